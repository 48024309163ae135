/* put.c - putting an entry: reserve its row and room (the fastest tier
 * with room, a full file system passed over), write and verify the file,
 * publish it in the index, and write it through to the shared tier. */
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

/* The fields of a KV file header (format versions 1 to 4, which agree on
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
    if (ver < 1 || ver > 4)
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
static const char SQL_RESERVE[] =
    "INSERT INTO entries(key, model, tier, bytes, n_tokens, created, last_access, hits, checksum, pinned, state, owner)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6, 0, ?7, 0, 0, ?8)";
static const char SQL_READY[] =
    "UPDATE entries SET state = 1, owner = NULL, created = ?3, last_access = ?3 WHERE key = ?1 AND owner = ?2 AND state = 0";
static const char SQL_UNRESERVE[] =
    "DELETE FROM entries WHERE key = ?1 AND owner = ?2 AND state = 0";
static const char SQL_REVIVE[] = "UPDATE entries SET state = 1 WHERE key = ?1 AND state = 2";

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
    return st_put_bytes(s, key, data, size, 0, err);
}

cb_status cb_store_put_in(cb_store *s, const char *key, const void *data, size_t size,
                          const char *tier, cb_error *err)
{
    int t = s ? st_tier_index(s, tier) : -1;
    if (t < 0)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "no tier named '%s' in the store",
                            tier ? tier : "(null)");
    return st_put_bytes(s, key, data, size, t, err);
}

cb_status st_put_bytes(cb_store *s, const char *key, const void *data, size_t size, int first_tier,
                       cb_error *err)
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
