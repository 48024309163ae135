/* store.c - the tiered store: configuration (store.json), tiers, the
 * store lock, owners, opening and closing, and per-tier figures.  The
 * index is index.c, entries entry.c, moves between tiers tiers.c, gc and
 * verify maint.c.  Layout and invariants in store_impl.h and cb-store(5). */
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

/* --------------------------------------------------------------- locks */

cb_status st_lock(cb_store *s, cb_error *err)
{
    if (s->lock_held++ > 0)
        return CB_OK;
    if (s->readonly) {
        /* best effort: a lock file on NFS opened for reading may refuse */
        while (s->lock_fd >= 0 && flock(s->lock_fd, LOCK_SH) != 0 && errno == EINTR)
            ;
        return CB_OK;
    }
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
    if (s->readonly)
        return 0; /* only ever asked for to change something */
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
    if (s->lock_held > 0 && --s->lock_held == 0 && s->lock_fd >= 0)
        flock(s->lock_fd, LOCK_UN);
}

cb_status st_writable(const cb_store *s, const char *what, cb_error *err)
{
    if (!s->readonly)
        return CB_OK;
    return cb_error_set(err, CB_ERR_CREATE,
                        "%s: %s: the store is read-only (a read-only file system, or no write "
                        "permission)",
                        s->dir, what);
}

/* -------------------------------------------------------------- owners */

cb_status st_owner(cb_store *s, cb_error *err)
{
    if (s->owner_fd >= 0)
        return CB_OK;
    cb_status ro = st_writable(s, "write", err);
    if (ro != CB_OK)
        return ro;
    char id[ST_OWNER_LEN + 1];
    st_random_hex(id, ST_OWNER_LEN);
    char *dir = st_asprintf("%s/owners", s->dir),
         *tmp = st_asprintf("%s/owners/%s.new", s->dir, id),
         *fin = st_asprintf("%s/owners/%s", s->dir, id);
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
    if (strlen(id) != ST_OWNER_LEN || !st_is_hex(id, ST_OWNER_LEN))
        return 0;
    char *p = st_asprintf("%s/owners/%s", s->dir, id);
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
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

static char *abs_path(const char *dir, const char *p)
{
    return p[0] == '/' ? strdup(p) : st_asprintf("%s/%s", dir, p);
}

static char *marker_path(const char *tier) { return st_asprintf("%s/.cb-store", tier); }

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

/* The id of the shared tier at t->url (made in Redis when missing). */
static cb_status shared_id_of(const cb_store_tier *t, char id[33], cb_error *err)
{
    char host[1024];
    int port, db, is_unix;
    if (!tier_name_valid(t->name) ||
        st_remote_parse(t->url, host, sizeof host, &port, &db, &is_unix) != 0)
        return cb_error_set(err, CB_ERR_INVALID,
                            "tier %s: '%s' is not redis://HOST[:PORT][/DB] or unix:///PATH",
                            t->name ? t->name : "", t->url);
    cb_store tmp;
    memset(&tmp, 0, sizeof tmp);
    snprintf(tmp.remote.name, sizeof tmp.remote.name, "%s", t->name);
    tmp.remote.url = (char *)t->url;
    tmp.remote.auth_file = (char *)t->auth_file;
    tmp.remote.key_file = (char *)t->key_file;
    tmp.remote.timeout_ms = t->timeout_ms > 0 ? t->timeout_ms : ST_REMOTE_TIMEOUT_MS;
    /* the secrets first: a file that cannot be used is its own error */
    cb_status st = st_remote_secrets(&tmp.remote, err);
    int rc = st != CB_OK ? -1 : st_remote_up(&tmp) ? st_remote_id(&tmp, t->name, id) : -1;
    if (st == CB_OK && rc != 0)
        st = cb_error_set(err, CB_ERR_IO, "tier %s: %s: %s", t->name, t->url,
                          tmp.remote.why[0] ? tmp.remote.why : "cannot be reached");
    tmp.remote.url = tmp.remote.auth_file = tmp.remote.key_file = NULL;
    st_remote_close(&tmp.remote);
    return st;
}

static cb_status init_locked(const char *dir, const cb_store_tier *tiers, int n_tiers,
                             int promote_hits, int *exists, cb_error *err)
{
    static const cb_store_tier def = {"main", "tiers/main", 0, 0, NULL, 0, NULL, NULL};
    char *conf = st_asprintf("%s/%s", dir, conf_name);
    char *abs[CB_STORE_MAX_TIERS] = {0};
    char *real[CB_STORE_MAX_TIERS] = {0};
    int made[CB_STORE_MAX_TIERS] = {0}, n_marked = 0; /* tier directories made, markers written */
    int made_rest = 0;                                /* owners/, tmp/ and the index were made */
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
    /* The shared tier: the last, at most one, not the only one; its id
     * comes from Redis. */
    const cb_store_tier *shared = NULL;
    char shared_id[33] = "";
    if (tiers[n_tiers - 1].url) {
        shared = &tiers[--n_tiers];
        if (n_tiers == 0) {
            st = cb_error_set(err, CB_ERR_INVALID,
                              "tier %s: a shared tier needs a local tier in front", shared->name);
            goto done;
        }
        if ((st = shared_id_of(shared, shared_id, err)) != CB_OK)
            goto done;
    }
    for (int i = 0; i < n_tiers; i++)
        if (tiers[i].url) {
            st = cb_error_set(err, CB_ERR_INVALID,
                              "tier %s: the shared tier must be the last, and only one",
                              tiers[i].name);
            goto done;
        }
    st_random_hex(id, 32);
    for (int i = 0; i < n_tiers; i++) {
        if (!(abs[i] = abs_path(dir, tiers[i].path))) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (!dir_is_empty(abs[i])) {
            st =
                cb_error_set(err, CB_ERR_CREATE, "tier %s: %s is not empty", tiers[i].name, abs[i]);
            goto done;
        }
        made[i] = access(abs[i], F_OK) != 0;
        if (st_mkdir_p(abs[i], 0755) != 0 || !(real[i] = realpath(abs[i], NULL))) {
            st = cb_error_set(err, CB_ERR_CREATE, "tier %s: %s: %s", tiers[i].name, abs[i],
                              strerror(errno));
            goto done;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(real[i], real[j]) == 0) {
                st = cb_error_set(err, CB_ERR_INVALID, "tiers %s and %s share the directory %s",
                                  tiers[j].name, tiers[i].name, real[i]);
                goto done;
            }
    }
    for (; n_marked < n_tiers; n_marked++)
        if ((st = marker_write(abs[n_marked], id, err)) != CB_OK)
            goto done;
    made_rest = 1;
    {
        char *o = st_asprintf("%s/owners", dir), *t = st_asprintf("%s/tmp", dir);
        int bad = !o || !t || st_mkdir_p(o, 0755) != 0 || st_mkdir_p(t, 0755) != 0;
        free(o);
        free(t);
        if (bad) {
            st = cb_error_set(err, CB_ERR_CREATE, "%s: cannot create owners/ or tmp/: %s", dir,
                              strerror(errno));
            goto done;
        }
    }
    if ((st = st_index_create(dir, err)) != CB_OK)
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
    json_object_set_new(root, "promote_hits",
                        json_integer(promote_hits < 0 ? ST_DEFAULT_PROMOTE : promote_hits));
    for (int i = 0; i < n_tiers; i++)
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:I, s:f}", "name", tiers[i].name, "path", tiers[i].path,
                           "capacity", (json_int_t)tiers[i].capacity, "cost",
                           tiers[i].cost > 0 ? tiers[i].cost : (double)(n_tiers - i)));
    json_object_set(root, "tiers", arr);
    if (shared) {
        json_t *sh =
            json_pack("{s:s, s:s, s:s, s:I, s:i}", "name", shared->name, "url", shared->url, "id",
                      shared_id, "capacity", (json_int_t)shared->capacity, "timeout_ms",
                      shared->timeout_ms > 0 ? shared->timeout_ms : ST_REMOTE_TIMEOUT_MS);
        /* the secrets' files, never what they hold */
        if (sh && shared->auth_file)
            json_object_set_new(sh, "auth_file", json_string(shared->auth_file));
        if (sh && shared->key_file)
            json_object_set_new(sh, "key_file", json_string(shared->key_file));
        json_object_set_new(root, "shared", sh);
    }
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
    /* A failed init leaves no half store: without the configuration the
     * markers would make the next init find its tiers taken. */
    for (int i = 0; st != CB_OK && !*exists && i < n_tiers; i++) {
        char *mp = i < n_marked ? marker_path(abs[i]) : NULL;
        if (mp)
            unlink(mp);
        free(mp);
        if (made[i])
            rmdir(abs[i]);
    }
    if (st != CB_OK && !*exists && made_rest) {
        static const char *const rest[] = {"index.db", "index.db-wal", "index.db-shm"};
        for (int i = 0; i < 3; i++) {
            char *p = st_asprintf("%s/%s", dir, rest[i]);
            if (p)
                unlink(p);
            free(p);
        }
        static const char *const dirs[] = {"owners", "tmp"};
        for (int i = 0; i < 2; i++) {
            char *p = st_asprintf("%s/%s", dir, dirs[i]);
            if (p)
                rmdir(p);
            free(p);
        }
    }
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
    char *p = st_asprintf("%s/lock", dir);
    int fd = p ? open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    free(p);
    return fd;
}

cb_status cb_store_init(const char *dir, const cb_store_tier *tiers, int n_tiers, int promote_hits,
                        cb_error *err)
{
    int exists, fd;
    cb_status st;

    if (!dir || !*dir || n_tiers < 0 || n_tiers > CB_STORE_MAX_TIERS || (n_tiers > 0 && !tiers))
        return cb_error_set(err, CB_ERR_INVALID, "store: between 1 and %d tiers",
                            CB_STORE_MAX_TIERS);
    for (int i = 0; i < n_tiers; i++) {
        if (!tier_name_valid(tiers[i].name))
            return cb_error_set(err, CB_ERR_INVALID,
                                "tier name '%s': use 1 to 32 letters, digits, '_', '-' or '.'",
                                tiers[i].name ? tiers[i].name : "");
        if (!tiers[i].url && (!tiers[i].path || !*tiers[i].path))
            return cb_error_set(err, CB_ERR_INVALID, "tier %s: no directory", tiers[i].name);
        for (int j = 0; j < i; j++)
            if (strcmp(tiers[i].name, tiers[j].name) == 0)
                return cb_error_set(err, CB_ERR_INVALID, "tier name '%s' given twice",
                                    tiers[i].name);
    }
    int made_dir = access(dir, F_OK) != 0;
    if (st_mkdir_p(dir, 0755) != 0)
        return cb_error_set(err, CB_ERR_CREATE, "%s: %s", dir, strerror(errno));
    char *lock = st_asprintf("%s/lock", dir);
    if (!lock)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    /* A failed init removes the lock file it made (under the lock), so a
     * waiting init may hold a lock on a file no longer there: it locks the
     * file at that name again. */
    for (;;) {
        struct stat a, b;
        if ((fd = open_lock_file(dir)) < 0) {
            st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", lock, strerror(errno));
            free(lock);
            return st;
        }
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR)
            ;
        if (fstat(fd, &a) == 0 && stat(lock, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            break;
        close(fd);
    }
    st = init_locked(dir, tiers, n_tiers, promote_hits, &exists, err);
    /* Nothing of a store that was not made stays behind: its lock file,
     * and its directory where init made it and nothing else is there. */
    if (st != CB_OK && !exists) {
        unlink(lock);
        if (made_dir)
            rmdir(dir);
    }
    close(fd);
    free(lock);
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
    char *conf = st_asprintf("%s/%s", s->dir, conf_name);
    json_error_t je;
    json_t *root, *tiers;
    cb_status st = CB_OK;

    if (!conf)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    root = json_load_file(conf, 0, &je);
    if (!root) {
        st = access(conf, F_OK) != 0
                 ? cb_error_set(err, CB_ERR_NOT_FOUND,
                                "%s: no store there (create one with cb-store init)", s->dir)
                 : cb_error_set(err, CB_ERR_FORMAT, "%s: line %d: %s", conf, je.line, je.text);
        free(conf);
        return st;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    const char *id = json_string_value(json_object_get(root, "id"));
    json_t *ph = json_object_get(root, "promote_hits");
    tiers = json_object_get(root, "tiers");
    if (!fmt || strcmp(fmt, "cacheblend-store") != 0 ||
        json_integer_value(json_object_get(root, "version")) != 1) {
        st = cb_error_set(err, CB_ERR_FORMAT,
                          "%s: not a cacheblend store configuration (version 1)", conf);
        goto done;
    }
    if (!id || strlen(id) != 32 || !st_is_hex(id, 32) || (ph && !json_is_integer(ph)) ||
        !json_is_array(tiers) || json_array_size(tiers) < 1 ||
        json_array_size(tiers) > CB_STORE_MAX_TIERS) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: needs an id, promote_hits and 1 to %d tiers",
                          conf, CB_STORE_MAX_TIERS);
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
        if (!tier_name_valid(name) || !path || !*path ||
            (cap && (!json_is_integer(cap) || json_integer_value(cap) < 0))) {
            st = cb_error_set(err, CB_ERR_FORMAT,
                              "%s: tier %zu: needs a valid name, a path and a capacity >= 0", conf,
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
    json_t *sh = json_object_get(root, "shared");
    if (sh) {
        const char *name = json_string_value(json_object_get(sh, "name"));
        const char *url = json_string_value(json_object_get(sh, "url"));
        const char *sid = json_string_value(json_object_get(sh, "id"));
        json_t *cap = json_object_get(sh, "capacity"), *to = json_object_get(sh, "timeout_ms");
        json_t *af = json_object_get(sh, "auth_file"), *kf = json_object_get(sh, "key_file");
        char host[1024];
        int port, db, is_unix;
        if (!tier_name_valid(name) || !url ||
            st_remote_parse(url, host, sizeof host, &port, &db, &is_unix) != 0 || !sid ||
            strlen(sid) != 32 || !st_is_hex(sid, 32) ||
            (cap && (!json_is_integer(cap) || json_integer_value(cap) < 0)) ||
            (to && (!json_is_integer(to) || json_integer_value(to) < 1 ||
                    json_integer_value(to) > 600000)) ||
            (af && (!json_is_string(af) || !*json_string_value(af))) ||
            (kf && (!json_is_string(kf) || !*json_string_value(kf)))) {
            st = cb_error_set(
                err, CB_ERR_FORMAT,
                "%s: shared: needs a name, a url, an id, a capacity >= 0 and a timeout_ms "
                "from 1 to 600000 (auth_file and key_file: file names)",
                conf);
            goto done;
        }
        /* relative to the store, as tier paths are */
        if ((af && !(s->remote.auth_file = abs_path(s->dir, json_string_value(af)))) ||
            (kf && !(s->remote.key_file = abs_path(s->dir, json_string_value(kf))))) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        snprintf(s->remote.name, sizeof s->remote.name, "%s", name);
        memcpy(s->remote.id, sid, 33);
        s->remote.cap = cap ? (uint64_t)json_integer_value(cap) : 0;
        s->remote.timeout_ms = to ? (int)json_integer_value(to) : ST_REMOTE_TIMEOUT_MS;
        const char *env = getenv("CB_STORE_TIMEOUT_MS");
        if (env && atoi(env) > 0 && atoi(env) <= 600000)
            s->remote.timeout_ms = atoi(env);
        if (!(s->remote.url = strdup(url))) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
done:
    json_decref(root);
    free(conf);
    return st;
}

/* Each tier directory exists, carries this store's id, and is no other
 * tier's (an edited store.json could name one twice: gc and verify would
 * then take one tier's entries for the other's orphans). */
static cb_status check_tiers(cb_store *s, cb_error *err)
{
    struct stat seen[CB_STORE_MAX_TIERS];
    for (int i = 0; i < s->n_tiers; i++) {
        st_tier *t = &s->tiers[i];
        int m = marker_check(t->path, s->id);
        if (m < 0)
            return cb_error_set(err, CB_ERR_FORMAT, "tier %s: %s belongs to another store", t->name,
                                t->path);
        if (m == 0 && !s->readonly) {
            /* A RAM disk after a reboot: the directory is made again, empty;
             * the index's entries there are dropped by the next gc. */
            if (st_mkdir_p(t->path, 0755) != 0)
                return cb_error_set(err, CB_ERR_IO, "tier %s: %s: %s", t->name, t->path,
                                    strerror(errno));
            cb_status st = marker_write(t->path, s->id, err);
            if (st != CB_OK)
                return st;
        }
        if (stat(t->path, &seen[i]) != 0) {
            if (s->readonly && errno == ENOENT) {
                /* read-only, the directory gone: the tier is empty, its
                 * entries are not found */
                memset(&seen[i], 0, sizeof seen[i]);
                continue;
            }
            return cb_error_set(err, CB_ERR_IO, "tier %s: %s: %s", t->name, t->path,
                                strerror(errno));
        }
        for (int j = 0; j < i; j++)
            if (seen[j].st_ino && seen[j].st_dev == seen[i].st_dev &&
                seen[j].st_ino == seen[i].st_ino)
                return cb_error_set(err, CB_ERR_FORMAT,
                                    "%s/%s: tiers %s and %s share the directory %s", s->dir,
                                    conf_name, s->tiers[j].name, t->name, t->path);
    }
    return CB_OK;
}

/* 1 when nothing may be written into dir: a read-only file system, or no
 * permission to write the directory or its index. */
static int dir_readonly(const char *dir)
{
    struct statvfs vfs;
    if (statvfs(dir, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
        return 1;
    if (access(dir, W_OK) != 0 && (errno == EACCES || errno == EROFS || errno == EPERM))
        return 1;
    char *p = st_asprintf("%s/index.db", dir);
    int ro = p && access(p, W_OK) != 0 && (errno == EACCES || errno == EROFS || errno == EPERM);
    free(p);
    return ro;
}
static cb_status open_store(cb_store **out, const char *dir, int create, int readonly,
                            cb_error *err)
{
    cb_store *s;
    cb_status st;

    if (!out || !dir || !*dir)
        return cb_error_set(err, CB_ERR_INVALID, "store: no directory");
    if (!readonly && access(dir, F_OK) == 0)
        readonly = dir_readonly(dir);
    if (create && !readonly) {
        char *conf = st_asprintf("%s/%s", dir, conf_name);
        int missing = conf && access(conf, F_OK) != 0;
        free(conf);
        if (missing) {
            int exists = 0, fd;
            if (st_mkdir_p(dir, 0755) != 0)
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
    s->readonly = readonly;
    if (!(s->dir = strdup(dir))) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = read_config(s, err)) != CB_OK || (st = check_tiers(s, err)) != CB_OK)
        goto fail;
    if (readonly) {
        /* no lock file is made; an existing one is only read-locked */
        char *p = st_asprintf("%s/lock", dir);
        s->lock_fd = p ? open(p, O_RDONLY | O_CLOEXEC) : -1;
        free(p);
    } else if ((s->lock_fd = open_lock_file(dir)) < 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s/lock: %s", dir, strerror(errno));
        goto fail;
    }
    if ((st = st_index_open(s, err)) != CB_OK)
        goto fail;
    *out = s;
    return CB_OK;
fail:
    cb_store_close(s);
    return st;
}

cb_status cb_store_open(cb_store **out, const char *dir, int create, cb_error *err)
{
    return open_store(out, dir, create, 0, err);
}

cb_status cb_store_open_readonly(cb_store **out, const char *dir, cb_error *err)
{
    return open_store(out, dir, 0, 1, err);
}

int cb_store_readonly(const cb_store *s) { return s ? s->readonly : 0; }

void cb_store_set_warn(cb_store *s, void (*warn)(void *ctx, const char *msg), void *ctx)
{
    if (s) {
        s->warn = warn;
        s->warn_ctx = ctx;
    }
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
        char *p = st_asprintf("%s/owners/%s", s->dir, s->owner);
        if (p)
            unlink(p);
        free(p);
        close(s->owner_fd);
    }
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    st_remote_close(&s->remote);
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
    char *conf = st_asprintf("%s/%s", dir, conf_name);
    char *db = st_asprintf("%s/index.db", dir);
    char *aside = st_asprintf("%s/index.db.broken-%lld", dir, (long long)time(NULL));
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
    st = st_index_create(dir, err);
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

char *st_entry_path(const cb_store *s, int tier, const char *key, const char *tmp_owner)
{
    return tmp_owner ? st_asprintf("%s/%s.kv.tmp.%s", s->tiers[tier].path, key, tmp_owner)
                     : st_asprintf("%s/%s.kv", s->tiers[tier].path, key);
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
        o->healed = s->n_healed[t];
        o->full = s->n_full[t];
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
