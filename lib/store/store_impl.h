/* store_impl.h - private layout of the tiered store (lib/store/ only).
 *
 * On disk (also in cb-store(5)):
 *
 *   DIR/store.json        configuration: id, promote_hits, tiers (name, path, capacity)
 *   DIR/index.db          SQLite index in WAL mode (+ index.db-wal, index.db-shm)
 *   DIR/lock              flock(2)ed exclusively by whoever changes where bytes live
 *                         (reservations, moves, removal, gc, verify)
 *   DIR/owners/ID         one per open handle that writes, flock(2)ed while it lives,
 *                         so that gc can tell the leftovers of dead processes
 *   DIR/tmp/              staging for import
 *   TIER/.cb-store        the id of the store the tier directory belongs to
 *   TIER/KEY.kv           an entry
 *   TIER/KEY.kv.tmp.ID    an entry being written (or moved) by owner ID
 *
 * Index:
 *   entries(key, model, tier, bytes, n_tokens, created, last_access, hits,
 *           checksum, pinned, state, owner)      state 0 = reserved by owner, 1 = stored,
 *                                                2 = removed, its file still held by readers
 *   counters(name, value)                        "hits:TIER", "misses"
 *   meta(name, value)                            "schema" = 1
 *
 * Invariants:
 *   - a row in state 1 has its complete file at TIER/KEY.kv;
 *   - the bytes of a tier's rows (both states) never exceed its capacity;
 *   - rows are inserted (reserved) and rows' tiers change only under DIR/lock;
 *   - a file is unlinked or moved only under an exclusive flock on it, which
 *     fails while a reader holds its shared one; but a file found bad when
 *     read, unlinked under the store lock alone (st_heal_local). */
#ifndef CB_STORE_IMPL_H
#define CB_STORE_IMPL_H

#include "store.h"

#include <sqlite3.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define ST_SCHEMA 1
#define ST_OWNER_LEN 16 /* hex digits of an owner id */
#define ST_DEFAULT_PROMOTE 2
#define ST_STALE_TMP_S 3600 /* foreign temporary files older than this are stale */
#define ST_BUSY_MS 60000    /* SQLite busy timeout */
#define ST_NSTMT 48

typedef struct st_tier {
    char name[33];
    char *path;      /* absolute */
    char *conf_path; /* as written in store.json */
    uint64_t cap;    /* 0 = unlimited */
    double cost;     /* relative cost per byte, for placement */
} st_tier;

/* A tier key ready to seal parts (secret.c); kdf NULL: no key. */
typedef struct evp_mac_ctx_st st_mac_ctx;     /* one v2 upload's GMAC key (st_mac_upload) */
typedef struct evp_cipher_ctx_st st_seal_ctx; /* one upload's AES-256-GCM key (st_seal_upload) */
typedef struct st_mac {
    struct evp_kdf_ctx_st *kdf; /* HKDF-SHA256 (expand only) keyed with the tier key */
    char id[17];                /* the key's id: 16 hex digits of HMAC(K, "cacheblend-key-id-v1") */
} st_mac;

#define ST_KEY_BYTES 32
#define ST_NONCE_BYTES 16
#define ST_TAG_BYTES 16
/* The metadata's mac_alg: the construction this version writes (secret.c),
 * every part encrypted and authenticated; and the one it still reads, the
 * parts in clear under GMAC tags (read, then rewritten sealed).  v1 entries
 * (HMAC-SHA256, no mac_alg) are refused. */
#define ST_MAC_ALG "aes-256-gcm-v3"
#define ST_MAC_ALG_V2 "aes-256-gmac-v2"

/* The shared tier on Redis (remote*.c); url NULL when the store has none. */
typedef struct st_remote {
    char name[33];
    char *url;                /* redis://HOST[:PORT][/DB] or unix:///PATH */
    char id[33];              /* the shared tier's id (its keys' namespace) */
    uint64_t cap;             /* 0 = unlimited */
    int timeout_ms;           /* deadline of a connect (and login), and of each request */
    struct redisContext *ctx; /* NULL when not connected */
    int64_t down_until;       /* after a failure: not tried again before (us; INT64_MAX never) */
    /* Secrets (secret.c), read when first connecting: the files' paths as
     * store.json records them (NULL: none; $CB_REDIS_AUTH_FILE and
     * $CB_TIER_KEY_FILE override them), never their contents. */
    char *auth_file, *key_file;
    int secrets;                /* 0 not read yet, 1 read, -1 unusable (the tier is not used) */
    char user[128];             /* the ACL user, "" for the password alone */
    char pass[512];             /* the password ("" none); cleansed when closed */
    st_mac mac;                 /* the tier key: entries written sealed, read when tags verify */
    int ro;                     /* the server refused this user a write (NOPERM): reads only */
    int ro_warned;              /* said once that nothing is written through */
    int quiet;                  /* a NOPERM expected: not warned of */
    int refused_login;          /* the server refused the login: the tier is not used */
    char why[CB_ERROR_MSG_MAX]; /* the last failure, for messages (never a secret) */
    uint64_t n_refused;         /* entries refused: no MAC, or one that does not verify */
    uint64_t n_resealed;        /* v2 entries (parts in clear) read and rewritten sealed */
    int sealed_warned;          /* said once that sealed entries need the tier key */
} st_remote;

#define ST_REMOTE_TIMEOUT_MS 1000

struct cb_store {
    char *dir;
    char *id; /* store id, 32 hex */
    int n_tiers;
    st_tier tiers[CB_STORE_MAX_TIERS];
    int promote_hits;
    sqlite3 *db;
    int readonly;  /* opened read-only: nothing is written (cb_store_readonly) */
    int lock_fd;   /* DIR/lock; read-only: the existing one opened for reading, or -1 */
    int lock_held; /* depth of maint_lock */
    int owner_fd;  /* DIR/owners/ID, -1 until the first write */
    char owner[ST_OWNER_LEN + 1];
    st_remote remote;
    int no_write_through; /* putting an entry fetched from the shared tier */
    /* What this handle mended (cb_store_stat): bad entries dropped when
     * read, by tier (n_tiers: the shared tier's), and puts that found a
     * tier's file system full and went to a later tier; which tiers were
     * said to be full (a bit each), and the shared tier's id said to
     * differ in Redis. */
    uint64_t n_healed[CB_STORE_MAX_TIERS + 1], n_full[CB_STORE_MAX_TIERS];
    unsigned full_said;
    int id_warned;
    void (*warn)(void *ctx, const char *msg);
    void *warn_ctx;
    struct {
        const char *sql;
        sqlite3_stmt *st;
    } stmts[ST_NSTMT];
};

typedef struct st_stream st_stream;

struct cb_store_ref {
    int fd;   /* -1 for a stream */
    int tier; /* the tier whose file fd is; n_tiers: the shared tier */
    uint64_t size;
    char *path;        /* the file, or the shared tier's name */
    st_stream *stream; /* an entry read from the shared tier, else NULL */
};

/* The files, each using only those above it (no circle):
 *   util.c    file-system helpers, keys, ids
 *   secret.c  the shared tier's secrets and its entries' MACs (libcrypto)
 *   remote*.c the shared tier on Redis (uses util.c and secret.c): remote.c
 *             keys, put, get, drop; remote_conn.c the connection and its
 *             login; remote_mac.c the entries' tags; remote_stream.c reading
 *             by layer; remote_maint.c list, stat, gc, verify;
 *             remote_heal.c broken entries found and dropped, the tier's id
 *             registered again (what they share: remote_impl.h)
 *   index.c   the SQLite index: schema, statements, transactions
 *   store.c   configuration, tiers, the store lock, owners, open/close, stat
 *   tiers.c   moves between tiers: demotion, eviction, promotion
 *   entry.c   entries: put, lookup, acquire, remove, pin, list
 *   recode.c  the entries by model and element type; rewriting them in
 *             another type
 *   maint.c   gc, verify and repair (settling what recode.c left)
 *   archive.c export and import; profile.c the profiles kept in the store */

/* -------------------------------------------------------------- util.c */

/* A malloc'd printf-formatted string, or NULL. */
char *st_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int64_t st_now_us(void);
/* 1 when p[0..n) are lowercase hex digits. */
int st_is_hex(const char *p, size_t n);
int st_key_valid(const char *key);
/* n_hex random lowercase hex digits and a NUL into out. */
void st_random_hex(char *out, size_t n_hex);
/* mkdir -p; 0 or -1 with errno. */
int st_mkdir_p(const char *path, mode_t mode);
/* fsync a directory (errors ignored: tmpfs and some filesystems refuse). */
void st_fsync_dir(const char *dir);
/* write all n bytes (retrying EINTR and short writes); 0, or -1 with errno */
int st_write_all(int fd, const void *buf, size_t n);
/* Copy n bytes from in to out; 0, or -1 with errno. */
int st_copy_fd(int in, int out, uint64_t n);
/* Open path and take an exclusive flock without waiting; -1 with errno
 * EWOULDBLOCK when a reader holds it, ENOENT when missing.  The descriptor
 * is checked to still be the file at path. */
int st_lock_file_ex(const char *path);
/* Unlink a file after taking its exclusive lock; 1 removed, 0 in use, -1 error (errno). */
int st_unlink_locked(const char *path);
/* Index of tier `name`, or -1. */
int st_tier_index(const cb_store *s, const char *name);

/* ------------------------------------------------------------- index.c */

/* Create an empty index (schema ST_SCHEMA) in dir/index.db. */
cb_status st_index_create(const char *dir, cb_error *err);
/* Open s->dir's index into s->db (WAL, busy timeout, schema check). */
cb_status st_index_open(cb_store *s, cb_error *err);
/* A prepared statement for a constant SQL string (cached by pointer), reset
 * and with bindings cleared; NULL after setting err. */
sqlite3_stmt *st_stmt(cb_store *s, const char *sql, cb_error *err);
/* Run one statement without results (BEGIN, COMMIT, ...). */
cb_status st_exec(cb_store *s, const char *sql, cb_error *err);
cb_status st_begin(cb_store *s, cb_error *err); /* BEGIN IMMEDIATE */
/* BEGIN IMMEDIATE, then *q = st_stmt(sql): CB_OK, or the status (err set
 * where given) with nothing left open. */
cb_status st_begin_stmt(cb_store *s, const char *sql, sqlite3_stmt **q, cb_error *err);
cb_status st_commit(cb_store *s, cb_error *err);
void st_rollback(cb_store *s);
/* Map the SQLite result code of the last call into err. */
cb_status st_dberr(cb_store *s, int rc, const char *what, cb_error *err);
/* Step a bound data-changing statement to completion and reset it; *changed
 * (may be NULL) gets the rows it changed.  On failure the transaction is
 * rolled back and the error (naming `what`) returned. */
cb_status st_write(cb_store *s, sqlite3_stmt *q, const char *what, int *changed, cb_error *err);

/* An entry's row. */
typedef struct st_row {
    int tier, state, pinned;
    uint64_t bytes;
    int64_t hits;
    char checksum[33];
} st_row;
/* 1 with *r filled, 0 when key has no row, <0 on error. */
int st_get_row(cb_store *s, const char *key, st_row *r, cb_error *err);
/* Run one data-changing statement with key (?1) and tier name (?2) (and a
 * second tier name, ?3, when tier2 >= 0) in its own transaction; the
 * number of rows changed, or <0. */
int st_change(cb_store *s, const char *sql, const char *key, int tier, int tier2, cb_error *err);
/* Delete key's row in tier `tier` (its own transaction); rows deleted, or <0. */
int st_delete_at(cb_store *s, const char *key, int tier, cb_error *err);

/* ------------------------------------------------------------- store.c */

/* The store-wide lock on DIR/lock, reentrant within a handle; st_trylock
 * does not wait and returns 1 when it took the lock.  A read-only handle
 * takes a shared lock on the lock file when there is one it can lock (so
 * that its checks do not run while a writer moves bytes), and goes on
 * without one where it cannot. */
cb_status st_lock(cb_store *s, cb_error *err);
int st_trylock(cb_store *s);
void st_unlock(cb_store *s);

/* CB_OK when the handle may write, else CB_ERR_CREATE naming `what` and
 * the store (a read-only store). */
cb_status st_writable(const cb_store *s, const char *what, cb_error *err);

/* Make sure this handle has an owner id with its lock file. */
cb_status st_owner(cb_store *s, cb_error *err);
/* 1 when owner id is alive (its lock file exists and is locked). */
int st_owner_alive(cb_store *s, const char *id);

/* malloc'd TIER/KEY.kv, or TIER/KEY.kv.tmp.OWNER with tmp. */
char *st_entry_path(const cb_store *s, int tier, const char *key, const char *tmp_owner);
/* Sum of bytes of tier t's rows, both states. */
cb_status st_tier_used(cb_store *s, int t, uint64_t *used, cb_error *err);

/* ------------------------------------------------------------- tiers.c */

/* Make room for `need` bytes in tier t by moving its least recently used
 * entries down (never `exclude`); called with the lock held.  CB_OK when
 * used + need <= capacity afterwards, CB_ERR_CREATE when it cannot. */
cb_status st_make_room(cb_store *s, int t, uint64_t need, const char *exclude,
                       cb_store_gc_report *rep, cb_error *err);
/* Move an entry to tier `to` (lock held): 1 moved, 0 skipped (in use,
 * changed, no room), CB_ERR_* on failure. */
int st_move(cb_store *s, const char *key, int from, int to, cb_store_gc_report *rep, cb_error *err);
/* Promote key if the configuration says so (lock held). */
void st_promote(cb_store *s, const char *key);

/* ------------------------------------------------------------- entry.c */

/* Acquire without (flags 0) or with recording the access and promotion
 * (ST_ACQ_RECORD); a local miss is fetched from the shared tier unless
 * ST_ACQ_LOCAL. */
#define ST_ACQ_RECORD 1
#define ST_ACQ_LOCAL 2
cb_status st_acquire(cb_store *s, const char *key, int flags, cb_store_ref **out, cb_error *err);
/* An entry of local tier t found bad when read: dropped (its row and its
 * file), where the handle may write, unless its file at the path is no
 * longer the one read (was: that file's stat), so that the chunk is
 * computed and put again.  Readers elsewhere keep their descriptors (and
 * find it bad too).  1 dropped, 0 not; nothing said (the caller warns). */
int st_heal_local(cb_store *s, const char *key, int t, const struct stat *was);
/* Put data (size bytes) under key into tier first_tier or a slower one with
 * room (put.c): checked as a KV file, written atomically, indexed. */
cb_status st_put_bytes(cb_store *s, const char *key, const void *data, size_t size, int first_tier,
                       cb_error *err);
/* An entry's row (put.c, entry.c): its state, tier and owner; drop it; mark it removed. */
static const char SQL_GET_STATE[] = "SELECT state, tier, owner FROM entries WHERE key = ?1";
static const char SQL_DEL_KEY[] = "DELETE FROM entries WHERE key = ?1";
static const char SQL_REMOVED[] =
    "UPDATE entries SET state = 2, pinned = 0 WHERE key = ?1 AND state = 1";
/* Adopt a verified copy of the KV file at path; movable: it may be renamed
 * into the tier; expect: the key it must hold (or NULL). */
cb_status st_put_file(cb_store *s, const char *path, int movable, const char *expect,
                      char key_out[66], int *existed, cb_error *err);

/* ----------------------------------------------------------- remote*.c */

/* Parse a shared tier's address: 0, or -1 when malformed. */
int st_remote_parse(const char *url, char *host, size_t host_n, int *port, int *db, int *is_unix);
void st_remote_warn(cb_store *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when connected (connecting when needed), 0 when down. */
int st_remote_up(cb_store *s);
cb_status st_remote_need(cb_store *s, cb_error *err);
void st_remote_close(st_remote *r);
/* Read r's secret files when not read yet (the environment's names first):
 * CB_OK, or the error (kept: the tier is not used by this handle). */
cb_status st_remote_secrets(st_remote *r, cb_error *err);
/* The shared tier's id from Redis (made when missing): 0, or -1. */
int st_remote_id(cb_store *s, const char *name, char id[33]);
/* 1 when the shared tier holds key, 0 when not, -1 when it is down. */
int st_remote_has(cb_store *s, const char *key);
/* Write an entry through to the shared tier: 0 stored or there, -1 not. */
int st_remote_put(cb_store *s, const char *key, const void *data, size_t size, int64_t n_tokens);
/* 1 fetched (bytes and checksum as its metadata says), 0 missing or
 * unreachable, -1 bad (dropped when drop_bad). */
int st_remote_get(cb_store *s, const char *key, int record, int drop_bad, void **out, size_t *size);
/* A fetched entry was refused by the local verification. */
void st_remote_reject(cb_store *s, const char *key, const char *why);
cb_status st_remote_list(cb_store *s, const char *model,
                         int (*fn)(void *ctx, const cb_store_entry *e), void *ctx, int *stopped,
                         cb_error *err);
cb_status st_remote_check(cb_store *s, int fetch, int fix,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          uint64_t *n_entries, uint64_t *n_bad, uint64_t *n_bytes, cb_error *err);

/* Open key's value in the shared tier for reading layer by layer (its
 * access recorded unless read-only): 1 with *kf (its header verified) and
 * *x (held for the caller), 0 missing or the tier down, -1 bad (dropped,
 * warned). */
int st_remote_stream(cb_store *s, const char *key, cb_kvfile **kf, st_stream **x);
void st_stream_unref(st_stream *x); /* accepts NULL */
const char *st_stream_key(const st_stream *x);
/* A streamed entry failed (why: the message, naming it): warned; when the
 * connection failed the tier is not used for a while (2), else the entry
 * is dropped (1; not when a part had gone, evicted meanwhile). */
int st_stream_bad(cb_store *s, st_stream *x, const char *why);
/* Receive the parts not read yet and check the whole value against its
 * metadata: 1 with the bytes (held by x, in clear), else 0 (warned,
 * dropped).  A v2 entry (parts in clear) is then written again sealed. */
int st_stream_finish(cb_store *s, st_stream *x, const void **data, size_t *size);

/* ------------------------------------------------------ remote_heal.c */

/* Look at the shape of key's entry in the shared tier (unless its checksum
 * is no longer checksum; NULL: any): 0 as a put leaves it, or no entry;
 * else why gets what is wrong (its value missing, cut short or of another
 * Redis type, its metadata no hash or malformed) and it is dropped when
 * drop and the handle may: 2 dropped, 1 not; -1 the tier is down. */
int st_remote_inspect(cb_store *s, const char *key, const char *checksum, int drop, char *why,
                      size_t why_n);
/* st_remote_inspect dropping where it may, a broken entry warned of (then:
 * what becomes of it, "a miss"): its result. */
int st_remote_heal(cb_store *s, const char *key, const char *checksum, const char *then);
/* 1 when the shared tier holds key in the shape a put leaves, 0 when not
 * (a broken entry dropped, warned: to be written again), -1 when it is
 * down. */
int st_remote_sound(cb_store *s, const char *key);
/* Register the tier's id under its name in Redis where it is missing
 * (warned); warned once when Redis names another id. */
void st_remote_register(cb_store *s);

/* ------------------------------------------------------------ secret.c */

/* Read a Redis password file (one line: PASSWORD, or USER PASSWORD; mode
 * 0600 or stricter, owned by this user or root) into user ("" when none)
 * and pass.  Errors: CB_ERR_NOT_FOUND (missing, unreadable), CB_ERR_FORMAT
 * (too open, another owner, malformed), CB_ERR_IO; messages never hold the
 * file's contents. */
cb_status st_auth_load(const char *path, char *user, size_t user_n, char *pass, size_t pass_n,
                       cb_error *err);
/* Read a tier key file (64 hex digits, kept like a password file) into m.
 * Errors as st_auth_load, and CB_ERR_INTERNAL (no HMAC, HKDF in libcrypto). */
cb_status st_key_load(const char *path, st_mac *m, cb_error *err);
/* m from the raw key bytes (tests). */
cb_status st_mac_from_key(st_mac *m, const uint8_t key[ST_KEY_BYTES], cb_error *err);
void st_mac_free(st_mac *m); /* m may hold no key */

/* What a part's tag binds besides its bytes (secret.c's comment). */
typedef struct st_part_id {
    const char *sid;               /* the shared tier's id, 32 hex digits */
    const char *key;               /* the entry's key, 65 characters */
    uint8_t nonce[ST_NONCE_BYTES]; /* the upload's */
    uint64_t n_parts, total;
} st_part_id;
/* The GMAC key of the upload id names (its tier, entry and nonce), derived
 * from m's tier key: a context of the caller's own (a stream hands it to its
 * receiver's thread), NULL without a key or memory; freed by
 * st_mac_ctx_free (accepts NULL).  Uses m's context: one thread at a time. */
st_mac_ctx *st_mac_upload(const st_mac *m, const st_part_id *id);
void st_mac_ctx_free(st_mac_ctx *c);
/* tag of part i of len bytes under c (id's upload's): 0, or -1 when
 * libcrypto fails.  A writer tags each i of an upload once. */
int st_mac_part(st_mac_ctx *c, const st_part_id *id, uint64_t i, const void *part, size_t len,
                uint8_t tag[ST_TAG_BYTES]);
/* 1 when want is part i's tag (compared in constant time), else 0. */
int st_mac_check(st_mac_ctx *c, const st_part_id *id, uint64_t i, const void *part, size_t len,
                 const uint8_t want[ST_TAG_BYTES]);
/* The AES-256-GCM key of the upload id names (v3: labels of its own),
 * derived from m's tier key: a context of the caller's own, NULL without a
 * key or memory; freed by st_seal_ctx_free (accepts NULL).  Uses m's
 * context: one thread at a time. */
st_seal_ctx *st_seal_upload(const st_mac *m, const st_part_id *id);
void st_seal_ctx_free(st_seal_ctx *c);
/* Part i of len bytes encrypted under c into out (len bytes; may be part)
 * and its tag: 0, or -1 when libcrypto fails.  A writer seals each i of an
 * upload once: the IV is i, and no (key, IV) pair may come twice. */
int st_seal_part(st_seal_ctx *c, const st_part_id *id, uint64_t i, const void *part, size_t len,
                 void *out, uint8_t tag[ST_TAG_BYTES]);
/* Sealed part i of len bytes decrypted under c into out (may be sealed):
 * 1 when want is its tag, else 0 with out cleansed. */
int st_seal_open(st_seal_ctx *c, const st_part_id *id, uint64_t i, const void *sealed, size_t len,
                 void *out, const uint8_t want[ST_TAG_BYTES]);
/* A fresh random nonce: 0, or -1 when libcrypto has no random bytes. */
int st_mac_nonce(uint8_t nonce[ST_NONCE_BYTES]);

/* ------------------------------------------------------------ recode.c */

/* Settle the intents of rewrites that dead processes left (recode.c's top
 * comment), under the lock: fix rolls each forward (its file is the new
 * one: the row takes its bytes and checksum) or drops it (the old file
 * stayed); without fix they are only found.  fn (may be NULL) hears of
 * each, with forward and whether it was fixed; *n_found (may be NULL). */
cb_status st_recode_settle(cb_store *s, int fix,
                           void (*fn)(void *ctx, const char *key, int forward, int fixed),
                           void *ctx, uint64_t *n_found, cb_error *err);
/* 1 when key has an intent of a rewrite (not yet settled). */
int st_recode_pending(cb_store *s, const char *key);

/* 0 when the bytes are a valid KV file (header, every layer's
 * checksum) holding key, else -1 with the reason in why. */
int st_kv_check_bytes(const void *data, size_t size, const char *key, char *why, size_t why_n);

#endif
