/* index.c - the store's SQLite index (index.db, WAL mode): its schema,
 * prepared statements, transactions and errors, opening it, and the
 * entries' rows. */
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
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- SQLite */

cb_status st_dberr(cb_store *s, int rc, const char *what, cb_error *err)
{
    int base = rc & 0xff;
    cb_status st = base == SQLITE_CORRUPT || base == SQLITE_NOTADB ? CB_ERR_FORMAT
                   : base == SQLITE_NOMEM                          ? CB_ERR_NOMEM
                                                                   : CB_ERR_IO;
    return cb_error_set(err, st, "%s/index.db: %s: %s%s", s->dir, what,
                        s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc),
                        st == CB_ERR_FORMAT ? " (the index is corrupt: cb-store verify --repair)"
                                            : "");
}

cb_status st_write(cb_store *s, sqlite3_stmt *q, const char *what, int *changed, cb_error *err)
{
    int rc = sqlite3_step(q);
    if (changed)
        *changed = sqlite3_changes(s->db);
    sqlite3_reset(q);
    if (rc != SQLITE_DONE) {
        st_rollback(s);
        return st_dberr(s, rc, what, err);
    }
    return CB_OK;
}

sqlite3_stmt *st_stmt(cb_store *s, const char *sql, cb_error *err)
{
    int free_slot = -1;
    for (int i = 0; i < ST_NSTMT; i++) {
        if (s->stmts[i].sql == sql) {
            sqlite3_reset(s->stmts[i].st);
            sqlite3_clear_bindings(s->stmts[i].st);
            return s->stmts[i].st;
        }
        if (!s->stmts[i].sql && free_slot < 0)
            free_slot = i;
    }
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
    if (rc != SQLITE_OK) {
        st_dberr(s, rc, "prepare", err);
        return NULL;
    }
    if (free_slot < 0) {
        sqlite3_finalize(st);
        cb_error_set(err, CB_ERR_INTERNAL, "store: statement cache full");
        return NULL;
    }
    s->stmts[free_slot].sql = sql;
    s->stmts[free_slot].st = st;
    return st;
}

cb_status st_exec(cb_store *s, const char *sql, cb_error *err)
{
    sqlite3_stmt *st = st_stmt(s, sql, err);
    if (!st)
        return err ? err->status : CB_ERR_IO;
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        return st_dberr(s, rc, sql, err);
    return CB_OK;
}

static const char SQL_BEGIN[] = "BEGIN IMMEDIATE";
static const char SQL_COMMIT[] = "COMMIT";
static const char SQL_ROLLBACK[] = "ROLLBACK";

cb_status st_begin(cb_store *s, cb_error *err) { return st_exec(s, SQL_BEGIN, err); }

cb_status st_begin_stmt(cb_store *s, const char *sql, sqlite3_stmt **q, cb_error *err)
{
    cb_status st = st_begin(s, err);
    if (st != CB_OK)
        return st;
    if (!(*q = st_stmt(s, sql, err))) {
        st_rollback(s);
        return err ? err->status : CB_ERR_IO;
    }
    return CB_OK;
}
cb_status st_commit(cb_store *s, cb_error *err) { return st_exec(s, SQL_COMMIT, err); }
void st_rollback(cb_store *s)
{
    if (!sqlite3_get_autocommit(s->db))
        st_exec(s, SQL_ROLLBACK, NULL);
}

static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS entries(\n"
    "  key TEXT PRIMARY KEY NOT NULL,\n"
    "  model TEXT NOT NULL,\n"
    "  tier TEXT NOT NULL,\n"
    "  bytes INTEGER NOT NULL,\n"
    "  n_tokens INTEGER NOT NULL DEFAULT 0,\n"
    "  created INTEGER NOT NULL,\n"
    "  last_access INTEGER NOT NULL,\n"
    "  hits INTEGER NOT NULL DEFAULT 0,\n"
    "  checksum TEXT NOT NULL,\n"
    "  pinned INTEGER NOT NULL DEFAULT 0,\n"
    "  state INTEGER NOT NULL DEFAULT 1,\n"
    "  owner TEXT\n"
    ") WITHOUT ROWID;\n"
    "CREATE INDEX IF NOT EXISTS entries_lru ON entries(tier, last_access);\n"
    "CREATE INDEX IF NOT EXISTS entries_model ON entries(model);\n"
    "CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;\n"
    "CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY NOT NULL, value TEXT) WITHOUT ROWID;\n"
    "INSERT OR IGNORE INTO meta VALUES('schema', '1');\n";

/* Create a fresh index at path (any old one removed first). */
cb_status st_index_create(const char *dir, cb_error *err)
{
    char *p = st_asprintf("%s/index.db", dir), *w = st_asprintf("%s/index.db-wal", dir),
         *m = st_asprintf("%s/index.db-shm", dir);
    sqlite3 *db = NULL;
    char *msg = NULL;
    cb_status st = CB_OK;
    if (!p || !w || !m) {
        st = cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    unlink(p);
    unlink(w);
    unlink(m);
    if (sqlite3_open_v2(p, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK ||
        sqlite3_exec(db, "PRAGMA journal_mode=WAL", NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(db, SCHEMA, NULL, NULL, &msg) != SQLITE_OK) {
        st = cb_error_set(err, CB_ERR_CREATE, "%s: cannot create the index: %s", p,
                          msg  ? msg
                          : db ? sqlite3_errmsg(db)
                               : "out of memory");
        sqlite3_free(msg);
    }
    sqlite3_close(db);
done:
    free(p);
    free(w);
    free(m);
    return st;
}

/* A read-only SQLite URI for path (immutable: the file is taken not to change). */
static char *uri_ro(const char *path, int immutable)
{
    size_t n = strlen(path);
    char *u = malloc(3 * n + 40), *o = u;
    if (!u)
        return NULL;
    o += sprintf(o, "file:");
    for (const char *c = path; *c; c++) {
        if (*c == '?' || *c == '#' || *c == '%')
            o += sprintf(o, "%%%02X", (unsigned char)*c);
        else
            *o++ = *c;
    }
    sprintf(o, "?mode=ro%s", immutable ? "&immutable=1" : "");
    return u;
}

cb_status st_index_open(cb_store *s, cb_error *err)
{
    char *p = st_asprintf("%s/index.db", s->dir);
    sqlite3_stmt *st;
    int rc;

    if (!p)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    if (access(p, F_OK) != 0) {
        cb_status r = cb_error_set(err, CB_ERR_FORMAT,
                                   "%s: the index is missing (cb-store verify --repair)", p);
        free(p);
        return r;
    }
    int ok = 0;
    for (int immutable = 0; immutable < 2; immutable++) {
        if (s->db) {
            sqlite3_close_v2(s->db);
            s->db = NULL;
        }
        if (s->readonly) {
            /* A WAL index read-only needs its -shm file, which a read-only
             * directory may lack: then it is opened as immutable (nobody
             * can be writing it where we cannot write either; a store that
             * others write is read through its -shm). */
            char *u = uri_ro(p, immutable);
            rc = u ? sqlite3_open_v2(u, &s->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL)
                   : SQLITE_NOMEM;
            free(u);
        } else {
            rc = sqlite3_open_v2(p, &s->db, SQLITE_OPEN_READWRITE, NULL);
        }
        if (rc != SQLITE_OK)
            break;
        sqlite3_busy_timeout(s->db, ST_BUSY_MS);
        if (!s->readonly)
            sqlite3_exec(s->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
        /* The schema check is the first read: a file that is not an index,
         * or a corrupt one, fails here. */
        rc = sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE name = 'schema'", -1, &st,
                                NULL);
        if (rc == SQLITE_OK) {
            rc = sqlite3_step(st);
            ok = rc == SQLITE_ROW && sqlite3_column_int(st, 0) == ST_SCHEMA;
            sqlite3_finalize(st);
        }
        if (!s->readonly || (rc & 0xff) != SQLITE_CANTOPEN)
            break;
    }
    free(p);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return st_dberr(s, rc, "open", err);
    if (!ok)
        return cb_error_set(err, CB_ERR_FORMAT, "%s/index.db: not a store index of schema %d",
                            s->dir, ST_SCHEMA);
    return CB_OK;
}

/* ------------------------------------------------------------ rows */

static const char SQL_ROW[] =
    "SELECT tier, state, bytes, checksum, pinned, hits FROM entries WHERE key = ?1";
static const char SQL_DEL_AT[] = "DELETE FROM entries WHERE key = ?1 AND tier = ?2";

/* 1 with *r filled, 0 when key has no row, <0 on error. */
int st_get_row(cb_store *s, const char *key, st_row *r, cb_error *err)
{
    sqlite3_stmt *q = st_stmt(s, SQL_ROW, err);
    if (!q)
        return err ? err->status : CB_ERR_IO;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        r->tier = st_tier_index(s, (const char *)sqlite3_column_text(q, 0));
        r->state = sqlite3_column_int(q, 1);
        r->bytes = (uint64_t)sqlite3_column_int64(q, 2);
        snprintf(r->checksum, sizeof r->checksum, "%s",
                 sqlite3_column_text(q, 3) ? (const char *)sqlite3_column_text(q, 3) : "");
        r->pinned = sqlite3_column_int(q, 4);
        r->hits = sqlite3_column_int64(q, 5);
    }
    sqlite3_reset(q);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return st_dberr(s, rc, "lookup", err);
    return rc == SQLITE_ROW;
}

/* Run one data-changing statement with key and tier name (and a second tier
 * name) in its own transaction; the number of rows changed, or <0. */
int st_change(cb_store *s, const char *sql, const char *key, int tier, int tier2, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    if ((st = st_begin_stmt(s, sql, &q, err)) != CB_OK)
        return st;
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, s->tiers[tier].name, -1, SQLITE_STATIC);
    if (tier2 >= 0)
        sqlite3_bind_text(q, 3, s->tiers[tier2].name, -1, SQLITE_STATIC);
    int n;
    if ((st = st_write(s, q, "update", &n, err)) != CB_OK)
        return st;
    if ((st = st_commit(s, err)) != CB_OK) {
        st_rollback(s);
        return st;
    }
    return n;
}

int st_delete_at(cb_store *s, const char *key, int tier, cb_error *err)
{
    return st_change(s, SQL_DEL_AT, key, tier, -1, err);
}
