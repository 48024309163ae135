/* remote_impl.h - what the files of the shared tier on Redis share
 * (remote.c: its keys and accounting scripts, put, get, drop;
 * remote_conn.c: the address, the connection with its login, and
 * commands; remote_mac.c: an entry's MAC tags as its metadata holds them;
 * remote_stream.c: entries read layer by layer; remote_maint.c: list,
 * stat, gc and verify; remote_heal.c: broken entries dropped, the tier's
 * id registered again).  Private to lib/store. */
#ifndef CB_REMOTE_IMPL_H
#define CB_REMOTE_IMPL_H

#include "store_impl.h"

#include <hiredis.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define ST_RETRY_US 5000000
#define ST_MAX_PARTS 65536 /* a header and at most 4096 layers (cbkv(5)), or 1 MB parts of 64 GB */
#define ST_MAX_BYTES ((uint64_t)ST_MAX_PARTS << 20) /* an entry's most bytes (64 GB) */
/* The last command's error reply was WRONGTYPE (a script's too): one of
 * an entry's keys is of another Redis type (a bad entry, not a tier down). */
#define ST_WRONGTYPE(r) (strstr((r)->why, "WRONGTYPE") != NULL)

/* ------------------------------------------------------- remote_conn.c */

/* A write to a server that went away raises SIGPIPE, which would kill the
 * program: it is blocked around each request and a SIGPIPE that the
 * request caused is consumed (the library leaves signal handling alone). */
typedef struct st_pipe_guard {
    sigset_t old;
    int pending_before;
} st_pipe_guard;

void st_pipe_block(st_pipe_guard *g);
void st_pipe_restore(st_pipe_guard *g);
void st_remote_disconnect(st_remote *r);
/* Mark the tier down after a failure (why, never a secret), warned: for
 * ST_RETRY_US, or for the rest of the handle's life when for_run. */
void st_remote_went_down(cb_store *s, const char *why, int for_run);
/* A reply, or NULL after marking the tier down (no reply: for ST_RETRY_US;
 * a time-out or the login refused: for the rest of the handle's life;
 * warned once) or after an error reply (warned, freed; NOPERM turns the
 * tier read-only for this handle).  The whole request, sent and answered,
 * is bounded by the time-out.  The format is hiredis' (%b a binary
 * argument). */
redisReply *st_remote_cmd_argv(cb_store *s, int argc, const char **argv, const size_t *len);
redisReply *st_remote_cmdf(cb_store *s, const char *fmt, ...);
/* The deadline timeout_ms from now, for st_remote_reply. */
int64_t st_remote_deadline(int timeout_ms);
/* Write what was appended to c by deadline: 0, else -1 with c->errstr
 * set and *timed_out 1 when the deadline passed.  SIGPIPE is the
 * caller's to block. */
int st_remote_flush(redisContext *c, int64_t deadline, int timeout_ms, int *timed_out);
/* The next reply on c, after writing what was appended to it, by deadline
 * at the latest (a server that answers a byte at a time cannot stretch
 * it): NULL with c->errstr set, and *timed_out 1 when the deadline passed
 * ("timed out after timeout_ms ms").  SIGPIPE is the caller's to block. */
redisReply *st_remote_reply(redisContext *c, int64_t deadline, int timeout_ms, int *timed_out);
/* A new connection to r's server, connected and logged in (when r has a
 * password) within one time-out; *db the database to select.  NULL with
 * the reason in why, and *for_run 1 when the failure holds for the run (a
 * time-out, or the login refused: then *refused 1). */
redisContext *st_remote_connect(const st_remote *r, int *db, char *why, size_t why_n, int *for_run,
                                int *refused);

/* ------------------------------------------------------------ remote.c */

/* An entry's keys in Redis (the top of remote.c); t is named by a put. */
typedef struct rkeys {
    char m[200], v[200], t[200], lru[80], used[80];
} rkeys;
void st_remote_keys(const cb_store *s, const char *key, rkeys *k);
/* Drop key's entry (unless its checksum is no longer checksum; NULL: any):
 * CB_OK, CB_ERR_CREATE when this user may not, CB_ERR_IO. */
cb_status st_remote_drop(cb_store *s, const char *key, const char *checksum);

/* Warn that key's entry is not used (msg names it and says why): a miss.
 * keep NULL: dropped (unless its checksum is no longer checksum) where
 * this handle may drop it; else it is kept, keep the reason said ("" none).
 * The warning says which happened. */
void st_remote_refuse(cb_store *s, const char *key, const char *checksum, const char *keep,
                      const char *msg);

/* An entry's metadata as a reader needs it. */
typedef struct rmeta {
    int64_t bytes, parts;
    char want[33];    /* XXH3-128 of the whole value */
    char mac_key[17]; /* the id of the key its tags were made with, "" none */
    char mac_alg[24]; /* their algorithm: "" none, "?" not a name, else as stored */
    int has_mac;      /* mac_key, mac_alg known, nonce and tags present and well-formed */
    int sealed;       /* mac_alg is ST_MAC_ALG: the parts are ciphertext */
    int64_t tokens;   /* as the writer recorded it, -1 none */
    uint8_t nonce[ST_NONCE_BYTES];
    uint8_t *tags; /* [parts][ST_TAG_BYTES], malloc'd, or NULL */
} rmeta;
/* Read key's metadata into *m (m->tags to be freed), recording the access
 * (hits, LRU time) when record and this user may write: 1 found, 0
 * missing or unreachable. */
int st_remote_touch_meta(cb_store *s, const char *key, int record, const rkeys *k, rmeta *m);

/* A metadata field's integer, -1 when it is none. */
static inline int64_t int_of(const redisReply *e)
{
    return e && e->type == REDIS_REPLY_STRING ? strtoll(e->str, NULL, 10) : -1;
}

/* -------------------------------------------------------- remote_mac.c */

/* n bytes as 2n lowercase hex digits and a NUL into out. */
void st_tohex(const uint8_t *p, size_t n, char *out);
/* The mac fields of the metadata's HMGET reply into m (m->parts read). */
void st_remote_meta_macs(rmeta *m, const redisReply *rep);
/* With a tier key: 0 when m carries tags made with it by an algorithm this
 * host reads (ST_MAC_ALG, or ST_MAC_ALG_V2), else -1 with why.  Without a
 * key: 0, or 1 with why when the entry is sealed (unreadable here, not bad:
 * a miss, neither dropped nor counted as refused). */
int st_remote_mac_usable(const cb_store *s, const rmeta *m, char *why, size_t why_n);
/* What the tags of key's entry (its metadata m) bind. */
void st_remote_part_id(const cb_store *s, const char *key, const rmeta *m, st_part_id *id);
/* A sealed entry met by a host without the tier key: warned of once. */
void st_remote_sealed_miss(cb_store *s, const char *key);
/* Key's v2 entry (parts in clear, checksum want), read and verified as
 * data: written again sealed (a put that replaces it) where this handle
 * may write, counted in n_resealed. */
void st_remote_reseal(cb_store *s, const char *key, const void *data, size_t size, int64_t tokens);

#endif
