/* remote_conn.c - the shared tier's connection (remote.c): its address,
 * its secrets, connecting and logging in (AUTH [USER] PASSWORD), commands
 * and what a failed one means (down for ST_RETRY_US, or read-only). */
#include "remote_impl.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

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

void st_remote_disconnect(st_remote *r)
{
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
}

void st_remote_close(st_remote *r)
{
    st_remote_disconnect(r);
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

void st_pipe_block(st_pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    g->pending_before = sigismember(&pend, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

void st_pipe_restore(st_pipe_guard *g)
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

void st_remote_went_down(cb_store *s, const char *why, int for_run)
{
    st_remote *r = &s->remote;
    snprintf(r->why, sizeof r->why, "%s", why);
    st_remote_warn(s, "shared tier %s (%s): %s; %s (its entries are misses)", r->name, r->url, why,
                   for_run ? "not used again by this process" : "not used for 5 s");
    st_remote_disconnect(r);
    r->down_until = for_run ? INT64_MAX : st_now_us() + ST_RETRY_US;
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

/* rep, or NULL after marking the tier down (no reply: for ST_RETRY_US;
 * the request timed out or the login was refused: for the rest of the
 * handle's life, as neither mends within a run; warned once) or after an
 * error reply (warned, freed; NOPERM, a write this user may not make,
 * turns the tier read-only for this handle, warned once). */
static redisReply *checked(cb_store *s, redisReply *rep, int timed_out)
{
    st_remote *r = &s->remote;
    char buf[300];
    if (!rep) {
        st_remote_went_down(s, r->ctx->errstr[0] ? r->ctx->errstr : "no reply", timed_out);
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        const char *login = login_refused(r, rep->str, buf, sizeof buf);
        if (login) {
            r->refused_login = 1;
            st_remote_went_down(s, login, 1);
        } else if (strstr(rep->str, "NOPERM")) {
            if (!r->ro && !r->quiet)
                st_remote_warn(
                    s, "shared tier %s (%s): %s%s may not write (%s): it is read from only",
                    r->name, r->url, r->user[0] ? "user " : "this user", r->user, rep->str);
            r->ro = 1;
            r->ro_warned |= !r->quiet; /* put says nothing more */
            snprintf(r->why, sizeof r->why, "%s", rep->str);
        } else if (strstr(rep->str, "WRONGTYPE")) {
            /* an entry's key of another type: the caller's to mend (ST_WRONGTYPE) */
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

/* Microseconds on a clock that no one sets: deadlines. */
static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t st_remote_deadline(int timeout_ms) { return mono_us() + (int64_t)timeout_ms * 1000; }

/* Milliseconds left before deadline (at least 1), or 0 when it has passed:
 * then c's error says the request timed out after timeout_ms. */
static int left_ms(redisContext *c, int64_t deadline, int timeout_ms)
{
    int64_t left = deadline - mono_us();
    if (left > 0)
        return (int)((left + 999) / 1000);
    c->err = REDIS_ERR_IO;
    snprintf(c->errstr, sizeof c->errstr, "timed out after %d ms", timeout_ms);
    return 0;
}

/* A failed read or write on c as a time-out when it is one. */
static void io_failed(redisContext *c, int64_t deadline, int timeout_ms, int *timed_out)
{
    /* a write that ran out of time fails with EAGAIN */
    if (errno != EAGAIN && errno != EWOULDBLOCK && mono_us() < deadline)
        return;
    snprintf(c->errstr, sizeof c->errstr, "timed out after %d ms", timeout_ms);
    *timed_out = 1;
}

int st_remote_flush(redisContext *c, int64_t deadline, int timeout_ms, int *timed_out)
{
    int done = 0, ms;
    *timed_out = 0;
    if (c->err)
        return -1;
    /* Each write is bounded by the time left (a send time-out: a blocking
     * write of a large command waits for the server to read it). */
    while (!done) {
        if (!(ms = left_ms(c, deadline, timeout_ms))) {
            *timed_out = 1;
            return -1;
        }
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (redisBufferWrite(c, &done) != REDIS_OK) {
            io_failed(c, deadline, timeout_ms, timed_out);
            return -1;
        }
    }
    return 0;
}

redisReply *st_remote_reply(redisContext *c, int64_t deadline, int timeout_ms, int *timed_out)
{
    void *rep = NULL;
    int ms;
    /* What was appended goes out first; then the reply comes in as the
     * socket has bytes for it, each wait at most the time left. */
    if (st_remote_flush(c, deadline, timeout_ms, timed_out) != 0)
        return NULL;
    if (redisGetReplyFromReader(c, &rep) != REDIS_OK)
        return NULL;
    while (!rep) {
        struct pollfd p = {c->fd, POLLIN, 0};
        if (!(ms = left_ms(c, deadline, timeout_ms))) {
            *timed_out = 1;
            return NULL;
        }
        int n = poll(&p, 1, ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            continue; /* left_ms says it timed out */
        if (n < 0) {
            c->err = REDIS_ERR_IO;
            snprintf(c->errstr, sizeof c->errstr, "poll: %s", strerror(errno));
            return NULL;
        }
        if (redisBufferRead(c) != REDIS_OK) {
            io_failed(c, deadline, timeout_ms, timed_out);
            return NULL;
        }
        if (redisGetReplyFromReader(c, &rep) != REDIS_OK)
            return NULL;
    }
    return rep;
}

/* A reply, or NULL after marking the tier down (warned once per outage). */
redisReply *st_remote_cmd_argv(cb_store *s, int argc, const char **argv, const size_t *len)
{
    st_remote *r = &s->remote;
    st_pipe_guard g;
    redisReply *rep = NULL;
    int timed_out = 0;
    st_pipe_block(&g);
    if (redisAppendCommandArgv(r->ctx, argc, argv, len) == REDIS_OK)
        rep = st_remote_reply(r->ctx, st_remote_deadline(r->timeout_ms), r->timeout_ms, &timed_out);
    st_pipe_restore(&g);
    return checked(s, rep, timed_out);
}

redisReply *st_remote_cmdf(cb_store *s, const char *fmt, ...)
{
    st_remote *r = &s->remote;
    va_list ap;
    st_pipe_guard g;
    redisReply *rep = NULL;
    int timed_out = 0, ok;
    st_pipe_block(&g);
    va_start(ap, fmt);
    ok = redisvAppendCommand(r->ctx, fmt, ap) == REDIS_OK;
    va_end(ap);
    if (ok)
        rep = st_remote_reply(r->ctx, st_remote_deadline(r->timeout_ms), r->timeout_ms, &timed_out);
    st_pipe_restore(&g);
    return checked(s, rep, timed_out);
}

/* A new connection to r's server, connected and logged in by one deadline
 * (the time-out); *db the database to select.  NULL with the reason, and
 * *for_run 1 when the failure holds for the run (a time-out, or the login
 * refused: *refused 1). */
redisContext *st_remote_connect(const st_remote *r, int *db, char *why, size_t why_n, int *for_run,
                                int *refused)
{
    char host[1024];
    int port, is_unix;
    *for_run = *refused = 0;
    if (st_remote_parse(r->url, host, sizeof host, &port, db, &is_unix) != 0) {
        snprintf(why, why_n, "malformed address");
        return NULL;
    }
    int64_t deadline = st_remote_deadline(r->timeout_ms);
    struct timeval tv = {r->timeout_ms / 1000, (r->timeout_ms % 1000) * 1000};
    redisContext *c =
        is_unix ? redisConnectUnixWithTimeout(host, tv) : redisConnectWithTimeout(host, port, tv);
    if (!c || c->err) {
        int e = errno; /* hiredis' connect sets ETIMEDOUT when its time-out passes */
        snprintf(why, why_n, "%s", c ? c->errstr : "out of memory");
        *for_run = c && c->err == REDIS_ERR_IO && e == ETIMEDOUT;
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    if (r->pass[0]) {
        /* AUTH [USER] PASSWORD, as arguments: never formatted into text */
        const char *argv[] = {"AUTH", r->user, r->pass};
        int argc = 3, timed_out = 0;
        if (!r->user[0])
            argv[1] = r->pass, argc = 2;
        st_pipe_guard g; /* a server gone meanwhile: EPIPE, not SIGPIPE */
        st_pipe_block(&g);
        redisReply *rep = NULL;
        if (redisAppendCommandArgv(c, argc, argv, NULL) == REDIS_OK)
            rep = st_remote_reply(c, deadline, r->timeout_ms, &timed_out);
        st_pipe_restore(&g);
        char buf[300];
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            const char *login = rep ? login_refused(r, rep->str, buf, sizeof buf) : NULL;
            snprintf(why, why_n, "%s",
                     login          ? login
                     : rep          ? rep->str
                     : c->errstr[0] ? c->errstr
                                    : "no reply to AUTH");
            *refused = login != NULL;
            *for_run = timed_out || *refused;
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
        st_remote_warn(s, "shared tier %s (%s): %s; it is not used (its entries are misses)",
                       r->name, r->url, e.msg);
        return 0;
    }
    int db, for_run, refused;
    char why[320];
    if (!(r->ctx = st_remote_connect(r, &db, why, sizeof why, &for_run, &refused))) {
        r->refused_login |= refused;
        st_remote_went_down(s, why, for_run);
        return 0;
    }
    if (db > 0) {
        redisReply *rep = st_remote_cmdf(s, "SELECT %d", db);
        if (!rep)
            return 0;
        freeReplyObject(rep);
    }
    r->down_until = 0;
    st_remote_register(s); /* a server restarted empty: its id again */
    return r->ctx != NULL;
}

/* CB_OK when st_remote_up, else CB_ERR_IO naming the tier and why it is
 * down (for the operations that need it rather than fall back) */
cb_status st_remote_need(cb_store *s, cb_error *err)
{
    st_remote *r = &s->remote;
    if (st_remote_up(s))
        return CB_OK;
    return cb_error_set(err, CB_ERR_IO, "shared tier %s (%s) cannot be used: %s", r->name, r->url,
                        r->why);
}

/* The shared tier's id: the one in Redis under cb:tier:NAME, made when
 * missing.  0 with id, -1 when Redis cannot be reached. */
int st_remote_id(cb_store *s, const char *name, char id[33])
{
    st_remote *r = &s->remote;
    char fresh[33];
    st_random_hex(fresh, 32);
    redisReply *rep = st_remote_cmdf(s, "SET cb:tier:%s %s NX", name, fresh);
    if (rep)
        freeReplyObject(rep);
    else if (!r->ro || !r->ctx)
        return -1; /* a read-only user may still find the tier made */
    if (!(rep = st_remote_cmdf(s, "GET cb:tier:%s", name)))
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

cb_status cb_store_shared_auth_info(cb_store *s, cb_store_shared_auth *out, cb_error *err)
{
    st_remote *r = &s->remote;
    cb_status st;
    memset(out, 0, sizeof *out);
    if (!r->url)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: the store has no shared tier", s->dir);
    if ((st = st_remote_secrets(r, err)) != CB_OK)
        return st;
    out->authenticated = r->mac.kdf != NULL && !r->refused_login;
    out->login_refused = r->refused_login;
    snprintf(out->key_id, sizeof out->key_id, "%s", r->mac.id);
    snprintf(out->user, sizeof out->user, "%s", r->user);
    out->password = r->pass[0] != 0;
    out->read_only = r->ro;
    out->n_refused = r->n_refused;
    out->n_resealed = r->n_resealed;
    return CB_OK;
}
