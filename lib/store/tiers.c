/* tiers.c - moving entries between tiers: LRU demotion and eviction to
 * make room, promotion of an entry read often.  Everything here runs under
 * the store lock (DIR/lock), so no two processes move entries at once;
 * readers go on meanwhile, and an entry a reader holds is skipped. */
#include "store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ moving */

static const char SQL_SET_TIER[] =
    "UPDATE entries SET tier = ?3 WHERE key = ?1 AND tier = ?2 AND state = 1";
static const char SQL_LRU[] =
    "SELECT key, bytes FROM entries WHERE tier = ?1 AND state = 1 AND pinned = 0 AND key != ?2"
    " ORDER BY last_access, key LIMIT 1 OFFSET ?3";

int st_move(cb_store *s, const char *key, int from, int to, cb_store_gc_report *rep, cb_error *err)
{
    char *src = st_entry_path(s, from, key, NULL), *dst = st_entry_path(s, to, key, NULL),
         *tmp = st_entry_path(s, to, key, s->owner);
    int fd = -1, out = -1, result = 0;
    void *map = MAP_FAILED;
    struct stat sb;
    st_row r;
    int rc;

    if (!src || !dst || !tmp) {
        result = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = st_owner(s, err)) != CB_OK) {
        result = rc;
        goto done;
    }
    if ((rc = st_get_row(s, key, &r, err)) <= 0 || r.tier != from || r.state != 1) {
        result = rc < 0 ? rc : 0;
        goto done;
    }
    if ((fd = st_lock_file_ex(src)) < 0) {
        if (errno == ENOENT)
            st_delete_at(s, key, from, NULL); /* indexed without a file */
        goto done;                            /* else in use: skipped */
    }
    if (fstat(fd, &sb) != 0) {
        result = cb_error_set(err, CB_ERR_IO, "%s: %s", src, strerror(errno));
        goto done;
    }
    if ((uint64_t)sb.st_size == r.bytes && sb.st_size > 0) {
        char hex[33];
        if ((map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            result = cb_error_set(err, CB_ERR_IO, "%s: mmap: %s", src, strerror(errno));
            goto done;
        }
        cb_hash128_hex(cb_hash128_bytes(map, (size_t)sb.st_size), hex);
        if (strcmp(hex, r.checksum) == 0) {
            /* Intact: copy to the new tier (temporary name, fsync, rename). */
            out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (out < 0 || st_write_all(out, map, (size_t)sb.st_size) != 0 || fsync(out) != 0) {
                result = cb_error_set(err, out < 0 ? CB_ERR_CREATE : CB_ERR_IO, "%s: %s", tmp,
                                      strerror(errno));
                unlink(tmp);
                goto done;
            }
            close(out);
            out = -1;
            if (rename(tmp, dst) != 0) {
                result = cb_error_set(err, CB_ERR_CREATE, "%s: rename: %s", dst, strerror(errno));
                unlink(tmp);
                goto done;
            }
            st_fsync_dir(s->tiers[to].path);
            if ((rc = st_change(s, SQL_SET_TIER, key, from, to, err)) != 1) {
                st_unlink_locked(dst);
                result = rc < 0 ? rc : 0;
                goto done;
            }
            unlink(src);
            if (rep && to > from)
                rep->demoted++;
            result = 1;
            goto done;
        }
    }
    /* A corrupt entry is never copied on: it goes, as if evicted. */
    if (st_delete_at(s, key, from, err) >= 0)
        unlink(src);
    if (rep)
        rep->evicted++;
    result = 1; /* it left the tier all the same */
done:
    if (map != MAP_FAILED)
        munmap(map, (size_t)sb.st_size);
    if (out >= 0)
        close(out);
    if (fd >= 0)
        close(fd);
    free(src);
    free(dst);
    free(tmp);
    return result;
}

/* Delete an entry of the last tier (or one that fits nowhere): 1 gone, 0 in use. */
static int evict(cb_store *s, const char *key, int t, cb_store_gc_report *rep, cb_error *err)
{
    char *p = st_entry_path(s, t, key, NULL);
    int fd, n;
    if (!p)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    fd = st_lock_file_ex(p);
    if (fd < 0 && errno != ENOENT) {
        free(p);
        return 0;
    }
    n = st_delete_at(s, key, t, err);
    if (fd >= 0) {
        if (n > 0) {
            unlink(p);
            if (rep)
                rep->evicted++;
        }
        close(fd);
    }
    free(p);
    return n < 0 ? n : n > 0;
}

/* Move one entry of tier t down to the first tier below with room, else delete it. */
static int demote(cb_store *s, const char *key, uint64_t bytes, int t, cb_store_gc_report *rep,
                  cb_error *err)
{
    for (int d = t + 1; d < s->n_tiers; d++) {
        if (s->tiers[d].cap && bytes > s->tiers[d].cap)
            continue;
        cb_status st = st_make_room(s, d, bytes, key, rep, err);
        if (st == CB_OK)
            return st_move(s, key, t, d, rep, err);
        if (st != CB_ERR_CREATE)
            return st;
    }
    return evict(s, key, t, rep, err);
}

static const char SQL_RESERVED[] =
    "SELECT key, owner, state FROM entries WHERE tier = ?1 AND state != 1";

/* Drop the reservations of dead processes in tier t, and removed entries
 * whose readers are done (their bytes count against its capacity until
 * then); how many went. */
static int reap_reservations(cb_store *s, int t)
{
    char keys[64][CB_STORE_KEY_LEN + 1], owners[64][ST_OWNER_LEN + 1];
    int states[64], n = 0, gone = 0;
    sqlite3_stmt *q = st_stmt(s, SQL_RESERVED, NULL);
    if (!q)
        return 0;
    sqlite3_bind_text(q, 1, s->tiers[t].name, -1, SQLITE_STATIC);
    while (n < 64 && sqlite3_step(q) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(q, 0),
                   *o = (const char *)sqlite3_column_text(q, 1);
        snprintf(keys[n], sizeof keys[n], "%s", k ? k : "");
        snprintf(owners[n], sizeof owners[n], "%s", o ? o : "");
        states[n] = sqlite3_column_int(q, 2);
        n++;
    }
    sqlite3_reset(q);
    for (int i = 0; i < n; i++) {
        char *p = st_entry_path(s, t, keys[i], NULL);
        int drop = 0;
        if (!p)
            continue;
        if (states[i] == 0 && !st_owner_alive(s, owners[i])) {
            char *tp = st_entry_path(s, t, keys[i], owners[i]);
            if (tp)
                unlink(tp);
            free(tp);
            st_unlink_locked(p);
            drop = 1;
        } else if (states[i] == 2) {
            drop = st_unlink_locked(p) == 1;
        }
        free(p);
        if (drop && st_change(s, "DELETE FROM entries WHERE key = ?1 AND tier = ?2 AND state != 1",
                              keys[i], t, -1, NULL) > 0)
            gone++;
    }
    return gone;
}

cb_status st_make_room(cb_store *s, int t, uint64_t need, const char *exclude,
                       cb_store_gc_report *rep, cb_error *err)
{
    uint64_t cap = s->tiers[t].cap, used;
    int skip = 0, reaped = 0;
    cb_status st;

    if (cap == 0)
        return CB_OK;
    if (need > cap)
        return CB_ERR_CREATE;
    for (;;) {
        char key[CB_STORE_KEY_LEN + 1];
        uint64_t bytes;
        sqlite3_stmt *q;
        int rc;

        if ((st = st_tier_used(s, t, &used, err)) != CB_OK)
            return st;
        if (used + need <= cap)
            return CB_OK;
        if (!(q = st_stmt(s, SQL_LRU, err)))
            return err ? err->status : CB_ERR_IO;
        sqlite3_bind_text(q, 1, s->tiers[t].name, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, exclude ? exclude : "", -1, SQLITE_STATIC);
        sqlite3_bind_int(q, 3, skip);
        rc = sqlite3_step(q);
        if (rc == SQLITE_ROW) {
            snprintf(key, sizeof key, "%s", (const char *)sqlite3_column_text(q, 0));
            bytes = (uint64_t)sqlite3_column_int64(q, 1);
        }
        sqlite3_reset(q);
        if (rc == SQLITE_DONE) {
            if (!reaped++ && reap_reservations(s, t) > 0)
                continue;
            if (rep)
                rep->busy += (uint64_t)skip;
            return CB_ERR_CREATE; /* what is left is pinned, in use or reserved */
        }
        if (rc != SQLITE_ROW)
            return st_dberr(s, rc, "eviction", err);
        rc = demote(s, key, bytes, t, rep, err);
        if (rc < 0)
            return (cb_status)rc;
        if (rc == 0)
            skip++;
    }
}

void st_promote(cb_store *s, const char *key)
{
    st_row r;
    if (st_get_row(s, key, &r, NULL) != 1 || r.state != 1 || r.pinned || r.tier <= 0 ||
        s->promote_hits <= 0 || r.hits < s->promote_hits)
        return;
    for (int t = 0; t < r.tier; t++) {
        if (s->tiers[t].cap && r.bytes > s->tiers[t].cap)
            continue;
        if (st_make_room(s, t, r.bytes, key, NULL, NULL) == CB_OK) {
            st_move(s, key, r.tier, t, NULL, NULL);
            return;
        }
    }
}
