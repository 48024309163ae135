/* remote_stream.c - entries of the shared tier (remote.c) read layer by
 * layer, a thread receiving and checking the parts. */
#include "remote_impl.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* An entry read layer by layer (cb_store_open_kv): every part requested
 * at once on a connection of its own (the server queues the replies), and
 * received in order by a thread of the stream's own, which checks each
 * part (with a tier key, against its tag, decrypting a sealed one) before
 * it puts it into buf and publishes it; the KV reader waits for the bytes
 * it asks for, so that the receiving, decrypting and checking of layer l+1
 * runs while layer l is converted and computed on.  The parts are kept in
 * buf, in clear, for re-reads and for keeping the entry locally afterwards
 * (st_stream_finish), where the whole value is checked against its
 * metadata (a sealed value's tags have bound every part, its place, the
 * count and the size already; its checksum is the ciphertext's, which buf
 * no longer holds).  The reader never sees a byte of a part that failed.
 * Besides the receiver, one thread at a time uses it: the reader's (the
 * loader's), then the store's. */
struct st_stream {
    redisContext *c; /* the receiver's; freed with the stream */
    char key[66];
    char name[120]; /* "shared tier NAME: KEY", for messages */
    char want[33];  /* XXH3-128 of the whole value, from its metadata */
    uint8_t *buf;   /* [size]: [0, have) published, written by the receiver only beyond */
    int64_t parts;  /* parts in the value */
    uint64_t size;
    int timeout_ms;
    st_mac_ctx *mac;   /* a v2 upload's GMAC key (a context of the receiver's own), or NULL */
    st_seal_ctx *seal; /* a sealed upload's AES-256-GCM key (the receiver's), or NULL */
    int64_t tokens;    /* as the metadata says, for rewriting a v2 entry sealed */
    st_part_id pid;    /* what the tags bind (pid.sid points at sid, pid.key at key) */
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
    int timed_out;      /* it timed out: the tier is down for the run */
    int gone;           /* a part was missing or of another type: evicted meanwhile, or broken */
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
    st_seal_ctx_free(x->seal);
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

/* The next reply, within the time-out (each part has the time-out to
 * arrive whole); *timed_out 1 when it did not. */
static redisReply *stream_reply(st_stream *x, int *timed_out)
{
    return st_remote_reply(x->c, st_remote_deadline(x->timeout_ms), x->timeout_ms, timed_out);
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
        int timed_out;
        redisReply *rep = stream_reply(x, &timed_out);
        const char *bad = NULL;
        int mac_bad = 0;
        /* into buf beyond what is published: nobody reads there yet */
        if (rep && rep->type == REDIS_REPLY_STRING && rep->len <= x->size - have && x->seal)
            mac_bad = !st_seal_open(x->seal, &x->pid, (uint64_t)i, rep->str, rep->len,
                                    x->buf + have, x->tags + i * ST_TAG_BYTES);
        else if (rep && rep->type == REDIS_REPLY_STRING && rep->len <= x->size - have)
            mac_bad = x->mac && !st_mac_check(x->mac, &x->pid, (uint64_t)i, rep->str, rep->len,
                                              x->tags + i * ST_TAG_BYTES);
        else if (rep && rep->type == REDIS_REPLY_STRING)
            bad = "its size does not match its metadata";
        if (rep && !bad && !mac_bad && !x->seal && rep->type == REDIS_REPLY_STRING)
            memcpy(x->buf + have, rep->str, rep->len);
        pthread_mutex_lock(&x->mu);
        if (timed_out) {
            x->timed_out = !x->why[0];
            fail_locked(x, 1, "timed out after %d ms", x->timeout_ms);
        } else if (!rep)
            fail_locked(x, 1, "%s", x->c->errstr[0] ? x->c->errstr : "no reply");
        else if (rep->type == REDIS_REPLY_NIL) {
            x->gone = !x->why[0];
            fail_locked(x, 0, "part %lld is missing", (long long)i);
        } else if (rep->type == REDIS_REPLY_ERROR && strstr(rep->str, "WRONGTYPE")) {
            x->gone = !x->why[0]; /* the entry's fault, not the tier's */
            fail_locked(x, 0, "part %lld: %s", (long long)i, rep->str);
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

/* Ask for every part of key's value on a new connection: 0, else -1 with
 * why and *for_run (the failure holds for the run, st_remote_connect). */
static int stream_request(cb_store *s, st_stream *x, const char *vkey, char *why, size_t why_n,
                          int *for_run)
{
    int db, refused, timed_out;
    st_pipe_guard g;
    char idx[24];
    if (!(x->c = st_remote_connect(&s->remote, &db, why, why_n, for_run, &refused)))
        return -1;
    if (db > 0)
        redisAppendCommand(x->c, "SELECT %d", db);
    for (int64_t i = 0; i < x->parts; i++) {
        snprintf(idx, sizeof idx, "%lld", (long long)i);
        const char *argv[] = {"LINDEX", vkey, idx};
        redisAppendCommandArgv(x->c, 3, argv, NULL);
    }
    st_pipe_block(&g);
    int sent =
        st_remote_flush(x->c, st_remote_deadline(x->timeout_ms), x->timeout_ms, &timed_out) == 0;
    st_pipe_restore(&g);
    if (!sent) {
        snprintf(why, why_n, "%s", x->c->errstr[0] ? x->c->errstr : "cannot send");
        *for_run = timed_out;
        return -1;
    }
    redisReply *rep = db > 0 ? stream_reply(x, &timed_out) : NULL;
    if (db > 0 && (!rep || rep->type == REDIS_REPLY_ERROR)) {
        *for_run = !rep && timed_out;
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
    st_remote_keys(s, key, &k);
    int found = st_remote_touch_meta(s, key, !s->readonly, &k, &m);
    if (found <= 0)
        return found;
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
        (uint64_t)m.bytes > SIZE_MAX / 2 || (uint64_t)m.bytes > ST_MAX_BYTES ||
        (r->cap && (uint64_t)m.bytes > r->cap)) {
        /* dropped without counting its bytes out of the tier's, which
         * would be as wrong as they are */
        snprintf(why, sizeof why, "%s: its metadata is malformed", x->name);
        if (st_remote_heal(s, key, x->want, "a miss") <= 0)
            st_remote_refuse(s, key, x->want, NULL, why);
        stream_unref(x);
        return -1;
    }
    int usable = st_remote_mac_usable(s, &m, why, sizeof why);
    if (usable > 0) {
        st_remote_sealed_miss(s, key);
        stream_unref(x);
        return 0;
    }
    if (usable < 0) {
        char msg[sizeof why + sizeof x->name + 2];
        r->n_refused++;
        snprintf(msg, sizeof msg, "%s: %s", x->name, why);
        st_remote_refuse(s, key, x->want, NULL, msg);
        stream_unref(x);
        return -1;
    }
    x->size = (uint64_t)m.bytes;
    x->parts = m.parts;
    if (r->mac.kdf) {
        memcpy(x->sid, r->id, sizeof x->sid);
        st_remote_part_id(s, x->key, &m, &x->pid);
        x->pid.sid = x->sid;
        x->tokens = m.tokens;
        if (m.sealed ? !(x->seal = st_seal_upload(&r->mac, &x->pid))
                     : !(x->mac = st_mac_upload(&r->mac, &x->pid))) {
            stream_unref(x);
            return 0;
        }
    }
    if (!(x->buf = malloc((size_t)x->size))) {
        st_remote_warn(s, "%s: no memory for its %llu bytes; a miss", x->name,
                       (unsigned long long)x->size);
        stream_unref(x);
        return 0;
    }
    int for_run;
    if (stream_request(s, x, k.v, why, sizeof why, &for_run) != 0) {
        st_remote_went_down(s, why, for_run);
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
    int down = x->down, gone = x->gone, forged = x->forged, timed_out = x->timed_out;
    x->forged = 0; /* counted once */
    pthread_mutex_unlock(&x->mu);
    if (down) {
        st_remote_went_down(s, x->why, timed_out);
        return 2;
    }
    /* why names the entry (the reader's or the stream's message); a part
     * missing or of another type: the entry is dropped where its keys are
     * broken, and not where it went away meanwhile (it may be back, sound) */
    r->n_refused += forged;
    if (gone && st_remote_heal(s, x->key, x->want, "a miss") > 0)
        return 1;
    st_remote_refuse(s, x->key, x->want, gone ? "it went away meanwhile" : NULL, why);
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
    if (whole && !x->seal) {
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
    if (x->mac) /* a v2 entry, its tags verified: written again sealed */
        st_remote_reseal(s, x->key, x->buf, (size_t)x->size, x->tokens);
    *data = x->buf;
    *size = (size_t)x->size;
    return 1;
}
