/* test_store.c - the tiered store (lib/store): put, acquire, LRU demotion
 * and eviction, promotion, pins, readers' protection, gc, verify and
 * repair, export and import (with hostile archives); then many processes at
 * once (4 writers, 8 readers, gc in a loop) and 50 rounds of SIGKILL at
 * random moments, each followed by gc and a verify that must be clean.
 * First, without a model: the shared tier's secret files and the MACs of
 * its entries (a vector from an independent AES-GCM and HKDF, and what each
 * tag binds).
 *
 * KV files are real: the tiny fixture model prefills a few tokens once and
 * cb_kv_serialize writes them under many token-id lists (distinct keys).
 *
 *   test_store                              run the tests (TAP)
 *   test_store --make-kv MODEL DIR N [NTOK] write N KV files DIR/kv-I.kv
 *
 * Environment: CB_TEST_TMP (work directory), CB_STORE_STRESS_S (seconds of
 * the concurrency test, default 4), CB_STORE_ROUNDS (kill rounds, default 50). */
#include "cbcore.h"
#include "test.h"
#include "../../lib/store/store_impl.h" /* the shared tier's secrets and MACs */

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ fixtures */

typedef struct kvgen {
    cb_model *m;
    cb_kvcache *kv;
    int n_ctx, n_vocab;
} kvgen;

typedef struct entry {
    void *data;
    size_t size;
    char key[66];
} entry;

static int kvgen_open(kvgen *g, const char *path)
{
    cb_error err;
    cb_fwd *f = NULL;
    int32_t ids[256];
    memset(g, 0, sizeof *g);
    g->n_ctx = 256;
    if (cb_model_load(&g->m, path, &T_EXACT, &err) != CB_OK) {
        printf("# %s\n", err.msg);
        return -1;
    }
    g->n_vocab = cb_model_hparams(g->m)->n_vocab;
    for (int i = 0; i < g->n_ctx; i++)
        ids[i] = (i * 13 + 5) % g->n_vocab;
    if (cb_kvcache_new(&g->kv, g->m, g->n_ctx, CB_TYPE_F32) != CB_OK ||
        cb_fwd_new(&f, g->m, g->n_ctx) != CB_OK ||
        cb_model_eval(f, g->kv, ids, g->n_ctx, 0, NULL) != CB_OK) {
        cb_fwd_free(f);
        return -1;
    }
    cb_fwd_free(f);
    return 0;
}

static void kvgen_close(kvgen *g)
{
    cb_kvcache_free(g->kv);
    cb_model_free(g->m);
}

/* A valid KV file of n tokens, distinct for each variant v. */
static int kvgen_make(kvgen *g, int v, int n, cb_type type, entry *e)
{
    int32_t ids[256];
    for (int j = 0; j < n; j++)
        ids[j] = (j * 7 + v) % g->n_vocab;
    ids[0] = v % g->n_vocab;
    if (n > 1)
        ids[1] = (v / g->n_vocab) % g->n_vocab;
    if (n > 2)
        ids[2] = v % 7;
    if (cb_kv_serialize(g->m, g->kv, NULL, 0, ids, n, 0, type, &e->data, &e->size) != CB_OK)
        return -1;
    cb_kv_key(cb_model_fingerprint(g->m), cb_kv_tokens_hash(NULL, 0, ids, n), e->key);
    return 0;
}

/* ---------------------------------------------------------------- helpers */

static char work[1024];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void rmrf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int file_eq(const char *path, const entry *e)
{
    size_t n;
    char *b = t_read_file(path, &n);
    int eq = b && n == e->size && memcmp(b, e->data, n) == 0;
    free(b);
    return eq;
}

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

typedef struct find {
    const char *key;
    char tier[33];
    int pinned;
    uint64_t hits;
    int n;
} find;

static int find_cb(void *ctx, const cb_store_entry *e)
{
    find *f = ctx;
    f->n++;
    if (f->key && strcmp(e->key, f->key) == 0) {
        snprintf(f->tier, sizeof f->tier, "%s", e->tier);
        f->pinned = e->pinned;
        f->hits = e->hits;
    }
    return 0;
}

/* Tier name of key ("" when not stored). */
static const char *tier_of(cb_store *s, const char *key)
{
    static find f;
    memset(&f, 0, sizeof f);
    f.key = key;
    cb_store_list(s, NULL, NULL, find_cb, &f, NULL);
    return f.tier;
}

static int n_entries(cb_store *s, const char *tier)
{
    find f = {0};
    cb_store_list(s, NULL, tier, find_cb, &f, NULL);
    return f.n;
}

/* Files in dir whose name ends with suffix, and their bytes. */
static int count_files(const char *dir, const char *suffix, uint64_t *bytes)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (bytes)
        *bytes = 0;
    if (!d)
        return 0;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name), m = strlen(suffix);
        if (de->d_name[0] == '.' || l < m || strcmp(de->d_name + l - m, suffix) != 0)
            continue;
        n++;
        if (bytes) {
            char p[2048];
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            if (stat(p, &sb) == 0)
                *bytes += (uint64_t)sb.st_size;
        }
    }
    closedir(d);
    return n;
}

/* Problems are printed where none is expected (or with CB_TEST_VERBOSE). */
static int n_problems, show_problems;
static void count_problem(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    n_problems++;
    if (show_problems || getenv("CB_TEST_VERBOSE"))
        printf("#     verify: %s: %s\n", what, msg);
}

/* Run SQL on a store's index directly (to simulate damage). */
static int sql(const char *dir, const char *q)
{
    char p[1200];
    sqlite3 *db;
    snprintf(p, sizeof p, "%s/index.db", dir);
    if (sqlite3_open(p, &db) != SQLITE_OK)
        return -1;
    sqlite3_busy_timeout(db, 10000);
    int rc = sqlite3_exec(db, q, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

/* ------------------------------------------------------------ basics */

static void test_basics(kvgen *g)
{
    char dir[1100], tdir[1200], p[1600];
    cb_store *s = NULL;
    cb_error err;
    entry e = {0}, e2 = {0};
    int found = -1;

    snprintf(dir, sizeof dir, "%s/basic", work);
    snprintf(tdir, sizeof tdir, "%s/tiers/main", dir);
    kvgen_make(g, 1, 8, CB_TYPE_F16, &e);
    kvgen_make(g, 2, 8, CB_TYPE_F16, &e2);

    tcase("open without create on a missing store is CB_ERR_NOT_FOUND");
    CHECK(cb_store_open(&s, dir, 0, &err) == CB_ERR_NOT_FOUND);
    CHECK(s == NULL);

    tcase("open with create makes one unlimited tier 'main' in DIR/tiers/main");
    CHECK_OK(cb_store_open(&s, dir, 1, &err));
    if (!s) {
        printf("# %s\n", err.msg);
        return;
    }
    cb_store_tier ti;
    CHECK(cb_store_n_tiers(s) == 1);
    CHECK(cb_store_tier_info(s, 0, &ti) == CB_OK && strcmp(ti.name, "main") == 0 &&
          ti.capacity == 0);
    CHECK(strcmp(ti.path, tdir) == 0);
    CHECK(cb_store_promote_hits(s) == 2);

    tcase("put, lookup, acquire, read, release");
    CHECK_OK(cb_store_lookup(s, e.key, &found));
    CHECK(found == 0);
    CHECK_OK(cb_store_put(s, e.key, e.data, e.size, &err));
    CHECK_OK(cb_store_lookup(s, e.key, &found));
    CHECK(found == 1);
    {
        cb_store_ref *ref = NULL;
        const char *path = NULL;
        CHECK_OK(cb_store_acquire(s, e.key, &ref, &path, &err));
        CHECK(path && file_eq(path, &e));
        CHECK(cb_store_ref_size(ref) == e.size);
        cb_kvfile *f = NULL;
        CHECK(path && cb_kvfile_open(&f, path, &err) == CB_OK &&
              cb_kvfile_verify(f, &err) == CB_OK);
        cb_kvfile_free(f);
        cb_store_release(ref);
        cb_store_release(NULL);
    }

    tcase("put with NULL key takes the file's key; an existing key is left as it is");
    CHECK_OK(cb_store_put(s, NULL, e2.data, e2.size, &err));
    CHECK_OK(cb_store_lookup(s, e2.key, &found));
    CHECK(found == 1);
    CHECK_OK(cb_store_put(s, e.key, e.data, e.size, &err));
    CHECK(n_entries(s, NULL) == 2);

    tcase("put refuses bad data and a wrong key, leaving nothing behind");
    {
        char junk[8192];
        memset(junk, 'x', sizeof junk);
        CHECK(cb_store_put(s, NULL, junk, sizeof junk, &err) == CB_ERR_FORMAT);
        uint8_t *bad = malloc(e.size);
        memcpy(bad, e.data, e.size);
        bad[e.size - 100] ^= 1; /* body: caught after writing, by the layer checksum */
        char k3[66];
        memcpy(k3, e.key, 66);
        k3[40] = k3[40] == '0' ? '1' : '0';
        CHECK(cb_store_put(s, k3, e.data, e.size, &err) == CB_ERR_INVALID);
        CHECK(cb_store_put(s, "nonsense", e.data, e.size, &err) == CB_ERR_INVALID);
        cb_store_remove(s, e.key, NULL);
        cb_status st = cb_store_put(s, e.key, bad, e.size, &err);
        CHECKF(st == CB_ERR_CHECKSUM || st == CB_ERR_FORMAT, "%d %s", st, err.msg);
        CHECK_OK(cb_store_lookup(s, e.key, &found));
        CHECK(found == 0);
        CHECK(count_files(tdir, ".kv", NULL) == 1);
        CHECK(count_files(tdir, "", NULL) == 1); /* no temporary file left */
        free(bad);
    }

    tcase("acquire of a missing key is CB_ERR_NOT_FOUND and counts a miss");
    {
        cb_store_ref *ref = NULL;
        cb_store_tier_stat st[1];
        uint64_t misses = 0;
        CHECK(cb_store_acquire(s, e.key, &ref, NULL, &err) == CB_ERR_NOT_FOUND && ref == NULL);
        CHECK_OK(cb_store_stat(s, st, &misses, &err));
        CHECK(misses == 1 && st[0].hits == 1 && st[0].entries == 1 && st[0].bytes == e2.size);
    }

    tcase("a file deleted behind the store's back is a miss, and put stores it again");
    {
        snprintf(p, sizeof p, "%s/%s.kv", tdir, e2.key);
        CHECK(unlink(p) == 0);
        CHECK_OK(cb_store_lookup(s, e2.key, &found));
        CHECK(found == 0);
        cb_store_ref *ref = NULL;
        CHECK(cb_store_acquire(s, e2.key, &ref, NULL, &err) == CB_ERR_NOT_FOUND);
        CHECK_OK(cb_store_put(s, e2.key, e2.data, e2.size, &err));
        CHECK(file_eq(p, &e2));
    }

    tcase(
        "rm of an entry in use: hidden at once, the file kept for its reader; put brings it back");
    {
        cb_store_ref *ref = NULL;
        const char *path;
        cb_store_verify_report vr;
        cb_store_tier_stat st[1];
        CHECK_OK(cb_store_acquire(s, e2.key, &ref, &path, &err));
        CHECK_OK(cb_store_remove(s, e2.key, &err));
        CHECK_OK(cb_store_lookup(s, e2.key, &found));
        CHECK(found == 0 && path && file_eq(path, &e2));
        CHECK(cb_store_remove(s, e2.key, &err) == CB_ERR_NOT_FOUND);
        n_problems = 0;
        CHECK_OK(cb_store_verify(s, 0, count_problem, NULL, &vr, &err));
        CHECK_OK(cb_store_stat(s, st, NULL, &err));
        CHECK(st[0].entries == 0 && st[0].reserved == e2.size);
        CHECK_OK(cb_store_put(s, e2.key, e2.data, e2.size, &err));
        CHECK_OK(cb_store_lookup(s, e2.key, &found));
        CHECK(found == 1);
        cb_store_release(ref);
        CHECK_OK(cb_store_remove(s, e2.key, &err));
        CHECK(access(p, F_OK) != 0);
        CHECK_OK(cb_store_put(s, e2.key, e2.data, e2.size, &err));
    }

    tcase("remove, pin and unpin of missing keys are CB_ERR_NOT_FOUND");
    CHECK(cb_store_remove(s, e.key, &err) == CB_ERR_NOT_FOUND);
    CHECK(cb_store_pin(s, e.key, 1, &err) == CB_ERR_NOT_FOUND);
    CHECK(cb_store_remove(s, "zz", &err) == CB_ERR_INVALID);
    CHECK_OK(cb_store_pin(s, e2.key, 1, &err));
    CHECK_OK(cb_store_pin(s, e2.key, 0, &err));

    tcase("put_file adopts a KV file and reports its key");
    {
        char kf[1200], key[66];
        int existed = -1;
        snprintf(kf, sizeof kf, "%s/one.kv", work);
        write_file(kf, e.data, e.size);
        CHECK_OK(cb_store_put_file(s, kf, key, &existed, &err));
        CHECK(strcmp(key, e.key) == 0 && existed == 0);
        CHECK_OK(cb_store_put_file(s, kf, key, &existed, &err));
        CHECK(existed == 1);
        CHECK(cb_store_put_file(s, "/nonexistent/x.kv", key, &existed, &err) == CB_ERR_NOT_FOUND);
        write_file(kf, "CBKV", 4);
        CHECK(cb_store_put_file(s, kf, key, &existed, &err) == CB_ERR_FORMAT);
    }
    cb_store_close(s);
    cb_store_close(NULL);

    tcase(
        "init refuses an existing store, bad or duplicate tiers, a shared directory, a non-empty one");
    {
        char d2[1200], a[1300], b[1300];
        snprintf(d2, sizeof d2, "%s/init", work);
        snprintf(a, sizeof a, "%s/a", d2);
        snprintf(b, sizeof b, "%s/b", d2);
        cb_store_tier bad1[] = {{"x y", a, 0, 0, NULL, 0, NULL, NULL}};
        cb_store_tier dup[] = {{"x", a, 0, 0, NULL, 0, NULL, NULL},
                               {"x", b, 0, 0, NULL, 0, NULL, NULL}};
        cb_store_tier same[] = {{"x", a, 0, 0, NULL, 0, NULL, NULL},
                                {"y", a, 0, 0, NULL, 0, NULL, NULL}};
        CHECK(cb_store_init(dir, NULL, 0, -1, &err) == CB_ERR_CREATE);
        CHECK(cb_store_init(d2, bad1, 1, -1, &err) == CB_ERR_INVALID);
        CHECK(cb_store_init(d2, dup, 2, -1, &err) == CB_ERR_INVALID);
        CHECK(cb_store_init(d2, same, 2, -1, &err) == CB_ERR_INVALID);
        mkdir(d2, 0755);
        mkdir(b, 0755);
        snprintf(p, sizeof p, "%s/junk", b);
        write_file(p, "x", 1);
        cb_store_tier nonempty[] = {{"x", a, 0, 0, NULL, 0, NULL, NULL},
                                    {"y", b, 0, 0, NULL, 0, NULL, NULL}};
        CHECK(cb_store_init(d2, nonempty, 2, -1, &err) == CB_ERR_CREATE);
        CHECK(cb_store_open(&s, d2, 0, &err) == CB_ERR_NOT_FOUND);
        /* A tier directory of another store is refused when opened. */
        unlink(p);
        cb_store_tier t1[] = {{"x", a, 0, 0, NULL, 0, NULL, NULL}};
        cb_store_tier t2[] = {{"y", b, 0, 0, NULL, 0, NULL, NULL}};
        char d3[1300];
        snprintf(d3, sizeof d3, "%s/other", d2);
        CHECK_OK(cb_store_init(d2, t1, 1, -1, &err));
        CHECK_OK(cb_store_init(d3, t2, 1, -1, &err));
        snprintf(p, sizeof p, "%s/.cb-store", a);
        char q[1400];
        snprintf(q, sizeof q, "%s/.cb-store", b);
        size_t n;
        char *other = t_read_file(q, &n);
        if (other)
            write_file(p, other, n);
        free(other);
        CHECK(cb_store_open(&s, d2, 0, &err) == CB_ERR_FORMAT);
        CHECKF(strstr(err.msg, "another store") != NULL, "%s", err.msg);
    }
    free(e.data);
    free(e2.data);
}

/* --------------------------------------------------------------- tiers */

static void test_tiers(kvgen *g, const char *ram)
{
    char dir[1100], t0[1200], t1[1200], t2[1200];
    cb_store *s = NULL;
    cb_error err;
    entry e[12];

    for (int i = 0; i < 12; i++)
        kvgen_make(g, 100 + i, 8, CB_TYPE_F16, &e[i]);
    uint64_t E = e[0].size;
    snprintf(dir, sizeof dir, "%s/tiers", work);
    snprintf(t0, sizeof t0, "%s/ram", ram);
    snprintf(t1, sizeof t1, "%s/ssd", dir);
    snprintf(t2, sizeof t2, "%s/hdd", dir);
    cb_store_tier tiers[] = {{"ram", t0, 2 * E, 0, NULL, 0, NULL, NULL},
                             {"ssd", t1, 2 * E, 0, NULL, 0, NULL, NULL},
                             {"hdd", t2, 2 * E, 0, NULL, 0, NULL, NULL}};

    tcase("three tiers: put fills the fastest first, LRU moves down, the last tier evicts");
    CHECK_OK(cb_store_init(dir, tiers, 3, 2, &err));
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    if (!s) {
        printf("# %s\n", err.msg);
        return;
    }
    for (int i = 0; i < 6; i++)
        CHECK_OK(cb_store_put(s, e[i].key, e[i].data, e[i].size, &err));
    CHECK(strcmp(tier_of(s, e[5].key), "ram") == 0 && strcmp(tier_of(s, e[4].key), "ram") == 0);
    CHECK(strcmp(tier_of(s, e[3].key), "ssd") == 0 && strcmp(tier_of(s, e[2].key), "ssd") == 0);
    CHECK(strcmp(tier_of(s, e[1].key), "hdd") == 0 && strcmp(tier_of(s, e[0].key), "hdd") == 0);
    CHECK_OK(cb_store_put(s, e[6].key, e[6].data, e[6].size, &err));
    CHECKF(strcmp(tier_of(s, e[0].key), "") == 0, "e0 in %s", tier_of(s, e[0].key));
    CHECK(strcmp(tier_of(s, e[6].key), "ram") == 0 && strcmp(tier_of(s, e[4].key), "ssd") == 0);
    CHECK(strcmp(tier_of(s, e[2].key), "hdd") == 0);
    CHECK(count_files(t0, ".kv", NULL) == 2 && count_files(t1, ".kv", NULL) == 2 &&
          count_files(t2, ".kv", NULL) == 2);

    tcase("get promotes to the fastest tier on the 2nd hit (promote_hits 2)");
    {
        cb_store_ref *r = NULL;
        const char *path;
        CHECK_OK(cb_store_acquire(s, e[1].key, &r, &path, &err));
        CHECK(strstr(path, "/hdd/") != NULL && file_eq(path, &e[1]));
        cb_store_release(r);
        CHECK(strcmp(tier_of(s, e[1].key), "hdd") == 0);
        CHECK_OK(cb_store_acquire(s, e[1].key, &r, &path, &err));
        CHECK(strstr(path, "/ram/") != NULL && file_eq(path, &e[1]));
        cb_store_release(r);
        CHECK(strcmp(tier_of(s, e[1].key), "ram") == 0);
        /* The chain ram -> ssd -> hdd made room in hdd before e1 left it. */
        CHECK(n_entries(s, "ram") == 2 && n_entries(s, "ssd") == 2 && n_entries(s, "hdd") == 1);
    }

    tcase("a pinned entry stays in its tier while others move");
    {
        CHECK_OK(cb_store_pin(s, e[6].key, 1, &err));
        for (int i = 7; i < 10; i++)
            CHECK_OK(cb_store_put(s, e[i].key, e[i].data, e[i].size, &err));
        CHECK(strcmp(tier_of(s, e[6].key), "ram") == 0);
        CHECK(n_entries(s, "ram") == 2);
        CHECK_OK(cb_store_pin(s, e[6].key, 0, &err));
    }

    tcase("an entry in use is never moved or deleted under its reader");
    {
        /* The least recently used entry of each tier, held by a reader. */
        cb_store_ref *r = NULL;
        const char *path;
        char held[66];
        find f = {0};
        (void)f;
        snprintf(held, sizeof held, "%s", e[6].key);
        CHECK_OK(cb_store_acquire(s, held, &r, &path, &err));
        char pcopy[1300];
        snprintf(pcopy, sizeof pcopy, "%s", path);
        /* Make held the LRU of ram again by touching the other ram entry. */
        for (int i = 0; i < 12; i++)
            if (strcmp(e[i].key, held) && strcmp(tier_of(s, e[i].key), "ram") == 0) {
                cb_store_ref *r2;
                if (cb_store_acquire(s, e[i].key, &r2, NULL, &err) == CB_OK)
                    cb_store_release(r2);
            }
        for (int i = 0; i < 6; i++) {
            entry x;
            kvgen_make(g, 300 + i, 8, CB_TYPE_F16, &x);
            CHECK_OK(cb_store_put(s, x.key, x.data, x.size, &err));
            free(x.data);
        }
        CHECK(file_eq(pcopy, &e[6]));
        CHECK(strcmp(tier_of(s, held), "ram") == 0);
        /* rm while in use: gone from the index at once, the file stays. */
        CHECK_OK(cb_store_remove(s, held, &err));
        CHECK(strcmp(tier_of(s, held), "") == 0);
        CHECK(file_eq(pcopy, &e[6]));
        cb_store_gc_report rep;
        CHECK_OK(cb_store_gc(s, &rep, &err));
        CHECK(access(pcopy, F_OK) == 0);
        cb_store_release(r);
        CHECK_OK(cb_store_gc(s, &rep, &err));
        CHECK(access(pcopy, F_OK) != 0 && rep.orphans == 1);
        n_problems = 0;
        CHECK_OK(cb_store_verify(s, 0, count_problem, NULL, NULL, &err));
        uint64_t b0, b1, b2;
        count_files(t0, ".kv", &b0);
        count_files(t1, ".kv", &b1);
        count_files(t2, ".kv", &b2);
        CHECK(b0 <= 2 * E && b1 <= 2 * E && b2 <= 2 * E);
    }

    tcase("an entry larger than a tier goes to the first tier it fits; none: CB_ERR_CREATE");
    {
        entry big;
        kvgen_make(g, 400, 200, CB_TYPE_F32, &big);
        cb_status st = cb_store_put(s, big.key, big.data, big.size, &err);
        CHECKF(st == CB_ERR_CREATE, "%d", st);
        CHECK(count_files(t0, "", NULL) == n_entries(s, "ram")); /* nothing half-written left */
        free(big.data);
    }
    cb_store_close(s);

    tcase("stat reports per-tier entries, bytes, capacity and hits");
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    {
        cb_store_tier_stat st[3];
        uint64_t misses = 9;
        CHECK_OK(cb_store_stat(s, st, &misses, &err));
        CHECK(st[0].capacity == 2 * E && st[0].entries == (uint64_t)n_entries(s, "ram") &&
              st[0].bytes == st[0].entries * E && st[0].reserved == 0);
        CHECK(st[1].entries == 2 && st[1].bytes == 2 * E);
        CHECK(strcmp(st[2].name, "hdd") == 0 && st[2].hits >= 1);
        CHECK(misses == 0);
    }
    cb_store_close(s);

    tcase("a RAM tier that vanished (a reboot): made again, its entries missed, dropped by gc");
    rmrf(t0);
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    if (s) {
        int found = 1, ram_entries = n_entries(s, "ram");
        cb_store_gc_report rep;
        cb_store_verify_report vr;
        CHECK(access(t0, F_OK) == 0);
        for (int i = 0; i < 12; i++)
            if (cb_store_lookup(s, e[i].key, &found) == CB_OK && found)
                CHECK(strcmp(tier_of(s, e[i].key), "ram") != 0);
        CHECK(ram_entries > 0);
        CHECK(cb_store_verify(s, 0, NULL, NULL, &vr, &err) == CB_ERR_FORMAT &&
              vr.problems == (uint64_t)ram_entries);
        CHECK_OK(cb_store_gc(s, &rep, &err));
        CHECK(rep.stale == (uint64_t)ram_entries && n_entries(s, "ram") == 0);
        CHECK_OK(cb_store_verify(s, 0, NULL, NULL, &vr, &err));
        CHECK_OK(cb_store_put(s, e[0].key, e[0].data, e[0].size, &err));
        CHECK(strcmp(tier_of(s, e[0].key), "ram") == 0);
        cb_store_close(s);
    }
    for (int i = 0; i < 12; i++)
        free(e[i].data);
}

/* ------------------------------------------------------ gc and verify */

static void test_gc_verify(kvgen *g)
{
    char dir[1100], tdir[1200], p[1400], q[1400];
    cb_store *s = NULL;
    cb_error err;
    cb_store_gc_report rep;
    cb_store_verify_report vr;
    entry e[8];

    for (int i = 0; i < 8; i++)
        kvgen_make(g, 500 + i, 10, CB_TYPE_F16, &e[i]);
    snprintf(dir, sizeof dir, "%s/gcv", work);
    snprintf(tdir, sizeof tdir, "%s/tiers/main", dir);
    CHECK_OK(cb_store_open(&s, dir, 1, &err));
    if (!s)
        return;
    for (int i = 0; i < 5; i++)
        cb_store_put(s, e[i].key, e[i].data, e[i].size, &err);

    tcase("verify of a sound store is clean");
    n_problems = 0;
    CHECK_OK(cb_store_verify(s, 0, count_problem, NULL, &vr, &err));
    CHECK(n_problems == 0 && vr.entries == 5 && vr.files == 5 && vr.bytes >= 5 * e[0].size);

    tcase(
        "verify finds an orphan, a dead temporary file, a missing file, a dead reservation, a flipped byte");
    snprintf(p, sizeof p, "%s/%s.kv", tdir, e[5].key); /* orphan: valid, not indexed */
    write_file(p, e[5].data, e[5].size);
    snprintf(p, sizeof p, "%s/%s.kv.tmp.0123456789abcdef", tdir,
             e[6].key); /* owner never existed */
    write_file(p, e[6].data, 100);
    snprintf(p, sizeof p, "%s/%s.kv", tdir, e[0].key); /* indexed, file gone */
    unlink(p);
    snprintf(
        q, sizeof q,
        "INSERT INTO entries(key, model, tier, bytes, created, last_access, checksum, state, owner) "
        "VALUES('%s', 'm', 'main', 99, 0, 0, 'x', 0, 'fedcba9876543210')",
        e[7].key);
    CHECK(sql(dir, q) == 0);
    snprintf(p, sizeof p, "%s/%s.kv", tdir, e[1].key); /* corrupt body */
    {
        int fd = open(p, O_RDWR);
        uint8_t b;
        off_t off = (off_t)e[1].size - 5000;
        CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
        b ^= 0x10;
        CHECK(pwrite(fd, &b, 1, off) == 1);
        close(fd);
    }
    n_problems = 0;
    CHECK(cb_store_verify(s, 0, count_problem, NULL, &vr, &err) == CB_ERR_FORMAT);
    CHECKF(n_problems == 5 && vr.remaining == 5, "%d problems", n_problems);

    tcase("gc removes what dead processes left; verify then finds only the corrupt file");
    CHECK_OK(cb_store_gc(s, &rep, &err));
    CHECKF(rep.orphans == 1 && rep.temps == 1 && rep.stale == 2,
           "orphans %llu temps %llu stale %llu", (unsigned long long)rep.orphans,
           (unsigned long long)rep.temps, (unsigned long long)rep.stale);
    n_problems = 0;
    CHECK(cb_store_verify(s, 0, count_problem, NULL, &vr, &err) == CB_ERR_FORMAT);
    CHECK(n_problems == 1);

    tcase("verify --repair removes the corrupt entry and is clean after");
    n_problems = 0;
    CHECK_OK(cb_store_verify(s, 1, count_problem, NULL, &vr, &err));
    CHECK(vr.problems == 1 && vr.repaired == 1 && vr.remaining == 0);
    CHECK(strcmp(tier_of(s, e[1].key), "") == 0 && access(p, F_OK) != 0);
    CHECK_OK(cb_store_verify(s, 0, count_problem, NULL, &vr, &err));

    tcase("repair rebuilds the index from the files (rows lost, checksums wrong)");
    CHECK(sql(dir, "DELETE FROM entries WHERE key > (SELECT MIN(key) FROM entries)") == 0);
    CHECK(sql(dir, "UPDATE entries SET checksum = '00000000000000000000000000000000'") == 0);
    n_problems = 0;
    CHECK(cb_store_verify(s, 0, count_problem, NULL, &vr, &err) == CB_ERR_FORMAT);
    CHECK(n_problems == 3);
    CHECK_OK(cb_store_verify(s, 1, count_problem, NULL, &vr, &err));
    CHECK(n_entries(s, NULL) == 3);
    for (int i = 2; i < 5; i++) {
        cb_store_ref *r;
        const char *path;
        CHECK(cb_store_acquire(s, e[i].key, &r, &path, &err) == CB_OK && file_eq(path, &e[i]));
        cb_store_release(r);
    }
    cb_store_close(s);

    tcase("an unreadable index: open says so; reset_index and repair rebuild it");
    snprintf(p, sizeof p, "%s/index.db", dir);
    {
        char junk[8192];
        memset(junk, 0x5a, sizeof junk);
        unlink(p);
        snprintf(q, sizeof q, "%s/index.db-wal", dir);
        unlink(q);
        snprintf(q, sizeof q, "%s/index.db-shm", dir);
        unlink(q);
        write_file(p, junk, sizeof junk);
    }
    CHECK(cb_store_open(&s, dir, 0, &err) == CB_ERR_FORMAT);
    CHECK_OK(cb_store_reset_index(dir, &err));
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    if (s) {
        CHECK(n_entries(s, NULL) == 0);
        CHECK_OK(cb_store_verify(s, 1, NULL, NULL, &vr, &err));
        CHECK(vr.repaired == 3 && n_entries(s, NULL) == 3);
        CHECK_OK(cb_store_verify(s, 0, NULL, NULL, &vr, &err));
        cb_store_close(s);
    }
    for (int i = 0; i < 8; i++)
        free(e[i].data);
}

/* ----------------------------------------------------- export, import */

static int add_member(struct archive *a, const char *name, int type, const void *data, size_t n,
                      const char *link)
{
    struct archive_entry *ae = archive_entry_new();
    archive_entry_set_pathname(ae, name);
    archive_entry_set_filetype(ae, (unsigned)type);
    archive_entry_set_perm(ae, 0644);
    if (type == AE_IFLNK)
        archive_entry_set_symlink(ae, link);
    else if (link)
        archive_entry_set_hardlink(ae, link);
    archive_entry_set_size(ae, type == AE_IFREG && !link ? (la_int64_t)n : 0);
    int rc = archive_write_header(a, ae);
    if (rc == ARCHIVE_OK && type == AE_IFREG && !link && n)
        rc = archive_write_data(a, data, n) == (la_ssize_t)n ? ARCHIVE_OK : ARCHIVE_FATAL;
    archive_entry_free(ae);
    return rc;
}

static int n_rejected;
static void reject_cb(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    n_rejected++;
    if (getenv("CB_TEST_VERBOSE"))
        printf("#     rejected %s: %s\n", what, msg);
}

static void test_archive(kvgen *g)
{
    char a_dir[1100], b_dir[1100], arch[1100], p[1300];
    cb_store *a = NULL, *b = NULL;
    cb_error err;
    entry e[6];
    uint64_t n = 0;
    cb_store_import_report ir;

    for (int i = 0; i < 6; i++)
        kvgen_make(g, 600 + i, 12, CB_TYPE_F16, &e[i]);
    snprintf(a_dir, sizeof a_dir, "%s/arch-a", work);
    snprintf(b_dir, sizeof b_dir, "%s/arch-b", work);
    CHECK_OK(cb_store_open(&a, a_dir, 1, &err));
    CHECK_OK(cb_store_open(&b, b_dir, 1, &err));
    if (!a || !b)
        return;
    for (int i = 0; i < 4; i++)
        cb_store_put(a, e[i].key, e[i].data, e[i].size, &err);

    const char *names[] = {"all.tar.zst", "all.tar.gz", "all.tar"};
    for (int k = 0; k < 3; k++) {
        tcase("export every entry to %s, import into another store: same bytes", names[k]);
        snprintf(arch, sizeof arch, "%s/%s", work, names[k]);
        CHECK_OK(cb_store_export(a, arch, -1, NULL, 0, CB_STORE_COMPRESS_AUTO, &n, &err));
        CHECK(n == 4);
        {
            size_t len;
            uint8_t *h = (uint8_t *)t_read_file(arch, &len);
            if (k == 0)
                CHECK(h && len > 4 && h[0] == 0x28 && h[1] == 0xb5 && h[2] == 0x2f &&
                      h[3] == 0xfd); /* zstd */
            if (k == 1)
                CHECK(h && len > 2 && h[0] == 0x1f && h[1] == 0x8b);
            if (k == 2)
                CHECK(h && len > 262 && memcmp(h + 257, "ustar", 5) == 0);
            free(h);
        }
        n_rejected = 0;
        CHECK_OK(cb_store_import(b, arch, -1, reject_cb, NULL, &ir, &err));
        CHECK(ir.rejected == 0 && ir.imported + ir.existed == 4 && n_rejected == 0);
        CHECK(k == 0 ? ir.imported == 4 : ir.existed == 4);
        for (int i = 0; i < 4; i++) {
            cb_store_ref *r;
            const char *path;
            CHECK(cb_store_acquire(b, e[i].key, &r, &path, &err) == CB_OK && file_eq(path, &e[i]));
            cb_store_release(r);
        }
    }

    tcase("export of chosen keys; a missing key exports nothing");
    {
        const char *keys[] = {e[1].key};
        snprintf(arch, sizeof arch, "%s/one.tar.zst", work);
        CHECK_OK(cb_store_export(a, arch, -1, keys, 1, CB_STORE_COMPRESS_AUTO, &n, &err));
        CHECK(n == 1);
        const char *missing[] = {e[5].key};
        snprintf(p, sizeof p, "%s/none.tar.zst", work);
        CHECK(cb_store_export(a, p, -1, missing, 1, CB_STORE_COMPRESS_AUTO, &n, &err) ==
              CB_ERR_NOT_FOUND);
        CHECK(access(p, F_OK) != 0);
    }

    tcase("export into a pipe and import from one (no padding after the zstd stream)");
    {
        const char *keys[] = {e[2].key};
        int fds[2];
        char c_dir[1100];
        cb_store *c = NULL;
        CHECK(pipe(fds) == 0);
        CHECK_OK(cb_store_export(a, NULL, fds[1], keys, 1, CB_STORE_COMPRESS_ZSTD, &n, &err));
        close(fds[1]);
        snprintf(c_dir, sizeof c_dir, "%s/arch-pipe", work);
        CHECK_OK(cb_store_open(&c, c_dir, 1, &err));
        CHECK_OK(cb_store_import(c, NULL, fds[0], reject_cb, NULL, &ir, &err));
        CHECK(ir.imported == 1 && strcmp(tier_of(c, e[2].key), "main") == 0);
        close(fds[0]);
        cb_store_close(c);
    }

    tcase("import rejects absolute paths, '..', links, devices, invalid and misnamed KV files");
    {
        struct archive *w = archive_write_new();
        char good1[80], good2[80], misnamed[80];
        snprintf(arch, sizeof arch, "%s/evil.tar.zst", work);
        archive_write_set_format_pax_restricted(w);
        archive_write_add_filter_zstd(w);
        archive_write_open_filename(w, arch);
        snprintf(good1, sizeof good1, "%s.kv", e[4].key);
        snprintf(good2, sizeof good2, "sub/dir/anything.kv");
        snprintf(misnamed, sizeof misnamed, "%s.kv", e[0].key);
        char abs[1300];
        snprintf(abs, sizeof abs, "%s/escaped-abs.kv", work);
        add_member(w, "sub/", AE_IFDIR, NULL, 0, NULL);
        add_member(w, good1, AE_IFREG, e[4].data, e[4].size, NULL);
        add_member(w, good2, AE_IFREG, e[5].data, e[5].size, NULL);
        add_member(w, abs, AE_IFREG, e[2].data, e[2].size, NULL);
        add_member(w, "../escaped-up.kv", AE_IFREG, e[2].data, e[2].size, NULL);
        add_member(w, "sub/../../escaped-mid.kv", AE_IFREG, e[2].data, e[2].size, NULL);
        add_member(w, "link.kv", AE_IFLNK, NULL, 0, "/etc/passwd");
        add_member(w, "hard.kv", AE_IFREG, NULL, 0, good1);
        add_member(w, "fifo.kv", AE_IFIFO, NULL, 0, NULL);
        add_member(w, "junk.kv", AE_IFREG, "hello, not a KV file", 20, NULL);
        add_member(w, "trunc.kv", AE_IFREG, e[3].data, e[3].size - 4096, NULL);
        add_member(w, misnamed, AE_IFREG, e[3].data, e[3].size, NULL); /* holds e3, named e0 */
        CHECK(archive_write_close(w) == ARCHIVE_OK);
        archive_write_free(w);

        char c_dir[1100];
        cb_store *c = NULL;
        snprintf(c_dir, sizeof c_dir, "%s/arch-c", work);
        CHECK_OK(cb_store_open(&c, c_dir, 1, &err));
        n_rejected = 0;
        CHECK(cb_store_import(c, arch, -1, reject_cb, NULL, &ir, &err) == CB_ERR_FORMAT);
        CHECKF(ir.imported == 2 && ir.rejected == 9 && ir.skipped == 1 && n_rejected == 9,
               "imported %llu rejected %llu skipped %llu", (unsigned long long)ir.imported,
               (unsigned long long)ir.rejected, (unsigned long long)ir.skipped);
        CHECK(n_entries(c, NULL) == 2);
        CHECK(strcmp(tier_of(c, e[4].key), "main") == 0 &&
              strcmp(tier_of(c, e[5].key), "main") == 0);
        snprintf(p, sizeof p, "%s/escaped-up.kv", c_dir);
        CHECK(access(abs, F_OK) != 0 && access(p, F_OK) != 0);
        snprintf(p, sizeof p, "%s/escaped-up.kv", work);
        CHECK(access(p, F_OK) != 0);
        CHECK_OK(cb_store_verify(c, 0, count_problem, NULL, NULL, &err));

        tcase("import of a truncated or non-archive file is CB_ERR_FORMAT");
        snprintf(p, sizeof p, "%s/cut.tar.zst", work);
        {
            size_t len;
            char *whole = t_read_file(arch, &len);
            write_file(p, whole, len / 2);
            free(whole);
        }
        CHECK(cb_store_import(c, p, -1, NULL, NULL, &ir, &err) == CB_ERR_FORMAT);
        write_file(p, "garbage garbage garbage", 23);
        CHECK(cb_store_import(c, p, -1, NULL, NULL, &ir, &err) == CB_ERR_FORMAT);
        CHECK(cb_store_import(c, "/nonexistent.tar", -1, NULL, NULL, &ir, &err) ==
              CB_ERR_NOT_FOUND);
        CHECK_OK(cb_store_verify(c, 0, count_problem, NULL, NULL, &err));
        cb_store_close(c);
    }
    cb_store_close(a);
    cb_store_close(b);
    for (int i = 0; i < 6; i++)
        free(e[i].data);
}

/* ------------------------------------------- decompression bombs (import) */

static char bomb_msg[512];
static void bomb_cb(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    n_rejected++;
    snprintf(bomb_msg, sizeof bomb_msg, "%s: %s", what, msg);
}

/* Files left in DIR/tmp (the import's staging directory). */
static int n_staged(const char *dir)
{
    char p[1300];
    int n = 0;
    snprintf(p, sizeof p, "%s/tmp", dir);
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* A tar.gz holding e0 as is, then `bomb` (BOMB bytes: e1's first 4096
 * bytes, a valid KV header, then zeros) and `zeros` (BOMB zero bytes). */
#define BOMB (32u << 20)
static void write_bomb(const char *arch, const entry *e0, const entry *e1, int with_zeros)
{
    char *big = calloc(1, BOMB), name[80];
    struct archive *w = archive_write_new();
    archive_write_set_format_pax_restricted(w);
    archive_write_add_filter_gzip(w);
    archive_write_open_filename(w, arch);
    snprintf(name, sizeof name, "%s.kv", e0->key);
    add_member(w, name, AE_IFREG, e0->data, e0->size, NULL);
    if (big) {
        memcpy(big, e1->data, e1->size < 4096 ? e1->size : 4096);
        add_member(w, "bomb.kv", AE_IFREG, big, BOMB, NULL);
        if (with_zeros) {
            memset(big, 0, 4096);
            add_member(w, "zeros.kv", AE_IFREG, big, BOMB, NULL);
        }
    }
    archive_write_close(w);
    archive_write_free(w);
    free(big);
}

/* cb-store import used to stage a whole member before looking at it, so
 * that a small archive could fill the disk.  Files are limited to 8 MiB
 * while importing: a 32 MiB staging write would fail with EFBIG. */
static void test_import_bomb(kvgen *g)
{
    char dir[1100], dir2[1100], arch[1100];
    entry e[2];
    cb_store *s = NULL;
    cb_error err;
    cb_store_import_report ir;
    struct rlimit old, lim;
    cb_store_tier small[1] = {{"small", "t/small", 1u << 20, 0, NULL, 0, NULL, NULL}};

    for (int i = 0; i < 2; i++)
        kvgen_make(g, 700 + i, 12, CB_TYPE_F16, &e[i]);
    snprintf(arch, sizeof arch, "%s/bomb.tar.gz", work);
    write_bomb(arch, &e[0], &e[1], 1);
    snprintf(dir, sizeof dir, "%s/bomb", work);
    CHECK_OK(cb_store_open(&s, dir, 1, &err));
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 8u << 20;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);

    tcase(
        "import rejects members that decompress to more than their KV header (a gzip of zeros), unstaged");
    n_rejected = 0;
    cb_status st = cb_store_import(s, arch, -1, bomb_cb, NULL, &ir, &err);
    CHECKF(st == CB_ERR_FORMAT && ir.imported == 1 && ir.rejected == 2 && n_rejected == 2, "%s: %s",
           cb_strerror(st), err.msg);
    CHECKF(strstr(bomb_msg, "zeros.kv: not a valid KV file: bad magic"), "%s", bomb_msg);
    CHECK(n_entries(s, NULL) == 1 && n_staged(dir) == 0);
    CHECK_OK(cb_store_verify(s, 0, count_problem, NULL, NULL, &err));

    tcase("the bomb alone: named with its size and its header's, store as it was");
    write_bomb(arch, &e[0], &e[1], 0);
    CHECK_OK(cb_store_remove(s, e[0].key, &err));
    n_rejected = 0;
    st = cb_store_import(s, arch, -1, bomb_cb, NULL, &ir, &err);
    char want[128];
    snprintf(want, sizeof want,
             "bomb.kv: holds %u bytes, but a KV file with its header is %zu bytes", BOMB,
             e[1].size);
    CHECKF(st == CB_ERR_FORMAT && ir.rejected == 1 && strstr(bomb_msg, want), "%s", bomb_msg);
    CHECK(n_entries(s, NULL) == 1 && n_staged(dir) == 0);
    cb_store_close(s);
    s = NULL;

    tcase("a member larger than the largest tier's capacity stops the import before writing");
    snprintf(dir2, sizeof dir2, "%s/bomb-small", work);
    CHECK_OK(cb_store_init(dir2, small, 1, -1, &err));
    CHECK_OK(cb_store_open(&s, dir2, 0, &err));
    if (s) {
        n_rejected = 0;
        st = cb_store_import(s, arch, -1, bomb_cb, NULL, &ir, &err);
        CHECKF(st == CB_ERR_FORMAT && strstr(err.msg, arch) &&
                   strstr(err.msg, "bomb.kv: 33554432 bytes") && strstr(err.msg, "capacity"),
               "%s", err.msg);
        CHECK(ir.imported == 1 && n_entries(s, NULL) == 1 && n_staged(dir2) == 0);
        CHECK_OK(cb_store_verify(s, 0, count_problem, NULL, NULL, &err));
        cb_store_close(s);
    }
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, was);
    unlink(arch);
    for (int i = 0; i < 2; i++)
        free(e[i].data);
}

/* ------------------------------------------------- concurrency, crashes */

typedef struct slot {
    uint64_t puts, full, rms, gets, hits, misses, gcs, verifies, vfail, fails, bad, capv;
    int kind; /* 0 writer, 1 reader, 2 gc */
} slot;

static entry *pool;
static int n_pool;

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void child_fail(slot *sl, const char *who, const cb_error *err)
{
    if (sl->fails++ < 3)
        printf("#     %s: %s\n", who, err->msg);
}

/* The body of a child process; it never returns. */
static void child(const char *dir, int kind, int id, slot *sl, double deadline,
                  const uint64_t *caps, int n_tiers, int with_verify)
{
    cb_store *s = NULL;
    cb_error err;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 20) ^ (uint64_t)id;
    sl->kind = kind;
    if (cb_store_open(&s, dir, 0, &err) != CB_OK) {
        child_fail(sl, "open", &err);
        _exit(1);
    }
    while (now_s() < deadline) {
        entry *e = &pool[rng_next(&x) % (uint64_t)n_pool];
        if (kind == 0) {
            if (rng_next(&x) % 100 < 5) {
                cb_status st = cb_store_remove(s, e->key, &err);
                if (st == CB_OK)
                    sl->rms++;
                else if (st != CB_ERR_NOT_FOUND)
                    child_fail(sl, "rm", &err);
                continue;
            }
            cb_status st = cb_store_put(s, e->key, e->data, e->size, &err);
            if (st == CB_OK)
                sl->puts++;
            else if (st == CB_ERR_CREATE)
                sl->full++;
            else
                child_fail(sl, "put", &err);
        } else if (kind == 1) {
            cb_store_ref *r = NULL;
            const char *path;
            sl->gets++;
            cb_status st = cb_store_acquire(s, e->key, &r, &path, &err);
            if (st == CB_OK) {
                sl->hits++;
                /* The whole file must be exactly the entry's bytes. */
                if (!file_eq(path, e)) {
                    if (sl->bad++ < 3)
                        printf("#     reader: %s does not hold %s\n", path, e->key);
                }
                uint64_t hold = rng_next(&x) % 1000;
                if (hold)
                    usleep((useconds_t)hold);
                cb_store_release(r);
            } else if (st == CB_ERR_NOT_FOUND) {
                sl->misses++;
            } else {
                child_fail(sl, "get", &err);
            }
        } else {
            cb_store_tier_stat st[CB_STORE_MAX_TIERS];
            if (cb_store_gc(s, NULL, &err) == CB_OK)
                sl->gcs++;
            else
                child_fail(sl, "gc", &err);
            /* verify while everyone works: it must see no inconsistency
             * (not in the kill rounds, where the dead leave leftovers). */
            if (with_verify && sl->gcs % 4 == 0) {
                cb_store_verify_report vr;
                cb_status vs = cb_store_verify(s, 0, count_problem, NULL, &vr, &err);
                sl->verifies++;
                if (vs != CB_OK && sl->vfail++ < 3)
                    printf("#     verify during the run: %s\n", err.msg);
            }
            if (cb_store_stat(s, st, NULL, &err) == CB_OK) {
                for (int t = 0; t < n_tiers; t++)
                    if (caps[t] && st[t].bytes + st[t].reserved > caps[t] && sl->capv++ < 3)
                        printf("#     gc: tier %s holds %llu bytes, capacity %llu\n", st[t].name,
                               (unsigned long long)(st[t].bytes + st[t].reserved),
                               (unsigned long long)caps[t]);
            }
            usleep(2000);
        }
    }
    cb_store_close(s);
    fflush(stdout);
    _exit(0);
}

/* Every stored entry is exactly its pool bytes. */
static int check_entries(cb_store *s, int *n_checked)
{
    find f = {0};
    int bad = 0;
    *n_checked = 0;
    cb_store_list(s, NULL, NULL, find_cb, &f, NULL);
    for (int i = 0; i < n_pool; i++) {
        cb_store_ref *r;
        const char *path;
        cb_error err;
        int found = 0;
        cb_store_lookup(s, pool[i].key, &found);
        if (!found)
            continue;
        if (cb_store_acquire(s, pool[i].key, &r, &path, &err) != CB_OK) {
            bad++;
            continue;
        }
        (*n_checked)++;
        if (!file_eq(path, &pool[i])) {
            printf("#     %s: not the bytes of %s\n", path, pool[i].key);
            bad++;
        }
        cb_store_release(r);
    }
    return bad;
}

static void test_concurrency(kvgen *g, const char *ram)
{
    char dir[1100], t0[1200], t1[1200], t2[1200];
    cb_error err;
    const char *env = getenv("CB_STORE_STRESS_S");
    double secs = env && atof(env) > 0 ? atof(env) : 4.0;
    enum { NW = 4, NR = 8, NG = 1, NP = NW + NR + NG };
    pid_t pids[NP];
    slot *sl;
    uint64_t E = 0, caps[3];

    n_pool = 48;
    pool = calloc((size_t)n_pool, sizeof *pool);
    for (int i = 0; i < n_pool; i++) {
        kvgen_make(g, 1000 + i, i % 4 == 0 ? 160 : 8 + i, i % 3 ? CB_TYPE_F16 : CB_TYPE_F32,
                   &pool[i]);
        E += pool[i].size;
    }
    E /= (uint64_t)n_pool; /* mean entry size */
    snprintf(dir, sizeof dir, "%s/stress", work);
    snprintf(t0, sizeof t0, "%s/stress-ram", ram);
    snprintf(t1, sizeof t1, "%s/ssd", dir);
    snprintf(t2, sizeof t2, "%s/hdd", dir);
    caps[0] = 4 * E;
    caps[1] = 8 * E;
    caps[2] = 16 * E;
    cb_store_tier tiers[] = {{"ram", t0, caps[0], 0, NULL, 0, NULL, NULL},
                             {"ssd", t1, caps[1], 0, NULL, 0, NULL, NULL},
                             {"hdd", t2, caps[2], 0, NULL, 0, NULL, NULL}};

    tcase(
        "concurrency: %d writers, %d readers, gc in a loop for %.0f s on small tiers; then verify",
        NW, NR, secs);
    if (cb_store_init(dir, tiers, 3, 2, &err) != CB_OK) {
        printf("# %s\n", err.msg);
        CHECK(0);
        return;
    }
    sl = mmap(NULL, sizeof(slot) * NP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(sl, 0, sizeof(slot) * NP);
    fflush(stdout);
    double t_start = now_s(), deadline = t_start + secs;
    for (int i = 0; i < NP; i++) {
        int kind = i < NW ? 0 : i < NW + NR ? 1 : 2;
        if ((pids[i] = fork()) == 0)
            child(dir, kind, i, &sl[i], deadline, caps, 3, 1);
    }
    int exited_bad = 0;
    for (int i = 0; i < NP; i++) {
        int status;
        waitpid(pids[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            exited_bad++;
    }
    double took = now_s() - t_start;
    slot sum = {0};
    for (int i = 0; i < NP; i++) {
        sum.puts += sl[i].puts;
        sum.full += sl[i].full;
        sum.rms += sl[i].rms;
        sum.gets += sl[i].gets;
        sum.hits += sl[i].hits;
        sum.misses += sl[i].misses;
        sum.gcs += sl[i].gcs;
        sum.verifies += sl[i].verifies;
        sum.vfail += sl[i].vfail;
        sum.fails += sl[i].fails;
        sum.bad += sl[i].bad;
        sum.capv += sl[i].capv;
    }
    cb_store *s = NULL;
    cb_store_verify_report vr = {0};
    cb_store_gc_report gr = {0};
    int n_checked = 0, wrong = 0;
    n_problems = 0;
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    /* Files removed while a reader held them are left for a gc: one more
     * runs now that every process is gone. */
    cb_status gst = s ? cb_store_gc(s, &gr, &err) : CB_ERR_IO;
    cb_status vst = s ? cb_store_verify(s, 0, count_problem, NULL, &vr, &err) : CB_ERR_IO;
    if (s)
        wrong = check_entries(s, &n_checked);
    uint64_t b0, b1, b2;
    count_files(t0, ".kv", &b0);
    count_files(t1, ".kv", &b1);
    count_files(t2, ".kv", &b2);
    uint64_t ops = sum.puts + sum.full + sum.rms + sum.gets + sum.gcs + sum.verifies;
    printf(
        "# concurrency: %.1f s, %llu operations (%llu puts, %llu store-full, %llu rm, %llu gets: %llu hits, "
        "%llu misses; %llu gc runs; %llu verify runs, %llu inconsistent), %.0f ops/s; failures %llu, wrong or corrupt reads %llu, capacity "
        "violations seen %llu; verify: %llu problems; %d entries re-read intact\n",
        took, (unsigned long long)ops, (unsigned long long)sum.puts, (unsigned long long)sum.full,
        (unsigned long long)sum.rms, (unsigned long long)sum.gets, (unsigned long long)sum.hits,
        (unsigned long long)sum.misses, (unsigned long long)sum.gcs,
        (unsigned long long)sum.verifies, (unsigned long long)sum.vfail, ops / took,
        (unsigned long long)sum.fails, (unsigned long long)sum.bad, (unsigned long long)sum.capv,
        (unsigned long long)vr.problems, n_checked);
    CHECK(exited_bad == 0);
    CHECK(sum.fails == 0 && sum.bad == 0 && sum.capv == 0 && sum.vfail == 0);
    CHECK(sum.puts > 0 && sum.hits > 0 && sum.gcs > 0 && sum.verifies > 0);
    CHECK(gst == CB_OK && gr.temps == 0 && gr.stale == 0);
    CHECK(vst == CB_OK && n_problems == 0);
    CHECK(wrong == 0);
    CHECKF(b0 <= caps[0] && b1 <= caps[1] && b2 <= caps[2], "%llu %llu %llu",
           (unsigned long long)b0, (unsigned long long)b1, (unsigned long long)b2);
    cb_store_close(s);
    munmap(sl, sizeof(slot) * NP);

    /* ---- crashes ---- */
    const char *renv = getenv("CB_STORE_ROUNDS");
    int rounds = renv && atoi(renv) > 0 ? atoi(renv) : 50;
    enum { KW = 3, KR = 1, KG = 1, KP = KW + KR + KG };
    uint64_t x = 0x1234567ull ^ (uint64_t)getpid();
    int kills = 0, failures = 0, partial = 0, dirty = 0, checked_total = 0;
    uint64_t left_tmp = 0, left_res = 0, left_orph = 0;
    uint64_t k_puts = 0, k_gets = 0, k_gcs = 0;
    tcase(
        "crashes: %d rounds of SIGKILL at random moments to writers and gc; gc and verify clean after each",
        rounds);
    sl = mmap(NULL, sizeof(slot) * KP, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    t_start = now_s();
    for (int round = 0; round < rounds; round++) {
        memset(sl, 0, sizeof(slot) * KP);
        fflush(stdout);
        double dl = now_s() + 10.0; /* a safety net: every child is killed long before */
        for (int i = 0; i < KP; i++) {
            int kind = i < KW ? 0 : i < KW + KR ? 1 : 2;
            if ((pids[i] = fork()) == 0)
                child(dir, kind, 100 + i, &sl[i], dl, caps, 3, 0);
        }
        /* Kill each one at its own random moment within 3..40 ms. */
        int order[KP];
        double at[KP];
        for (int i = 0; i < KP; i++) {
            order[i] = i;
            at[i] = 0.003 + (double)(rng_next(&x) % 37000) * 1e-6;
        }
        for (int i = 0; i < KP; i++)
            for (int j = i + 1; j < KP; j++)
                if (at[order[j]] < at[order[i]]) {
                    int tmp = order[i];
                    order[i] = order[j];
                    order[j] = tmp;
                }
        double t0r = now_s();
        for (int i = 0; i < KP; i++) {
            double wait = t0r + at[order[i]] - now_s();
            if (wait > 0)
                usleep((useconds_t)(wait * 1e6));
            kill(pids[order[i]], SIGKILL);
        }
        for (int i = 0; i < KP; i++) {
            int status;
            waitpid(pids[i], &status, 0);
            if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                kills++;
            failures += (int)(sl[i].fails + sl[i].bad + sl[i].capv);
            k_puts += sl[i].puts;
            k_gets += sl[i].gets;
            k_gcs += sl[i].gcs;
        }
        /* Right after the crash: every visible entry is whole. */
        cb_store *cs = NULL;
        int nc = 0;
        if (cb_store_open(&cs, dir, 0, &err) != CB_OK) {
            printf("# round %d: open: %s\n", round, err.msg);
            dirty++;
            continue;
        }
        partial += check_entries(cs, &nc);
        checked_total += nc;
        n_problems = 0;
        memset(&gr, 0, sizeof gr);
        if (cb_store_gc(cs, &gr, &err) != CB_OK ||
            cb_store_verify(cs, 0, count_problem, NULL, &vr, &err) != CB_OK || n_problems) {
            printf("# round %d: not clean after gc: %s\n", round, err.msg);
            dirty++;
        }
        left_tmp += gr.temps;
        left_res += gr.stale;
        left_orph += gr.orphans;
        cb_store_close(cs);
    }
    took = now_s() - t_start;
    printf(
        "# crashes: %d rounds in %.1f s, %d processes killed (%llu puts, %llu gets, %llu gc runs completed "
        "between kills); left behind by the killed and removed by gc: %llu temporary files, %llu unfinished "
        "writes, %llu orphan copies; %d entries checked after the kills, partial or wrong entries %d, failures "
        "%d, rounds not clean after gc %d\n",
        rounds, took, kills, (unsigned long long)k_puts, (unsigned long long)k_gets,
        (unsigned long long)k_gcs, (unsigned long long)left_tmp, (unsigned long long)left_res,
        (unsigned long long)left_orph, checked_total, partial, failures, dirty);
    CHECK(kills >= rounds * KW);
    CHECK(partial == 0 && failures == 0 && dirty == 0);
    munmap(sl, sizeof(slot) * KP);
    for (int i = 0; i < n_pool; i++)
        free(pool[i].data);
    free(pool);
}

/* ---------------------------------------------------------------- main */

static int make_kv(int argc, char **argv)
{
    kvgen g;
    if (argc < 5)
        return 64;
    int n = atoi(argv[4]), ntok = argc > 5 ? atoi(argv[5]) : 8;
    if (kvgen_open(&g, argv[2]) != 0)
        return 66;
    for (int i = 0; i < n; i++) {
        entry e;
        char p[2048];
        if (kvgen_make(&g, 7000 + i * 3 + ntok, ntok, CB_TYPE_F16, &e) != 0)
            return 70;
        snprintf(p, sizeof p, "%s/kv-%d.kv", argv[3], i);
        if (write_file(p, e.data, e.size) != 0)
            return 73;
        printf("%s %s\n", p, e.key);
        free(e.data);
    }
    kvgen_close(&g);
    return 0;
}

/* ------------------------------------------------ read-only (issue 16) */

static void list_names(const char *dir, char *buf, size_t n)
{
    char cmd[1400];
    /* SQLite may make the index's -wal and -shm files where it can (to read
     * beside writers); they are not the store's contents */
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | grep -v '^index.db-'", dir);
    FILE *f = popen(cmd, "r");
    size_t k = f ? fread(buf, 1, n - 1, f) : 0;
    buf[k] = 0;
    if (f)
        pclose(f);
}

typedef struct hctx {
    const char *key;
    uint64_t hits;
    int64_t last;
    int found;
} hctx;

static int hits_cb(void *ctx, const cb_store_entry *e)
{
    hctx *c = ctx;
    if (strcmp(e->key, c->key) == 0) {
        c->hits = e->hits;
        c->last = e->last_access_us;
        c->found = 1;
    }
    return 0;
}

static void test_readonly(kvgen *g)
{
    char dir[1100], tdir[1200], before[4096], after[4096], lock[1200];
    cb_store *s = NULL, *r = NULL;
    cb_error err;
    entry e[3];
    for (int i = 0; i < 3; i++)
        kvgen_make(g, 900 + i, 8, CB_TYPE_F16, &e[i]);
    snprintf(dir, sizeof dir, "%s/ro", work);
    snprintf(tdir, sizeof tdir, "%s/tiers/main", dir);
    snprintf(lock, sizeof lock, "%s/lock", dir);
    CHECK_OK(cb_store_open(&s, dir, 1, &err));
    if (!s)
        return;
    CHECK_OK(cb_store_put(s, e[0].key, e[0].data, e[0].size, &err));
    CHECK_OK(cb_store_put(s, e[1].key, e[1].data, e[1].size, &err));
    CHECK(cb_store_readonly(s) == 0);
    cb_store_close(s);
    s = NULL;
    unlink(lock);
    list_names(dir, before, sizeof before);

    tcase("cb_store_open_readonly: no lock file, no owner file, reads work");
    CHECK_OK(cb_store_open_readonly(&r, dir, &err));
    if (!r)
        return;
    CHECK(cb_store_readonly(r) == 1);
    int found = 0;
    CHECK_OK(cb_store_lookup(r, e[0].key, &found));
    CHECK(found == 1);
    cb_store_ref *ref = NULL;
    const char *path = NULL;
    CHECK_OK(cb_store_acquire(r, e[0].key, &ref, &path, &err));
    CHECK(ref && cb_store_ref_size(ref) == e[0].size);
    cb_store_release(ref);
    CHECK(cb_store_acquire(r, e[2].key, &ref, &path, &err) == CB_ERR_NOT_FOUND);
    cb_store_verify_report vr;
    CHECK_OK(cb_store_verify(r, 0, NULL, NULL, &vr, &err));
    CHECK(vr.entries == 2 && vr.problems == 0);
    cb_store_tier_stat ts[CB_STORE_MAX_TIERS];
    uint64_t misses = 7;
    CHECK_OK(cb_store_stat(r, ts, &misses, &err));
    CHECK(ts[0].entries == 2 && ts[0].hits == 0 && misses == 0);
    CHECK(access(lock, F_OK) != 0);

    tcase("read-only: writes fail with CB_ERR_CREATE and change nothing");
    CHECK(cb_store_put(r, e[2].key, e[2].data, e[2].size, &err) == CB_ERR_CREATE);
    CHECK(strstr(err.msg, "read-only") != NULL);
    CHECK(cb_store_remove(r, e[0].key, &err) == CB_ERR_CREATE);
    CHECK(cb_store_pin(r, e[0].key, 1, &err) == CB_ERR_CREATE);
    CHECK(cb_store_gc(r, NULL, &err) == CB_ERR_CREATE);
    CHECK(cb_store_verify(r, 1, NULL, NULL, NULL, &err) == CB_ERR_CREATE);
    list_names(dir, after, sizeof after);
    CHECK(strcmp(before, after) == 0);
    if (strcmp(before, after) != 0)
        printf("# before:\n%s# after:\n%s", before, after);
    cb_store_close(r);
    r = NULL;

    tcase("read-only: no access recorded (hits, last access, counters)");
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    if (!s)
        return;
    hctx c = {e[0].key, 0, 0, 0};
    CHECK_OK(cb_store_list(s, NULL, NULL, hits_cb, &c, &err));
    CHECK(c.found && c.hits == 0);
    CHECK_OK(cb_store_stat(s, ts, &misses, &err));
    CHECK(ts[0].hits == 0 && misses == 0);

    tcase(
        "read-only: a tier directory that vanished is not made again, its entries not found, the index kept");
    cb_store_close(s);
    s = NULL;
    char p[1400];
    snprintf(p, sizeof p, "%s/%s.kv", tdir, e[1].key);
    unlink(p);
    CHECK_OK(cb_store_open_readonly(&r, dir, &err));
    if (!r)
        return;
    CHECK(cb_store_acquire(r, e[1].key, &ref, &path, &err) == CB_ERR_NOT_FOUND);
    n_problems = 0;
    CHECK(cb_store_verify(r, 0, count_problem, NULL, &vr, &err) == CB_ERR_FORMAT &&
          n_problems == 1);
    cb_store_close(r);
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    hctx c1 = {e[1].key, 0, 0, 0};
    CHECK_OK(cb_store_list(s, NULL, NULL, hits_cb, &c1, &err));
    CHECK(c1.found); /* left for a writer's gc */
    cb_store_close(s);
    for (int i = 0; i < 3; i++)
        free(e[i].data);
}

/* Found by fuzz_store_conf: a store.json edited to give two tiers one
 * directory was opened; gc and verify would then take one tier's entries for
 * the other's orphans.  Opening must refuse it, naming both tiers. */
/* ------------------------------------------------------------- secrets */

static void write_secret(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    chmod(path, mode);
}

/* As a reader checks part i: under the upload key it derives from what
 * the metadata says (id), against tag: 1 verifies, 0 not (or no context). */
static int mac_check_as(const st_mac *m, const st_part_id *id, uint64_t i, const char *part,
                        const uint8_t *tag)
{
    st_mac_ctx *c = st_mac_upload(m, id);
    int ok = c && st_mac_check(c, id, i, part, strlen(part), tag) == 1;
    st_mac_ctx_free(c);
    return ok;
}

static void test_secrets(const char *tmp)
{
    char dir[1100], p[1200], q[1400], user[128], pass[512];
    cb_error err;
    st_mac m = {0}, m2 = {0};

    snprintf(dir, sizeof dir, "%s/secrets.%d", tmp, (int)getpid());
    rmrf(dir);
    mkdir(dir, 0700);

    tcase(
        "keygen: a 0600 file of 64 hex digits, never overwritten; the same key gives the same id");
    snprintf(p, sizeof p, "%s/tier.key", dir);
    CHECK_OK(cb_store_keygen(p, &err));
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && (sb.st_mode & 0777) == 0600 && sb.st_size == 65);
    CHECK(cb_store_keygen(p, &err) == CB_ERR_CREATE);
    CHECK_OK(st_key_load(p, &m, &err));
    CHECK_OK(st_key_load(p, &m2, &err));
    CHECK(m.kdf && strlen(m.id) == 16 && strcmp(m.id, m2.id) == 0);
    snprintf(q, sizeof q, "%s/tier2.key", dir);
    CHECK_OK(cb_store_keygen(q, &err));
    CHECK_OK(st_key_load(q, &m2, &err));
    CHECK(strcmp(m.id, m2.id) != 0);
    st_mac_free(&m);
    st_mac_free(&m2);

    tcase(
        "secret files: refused when others may read them or malformed, and no message holds the secret");
    char key_text[80] = "";
    FILE *kf = fopen(p, "r");
    if (kf) {
        CHECK(fgets(key_text, sizeof key_text, kf) != NULL);
        fclose(kf);
    }
    key_text[64] = 0;
    chmod(p, 0640);
    CHECK(st_key_load(p, &m, &err) == CB_ERR_FORMAT && strstr(err.msg, "too open") &&
          !strstr(err.msg, key_text));
    chmod(p, 0604);
    CHECK(st_key_load(p, &m, &err) == CB_ERR_FORMAT);
    chmod(p, 0600);
    snprintf(q, sizeof q, "%s/short.key", dir);
    write_secret(q, "00112233\n", 0600);
    CHECK(st_key_load(q, &m, &err) == CB_ERR_FORMAT && strstr(err.msg, "not a tier key") &&
          !strstr(err.msg, "0011"));
    snprintf(q, sizeof q, "%s/none.key", dir);
    CHECK(st_key_load(q, &m, &err) == CB_ERR_NOT_FOUND && m.kdf == NULL);
    snprintf(q, sizeof q, "%s/pw", dir);
    write_secret(q, "s3cret-Pw\n", 0600);
    CHECK(st_auth_load(q, user, sizeof user, pass, sizeof pass, &err) == CB_OK && !user[0] &&
          strcmp(pass, "s3cret-Pw") == 0);
    write_secret(q, "cb-cron pass with spaces", 0600);
    CHECK(st_auth_load(q, user, sizeof user, pass, sizeof pass, &err) == CB_OK &&
          strcmp(user, "cb-cron") == 0 && strcmp(pass, "pass with spaces") == 0);
    write_secret(q, "s3cret-Pw\nsecond\n", 0600);
    CHECK(st_auth_load(q, user, sizeof user, pass, sizeof pass, &err) == CB_ERR_FORMAT &&
          !strstr(err.msg, "s3cret"));
    write_secret(q, "\n", 0600);
    CHECK(st_auth_load(q, user, sizeof user, pass, sizeof pass, &err) == CB_ERR_FORMAT);
    write_secret(q, "s3cret-Pw\n", 0644);
    CHECK(st_auth_load(q, user, sizeof user, pass, sizeof pass, &err) == CB_ERR_FORMAT &&
          strstr(err.msg, "0644") && !strstr(err.msg, "s3cret"));
    if (geteuid() == 0) {
        CHECK(chown(q, 1, 1) == 0);
        chmod(q, 0600);
        CHECK(st_auth_load(q, user, sizeof user, pass, sizeof pass, &err) == CB_ERR_FORMAT &&
              strstr(err.msg, "owned by user 1"));
    }

    tcase(
        "part MAC: AES-256-GMAC under the upload's HKDF key, the layout of cb-store(5), as Python's "
        "cryptography computes it");
    uint8_t K[ST_KEY_BYTES], tag[ST_TAG_BYTES], t2[ST_TAG_BYTES], t3[ST_TAG_BYTES];
    for (int i = 0; i < ST_KEY_BYTES; i++)
        K[i] = (uint8_t)i;
    char ekey[66];
    memset(ekey, 'a', 32);
    ekey[32] = '-';
    memset(ekey + 33, 'b', 32);
    ekey[65] = 0;
    st_part_id id = {"0123456789abcdef0123456789abcdef", ekey, {0}, 3, 4096};
    for (int i = 0; i < ST_NONCE_BYTES; i++)
        id.nonce[i] = (uint8_t)(100 + i);
    static const char part[] = "the header part", other[] = "the layer 0 part";
    /* python3 (cryptography): sid, key = b"0123456789abcdef" * 2, b"a" * 32 + b"-" + b"b" * 32;
     * nonce = bytes(range(100, 116)); ku = HKDFExpand(hashes.SHA256(), 32,
     *     b"cacheblend-entry-key-v2\0" + sid + key + nonce).derive(bytes(range(32)));
     * AESGCM(ku).encrypt(struct.pack("<Q", 1) + bytes(4), b"", b"cacheblend-part-v2\0" + sid + key +
     *     nonce + struct.pack("<QQQQ", 1, 3, 4096, 15) + b"the header part").hex() */
    static const char want[] = "d9b19211c601f163f8456a8387f7f92b";
    char hex[2 * ST_TAG_BYTES + 1];
    CHECK(st_mac_upload(&m, &id) == NULL &&
          st_mac_part(NULL, &id, 1, part, strlen(part), tag) == -1); /* no key */
    CHECK_OK(st_mac_from_key(&m, K, &err));
    CHECK(strcmp(m.id, "42b36802331f4633") ==
          0); /* the key's id is v1's: HMAC-SHA256(K, "cacheblend-key-id-v1") */
    st_mac_ctx *c = st_mac_upload(&m, &id);
    CHECK(c != NULL);
    CHECK_OK(st_mac_part(c, &id, 1, part, strlen(part), tag));
    for (int i = 0; i < ST_TAG_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", tag[i]);
    CHECKF(strcmp(hex, want) == 0, "%s", hex);
    CHECK_OK(st_mac_part(c, &id, 2, other, strlen(other),
                         t2)); /* the context holds no state between parts */
    CHECK(st_mac_check(c, &id, 1, part, strlen(part), tag) == 1 &&
          st_mac_check(c, &id, 2, other, strlen(other), t2) == 1);

    tcase(
        "part MAC: binds the tier, the entry, the upload, the place, the count, the size, every byte");
    CHECK(st_mac_check(c, &id, 0, part, strlen(part), tag) == 0); /* another place */
    CHECK(st_mac_check(c, &id, 2, part, strlen(part), tag) == 0);
    CHECK(st_mac_check(c, &id, 2, part, strlen(part), tag) == 0 && /* two parts swapped */
          st_mac_check(c, &id, 1, other, strlen(other), t2) == 0 &&
          st_mac_check(c, &id, 1, other, strlen(other), tag) == 0);
    CHECK(st_mac_check(c, &id, 1, part, strlen(part) - 1, tag) == 0); /* cut short */
    char flipped[sizeof part];
    memcpy(flipped, part, sizeof part);
    flipped[3] ^= 1;
    CHECK(st_mac_check(c, &id, 1, flipped, strlen(part), tag) == 0); /* one bit */
    /* each changed field checked as a reader does (the upload's key derived
     * from what the metadata says) and under the right upload's key */
    st_part_id o = id;
    o.n_parts = 2;
    CHECK(mac_check_as(&m, &o, 1, part, tag) == 0 &&
          st_mac_check(c, &o, 1, part, strlen(part), tag) == 0); /* count */
    o = id;
    o.total = 4095;
    CHECK(mac_check_as(&m, &o, 1, part, tag) == 0 &&
          st_mac_check(c, &o, 1, part, strlen(part), tag) == 0); /* size */
    o = id;
    o.nonce[0] ^= 1;
    CHECK(mac_check_as(&m, &o, 1, part, tag) == 0 &&
          st_mac_check(c, &o, 1, part, strlen(part), tag) == 0); /* upload */
    char k2[66];
    memcpy(k2, ekey, sizeof k2);
    k2[64] = 'c';
    o = id;
    o.key = k2;
    CHECK(mac_check_as(&m, &o, 1, part, tag) == 0 &&
          st_mac_check(c, &o, 1, part, strlen(part), tag) == 0); /* entry */
    o = id;
    o.sid = "1123456789abcdef0123456789abcdef";
    CHECK(mac_check_as(&m, &o, 1, part, tag) == 0 &&
          st_mac_check(c, &o, 1, part, strlen(part), tag) == 0); /* tier */
    CHECK(mac_check_as(&m, &id, 1, part, tag) ==
          1); /* and unchanged, a reader's own context verifies */
    o = id;
    o.nonce[15] ^= 0x80; /* another upload of the same part: another key, another tag */
    st_mac_ctx *co = st_mac_upload(&m, &o);
    CHECK(co && st_mac_part(co, &o, 1, part, strlen(part), t3) == 0 &&
          memcmp(tag, t3, sizeof tag) != 0);
    st_mac_ctx_free(co);
    K[0] ^= 1;
    CHECK_OK(st_mac_from_key(&m2, K, &err));
    CHECK(mac_check_as(&m2, &id, 1, part, tag) == 0); /* another key */
    co = st_mac_upload(&m2, &id);
    CHECK(co && st_mac_part(co, &id, 1, part, strlen(part), t3) == 0 &&
          memcmp(tag, t3, sizeof tag) != 0 && strcmp(m.id, m2.id) != 0);
    st_mac_ctx_free(co);

    tcase("sealed part: AES-256-GCM under the upload's v3 HKDF key, the layout of cb-store(5), as "
          "Python's cryptography computes it; every field bound, nothing of a bad part left");
    /* python3 (cryptography): as above with "-v3" labels; ku = HKDFExpand(..., b"cacheblend-entry-key-v3\0"
     *     + sid + key + nonce).derive(bytes(range(32))); AESGCM(ku).encrypt(struct.pack("<Q", 1) +
     *     bytes(4), b"the header part", b"cacheblend-part-v3\0" + sid + key + nonce +
     *     struct.pack("<QQQQ", 1, 3, 4096, 15)).hex(): ciphertext, then the tag */
    static const char want_ct[] = "7786b2907e8f644a016cf7bd309fe2",
                      want_tag[] = "f72aaf076c1f3764ed836304c794696e";
    K[0] ^= 1; /* the key of the vector again */
    CHECK_OK(st_mac_from_key(&m2, K, &err));
    st_seal_ctx *sc = st_seal_upload(&m2, &id);
    char ct[sizeof part], pt[sizeof part], cthex[2 * sizeof part + 1];
    CHECK(sc != NULL && st_seal_part(sc, &id, 1, part, strlen(part), ct, tag) == 0);
    for (size_t i = 0; i < strlen(part); i++)
        snprintf(cthex + 2 * i, 3, "%02x", (uint8_t)ct[i]);
    for (int i = 0; i < ST_TAG_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", tag[i]);
    CHECKF(strcmp(cthex, want_ct) == 0 && strcmp(hex, want_tag) == 0, "%s %s", cthex, hex);
    CHECK(st_seal_open(sc, &id, 1, ct, strlen(part), pt, tag) == 1 &&
          memcmp(pt, part, strlen(part)) == 0);
    memcpy(pt, ct, sizeof ct); /* in place */
    CHECK(st_seal_open(sc, &id, 1, pt, strlen(part), pt, tag) == 1 &&
          memcmp(pt, part, strlen(part)) == 0);
    CHECK(st_seal_open(sc, &id, 2, ct, strlen(part), pt, tag) == 0); /* another place */
    static const char zero[sizeof part] = {0};
    CHECK(memcmp(pt, zero, strlen(part)) == 0); /* what it decrypted, wiped */
    ct[3] ^= 1;
    CHECK(st_seal_open(sc, &id, 1, ct, strlen(part), pt, tag) == 0); /* one bit */
    ct[3] ^= 1;
    o = id;
    o.total = 4095;
    CHECK(st_seal_open(sc, &o, 1, ct, strlen(part), pt, tag) == 0); /* size */
    o = id;
    o.n_parts = 4;
    CHECK(st_seal_open(sc, &o, 1, ct, strlen(part), pt, tag) == 0); /* count */
    o = id;
    o.nonce[0] ^= 1;
    st_seal_ctx *so = st_seal_upload(&m2, &o);
    CHECK(so && st_seal_open(so, &o, 1, ct, strlen(part), pt, tag) == 0); /* upload */
    st_seal_ctx_free(so);
    /* the v2 construction's key for the same upload is another: its GMAC
     * tag of an empty part is no GCM tag under the v3 key */
    co = st_mac_upload(&m2, &id);
    CHECK(co && st_mac_part(co, &id, 1, "", 0, t3) == 0 &&
          st_seal_part(sc, &id, 1, "", 0, ct, t2) == 0 && memcmp(t2, t3, sizeof t2) != 0);
    st_mac_ctx_free(co);
    st_seal_ctx_free(sc);
    CHECK(st_seal_upload(&(st_mac){0}, &id) == NULL); /* no key */
    uint8_t n1[ST_NONCE_BYTES], n2[ST_NONCE_BYTES];
    CHECK(st_mac_nonce(n1) == 0 && st_mac_nonce(n2) == 0 && memcmp(n1, n2, sizeof n1) != 0);
    st_mac_ctx_free(c);
    st_mac_free(&m);
    st_mac_free(&m2);

    tcase(
        "store.json names the secret files (relative to the store), the environment overrides them");
    char sdir[1200], conf[1300];
    snprintf(sdir, sizeof sdir, "%s/store", dir);
    snprintf(conf, sizeof conf, "%s/store.json", sdir);
    CHECK_OK(cb_store_init(sdir, NULL, 0, -1, &err));
    json_error_t je;
    json_t *root = json_load_file(conf, 0, &je);
    json_object_set_new(root, "shared",
                        json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", "shared", "url",
                                  "redis://127.0.0.1:1", "id", "0123456789abcdef0123456789abcdef",
                                  "auth_file", "cron.auth", "key_file", "../tier.key"));
    CHECK(json_dump_file(root, conf, 0) == 0);
    snprintf(q, sizeof q, "%s/cron.auth", sdir);
    write_secret(q, "cb-cron Pw-in-file\n", 0600);
    cb_store *s = NULL;
    cb_store_shared_auth sa;
    CHECK_OK(cb_store_open(&s, sdir, 0, &err));
    CHECK(s && cb_store_shared_auth_info(s, &sa, &err) == CB_OK && sa.authenticated &&
          sa.password && strcmp(sa.user, "cb-query") != 0 && strcmp(sa.user, "cb-cron") == 0 &&
          strlen(sa.key_id) == 16);
    cb_store_close(s);
    snprintf(q, sizeof q, "%s/query.auth", dir);
    write_secret(q, "cb-query other\n", 0600);
    setenv("CB_REDIS_AUTH_FILE", q, 1);
    setenv("CB_TIER_KEY_FILE", "", 1); /* empty: the recorded one */
    s = NULL;
    CHECK_OK(cb_store_open(&s, sdir, 0, &err));
    CHECK(s && cb_store_shared_auth_info(s, &sa, &err) == CB_OK &&
          strcmp(sa.user, "cb-query") == 0 && sa.authenticated);
    cb_store_close(s);
    snprintf(q, sizeof q, "%s/missing.key", dir);
    setenv("CB_TIER_KEY_FILE", q, 1);
    s = NULL;
    CHECK_OK(cb_store_open(&s, sdir, 0, &err));
    CHECK(s && cb_store_shared_auth_info(s, &sa, &err) == CB_ERR_NOT_FOUND &&
          strstr(err.msg, "missing.key"));
    cb_store_close(s);
    unsetenv("CB_REDIS_AUTH_FILE");
    unsetenv("CB_TIER_KEY_FILE");
    json_object_set_new(json_object_get(root, "shared"), "auth_file", json_integer(3));
    CHECK(json_dump_file(root, conf, 0) == 0);
    s = NULL;
    CHECK(cb_store_open(&s, sdir, 0, &err) == CB_ERR_FORMAT && s == NULL);
    json_decref(root);
    rmrf(dir);
}

static void test_fuzz_findings(void)
{
    char dir[1200], conf[1300];
    cb_store_tier tiers[2] = {{"a", "t/a", 0, 0, NULL, 0, NULL, NULL},
                              {"b", "t/b", 0, 0, NULL, 0, NULL, NULL}};
    cb_store *s = NULL;
    cb_error err;
    json_error_t je;

    tcase("open refuses a configuration whose tiers share a directory (fuzz finding)");
    snprintf(dir, sizeof dir, "%s/shared-tiers", work);
    snprintf(conf, sizeof conf, "%s/store.json", dir);
    CHECK_OK(cb_store_init(dir, tiers, 2, -1, &err));
    json_t *root = json_load_file(conf, 0, &je);
    json_t *t = root ? json_object_get(root, "tiers") : NULL;
    CHECK(json_array_size(t) == 2);
    if (json_array_size(t) == 2) {
        json_object_set_new(json_array_get(t, 1), "path", json_string("t/a/"));
        CHECK(json_dump_file(root, conf, 0) == 0);
        CHECK(cb_store_open(&s, dir, 0, &err) == CB_ERR_FORMAT && s == NULL);
        CHECKF(strstr(err.msg, "share") && strstr(err.msg, "tiers a and b"), "%s", err.msg);
    }
    json_decref(root);
    cb_store_close(s);
}

int main(int argc, char **argv)
{
    const char *tmp = getenv("CB_TEST_TMP");
    char model[1024], ram[1100];
    kvgen g;

    if (argc > 1 && strcmp(argv[1], "--make-kv") == 0)
        return make_kv(argc, argv);
    TEST_BEGIN();
    test_secrets(tmp && *tmp ? tmp : "tests/tmp");
    snprintf(model, sizeof model, "%s/tiny-f32.gguf", tmp && *tmp ? tmp : "tests/tmp");
    if (access(model, R_OK) != 0 || kvgen_open(&g, model) != 0) {
        tskip("store", "no fixture model (tests/run.sh generates tiny-f32.gguf)");
        TEST_END();
    }
    snprintf(work, sizeof work, "%s/store.%d", tmp && *tmp ? tmp : "tests/tmp", (int)getpid());
    rmrf(work);
    mkdir(work, 0755);
    /* A RAM tier where there is one, so that moves cross filesystems. */
    if (access("/dev/shm", W_OK) == 0)
        snprintf(ram, sizeof ram, "/dev/shm/cb-test-store.%d", (int)getpid());
    else
        snprintf(ram, sizeof ram, "%s/ram", work);
    mkdir(ram, 0755);

    test_basics(&g);
    test_tiers(&g, ram);
    test_gc_verify(&g);
    test_archive(&g);
    test_import_bomb(&g);
    test_readonly(&g);
    test_fuzz_findings();
    show_problems = 1;
    test_concurrency(&g, ram);

    kvgen_close(&g);
    rmrf(ram);
    rmrf(work);
    TEST_END();
}
