/* entry.c - operations on single entries: lookup, acquire and release,
 * remove, pin, list (put is put.c's). */
#include "store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
/* ------------------------------------------------------------- lookup */

static const char SQL_LOOKUP[] = "SELECT tier FROM entries WHERE key = ?1 AND state = 1";

/* Tier of a stored key, -1 when not stored (or in an unknown tier). */
static cb_status tier_of(cb_store *s, const char *key, int *tier, cb_error *err)
{
    sqlite3_stmt *q = st_stmt(s, SQL_LOOKUP, err);
    *tier = -1;
    if (!q)
        return err ? err->status : CB_ERR_IO;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW)
        *tier = st_tier_index(s, (const char *)sqlite3_column_text(q, 0));
    sqlite3_reset(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return st_dberr(s, rc, "lookup", err);
    return CB_OK;
}

cb_status cb_store_lookup(cb_store *s, const char *key, int *found)
{
    int t;
    cb_status st;
    *found = 0;
    if (!st_key_valid(key))
        return CB_ERR_INVALID;
    if ((st = tier_of(s, key, &t, NULL)) != CB_OK)
        return st;
    if (t >= 0) {
        char *p = st_entry_path(s, t, key, NULL);
        if (!p)
            return CB_ERR_NOMEM;
        *found = access(p, F_OK) == 0;
        /* Stored here but lost by the shared tier (a restart without
         * persistence, an eviction) or broken there: written through
         * again, so that the host that computes a corpus refills it; a
         * local file found bad meanwhile is dropped: the chunk is computed
         * and put again. */
        if (*found && s->remote.url && !s->readonly && st_remote_sound(s, key) == 0) {
            cb_mmap m;
            cb_error e;
            struct stat sb;
            int fd = open(p, O_RDONLY | O_CLOEXEC);
            if (fd >= 0 && fstat(fd, &sb) == 0 && cb_mmap_open(&m, p, &e) == CB_OK) {
                char why[300];
                if (st_kv_check_bytes(m.data, m.size, key, why, sizeof why) == 0)
                    st_remote_put(s, key, m.data, m.size, 0);
                else if (st_heal_local(s, key, t, &sb)) {
                    st_remote_warn(s, "tier %s: %s: %s; dropped (computed again)", s->tiers[t].name,
                                   key, why);
                    *found = 0;
                }
                cb_mmap_close(&m);
            }
            if (fd >= 0)
                close(fd);
        }
        free(p);
    }
    return CB_OK;
}

cb_status cb_store_has(cb_store *s, const char *key, int *found)
{
    cb_status st = cb_store_lookup(s, key, found);
    if (st == CB_OK && !*found && s->remote.url)
        *found = st_remote_has(s, key) == 1;
    return st;
}

/* ------------------------------------------------------------ acquire */

static const char SQL_ACCESS_GET[] =
    "SELECT tier, hits, pinned FROM entries WHERE key = ?1 AND state = 1";
static const char SQL_ACCESS_SET[] =
    "UPDATE entries SET hits = hits + 1, last_access = ?2 WHERE key = ?1";
static const char SQL_COUNT[] =
    "INSERT INTO counters(name, value) VALUES(?1, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1";
static const char SQL_DEL_MISSING[] =
    "DELETE FROM entries WHERE key = ?1 AND tier = ?2 AND state = 1";

/* Record an access: hits and last use of the entry, the tier's hit counter
 * or the miss counter.  *tier -1 when not stored; *hits after this access. */
static cb_status record_access(cb_store *s, const char *key, int *tier, int64_t *hits, int *pinned,
                               cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    char cname[48];
    int rc;

    *tier = -1;
    if ((st = st_begin(s, err)) != CB_OK)
        return st;
    if (!(q = st_stmt(s, SQL_ACCESS_GET, err)))
        goto fail;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        *tier = st_tier_index(s, (const char *)sqlite3_column_text(q, 0));
        *hits = sqlite3_column_int64(q, 1) + 1;
        *pinned = sqlite3_column_int(q, 2);
    } else if (rc != SQLITE_DONE) {
        st_dberr(s, rc, "lookup", err);
        goto fail;
    }
    sqlite3_reset(q);
    if (*tier >= 0) {
        if (!(q = st_stmt(s, SQL_ACCESS_SET, err)))
            goto fail;
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 2, st_now_us());
        rc = sqlite3_step(q);
        sqlite3_reset(q);
        if (rc != SQLITE_DONE) {
            st_dberr(s, rc, "record an access", err);
            goto fail;
        }
        snprintf(cname, sizeof cname, "hits:%s", s->tiers[*tier].name);
    } else {
        snprintf(cname, sizeof cname, "misses");
    }
    if (!(q = st_stmt(s, SQL_COUNT, err)))
        goto fail;
    sqlite3_bind_text(q, 1, cname, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        st_dberr(s, rc, "count an access", err);
        goto fail;
    }
    if ((st = st_commit(s, err)) != CB_OK)
        goto fail;
    return CB_OK;
fail:
    st_rollback(s);
    return err && err->status != CB_OK ? err->status : CB_ERR_IO;
}

/* The file of tier t is missing: drop the entry unless it moved meanwhile. */
static void drop_missing(cb_store *s, const char *key, int t, const char *path)
{
    sqlite3_stmt *q;
    if (st_begin(s, NULL) != CB_OK)
        return;
    /* Inside the write transaction nobody can move the entry, so a file that
     * is still missing now is gone for good. */
    if (access(path, F_OK) != 0 && errno == ENOENT && (q = st_stmt(s, SQL_DEL_MISSING, NULL))) {
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, s->tiers[t].name, -1, SQLITE_STATIC);
        sqlite3_step(q);
        sqlite3_reset(q);
    }
    if (st_commit(s, NULL) != CB_OK)
        st_rollback(s);
}

int st_heal_local(cb_store *s, const char *key, int t, const struct stat *was)
{
    struct stat now;
    int dropped = 0, t2;
    if (s->readonly || t < 0 || t >= s->n_tiers || st_lock(s, NULL) != CB_OK)
        return 0;
    /* under the lock nobody moves it: the row and the file are the ones read */
    char *p = st_entry_path(s, t, key, NULL);
    if (p && tier_of(s, key, &t2, NULL) == CB_OK && t2 == t && stat(p, &now) == 0 &&
        now.st_ino == was->st_ino && now.st_dev == was->st_dev &&
        st_delete_at(s, key, t, NULL) > 0) {
        unlink(p);
        st_fsync_dir(s->tiers[t].path);
        s->n_healed[t]++;
        dropped = 1;
    }
    free(p);
    st_unlock(s);
    return dropped;
}

/* A key missing from the local tiers: fetched from the shared tier and
 * put into the fastest local tier with room (verified there, not written
 * back).  1 when it is now local. */
static int fetch_shared(cb_store *s, const char *key, int record)
{
    void *data = NULL;
    size_t size = 0;
    cb_error e;
    if (st_remote_get(s, key, record, 1, &data, &size) != 1)
        return 0;
    s->no_write_through = 1;
    cb_status st = st_put_bytes(s, key, data, size, 0, &e);
    s->no_write_through = 0;
    free(data);
    if (st == CB_ERR_FORMAT || st == CB_ERR_CHECKSUM || st == CB_ERR_INVALID ||
        st == CB_ERR_UNSUPPORTED) {
        st_remote_reject(s, key, e.msg);
        return 0;
    }
    if (st != CB_OK)
        st_remote_warn(s, "%s: fetched from the shared tier %s but not kept here: %s", key,
                       s->remote.name, e.msg);
    return st == CB_OK;
}

cb_status st_acquire(cb_store *s, const char *key, int flags, cb_store_ref **out, cb_error *err)
{
    int record = flags & ST_ACQ_RECORD;
    cb_status st;
    int t;

    if (!st_key_valid(key))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", key ? key : "");
    if (record && !s->readonly) {
        int64_t hits = 0;
        int pinned = 0;
        if ((st = record_access(s, key, &t, &hits, &pinned, err)) != CB_OK)
            return st;
        if (t < 0 && !s->remote.url)
            return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", key);
        /* Promotion is opportunistic: a reader never waits for the lock. */
        if (t > 0 && !pinned && s->promote_hits > 0 && hits >= s->promote_hits && st_trylock(s)) {
            st_promote(s, key);
            st_unlock(s);
        }
    }
    int fetched = 0;
    for (int attempt = 0; attempt < 1000; attempt++) {
        struct stat a, b;
        if ((st = tier_of(s, key, &t, err)) != CB_OK)
            return st;
        if (t < 0 && !fetched && s->remote.url && !s->readonly && !(flags & ST_ACQ_LOCAL)) {
            fetched = 1;
            if (fetch_shared(s, key, record) == 1)
                continue;
        }
        if (t < 0)
            return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", key);
        char *p = st_entry_path(s, t, key, NULL);
        if (!p)
            return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == ENOENT) {
                int t2;
                if (tier_of(s, key, &t2, NULL) == CB_OK && t2 == t) {
                    if (s->readonly) {
                        /* not moved meanwhile: gone, and left in the index */
                        free(p);
                        return cb_error_set(err, CB_ERR_NOT_FOUND,
                                            "%s: not in the store (its file is missing)", key);
                    }
                    drop_missing(s, key, t, p);
                }
                free(p);
                continue;
            }
            free(p);
            return cb_error_set(err, CB_ERR_IO, "%s: %s", key, strerror(e));
        }
        /* A mover or deleter holds the exclusive lock while it works; the
         * shared lock waits for it, and then the file must still be the one
         * at the path (not unlinked, not replaced). */
        while (flock(fd, LOCK_SH) != 0 && errno == EINTR)
            ;
        if (fstat(fd, &a) == 0 && stat(p, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev && a.st_nlink > 0) {
            cb_store_ref *r = malloc(sizeof *r);
            if (!r) {
                close(fd);
                free(p);
                return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            }
            r->fd = fd;
            r->tier = t;
            r->stream = NULL;
            r->path = p;
            r->size = (uint64_t)a.st_size;
            *out = r;
            return CB_OK;
        }
        close(fd);
        free(p);
    }
    return cb_error_set(err, CB_ERR_IO, "%s: the entry keeps moving", key);
}

cb_status cb_store_acquire(cb_store *s, const char *key, cb_store_ref **ref, const char **path,
                           cb_error *err)
{
    cb_store_ref *r = NULL;
    cb_status st;
    if (!s || !ref)
        return cb_error_set(err, CB_ERR_INVALID, "store acquire: no handle");
    if ((st = st_acquire(s, key, 1, &r, err)) != CB_OK)
        return st;
    *ref = r;
    if (path)
        *path = r->path;
    return CB_OK;
}

uint64_t cb_store_ref_size(const cb_store_ref *ref) { return ref ? ref->size : 0; }

int cb_store_ref_tier(const cb_store_ref *ref) { return ref ? ref->tier : -1; }

void cb_store_release(cb_store_ref *ref)
{
    if (!ref)
        return;
    if (ref->fd >= 0)
        close(ref->fd);
    st_stream_unref(ref->stream);
    free(ref->path);
    free(ref);
}

const char *cb_store_ref_tier_name(const cb_store *s, const cb_store_ref *ref)
{
    if (!s || !ref)
        return NULL;
    if (ref->stream)
        return s->remote.name;
    return ref->tier >= 0 && ref->tier < s->n_tiers ? s->tiers[ref->tier].name : NULL;
}

cb_status cb_store_open_kv(cb_store *s, const char *key, cb_kvfile **kf, cb_store_ref **ref,
                           cb_error *err)
{
    cb_store_ref *r = NULL;
    st_stream *x = NULL;
    cb_status st;
    if (!kf || !ref)
        return cb_error_set(err, CB_ERR_INVALID, "store open: no output");
    *kf = NULL;
    *ref = NULL;
    if (!s)
        return cb_error_set(err, CB_ERR_INVALID, "store open: no handle");
    /* $CB_STORE_STREAM=0: fetched whole into a local tier first (to compare) */
    const char *env = getenv("CB_STORE_STREAM");
    int stream = s->remote.url && !(env && strcmp(env, "0") == 0);
    st = st_acquire(s, key, ST_ACQ_RECORD | (stream ? ST_ACQ_LOCAL : 0), &r, err);
    if (st == CB_OK) {
        if ((st = cb_kvfile_open(kf, r->path, err)) != CB_OK) {
            /* a bad file (not one of a newer format): dropped, to be put again */
            struct stat sb;
            if ((st == CB_ERR_FORMAT || st == CB_ERR_CHECKSUM) && fstat(r->fd, &sb) == 0 &&
                st_heal_local(s, key, r->tier, &sb) && err) {
                size_t n = strlen(err->msg);
                snprintf(err->msg + n, sizeof err->msg - n, "; dropped from tier %s",
                         s->tiers[r->tier].name);
            }
            cb_store_release(r);
            return st;
        }
        *ref = r;
        return CB_OK;
    }
    if (st != CB_ERR_NOT_FOUND || !stream)
        return st;
    if (st_remote_stream(s, key, kf, &x) != 1)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", key);
    if (!(r = calloc(1, sizeof *r)) || !(r->path = strdup(s->remote.name))) {
        free(r);
        cb_kvfile_free(*kf);
        *kf = NULL;
        st_stream_unref(x);
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    }
    r->fd = -1;
    r->tier = s->n_tiers;
    r->size = cb_kvfile_size(*kf);
    r->stream = x;
    *ref = r;
    return CB_OK;
}

int cb_store_ref_bad(cb_store *s, cb_store_ref *ref, const char *why)
{
    struct stat sb;
    if (!s || !ref)
        return 0;
    if (ref->stream)
        return st_stream_bad(s, ref->stream, why);
    if (ref->fd < 0 || fstat(ref->fd, &sb) != 0)
        return 0;
    const char *key = strrchr(ref->path, '/');
    char k[CB_STORE_KEY_LEN + 1];
    snprintf(k, sizeof k, "%s", key ? key + 1 : ref->path); /* TIER/KEY.kv */
    if (!st_heal_local(s, k, ref->tier, &sb))
        return 0;
    st_remote_warn(s, "%s; dropped from tier %s (a miss)", why, s->tiers[ref->tier].name);
    return 1;
}

cb_status cb_store_keep(cb_store *s, cb_store_ref *ref, cb_error *err)
{
    const void *data;
    size_t size;
    cb_status st;
    if (!s || !ref || !ref->stream || s->readonly)
        return CB_OK;
    const char *key = st_stream_key(ref->stream);
    if (!st_stream_finish(s, ref->stream, &data, &size))
        return cb_error_set(err, CB_ERR_CHECKSUM,
                            "%s: not kept: its value in the shared tier %s is bad", key,
                            s->remote.name);
    s->no_write_through = 1;
    st = st_put_bytes(s, key, data, size, 0, err);
    s->no_write_through = 0;
    return st;
}

/* -------------------------------------------------------- remove, pin */

/* Run one statement on key in its own transaction. */
static cb_status key_change(cb_store *s, const char *sql, const char *key, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    if ((st = st_begin_stmt(s, sql, &q, err)) != CB_OK)
        return st;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    if ((st = st_write(s, q, "update", NULL, err)) != CB_OK)
        return st;
    if ((st = st_commit(s, err)) != CB_OK)
        st_rollback(s);
    return st;
}

cb_status cb_store_remove(cb_store *s, const char *key, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    int state = -1, t = -1, rc, fd;
    char owner[ST_OWNER_LEN + 1] = {0};
    char *p = NULL;

    if (!st_key_valid(key))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", key ? key : "");
    if ((st = st_writable(s, "remove", err)) != CB_OK || (st = st_lock(s, err)) != CB_OK)
        return st;
    if (!(q = st_stmt(s, SQL_GET_STATE, err))) {
        st = err ? err->status : CB_ERR_IO;
        goto done;
    }
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        state = sqlite3_column_int(q, 0);
        t = st_tier_index(s, (const char *)sqlite3_column_text(q, 1));
        if (sqlite3_column_text(q, 2))
            snprintf(owner, sizeof owner, "%s", (const char *)sqlite3_column_text(q, 2));
    }
    sqlite3_reset(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        st = st_dberr(s, rc, "lookup", err);
        goto done;
    }
    if (state < 0 || state == 2 || (state == 0 && st_owner_alive(s, owner))) {
        st = cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", key);
        goto done;
    }
    if (t < 0 || !(p = st_entry_path(s, t, key, NULL))) {
        st = key_change(s, SQL_DEL_KEY, key, err);
        goto done;
    }
    if (state == 0) {
        /* the unfinished write of a process that is gone */
        char *tp = st_entry_path(s, t, key, owner);
        if (tp)
            unlink(tp);
        free(tp);
        st_unlink_locked(p);
        st = key_change(s, SQL_DEL_KEY, key, err);
        goto done;
    }
    fd = st_lock_file_ex(p);
    if (fd < 0 && errno == EWOULDBLOCK) {
        /* In use: hidden from readers at once; the file stays for the readers
         * that hold it, and gc deletes it (and the row) after them. */
        st = key_change(s, SQL_REMOVED, key, err);
        goto done;
    }
    /* The row goes first, then the file (while new readers wait on its lock). */
    st = key_change(s, SQL_DEL_KEY, key, err);
    if (fd >= 0) {
        if (st == CB_OK)
            unlink(p);
        close(fd);
    }
done:
    free(p);
    st_unlock(s);
    return st;
}

static const char SQL_PIN[] = "UPDATE entries SET pinned = ?2 WHERE key = ?1 AND state = 1";

cb_status cb_store_pin(cb_store *s, const char *key, int pinned, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    if (!st_key_valid(key))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", key ? key : "");
    if ((st = st_writable(s, "pin", err)) != CB_OK ||
        (st = st_begin_stmt(s, SQL_PIN, &q, err)) != CB_OK)
        return st;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 2, pinned ? 1 : 0);
    int n;
    if ((st = st_write(s, q, "pin", &n, err)) != CB_OK)
        return st;
    if ((st = st_commit(s, err)) != CB_OK) {
        st_rollback(s);
        return st;
    }
    return n == 1 ? CB_OK : cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", key);
}

/* ---------------------------------------------------------- list, stat */

static const char SQL_LIST[] =
    "SELECT key, model, bytes, n_tokens, created, last_access, hits, checksum, pinned FROM entries"
    " WHERE tier = ?1 AND state = 1 AND (?2 IS NULL OR model = ?2) ORDER BY last_access DESC, key";

cb_status cb_store_list(cb_store *s, const char *model, const char *tier,
                        int (*fn)(void *ctx, const cb_store_entry *e), void *ctx, cb_error *err)
{
    int only = -1;
    if (model && (strlen(model) != 32 || !st_is_hex(model, 32)))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a model fingerprint (32 hex digits)",
                            model);
    int shared = s->remote.url && !s->readonly && (!tier || strcmp(tier, s->remote.name) == 0);
    if (tier && (only = st_tier_index(s, tier)) < 0 && !shared)
        return cb_error_set(err, CB_ERR_INVALID, "no tier '%s' in %s", tier, s->dir);
    int stopped = 0;
    for (int t = 0; t < s->n_tiers; t++) {
        if (tier && t != only)
            continue;
        /* A statement of its own: fn may call the store. */
        sqlite3_stmt *q = NULL;
        int rc = sqlite3_prepare_v2(s->db, SQL_LIST, -1, &q, NULL);
        if (rc != SQLITE_OK)
            return st_dberr(s, rc, "list", err);
        sqlite3_bind_text(q, 1, s->tiers[t].name, -1, SQLITE_STATIC);
        if (model)
            sqlite3_bind_text(q, 2, model, -1, SQLITE_STATIC);
        int stop = 0;
        while (!stop && (rc = sqlite3_step(q)) == SQLITE_ROW) {
            cb_store_entry e;
            e.key = (const char *)sqlite3_column_text(q, 0);
            e.model = (const char *)sqlite3_column_text(q, 1);
            e.tier = s->tiers[t].name;
            e.bytes = (uint64_t)sqlite3_column_int64(q, 2);
            e.n_tokens = sqlite3_column_int64(q, 3);
            e.created_us = sqlite3_column_int64(q, 4);
            e.last_access_us = sqlite3_column_int64(q, 5);
            e.hits = (uint64_t)sqlite3_column_int64(q, 6);
            e.checksum = (const char *)sqlite3_column_text(q, 7);
            e.pinned = sqlite3_column_int(q, 8);
            char *p = e.key ? st_entry_path(s, t, e.key, NULL) : NULL;
            if (!p) {
                sqlite3_finalize(q);
                return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            }
            e.path = p;
            stop = fn(ctx, &e);
            free(p);
        }
        sqlite3_finalize(q);
        if (!stop && rc != SQLITE_DONE)
            return st_dberr(s, rc, "list", err);
        if ((stopped = stop))
            break;
    }
    if (shared && !stopped)
        return st_remote_list(s, model, fn, ctx, &stopped, err);
    return CB_OK;
}
