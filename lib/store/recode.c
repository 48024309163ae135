/* recode.c - what the store holds by model and KV element type, and
 * rewriting its entries in place in another element type.
 *
 * A rewrite keeps the entry's key (the element type is not part of it),
 * its tier and its row's access history; only the file, its size and its
 * checksum change.  It is made crash-safe by an intent row in the index's
 * meta table, kept only while the store lock is held:
 *
 *   1. the new file is written to TIER/KEY.kv.tmp.OWNER, fsynced, verified;
 *   2. under the store lock, with the old file's exclusive flock (no reader
 *      holds it): meta "recode:KEY" = "TIER BYTES CHECKSUM OWNER" is
 *      committed, the temporary file renamed over TIER/KEY.kv, the
 *      directory fsynced, and in one transaction the row gets the new bytes
 *      and checksum and the intent goes.
 *
 * A process killed anywhere leaves the old file with its row (and a
 * temporary file of a dead owner, which gc removes), or the new file with
 * an intent row whose checksum it matches.  Whoever next holds the lock to
 * repair (recode, gc, verify --repair) settles an intent: rolled forward
 * (the row takes the new bytes and checksum) when the file is the new one,
 * else dropped.  An intent seen under the lock is always a dead process's:
 * its owner held the lock from writing it to deleting it. */
#include "store_impl.h"
#include "../core/vec.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define INTENT_PREFIX "recode:"

/* ------------------------------------------------------------- by type */

static cb_status kv_stat_add(cb_store_kv_stat **v, size_t *n, size_t *cap, const char *model,
                             int type, uint64_t tokens, uint64_t bytes)
{
    for (size_t i = 0; i < *n; i++)
        if ((*v)[i].type == type && strcmp((*v)[i].model, model) == 0) {
            (*v)[i].entries++;
            (*v)[i].tokens += tokens;
            (*v)[i].bytes += bytes;
            return CB_OK;
        }
    if (*n == *cap) {
        cb_store_kv_stat *nv = cb_vec_reserve(*v, cap, *n + 1, sizeof *nv, 16);
        if (!nv)
            return CB_ERR_NOMEM;
        *v = nv;
    }
    cb_store_kv_stat *e = &(*v)[(*n)++];
    memset(e, 0, sizeof *e);
    snprintf(e->model, sizeof e->model, "%s", model);
    e->type = type;
    e->entries = 1;
    e->tokens = tokens;
    e->bytes = bytes;
    return CB_OK;
}

static int kv_stat_cmp(const void *a, const void *b)
{
    const cb_store_kv_stat *x = a, *y = b;
    int c = strcmp(x->model, y->model);
    return c ? c : (x->type > y->type) - (x->type < y->type);
}

/* The element type, tokens and size of the KV file at path, from its fixed
 * header: 0, or -1 when it cannot be read as a KV file's. */
static int peek_type(const char *path, int *type, uint64_t *tokens, uint64_t *bytes)
{
    uint8_t fixed[128];
    uint64_t size;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC), ok = -1;
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) == 0 && pread(fd, fixed, sizeof fixed, 0) == (ssize_t)sizeof fixed &&
        cb_kv_header_size(fixed, sizeof fixed, path, &size, NULL) == CB_OK &&
        size == (uint64_t)sb.st_size) {
        uint32_t t, nt;
        memcpy(&t, fixed + 72, 4);
        memcpy(&nt, fixed + 76, 4);
        *type = (int)t;
        *tokens = nt;
        *bytes = (uint64_t)sb.st_size;
        ok = 0;
    }
    close(fd);
    return ok;
}

static const char SQL_STORED[] =
    "SELECT key, model, tier, n_tokens, bytes FROM entries WHERE state = 1 ORDER BY tier, key";

cb_status cb_store_stat_kv(cb_store *s, cb_store_kv_stat **out, size_t *n_out, cb_error *err)
{
    cb_store_kv_stat *v = NULL;
    size_t n = 0, cap = 0;
    sqlite3_stmt *q = NULL;
    cb_status st = CB_OK;
    int rc;

    if (!s || !out || !n_out)
        return cb_error_set(err, CB_ERR_INVALID, "store stat: no handle or output");
    *out = NULL;
    *n_out = 0;
    if ((rc = sqlite3_prepare_v2(s->db, SQL_STORED, -1, &q, NULL)) != SQLITE_OK)
        return st_dberr(s, rc, "stat", err);
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *key = (const char *)sqlite3_column_text(q, 0),
                   *model = (const char *)sqlite3_column_text(q, 1);
        int t = st_tier_index(s, (const char *)sqlite3_column_text(q, 2)), type = -1;
        uint64_t tokens = (uint64_t)sqlite3_column_int64(q, 3),
                 bytes = (uint64_t)sqlite3_column_int64(q, 4);
        char *p = key && t >= 0 ? st_entry_path(s, t, key, NULL) : NULL;
        if (key && t >= 0 && !p) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            break;
        }
        /* an entry whose file cannot be read is counted as of no type */
        if (p && peek_type(p, &type, &tokens, &bytes) != 0)
            type = -1;
        free(p);
        if (kv_stat_add(&v, &n, &cap, model ? model : "", type, tokens, bytes) != CB_OK) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            break;
        }
    }
    if (st == CB_OK && rc != SQLITE_DONE)
        st = st_dberr(s, rc, "stat", err);
    sqlite3_finalize(q);
    if (st != CB_OK) {
        free(v);
        return st;
    }
    if (n > 1)
        qsort(v, n, sizeof *v, kv_stat_cmp);
    *out = v;
    *n_out = n;
    return CB_OK;
}

/* ------------------------------------------------------------ intents */

static const char SQL_INTENT_SET[] = "INSERT OR REPLACE INTO meta(name, value) VALUES(?1, ?2)";
static const char SQL_INTENT_DEL[] = "DELETE FROM meta WHERE name = ?1";
static const char SQL_INTENTS[] =
    "SELECT name, value FROM meta WHERE name >= 'recode:' AND name < 'recode;' ORDER BY name";
static const char SQL_INTENT_ONE[] = "SELECT value FROM meta WHERE name = ?1";
static const char SQL_RECODED[] =
    "UPDATE entries SET bytes = ?3, checksum = ?4 WHERE key = ?1 AND tier = ?2 AND state = 1";

typedef struct intent {
    char key[CB_STORE_KEY_LEN + 1];
    char tier[33];
    uint64_t bytes;
    char sum[33];
    char owner[ST_OWNER_LEN + 1];
} intent;

static int intent_parse(const char *name, const char *value, intent *it)
{
    unsigned long long b;
    memset(it, 0, sizeof *it);
    if (!name || !value || strncmp(name, INTENT_PREFIX, strlen(INTENT_PREFIX)) != 0)
        return -1;
    snprintf(it->key, sizeof it->key, "%s", name + strlen(INTENT_PREFIX));
    if (sscanf(value, "%32s %llu %32s %16s", it->tier, &b, it->sum, it->owner) != 4)
        return -1;
    it->bytes = b;
    return 0;
}

/* Commit an intent; complete: carry it out instead (the row takes its bytes
 * and checksum, and the intent goes, in one transaction). */
static cb_status intent_write(cb_store *s, const intent *it, int complete, cb_error *err)
{
    char name[sizeof INTENT_PREFIX + CB_STORE_KEY_LEN], value[128];
    sqlite3_stmt *q;
    cb_status st;
    snprintf(name, sizeof name, INTENT_PREFIX "%s", it->key);
    if ((st = st_begin(s, err)) != CB_OK)
        return st;
    if (complete) {
        if (!(q = st_stmt(s, SQL_RECODED, err)))
            goto fail;
        sqlite3_bind_text(q, 1, it->key, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, it->tier, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 3, (sqlite3_int64)it->bytes);
        sqlite3_bind_text(q, 4, it->sum, -1, SQLITE_STATIC);
        if ((st = st_write(s, q, "recode", NULL, err)) != CB_OK)
            return st;
        if (!(q = st_stmt(s, SQL_INTENT_DEL, err)))
            goto fail;
        sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    } else {
        snprintf(value, sizeof value, "%s %llu %s %s", it->tier, (unsigned long long)it->bytes,
                 it->sum, it->owner);
        if (!(q = st_stmt(s, SQL_INTENT_SET, err)))
            goto fail;
        sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, value, -1, SQLITE_STATIC);
    }
    if ((st = st_write(s, q, "recode", NULL, err)) != CB_OK)
        return st;
    if ((st = st_commit(s, err)) != CB_OK)
        st_rollback(s);
    return st;
fail:
    st_rollback(s);
    return err && err->status != CB_OK ? err->status : CB_ERR_IO;
}

static void intent_drop(cb_store *s, const char *key)
{
    char name[sizeof INTENT_PREFIX + CB_STORE_KEY_LEN];
    sqlite3_stmt *q;
    snprintf(name, sizeof name, INTENT_PREFIX "%s", key);
    if (st_begin_stmt(s, SQL_INTENT_DEL, &q, NULL) != CB_OK)
        return;
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    if (st_write(s, q, "recode", NULL, NULL) == CB_OK && st_commit(s, NULL) != CB_OK)
        st_rollback(s);
}

int st_recode_pending(cb_store *s, const char *key)
{
    char name[sizeof INTENT_PREFIX + CB_STORE_KEY_LEN];
    sqlite3_stmt *q = st_stmt(s, SQL_INTENT_ONE, NULL);
    if (!q)
        return 0;
    snprintf(name, sizeof name, INTENT_PREFIX "%s", key);
    sqlite3_bind_text(q, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    return rc == SQLITE_ROW;
}

/* The intent's entry file is the new one (its size and checksum). */
static int intent_done(cb_store *s, const intent *it)
{
    int t = st_tier_index(s, it->tier), done = 0;
    char *p = t >= 0 ? st_entry_path(s, t, it->key, NULL) : NULL;
    cb_mmap m;
    if (p && cb_mmap_open(&m, p, NULL) == CB_OK) {
        char sum[33];
        cb_hash128_hex(cb_hash128_bytes(m.data, m.size), sum);
        done = m.size == it->bytes && strcmp(sum, it->sum) == 0;
        cb_mmap_close(&m);
    }
    free(p);
    return done;
}

cb_status st_recode_settle(cb_store *s, int fix,
                           void (*fn)(void *ctx, const char *key, int forward, int fixed),
                           void *ctx, uint64_t *n_found, cb_error *err)
{
    intent *v = NULL;
    size_t n = 0, cap = 0;
    cb_status st = CB_OK;
    sqlite3_stmt *q = st_stmt(s, SQL_INTENTS, err);
    int rc;
    if (n_found)
        *n_found = 0;
    if (!q)
        return err ? err->status : CB_ERR_IO;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        intent it;
        if (intent_parse((const char *)sqlite3_column_text(q, 0),
                         (const char *)sqlite3_column_text(q, 1), &it) != 0) {
            /* an intent that cannot be read is dropped: the entry is checked as it is */
            snprintf(it.key, sizeof it.key, "%.*s", CB_STORE_KEY_LEN,
                     (const char *)sqlite3_column_text(q, 0) + strlen(INTENT_PREFIX));
            it.tier[0] = 0;
        }
        if (n == cap) {
            intent *nv = cb_vec_reserve(v, &cap, n + 1, sizeof *nv, 16);
            if (!nv) {
                sqlite3_reset(q);
                free(v);
                return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            }
            v = nv;
        }
        v[n++] = it;
    }
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        free(v);
        return st_dberr(s, rc, "recode intents", err);
    }
    for (size_t i = 0; i < n && st == CB_OK; i++) {
        intent *it = &v[i];
        int forward = it->tier[0] && intent_done(s, it), fixed = 0;
        if (fix && !s->readonly) {
            if (forward) {
                fixed = intent_write(s, it, 1, err) == CB_OK;
                if (!fixed)
                    st = err ? err->status : CB_ERR_IO;
            } else {
                int t = st_tier_index(s, it->tier);
                char *tp = t >= 0 && it->owner[0] && !st_owner_alive(s, it->owner)
                               ? st_entry_path(s, t, it->key, it->owner)
                               : NULL;
                if (tp)
                    unlink(tp);
                free(tp);
                intent_drop(s, it->key);
                fixed = 1;
            }
        }
        if (fn)
            fn(ctx, it->key, forward, fixed);
    }
    if (n_found)
        *n_found = n;
    free(v);
    return st;
}

/* ------------------------------------------------------------- recode */

/* Remove the temporary files (KEY.kv.tmp.OWNER) of dead owners in tier t,
 * lock held: what an earlier run killed while writing left. */
static void reap_temps(cb_store *s, int t)
{
    DIR *d = opendir(s->tiers[t].path);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        const char *tp = strstr(e->d_name, ".kv.tmp.");
        if (!tp || (size_t)(tp - e->d_name) != CB_STORE_KEY_LEN)
            continue;
        const char *owner = tp + 8;
        if (strlen(owner) != ST_OWNER_LEN || !st_is_hex(owner, ST_OWNER_LEN) ||
            st_owner_alive(s, owner))
            continue;
        char *p = st_asprintf("%s/%s", s->tiers[t].path, e->d_name);
        if (p)
            unlink(p);
        free(p);
    }
    closedir(d);
}

typedef enum { RC_DONE, RC_ALREADY, RC_BUSY, RC_NO_ROOM, RC_BAD } rc_outcome;

/* Write the new file to tmp, fsynced, and check it back in full. */
static cb_status write_tmp(const char *tmp, const char *key, const void *data, size_t size,
                           cb_error *err)
{
    cb_status st = CB_OK;
    cb_kvfile *f = NULL;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return cb_error_set(err, CB_ERR_CREATE, "%s: %s", tmp, strerror(errno));
    if (st_write_all(fd, data, size) != 0 || fsync(fd) != 0)
        st = cb_error_set(err, CB_ERR_IO, "%s: write: %s", tmp, strerror(errno));
    close(fd);
    if (st == CB_OK && (st = cb_kvfile_open(&f, tmp, err)) == CB_OK &&
        (st = cb_kvfile_verify(f, err)) == CB_OK) {
        char k2[66];
        cb_kv_key(cb_kvfile_meta(f)->model, cb_kvfile_meta(f)->tokens, k2);
        if (strcmp(k2, key) != 0)
            st = cb_error_set(err, CB_ERR_INTERNAL, "%s: the rewritten file holds %s", key, k2);
    }
    cb_kvfile_free(f);
    return st;
}

/* Read key's file in tier t (as a reader: under its shared flock) and, when
 * it is not of type already, its bytes rewritten: *buf, *size, and the
 * file's identity (*dev, *ino).  RC_* outcome or a status (< 0). */
static int read_recoded(cb_store *s, const char *key, int t, cb_type type, void **buf, size_t *size,
                        dev_t *dev, ino_t *ino, char *why, size_t why_n, cb_error *err)
{
    cb_kvfile *f = NULL;
    cb_error e;
    struct stat a, b;
    int out;
    char *p = st_entry_path(s, t, key, NULL);
    if (!p)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_n, "moved or removed meanwhile");
        free(p);
        return RC_BUSY;
    }
    while (flock(fd, LOCK_SH) != 0 && errno == EINTR)
        ;
    if (fstat(fd, &a) != 0 || stat(p, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev ||
        a.st_nlink == 0) {
        snprintf(why, why_n, "moved or replaced meanwhile");
        out = RC_BUSY;
    } else if (cb_kvfile_open(&f, p, &e) != CB_OK) {
        snprintf(why, why_n, "%s", e.msg);
        out = e.status == CB_ERR_NOMEM ? CB_ERR_NOMEM : RC_BAD;
    } else if (cb_kvfile_meta(f)->type == type) {
        out = RC_ALREADY;
    } else if (cb_kvfile_recode(f, type, buf, size, &e) != CB_OK) {
        snprintf(why, why_n, "%s", e.msg);
        out = e.status == CB_ERR_NOMEM ? CB_ERR_NOMEM : RC_BAD;
    } else {
        *dev = a.st_dev;
        *ino = a.st_ino;
        out = RC_DONE;
    }
    if (out == CB_ERR_NOMEM)
        cb_error_set(err, CB_ERR_NOMEM, "%s", why);
    cb_kvfile_free(f);
    close(fd);
    free(p);
    return out;
}

/* Rewrite one entry of tier t in type: an RC_* outcome, or a status (< 0)
 * that stops the run. */
static int recode_one(cb_store *s, const char *key, int t, cb_type type,
                      cb_store_recode_report *rep, char *why, size_t why_n, cb_error *err)
{
    void *buf = NULL;
    size_t size = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    int out, rc, fd = -1, locked = 0;
    char *tmp = NULL, *fin = NULL;
    struct stat sb;
    intent it;
    st_row r;

    out = read_recoded(s, key, t, type, &buf, &size, &dev, &ino, why, why_n, err);
    if (out != RC_DONE)
        return out;
    memset(&it, 0, sizeof it);
    snprintf(it.key, sizeof it.key, "%s", key);
    snprintf(it.tier, sizeof it.tier, "%s", s->tiers[t].name);
    snprintf(it.owner, sizeof it.owner, "%s", s->owner);
    it.bytes = size;
    cb_hash128_hex(cb_hash128_bytes(buf, size), it.sum);
    tmp = st_entry_path(s, t, key, s->owner);
    fin = st_entry_path(s, t, key, NULL);
    if (!tmp || !fin) {
        out = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((out = write_tmp(tmp, key, buf, size, err)) != CB_OK)
        goto done;
    free(buf);
    buf = NULL;

    if ((out = st_lock(s, err)) != CB_OK)
        goto done;
    locked = 1;
    rc = st_get_row(s, key, &r, err);
    if (rc < 0) {
        out = rc;
        goto done;
    }
    if (rc == 0 || r.state != 1 || r.tier != t) {
        snprintf(why, why_n, "moved or removed meanwhile");
        out = RC_BUSY;
        goto done;
    }
    /* An entry that grows takes room its tier has: a recode moves and
     * evicts no other entry. */
    if (size > r.bytes && s->tiers[t].cap) {
        uint64_t used;
        if ((out = st_tier_used(s, t, &used, err)) != CB_OK)
            goto done;
        if (used + (size - r.bytes) > s->tiers[t].cap) {
            snprintf(why, why_n, "tier %s has no room for its %llu bytes as %s (%llu of %llu used)",
                     s->tiers[t].name, (unsigned long long)size, cb_type_name(type),
                     (unsigned long long)used, (unsigned long long)s->tiers[t].cap);
            out = RC_NO_ROOM;
            goto done;
        }
    }
    /* No reader may hold the old file, and it must be the one converted. */
    if ((fd = st_lock_file_ex(fin)) < 0 || fstat(fd, &sb) != 0 || sb.st_dev != dev ||
        sb.st_ino != ino) {
        snprintf(why, why_n, fd < 0 && errno == EWOULDBLOCK ? "in use" : "replaced meanwhile");
        out = RC_BUSY;
        goto done;
    }
    if ((out = intent_write(s, &it, 0, err)) != CB_OK)
        goto done;
    if (rename(tmp, fin) != 0) {
        out = cb_error_set(err, CB_ERR_CREATE, "%s: rename: %s", fin, strerror(errno));
        intent_drop(s, key);
        goto done;
    }
    st_fsync_dir(s->tiers[t].path);
    if ((out = intent_write(s, &it, 1, err)) != CB_OK)
        goto done; /* the intent stays: settled by the next recode, gc or verify --repair */
    rep->bytes_before += r.bytes;
    rep->bytes_after += size;
    out = RC_DONE;
done:
    if (fd >= 0)
        close(fd);
    if (locked)
        st_unlock(s);
    if (out != RC_DONE && tmp)
        unlink(tmp);
    free(buf);
    free(tmp);
    free(fin);
    return out;
}

typedef struct todo {
    char key[CB_STORE_KEY_LEN + 1];
    int tier;
} todo;

static const char SQL_TODO[] =
    "SELECT key, tier FROM entries WHERE state = 1 AND (?1 IS NULL OR tier = ?1) ORDER BY tier, key";

cb_status cb_store_recode(cb_store *s, const char *tier, cb_type type, cb_store_recode_fn fn,
                          void *ctx, cb_store_recode_report *rep, cb_error *err)
{
    cb_store_recode_report dummy;
    todo *v = NULL;
    size_t n = 0, cap = 0;
    int only = -1, rc;
    cb_status st;

    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (!s)
        return cb_error_set(err, CB_ERR_INVALID, "store recode: no handle");
    if (!cb_kv_type_ok(type))
        return cb_error_set(err, CB_ERR_INVALID, "%s is not an element type of KV files",
                            cb_type_name(type) ? cb_type_name(type) : "(unknown)");
    if (tier && (only = st_tier_index(s, tier)) < 0) {
        if (s->remote.url && strcmp(tier, s->remote.name) == 0)
            return cb_error_set(
                err, CB_ERR_UNSUPPORTED,
                "%s is the shared tier: its entries are not recoded (other hosts stream them part "
                "by part, and Redis cannot replace one under them); recode each host's local tiers",
                tier);
        return cb_error_set(err, CB_ERR_INVALID, "no tier '%s' in %s", tier, s->dir);
    }
    if ((st = st_writable(s, "recode", err)) != CB_OK || (st = st_owner(s, err)) != CB_OK)
        return st;

    /* What an earlier run left: its intents settled, its temporary files
     * removed; then the entries to look at, copied out. */
    if ((st = st_lock(s, err)) != CB_OK)
        return st;
    if ((st = st_recode_settle(s, 1, NULL, NULL, NULL, err)) == CB_OK) {
        for (int t = 0; t < s->n_tiers; t++)
            if (only < 0 || t == only)
                reap_temps(s, t);
    }
    sqlite3_stmt *q = st == CB_OK ? st_stmt(s, SQL_TODO, err) : NULL;
    if (st == CB_OK && !q)
        st = err ? err->status : CB_ERR_IO;
    if (q) {
        if (only >= 0)
            sqlite3_bind_text(q, 1, s->tiers[only].name, -1, SQLITE_STATIC);
        while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
            const char *k = (const char *)sqlite3_column_text(q, 0);
            int t = st_tier_index(s, (const char *)sqlite3_column_text(q, 1));
            if (!k || t < 0)
                continue;
            if (n == cap) {
                todo *nv = cb_vec_reserve(v, &cap, n + 1, sizeof *nv, 256);
                if (!nv) {
                    st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
                    break;
                }
                v = nv;
            }
            snprintf(v[n].key, sizeof v[n].key, "%s", k);
            v[n++].tier = t;
        }
        sqlite3_reset(q);
        if (st == CB_OK && rc != SQLITE_DONE)
            st = st_dberr(s, rc, "recode", err);
    }
    st_unlock(s);
    if (st != CB_OK) {
        free(v);
        return st;
    }

    rep->total = n;
    for (size_t i = 0; i < n; i++) {
        char why[CB_ERROR_MSG_MAX] = "";
        int out = recode_one(s, v[i].key, v[i].tier, type, rep, why, sizeof why, err);
        if (out < 0) {
            st = (cb_status)out;
            break;
        }
        rep->done++;
        rep->recoded += out == RC_DONE;
        rep->already += out == RC_ALREADY;
        rep->busy += out == RC_BUSY;
        rep->no_room += out == RC_NO_ROOM;
        rep->bad += out == RC_BAD;
        if (fn && fn(ctx, rep, v[i].key, why[0] ? why : NULL))
            break;
    }
    free(v);
    return st;
}
