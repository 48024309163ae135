/* remote_maint.c - the shared tier's (remote.c) list, stat, gc and verify. */
#include "remote_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* KEYS: lru, used; ARGV: sid, the most bytes an entry may have.
 * Recount: members without a whole entry (metadata a hash with bytes a put
 * writes, value a list) leave the LRU set, their keys dropped, and used
 * becomes the sum of the rest (a key of another type told by pcall: only
 * commands of the writer's ACL in cb-store(5)). */
static const char LUA_RECOUNT[] =
    "local all = redis.call('ZRANGE', KEYS[1], 0, -1) local u = 0 local gone = 0\n"
    "for _, k in ipairs(all) do\n"
    "  local mk = 'cb:{' .. ARGV[1] .. ':' .. k .. '}:m' local vk = 'cb:{' .. ARGV[1] .. ':' .. k .. '}:v'\n"
    "  local b = redis.pcall('HGET', mk, 'bytes')\n"
    "  if type(b) == 'table' then b = nil end\n"
    "  b = tonumber(b or '')\n"
    "  if b and (b < 1 or b > tonumber(ARGV[2])) then b = nil end\n"
    "  if b then\n"
    "    local n = redis.pcall('LLEN', vk)\n"
    "    if type(n) ~= 'number' or n < 1 then b = nil end\n"
    "  end\n"
    "  if b then u = u + b\n"
    "  else redis.call('DEL', mk, vk) redis.call('ZREM', KEYS[1], k) gone = gone + 1 end\n"
    "end\n"
    "redis.call('SET', KEYS[2], u)\n"
    "return {gone, u}\n";

/* The accounting recounted (LUA_RECOUNT): CB_OK, else err set. */
static cb_status recount(cb_store *s, const rkeys *k, cb_error *err)
{
    st_remote *r = &s->remote;
    char max[32];
    snprintf(max, sizeof max, "%llu", (unsigned long long)(r->cap ? r->cap : ST_MAX_BYTES));
    const char *argv[] = {"EVAL", LUA_RECOUNT, "2", k->lru, k->used, r->id, max};
    redisReply *rep = st_remote_cmd_argv(s, 7, argv, NULL);
    if (!rep)
        return cb_error_set(err, CB_ERR_IO, "shared tier %s: recount failed", r->name);
    freeReplyObject(rep);
    return CB_OK;
}

/* --------------------------------------------------------- list, stat */

cb_status st_remote_list(cb_store *s, const char *model,
                         int (*fn)(void *ctx, const cb_store_entry *e), void *ctx, int *stopped,
                         cb_error *err)
{
    st_remote *r = &s->remote;
    rkeys k;
    *stopped = 0;
    cb_status st = st_remote_need(s, err);
    if (st != CB_OK)
        return st;
    st_remote_keys(s, "x", &k);
    redisReply *all = st_remote_cmdf(s, "ZREVRANGE %s 0 -1", k.lru);
    if (!all)
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): listing failed", r->name, r->url);
    for (size_t i = 0; all->type == REDIS_REPLY_ARRAY && i < all->elements && !*stopped; i++) {
        const char *key = all->element[i]->str;
        if (!key || !st_key_valid(key) || (model && strncmp(key, model, 32) != 0))
            continue;
        st_remote_keys(s, key, &k);
        redisReply *m =
            st_remote_cmdf(s, "HMGET %s bytes checksum tokens created last_access hits", k.m);
        if (!m && r->ctx && ST_WRONGTYPE(r))
            continue; /* a broken entry: not listed (verify reports it) */
        if (!m) {
            freeReplyObject(all);
            return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): listing failed", r->name,
                                r->url);
        }
        if (m->type == REDIS_REPLY_ARRAY && m->elements == 6 &&
            m->element[0]->type == REDIS_REPLY_STRING) {
            char mod[33];
            snprintf(mod, sizeof mod, "%.32s", key);
            cb_store_entry e = {key,
                                mod,
                                r->name,
                                r->url,
                                m->element[1]->type == REDIS_REPLY_STRING ? m->element[1]->str : "",
                                (uint64_t)int_of(m->element[0]),
                                int_of(m->element[2]),
                                int_of(m->element[3]),
                                int_of(m->element[4]),
                                (uint64_t)int_of(m->element[5]),
                                0};
            *stopped = fn(ctx, &e) != 0;
        }
        freeReplyObject(m);
    }
    freeReplyObject(all);
    return CB_OK;
}

const char *cb_store_shared_name(const cb_store *s)
{
    return s && s->remote.url ? s->remote.name : NULL;
}

cb_status cb_store_shared_stat(cb_store *s, cb_store_tier_stat *out, cb_error *err)
{
    st_remote *r = &s->remote;
    rkeys k;
    if (!r->url)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: the store has no shared tier", s->dir);
    memset(out, 0, sizeof *out);
    out->name = r->name;
    out->path = r->url;
    out->capacity = r->cap;
    out->healed = s->n_healed[s->n_tiers];
    cb_status st = st_remote_need(s, err);
    if (st != CB_OK)
        return st;
    st_remote_keys(s, "x", &k);
    redisReply *a = st_remote_cmdf(s, "ZCARD %s", k.lru),
               *b = a ? st_remote_cmdf(s, "GET %s", k.used) : NULL;
    if (!a || !b) {
        if (a)
            freeReplyObject(a);
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): stat failed", r->name, r->url);
    }
    out->entries = a->type == REDIS_REPLY_INTEGER ? (uint64_t)a->integer : 0;
    out->bytes = b->type == REDIS_REPLY_STRING ? strtoull(b->str, NULL, 10) : 0;
    freeReplyObject(a);
    freeReplyObject(b);
    return CB_OK;
}

/* --------------------------------------------------------- gc, verify */

/* Every entry's keys' shape and then its bytes checked (verify; not with
 * fetch 0) and bad ones dropped when fix, then the accounting recounted
 * when fix.  problems counted in *bad. */
cb_status st_remote_check(cb_store *s, int fetch, int fix,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          uint64_t *n_entries, uint64_t *n_bad, uint64_t *n_bytes, cb_error *err)
{
    st_remote *r = &s->remote;
    rkeys k;
    *n_entries = *n_bad = 0;
    cb_status st = st_remote_need(s, err);
    if (st != CB_OK)
        return st;
    st_remote_keys(s, "x", &k);
    if (!fetch) /* gc: the accounting alone */
        return fix ? recount(s, &k, err) : CB_OK;
    redisReply *all = st_remote_cmdf(s, "ZRANGE %s 0 -1", k.lru);
    if (!all)
        return cb_error_set(err, CB_ERR_IO, "shared tier %s: listing failed", r->name);
    for (size_t i = 0; all->type == REDIS_REPLY_ARRAY && i < all->elements; i++) {
        const char *key = all->element[i]->str;
        void *buf;
        size_t size;
        char why[CB_ERROR_MSG_MAX];
        if (!key)
            continue;
        (*n_entries)++;
        /* its keys' shape first: a value missing, cut short or of another
         * type, metadata no hash or malformed (dropped when fix) */
        void (*w0)(void *, const char *) = s->warn;
        s->warn = NULL; /* reported below instead */
        int ins = st_remote_inspect(s, key, NULL, fix, why, sizeof why);
        s->warn = w0;
        if (ins < 0) {
            freeReplyObject(all);
            return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): lost the connection", r->name,
                                r->url);
        }
        if (ins > 0) {
            char msg[CB_ERROR_MSG_MAX + 100];
            (*n_bad)++;
            snprintf(msg, sizeof msg, "shared tier %s: %s%s", r->name, why,
                     ins == 2 ? " (dropped)" : "");
            if (problem)
                problem(ctx, key, msg);
            continue;
        }
        st_remote_keys(s, key, &k);
        redisReply *m = st_remote_cmdf(s, "HMGET %s checksum bytes", k.m);
        if (!m) {
            freeReplyObject(all);
            return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): %s", r->name, r->url, r->why);
        }
        char want[33] = "";
        if (m->type == REDIS_REPLY_ARRAY && m->elements == 2 &&
            m->element[0]->type == REDIS_REPLY_STRING)
            snprintf(want, sizeof want, "%s", m->element[0]->str);
        freeReplyObject(m);
        if (!want[0])
            continue; /* dropped or evicted meanwhile */
        why[0] = 0;
        void (*w)(void *, const char *) = s->warn;
        s->warn = NULL; /* reported below instead */
        int got = st_remote_get(s, key, 0, 0, &buf, &size);
        s->warn = w;
        if (got == 1) {
            *n_bytes += size;
            if (st_kv_check_bytes(buf, size, key, why, sizeof why) != 0) {
                (*n_bad)++;
                if (fix)
                    st_remote_drop(s, key, want);
            }
            free(buf);
        } else if (got < 0) {
            snprintf(why, sizeof why, "%s", r->why);
            (*n_bad)++;
            if (fix)
                st_remote_drop(s, key, want);
        } else if (!s->remote.ctx) {
            freeReplyObject(all);
            return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): lost the connection", r->name,
                                r->url);
        }
        if (why[0] && problem) {
            char msg[CB_ERROR_MSG_MAX + 100];
            snprintf(msg, sizeof msg, "shared tier %s: %s%s", r->name, why,
                     fix ? " (dropped)" : "");
            problem(ctx, key, msg);
        }
    }
    freeReplyObject(all);
    /* after the entries were reported: what is left is counted again */
    st_remote_keys(s, "x", &k);
    return fix ? recount(s, &k, err) : CB_OK;
}
