/* cb-profile - measure what the loading controller needs, on this machine:
 * full-prefill time per layer at several prompt lengths, selective
 * recompute time per layer at several ratios, probe's scoring step, and
 * the KV read throughput of every store tier, cold and warm, and from them
 * the figures cb-run's --speedup cost model prices loading, attention and
 * scoring with.  Writes the profile into the store and prints a table. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: cb-profile [-m MODEL] [--store DIR] [--lengths L,...] [--ratios R,...]\n"
               "                  [--repeat N] [-o md|json] [--plot FILE.png] [-t N]\n"
               "\n"
               "Measure full-prefill, selective-recompute and scoring time per layer and the KV\n"
               "load throughput of every tier of the store (cold and warm), write the profile\n"
               "into the store (profile-<model>-<backend>.json), and print a table.\n"
               "\n"
               "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model)\n"
               "      --store DIR    the store (default: $CB_STORE, else\n"
               "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/store)\n"
               "      --lengths LIST prompt lengths (default 512,1024,2048,4096,8192, up to the\n"
               "                     model's context)\n"
               "      --ratios LIST  recompute ratios (default 0.05,0.1,0.15,0.25,0.5)\n"
               "      --repeat N     repeats of each measurement; the median is kept (default 3)\n"
               "      --no-write     measure and print, but do not write the profile\n"
               "  -o, --output FMT   md (default) or json\n"
               "      --plot FILE    the curves as a PNG (needs gnuplot)\n"
               "  -t, --threads N    compute threads (default: every core)\n" CLI_DEVICE_HELP
               "  -v, --verbose      progress on stderr\n"
               "  -q, --quiet        print nothing but errors\n"
               "  -h, --help         this help\n"
               "      --version      print the version\n"
               "\n"
               "Exit status: 0 success, 64 usage error, 65 bad model, 66 missing model or\n"
               "store, 69 compute device not available or failed (a device fault), 70\n"
               "internal error, 73 cannot write the profile, 74 I/O error.\n");
}

enum { OPT_LENGTHS = 256, OPT_RATIOS, OPT_REPEAT, OPT_PLOT, OPT_NOWRITE };

/* the rows whose scoring step is timed: about a question's (a blend's first
 * pass scores with the question's uncached rows) */
#define SCORE_ROWS 32

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median and (max - min) / median of n samples (sorted in place) */
static double median(double *x, int n, double *spread)
{
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    double m = n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
    *spread = m > 0 ? (x[n - 1] - x[0]) / m : 0;
    return m;
}

static int parse_list(const char *s, double *out, int max, double lo, double hi)
{
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(t, &end);
        if (*end || end == t || v < lo || v > hi || n == max) {
            free(dup);
            return -1;
        }
        out[n++] = v;
    }
    free(dup);
    return n;
}

/* Drop a file's pages from the page cache, so the next read comes from the device. */
static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Load every layer of an open KV file the way cb-run's loader does: read
 * it from the tier, verify it, and place it in kv, a cache on the compute
 * device, at position 0 (the f16 rows sent as they are).  The file is freed
 * here.  Returns its MB/s from t0, or -1. */
static double load_kv(const cb_model *m, cb_kvfile *kf, double t0, cb_kvcache *kv, cb_error *err)
{
    const cb_kv_meta *mt = cb_kvfile_meta(kf);
    for (int32_t l = 0; l < mt->n_layer; l++)
        if (cb_kvfile_load_layer(kf, l, kv, 0, err) != CB_OK) {
            cb_kvfile_free(kf);
            return -1;
        }
    if (cb_model_sync(m) != CB_OK) { /* on a GPU, until the copies are done */
        cb_kvfile_free(kf);
        return -1;
    }
    double mb = (double)cb_kvfile_size(kf) / 1e6, ms = cb_now_ms() - t0;
    cb_kvfile_free(kf);
    return mb / (ms / 1e3);
}

static double load_all(const cb_model *m, const char *path, cb_kvcache *kv, cb_error *err)
{
    cb_kvfile *kf;
    double t0 = cb_now_ms();
    if (cb_kvfile_open(&kf, path, err) != CB_OK)
        return -1;
    return load_kv(m, kf, t0, kv, err);
}

typedef struct popts {
    cli_common co;
    const char *plot, *fmt;
    double lens[16], ratios[16];
    int n_lens, n_ratios, repeat, write, lens_given;
} popts;

static int parse_args(int argc, char **argv, popts *o)
{
    static const struct option opts[] = {
        {"lengths", required_argument, 0, OPT_LENGTHS},
        {"ratios", required_argument, 0, OPT_RATIOS},
        {"repeat", required_argument, 0, OPT_REPEAT},
        {"output", required_argument, 0, 'o'},
        {"plot", required_argument, 0, OPT_PLOT},
        {"no-write", no_argument, 0, OPT_NOWRITE},
        CLI_COMMON_OPTS,
        CLI_STORE_OPT,
        CLI_DEVICE_OPT,
        CLI_ACT8_OPT,
        {0, 0, 0, 0},
    };
    int c, r;
    while ((c = cli_getopt(argc, argv, "o:" CLI_COMMON_SHORT, opts)) != -1) {
        if ((r = cli_common_opt(&o->co, c, optarg, usage)) != CLI_NOT_COMMON) {
            if (r != CLI_CONTINUE)
                return r;
            continue;
        }
        switch (c) {
        case OPT_LENGTHS:
            if ((o->n_lens = parse_list(optarg, o->lens, 16, 2, 1 << 20)) < 1) {
                cli_err("--lengths %s: give up to 16 lengths, e.g. 512,1024", optarg);
                return CLI_EX_USAGE;
            }
            o->lens_given = 1;
            break;
        case OPT_RATIOS:
            if ((o->n_ratios = parse_list(optarg, o->ratios, 16, 0.001, 1)) < 1) {
                cli_err("--ratios %s: give up to 16 ratios in (0, 1]", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case OPT_REPEAT:
            o->repeat = atoi(optarg);
            if (o->repeat < 1 || o->repeat > 100) {
                cli_err("--repeat %s: 1 to 100", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case 'o':
            if (strcmp(optarg, "md") && strcmp(optarg, "json")) {
                cli_err("-o %s: md or json", optarg);
                return CLI_EX_USAGE;
            }
            o->fmt = optarg;
            break;
        case OPT_PLOT: o->plot = optarg; break;
        case OPT_NOWRITE: o->write = 0; break;
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("unexpected argument '%s'", argv[optind]);
        return CLI_EX_USAGE;
    }
    return -1;
}

/* Full prefill of L tokens, whole prompt in one batch like a blend does,
 * then selective recompute at every ratio, then probe's scoring: one
 * prefill point, n_ratios recompute points and one scoring point added to
 * prof. */
static int measure_length(const cb_model *m, const popts *o, int64_t L, double *samples,
                          cb_profile *prof)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)L),
            *rows = malloc(sizeof(int32_t) * (size_t)L);
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_status st = toks && rows ? CB_OK : CB_ERR_NOMEM;
    int code = 0;

    if (st != CB_OK || (st = cb_kvcache_new(&kv, m, (int32_t)L, CB_TYPE_F16)) != CB_OK ||
        (st = cb_fwd_new(&f, m, (int32_t)L)) != CB_OK)
        goto fail;
    for (int64_t i = 0; i < L; i++)
        toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    for (int r = 0; r < o->repeat; r++) {
        double t0 = cb_now_ms();
        int32_t *pos = rows;
        for (int64_t i = 0; i < L; i++)
            pos[i] = (int32_t)i;
        st = cb_fwd_embed(f, toks, pos, (int32_t)L);
        for (int32_t l = 0; l < hp->n_layer && st == CB_OK; l++)
            st = cb_fwd_layer(f, kv, l, NULL, 0);
        if (st != CB_OK || (st = cb_model_sync(m)) != CB_OK) /* a device queues the work */
            goto fail;
        samples[r] = (cb_now_ms() - t0) / hp->n_layer;
    }
    cb_profile_point *pp = &prof->prefill[prof->n_prefill++];
    pp->length = L;
    pp->ratio = 1.0;
    pp->ms_per_layer = median(samples, o->repeat, &pp->spread);
    cli_info("length %lld: full prefill %.2f ms per layer", (long long)L, pp->ms_per_layer);
    /* selective recompute: a ratio of rows, spread over the prompt, at a
     * middle layer, attending over the whole (filled) cache */
    for (int ri = 0; ri < o->n_ratios; ri++) {
        int32_t n = (int32_t)(o->ratios[ri] * (double)L + 0.5);
        if (n < 1)
            n = 1;
        for (int32_t i = 0; i < n; i++)
            rows[i] = (int32_t)((int64_t)i * L / n);
        rows[n - 1] = (int32_t)(L - 1);
        int32_t layer = hp->n_layer / 2;
        for (int r = 0; r < o->repeat; r++) {
            double t0 = cb_now_ms();
            if ((st = cb_fwd_layer(f, kv, layer, rows, n)) != CB_OK ||
                (st = cb_model_sync(m)) != CB_OK)
                goto fail;
            samples[r] = cb_now_ms() - t0;
        }
        cb_profile_point *rp = &prof->recompute[prof->n_recompute++];
        rp->length = L;
        rp->ratio = o->ratios[ri];
        rp->ms_per_layer = median(samples, o->repeat, &rp->spread);
        cli_info("length %lld: ratio %.2f recompute %.2f ms per layer", (long long)L, o->ratios[ri],
                 rp->ms_per_layer);
    }
    /* probe's scoring: a question's rows at the end of the prompt, at the middle layer */
    cb_profile_scoring *sp = &prof->scoring[prof->n_scoring];
    sp->length = L;
    sp->rows = L < SCORE_ROWS ? L : SCORE_ROWS;
    if ((st = cb_profile_time_score(f, kv, hp->n_layer / 2, (int32_t)L, (int32_t)sp->rows,
                                    o->repeat, samples, &sp->keys)) != CB_OK)
        goto fail;
    sp->ms_per_layer = median(samples, o->repeat, &sp->spread);
    prof->n_scoring++;
    cli_info("length %lld: scoring %lld rows %.3f ms per layer", (long long)L, (long long)sp->rows,
             sp->ms_per_layer);
    goto done;
fail:
    cli_err("length %lld: %s", (long long)L, cb_model_strerror(m, st));
    code = cli_exit_code(st);
done:
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    free(toks);
    free(rows);
    return code;
}

/* A test KV file of L f16 tokens, in memory. */
static int test_kvfile(const cb_model *m, int32_t L, void **buf, size_t *size)
{
    int32_t n_vocab = cb_model_hparams(m)->n_vocab;
    cb_tokens lead = {0};
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)L);
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_status st = toks ? CB_OK : CB_ERR_NOMEM;

    for (int32_t i = 0; toks && i < L; i++)
        toks[i] = (int32_t)((i * 104729 + 7) % n_vocab);
    if (st == CB_OK && (st = cb_kv_lead_in(m, &lead)) == CB_OK &&
        (st = cb_kvcache_new(&kv, m, L + (int32_t)lead.n, CB_TYPE_F32)) == CB_OK &&
        (st = cb_fwd_new(&f, m, 512)) == CB_OK)
        st = cb_kv_precompute(f, kv, lead.ids, (int32_t)lead.n, toks, L, CB_TYPE_F16, buf, size);
    if (st != CB_OK)
        cli_err("cannot build the test KV file: %s", cb_model_strerror(m, st));
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_tokens_free(&lead);
    free(toks);
    return st == CB_OK ? 0 : cli_exit_code(st);
}

/* The shared tier (Redis), when the store has one: an entry only it
 * holds, opened and loaded layer by layer as it streams in (its header
 * and every layer checked), as cb-run's loader does on a host that has
 * not seen the chunk; cold and warm alike (Redis keeps values in memory).
 * The test entry is dropped from the shared tier afterwards. */
static void measure_shared(const cb_model *m, cb_store *store, int repeat, const void *buf,
                           size_t size, cb_kvcache *lkv, cb_profile *prof)
{
    cb_store_tier_stat sh;
    cb_error err;
    char key[66];
    double t[16], sc;
    int n = 0;
    if (cb_store_shared_stat(store, &sh, &err) != CB_OK) {
        if (err.status != CB_ERR_NOT_FOUND)
            cli_err("warning: %s; the shared tier is not measured", err.msg);
        return;
    }
    cb_hash128 mh, th; /* the file's model and token hash (cbkv(5): offsets 16 and 32) */
    if (size >= 48) {
        memcpy(&mh.lo, (const char *)buf + 16, 8);
        memcpy(&mh.hi, (const char *)buf + 24, 8);
        memcpy(&th.lo, (const char *)buf + 32, 8);
        memcpy(&th.hi, (const char *)buf + 40, 8);
        cb_kv_key(mh, th, key);
    }
    if (prof->n_tiers >= 16 || size < 48 || cb_store_put(store, key, buf, size, &err) != CB_OK) {
        cli_err("warning: shared tier %s: the test entry cannot be stored; not measured", sh.name);
        return;
    }
    if (repeat > 16)
        repeat = 16;
    for (int r = 0; r < repeat; r++) {
        cb_store_ref *ref;
        cb_kvfile *kf;
        cb_store_remove(store, key, NULL); /* only the shared tier holds it */
        double t0 = cb_now_ms();
        if (cb_store_open_kv(store, key, &kf, &ref, &err) != CB_OK)
            break;
        double mbs = load_kv(m, kf, t0, lkv, &err);
        double ms = cb_now_ms() - t0;
        cb_store_release(ref);
        if (mbs <= 0)
            break;
        t[n++] = (double)size / 1e6 / (ms / 1e3);
    }
    cb_store_remove(store, key, NULL);
    cb_store_shared_drop(store, key, NULL);
    if (n < repeat) {
        cli_err("warning: shared tier %s: a get failed (%s); not measured", sh.name, err.msg);
        return;
    }
    cb_profile_tier *pt = &prof->tiers[prof->n_tiers++];
    snprintf(pt->name, sizeof pt->name, "%s", sh.name);
    pt->cold_mbs = pt->warm_mbs = median(t, n, &sc);
    cli_info("tier %s (shared): %.0f MB/s", sh.name, pt->cold_mbs);
}

/* KV load throughput of every tier: a 1024-token f16 KV file, cold and warm. */
static int measure_tiers(const cb_model *m, cb_store *store, int repeat, cb_profile *prof)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int32_t L = 1024 < hp->n_ctx_train - 8 ? 1024 : hp->n_ctx_train - 8;
    cb_kvcache *lkv = NULL; /* where the loads land: cb-run's f16 cache on the device */
    void *buf = NULL;
    size_t size = 0;
    cb_error err;
    cb_status st;
    int code = test_kvfile(m, L, &buf, &size);

    if (code == 0 && (st = cb_kvcache_new(&lkv, m, L, CB_TYPE_F16)) != CB_OK) {
        cli_err("a %d-token cache: %s", L, cb_model_strerror(m, st));
        code = cli_exit_code(st);
    }
    for (int t = 0; code == 0 && t < cb_store_n_tiers(store) && t < 16; t++) {
        cb_store_tier ti;
        char path[4096 + 64];
        if (cb_store_tier_info(store, t, &ti) != CB_OK)
            continue;
        snprintf(path, sizeof path, "%s/.cb-profile-%ld.tmp", ti.path, (long)getpid());
        if (cb_file_write_atomic(path, buf, size, &err) != CB_OK) {
            cli_err("tier %s: %s", ti.name, err.msg);
            continue;
        }
        double cold[16], warm[16], sc, sw;
        if (repeat > 16)
            repeat = 16; /* the samples kept */
        for (int r = 0; r < repeat; r++) {
            drop_cache(path);
            cold[r] = load_all(m, path, lkv, &err);
            warm[r] = load_all(m, path, lkv, &err);
        }
        unlink(path);
        cb_profile_tier *pt = &prof->tiers[prof->n_tiers++];
        snprintf(pt->name, sizeof pt->name, "%s", ti.name);
        pt->cold_mbs = median(cold, repeat, &sc);
        pt->warm_mbs = median(warm, repeat, &sw);
        cli_info("tier %s: %.0f MB/s cold, %.0f MB/s warm", ti.name, pt->cold_mbs, pt->warm_mbs);
    }
    if (code == 0)
        measure_shared(m, store, repeat, buf, size, lkv, prof);
    if (code == 0 && (st = cb_model_sync(m)) != CB_OK) { /* a load's device fault */
        cli_err("KV loads: %s", cb_model_strerror(m, st));
        code = cli_exit_code(st);
    }
    cb_kvcache_free(lkv);
    free(buf);
    return code;
}

static void print_md(const cb_profile *prof, const popts *o, const cb_model *m)
{
    printf("model %s (%s), device %s, %d layers; medians of %d runs\n\n",
           cli_model_path(o->co.model), prof->model, cb_model_device(m), prof->n_layer, o->repeat);
    printf("| length | full prefill ms/layer | full prefill ms |");
    for (int ri = 0; ri < o->n_ratios; ri++)
        printf(" recompute r=%.2f ms/layer |", o->ratios[ri]);
    printf(" scoring ms/layer |\n|---|---|---|");
    for (int ri = 0; ri <= o->n_ratios; ri++)
        printf("---|");
    printf("\n");
    for (int i = 0; i < prof->n_prefill; i++) {
        printf("| %lld | %.2f | %.0f |", (long long)prof->prefill[i].length,
               prof->prefill[i].ms_per_layer, prof->prefill[i].ms_per_layer * prof->n_layer);
        for (int j = 0; j < prof->n_recompute; j++)
            if (prof->recompute[j].length == prof->prefill[i].length)
                printf(" %.2f |", prof->recompute[j].ms_per_layer);
        for (int j = 0; j < prof->n_scoring; j++)
            if (prof->scoring[j].length == prof->prefill[i].length)
                printf(" %.3f |", prof->scoring[j].ms_per_layer);
        printf("\n");
    }
    printf(
        "\n| tier | cold MB/s | warm MB/s | load ms for 1024 f16 tokens (cold) |\n|---|---|---|---|\n");
    for (int t = 0; t < prof->n_tiers; t++)
        printf("| %s | %.0f | %.0f | %.1f |\n", prof->tiers[t].name, prof->tiers[t].cold_mbs,
               prof->tiers[t].warm_mbs,
               cb_profile_load_ms(prof, prof->tiers[t].name, 1024, CB_TYPE_F16, 1));
    printf("\nKV bytes per token: f32 %.0f, f16 %.0f, bf16 %.0f, q8_0 %.0f\n",
           prof->kv_bytes_per_token[0], prof->kv_bytes_per_token[1], prof->kv_bytes_per_token[2],
           prof->kv_bytes_per_token[3]);
    printf("\n--speedup's cost figures (0: not measured, the built-in): load %.3g a byte, "
           "attention %.3g, scoring %.3g\n",
           (double)prof->costs.load, (double)prof->costs.attn, (double)prof->costs.score);
}

/* --plot: the recompute curves through gnuplot. */
static int plot(const cb_profile *prof, const char *png)
{
    char dat[] = "/tmp/cb-profile-XXXXXX";
    int fd = mkstemp(dat), code = 0;
    FILE *df = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!df) {
        cli_err("--plot: cannot write a temporary file");
        return CLI_EX_CANTCREAT;
    }
    /* one block per length: ratio, ms per layer (full prefill at ratio 1) */
    for (int i = 0; i < prof->n_prefill; i++) {
        fprintf(df, "# length %lld\n0 0\n", (long long)prof->prefill[i].length);
        for (int j = 0; j < prof->n_recompute; j++)
            if (prof->recompute[j].length == prof->prefill[i].length)
                fprintf(df, "%g %g\n", prof->recompute[j].ratio, prof->recompute[j].ms_per_layer);
        fprintf(df, "1 %g\n\n\n", prof->prefill[i].ms_per_layer);
    }
    fclose(df);
    char cmd[8192];
    int off = snprintf(
        cmd, sizeof cmd,
        "gnuplot -e \"set terminal png size 900,600; set output '%s'; set xlabel 'recompute ratio'; "
        "set ylabel 'ms per layer'; set grid; set key left top; set title 'recompute time per layer "
        "(%s, %d threads)'; plot ",
        png, prof->backend, prof->threads);
    for (int i = 0; i < prof->n_prefill; i++)
        off += snprintf(cmd + off, sizeof cmd - (size_t)off,
                        "%s'%s' index %d using 1:2 with linespoints title '%lld tokens'",
                        i ? ", " : "", dat, i, (long long)prof->prefill[i].length);
    snprintf(cmd + off, sizeof cmd - (size_t)off, "\"");
    if (system(cmd) != 0) {
        cli_err("--plot: gnuplot failed (is it installed? apt-get install gnuplot-nox)");
        code = CLI_EX_CANTCREAT;
    }
    unlink(dat);
    return code;
}

/* Every measurement into prof. */
static int measure(const cb_model *m, cb_store *store, const popts *o, cb_profile *prof)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    static const cb_type kvt[4] = {CB_TYPE_F32, CB_TYPE_F16, CB_TYPE_BF16, CB_TYPE_Q8_0};
    double *samples = malloc(sizeof(double) * (size_t)o->repeat);
    int code = samples ? 0 : CLI_EX_SOFTWARE;

    cb_hash128_hex(cb_model_fingerprint(m), prof->model);
    snprintf(prof->backend, sizeof prof->backend, "%s", cb_model_backend(m));
    prof->n_layer = hp->n_layer;
    prof->threads = cli_threads(&o->co);
    for (int i = 0; i < 4; i++) /* K and V of every layer */
        prof->kv_bytes_per_token[i] =
            2.0 * (double)hp->n_layer * (double)cb_type_row_bytes(kvt[i], w);
    for (int i = 0; code == 0 && i < o->n_lens; i++) /* lengths within the context */
        if ((int64_t)o->lens[i] <= hp->n_ctx_train)
            code = measure_length(m, o, (int64_t)o->lens[i], samples, prof);
        else if (o->lens_given)
            cli_err("note: length %.0f is past the model's context (%d): skipped", o->lens[i],
                    hp->n_ctx_train);
    if (code == 0)
        code = measure_tiers(m, store, o->repeat, prof);
    if (code == 0) /* what cb-run --speedup prices with (cb-run(1), PROFILE) */
        cb_profile_fit_costs(prof, m);
    free(samples);
    return code;
}

int main(int argc, char **argv)
{
    popts o = {.fmt = "md",
               .lens = {512, 1024, 2048, 4096, 8192},
               .ratios = {0.05, 0.1, 0.15, 0.25, 0.5},
               .n_lens = 5,
               .n_ratios = 5,
               .repeat = 3,
               .write = 1};
    char store_buf[4096], path[4096];
    cb_model *m = NULL;
    cb_store *store = NULL;
    cb_error err;
    cb_profile *prof = NULL;
    char *json = NULL;
    int code;

    cli_prog = "cb-profile";
    cli_trap_sigbus();
    if ((code = parse_args(argc, argv, &o)) >= 0)
        return code;
    cb_model_params mp = cli_model_params(o.co.n_threads, o.co.device);
    const char *store_dir = cli_store_dir(&o.co, store_buf, sizeof store_buf);
    if (!(prof = calloc(1, sizeof *prof)))
        return CLI_EX_SOFTWARE;
    if (cb_model_load(&m, cli_model_path(o.co.model), &mp, &err) != CB_OK ||
        cli_store_open(&store, store_dir, 1, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    if ((code = measure(m, store, &o, prof)) != 0)
        goto done;
    if (cb_profile_to_json(prof, &json) != CB_OK) {
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    if (o.write && cb_store_profile_save(store, prof, path, sizeof path, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
    } else if (o.write) {
        cli_info("profile written to %s", path);
    }
    if (!strcmp(o.fmt, "json"))
        printf("%s\n", json);
    else
        print_md(prof, &o, m);
    if (o.plot && plot(prof, o.plot) != 0)
        code = CLI_EX_CANTCREAT;
done:
    free(json);
    free(prof);
    cb_store_close(store);
    cb_model_free(m);
    return cli_finish(code);
}
