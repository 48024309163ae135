/* store.c - the tiered store: configuration, index, locks, owners, and the
 * operations on single entries (put, acquire, lookup, remove, pin, list,
 * stat).  Layout and invariants in store_impl.h and cb-store(5). */
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

/* ------------------------------------------------------------ helpers */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p = NULL;
    va_start(ap, fmt);
    if (vasprintf(&p, fmt, ap) < 0)
        p = NULL;
    va_end(ap);
    return p;
}

int64_t st_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int is_hex(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return 0;
    return 1;
}

int st_key_valid(const char *key)
{
    return key && strlen(key) == CB_STORE_KEY_LEN && key[32] == '-' && is_hex(key, 32) && is_hex(key + 33, 32);
}

static void random_hex(char *out, size_t n_hex)
{
    uint8_t b[32];
    size_t nb = (n_hex + 1) / 2;
    static const char hx[] = "0123456789abcdef";
    if (getrandom(b, nb, 0) != (ssize_t)nb) {
        uint64_t x = (uint64_t)st_now_us() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < nb; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[i] = (uint8_t)x;
        }
    }
    for (size_t i = 0; i < n_hex; i++)
        out[i] = hx[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n_hex] = 0;
}

static int mkdir_p(const char *path, mode_t mode)
{
    char *p = strdup(path);
    if (!p)
        return -1;
    for (char *q = p + 1; *q; q++) {
        if (*q != '/')
            continue;
        *q = 0;
        if (mkdir(p, mode) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *q = '/';
    }
    int rc = mkdir(p, mode);
    free(p);
    if (rc != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

void st_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int st_lock_file_ex(const char *path)
{
    struct stat a, b;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        errno = e == EINTR ? EWOULDBLOCK : e;
        return -1;
    }
    /* The path may have been renamed over or unlinked since we opened it. */
    if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
        close(fd);
        errno = ENOENT;
        return -1;
    }
    return fd;
}

int st_unlink_locked(const char *path)
{
    int fd = st_lock_file_ex(path);
    if (fd < 0)
        return errno == EWOULDBLOCK ? 0 : errno == ENOENT ? 1 : -1;
    int rc = unlink(path) == 0 || errno == ENOENT ? 1 : -1;
    close(fd);
    return rc;
}

/* ------------------------------------------------------------- SQLite */

cb_status st_dberr(cb_store *s, int rc, const char *what, cb_error *err)
{
    int base = rc & 0xff;
    cb_status st = base == SQLITE_CORRUPT || base == SQLITE_NOTADB ? CB_ERR_FORMAT
                 : base == SQLITE_NOMEM                            ? CB_ERR_NOMEM
                                                                   : CB_ERR_IO;
    return cb_error_set(err, st, "%s/index.db: %s: %s%s", s->dir, what, s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc),
                        st == CB_ERR_FORMAT ? " (the index is corrupt: cb-store verify --repair)" : "");
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
static cb_status index_create(const char *dir, cb_error *err)
{
    char *p = xasprintf("%s/index.db", dir), *w = xasprintf("%s/index.db-wal", dir),
         *m = xasprintf("%s/index.db-shm", dir);
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
                          msg ? msg : db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_free(msg);
    }
    sqlite3_close(db);
done:
    free(p);
    free(w);
    free(m);
    return st;
}

/* --------------------------------------------------------------- locks */

cb_status st_lock(cb_store *s, cb_error *err)
{
    if (s->lock_held++ > 0)
        return CB_OK;
    while (flock(s->lock_fd, LOCK_EX) != 0) {
        if (errno == EINTR)
            continue;
        s->lock_held = 0;
        return cb_error_set(err, CB_ERR_IO, "%s/lock: %s", s->dir, strerror(errno));
    }
    return CB_OK;
}

int st_trylock(cb_store *s)
{
    if (s->lock_held > 0) {
        s->lock_held++;
        return 1;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0)
        return 0;
    s->lock_held = 1;
    return 1;
}

void st_unlock(cb_store *s)
{
    if (s->lock_held > 0 && --s->lock_held == 0)
        flock(s->lock_fd, LOCK_UN);
}

/* -------------------------------------------------------------- owners */

cb_status st_owner(cb_store *s, cb_error *err)
{
    if (s->owner_fd >= 0)
        return CB_OK;
    char id[ST_OWNER_LEN + 1];
    random_hex(id, ST_OWNER_LEN);
    char *dir = xasprintf("%s/owners", s->dir), *tmp = xasprintf("%s/owners/%s.new", s->dir, id),
         *fin = xasprintf("%s/owners/%s", s->dir, id);
    cb_status st = CB_OK;
    int fd = -1;
    if (!dir || !tmp || !fin) {
        st = cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", s->dir);
        goto done;
    }
    mkdir(dir, 0755);
    /* Locked before it is visible under its final name, so that a gc never
     * sees an owner file that nobody holds and takes a live writer for dead. */
    fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0 || rename(tmp, fin) != 0) {
        st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", tmp, strerror(errno));
        if (fd >= 0) {
            unlink(tmp);
            close(fd);
        }
        goto done;
    }
    s->owner_fd = fd;
    memcpy(s->owner, id, sizeof id);
done:
    free(dir);
    free(tmp);
    free(fin);
    return st;
}

int st_owner_alive(cb_store *s, const char *id)
{
    if (s->owner_fd >= 0 && strcmp(id, s->owner) == 0)
        return 1;
    if (strlen(id) != ST_OWNER_LEN || !is_hex(id, ST_OWNER_LEN))
        return 0;
    char *p = xasprintf("%s/owners/%s", s->dir, id);
    if (!p)
        return 1;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    free(p);
    if (fd < 0)
        return errno == ENOENT ? 0 : 1;
    int alive = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd);
    return alive;
}

/* ------------------------------------------------------- configuration */

static int tier_name_valid(const char *n)
{
    size_t len = n ? strlen(n) : 0;
    if (len < 1 || len > 32)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return 0;
    }
    return 1;
}

static char *abs_path(const char *dir, const char *p)
{
    return p[0] == '/' ? strdup(p) : xasprintf("%s/%s", dir, p);
}

static char *marker_path(const char *tier)
{
    return xasprintf("%s/.cb-store", tier);
}

/* 1 when the tier directory carries id, 0 when it has no marker, -1 when it
 * belongs to another store. */
static int marker_check(const char *tier, const char *id)
{
    char *p = marker_path(tier);
    char buf[64] = {0};
    int rc = 0;
    FILE *f = p ? fopen(p, "r") : NULL;
    if (f) {
        rc = fgets(buf, sizeof buf, f) && strncmp(buf, id, 32) == 0 ? 1 : -1;
        fclose(f);
    }
    free(p);
    return rc;
}

static cb_status marker_write(const char *tier, const char *id, cb_error *err)
{
    char *p = marker_path(tier);
    char buf[40];
    if (!p)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    snprintf(buf, sizeof buf, "%s\n", id);
    cb_status st = cb_file_write_atomic(p, buf, strlen(buf), err);
    free(p);
    return st;
}

static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int empty = 1;
    if (!d)
        return errno == ENOENT;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            empty = 0;
            break;
        }
    closedir(d);
    return empty;
}

static const char *conf_name = "store.json";

static cb_status init_locked(const char *dir, const cb_store_tier *tiers, int n_tiers, int promote_hits, int *exists,
                             cb_error *err)
{
    static const cb_store_tier def = {"main", "tiers/main", 0, 0};
    char *conf = xasprintf("%s/%s", dir, conf_name);
    char *abs[CB_STORE_MAX_TIERS] = {0};
    char *real[CB_STORE_MAX_TIERS] = {0};
    char id[33];
    json_t *root = NULL, *arr = NULL;
    char *text = NULL;
    cb_status st = CB_OK;

    *exists = 0;
    if (!conf)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    if (access(conf, F_OK) == 0) {
        *exists = 1;
        st = cb_error_set(err, CB_ERR_CREATE, "%s: a store already exists there", dir);
        goto done;
    }
    if (!tiers || n_tiers == 0) {
        tiers = &def;
        n_tiers = 1;
    }
    random_hex(id, 32);
    for (int i = 0; i < n_tiers; i++) {
        if (!(abs[i] = abs_path(dir, tiers[i].path))) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (!dir_is_empty(abs[i])) {
            st = cb_error_set(err, CB_ERR_CREATE, "tier %s: %s is not empty", tiers[i].name, abs[i]);
            goto done;
        }
        if (mkdir_p(abs[i], 0755) != 0 || !(real[i] = realpath(abs[i], NULL))) {
            st = cb_error_set(err, CB_ERR_CREATE, "tier %s: %s: %s", tiers[i].name, abs[i], strerror(errno));
            goto done;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(real[i], real[j]) == 0) {
                st = cb_error_set(err, CB_ERR_INVALID, "tiers %s and %s share the directory %s", tiers[j].name,
                                  tiers[i].name, real[i]);
                goto done;
            }
    }
    for (int i = 0; i < n_tiers; i++)
        if ((st = marker_write(abs[i], id, err)) != CB_OK)
            goto done;
    {
        char *o = xasprintf("%s/owners", dir), *t = xasprintf("%s/tmp", dir);
        int bad = !o || !t || mkdir_p(o, 0755) != 0 || mkdir_p(t, 0755) != 0;
        free(o);
        free(t);
        if (bad) {
            st = cb_error_set(err, CB_ERR_CREATE, "%s: cannot create owners/ or tmp/: %s", dir, strerror(errno));
            goto done;
        }
    }
    if ((st = index_create(dir, err)) != CB_OK)
        goto done;
    root = json_object();
    arr = json_array();
    if (!root || !arr) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    json_object_set_new(root, "format", json_string("cacheblend-store"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "id", json_string(id));
    json_object_set_new(root, "promote_hits", json_integer(promote_hits < 0 ? ST_DEFAULT_PROMOTE : promote_hits));
    for (int i = 0; i < n_tiers; i++)
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:f}", "name", tiers[i].name, "path", tiers[i].path,
                                             "capacity", (json_int_t)tiers[i].capacity, "cost",
                                             tiers[i].cost > 0 ? tiers[i].cost : (double)(n_tiers - i)));
    json_object_set(root, "tiers", arr);
    text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    {
        size_t n = strlen(text);
        char *t2 = realloc(text, n + 2);
        if (!t2) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        text = t2;
        text[n] = '\n';
        text[n + 1] = 0;
    }
    /* The configuration is written last: its presence is what makes the
     * directory a store, so a crash before this point leaves none. */
    st = cb_file_write_atomic(conf, text, strlen(text), err);
done:
    for (int i = 0; i < CB_STORE_MAX_TIERS; i++) {
        free(abs[i]);
        free(real[i]);
    }
    free(text);
    json_decref(arr);
    json_decref(root);
    free(conf);
    return st;
}

static int open_lock_file(const char *dir)
{
    char *p = xasprintf("%s/lock", dir);
    int fd = p ? open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    free(p);
    return fd;
}

cb_status cb_store_init(const char *dir, const cb_store_tier *tiers, int n_tiers, int promote_hits, cb_error *err)
{
    int exists, fd;
    cb_status st;

    if (!dir || !*dir || n_tiers < 0 || n_tiers > CB_STORE_MAX_TIERS || (n_tiers > 0 && !tiers))
        return cb_error_set(err, CB_ERR_INVALID, "store: between 1 and %d tiers", CB_STORE_MAX_TIERS);
    for (int i = 0; i < n_tiers; i++) {
        if (!tier_name_valid(tiers[i].name))
            return cb_error_set(err, CB_ERR_INVALID,
                                "tier name '%s': use 1 to 32 letters, digits, '_', '-' or '.'",
                                tiers[i].name ? tiers[i].name : "");
        if (!tiers[i].path || !*tiers[i].path)
            return cb_error_set(err, CB_ERR_INVALID, "tier %s: no directory", tiers[i].name);
        for (int j = 0; j < i; j++)
            if (strcmp(tiers[i].name, tiers[j].name) == 0)
                return cb_error_set(err, CB_ERR_INVALID, "tier name '%s' given twice", tiers[i].name);
    }
    if (mkdir_p(dir, 0755) != 0)
        return cb_error_set(err, CB_ERR_CREATE, "%s: %s", dir, strerror(errno));
    if ((fd = open_lock_file(dir)) < 0)
        return cb_error_set(err, CB_ERR_CREATE, "%s/lock: %s", dir, strerror(errno));
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
        ;
    st = init_locked(dir, tiers, n_tiers, promote_hits, &exists, err);
    close(fd);
    return st;
}

const char *cb_store_default_dir(char *buf, size_t n)
{
    const char *e = getenv("CB_STORE"), *c = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (e && *e)
        snprintf(buf, n, "%s", e);
    else if (c && *c)
        snprintf(buf, n, "%s/cacheblend/store", c);
    else
        snprintf(buf, n, "%s/.cache/cacheblend/store", h && *h ? h : ".");
    return buf;
}

static cb_status read_config(cb_store *s, cb_error *err)
{
    char *conf = xasprintf("%s/%s", s->dir, conf_name);
    json_error_t je;
    json_t *root, *tiers;
    cb_status st = CB_OK;

    if (!conf)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    root = json_load_file(conf, 0, &je);
    if (!root) {
        st = access(conf, F_OK) != 0 ? cb_error_set(err, CB_ERR_NOT_FOUND, "%s: no store there (cb-store init)", s->dir)
                                     : cb_error_set(err, CB_ERR_FORMAT, "%s: line %d: %s", conf, je.line, je.text);
        free(conf);
        return st;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const char *id = json_string_value(json_object_get(root, "id"));
    json_t *ph = json_object_get(root, "promote_hits");
    tiers = json_object_get(root, "tiers");
    if (!fmt || strcmp(fmt, "cacheblend-store") != 0 || json_integer_value(json_object_get(root, "version")) != 1) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: not a cacheblend store configuration (version 1)", conf);
        goto done;
    }
    if (!id || strlen(id) != 32 || !is_hex(id, 32) || (ph && !json_is_integer(ph)) || !json_is_array(tiers) ||
        json_array_size(tiers) < 1 || json_array_size(tiers) > CB_STORE_MAX_TIERS) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: needs an id, promote_hits and 1 to %d tiers", conf,
                          CB_STORE_MAX_TIERS);
        goto done;
    }
    s->id = strdup(id);
    s->promote_hits = ph ? (int)json_integer_value(ph) : ST_DEFAULT_PROMOTE;
    if (s->promote_hits < 0)
        s->promote_hits = 0;
    for (size_t i = 0; i < json_array_size(tiers); i++) {
        json_t *t = json_array_get(tiers, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        const char *path = json_string_value(json_object_get(t, "path"));
        json_t *cap = json_object_get(t, "capacity");
        if (!tier_name_valid(name) || !path || !*path || (cap && (!json_is_integer(cap) || json_integer_value(cap) < 0))) {
            st = cb_error_set(err, CB_ERR_FORMAT, "%s: tier %zu: needs a valid name, a path and a capacity >= 0", conf,
                              i + 1);
            goto done;
        }
        if (st_tier_index(s, name) >= 0) {
            st = cb_error_set(err, CB_ERR_FORMAT, "%s: tier name '%s' given twice", conf, name);
            goto done;
        }
        st_tier *ti = &s->tiers[s->n_tiers++];
        snprintf(ti->name, sizeof ti->name, "%s", name);
        ti->conf_path = strdup(path);
        ti->path = abs_path(s->dir, path);
        ti->cap = cap ? (uint64_t)json_integer_value(cap) : 0;
        json_t *cost = json_object_get(t, "cost");
        ti->cost = json_is_number(cost) && json_number_value(cost) > 0
                       ? json_number_value(cost)
                       : (double)json_array_size(tiers) - (double)i; /* default: fastest dearest */
        if (!ti->conf_path || !ti->path || !s->id) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
done:
    json_decref(root);
    free(conf);
    return st;
}

/* Each tier directory exists and carries this store's id. */
static cb_status check_tiers(cb_store *s, cb_error *err)
{
    for (int i = 0; i < s->n_tiers; i++) {
        st_tier *t = &s->tiers[i];
        int m = marker_check(t->path, s->id);
        if (m < 0)
            return cb_error_set(err, CB_ERR_FORMAT, "tier %s: %s belongs to another store", t->name, t->path);
        if (m == 0) {
            /* A RAM disk after a reboot: the directory is made again, empty;
             * the index's entries there are dropped by the next gc. */
            if (mkdir_p(t->path, 0755) != 0)
                return cb_error_set(err, CB_ERR_IO, "tier %s: %s: %s", t->name, t->path, strerror(errno));
            cb_status st = marker_write(t->path, s->id, err);
            if (st != CB_OK)
                return st;
        }
    }
    return CB_OK;
}

static cb_status open_index(cb_store *s, cb_error *err)
{
    char *p = xasprintf("%s/index.db", s->dir);
    sqlite3_stmt *st;
    int rc;

    if (!p)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    if (access(p, F_OK) != 0) {
        cb_status r = cb_error_set(err, CB_ERR_FORMAT, "%s: the index is missing (cb-store verify --repair)", p);
        free(p);
        return r;
    }
    rc = sqlite3_open_v2(p, &s->db, SQLITE_OPEN_READWRITE, NULL);
    free(p);
    if (rc != SQLITE_OK)
        return st_dberr(s, rc, "open", err);
    sqlite3_busy_timeout(s->db, ST_BUSY_MS);
    sqlite3_exec(s->db, "PRAGMA synchronous=NORMAL", NULL, NULL, NULL);
    /* The schema check is the first read: a file that is not an index, or a
     * corrupt one, fails here. */
    rc = sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE name = 'schema'", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return st_dberr(s, rc, "open", err);
    rc = sqlite3_step(st);
    int ok = rc == SQLITE_ROW && sqlite3_column_int(st, 0) == ST_SCHEMA;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return st_dberr(s, rc, "open", err);
    if (!ok)
        return cb_error_set(err, CB_ERR_FORMAT, "%s/index.db: not a store index of schema %d", s->dir, ST_SCHEMA);
    return CB_OK;
}

cb_status cb_store_open(cb_store **out, const char *dir, int create, cb_error *err)
{
    cb_store *s;
    cb_status st;

    if (!out || !dir || !*dir)
        return cb_error_set(err, CB_ERR_INVALID, "store: no directory");
    if (create) {
        char *conf = xasprintf("%s/%s", dir, conf_name);
        int missing = conf && access(conf, F_OK) != 0;
        free(conf);
        if (missing) {
            int exists = 0, fd;
            if (mkdir_p(dir, 0755) != 0)
                return cb_error_set(err, CB_ERR_CREATE, "%s: %s", dir, strerror(errno));
            if ((fd = open_lock_file(dir)) < 0)
                return cb_error_set(err, CB_ERR_CREATE, "%s/lock: %s", dir, strerror(errno));
            while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
                ;
            st = init_locked(dir, NULL, 0, -1, &exists, err);
            close(fd);
            if (st != CB_OK && !exists)
                return st;
        }
    }
    if (!(s = calloc(1, sizeof *s)))
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    s->lock_fd = -1;
    s->owner_fd = -1;
    if (!(s->dir = strdup(dir))) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = read_config(s, err)) != CB_OK || (st = check_tiers(s, err)) != CB_OK)
        goto fail;
    if ((s->lock_fd = open_lock_file(dir)) < 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s/lock: %s", dir, strerror(errno));
        goto fail;
    }
    if ((st = open_index(s, err)) != CB_OK)
        goto fail;
    *out = s;
    return CB_OK;
fail:
    cb_store_close(s);
    return st;
}

void cb_store_close(cb_store *s)
{
    if (!s)
        return;
    for (int i = 0; i < ST_NSTMT; i++)
        if (s->stmts[i].st)
            sqlite3_finalize(s->stmts[i].st);
    if (s->db)
        sqlite3_close_v2(s->db);
    if (s->owner_fd >= 0) {
        char *p = xasprintf("%s/owners/%s", s->dir, s->owner);
        if (p)
            unlink(p);
        free(p);
        close(s->owner_fd);
    }
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    for (int i = 0; i < s->n_tiers; i++) {
        free(s->tiers[i].path);
        free(s->tiers[i].conf_path);
    }
    free(s->id);
    free(s->dir);
    free(s);
}

cb_status cb_store_reset_index(const char *dir, cb_error *err)
{
    char *conf = xasprintf("%s/%s", dir, conf_name);
    char *db = xasprintf("%s/index.db", dir);
    char *aside = xasprintf("%s/index.db.broken-%lld", dir, (long long)time(NULL));
    cb_status st = CB_OK;
    int fd = -1;

    if (!conf || !db || !aside) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (access(conf, F_OK) != 0) {
        st = cb_error_set(err, CB_ERR_NOT_FOUND, "%s: no store there", dir);
        goto done;
    }
    if ((fd = open_lock_file(dir)) < 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s/lock: %s", dir, strerror(errno));
        goto done;
    }
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
        ;
    if (rename(db, aside) != 0 && errno != ENOENT) {
        st = cb_error_set(err, CB_ERR_IO, "%s: %s", db, strerror(errno));
        goto done;
    }
    st = index_create(dir, err);
done:
    if (fd >= 0)
        close(fd);
    free(conf);
    free(db);
    free(aside);
    return st;
}

/* --------------------------------------------------------------- tiers */

const char *cb_store_dir(const cb_store *s) { return s->dir; }
int cb_store_n_tiers(const cb_store *s) { return s->n_tiers; }
int cb_store_promote_hits(const cb_store *s) { return s->promote_hits; }

cb_status cb_store_tier_info(const cb_store *s, int i, cb_store_tier *out)
{
    if (i < 0 || i >= s->n_tiers)
        return CB_ERR_RANGE;
    out->name = s->tiers[i].name;
    out->path = s->tiers[i].path;
    out->capacity = s->tiers[i].cap;
    out->cost = s->tiers[i].cost;
    return CB_OK;
}

int st_tier_index(const cb_store *s, const char *name)
{
    for (int i = 0; i < s->n_tiers; i++)
        if (name && strcmp(s->tiers[i].name, name) == 0)
            return i;
    return -1;
}

char *st_entry_path(const cb_store *s, int tier, const char *key, const char *tmp_owner)
{
    return tmp_owner ? xasprintf("%s/%s.kv.tmp.%s", s->tiers[tier].path, key, tmp_owner)
                     : xasprintf("%s/%s.kv", s->tiers[tier].path, key);
}

static const char SQL_USED[] = "SELECT COALESCE(SUM(bytes), 0) FROM entries WHERE tier = ?1";

cb_status st_tier_used(cb_store *s, int t, uint64_t *used, cb_error *err)
{
    sqlite3_stmt *q = st_stmt(s, SQL_USED, err);
    if (!q)
        return err ? err->status : CB_ERR_IO;
    sqlite3_bind_text(q, 1, s->tiers[t].name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(q);
    if (rc != SQLITE_ROW)
        return st_dberr(s, rc, "tier usage", err);
    *used = (uint64_t)sqlite3_column_int64(q, 0);
    sqlite3_reset(q);
    return CB_OK;
}

/* ----------------------------------------------------------------- put */

#define KV_MAGIC "CBKV\r\n\x1a\n"

/* The fields of a KV file header (format versions 1 and 2, which agree on
 * them, lib/kv/kvfile.c) the reservation needs before the file is written
 * and verified in full. */
static cb_status peek_header(const uint8_t *p, size_t size, char key[66], char model[33], int64_t *n_tokens,
                             cb_error *err)
{
    uint32_t ver, nt;
    uint64_t m[2], t[2], total;
    if (size < 128 || memcmp(p, KV_MAGIC, 8) != 0)
        return cb_error_set(err, CB_ERR_FORMAT, "not a valid KV file: %s", size < 128 ? "too short" : "bad magic");
    memcpy(&ver, p + 8, 4);
    if (ver != 1 && ver != 2)
        return cb_error_set(err, CB_ERR_UNSUPPORTED, "KV format version %u is not supported", ver);
    memcpy(&total, p + 112, 8);
    if (total != size)
        return cb_error_set(err, CB_ERR_FORMAT, "not a valid KV file: %zu bytes, its header says %llu", size,
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
static cb_status check_kvfile(const char *path, char key[66], char model[33], int64_t *n_tokens, uint64_t *size,
                              cb_error *err)
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

int st_write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int copy_fd(int in, int out, uint64_t n)
{
    static const size_t chunk = 1 << 20;
    char *buf = NULL;
    loff_t off_in = 0, off_out = 0;
    while (n > 0) {
        ssize_t r = copy_file_range(in, &off_in, out, &off_out, n > (1u << 30) ? (1u << 30) : n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n -= (uint64_t)r;
    }
    if (n == 0)
        return 0;
    /* Filesystems without copy_file_range: plain reads and writes. */
    if (!(buf = malloc(chunk)))
        return -1;
    while (n > 0) {
        ssize_t r = pread(in, buf, n < chunk ? n : chunk, off_in);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || pwrite(out, buf, (size_t)r, off_out) != r) {
            free(buf);
            return -1;
        }
        off_in += r;
        off_out += r;
        n -= (uint64_t)r;
    }
    free(buf);
    return 0;
}

static const char SQL_GET_STATE[] = "SELECT state, tier, owner FROM entries WHERE key = ?1";
static const char SQL_DEL_KEY[] = "DELETE FROM entries WHERE key = ?1";
static const char SQL_RESERVE[] =
    "INSERT INTO entries(key, model, tier, bytes, n_tokens, created, last_access, hits, checksum, pinned, state, owner)"
    " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6, 0, ?7, 0, 0, ?8)";
static const char SQL_READY[] =
    "UPDATE entries SET state = 1, owner = NULL, created = ?3, last_access = ?3 WHERE key = ?1 AND owner = ?2 AND state = 0";
static const char SQL_UNRESERVE[] = "DELETE FROM entries WHERE key = ?1 AND owner = ?2 AND state = 0";
static const char SQL_REVIVE[] = "UPDATE entries SET state = 1 WHERE key = ?1 AND state = 2";
static const char SQL_REMOVED[] = "UPDATE entries SET state = 2, pinned = 0 WHERE key = ?1 AND state = 1";

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
            if ((st = st_begin(s, err)) != CB_OK) {
                free(p);
                return st;
            }
            if (!(q = st_stmt(s, SQL_REVIVE, err))) {
                st_rollback(s);
                free(p);
                return err ? err->status : CB_ERR_IO;
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
    if ((st = st_begin(s, err)) != CB_OK)
        return st;
    if (!(q = st_stmt(s, SQL_DEL_KEY, err))) {
        st_rollback(s);
        return err ? err->status : CB_ERR_IO;
    }
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    if ((st = st_write(s, q, "drop a stale entry", NULL, err)) != CB_OK)
        return st;
    return st_commit(s, err);
}

/* Where the bytes of a put come from. */
typedef struct put_src {
    const void *data;  /* bytes, or */
    const char *path;  /* a verified file */
    int movable;       /* path may be renamed into the tier */
    const char *key;   /* the caller's key (NULL: the file's) */
    int first_tier;    /* the fastest tier it may go to */
} put_src;

static cb_status put_common(cb_store *s, const put_src *src, const char *key, const char *model, int64_t n_tokens,
                            uint64_t size, cb_hash128 sum, int *existed, cb_error *err)
{
    char sumhex[33];
    char *tmp = NULL, *fin = NULL;
    int tier = -1, fd = -1, reserved = 0, exists = 0;
    cb_status st;

    if (existed)
        *existed = 0;
    if ((st = st_owner(s, err)) != CB_OK)
        return st;
    cb_hash128_hex(sum, sumhex);

    /* 1. Reserve room in the fastest tier that has it after eviction. */
    if ((st = st_lock(s, err)) != CB_OK)
        return st;
    if ((st = existing(s, key, &exists, err)) != CB_OK || exists) {
        st_unlock(s);
        if (exists && existed)
            *existed = 1;
        return st;
    }
    for (int t = src->first_tier; t < s->n_tiers && tier < 0; t++) {
        if (s->tiers[t].cap && size > s->tiers[t].cap)
            continue;
        st = st_make_room(s, t, size, NULL, NULL, err);
        if (st == CB_OK)
            tier = t;
        else if (st != CB_ERR_CREATE) {
            st_unlock(s);
            return st;
        }
    }
    if (tier < 0) {
        st_unlock(s);
        return cb_error_set(err, CB_ERR_CREATE,
                            "%s: no tier has room for %llu bytes (the entries that would have to go are pinned or in use)",
                            key, (unsigned long long)size);
    }
    {
        sqlite3_stmt *q;
        int64_t now = st_now_us();
        if ((st = st_begin(s, err)) != CB_OK) {
            st_unlock(s);
            return st;
        }
        if (!(q = st_stmt(s, SQL_RESERVE, err))) {
            st_rollback(s);
            st_unlock(s);
            return err ? err->status : CB_ERR_IO;
        }
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, model, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 3, s->tiers[tier].name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 4, (sqlite3_int64)size);
        sqlite3_bind_int64(q, 5, n_tokens);
        sqlite3_bind_int64(q, 6, now);
        sqlite3_bind_text(q, 7, sumhex, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 8, s->owner, -1, SQLITE_STATIC);
        int rc = sqlite3_step(q);
        sqlite3_reset(q);
        if (rc != SQLITE_DONE) {
            st_rollback(s);
            st_unlock(s);
            return st_dberr(s, rc, "reserve", err);
        }
        if ((st = st_commit(s, err)) != CB_OK) {
            st_rollback(s);
            st_unlock(s);
            return st;
        }
        reserved = 1;
    }
    st_unlock(s);

    /* 2. Write the temporary file, fsync, verify, rename, fsync the directory. */
    tmp = st_entry_path(s, tier, key, s->owner);
    fin = st_entry_path(s, tier, key, NULL);
    if (!tmp || !fin) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (src->path && src->movable && rename(src->path, tmp) == 0) {
        fd = open(tmp, O_RDONLY | O_CLOEXEC);
    } else {
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", tmp, strerror(errno));
            goto fail;
        }
        int in = -1, bad;
        if (src->data)
            bad = st_write_all(fd, src->data, (size_t)size);
        else
            bad = (in = open(src->path, O_RDONLY | O_CLOEXEC)) < 0 || copy_fd(in, fd, size) != 0;
        if (in >= 0)
            close(in);
        if (bad) {
            st = cb_error_set(err, CB_ERR_IO, "%s: write: %s", tmp, strerror(errno));
            goto fail;
        }
    }
    if (fd < 0 || fsync(fd) != 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    if (src->data) {
        /* The bytes were not verified yet: the written file is, in full. */
        char k2[66], m2[33];
        int64_t nt;
        uint64_t sz;
        if ((st = check_kvfile(tmp, k2, m2, &nt, &sz, err)) != CB_OK)
            goto fail;
        if (strcmp(k2, key) != 0) {
            st = cb_error_set(err, CB_ERR_INVALID, "%s: the file's key is %s", key, k2);
            goto fail;
        }
    } else {
        /* A copy of a verified file: the copy must hash as its source did. */
        cb_hash128 h;
        uint64_t sz;
        if ((st = hash_file(tmp, &h, &sz, err)) != CB_OK)
            goto fail;
        if (!cb_hash128_eq(h, sum) || sz != size) {
            st = cb_error_set(err, CB_ERR_IO, "%s: the copy differs from %s", tmp, src->path);
            goto fail;
        }
    }
    if (rename(tmp, fin) != 0) {
        st = cb_error_set(err, CB_ERR_CREATE, "%s: rename: %s", fin, strerror(errno));
        goto fail;
    }
    st_fsync_dir(s->tiers[tier].path);

    /* 3. Visible. */
    {
        sqlite3_stmt *q;
        if ((st = st_begin(s, err)) != CB_OK)
            goto fail_fin;
        if (!(q = st_stmt(s, SQL_READY, err))) {
            st = err ? err->status : CB_ERR_IO;
            st_rollback(s);
            goto fail_fin;
        }
        sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, s->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(q, 3, st_now_us());
        int n;
        if ((st = st_write(s, q, "index", &n, err)) != CB_OK)
            goto fail_fin;
        if ((st = st_commit(s, err)) != CB_OK) {
            st_rollback(s);
            goto fail_fin;
        }
        if (n != 1) {
            st = cb_error_set(err, CB_ERR_INTERNAL, "%s: the reservation vanished", key);
            goto fail_fin;
        }
    }
    free(tmp);
    free(fin);
    return CB_OK;

fail_fin:
    st_unlink_locked(fin);
fail:
    if (fd >= 0)
        close(fd);
    if (tmp)
        unlink(tmp); /* a staged source renamed into the tier goes with it */
    if (reserved) {
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
    free(tmp);
    free(fin);
    return st;
}

static cb_status put_bytes(cb_store *s, const char *key, const void *data, size_t size, int first_tier,
                           cb_error *err);

cb_status cb_store_put(cb_store *s, const char *key, const void *data, size_t size, cb_error *err)
{
    return put_bytes(s, key, data, size, 0, err);
}

cb_status cb_store_put_in(cb_store *s, const char *key, const void *data, size_t size, const char *tier,
                          cb_error *err)
{
    int t = s ? st_tier_index(s, tier) : -1;
    if (t < 0)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "no tier named '%s' in the store", tier ? tier : "(null)");
    return put_bytes(s, key, data, size, t, err);
}

static cb_status put_bytes(cb_store *s, const char *key, const void *data, size_t size, int first_tier,
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
    return put_common(s, &src, fkey, model, n_tokens, size, cb_hash128_bytes(data, size), NULL, err);
}

/* Adopt a file; movable: it may be renamed into the tier (staged imports). */
cb_status st_put_file(cb_store *s, const char *path, int movable, const char *expect, char key_out[66], int *existed,
                      cb_error *err)
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
    return put_common(s, &src, key, model, n_tokens, size, sum, existed, err);
}

cb_status cb_store_put_file(cb_store *s, const char *path, char key[66], int *existed, cb_error *err)
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
        free(p);
    }
    return CB_OK;
}

/* ------------------------------------------------------------ acquire */

static const char SQL_ACCESS_GET[] = "SELECT tier, hits, pinned FROM entries WHERE key = ?1 AND state = 1";
static const char SQL_ACCESS_SET[] = "UPDATE entries SET hits = hits + 1, last_access = ?2 WHERE key = ?1";
static const char SQL_COUNT[] =
    "INSERT INTO counters(name, value) VALUES(?1, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1";
static const char SQL_DEL_MISSING[] = "DELETE FROM entries WHERE key = ?1 AND tier = ?2 AND state = 1";

/* Record an access: hits and last use of the entry, the tier's hit counter
 * or the miss counter.  *tier -1 when not stored; *hits after this access. */
static cb_status record_access(cb_store *s, const char *key, int *tier, int64_t *hits, int *pinned, cb_error *err)
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

cb_status st_acquire(cb_store *s, const char *key, int record, cb_store_ref **out, cb_error *err)
{
    cb_status st;
    int t;

    if (!st_key_valid(key))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", key ? key : "");
    if (record) {
        int64_t hits = 0;
        int pinned = 0;
        if ((st = record_access(s, key, &t, &hits, &pinned, err)) != CB_OK)
            return st;
        if (t < 0)
            return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", key);
        /* Promotion is opportunistic: a reader never waits for the lock. */
        if (t > 0 && !pinned && s->promote_hits > 0 && hits >= s->promote_hits && st_trylock(s)) {
            st_promote(s, key);
            st_unlock(s);
        }
    }
    for (int attempt = 0; attempt < 1000; attempt++) {
        struct stat a, b;
        if ((st = tier_of(s, key, &t, err)) != CB_OK)
            return st;
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
                if (tier_of(s, key, &t2, NULL) == CB_OK && t2 == t)
                    drop_missing(s, key, t, p);
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
        if (fstat(fd, &a) == 0 && stat(p, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev &&
            a.st_nlink > 0) {
            cb_store_ref *r = malloc(sizeof *r);
            if (!r) {
                close(fd);
                free(p);
                return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            }
            r->fd = fd;
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

cb_status cb_store_acquire(cb_store *s, const char *key, cb_store_ref **ref, const char **path, cb_error *err)
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

void cb_store_release(cb_store_ref *ref)
{
    if (!ref)
        return;
    close(ref->fd);
    free(ref->path);
    free(ref);
}

/* -------------------------------------------------------- remove, pin */

/* Run one statement on key in its own transaction. */
static cb_status key_change(cb_store *s, const char *sql, const char *key, cb_error *err)
{
    sqlite3_stmt *q;
    cb_status st;
    if ((st = st_begin(s, err)) != CB_OK)
        return st;
    if (!(q = st_stmt(s, sql, err))) {
        st_rollback(s);
        return err ? err->status : CB_ERR_IO;
    }
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
    if ((st = st_lock(s, err)) != CB_OK)
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
    if ((st = st_begin(s, err)) != CB_OK)
        return st;
    if (!(q = st_stmt(s, SQL_PIN, err))) {
        st_rollback(s);
        return err ? err->status : CB_ERR_IO;
    }
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
    if (model && (strlen(model) != 32 || !is_hex(model, 32)))
        return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a model fingerprint (32 hex digits)", model);
    if (tier && (only = st_tier_index(s, tier)) < 0)
        return cb_error_set(err, CB_ERR_INVALID, "no tier '%s' in %s", tier, s->dir);
    for (int t = 0; t < s->n_tiers; t++) {
        if (only >= 0 && t != only)
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
        if (stop)
            break;
    }
    return CB_OK;
}

static const char SQL_STAT[] =
    "SELECT COALESCE(SUM(state = 1), 0), COALESCE(SUM(CASE WHEN state = 1 THEN bytes END), 0),"
    " COALESCE(SUM(CASE WHEN state != 1 THEN bytes END), 0), COALESCE(SUM(state = 1 AND pinned), 0)"
    " FROM entries WHERE tier = ?1";
static const char SQL_COUNTER[] = "SELECT value FROM counters WHERE name = ?1";

static uint64_t counter(cb_store *s, const char *name)
{
    sqlite3_stmt *q = st_stmt(s, SQL_COUNTER, NULL);
    uint64_t v = 0;
    if (!q)
        return 0;
    sqlite3_bind_text(q, 1, name, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(q) == SQLITE_ROW)
        v = (uint64_t)sqlite3_column_int64(q, 0);
    sqlite3_reset(q);
    return v;
}

cb_status cb_store_stat(cb_store *s, cb_store_tier_stat *stats, uint64_t *misses, cb_error *err)
{
    cb_status st;
    /* One read transaction, so the figures agree with each other. */
    if ((st = st_exec(s, "BEGIN", err)) != CB_OK)
        return st;
    for (int t = 0; t < s->n_tiers; t++) {
        cb_store_tier_stat *o = &stats[t];
        sqlite3_stmt *q = st_stmt(s, SQL_STAT, err);
        char cname[48];
        memset(o, 0, sizeof *o);
        o->name = s->tiers[t].name;
        o->path = s->tiers[t].path;
        o->capacity = s->tiers[t].cap;
        if (!q) {
            st_exec(s, "ROLLBACK", NULL);
            return err ? err->status : CB_ERR_IO;
        }
        sqlite3_bind_text(q, 1, s->tiers[t].name, -1, SQLITE_STATIC);
        int rc = sqlite3_step(q);
        if (rc != SQLITE_ROW) {
            st_exec(s, "ROLLBACK", NULL);
            return st_dberr(s, rc, "stat", err);
        }
        o->entries = (uint64_t)sqlite3_column_int64(q, 0);
        o->bytes = (uint64_t)sqlite3_column_int64(q, 1);
        o->reserved = (uint64_t)sqlite3_column_int64(q, 2);
        o->pinned = (uint64_t)sqlite3_column_int64(q, 3);
        sqlite3_reset(q);
        snprintf(cname, sizeof cname, "hits:%s", s->tiers[t].name);
        o->hits = counter(s, cname);
    }
    if (misses)
        *misses = counter(s, "misses");
    return st_exec(s, "COMMIT", err);
}
