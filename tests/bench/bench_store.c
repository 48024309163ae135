/* bench_store - latency and throughput of the tiered store per tier:
 *   put      cb_store_put of a KV file (reserve, write, fsync, verify,
 *            rename, index), one entry at a time
 *   get      cb_store_acquire + reading the whole file + cb_store_release,
 *            from the page cache ("hot") and, on a disk tier, after
 *            dropping the file's pages (posix_fadvise DONTNEED, "cold")
 *   acquire  cb_store_acquire + release alone (index and lock overhead)
 *   demote   put into a full RAM tier whose LRU entry moves to the disk tier
 *   shared   with $CB_BENCH_REDIS (redis://127.0.0.1:PORT or unix:///PATH,
 *            a server of the bench's own; tests/bench/run.sh starts one):
 *            put = cb_store_put into a store whose local tier has no room,
 *            so that the entry goes to the shared tier alone (upload and
 *            commit script); get = cb_store_acquire of an entry that only
 *            the shared tier holds (fetch, checksum, verification, kept in
 *            the local RAM tier) + reading it; fetch+layers = the same
 *            through cb_store_open_kv with $CB_STORE_STREAM=0, then every
 *            layer read (verified, converted to f32) as cb-run's loader
 *            reads it; stream = cb_store_open_kv streaming the entry from
 *            Redis while those layers are read; stream+mac = the same from a
 *            tier whose entries are sealed with AES-256-GCM (a tier key made
 *            by cb_store_keygen; every part decrypted and its tag checked as
 *            it arrives),
 *            measured alternately with stream, entry by entry, so that both
 *            see the same load on a shared machine
 * KV files are real: MODEL prefills TOKENS tokens once and cb_kv_serialize
 * writes them (f16) under ENTRIES different token lists.
 *
 * usage: bench_store MODEL [TOKENS[,TOKENS...]] [ENTRIES]
 *   RAM tier in $CB_BENCH_RAM (default /dev/shm), disk tier in
 *   $CB_BENCH_DISK (default /var/tmp).
 * Prints "key value" lines (for tests/bench/run.sh) and a table. */
#include "../../lib/store/store.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define TMPFS_MAGIC_ 0x01021994

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

typedef struct stats {
    double p50, p95, mean, mb_s;
} stats;

/* Latencies in seconds of n operations on `bytes` bytes each. */
static stats summarize(double *t, int n, double bytes)
{
    stats s;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += t[i];
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    s.p50 = t[n / 2] * 1e3;
    s.p95 = t[(n * 95 + 99) / 100 - 1] * 1e3;
    s.mean = sum / n * 1e3;
    s.mb_s = bytes * n / sum / 1e6;
    return s;
}

static void emit(const char *tier, const char *op, int tokens, stats s)
{
    printf("store_%s_%s_%d_ms_p50 %.3f\n", tier, op, tokens, s.p50);
    printf("store_%s_%s_%d_ms_p95 %.3f\n", tier, op, tokens, s.p95);
    printf("store_%s_%s_%d_mb_s %.1f\n", tier, op, tokens, s.mb_s);
}

typedef struct row {
    char what[64];
    stats s;
} row;
static row table[64];
static int n_table;

static void record(const char *tier, const char *op, int tokens, stats s)
{
    emit(tier, op, tokens, s);
    if (n_table < 64) {
        snprintf(table[n_table].what, sizeof table[n_table].what, "%-5s %-12s %4d tok", tier, op,
                 tokens);
        table[n_table++].s = s;
    }
}

static int read_all(const char *path, char *buf, size_t cap, int drop)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t r;
    size_t n = 0;
    if (fd < 0)
        return -1;
    if (drop)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    while ((r = read(fd, buf + n, cap - n > (1 << 22) ? (1 << 22) : cap - n)) > 0)
        n += (size_t)r;
    close(fd);
    return r < 0 ? -1 : 0;
}

/* Drop a file's pages from the page cache (it is clean: fsynced). */
static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

typedef struct kv {
    void *data;
    size_t size;
    char key[66];
} kv;

static int bench_tier(const char *name, const char *tier_dir, const char *base, kv *e, int n,
                      int tokens, char *buf, size_t cap, int cold)
{
    char dir[4200];
    cb_store *s = NULL;
    cb_error err;
    double *t = calloc((size_t)n * 4, sizeof *t);
    cb_store_tier tier = {name, tier_dir, 0, 0, NULL, 0, NULL, NULL};

    snprintf(dir, sizeof dir, "%s/store-%s-%d", base, name, tokens);
    if (!t || cb_store_init(dir, &tier, 1, 0, &err) != CB_OK ||
        cb_store_open(&s, dir, 0, &err) != CB_OK) {
        fprintf(stderr, "bench_store: %s\n", err.msg);
        free(t);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        double t0 = now();
        if (cb_store_put(s, e[i].key, e[i].data, e[i].size, &err) != CB_OK) {
            fprintf(stderr, "bench_store: put: %s\n", err.msg);
            return -1;
        }
        t[i] = now() - t0;
    }
    record(name, "put", tokens, summarize(t, n, (double)e[0].size));
    for (int pass = 0; pass < (cold ? 2 : 1); pass++) {
        int m = 0;
        for (int r = 0; r < (pass ? 1 : 3); r++)
            for (int i = 0; i < n; i++) {
                cb_store_ref *ref;
                const char *path;
                if (pass) {
                    char p[4400];
                    snprintf(p, sizeof p, "%s/%s.kv", tier_dir, e[i].key);
                    drop_cache(p);
                }
                double t0 = now();
                if (cb_store_acquire(s, e[i].key, &ref, &path, &err) != CB_OK ||
                    read_all(path, buf, cap, 0) != 0) {
                    fprintf(stderr, "bench_store: get: %s\n", err.msg);
                    return -1;
                }
                cb_store_release(ref);
                t[m++] = now() - t0;
            }
        record(name, pass ? "get-cold" : "get-hot", tokens, summarize(t, m, (double)e[0].size));
    }
    {
        int m = 0;
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < n; i++) {
                cb_store_ref *ref;
                double t0 = now();
                if (cb_store_acquire(s, e[i].key, &ref, NULL, &err) != CB_OK)
                    return -1;
                cb_store_release(ref);
                t[m++] = now() - t0;
            }
        record(name, "acquire", tokens, summarize(t, m, (double)e[0].size));
    }
    cb_store_close(s);
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    nftw(tier_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(t);
    return 0;
}

/* Every layer of kf read, verified and converted to f32: 0, or -1. */
static int read_layers(cb_kvfile *kf, cb_error *err)
{
    const cb_kv_meta *mt = cb_kvfile_meta(kf);
    size_t per = (size_t)mt->n_tokens * (size_t)(mt->n_head_kv * mt->head_dim);
    float *k = malloc(sizeof(float) * per), *v = malloc(sizeof(float) * per);
    int rc = k && v ? 0 : -1;
    for (int32_t l = 0; rc == 0 && l < mt->n_layer; l++)
        rc = cb_kvfile_read_layer(kf, l, k, v, err) == CB_OK ? 0 : -1;
    free(k);
    free(v);
    return rc;
}

/* One entry opened through cb_store_open_kv (streamed unless
 * $CB_STORE_STREAM=0) and every layer read, after its local copy is
 * removed; the seconds it took, or -1. */
static double open_read(cb_store *s, const kv *e, int want_tier, const char *what)
{
    cb_store_ref *ref;
    cb_kvfile *kf;
    cb_error err;
    cb_store_remove(s, e->key, NULL); /* only the shared tier holds it */
    double t0 = now();
    if (cb_store_open_kv(s, e->key, &kf, &ref, &err) != CB_OK || read_layers(kf, &err) != 0 ||
        cb_store_ref_tier(ref) != want_tier) {
        fprintf(stderr, "bench_store: shared %s: %s\n", what, err.msg);
        return -1;
    }
    cb_kvfile_free(kf);
    cb_store_release(ref);
    return now() - t0;
}

/* The shared tier on Redis at url: put through a local tier without room,
 * get of entries that only it holds; the same streamed from a tier whose
 * entries are sealed (named sharedmac: a namespace of its own). */
static int bench_shared(const char *url, const char *ram, const char *base, kv *e, int n,
                        int tokens, char *buf, size_t cap)
{
    char dir_p[4200], dir_g[4200], dir_m[4200], dir_mg[4200], tp[4300], tg[4300], tm[4300],
        tmg[4300], key[4300];
    cb_store *sp = NULL, *sg = NULL, *sm = NULL, *smg = NULL;
    cb_error err;
    double *t = calloc((size_t)n * 3, sizeof *t), *tk = calloc((size_t)n * 3, sizeof *tk);
    snprintf(dir_p, sizeof dir_p, "%s/store-shared-put-%d", base, tokens);
    snprintf(dir_g, sizeof dir_g, "%s/store-shared-get-%d", base, tokens);
    snprintf(dir_m, sizeof dir_m, "%s/store-sharedmac-put-%d", base, tokens);
    snprintf(dir_mg, sizeof dir_mg, "%s/store-sharedmac-get-%d", base, tokens);
    snprintf(tp, sizeof tp, "%s-sp%d", ram, tokens);
    snprintf(tg, sizeof tg, "%s-sg%d", ram, tokens);
    snprintf(tm, sizeof tm, "%s-sm%d", ram, tokens);
    snprintf(tmg, sizeof tmg, "%s-smg%d", ram, tokens);
    snprintf(key, sizeof key, "%s/tier-%d.key", base, tokens);
    cb_store_tier a[2] = {{"local", tp, 1, 0, NULL, 0, NULL, NULL},
                          {"shared", NULL, 0, 0, url, 5000, NULL, NULL}};
    cb_store_tier b[2] = {{"local", tg, 0, 0, NULL, 0, NULL, NULL},
                          {"shared", NULL, 0, 0, url, 5000, NULL, NULL}};
    cb_store_tier c[2] = {{"local", tm, 1, 0, NULL, 0, NULL, NULL},
                          {"sharedmac", NULL, 0, 0, url, 5000, NULL, key}};
    cb_store_tier d[2] = {{"local", tmg, 0, 0, NULL, 0, NULL, NULL},
                          {"sharedmac", NULL, 0, 0, url, 5000, NULL, key}};
    if (!t || !tk || cb_store_init(dir_p, a, 2, 0, &err) != CB_OK ||
        cb_store_open(&sp, dir_p, 0, &err) != CB_OK ||
        cb_store_init(dir_g, b, 2, 0, &err) != CB_OK ||
        cb_store_open(&sg, dir_g, 0, &err) != CB_OK || cb_store_keygen(key, &err) != CB_OK ||
        cb_store_init(dir_m, c, 2, 0, &err) != CB_OK ||
        cb_store_open(&sm, dir_m, 0, &err) != CB_OK ||
        cb_store_init(dir_mg, d, 2, 0, &err) != CB_OK ||
        cb_store_open(&smg, dir_mg, 0, &err) != CB_OK) {
        fprintf(stderr, "bench_store: shared tier %s: %s\n", url, err.msg);
        free(t);
        free(tk);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        double t0 = now();
        if (cb_store_put(sp, e[i].key, e[i].data, e[i].size, &err) != CB_OK) {
            fprintf(stderr, "bench_store: shared put: %s\n", err.msg);
            return -1;
        }
        t[i] = now() - t0;
    }
    record("shared", "put", tokens, summarize(t, n, (double)e[0].size));
    int m = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < n; i++) {
            cb_store_ref *ref;
            const char *path;
            cb_store_remove(sg, e[i].key, NULL); /* only the shared tier holds it */
            double t0 = now();
            if (cb_store_acquire(sg, e[i].key, &ref, &path, &err) != CB_OK ||
                read_all(path, buf, cap, 0) != 0 || cb_store_ref_tier(ref) != 0) {
                fprintf(stderr, "bench_store: shared get: %s\n", err.msg);
                return -1;
            }
            cb_store_release(ref);
            t[m++] = now() - t0;
        }
    record("shared", "get", tokens, summarize(t, m, (double)e[0].size));
    /* What cb-run's loader does with such an entry: fetched whole then read
     * layer by layer ($CB_STORE_STREAM=0, as before streaming), or streamed;
     * streamed, entry by entry, from the plain tier and the authenticated one. */
    for (int i = 0; i < n; i++)
        if (cb_store_put(sm, e[i].key, e[i].data, e[i].size, &err) != CB_OK) {
            fprintf(stderr, "bench_store: sharedmac put: %s\n", err.msg);
            return -1;
        }
    m = 0;
    setenv("CB_STORE_STREAM", "0", 1);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < n; i++)
            if ((t[m++] = open_read(sg, &e[i], 0, "fetch+layers")) < 0)
                return -1;
    unsetenv("CB_STORE_STREAM");
    record("shared", "fetch+layers", tokens, summarize(t, m, (double)e[0].size));
    m = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < n; i++, m++)
            if ((t[m] = open_read(sg, &e[i], 1, "stream")) < 0 ||
                (tk[m] = open_read(smg, &e[i], 1, "stream+mac")) < 0)
                return -1;
    record("shared", "stream", tokens, summarize(t, m, (double)e[0].size));
    record("shared", "stream+mac", tokens, summarize(tk, m, (double)e[0].size));
    cb_store_close(sp);
    cb_store_close(sg);
    cb_store_close(sm);
    cb_store_close(smg);
    nftw(tp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    nftw(tg, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    nftw(tm, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    nftw(tmg, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(t);
    free(tk);
    return 0;
}

/* A 2-entry RAM tier over a disk tier: every put past the second demotes. */
static int bench_demote(const char *ram, const char *disk, const char *base, kv *e, int n,
                        int tokens)
{
    char dir[4200];
    cb_store *s = NULL;
    cb_error err;
    double *t = calloc((size_t)n, sizeof *t);
    cb_store_tier tiers[] = {{"ram", ram, 2 * (uint64_t)e[0].size, 0, NULL, 0, NULL, NULL},
                             {"disk", disk, 0, 0, NULL, 0, NULL, NULL}};
    snprintf(dir, sizeof dir, "%s/store-demote-%d", base, tokens);
    if (!t || cb_store_init(dir, tiers, 2, 1, &err) != CB_OK ||
        cb_store_open(&s, dir, 0, &err) != CB_OK) {
        fprintf(stderr, "bench_store: %s\n", err.msg);
        free(t);
        return -1;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now();
        if (cb_store_put(s, e[i].key, e[i].data, e[i].size, &err) != CB_OK)
            return -1;
        if (i >= 2)
            t[m++] = now() - t0;
    }
    if (m > 0)
        record("ram", "put+demote", tokens, summarize(t, m, (double)e[0].size));
    /* Promotion: a get of a disk entry moves it up (demoting another). */
    m = 0;
    for (int i = 0; i + 2 < n; i++) {
        cb_store_ref *ref;
        double t0 = now();
        if (cb_store_acquire(s, e[i].key, &ref, NULL, &err) != CB_OK)
            return -1;
        cb_store_release(ref);
        t[m++] = now() - t0;
    }
    if (m > 0)
        record("disk", "get+promote", tokens, summarize(t, m, (double)e[0].size));
    cb_store_close(s);
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    nftw(ram, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    nftw(disk, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    const char *ram_base = getenv("CB_BENCH_RAM") ? getenv("CB_BENCH_RAM") : "/dev/shm";
    const char *disk_base = getenv("CB_BENCH_DISK") ? getenv("CB_BENCH_DISK") : "/var/tmp";
    const char *tok_list = argc > 2 ? argv[2] : "512,32";
    int n = argc > 3 ? atoi(argv[3]) : 16;
    char base[4096], ram[4200], disk[4200];
    struct statfs fs;
    cb_model *m = NULL;
    cb_error err;

    if (argc < 2 || n < 3) {
        fprintf(stderr, "usage: bench_store MODEL [TOKENS[,TOKENS...]] [ENTRIES >= 3]\n");
        return 64;
    }
    if (cb_model_load(&m, argv[1], NULL, &err) != CB_OK) {
        fprintf(stderr, "bench_store: %s\n", err.msg);
        return 66;
    }
    snprintf(base, sizeof base, "%s/cb-bench-store.%d", disk_base, (int)getpid());
    mkdir(base, 0755);
    if (statfs(disk_base, &fs) == 0 && fs.f_type == TMPFS_MAGIC_)
        fprintf(stderr,
                "bench_store: note: %s is a tmpfs, the disk tier is in RAM (set CB_BENCH_DISK)\n",
                disk_base);
    printf("store_model %s\n", argv[1]);
    char *list = strdup(tok_list);
    for (char *tk = strtok(list, ","); tk; tk = strtok(NULL, ",")) {
        int tokens = atoi(tk);
        cb_kvcache *cache = NULL;
        cb_fwd *f = NULL;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)tokens);
        int n_vocab = cb_model_hparams(m)->n_vocab;
        kv *e = calloc((size_t)n, sizeof *e);
        if (tokens < 1 || !ids || !e || cb_kvcache_new(&cache, m, tokens, CB_TYPE_F16) != CB_OK ||
            cb_fwd_new(&f, m, tokens) != CB_OK) {
            fprintf(stderr, "bench_store: bad token count %s\n", tk);
            return 64;
        }
        for (int i = 0; i < tokens; i++)
            ids[i] = (i * 131 + 17) % n_vocab;
        double t0 = now();
        if (cb_model_eval(f, cache, ids, tokens, 0, NULL) != CB_OK)
            return 70;
        double prefill = now() - t0;
        for (int i = 0; i < n; i++) {
            ids[0] =
                i; /* a different chunk: another key (the KV is the same, which storage ignores) */
            if (cb_kv_serialize(m, cache, NULL, 0, ids, tokens, 0, CB_TYPE_F16, &e[i].data,
                                &e[i].size) != CB_OK)
                return 70;
            cb_kv_key(cb_model_fingerprint(m), cb_kv_tokens_hash(NULL, 0, ids, tokens), e[i].key);
        }
        printf("store_entry_%d_bytes %zu\nstore_prefill_%d_ms %.1f\n", tokens, e[0].size, tokens,
               prefill * 1e3);
        fprintf(stderr,
                "bench_store: %d tokens: entries of %.2f MB; prefill of the chunk took %.1f ms\n",
                tokens, e[0].size / 1e6, prefill * 1e3);
        size_t cap = e[0].size + 4096;
        char *buf = malloc(cap);
        snprintf(ram, sizeof ram, "%s/cb-bench-ram.%d", ram_base, (int)getpid());
        snprintf(disk, sizeof disk, "%s/disk-tier", base);
        if (bench_tier("ram", ram, base, e, n, tokens, buf, cap, 0) != 0 ||
            bench_tier("disk", disk, base, e, n, tokens, buf, cap, 1) != 0 ||
            bench_demote(ram, disk, base, e, n, tokens) != 0)
            return 70;
        if (getenv("CB_BENCH_REDIS") && *getenv("CB_BENCH_REDIS") &&
            bench_shared(getenv("CB_BENCH_REDIS"), ram, base, e, n, tokens, buf, cap) != 0)
            return 70;
        for (int i = 0; i < n; i++)
            free(e[i].data);
        free(e);
        free(buf);
        free(ids);
        cb_fwd_free(f);
        cb_kvcache_free(cache);
    }
    free(list);
    nftw(base, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    fprintf(stderr, "%-28s %9s %9s %10s\n", "tier op (entry size)", "p50 ms", "p95 ms", "MB/s");
    for (int i = 0; i < n_table; i++) {
        if (strstr(table[i].what, "acquire"))
            fprintf(stderr, "%-28s %9.3f %9.3f %10s\n", table[i].what, table[i].s.p50,
                    table[i].s.p95, "-");
        else
            fprintf(stderr, "%-28s %9.3f %9.3f %10.1f\n", table[i].what, table[i].s.p50,
                    table[i].s.p95, table[i].s.mb_s);
    }
    cb_model_free(m);
    return 0;
}
