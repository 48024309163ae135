/* remote.c - the shared tier on Redis (hiredis): entries that every host
 * of a corpus sees, behind the local tiers.
 *
 * Keys (SID: the shared tier's id, made once in Redis by the first store
 * configured with it and kept in store.json; KEY: the entry's key, model
 * fingerprint and token hash):
 *   cb:{SID:KEY}:m       hash: bytes, tokens, checksum, created, last_access, hits, parts
 *   cb:{SID:KEY}:v       list: the KV file's header, then each layer
 *   cb:{SID:KEY}:t:RND   a part list being uploaded (expires after ST_UPLOAD_TTL s)
 *   cb:SID:lru           sorted set: KEY scored by its last access (microseconds)
 *   cb:SID:used          bytes of the entries
 * An entry's keys share the hash tag {SID:KEY}.  Every change of the
 * accounting (commit, touch, drop) is one Lua script, which Redis runs
 * atomically: eviction by LRU to the capacity happens inside the commit,
 * so concurrent writers on many hosts never see the tier over capacity or
 * an entry half made.  The scripts reach keys of other entries (victims)
 * and the store's lru/used keys by name, which a single Redis allows and a
 * Redis Cluster does not: the shared tier is one Redis server.
 *
 * Reads are verified: the parts' total size and XXH3-128 against the
 * metadata, then the local put verifies header, key and layer checksums.
 * With a tier key (secret.c), a writer seals every part (AES-256-GCM under
 * a key of the upload's own: the header with the token ids, each layer's
 * KV) and adds to the metadata its tag per part (mac_key, mac_alg,
 * mac_nonce, macs); the checksum is then the stored ciphertext's.  A
 * reader decrypts each part and takes none whose tag does not verify: an
 * entry without tags, with another key's, with no algorithm or one it does
 * not know (mac_alg; v1 entries of older hosts have none), or with one part
 * that fails is refused (dropped) as a corrupt one is.  A v2 entry (parts
 * in clear under GMAC tags) is read, its tags checked, and written again
 * sealed (st_remote_reseal).  A host without the key takes a sealed entry
 * for a miss and leaves it alone.  A password
 * file makes every connection log in first (AUTH [USER] PASSWORD); a user
 * the server refuses a write (NOPERM) is taken as read-only from then on.
 * Any failure (unreachable, timed out, bad entry) is a miss: the caller
 * computes the chunk; a bad entry is dropped.  After a connection error
 * the tier is skipped for ST_RETRY_US, so that a dead server costs one
 * timeout, not one per chunk.
 *
 * This file: the keys, the accounting scripts, put, get and drop; the
 * connection in remote_conn.c, the tags in remote_mac.c, reading by layer
 * in remote_stream.c, list, stat, gc and verify in remote_maint.c. */
#include "remote_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ST_PART (1u << 20)
#define ST_UPLOAD_TTL 600

static const char LUA_COMMIT[] =
    "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('DEL', KEYS[2]) return 0 end\n"
    "if redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[7]) then redis.call('DEL', KEYS[2]) return -2 end\n"
    "local b = tonumber(ARGV[2]) local cap = tonumber(ARGV[6])\n"
    "if cap > 0 and b > cap then redis.call('DEL', KEYS[2]) return -1 end\n"
    "local used = tonumber(redis.call('GET', KEYS[5]) or '0')\n"
    "local n = 0\n"
    "while cap > 0 and used + b > cap do\n"
    "  local v = redis.call('ZRANGE', KEYS[4], 0, 0)\n"
    "  if #v == 0 then break end\n"
    "  local mk = 'cb:{' .. ARGV[8] .. ':' .. v[1] .. '}:m'\n"
    "  local vb = tonumber(redis.call('HGET', mk, 'bytes') or '0')\n"
    "  redis.call('DEL', mk, 'cb:{' .. ARGV[8] .. ':' .. v[1] .. '}:v')\n"
    "  redis.call('ZREM', KEYS[4], v[1])\n"
    "  used = used - vb n = n + 1\n"
    "end\n"
    "if cap > 0 and used + b > cap then redis.call('DEL', KEYS[2]) redis.call('SET', KEYS[5], used) return -1 end\n"
    "redis.call('RENAME', KEYS[2], KEYS[3]) redis.call('PERSIST', KEYS[3])\n"
    "redis.call('HSET', KEYS[1], 'bytes', ARGV[2], 'tokens', ARGV[3], 'checksum', ARGV[4], 'created', ARGV[5],\n"
    "  'last_access', ARGV[5], 'hits', 0, 'parts', ARGV[7])\n"
    "if ARGV[9] ~= '' then\n"
    "  redis.call('HSET', KEYS[1], 'mac_key', ARGV[9], 'mac_nonce', ARGV[10], 'macs', ARGV[11], 'mac_alg', ARGV[12])\n"
    "end\n"
    "redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1])\n"
    "redis.call('SET', KEYS[5], used + b)\n"
    "return 1 + n\n";

/* KEYS: meta, lru; ARGV: key, now, record.  The metadata, or nil. */
static const char LUA_TOUCH[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return nil end\n"
    "if ARGV[3] == '1' then\n"
    "  redis.call('HINCRBY', KEYS[1], 'hits', 1) redis.call('HSET', KEYS[1], 'last_access', ARGV[2])\n"
    "  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])\n"
    "end\n"
    "return redis.call('HMGET', KEYS[1], 'bytes', 'checksum', 'parts', 'tokens', 'created', 'last_access', 'hits',\n"
    "  'mac_key', 'mac_nonce', 'macs', 'mac_alg')\n";

/* KEYS: meta, value, lru, used; ARGV: key, checksum ('' = any).  Drop an
 * entry, unless it was replaced meanwhile (another checksum). */
static const char LUA_DROP[] =
    "local c = redis.call('HGET', KEYS[1], 'checksum')\n"
    "if not c then redis.call('DEL', KEYS[2]) redis.call('ZREM', KEYS[3], ARGV[1]) return 0 end\n"
    "if ARGV[2] ~= '' and c ~= ARGV[2] then return 0 end\n"
    "local b = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')\n"
    "redis.call('DEL', KEYS[1], KEYS[2]) redis.call('ZREM', KEYS[3], ARGV[1])\n"
    "local u = tonumber(redis.call('GET', KEYS[4]) or '0') - b\n"
    "if u < 0 then u = 0 end\n"
    "redis.call('SET', KEYS[4], u)\n"
    "return 1\n";

/* ------------------------------------------------------------- checks */

int st_kv_check_bytes(const void *data, size_t size, const char *key, char *why, size_t why_n)
{
    char path[64], fkey[66];
    cb_kvfile *f = NULL;
    cb_error err;
    /* The KV file reader takes a path: an anonymous memory file is one,
     * even in a read-only store. */
    int fd = memfd_create("cb-kv-check", MFD_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_n, "memfd_create: %s", strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int rc = -1;
    if (st_write_all(fd, data, size) != 0) {
        snprintf(why, why_n, "memfd: %s", strerror(errno));
    } else if (cb_kvfile_open(&f, path, &err) != CB_OK || cb_kvfile_verify(f, &err) != CB_OK) {
        snprintf(why, why_n, "not a valid KV file: %s", err.msg);
    } else {
        const cb_kv_meta *m = cb_kvfile_meta(f);
        cb_kv_key(m->model, m->tokens, fkey);
        if (strcmp(fkey, key) != 0)
            snprintf(why, why_n, "it holds the entry %s", fkey);
        else
            rc = 0;
    }
    cb_kvfile_free(f);
    close(fd);
    return rc;
}

/* --------------------------------------------------------------- keys */

void st_remote_keys(const cb_store *s, const char *key, rkeys *k)
{
    const st_remote *r = &s->remote;
    snprintf(k->m, sizeof k->m, "cb:{%s:%s}:m", r->id, key);
    snprintf(k->v, sizeof k->v, "cb:{%s:%s}:v", r->id, key);
    snprintf(k->lru, sizeof k->lru, "cb:%s:lru", r->id);
    snprintf(k->used, sizeof k->used, "cb:%s:used", r->id);
}

cb_status st_remote_drop(cb_store *s, const char *key, const char *checksum)
{
    rkeys k;
    if (s->remote.ro)
        return CB_ERR_CREATE; /* this user may not */
    st_remote_keys(s, key, &k);
    const char *argv[] = {
        "EVAL", LUA_DROP, "4", k.m, k.v, k.lru, k.used, key, checksum ? checksum : ""};
    redisReply *rep = st_remote_cmd_argv(s, 9, argv, NULL);
    if (!rep)
        return CB_ERR_IO;
    freeReplyObject(rep);
    return CB_OK;
}

/* ---------------------------------------------------------------- put */

int st_remote_has(cb_store *s, const char *key)
{
    rkeys k;
    if (!st_remote_up(s))
        return -1;
    st_remote_keys(s, key, &k);
    redisReply *rep = st_remote_cmdf(s, "EXISTS %s", k.m);
    if (!rep)
        return -1;
    int have = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    freeReplyObject(rep);
    return have;
}

/* Parts: the header, then one per layer (cb_kv_part_bytes), as a loader
 * reads them; other bytes in parts of ST_PART bytes.  The length of the
 * part at off (part i). */
static size_t part_len(const void *data, size_t size, size_t i, size_t off)
{
    uint64_t n = cb_kv_part_bytes(data, size, i);
    if (n > 0 && n <= size - off)
        return (size_t)n;
    return size - off < ST_PART ? size - off : ST_PART;
}

/* 1 when an entry is stored under key that a keyed reader would take as
 * it is (or there is no key: any entry), 0 when there is none or one it
 * would refuse or reseal (no tags, another key's, another algorithm's or
 * none, v2's parts in clear; dropped here so that this put replaces it),
 * -1 when the tier is down. */
static int have_usable(cb_store *s, const char *key, const rkeys *k)
{
    st_remote *r = &s->remote;
    redisReply *rep = r->mac.kdf ? st_remote_cmdf(s, "HMGET %s checksum mac_key mac_alg", k->m)
                                 : st_remote_cmdf(s, "EXISTS %s", k->m);
    if (!rep)
        return -1;
    if (!r->mac.kdf) {
        int have = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
        freeReplyObject(rep);
        return have;
    }
    int have = rep->type == REDIS_REPLY_ARRAY && rep->elements == 3 &&
               rep->element[0]->type == REDIS_REPLY_STRING;
    if (have && !(rep->element[1]->type == REDIS_REPLY_STRING &&
                  strcmp(rep->element[1]->str, r->mac.id) == 0 &&
                  rep->element[2]->type == REDIS_REPLY_STRING &&
                  strcmp(rep->element[2]->str, ST_MAC_ALG) == 0)) {
        char want[33];
        snprintf(want, sizeof want, "%s", rep->element[0]->str);
        have = st_remote_drop(s, key, want) == CB_OK ? 0 : 1;
    }
    freeReplyObject(rep);
    return have;
}

int st_remote_put(cb_store *s, const char *key, const void *data, size_t size, int64_t n_tokens)
{
    st_remote *r = &s->remote;
    rkeys k;
    char sum[33], num[5][32], mac_key[17] = "", nonce_hex[2 * ST_NONCE_BYTES + 1] = "";
    char *macs = NULL;
    uint8_t *sealed = NULL;
    st_seal_ctx *sc = NULL;
    int rc = -1;
    if (!st_remote_up(s))
        return -1;
    if (r->ro) {
        if (!r->ro_warned++)
            st_remote_warn(s,
                           "shared tier %s: %s%s may not write it: nothing is written through (%s)",
                           r->name, r->user[0] ? "user " : "this user", r->user, r->why);
        return -1;
    }
    st_remote_keys(s, key, &k);
    char up[17];
    st_random_hex(up, 16); /* this upload's own name, whoever else uploads the key */
    snprintf(k.t, sizeof k.t, "cb:{%s:%s}:t:%s", r->id, key, up);
    int have = have_usable(s, key, &k);
    /* one there whose keys are broken (its value cut short, of another
     * type, ...) is replaced */
    if ((have > 0 || (have < 0 && r->ctx && ST_WRONGTYPE(r))) &&
        st_remote_heal(s, key, NULL, "written again") == 2)
        have = 0;
    if (have != 0)
        return have > 0 ? 0 : -1;
    size_t parts = 0;
    for (size_t off = 0; off < size; parts++)
        off += part_len(data, size, parts, off);
    st_part_id id = {r->id, key, {0}, parts, size};
    const uint8_t *val = data; /* the value as stored: sealed with a tier key */
    if (r->mac.kdf) {
        /* the upload's own key, derived after its nonce is drawn */
        if (st_mac_nonce(id.nonce) != 0 || !(macs = malloc(parts * 2 * ST_TAG_BYTES + 1)) ||
            !(sealed = malloc(size ? size : 1)) || !(sc = st_seal_upload(&r->mac, &id))) {
            st_remote_warn(s,
                           "shared tier %s: %s: not written (no random bytes or memory to seal it)",
                           r->name, key);
            goto done;
        }
        snprintf(mac_key, sizeof mac_key, "%s", r->mac.id);
        st_tohex(id.nonce, ST_NONCE_BYTES, nonce_hex);
        macs[0] = 0;
        size_t i = 0;
        for (size_t off = 0; off < size; i++) {
            size_t n = part_len(data, size, i, off);
            uint8_t tag[ST_TAG_BYTES];
            if (st_seal_part(sc, &id, i, (const char *)data + off, n, sealed + off, tag) != 0) {
                st_remote_warn(s, "shared tier %s: %s: not written (sealing failed in libcrypto)",
                               r->name, key);
                goto done;
            }
            st_tohex(tag, ST_TAG_BYTES, macs + i * 2 * ST_TAG_BYTES);
            off += n;
        }
        val = sealed;
    }
    /* Uploaded under its own name, expiring, then committed at once. */
    redisReply *rep;
    size_t i = 0;
    for (size_t off = 0; off < size; i++) {
        size_t n = part_len(data, size, i, off);
        if (!(rep = st_remote_cmdf(s, "RPUSH %s %b", k.t, (const char *)val + off, n)))
            goto done;
        freeReplyObject(rep);
        if (i == 0) {
            if (!(rep = st_remote_cmdf(s, "EXPIRE %s %d", k.t, ST_UPLOAD_TTL)))
                goto done;
            freeReplyObject(rep);
        }
        off += n;
    }
    cb_hash128_hex(cb_hash128_bytes(val, size), sum);
    snprintf(num[0], 32, "%zu", size);
    snprintf(num[1], 32, "%lld", (long long)n_tokens);
    snprintf(num[2], 32, "%lld", (long long)st_now_us());
    snprintf(num[3], 32, "%llu", (unsigned long long)r->cap);
    snprintf(num[4], 32, "%zu", parts);
    const char *argv[] = {
        "EVAL",           LUA_COMMIT, "5", k.m,    k.t,    k.v,    k.lru, k.used,  key,
        num[0],           num[1],     sum, num[2], num[3], num[4], r->id, mac_key, nonce_hex,
        macs ? macs : "", ST_MAC_ALG};
    if (!(rep = st_remote_cmd_argv(s, 20, argv, NULL)))
        goto done;
    long long res = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -3;
    freeReplyObject(rep);
    if (res == -1)
        st_remote_warn(s, "shared tier %s: no room for %s (%zu bytes, capacity %llu)", r->name, key,
                       size, (unsigned long long)r->cap);
    rc = res >= 0 ? 0 : -1;
done:
    st_seal_ctx_free(sc);
    free(sealed);
    free(macs);
    return rc;
}

/* ---------------------------------------------------------------- get */

/* Read key's metadata into *m (m->tags to be freed), recording the access
 * (hits, LRU time) when record and this user may write: 1 found, 0
 * missing or unreachable, -1 its metadata no hash (dropped where it may,
 * warned). */
int st_remote_touch_meta(cb_store *s, const char *key, int record, const rkeys *k, rmeta *m)
{
    char now[32];
    redisReply *rep = NULL;
    memset(m, 0, sizeof *m);
    if (record && !s->remote.ro) {
        snprintf(now, sizeof now, "%lld", (long long)st_now_us());
        const char *argv[] = {"EVAL", LUA_TOUCH, "2", k->m, k->lru, key, now, "1"};
        s->remote.quiet =
            1; /* a read-only user (NOPERM) reads without recording: not worth a warning */
        rep = st_remote_cmd_argv(s, 8, argv, NULL);
        s->remote.quiet = 0;
        if (!rep && (!s->remote.ro || !s->remote.ctx) &&
            !(s->remote.ctx && ST_WRONGTYPE(&s->remote)))
            return 0;
    }
    if (!rep &&
        !(rep = st_remote_cmdf(
              s,
              "HMGET %s bytes checksum parts tokens created last_access hits mac_key mac_nonce macs mac_alg",
              k->m))) /* as LUA_TOUCH without recording: a read-only user's way */
        return s->remote.ctx && ST_WRONGTYPE(&s->remote) &&
                       st_remote_heal(s, key, NULL, "a miss") > 0
                   ? -1
                   : 0;
    int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= 3 &&
             rep->element[0]->type == REDIS_REPLY_STRING;
    if (ok) {
        m->bytes = int_of(rep->element[0]);
        m->parts = int_of(rep->element[2]);
        m->tokens = rep->elements > 3 ? int_of(rep->element[3]) : -1;
        snprintf(m->want, sizeof m->want, "%s",
                 rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : "");
        st_remote_meta_macs(m, rep);
    }
    freeReplyObject(rep);
    return ok;
}

/* Fetch key's bytes into *out (malloc'd, in clear): 1 found and its
 * checksum right (and with a tier key every part's tag, each sealed part
 * decrypted), 0 missing, unreachable, or sealed and this host without the
 * key, -1 bad (dropped when drop_bad, with a warning).  With drop_bad, a
 * v2 entry read with the key is written again sealed (st_remote_reseal). */
int st_remote_get(cb_store *s, const char *key, int record, int drop_bad, void **out, size_t *size)
{
    st_remote *r = &s->remote;
    rkeys k;
    rmeta m;
    char sum[33], why[200];
    redisReply *rep;
    *out = NULL;
    if (!st_remote_up(s))
        return 0;
    st_remote_keys(s, key, &k);
    int found = st_remote_touch_meta(s, key, record && !s->readonly, &k, &m);
    if (found <= 0)
        return found;
    rep = st_remote_cmdf(s, "LRANGE %s 0 -1", k.v);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
        /* evicted meanwhile, or its value missing or not a list: looked at */
        int down = !rep && !(r->ctx && ST_WRONGTYPE(r));
        if (rep)
            freeReplyObject(rep);
        free(m.tags);
        if (down)
            return 0;
        int ins = st_remote_inspect(s, key, m.want, drop_bad, why, sizeof why);
        if (ins <= 0)
            return 0;
        snprintf(r->why, sizeof r->why, "%s", why);
        if (ins == 2)
            st_remote_warn(s, "shared tier %s: %s: %s; dropped (a miss)", r->name, key, why);
        else
            st_remote_warn(s, "shared tier %s: %s: %s; a miss", r->name, key, why);
        return -1;
    }
    const char *bad = NULL;
    int forged = 0, usable = 0;
    size_t total = 0;
    for (size_t i = 0; i < rep->elements; i++)
        total += rep->element[i]->type == REDIS_REPLY_STRING ? rep->element[i]->len : 0;
    if (m.bytes < 0 || m.parts != (int64_t)rep->elements || total != (uint64_t)m.bytes)
        bad = "its size does not match its metadata";
    else if ((usable = st_remote_mac_usable(s, &m, why, sizeof why)) < 0)
        bad = why, forged = 1;
    uint8_t *buf = bad || usable > 0 ? NULL : malloc(total ? total : 1);
    st_part_id id;
    st_remote_part_id(s, key, &m, &id);
    st_mac_ctx *mc = !bad && r->mac.kdf && !m.sealed ? st_mac_upload(&r->mac, &id) : NULL;
    st_seal_ctx *sc = !bad && r->mac.kdf && m.sealed ? st_seal_upload(&r->mac, &id) : NULL;
    if (usable > 0 || (!bad && (!buf || (r->mac.kdf && !mc && !sc)))) {
        if (usable > 0)
            st_remote_sealed_miss(s, key);
        st_mac_ctx_free(mc);
        st_seal_ctx_free(sc);
        free(buf);
        freeReplyObject(rep);
        free(m.tags);
        return 0; /* sealed and no key, or no memory: a miss, the entry left as it is */
    }
    /* the stored bytes (the checksum's), then with a key each part's tag
     * checked (v2) or each part decrypted in place and its tag checked */
    for (size_t i = 0, off = 0; !bad && i < rep->elements; i++) {
        memcpy(buf + off, rep->element[i]->str, rep->element[i]->len);
        off += rep->element[i]->len;
    }
    if (!bad)
        cb_hash128_hex(cb_hash128_bytes(buf, total), sum);
    for (size_t i = 0, off = 0; !bad && (mc || sc) && i < rep->elements; i++) {
        size_t n = rep->element[i]->len;
        const uint8_t *tag = m.tags + i * ST_TAG_BYTES;
        if (sc ? !st_seal_open(sc, &id, i, buf + off, n, buf + off, tag)
               : !st_mac_check(mc, &id, i, buf + off, n, tag)) {
            snprintf(why, sizeof why,
                     "part %zu: its MAC does not verify (forged, or changed in Redis)", i);
            bad = why, forged = 1;
        }
        off += n;
    }
    if (!bad && strcmp(sum, m.want) != 0)
        bad = "its checksum does not match";
    st_mac_ctx_free(mc);
    st_seal_ctx_free(sc);
    freeReplyObject(rep);
    free(m.tags);
    if (bad) {
        char msg[400];
        free(buf);
        r->n_refused += forged;
        snprintf(msg, sizeof msg, "shared tier %s: %s: %s", r->name, key, bad);
        st_remote_refuse(s, key, m.want, drop_bad ? NULL : "", msg);
        snprintf(r->why, sizeof r->why, "%s", bad);
        return -1;
    }
    if (r->mac.kdf && !m.sealed && drop_bad)
        st_remote_reseal(s, key, buf, total, m.tokens);
    *out = buf;
    *size = total;
    return 1;
}

cb_status cb_store_shared_drop(cb_store *s, const char *key, cb_error *err)
{
    if (!s || !s->remote.url)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "the store has no shared tier");
    if (!st_key_valid(key))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", key ? key : "");
    if (s->readonly)
        return cb_error_set(err, CB_ERR_CREATE, "%s: the store is read-only", s->dir);
    cb_status st = st_remote_need(s, err);
    if (st != CB_OK)
        return st;
    st = st_remote_drop(s, key, NULL);
    if (st == CB_ERR_CREATE)
        return cb_error_set(err, CB_ERR_CREATE, "shared tier %s: this user may not write it (%s)",
                            s->remote.name, s->remote.why);
    if (st != CB_OK)
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): %s", s->remote.name,
                            s->remote.url, s->remote.why);
    return CB_OK;
}

void st_remote_refuse(cb_store *s, const char *key, const char *checksum, const char *keep,
                      const char *msg)
{
    st_remote *r = &s->remote;
    if (!keep)
        keep = s->readonly ? "the store is read-only" : r->ro ? "this user may not write" : NULL;
    if (!keep && (!st_remote_up(s) || st_remote_drop(s, key, checksum) != CB_OK))
        keep = r->ro ? "this user may not write" : "the tier cannot be reached";
    if (keep && *keep)
        st_remote_warn(s, "%s; a miss (not dropped: %s)", msg, keep);
    else if (keep)
        st_remote_warn(s, "%s; a miss", msg);
    else {
        s->n_healed[s->n_tiers]++;
        st_remote_warn(s, "%s; dropped (a miss)", msg);
    }
}

/* A fetched entry failed the local verification: drop it. */
void st_remote_reject(cb_store *s, const char *key, const char *why)
{
    char msg[CB_ERROR_MSG_MAX + 200];
    snprintf(msg, sizeof msg, "shared tier %s: %s: %s", s->remote.name, key, why);
    st_remote_refuse(s, key, NULL, NULL, msg);
}
