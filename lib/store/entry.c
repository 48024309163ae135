/* entry.c - operations on single entries: put (reserve, write, verify,
 * index), lookup, acquire and release, remove, pin, list. */
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

/* ----------------------------------------------------------------- put */

#define KV_MAGIC "CBKV\r\n\x1a\n"

/* The fields of a KV file header (format versions 1 to 3, which agree on
 * them, lib/kv/kvfile.c) the reservation needs before the file is written
 * and verified in full. */
static cb_status peek_header(const uint8_t *p, size_t size, char key[66], char model[33],
                             int64_t *n_tokens, cb_error *err)
{
    uint32_t ver, nt;
    uint64_t m[2], t[2], total;
    if (size < 128 || memcmp(p, KV_MAGIC, 8) != 0)
        return cb_error_set(err, CB_ERR_FORMAT, "not a valid KV file: %s",
                            size < 128 ? "too short" : "bad magic");
    memcpy(&ver, p + 8, 4);
    if (ver < 1 || ver > 3)
        return cb_error_set(err, CB_ERR_UNSUPPORTED, "KV format version %u is not supported", ver);
    memcpy(&total, p + 112, 8);
    if (total != size)
        return cb_error_set(err, CB_ERR_FORMAT,
                            "not a valid KV file: %zu bytes, its header says %llu", size,
                            (unsigned long long)total);
    memcpy(m, p + 16, 16);
    memcpy(t, p + 32, 16);
    memcpy(&nt, p + 76, 4);
    cb_kv_key((cb_hash128){m[0], m[1]}, (cb_hash128){t[0], t[1]}, key);
    memcpy(model, key, 32);
    model[32] = 0;
    *n_tokens = nt;
    return CB_OK;
}

/* Open and fully verify a KV file; its key, model and token count. */
static cb_status check_kvfile(const char *path, char key[66], char model[33], int64_t *n_tokens,
                              uint64_t *size, cb_error *err)
{
    cb_kvfile *f = NULL;
    cb_status st = cb_kvfile_open(&f, path, err);
    if (st == CB_OK)
        st = cb_kvfile_verify(f, err);
    if (st == CB_OK) {
        const cb_kv_meta *m = cb_kvfile_meta(f);
        cb_kv_key(m->model, m->tokens, key);
        cb_hash128_hex(m->model, model);
        *n_tokens = m->n_tokens;
        *size = cb_kvfile_size(f);
    }
    cb_kvfile_free(f);
    return st;
}

/* XXH3-128 of a whole file, and its size. */
static cb_status hash_file(const char *path, cb_hash128 *h, uint64_t *size, cb_error *err)
{
    cb_mmap m;
    cb_status st = cb_mmap_open(&m, path, err);
    if (st != CB_OK)
        return st;
    *h = cb_hash128_bytes(m.data, m.size);
    *size = m.size;
    cb_mmap_close(&m);
    return CB_OK;
}
static const char SQL_GET_STATE[] = "SELECT state, tier, owner FROM entries WHERE key = ?1";
static const char SQL_DEL_KEY[] = "DELETE FROM entries WHERE key = ?1";
static const char SQL_RESERVE[] =
    "INSERT INTO entries(key, model, tier, bytes, n_tokens, created, last_access, hits, checksum, pinned, state, owner)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6, 0, ?7, 0, 0, ?8)";
static const char SQL_READY[] =
    "UPDATE entries SET state = 1, owner = NULL, created = ?3, last_access = ?3 WHERE key = ?1 AND owner = ?2 AND state = 0";
static const char SQL_UNRESERVE[] =
    "DELETE FROM entries WHERE key = ?1 AND owner = ?2 AND state = 0";
static const char SQL_REVIVE[] = "UPDATE entries SET state = 1 WHERE key = ?1 AND state = 2";
static const char SQL_REMOVED[] =
    "UPDATE entries SET state = 2, pinned = 0 WHERE key = ?1 AND state = 1";

/* Under the lock: is key there already?  A stored row whose file is gone and
 * a reservation of a dead process are dropped (their files too); a removed
 * entry that a reader still holds is stored again. */
static cb_status existing(cb_store *s, const char *key, int *exists, cb_error *err)
{
    cb_status st;
    sqlite3_stmt *q;
    int state = -1, t = -1;
    char owner[ST_OWNER_LEN + 1] = {0};

    *exists = 0;
    if (!(q = st_stmt(s, SQL_GET_STATE, err)))
        return err ? err->status : CB_ERR_IO;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        state = sqlite3_column_int(q, 0);
        t = st_tier_index(s, (const char *)sqlite3_column_text(q, 1));
        if (sqlite3_column_text(q, 2))
            snprintf(owner, sizeof owner, "%s", (const char *)sqlite3_column_text(q, 2));
    } else if (rc != SQLITE_DONE) {
        return st_dberr(s, rc, "lookup", err);
    }
    sqlite3_reset(q);
    if (state < 0)
        return CB_OK;
    if (t >= 0) {
        char *p = st_entry_path(s, t, key, NULL);
        if (!p)
            return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        if (state == 1 && access(p, F_OK) == 0)
            *exists = 1;
        else if (state == 0 && st_owner_alive(s, owner))
            *exists = 1;
        else if (state == 2 && st_unlink_locked(p) == 0) {
            /* Removed while a reader holds it: the file is whole, so it
             * simply becomes the entry again. */
            if ((st = st_begin_stmt(s, SQL_REVIVE, &q, err)) != CB_OK) {
                free(p);
                return st;
            }
            sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
            rc = sqlite3_step(q);
            sqlite3_reset(q);
            if (rc != SQLITE_DONE || (st = st_commit(s, err)) != CB_OK) {
                st_rollback(s);
                free(p);
                return rc != SQLITE_DONE ? st_dberr(s, rc, "revive", err) : st;
            }
            *exists = 1;
        } else if (state == 0) {
            char *tp = st_entry_path(s, t, key, owner);
            if (tp)
                unlink(tp);
            free(tp);
            st_unlink_locked(p);
        }
        free(p);
    }
    if (*exists)
        return CB_OK;
    if ((st = st_begin_stmt(s, SQL_DEL_KEY, &q, err)) != CB_OK)
        return st;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    if ((st = st_write(s, q, "drop a stale entry", NULL, err)) != CB_OK)
        return st;
    return st_commit(s, err);
}

/* Where the bytes of a put come from. */
typedef struct put_src {
    const void *data; /* bytes, or */
    const char *path; /* a verified file */
    int movable;      /* path may be renamed into the tier */
    const char *key;  /* the caller's key (NULL: the file's) */
    int first_tier;   /* the fastest tier it may go to */
} put_src;

/* The row of a reservation (state 0, owned by this handle), in its own
 * transaction. */
static cb_status reserve_row(cb_store *s, const char *key, const char *model, int tier,
                             uint64_t size, int64_t n_tokens, const char *sumhex, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    if ((st = st_begin_stmt(s, SQL_RESERVE, &q, err)) != CB_OK)
        return st;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, model, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, s->tiers[tier].name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, (sqlite3_int64)size);
    sqlite3_bind_int64(q, 5, n_tokens);
    sqlite3_bind_int64(q, 6, st_now_us());
    sqlite3_bind_text(q, 7, sumhex, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 8, s->owner, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        st_rollback(s);
        return st_dberr(s, rc, "reserve", err);
    }
    if ((st = st_commit(s, err)) != CB_OK)
        st_rollback(s);
    return st;
}

/* Bytes free for this process on the file system of dir (UINT64_MAX when
 * it does not say). */
static uint64_t fs_free(const char *dir)
{
    struct statvfs v;
    if (statvfs(dir, &v) != 0)
        return UINT64_MAX;
    return (uint64_t)v.f_bavail * (uint64_t)(v.f_frsize ? v.f_frsize : v.f_bsize);
}

/* 1. Under the store lock: unless key exists (*exists), reserve room in the
 * fastest tier from src->first_tier that has it after eviction (*tier). */
static cb_status put_reserve(cb_store *s, const put_src *src, const char *key, const char *model,
                             int64_t n_tokens, uint64_t size, const char *sumhex, int *tier,
                             int *exists, cb_error *err)
{
    cb_status st;
    *tier = -1;
    if ((st = st_lock(s, err)) != CB_OK)
        return st;
    if ((st = existing(s, key, exists, err)) != CB_OK || *exists)
        goto done;
    for (int t = src->first_tier; t < s->n_tiers && *tier < 0; t++) {
        if (s->tiers[t].cap && size > s->tiers[t].cap)
            continue;
        if ((s->full_said >> t & 1) && fs_free(s->tiers[t].path) < size) {
            s->n_full[t]++; /* its file system was full before: passed over while it is */
            continue;
        }
        st = st_make_room(s, t, size, NULL, NULL, err);
        if (st == CB_OK)
            *tier = t;
        else if (st != CB_ERR_CREATE)
            goto done;
    }
    if (*tier < 0) {
        st = cb_error_set(
            err, CB_ERR_CREATE,
            "%s: no tier has room for %llu bytes (the entries that would have to go are pinned or in use)",
            key, (unsigned long long)size);
        goto done;
    }
    if ((st = reserve_row(s, key, model, *tier, size, n_tokens, sumhex, err)) != CB_OK)
        *tier = -1;
done:
    st_unlock(s);
    return st;
}

#define NO_SPACE(e) ((e) == ENOSPC || (e) == EDQUOT)

/* 2. The temporary file tmp: written (or the movable source renamed to it),
 * fsynced, verified; then renamed to fin and the directory fsynced.
 * *no_space 1 when it failed for want of room on the file system. */
static cb_status put_write(cb_store *s, const put_src *src, const char *key, uint64_t size,
                           cb_hash128 sum, int tier, const char *tmp, const char *fin,
                           int *no_space, cb_error *err)
{
    cb_status st = CB_OK;
    int fd;
    *no_space = 0;
    if (src->path && src->movable && rename(src->path, tmp) == 0) {
        fd = open(tmp, O_RDONLY | O_CLOEXEC);
    } else {
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            *no_space = NO_SPACE(errno);
            return cb_error_set(err, CB_ERR_CREATE, "%s: %s", tmp, strerror(errno));
        }
        int in = -1, bad;
        if (src->data)
            bad = st_write_all(fd, src->data, (size_t)size);
        else
            bad = (in = open(src->path, O_RDONLY | O_CLOEXEC)) < 0 || st_copy_fd(in, fd, size) != 0;
        if (in >= 0)
            close(in);
        if (bad) {
            *no_space = NO_SPACE(errno);
            st = cb_error_set(err, CB_ERR_IO, "%s: write: %s", tmp, strerror(errno));
            close(fd);
            return st;
        }
    }
    if (fd < 0 || fsync(fd) != 0) {
        *no_space = NO_SPACE(errno);
        st = cb_error_set(err, CB_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    }
    if (fd >= 0)
        close(fd);
    if (st != CB_OK)
        return st;
    if (src->data) {
        /* The bytes were not verified yet: the written file is, in full. */
        char k2[66], m2[33];
        int64_t nt;
        uint64_t sz;
        if ((st = check_kvfile(tmp, k2, m2, &nt, &sz, err)) != CB_OK)
            return st;
        if (strcmp(k2, key) != 0)
            return cb_error_set(err, CB_ERR_INVALID, "%s: the file's key is %s", key, k2);
    } else {
        /* A copy of a verified file: the copy must hash as its source did. */
        cb_hash128 h;
        uint64_t sz;
        if ((st = hash_file(tmp, &h, &sz, err)) != CB_OK)
            return st;
        if (!cb_hash128_eq(h, sum) || sz != size)
            return cb_error_set(err, CB_ERR_IO, "%s: the copy differs from %s", tmp, src->path);
    }
    if (rename(tmp, fin) != 0)
        return cb_error_set(err, CB_ERR_CREATE, "%s: rename: %s", fin, strerror(errno));
    st_fsync_dir(s->tiers[tier].path);
    return CB_OK;
}

/* 3. Visible: the reservation becomes a stored entry. */
static cb_status put_publish(cb_store *s, const char *key, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    int n;
    if ((st = st_begin_stmt(s, SQL_READY, &q, err)) != CB_OK)
        return st;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, s->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, st_now_us());
    if ((st = st_write(s, q, "index", &n, err)) != CB_OK)
        return st;
    if ((st = st_commit(s, err)) != CB_OK) {
        st_rollback(s);
        return st;
    }
    if (n != 1)
        return cb_error_set(err, CB_ERR_INTERNAL, "%s: the reservation vanished", key);
    return CB_OK;
}

/* After a failure: drop this handle's reservation of key. */
static void put_unreserve(cb_store *s, const char *key)
{
    sqlite3_stmt *q = st_stmt(s, SQL_UNRESERVE, NULL);
    if (q && st_begin(s, NULL) == CB_OK) {
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, s->owner, -1, SQLITE_STATIC);
        sqlite3_step(q);
        sqlite3_reset(q);
        if (st_commit(s, NULL) != CB_OK)
            st_rollback(s);
    }
}

static cb_status put_common(cb_store *s, const put_src *src, const char *key, const char *model,
                            int64_t n_tokens, uint64_t size, cb_hash128 sum, int *existed,
                            cb_error *err)
{
    char sumhex[33];
    char *tmp = NULL, *fin = NULL;
    int tier = -1, exists = 0;
    cb_status st;

    if (existed)
        *existed = 0;
    if ((st = st_owner(s, err)) != CB_OK)
        return st;
    cb_hash128_hex(sum, sumhex);
    /* A tier whose file system fills before its capacity (a RAM disk
     * shared with others) is passed over for the next one with room, said
     * once; a source renamed into it already cannot go on. */
    put_src at = *src;
    for (;;) {
        int no_space = 0;
        if ((st = put_reserve(s, &at, key, model, n_tokens, size, sumhex, &tier, &exists, err)) !=
                CB_OK ||
            exists) {
            if (exists && existed)
                *existed = 1;
            return st;
        }
        tmp = st_entry_path(s, tier, key, s->owner);
        fin = st_entry_path(s, tier, key, NULL);
        if (!tmp || !fin)
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        else if ((st = put_write(s, &at, key, size, sum, tier, tmp, fin, &no_space, err)) ==
                     CB_OK &&
                 (st = put_publish(s, key, err)) != CB_OK)
            st_unlink_locked(fin);
        int moved = at.path && at.movable && access(at.path, F_OK) != 0;
        if (st != CB_OK) {
            if (tmp)
                unlink(tmp); /* a staged source renamed into the tier goes with it */
            put_unreserve(s, key);
        }
        free(tmp);
        free(fin);
        tmp = fin = NULL;
        if (st == CB_OK || !no_space || moved || tier + 1 >= s->n_tiers)
            return st;
        s->n_full[tier]++;
        uint64_t avail = fs_free(s->tiers[tier].path);
        if (!(s->full_said >> tier & 1))
            st_remote_warn(s,
                           "tier %s: its file system is full (%llu bytes free of the %llu a put "
                           "needs) before the tier's capacity; entries go to the next tier "
                           "with room while it is",
                           s->tiers[tier].name,
                           (unsigned long long)(avail == UINT64_MAX ? 0 : avail),
                           (unsigned long long)size);
        s->full_said |= 1u << tier;
        at.first_tier = tier + 1;
    }
}

static cb_status put_bytes(cb_store *s, const char *key, const void *data, size_t size,
                           int first_tier, cb_error *err);

/* After a local put (status st): write the entry through to the shared
 * tier.  A local tier without room is no failure when the shared tier took
 * it (the bytes verified first, as the local put would have). */
static cb_status write_through(cb_store *s, cb_status st, const char *key, const void *data,
                               size_t size, int64_t n_tokens, cb_error *err)
{
    char why[300];
    if (!s->remote.url || s->no_write_through || (st != CB_OK && st != CB_ERR_CREATE))
        return st;
    if (st == CB_ERR_CREATE && st_kv_check_bytes(data, size, key, why, sizeof why) != 0)
        return st;
    if (st_remote_put(s, key, data, size, n_tokens) == 0 && st == CB_ERR_CREATE) {
        if (err)
            err->status = CB_OK, err->msg[0] = 0;
        return CB_OK;
    }
    return st;
}

cb_status cb_store_put(cb_store *s, const char *key, const void *data, size_t size, cb_error *err)
{
    return put_bytes(s, key, data, size, 0, err);
}

cb_status cb_store_put_in(cb_store *s, const char *key, const void *data, size_t size,
                          const char *tier, cb_error *err)
{
    int t = s ? st_tier_index(s, tier) : -1;
    if (t < 0)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "no tier named '%s' in the store",
                            tier ? tier : "(null)");
    return put_bytes(s, key, data, size, t, err);
}

static cb_status put_bytes(cb_store *s, const char *key, const void *data, size_t size,
                           int first_tier, cb_error *err)
{
    char fkey[66], model[33];
    int64_t n_tokens = 0;
    cb_status st;

    if (!s || !data)
        return cb_error_set(err, CB_ERR_INVALID, "store put: no data");
    if (key && !st_key_valid(key))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", key);
    if ((st = peek_header(data, size, fkey, model, &n_tokens, err)) != CB_OK)
        return st;
    if (key && strcmp(key, fkey) != 0)
        return cb_error_set(err, CB_ERR_INVALID, "%s: the file's key is %s", key, fkey);
    put_src src = {data, NULL, 0, key, first_tier};
    st = put_common(s, &src, fkey, model, n_tokens, size, cb_hash128_bytes(data, size), NULL, err);
    return write_through(s, st, fkey, data, size, n_tokens, err);
}

/* Adopt a file; movable: it may be renamed into the tier (staged imports). */
cb_status st_put_file(cb_store *s, const char *path, int movable, const char *expect,
                      char key_out[66], int *existed, cb_error *err)
{
    char key[66], model[33];
    int64_t n_tokens;
    uint64_t size, hsize;
    cb_hash128 sum;
    cb_status st;

    if ((st = check_kvfile(path, key, model, &n_tokens, &size, err)) != CB_OK)
        return st;
    if (expect && strcmp(expect, key) != 0)
        return cb_error_set(err, CB_ERR_INVALID, "named %s.kv but holds the entry %s", expect, key);
    if ((st = hash_file(path, &sum, &hsize, err)) != CB_OK)
        return st;
    if (hsize != size)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: changed while it was read", path);
    if (key_out)
        memcpy(key_out, key, 66);
    put_src src = {NULL, path, movable, NULL, 0};
    if (!s->remote.url || s->no_write_through)
        return put_common(s, &src, key, model, n_tokens, size, sum, existed, err);
    cb_mmap m;
    cb_error merr;
    if (cb_mmap_open(&m, path, &merr) != CB_OK)
        return put_common(s, &src, key, model, n_tokens, size, sum, existed, err);
    st = put_common(s, &src, key, model, n_tokens, size, sum, existed, err);
    st = write_through(s, st, key, m.data, m.size, n_tokens, err);
    cb_mmap_close(&m);
    return st;
}

cb_status cb_store_put_file(cb_store *s, const char *path, char key[66], int *existed,
                            cb_error *err)
{
    if (!s || !path)
        return cb_error_set(err, CB_ERR_INVALID, "store put: no file");
    return st_put_file(s, path, 0, NULL, key, existed, err);
}

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
    cb_status st = put_bytes(s, key, data, size, 0, &e);
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
    st = put_bytes(s, key, data, size, 0, err);
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
