/* maint.c - keeping a store sound: gc (capacities, orphans, temporary
 * files, unfinished writes of dead processes) and verify with repair.
 * Everything here runs under the store lock (DIR/lock); readers go on
 * meanwhile, and an entry a reader holds is skipped. */
#include "store_impl.h"
#include "../core/vec.h"

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

/* --------------------------------------------------------- scanning */

/* A name in a tier directory. */
enum { F_OTHER, F_ENTRY, F_TEMP_OWNED, F_TEMP_OTHER };

static int classify(const char *name, char key[CB_STORE_KEY_LEN + 1], char owner[ST_OWNER_LEN + 1])
{
    size_t n = strlen(name);
    const char *t = strstr(name, ".tmp.");
    if (name[0] == '.')
        return F_OTHER;
    if (t) {
        const char *o = t + 5, *last;
        while ((last = strstr(o, ".tmp.")) != NULL)
            o = last + 5;
        if (strlen(o) == ST_OWNER_LEN && strspn(o, "0123456789abcdef") == ST_OWNER_LEN) {
            memcpy(owner, o, ST_OWNER_LEN + 1);
            return F_TEMP_OWNED;
        }
        return F_TEMP_OTHER;
    }
    if (n == CB_STORE_KEY_LEN + 3 && strcmp(name + CB_STORE_KEY_LEN, ".kv") == 0) {
        memcpy(key, name, CB_STORE_KEY_LEN);
        key[CB_STORE_KEY_LEN] = 0;
        if (st_key_valid(key))
            return F_ENTRY;
    }
    return F_OTHER;
}

typedef struct names {
    char **v;
    size_t n, cap;
} names;

static void names_free(names *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int names_push(names *l, const char *s)
{
    if (l->n == l->cap) {
        char **v = cb_vec_reserve(l->v, &l->cap, l->n + 1, sizeof *v, 64);
        if (!v)
            return -1;
        l->v = v;
    }
    if (!(l->v[l->n] = strdup(s)))
        return -1;
    l->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names in a directory (sorted); a missing directory is empty. */
static cb_status list_dir(const char *dir, names *out, cb_error *err)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        return errno == ENOENT ? CB_OK
                               : cb_error_set(err, CB_ERR_IO, "%s: %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (names_push(out, e->d_name) != 0) {
            closedir(d);
            return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        }
    }
    closedir(d);
    if (out->n)
        qsort(out->v, out->n, sizeof *out->v, cmp_str);
    return CB_OK;
}

static char *path2(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int older_than(const char *path, int64_t secs)
{
    struct stat sb;
    return stat(path, &sb) == 0 && (int64_t)time(NULL) - (int64_t)sb.st_mtime > secs;
}

/* All rows, copied out so that the statement is done before files are touched. */
typedef struct rowl {
    char key[CB_STORE_KEY_LEN + 1];
    char tier[33];
    char owner[ST_OWNER_LEN + 1];
    char checksum[33];
    int state;
    uint64_t bytes;
} rowl;

static const char SQL_ALL[] =
    "SELECT key, tier, state, owner, bytes, checksum FROM entries ORDER BY key";
static const char SQL_ONE[] =
    "SELECT key, tier, state, owner, bytes, checksum FROM entries WHERE key = ?1";

static void fill_rowl(sqlite3_stmt *q, rowl *r)
{
    const char *t;
    memset(r, 0, sizeof *r);
    if ((t = (const char *)sqlite3_column_text(q, 0)))
        snprintf(r->key, sizeof r->key, "%s", t);
    if ((t = (const char *)sqlite3_column_text(q, 1)))
        snprintf(r->tier, sizeof r->tier, "%s", t);
    r->state = sqlite3_column_int(q, 2);
    if ((t = (const char *)sqlite3_column_text(q, 3)))
        snprintf(r->owner, sizeof r->owner, "%s", t);
    r->bytes = (uint64_t)sqlite3_column_int64(q, 4);
    if ((t = (const char *)sqlite3_column_text(q, 5)))
        snprintf(r->checksum, sizeof r->checksum, "%s", t);
}

/* The row of key now: 1 found, 0 not, <0 error. */
static int one_row(cb_store *s, const char *key, rowl *r, cb_error *err)
{
    sqlite3_stmt *q = st_stmt(s, SQL_ONE, err);
    if (!q)
        return err ? err->status : CB_ERR_IO;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW)
        fill_rowl(q, r);
    sqlite3_reset(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return st_dberr(s, rc, "lookup", err);
    return rc == SQLITE_ROW;
}

static cb_status all_rows(cb_store *s, rowl **out, size_t *n, cb_error *err)
{
    sqlite3_stmt *q = st_stmt(s, SQL_ALL, err);
    rowl *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc;
    if (!q)
        return err ? err->status : CB_ERR_IO;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (cnt == cap) {
            rowl *nv = cb_vec_reserve(v, &cap, cnt + 1, sizeof *nv, 256);
            if (!nv) {
                sqlite3_reset(q);
                free(v);
                return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            }
            v = nv;
        }
        fill_rowl(q, &v[cnt++]);
    }
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        free(v);
        return st_dberr(s, rc, "scan", err);
    }
    *out = v;
    *n = cnt;
    return CB_OK;
}

/* Remove the owner files of processes that are gone. */
static void reap_owners(cb_store *s)
{
    char *dir = path2(s->dir, "owners");
    names l = {0};
    if (dir && list_dir(dir, &l, NULL) == CB_OK) {
        for (size_t i = 0; i < l.n; i++) {
            char *p = path2(dir, l.v[i]);
            size_t n = strlen(l.v[i]);
            if (!p)
                continue;
            if (n == ST_OWNER_LEN && !st_owner_alive(s, l.v[i]))
                unlink(p);
            else if (n == ST_OWNER_LEN + 4 && strcmp(l.v[i] + ST_OWNER_LEN, ".new") == 0 &&
                     older_than(p, 60))
                unlink(p);
            free(p);
        }
    }
    names_free(&l);
    free(dir);
}

/* --------------------------------------------------------------- gc */

cb_status cb_store_gc(cb_store *s, cb_store_gc_report *rep, cb_error *err)
{
    cb_store_gc_report dummy;
    rowl *rows = NULL;
    size_t n_rows = 0;
    cb_status st;

    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if ((st = st_owner(s, err)) != CB_OK)
        return st;
    if ((st = st_lock(s, err)) != CB_OK)
        return st;

    /* 1. Rewrites, reservations of dead processes; rows whose file is gone. */
    if ((st = st_recode_settle(s, 1, NULL, NULL, NULL, err)) != CB_OK ||
        (st = all_rows(s, &rows, &n_rows, err)) != CB_OK)
        goto done;
    for (size_t i = 0; i < n_rows; i++) {
        rowl *r = &rows[i];
        int t = st_tier_index(s, r->tier);
        char *p = t >= 0 ? st_entry_path(s, t, r->key, NULL) : NULL;
        int drop = 0;
        if (t < 0)
            drop = 1; /* a tier the configuration no longer has */
        else if (!p) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        } else if (r->state == 0 && !st_owner_alive(s, r->owner)) {
            char *tp = st_entry_path(s, t, r->key, r->owner);
            if (tp)
                unlink(tp);
            free(tp);
            st_unlink_locked(p);
            drop = 1;
        } else if (r->state == 1 && access(p, F_OK) != 0 && errno == ENOENT) {
            drop = 1;
        } else if (r->state == 2) {
            /* removed while in use: the file goes once its readers are done */
            if ((drop = st_unlink_locked(p) == 1))
                rep->orphans++;
        }
        free(p);
        if (drop) {
            if (t >= 0) {
                if (st_delete_at(s, r->key, t, err) < 0) {
                    st = err ? err->status : CB_ERR_IO;
                    goto done;
                }
                if (r->state == 2)
                    continue;
            } else {
                sqlite3_stmt *q;
                if ((st = st_begin_stmt(s, "DELETE FROM entries WHERE key = ?1", &q, err)) != CB_OK)
                    goto done;
                sqlite3_bind_text(q, 1, r->key, -1, SQLITE_STATIC);
                sqlite3_step(q);
                sqlite3_reset(q);
                if ((st = st_commit(s, err)) != CB_OK) {
                    st_rollback(s);
                    goto done;
                }
            }
            rep->stale++;
        }
    }

    /* 2. Files: temporaries of dead processes, stale foreign temporaries,
     *    entry files that the index does not place in this tier. */
    for (int t = 0; t <= s->n_tiers; t++) {
        char *dir = t < s->n_tiers ? strdup(s->tiers[t].path) : path2(s->dir, "tmp");
        names l = {0};
        if (!dir || (st = list_dir(dir, &l, err)) != CB_OK) {
            free(dir);
            if (!dir)
                st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < l.n; i++) {
            char key[CB_STORE_KEY_LEN + 1], owner[ST_OWNER_LEN + 1];
            int kind = classify(l.v[i], key, owner);
            char *p = path2(dir, l.v[i]);
            st_row r;
            if (!p)
                continue;
            if (kind == F_TEMP_OWNED && !st_owner_alive(s, owner)) {
                if (unlink(p) == 0)
                    rep->temps++;
            } else if (kind == F_TEMP_OTHER && older_than(p, ST_STALE_TMP_S)) {
                if (unlink(p) == 0)
                    rep->temps++;
            } else if (kind == F_ENTRY && t < s->n_tiers) {
                int rc = st_get_row(s, key, &r, NULL);
                /* A reservation in this tier is a write in progress (its
                 * owner is alive: dead ones went in step 1). */
                if (rc == 0 || (rc == 1 && r.tier != t)) {
                    if (st_unlink_locked(p) == 1)
                        rep->orphans++;
                }
            }
            free(p);
        }
        names_free(&l);
        free(dir);
    }

    /* 3. Capacities, fastest tier first (its demotions land below). */
    for (int t = 0; t < s->n_tiers; t++) {
        st = st_make_room(s, t, 0, NULL, rep, err);
        if (st == CB_ERR_CREATE)
            st = CB_OK; /* pinned or in use: counted in rep->busy */
        if (st != CB_OK)
            goto done;
    }
    reap_owners(s);
    sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
done:
    free(rows);
    st_unlock(s);
    if (st == CB_OK && s->remote.url) {
        /* the shared tier's accounting recounted (its capacity is kept by
         * every commit); a server that cannot be reached is warned about */
        uint64_t n, bad, bytes = 0;
        cb_error e;
        if (st_remote_check(s, 0, 1, NULL, NULL, &n, &bad, &bytes, &e) != CB_OK)
            st_remote_warn(s, "gc: %s", e.msg);
    }
    return st;
}

/* ------------------------------------------------------------- verify */

typedef struct vctx {
    cb_store *s;
    int fix;
    const char *prefix; /* before each message */
    void (*problem)(void *ctx, const char *what, const char *msg);
    void *ctx;
    cb_store_verify_report *rep;
    cb_error *err;
} vctx;

static void report(vctx *v, const char *what, int fixed, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report(vctx *v, const char *what, int fixed, const char *fmt, ...)
{
    char msg[700];
    size_t n = 0;
    va_list ap;
    if (v->prefix)
        n = (size_t)snprintf(msg, sizeof msg, "%s", v->prefix);
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - n, fmt, ap);
    va_end(ap);
    if (fixed)
        strncat(msg, " (repaired)", sizeof msg - strlen(msg) - 1);
    v->rep->problems++;
    if (fixed)
        v->rep->repaired++;
    if (v->problem)
        v->problem(v->ctx, what, msg);
}

/* Check a file fully: size and checksum against the row (when given), its
 * own header and layer checksums, and that it holds `key`.  NULL when fine,
 * else a static description; *sum receives its checksum. */
static const char *check_file(const char *path, const char *key, const rowl *r, char sum[33],
                              char model[33], int64_t *n_tokens, uint64_t *size,
                              uint64_t *read_bytes, char *why, size_t why_n)
{
    cb_mmap m;
    cb_error e;
    cb_kvfile *f = NULL;
    if (cb_mmap_open(&m, path, &e) != CB_OK) {
        snprintf(why, why_n, "cannot be read: %s", e.msg);
        return why;
    }
    *size = m.size;
    *read_bytes += m.size;
    cb_hash128_hex(cb_hash128_bytes(m.data, m.size), sum);
    cb_mmap_close(&m);
    if (r && *size != r->bytes) {
        snprintf(why, why_n, "has %llu bytes, the index says %llu", (unsigned long long)*size,
                 (unsigned long long)r->bytes);
        return why;
    }
    if (r && strcmp(sum, r->checksum) != 0) {
        snprintf(why, why_n, "checksum %s, the index says %s", sum, r->checksum);
        return why;
    }
    if (cb_kvfile_open(&f, path, &e) != CB_OK || cb_kvfile_verify(f, &e) != CB_OK) {
        size_t pl = strlen(path);
        const char *msg =
            strncmp(e.msg, path, pl) == 0 && e.msg[pl] == ':' ? e.msg + pl + 2 : e.msg;
        cb_kvfile_free(f);
        snprintf(why, why_n, "%s", msg);
        return why;
    }
    const cb_kv_meta *mt = cb_kvfile_meta(f);
    char k2[66];
    cb_kv_key(mt->model, mt->tokens, k2);
    cb_hash128_hex(mt->model, model);
    *n_tokens = mt->n_tokens;
    cb_kvfile_free(f);
    if (strcmp(k2, key) != 0) {
        snprintf(why, why_n, "holds the entry %s", k2);
        return why;
    }
    return NULL;
}

static const char SQL_ADOPT[] =
    "INSERT OR REPLACE INTO entries(key, model, tier, bytes, n_tokens, created, last_access, hits, checksum, pinned,"
    " state, owner) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6, 0, ?7, 0, 1, NULL)";
static const char SQL_FIXSUM[] = "UPDATE entries SET checksum = ?2, bytes = ?3 WHERE key = ?1";

static int adopt(cb_store *s, const char *key, const char *model, int t, uint64_t bytes,
                 int64_t n_tokens, int64_t mtime_us, const char *sum)
{
    sqlite3_stmt *q;
    if (st_begin_stmt(s, SQL_ADOPT, &q, NULL) != CB_OK)
        return -1;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, model, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, s->tiers[t].name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, (sqlite3_int64)bytes);
    sqlite3_bind_int64(q, 5, n_tokens);
    sqlite3_bind_int64(q, 6, mtime_us);
    sqlite3_bind_text(q, 7, sum, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE || st_commit(s, NULL) != CB_OK) {
        st_rollback(s);
        return -1;
    }
    return 0;
}

static void del_key(cb_store *s, const char *key)
{
    sqlite3_stmt *q;
    if (st_begin(s, NULL) != CB_OK)
        return;
    if ((q = st_stmt(s, "DELETE FROM entries WHERE key = ?1", NULL))) {
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        sqlite3_step(q);
        sqlite3_reset(q);
    }
    if (st_commit(s, NULL) != CB_OK)
        st_rollback(s);
}

/* Check one entry against its file, under the lock (so that no move or
 * removal is half done), as the index has it now. */
static cb_status verify_row(vctx *v, const rowl *r)
{
    cb_store *s = v->s;
    char why[600];
    int t = st_tier_index(s, r->tier);
    v->rep->entries++;
    if (t < 0) {
        if (v->fix)
            del_key(s, r->key);
        report(v, r->key, v->fix, "indexed in tier '%s', which the configuration does not have",
               r->tier);
        return CB_OK;
    }
    char *p = st_entry_path(s, t, r->key, NULL);
    if (!p)
        return cb_error_set(v->err, CB_ERR_NOMEM, "out of memory");
    if (r->state == 2) {
        /* removed while in use: its file stays until its readers are done */
        if (access(p, F_OK) != 0) {
            if (v->fix)
                del_key(s, r->key);
            report(v, r->key, v->fix, "removed, and its file %s is missing", p);
        }
        free(p);
        return CB_OK;
    }
    if (r->state == 0) {
        if (!st_owner_alive(s, r->owner)) {
            if (v->fix) {
                char *tp = st_entry_path(s, t, r->key, r->owner);
                if (tp)
                    unlink(tp);
                free(tp);
                st_unlink_locked(p);
                del_key(s, r->key);
            }
            report(v, r->key, v->fix, "an unfinished write by a process that is gone");
        }
        free(p);
        return CB_OK;
    }
    char sum[33], model[33];
    int64_t nt;
    uint64_t size;
    const char *bad;
    if (access(p, F_OK) != 0) {
        if (v->fix)
            del_key(s, r->key);
        report(v, r->key, v->fix, "indexed in tier %s but %s is missing", r->tier, p);
    } else if ((bad = check_file(p, r->key, r, sum, model, &nt, &size, &v->rep->bytes, why,
                                 sizeof why)) &&
               !(!v->fix && st_recode_pending(s, r->key))) { /* reported as a rewrite */
        int fixed = 0;
        if (v->fix) {
            /* The index may be what is wrong: a file that is valid on its
             * own terms is kept and the index corrected. */
            uint64_t again = 0; /* the same bytes: counted once */
            if (check_file(p, r->key, NULL, sum, model, &nt, &size, &again, why, sizeof why) ==
                NULL) {
                sqlite3_stmt *q;
                if (st_begin_stmt(s, SQL_FIXSUM, &q, NULL) == CB_OK) {
                    sqlite3_bind_text(q, 1, r->key, -1, SQLITE_STATIC);
                    sqlite3_bind_text(q, 2, sum, -1, SQLITE_STATIC);
                    sqlite3_bind_int64(q, 3, (sqlite3_int64)size);
                    sqlite3_step(q);
                    sqlite3_reset(q);
                    fixed = st_commit(s, NULL) == CB_OK;
                }
                if (!fixed)
                    st_rollback(s);
            } else if (st_unlink_locked(p) == 1) {
                del_key(s, r->key);
                fixed = 1;
            }
        }
        report(v, p, fixed, "%s", bad);
    }
    free(p);
    return CB_OK;
}

static void intent_problem(void *ctx, const char *key, int forward, int fixed)
{
    report(ctx, key, fixed, "%s",
           forward ? "an interrupted recode: the file is rewritten, the index still has its old "
                     "size and checksum (cb-store recode, gc or verify --repair finishes it)"
                   : "an interrupted recode: the file was not replaced, its intent is left in the "
                     "index (cb-store recode, gc or verify --repair drops it)");
}

static cb_status verify_pass(vctx *v)
{
    cb_store *s = v->s;
    rowl *rows = NULL;
    size_t n_rows = 0;
    cb_status st;
    char why[600];

    /* The index itself. */
    {
        sqlite3_stmt *q = NULL;
        int rc = sqlite3_prepare_v2(s->db, "PRAGMA quick_check", -1, &q, NULL);
        const char *res = NULL;
        if (rc == SQLITE_OK && (rc = sqlite3_step(q)) == SQLITE_ROW)
            res = (const char *)sqlite3_column_text(q, 0);
        if (!res || strcmp(res, "ok") != 0)
            report(v, "index.db", 0,
                   "the index is corrupt: %s (cb-store verify --repair after cb_store_reset_index)",
                   res ? res : sqlite3_errmsg(s->db));
        sqlite3_finalize(q);
    }

    /* Rewrites that a killed cb-store recode left half done. */
    if ((st = st_lock(s, v->err)) != CB_OK)
        return st;
    st = st_recode_settle(s, v->fix, intent_problem, v, NULL, v->err);
    st_unlock(s);
    if (st != CB_OK)
        return st;

    /* Every row against its file; the lock is taken per entry, so that
     * writers wait for one file's check at most. */
    if ((st = all_rows(s, &rows, &n_rows, v->err)) != CB_OK)
        return st;
    for (size_t i = 0; i < n_rows && st == CB_OK; i++) {
        rowl now;
        if ((st = st_lock(s, v->err)) != CB_OK)
            break;
        int rc = one_row(s, rows[i].key, &now, v->err);
        if (rc < 0)
            st = (cb_status)rc;
        else if (rc == 1)
            st = verify_row(v, &now);
        st_unlock(s);
    }
    free(rows);
    if (st != CB_OK)
        return st;

    /* Every file against the index. */
    for (int t = 0; t <= s->n_tiers; t++) {
        char *dir = t < s->n_tiers ? strdup(s->tiers[t].path) : path2(s->dir, "tmp");
        names l = {0};
        if (!dir)
            return cb_error_set(v->err, CB_ERR_NOMEM, "out of memory");
        if ((st = list_dir(dir, &l, v->err)) != CB_OK) {
            free(dir);
            return st;
        }
        for (size_t i = 0; i < l.n; i++) {
            char key[CB_STORE_KEY_LEN + 1], owner[ST_OWNER_LEN + 1];
            int kind = classify(l.v[i], key, owner);
            char *p = path2(dir, l.v[i]);
            st_row r;
            if (!p)
                continue;
            if (kind == F_OTHER || (st = st_lock(s, v->err)) != CB_OK) {
                free(p);
                if (st != CB_OK)
                    break;
                continue;
            }
            if (access(p, F_OK) != 0) {
                /* gone meanwhile (moved, removed, renamed into place) */
            } else if (kind == F_TEMP_OWNED && !st_owner_alive(s, owner)) {
                report(v, p, v->fix && unlink(p) == 0,
                       "a temporary file of a process that is gone");
            } else if (kind == F_TEMP_OTHER && older_than(p, ST_STALE_TMP_S)) {
                report(v, p, v->fix && unlink(p) == 0, "a stale temporary file");
            } else if (kind == F_ENTRY && t < s->n_tiers) {
                v->rep->files++;
                int rc = st_get_row(s, key, &r, NULL);
                if (rc == 1 && r.tier == t) {
                    /* as the index says */
                } else if (rc == 1 && r.tier >= 0 && r.tier != t) {
                    report(v, p, v->fix && st_unlink_locked(p) == 1,
                           "a second copy of an entry of tier %s", s->tiers[r.tier].name);
                } else if (rc == 0) {
                    char sum[33], model[33];
                    int64_t nt;
                    uint64_t size;
                    struct stat sb;
                    const char *bad = check_file(p, key, NULL, sum, model, &nt, &size,
                                                 &v->rep->bytes, why, sizeof why);
                    int fixed = 0;
                    if (v->fix && bad)
                        fixed = st_unlink_locked(p) == 1;
                    else if (v->fix && stat(p, &sb) == 0)
                        fixed =
                            adopt(s, key, model, t, size, nt,
                                  (int64_t)sb.st_mtim.tv_sec * 1000000 + sb.st_mtim.tv_nsec / 1000,
                                  sum) == 0;
                    if (bad)
                        report(v, p, fixed, "not in the index, and invalid: %s", bad);
                    else
                        report(v, p, fixed, "a valid entry file that is not in the index");
                }
            }
            st_unlock(s);
            free(p);
        }
        names_free(&l);
        free(dir);
        if (st != CB_OK)
            return st;
    }

    /* Capacities. */
    for (int t = 0; t < s->n_tiers; t++) {
        uint64_t used;
        if ((st = st_lock(s, v->err)) != CB_OK)
            return st;
        if ((st = st_tier_used(s, t, &used, v->err)) != CB_OK) {
            st_unlock(s);
            return st;
        }
        if (s->tiers[t].cap && used > s->tiers[t].cap) {
            int fixed = 0;
            if (v->fix) {
                cb_status r = st_make_room(s, t, 0, NULL, NULL, v->err);
                if (r != CB_OK && r != CB_ERR_CREATE) {
                    st_unlock(s);
                    return r;
                }
                fixed = r == CB_OK;
            }
            report(v, s->tiers[t].name, fixed,
                   "tier %s holds %llu bytes, over its capacity of %llu", s->tiers[t].name,
                   (unsigned long long)used, (unsigned long long)s->tiers[t].cap);
        }
        st_unlock(s);
    }
    return CB_OK;
}

cb_status cb_store_verify(cb_store *s, int repair,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          cb_store_verify_report *rep, cb_error *err)
{
    cb_store_verify_report dummy;
    cb_status st;
    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (repair && (st = st_owner(s, err)) != CB_OK)
        return st; /* a read-only store cannot be repaired */
    vctx v = {s, repair, NULL, problem, ctx, rep, err};
    st = verify_pass(&v);
    if (st == CB_OK && s->remote.url && !s->readonly) {
        uint64_t n = 0, bad = 0;
        st = st_remote_check(s, 1, repair, problem, ctx, &n, &bad, &rep->bytes, err);
        rep->entries += n;
        rep->problems += bad;
        if (repair)
            rep->repaired += bad;
    }
    if (st == CB_OK && repair && rep->problems > 0) {
        /* Check again, without fixing: what is left is reported too. */
        cb_store_verify_report again;
        memset(&again, 0, sizeof again);
        vctx v2 = {s, 0, "still after repair: ", problem, ctx, &again, err};
        st = verify_pass(&v2);
        rep->remaining = again.problems;
    } else {
        rep->remaining = rep->problems;
    }
    if (repair && st_lock(s, NULL) == CB_OK) {
        reap_owners(s);
        st_unlock(s);
    }
    if (st != CB_OK)
        return st;
    if (rep->remaining)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: %llu inconsistencies", s->dir,
                            (unsigned long long)rep->remaining);
    return CB_OK;
}
