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
 * With a tier key (secret.c), a writer adds to the metadata an AES-256-GMAC
 * tag per part (mac_key, mac_alg, mac_nonce, macs) and a reader takes no
 * part whose tag does not verify: an entry without tags, with another key's,
 * with no algorithm or one it does not know (mac_alg; v1 entries of older
 * hosts have none), or with one part that fails is refused (dropped) as a
 * corrupt one is.  A password
 * file makes every connection log in first (AUTH [USER] PASSWORD); a user
 * the server refuses a write (NOPERM) is taken as read-only from then on.
 * Any failure (unreachable, timed out, bad entry) is a miss: the caller
 * computes the chunk; a bad entry is dropped.  After a connection error
 * the tier is skipped for ST_RETRY_US, so that a dead server costs one
 * timeout, not one per chunk. */
#include "store_impl.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <hiredis.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define ST_PART (1u << 20)
#define ST_UPLOAD_TTL 600
#define ST_RETRY_US 5000000
#define ST_MAX_PARTS 65536 /* a header and at most 4096 layers (cbkv(5)), or 1 MB parts of 64 GB */

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

/* KEYS: lru, used; ARGV: sid.  Recount: members without metadata leave the
 * LRU set, and used becomes the sum of the rest. */
static const char LUA_RECOUNT[] =
    "local all = redis.call('ZRANGE', KEYS[1], 0, -1) local u = 0 local gone = 0\n"
    "for _, k in ipairs(all) do\n"
    "  local mk = 'cb:{' .. ARGV[1] .. ':' .. k .. '}:m'\n"
    "  local b = redis.call('HGET', mk, 'bytes')\n"
    "  if b and redis.call('EXISTS', 'cb:{' .. ARGV[1] .. ':' .. k .. '}:v') == 1 then u = u + tonumber(b)\n"
    "  else redis.call('DEL', mk, 'cb:{' .. ARGV[1] .. ':' .. k .. '}:v') redis.call('ZREM', KEYS[1], k) gone = gone + 1 end\n"
    "end\n"
    "redis.call('SET', KEYS[2], u)\n"
    "return {gone, u}\n";

void st_remote_warn(cb_store *s, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    if (!s->warn)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->warn(s->warn_ctx, msg);
}

/* ------------------------------------------------------------ address */

int st_remote_parse(const char *url, char *host, size_t host_n, int *port, int *db, int *is_unix)
{
    *db = 0;
    *port = 6379;
    *is_unix = 0;
    if (strncmp(url, "unix://", 7) == 0) {
        const char *p = url + 7;
        if (p[0] != '/' || strlen(p) >= host_n || strlen(p) < 2)
            return -1;
        snprintf(host, host_n, "%s", p);
        *is_unix = 1;
        return 0;
    }
    if (strncmp(url, "redis://", 8) != 0)
        return -1;
    const char *h = url + 8, *c = strchr(h, ':'), *sl = strchr(h, '/');
    const char *end = c ? c : sl ? sl : h + strlen(h);
    if (end == h || (size_t)(end - h) >= host_n)
        return -1;
    snprintf(host, host_n, "%.*s", (int)(end - h), h);
    if (c) {
        char *e;
        long v = strtol(c + 1, &e, 10);
        if (e == c + 1 || v < 1 || v > 65535 || (*e && *e != '/'))
            return -1;
        *port = (int)v;
        sl = *e == '/' ? e : NULL;
    }
    if (sl) {
        char *e;
        long v = strtol(sl + 1, &e, 10);
        if (e == sl + 1 || *e || v < 0 || v > 1000000)
            return -1;
        *db = (int)v;
    }
    return 0;
}

/* ---------------------------------------------------------- connection */

static void disconnect(st_remote *r)
{
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
}

void st_remote_close(st_remote *r)
{
    disconnect(r);
    free(r->url);
    free(r->auth_file);
    free(r->key_file);
    r->url = r->auth_file = r->key_file = NULL;
    OPENSSL_cleanse(r->pass, sizeof r->pass);
    st_mac_free(&r->mac);
    r->secrets = 0;
}

/* The file a secret comes from: the environment's, else store.json's. */
static const char *secret_path(const char *env, const char *recorded)
{
    const char *e = getenv(env);
    return e && *e ? e : recorded;
}

cb_status st_remote_secrets(st_remote *r, cb_error *err)
{
    cb_status st = CB_OK;
    if (r->secrets)
        return r->secrets > 0 ? CB_OK : cb_error_set(err, CB_ERR_FORMAT, "%s", r->why);
    const char *auth = secret_path("CB_REDIS_AUTH_FILE", r->auth_file);
    const char *key = secret_path("CB_TIER_KEY_FILE", r->key_file);
    r->user[0] = r->pass[0] = 0;
    if (auth)
        st = st_auth_load(auth, r->user, sizeof r->user, r->pass, sizeof r->pass, err);
    if (st == CB_OK && key)
        st = st_key_load(key, &r->mac, err);
    if (st != CB_OK) {
        snprintf(r->why, sizeof r->why, "%s", err ? err->msg : "a secret file cannot be used");
        OPENSSL_cleanse(r->pass, sizeof r->pass);
        st_mac_free(&r->mac);
        r->secrets = -1;
        return st;
    }
    r->secrets = 1;
    return CB_OK;
}

/* A write to a server that went away raises SIGPIPE, which would kill the
 * program: it is blocked around each request and a SIGPIPE that the
 * request caused is consumed (the library leaves signal handling alone). */
typedef struct pipe_guard {
    sigset_t old;
    int pending_before;
} pipe_guard;

static void pipe_block(pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    g->pending_before = sigismember(&pend, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void pipe_restore(pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    if (!g->pending_before && sigismember(&pend, SIGPIPE)) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* Mark the tier down for ST_RETRY_US after a failure (why), warned. */
static void went_down(cb_store *s, const char *why)
{
    st_remote *r = &s->remote;
    snprintf(r->why, sizeof r->why, "%s", why);
    st_remote_warn(s, "shared tier %s (%s): %s; not used for 5 s (what it holds is computed)",
                   r->name, r->url, why);
    disconnect(r);
    r->down_until = st_now_us() + ST_RETRY_US;
}

/* The server's refusal of our login (or of no login), said with what to
 * do about it; NULL for another error.  Redis' own words never hold the
 * password. */
static const char *login_refused(const st_remote *r, const char *reply, char *buf, size_t n)
{
    if (!strncmp(reply, "NOAUTH", 6))
        snprintf(
            buf, n,
            "the server wants a password (%s): give a password file with cb-store init --auth-file or "
            "$CB_REDIS_AUTH_FILE",
            reply);
    else if (!strncmp(reply, "WRONGPASS", 9) || !strncmp(reply, "ERR invalid password", 20) ||
             !strncmp(reply, "ERR AUTH", 8))
        snprintf(buf, n, "the server refused the login%s%s (%s)", r->user[0] ? " of user " : "",
                 r->user, reply);
    else
        return NULL;
    return buf;
}

/* rep, or NULL after marking the tier down (no reply, or the login
 * refused: warned once per outage) or after an error reply (warned,
 * freed; NOPERM, a write this user may not make, turns the tier read-only
 * for this handle, warned once). */
static redisReply *checked(cb_store *s, redisReply *rep)
{
    st_remote *r = &s->remote;
    char buf[300];
    if (!rep) {
        went_down(s, r->ctx->errstr[0] ? r->ctx->errstr : "no reply");
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        const char *login = login_refused(r, rep->str, buf, sizeof buf);
        if (login) {
            went_down(s, login);
        } else if (strstr(rep->str, "NOPERM")) {
            if (!r->ro && !r->quiet)
                st_remote_warn(
                    s, "shared tier %s (%s): %s%s may not write (%s): it is read from only",
                    r->name, r->url, r->user[0] ? "user " : "this user", r->user, rep->str);
            r->ro = 1;
            r->ro_warned |= !r->quiet; /* put says nothing more */
            snprintf(r->why, sizeof r->why, "%s", rep->str);
        } else {
            snprintf(r->why, sizeof r->why, "%s", rep->str);
            st_remote_warn(s, "shared tier %s (%s): %s", r->name, r->url, rep->str);
        }
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* A reply, or NULL after marking the tier down (warned once per outage). */
static redisReply *cmd_argv(cb_store *s, int argc, const char **argv, const size_t *len)
{
    st_remote *r = &s->remote;
    pipe_guard g;
    pipe_block(&g);
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, len);
    pipe_restore(&g);
    return checked(s, rep);
}

static redisReply *cmdf(cb_store *s, const char *fmt, ...)
{
    st_remote *r = &s->remote;
    va_list ap;
    pipe_guard g;
    pipe_block(&g);
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(r->ctx, fmt, ap);
    va_end(ap);
    pipe_restore(&g);
    return checked(s, rep);
}

/* A new connection to r's server, its time-out set for connecting and
 * each read or write; *db the database to select.  NULL with the reason. */
static redisContext *connect_to(const st_remote *r, int *db, char *why, size_t why_n)
{
    char host[1024];
    int port, is_unix;
    if (st_remote_parse(r->url, host, sizeof host, &port, db, &is_unix) != 0) {
        snprintf(why, why_n, "malformed address");
        return NULL;
    }
    struct timeval tv = {r->timeout_ms / 1000, (r->timeout_ms % 1000) * 1000};
    redisContext *c =
        is_unix ? redisConnectUnixWithTimeout(host, tv) : redisConnectWithTimeout(host, port, tv);
    if (!c || c->err) {
        snprintf(why, why_n, "%s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (r->pass[0]) {
        /* AUTH [USER] PASSWORD, as arguments: never formatted into text */
        const char *argv[] = {"AUTH", r->user, r->pass};
        int argc = 3;
        if (!r->user[0])
            argv[1] = r->pass, argc = 2;
        pipe_guard g; /* a server gone meanwhile: EPIPE, not SIGPIPE */
        pipe_block(&g);
        redisReply *rep = redisCommandArgv(c, argc, argv, NULL);
        pipe_restore(&g);
        char buf[300];
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            const char *login = rep ? login_refused(r, rep->str, buf, sizeof buf) : NULL;
            snprintf(why, why_n, "%s",
                     login          ? login
                     : rep          ? rep->str
                     : c->errstr[0] ? c->errstr
                                    : "no reply to AUTH");
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            return NULL;
        }
        freeReplyObject(rep);
    }
    return c;
}

/* 1 when connected (connecting now if needed), 0 when the tier is down. */
int st_remote_up(cb_store *s)
{
    st_remote *r = &s->remote;
    if (!r->url)
        return 0;
    if (r->ctx)
        return 1;
    if (r->down_until && st_now_us() < r->down_until)
        return 0;
    if (r->secrets < 0)
        return 0;
    cb_error e;
    if (!r->secrets && st_remote_secrets(r, &e) != CB_OK) {
        st_remote_warn(s, "shared tier %s (%s): %s; it is not used (what it holds is computed)",
                       r->name, r->url, e.msg);
        return 0;
    }
    int db;
    char why[320];
    if (!(r->ctx = connect_to(r, &db, why, sizeof why))) {
        went_down(s, why);
        return 0;
    }
    if (db > 0) {
        redisReply *rep = cmdf(s, "SELECT %d", db);
        if (!rep)
            return 0;
        freeReplyObject(rep);
    }
    r->down_until = 0;
    return 1;
}

/* The shared tier's id: the one in Redis under cb:tier:NAME, made when
 * missing.  0 with id, -1 when Redis cannot be reached. */
int st_remote_id(cb_store *s, const char *name, char id[33])
{
    st_remote *r = &s->remote;
    char fresh[33];
    st_random_hex(fresh, 32);
    redisReply *rep = cmdf(s, "SET cb:tier:%s %s NX", name, fresh);
    if (rep)
        freeReplyObject(rep);
    else if (!r->ro || !r->ctx)
        return -1; /* a read-only user may still find the tier made */
    if (!(rep = cmdf(s, "GET cb:tier:%s", name)))
        return -1;
    int ok = rep->type == REDIS_REPLY_STRING && rep->len == 32 && st_is_hex(rep->str, 32);
    if (ok)
        memcpy(id, rep->str, 33);
    else if (rep->type == REDIS_REPLY_NIL)
        snprintf(r->why, sizeof r->why,
                 "the tier does not exist yet and %s%s may not make it (make it with a "
                 "read/write user first)",
                 r->user[0] ? "user " : "this user", r->user);
    else
        snprintf(r->why, sizeof r->why, "cb:tier:%s does not hold a tier id", name);
    freeReplyObject(rep);
    return ok ? 0 : -1;
}

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

typedef struct rkeys {
    char m[200], v[200], t[200], lru[80], used[80];
} rkeys;

static void keys_of(const cb_store *s, const char *key, rkeys *k)
{
    const st_remote *r = &s->remote;
    snprintf(k->m, sizeof k->m, "cb:{%s:%s}:m", r->id, key);
    snprintf(k->v, sizeof k->v, "cb:{%s:%s}:v", r->id, key);
    snprintf(k->lru, sizeof k->lru, "cb:%s:lru", r->id);
    snprintf(k->used, sizeof k->used, "cb:%s:used", r->id);
}

static cb_status drop(cb_store *s, const char *key, const char *checksum)
{
    rkeys k;
    if (s->remote.ro)
        return CB_ERR_CREATE; /* this user may not */
    keys_of(s, key, &k);
    const char *argv[] = {
        "EVAL", LUA_DROP, "4", k.m, k.v, k.lru, k.used, key, checksum ? checksum : ""};
    redisReply *rep = cmd_argv(s, 9, argv, NULL);
    if (!rep)
        return CB_ERR_IO;
    freeReplyObject(rep);
    return CB_OK;
}

/* ---------------------------------------------------------------- MAC */

/* An entry's metadata as a reader needs it. */
typedef struct rmeta {
    int64_t bytes, parts;
    char want[33];    /* XXH3-128 of the whole value */
    char mac_key[17]; /* the id of the key its tags were made with, "" none */
    char mac_alg[24]; /* their algorithm: "" none, "?" not a name, else as stored */
    int has_mac;      /* mac_key, mac_alg known, nonce and tags present and well-formed */
    uint8_t nonce[ST_NONCE_BYTES];
    uint8_t *tags; /* [parts][ST_TAG_BYTES], malloc'd, or NULL */
} rmeta;

static int unhex(const char *h, size_t n_bytes, uint8_t *out)
{
    if (!st_is_hex(h, 2 * n_bytes))
        return -1;
    for (size_t i = 0; i < n_bytes; i++) {
        char a = h[2 * i], b = h[2 * i + 1];
        out[i] = (uint8_t)(((a <= '9' ? a - '0' : a - 'a' + 10) << 4) |
                           (b <= '9' ? b - '0' : b - 'a' + 10));
    }
    return 0;
}

static void tohex(const uint8_t *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = 0;
}

/* An algorithm's name as stored (anyone who may write Redis chose it), or
 * "?" when it is no short name: fit for a message. */
static void alg_name(const redisReply *a, char *out, size_t n)
{
    out[0] = 0;
    if (a->type != REDIS_REPLY_STRING)
        return;
    int ok = a->len > 0 && a->len < n;
    for (size_t i = 0; ok && i < a->len; i++)
        ok = (a->str[i] >= 'a' && a->str[i] <= 'z') || (a->str[i] >= '0' && a->str[i] <= '9') ||
             a->str[i] == '-';
    snprintf(out, n, "%s", ok ? a->str : "?");
}

/* The mac fields of a reply (elements 7, 8, 9, 10 of the metadata's HMGET). */
static void meta_macs(rmeta *m, const redisReply *rep)
{
    m->mac_key[0] = 0;
    m->mac_alg[0] = 0;
    m->has_mac = 0;
    m->tags = NULL;
    if (rep->elements < 11)
        return;
    const redisReply *k = rep->element[7], *n = rep->element[8], *t = rep->element[9];
    alg_name(rep->element[10], m->mac_alg, sizeof m->mac_alg);
    if (k->type == REDIS_REPLY_STRING && k->len == 16 && st_is_hex(k->str, 16))
        memcpy(m->mac_key, k->str, 17);
    if (!m->mac_key[0] || strcmp(m->mac_alg, ST_MAC_ALG) != 0 || n->type != REDIS_REPLY_STRING ||
        t->type != REDIS_REPLY_STRING || n->len != 2 * ST_NONCE_BYTES ||
        unhex(n->str, ST_NONCE_BYTES, m->nonce) != 0 || m->parts <= 0 || m->parts > ST_MAX_PARTS ||
        t->len != (size_t)m->parts * 2 * ST_TAG_BYTES ||
        !(m->tags = malloc((size_t)m->parts * ST_TAG_BYTES)))
        return;
    if (unhex(t->str, (size_t)m->parts * ST_TAG_BYTES, m->tags) != 0) {
        free(m->tags);
        m->tags = NULL;
        return;
    }
    m->has_mac = 1;
}

/* With a tier key: 0 when the metadata carries tags made with it by the
 * algorithm this host knows, else -1 with why (an entry a host without the
 * key wrote, an older host's, or planted).  Without a key: 0. */
static int mac_usable(const cb_store *s, const rmeta *m, char *why, size_t why_n)
{
    const st_remote *r = &s->remote;
    if (!r->mac.kdf)
        return 0;
    if (!m->mac_key[0])
        snprintf(why, why_n, "it carries no MAC (written without the tier key, or planted)");
    else if (strcmp(m->mac_key, r->mac.id) != 0)
        snprintf(why, why_n, "its MAC was made with another tier key (id %s; ours is %s)",
                 m->mac_key, r->mac.id);
    else if (!m->mac_alg[0])
        snprintf(
            why, why_n,
            "its MAC names no algorithm (an older host's HMAC-SHA256 tags, which are not read any "
            "more, or planted)");
    else if (strcmp(m->mac_alg, ST_MAC_ALG) != 0)
        snprintf(why, why_n, "its MAC algorithm %s is unknown here (this host reads %s)",
                 m->mac_alg, ST_MAC_ALG);
    else if (!m->has_mac)
        snprintf(why, why_n, "its MAC is malformed");
    else
        return 0;
    return -1;
}

static void part_id(const cb_store *s, const char *key, const rmeta *m, st_part_id *id)
{
    id->sid = s->remote.id;
    id->key = key;
    memcpy(id->nonce, m->nonce, ST_NONCE_BYTES);
    id->n_parts = (uint64_t)m->parts;
    id->total = (uint64_t)m->bytes;
}

/* ---------------------------------------------------------------- put */

int st_remote_has(cb_store *s, const char *key)
{
    rkeys k;
    if (!st_remote_up(s))
        return -1;
    keys_of(s, key, &k);
    redisReply *rep = cmdf(s, "EXISTS %s", k.m);
    if (!rep)
        return -1;
    int have = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    freeReplyObject(rep);
    return have;
}

/* Parts: the header, then one per layer (cbkv(5): H at 12, L at 48, S at
 * 96, H + L*S bytes), as a loader reads them; other sizes in parts of
 * ST_PART bytes.  The length of the part at off (part i). */
static size_t part_len(const void *data, size_t size, size_t i, size_t off)
{
    uint32_t H = 0, L = 0;
    uint64_t S = 0;
    if (size >= 128) {
        memcpy(&H, (const char *)data + 12, 4);
        memcpy(&L, (const char *)data + 48, 4);
        memcpy(&S, (const char *)data + 96, 8);
    }
    if (H > 0 && S > 0 && L > 0 && (uint64_t)H + (uint64_t)L * S == size)
        return i == 0 ? H : (size_t)S;
    return size - off < ST_PART ? size - off : ST_PART;
}

/* 1 when an entry is stored under key that a keyed reader would take (or
 * there is no key: any entry), 0 when there is none or one it would
 * refuse (no tags, another key's, another algorithm's or none; dropped here
 * so that this put replaces it), -1 when the tier is down. */
static int have_usable(cb_store *s, const char *key, const rkeys *k)
{
    st_remote *r = &s->remote;
    redisReply *rep = r->mac.kdf ? cmdf(s, "HMGET %s checksum mac_key mac_alg", k->m)
                                 : cmdf(s, "EXISTS %s", k->m);
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
        have = drop(s, key, want) == CB_OK ? 0 : 1;
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
    st_mac_ctx *mc = NULL;
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
    keys_of(s, key, &k);
    char up[17];
    st_random_hex(up, 16); /* this upload's own name, whoever else uploads the key */
    snprintf(k.t, sizeof k.t, "cb:{%s:%s}:t:%s", r->id, key, up);
    int have = have_usable(s, key, &k);
    if (have != 0)
        return have > 0 ? 0 : -1;
    size_t parts = 0;
    for (size_t off = 0; off < size; parts++)
        off += part_len(data, size, parts, off);
    st_part_id id = {r->id, key, {0}, parts, size};
    if (r->mac.kdf) {
        if (st_mac_nonce(id.nonce) != 0 || !(macs = malloc(parts * 2 * ST_TAG_BYTES + 1)) ||
            !(mc = st_mac_upload(&r->mac, &id))) { /* the upload's own key: drawn after its nonce */
            st_remote_warn(
                s, "shared tier %s: %s: not written (no random bytes or memory for its MAC)",
                r->name, key);
            free(macs);
            return -1;
        }
        snprintf(mac_key, sizeof mac_key, "%s", r->mac.id);
        tohex(id.nonce, ST_NONCE_BYTES, nonce_hex);
        macs[0] = 0;
    }
    /* Uploaded under its own name, expiring, then committed at once. */
    redisReply *rep;
    size_t i = 0;
    for (size_t off = 0; off < size; i++) {
        size_t n = part_len(data, size, i, off);
        if (macs) {
            uint8_t tag[ST_TAG_BYTES];
            if (st_mac_part(mc, &id, i, (const char *)data + off, n, tag) != 0) {
                st_remote_warn(s, "shared tier %s: %s: not written (its MAC failed in libcrypto)",
                               r->name, key);
                goto done;
            }
            tohex(tag, ST_TAG_BYTES, macs + i * 2 * ST_TAG_BYTES);
        }
        if (!(rep = cmdf(s, "RPUSH %s %b", k.t, (const char *)data + off, n)))
            goto done;
        freeReplyObject(rep);
        if (i == 0) {
            if (!(rep = cmdf(s, "EXPIRE %s %d", k.t, ST_UPLOAD_TTL)))
                goto done;
            freeReplyObject(rep);
        }
        off += n;
    }
    cb_hash128_hex(cb_hash128_bytes(data, size), sum);
    snprintf(num[0], 32, "%zu", size);
    snprintf(num[1], 32, "%lld", (long long)n_tokens);
    snprintf(num[2], 32, "%lld", (long long)st_now_us());
    snprintf(num[3], 32, "%llu", (unsigned long long)r->cap);
    snprintf(num[4], 32, "%zu", parts);
    const char *argv[] = {
        "EVAL",           LUA_COMMIT, "5", k.m,    k.t,    k.v,    k.lru, k.used,  key,
        num[0],           num[1],     sum, num[2], num[3], num[4], r->id, mac_key, nonce_hex,
        macs ? macs : "", ST_MAC_ALG};
    if (!(rep = cmd_argv(s, 20, argv, NULL)))
        goto done;
    long long res = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -3;
    freeReplyObject(rep);
    if (res == -1)
        st_remote_warn(s, "shared tier %s: no room for %s (%zu bytes, capacity %llu)", r->name, key,
                       size, (unsigned long long)r->cap);
    rc = res >= 0 ? 0 : -1;
done:
    st_mac_ctx_free(mc);
    free(macs);
    return rc;
}

/* ---------------------------------------------------------------- get */

static int64_t int_of(const redisReply *e)
{
    return e && e->type == REDIS_REPLY_STRING ? strtoll(e->str, NULL, 10) : -1;
}

/* Read key's metadata into *m (m->tags to be freed), recording the access
 * (hits, LRU time) when record and this user may write: 1 found, 0
 * missing or unreachable. */
static int touch_meta(cb_store *s, const char *key, int record, const rkeys *k, rmeta *m)
{
    char now[32];
    redisReply *rep = NULL;
    memset(m, 0, sizeof *m);
    if (record && !s->remote.ro) {
        snprintf(now, sizeof now, "%lld", (long long)st_now_us());
        const char *argv[] = {"EVAL", LUA_TOUCH, "2", k->m, k->lru, key, now, "1"};
        s->remote.quiet =
            1; /* a read-only user (NOPERM) reads without recording: not worth a warning */
        rep = cmd_argv(s, 8, argv, NULL);
        s->remote.quiet = 0;
        if (!rep && (!s->remote.ro || !s->remote.ctx))
            return 0;
    }
    if (!rep &&
        !(rep = cmdf(
              s,
              "HMGET %s bytes checksum parts tokens created last_access hits mac_key mac_nonce macs mac_alg",
              k->m))) /* as LUA_TOUCH without recording: a read-only user's way */
        return 0;
    int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= 3 &&
             rep->element[0]->type == REDIS_REPLY_STRING;
    if (ok) {
        m->bytes = int_of(rep->element[0]);
        m->parts = int_of(rep->element[2]);
        snprintf(m->want, sizeof m->want, "%s",
                 rep->element[1]->type == REDIS_REPLY_STRING ? rep->element[1]->str : "");
        meta_macs(m, rep);
    }
    freeReplyObject(rep);
    return ok;
}

/* Fetch key's bytes into *out (malloc'd): 1 found and its checksum right
 * (and with a tier key every part's MAC), 0 missing or unreachable, -1 bad
 * (dropped when drop_bad, with a warning). */
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
    keys_of(s, key, &k);
    if (!touch_meta(s, key, record && !s->readonly, &k, &m))
        return 0;
    if (!(rep = cmdf(s, "LRANGE %s 0 -1", k.v))) {
        free(m.tags);
        return 0;
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
        freeReplyObject(rep);
        free(m.tags);
        return 0; /* evicted meanwhile */
    }
    const char *bad = NULL;
    int forged = 0;
    size_t total = 0;
    for (size_t i = 0; i < rep->elements; i++)
        total += rep->element[i]->type == REDIS_REPLY_STRING ? rep->element[i]->len : 0;
    if (m.bytes < 0 || m.parts != (int64_t)rep->elements || total != (uint64_t)m.bytes)
        bad = "its size does not match its metadata";
    else if (mac_usable(s, &m, why, sizeof why) != 0)
        bad = why, forged = 1;
    if (!bad && r->mac.kdf) {
        st_part_id id;
        part_id(s, key, &m, &id);
        st_mac_ctx *mc = st_mac_upload(&r->mac, &id);
        if (!mc) {
            freeReplyObject(rep);
            free(m.tags);
            return 0; /* no memory: a miss, the entry left as it is */
        }
        for (size_t i = 0; i < rep->elements && !bad; i++)
            if (!st_mac_check(mc, &id, i, rep->element[i]->str, rep->element[i]->len,
                              m.tags + i * ST_TAG_BYTES)) {
                snprintf(why, sizeof why,
                         "part %zu: its MAC does not verify (forged, or changed in Redis)", i);
                bad = why, forged = 1;
            }
        st_mac_ctx_free(mc);
    }
    uint8_t *buf = bad ? NULL : malloc(total ? total : 1);
    if (!bad && !buf) {
        freeReplyObject(rep);
        free(m.tags);
        return 0;
    }
    if (!bad) {
        size_t off = 0;
        for (size_t i = 0; i < rep->elements; i++) {
            memcpy(buf + off, rep->element[i]->str, rep->element[i]->len);
            off += rep->element[i]->len;
        }
        cb_hash128_hex(cb_hash128_bytes(buf, total), sum);
        if (strcmp(sum, m.want) != 0)
            bad = "its checksum does not match";
    }
    freeReplyObject(rep);
    free(m.tags);
    if (bad) {
        free(buf);
        snprintf(r->why, sizeof r->why, "%s", bad);
        r->n_refused += forged;
        st_remote_warn(s, "shared tier %s: %s: %s; %sthe chunk is computed", r->name, key, bad,
                       drop_bad && !s->readonly && !r->ro ? "dropped, " : "");
        if (drop_bad && !s->readonly)
            drop(s, key, m.want);
        return -1;
    }
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
    if (!st_remote_up(s))
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s) cannot be used: %s",
                            s->remote.name, s->remote.url, s->remote.why);
    cb_status st = drop(s, key, NULL);
    if (st == CB_ERR_CREATE)
        return cb_error_set(err, CB_ERR_CREATE, "shared tier %s: this user may not write it (%s)",
                            s->remote.name, s->remote.why);
    if (st != CB_OK)
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): %s", s->remote.name,
                            s->remote.url, s->remote.why);
    return CB_OK;
}

/* A fetched entry failed the local verification: drop it. */
void st_remote_reject(cb_store *s, const char *key, const char *why)
{
    st_remote_warn(s, "shared tier %s: %s: %s; dropped, the chunk is computed", s->remote.name, key,
                   why);
    if (!s->readonly && st_remote_up(s))
        drop(s, key, NULL);
}

/* --------------------------------------------------------- list, stat */

cb_status st_remote_list(cb_store *s, const char *model,
                         int (*fn)(void *ctx, const cb_store_entry *e), void *ctx, int *stopped,
                         cb_error *err)
{
    st_remote *r = &s->remote;
    rkeys k;
    *stopped = 0;
    if (!st_remote_up(s))
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s) cannot be used: %s", r->name,
                            r->url, r->why);
    keys_of(s, "x", &k);
    redisReply *all = cmdf(s, "ZREVRANGE %s 0 -1", k.lru);
    if (!all)
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s): listing failed", r->name, r->url);
    for (size_t i = 0; all->type == REDIS_REPLY_ARRAY && i < all->elements && !*stopped; i++) {
        const char *key = all->element[i]->str;
        if (!key || !st_key_valid(key) || (model && strncmp(key, model, 32) != 0))
            continue;
        keys_of(s, key, &k);
        redisReply *m = cmdf(s, "HMGET %s bytes checksum tokens created last_access hits", k.m);
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
    if (!st_remote_up(s))
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s) cannot be used: %s", r->name,
                            r->url, r->why);
    keys_of(s, "x", &k);
    redisReply *a = cmdf(s, "ZCARD %s", k.lru), *b = a ? cmdf(s, "GET %s", k.used) : NULL;
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

/* Recount the accounting; then every entry is fetched and checked (verify)
 * and bad ones dropped when fix.  problems counted in *bad. */
cb_status st_remote_check(cb_store *s, int fetch, int fix,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          uint64_t *n_entries, uint64_t *n_bad, uint64_t *n_bytes, cb_error *err)
{
    st_remote *r = &s->remote;
    rkeys k;
    *n_entries = *n_bad = 0;
    if (!st_remote_up(s))
        return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s) cannot be used: %s", r->name,
                            r->url, r->why);
    keys_of(s, "x", &k);
    if (fix) {
        const char *argv[] = {"EVAL", LUA_RECOUNT, "2", k.lru, k.used, r->id};
        redisReply *rep = cmd_argv(s, 6, argv, NULL);
        if (!rep)
            return cb_error_set(err, CB_ERR_IO, "shared tier %s: recount failed", r->name);
        freeReplyObject(rep);
    }
    if (!fetch)
        return CB_OK;
    redisReply *all = cmdf(s, "ZRANGE %s 0 -1", k.lru);
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
        keys_of(s, key, &k);
        redisReply *m = cmdf(s, "HMGET %s checksum bytes", k.m);
        if (!m)
            break;
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
                    drop(s, key, want);
            }
            free(buf);
        } else if (got < 0) {
            snprintf(why, sizeof why, "%s", r->why);
            (*n_bad)++;
            if (fix)
                drop(s, key, want);
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
    return CB_OK;
}

/* ------------------------------------------------------------- stream */

/* An entry read layer by layer (cb_store_open_kv): every part requested
 * at once on a connection of its own (the server queues the replies), and
 * received in order by a thread of the stream's own, which checks each
 * part (with a tier key, against its MAC) before it puts it into buf and
 * publishes it; the KV reader waits for the bytes it asks for, so that the
 * receiving and checking of layer l+1 runs while layer l is converted and
 * computed on.  The parts are kept in buf, for re-reads and for keeping the
 * entry locally afterwards (st_stream_finish), where the whole value is
 * checked against its metadata.  The reader never sees a byte of a part
 * that failed.  Besides the receiver, one thread at a time uses it: the
 * reader's (the loader's), then the store's. */
struct st_stream {
    redisContext *c; /* the receiver's; freed with the stream */
    char key[66];
    char name[120]; /* "shared tier NAME: KEY", for messages */
    char want[33];  /* XXH3-128 of the whole value, from its metadata */
    uint8_t *buf;   /* [size]: [0, have) published, written by the receiver only beyond */
    int64_t parts;  /* parts in the value */
    uint64_t size;
    int timeout_ms;
    st_mac_ctx
        *mac;       /* the upload's GMAC key (a context of the receiver's own), NULL: no tier key */
    st_part_id pid; /* what the tags bind (pid.sid points at sid, pid.key at key) */
    char sid[33];
    uint8_t *tags; /* [parts][ST_TAG_BYTES] */
    pthread_t th;
    int th_on;          /* the receiver was started */
    pthread_mutex_t mu; /* guards what follows */
    pthread_cond_t cv;  /* a part published, or a failure */
    uint64_t have;      /* bytes published */
    int64_t got;        /* parts published */
    int refs;           /* the KV reader and the store reference */
    int stop;           /* the last reference went: the receiver ends */
    int failed;         /* the receiver ended on a failure (why) */
    int down;           /* the connection failed or timed out (not the entry's fault) */
    int gone;           /* a part was missing: evicted or dropped meanwhile (not corrupt) */
    int forged;         /* a part's MAC did not verify */
    char why[200];      /* the first failure */
};

static void stream_unref(void *ctx)
{
    st_stream *x = ctx;
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    int last = --x->refs <= 0;
    x->stop |= last;
    pthread_mutex_unlock(&x->mu);
    if (!last)
        return;
    if (x->th_on) {
        if (x->c)
            shutdown(x->c->fd, SHUT_RDWR); /* a receiver waiting on the socket wakes */
        pthread_join(x->th, NULL);
    }
    if (x->c)
        redisFree(x->c);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    st_mac_ctx_free(x->mac);
    free(x->tags);
    free(x->buf);
    free(x);
}

/* Record the first failure (lock held) and wake whoever waits. */
static void fail_locked(st_stream *x, int down, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_locked(st_stream *x, int down, const char *fmt, ...)
{
    va_list ap;
    if (!x->why[0]) {
        va_start(ap, fmt);
        vsnprintf(x->why, sizeof x->why, fmt, ap);
        va_end(ap);
        x->down = down;
    }
    x->failed = 1;
    pthread_cond_broadcast(&x->cv);
}

/* The stream's failure as a status (lock held). */
static cb_status stream_err(const st_stream *x, cb_error *err)
{
    return cb_error_set(err, x->down ? CB_ERR_IO : CB_ERR_FORMAT, "%s: %s", x->name, x->why);
}

/* The next reply, within the time-out (each read is bounded by the
 * socket's time-out too, so a part takes at most about twice it). */
static redisReply *stream_reply(st_stream *x)
{
    void *rep = NULL;
    int64_t deadline = st_now_us() + (int64_t)x->timeout_ms * 1000;
    if (redisGetReplyFromReader(x->c, &rep) != REDIS_OK)
        return NULL;
    while (!rep) {
        if (st_now_us() > deadline) {
            snprintf(x->c->errstr, sizeof x->c->errstr, "timed out after %d ms", x->timeout_ms);
            return NULL;
        }
        if (redisBufferRead(x->c) != REDIS_OK || redisGetReplyFromReader(x->c, &rep) != REDIS_OK)
            return NULL;
    }
    return rep;
}

/* The receiver: each part received, checked, put into buf, published. */
static void *stream_main(void *arg)
{
    st_stream *x = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the program's threads' */
    for (int64_t i = 0; i < x->parts; i++) {
        pthread_mutex_lock(&x->mu);
        int stop = x->stop;
        uint64_t have = x->have;
        pthread_mutex_unlock(&x->mu);
        if (stop)
            break;
        redisReply *rep = stream_reply(x);
        int timed_out =
            !rep && x->c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
        const char *bad = NULL;
        int mac_bad = 0;
        if (rep && rep->type == REDIS_REPLY_STRING && rep->len <= x->size - have)
            mac_bad = x->mac && !st_mac_check(x->mac, &x->pid, (uint64_t)i, rep->str, rep->len,
                                              x->tags + i * ST_TAG_BYTES);
        else if (rep && rep->type == REDIS_REPLY_STRING)
            bad = "its size does not match its metadata";
        if (rep && !bad && !mac_bad && rep->type == REDIS_REPLY_STRING)
            memcpy(x->buf + have, rep->str,
                   rep->len); /* before publishing: nobody reads there yet */
        pthread_mutex_lock(&x->mu);
        if (timed_out)
            fail_locked(x, 1, "timed out after %d ms", x->timeout_ms);
        else if (!rep)
            fail_locked(x, 1, "%s", x->c->errstr[0] ? x->c->errstr : "no reply");
        else if (rep->type == REDIS_REPLY_NIL) {
            x->gone = !x->why[0];
            fail_locked(x, 0, "part %lld is missing (evicted or dropped meanwhile)", (long long)i);
        } else if (rep->type != REDIS_REPLY_STRING)
            fail_locked(x, rep->type == REDIS_REPLY_ERROR, "part %lld: %s", (long long)i,
                        rep->type == REDIS_REPLY_ERROR ? rep->str : "not a string");
        else if (bad)
            fail_locked(x, 0, "%s", bad);
        else if (mac_bad) {
            x->forged = !x->why[0];
            fail_locked(x, 0, "part %lld: its MAC does not verify (forged, or changed in Redis)",
                        (long long)i);
        } else {
            x->have += rep->len;
            x->got++;
            pthread_cond_broadcast(&x->cv);
        }
        int failed = x->failed;
        pthread_mutex_unlock(&x->mu);
        if (rep)
            freeReplyObject(rep);
        if (failed)
            break;
    }
    return NULL;
}

/* Wait until the receiver has published `until` bytes (or every part, or
 * failed): CB_OK when it has, else the failure with err set. */
static cb_status stream_wait(st_stream *x, uint64_t until, cb_error *err)
{
    cb_status st = CB_OK;
    pthread_mutex_lock(&x->mu);
    while (x->have < until && x->got < x->parts && !x->failed)
        pthread_cond_wait(&x->cv, &x->mu);
    if (x->have < until) {
        if (!x->failed)
            fail_locked(x, 0, "its parts end at %llu of %llu bytes", (unsigned long long)x->have,
                        (unsigned long long)x->size);
        st = stream_err(x, err);
    }
    pthread_mutex_unlock(&x->mu);
    return st;
}

static cb_status stream_read(void *ctx, uint64_t off, void *buf, size_t n, cb_error *err)
{
    st_stream *x = ctx;
    cb_status st;
    if (off > x->size || n > x->size - off)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: a read past its %llu bytes", x->name,
                            (unsigned long long)x->size);
    if ((st = stream_wait(x, off + n, err)) != CB_OK)
        return st;
    memcpy(buf, x->buf + off, n); /* published bytes never change */
    return CB_OK;
}

/* Ask for every part of key's value on a new connection. */
static int stream_request(cb_store *s, st_stream *x, const char *vkey, char *why, size_t why_n)
{
    int db, done = 0;
    pipe_guard g;
    char idx[24];
    if (!(x->c = connect_to(&s->remote, &db, why, why_n)))
        return -1;
    if (db > 0)
        redisAppendCommand(x->c, "SELECT %d", db);
    for (int64_t i = 0; i < x->parts; i++) {
        snprintf(idx, sizeof idx, "%lld", (long long)i);
        const char *argv[] = {"LINDEX", vkey, idx};
        redisAppendCommandArgv(x->c, 3, argv, NULL);
    }
    pipe_block(&g);
    while (!done && redisBufferWrite(x->c, &done) == REDIS_OK)
        ;
    pipe_restore(&g);
    if (!done) {
        snprintf(why, why_n, "%s", x->c->errstr[0] ? x->c->errstr : "cannot send");
        return -1;
    }
    redisReply *rep = db > 0 ? stream_reply(x) : NULL;
    if (db > 0 && (!rep || rep->type == REDIS_REPLY_ERROR)) {
        snprintf(why, why_n, "SELECT %d: %s", db, rep ? rep->str : x->c->errstr);
        if (rep)
            freeReplyObject(rep);
        return -1;
    }
    if (rep)
        freeReplyObject(rep);
    return 0;
}

int st_remote_stream(cb_store *s, const char *key, cb_kvfile **kf, st_stream **out)
{
    st_remote *r = &s->remote;
    rkeys k;
    rmeta m;
    char why[320];
    *kf = NULL;
    *out = NULL;
    if (!st_remote_up(s))
        return 0;
    keys_of(s, key, &k);
    if (!touch_meta(s, key, !s->readonly, &k, &m))
        return 0;
    st_stream *x = calloc(1, sizeof *x);
    if (!x) {
        free(m.tags);
        return 0;
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    memcpy(x->want, m.want, sizeof x->want);
    snprintf(x->key, sizeof x->key, "%s", key);
    snprintf(x->name, sizeof x->name, "shared tier %s: %s", r->name, key);
    x->timeout_ms = r->timeout_ms;
    x->refs = 1;
    x->tags = m.tags;
    if (m.bytes <= 0 || m.parts <= 0 || m.parts > m.bytes || m.parts > ST_MAX_PARTS ||
        (uint64_t)m.bytes > SIZE_MAX / 2) {
        st_remote_warn(s, "%s: its metadata is malformed; %sthe chunk is computed", x->name,
                       s->readonly || r->ro ? "" : "dropped, ");
        if (!s->readonly)
            drop(s, key, x->want);
        stream_unref(x);
        return -1;
    }
    if (mac_usable(s, &m, why, sizeof why) != 0) {
        r->n_refused++;
        st_remote_warn(s, "%s: %s; %sthe chunk is computed", x->name, why,
                       s->readonly || r->ro ? "" : "dropped, ");
        if (!s->readonly)
            drop(s, key, x->want);
        stream_unref(x);
        return -1;
    }
    x->size = (uint64_t)m.bytes;
    x->parts = m.parts;
    if (r->mac.kdf) {
        memcpy(x->sid, r->id, sizeof x->sid);
        part_id(s, x->key, &m, &x->pid);
        x->pid.sid = x->sid;
        if (!(x->mac = st_mac_upload(&r->mac, &x->pid))) {
            stream_unref(x);
            return 0;
        }
    }
    if (!(x->buf = malloc((size_t)x->size))) {
        stream_unref(x);
        return 0;
    }
    if (stream_request(s, x, k.v, why, sizeof why) != 0) {
        st_remote_warn(s, "shared tier %s (%s): %s; not used for 5 s (what it holds is computed)",
                       r->name, r->url, why);
        r->down_until = st_now_us() + ST_RETRY_US;
        disconnect(r);
        stream_unref(x);
        return 0;
    }
    if (pthread_create(&x->th, NULL, stream_main, x) != 0) {
        stream_unref(x);
        return 0;
    }
    x->th_on = 1;
    /* The reader verifies the header part now, each layer part when read. */
    cb_kv_source src = {stream_read, stream_unref, x, x->size, x->name};
    cb_error err;
    x->refs = 2;
    if (cb_kvfile_open_source(kf, &src, &err) != CB_OK) { /* it released the reader's hold */
        int down = st_stream_bad(s, x, err.msg) == 2;
        stream_unref(x);
        return down ? 0 : -1;
    }
    *out = x;
    return 1;
}

void st_stream_unref(st_stream *x) { stream_unref(x); }

const char *st_stream_key(const st_stream *x) { return x->key; }

int st_stream_bad(cb_store *s, st_stream *x, const char *why)
{
    st_remote *r = &s->remote;
    pthread_mutex_lock(&x->mu);
    int down = x->down, gone = x->gone, forged = x->forged;
    x->forged = 0; /* counted once */
    pthread_mutex_unlock(&x->mu);
    if (down) {
        st_remote_warn(s, "shared tier %s (%s): %s; not used for 5 s (what it holds is computed)",
                       r->name, r->url, x->why);
        r->down_until = st_now_us() + ST_RETRY_US;
        disconnect(r);
        return 2;
    }
    /* why names the entry (the reader's or the stream's message); an entry
     * that went away meanwhile is not dropped (it may be back, sound) */
    int fix = !s->readonly && !r->ro && !gone;
    r->n_refused += forged;
    st_remote_warn(s, "%s; %sthe chunk is computed", why, fix ? "dropped, " : "");
    if (fix && st_remote_up(s))
        drop(s, x->key, x->want);
    return 1;
}

int st_stream_finish(cb_store *s, st_stream *x, const void **data, size_t *size)
{
    cb_error err;
    char sum[33];
    if (stream_wait(x, x->size, &err) != CB_OK) {
        st_stream_bad(s, x, err.msg);
        return 0;
    }
    pthread_mutex_lock(&x->mu);
    int whole = x->got == x->parts && x->have == x->size;
    if (!whole)
        fail_locked(x, 0, "its size does not match its metadata");
    pthread_mutex_unlock(&x->mu);
    if (whole) {
        cb_hash128_hex(cb_hash128_bytes(x->buf, (size_t)x->size), sum);
        if (strcmp(sum, x->want) != 0) {
            pthread_mutex_lock(&x->mu);
            fail_locked(x, 0, "its checksum does not match");
            pthread_mutex_unlock(&x->mu);
            whole = 0;
        }
    }
    if (!whole) {
        pthread_mutex_lock(&x->mu);
        stream_err(x, &err);
        pthread_mutex_unlock(&x->mu);
        st_stream_bad(s, x, err.msg);
        return 0;
    }
    *data = x->buf;
    *size = (size_t)x->size;
    return 1;
}

cb_status cb_store_shared_auth_info(cb_store *s, cb_store_shared_auth *out, cb_error *err)
{
    st_remote *r = &s->remote;
    cb_status st;
    memset(out, 0, sizeof *out);
    if (!r->url)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: the store has no shared tier", s->dir);
    if ((st = st_remote_secrets(r, err)) != CB_OK)
        return st;
    out->authenticated = r->mac.kdf != NULL;
    snprintf(out->key_id, sizeof out->key_id, "%s", r->mac.id);
    snprintf(out->user, sizeof out->user, "%s", r->user);
    out->password = r->pass[0] != 0;
    out->read_only = r->ro;
    out->n_refused = r->n_refused;
    return CB_OK;
}
