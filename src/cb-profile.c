/* cb-profile - measure what the loading controller needs, on this machine:
 * full-prefill time per layer at several prompt lengths, selective
 * recompute time per layer at several ratios, and the KV read throughput
 * of every store tier, cold and warm.  Writes the profile into the store
 * and prints a table. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cb-profile [-m MODEL] [--store DIR] [--lengths L,...] [--ratios R,...]\n"
            "                  [--repeat N] [-o md|json] [--plot FILE.png] [-t N]\n"
            "\n"
            "Measure full-prefill and selective-recompute time per layer and the KV load\n"
            "throughput of every tier of the store (cold and warm), write the profile into\n"
            "the store (profile-<model>-<backend>.json), and print a table.\n"
            "\n"
            "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model)\n"
            "      --store DIR    the store (default: $CB_STORE, else ~/.cache/cacheblend/store)\n"
            "      --lengths LIST prompt lengths (default 512,1024,2048,4096,8192, up to the\n"
            "                     model's context)\n"
            "      --ratios LIST  recompute ratios (default 0.05,0.1,0.15,0.25,0.5)\n"
            "      --repeat N     repeats of each measurement; the median is kept (default 3)\n"
            "      --no-write     measure and print, but do not write the profile\n"
            "  -o, --output FMT   md (default) or json\n"
            "      --plot FILE    the curves as a PNG (needs gnuplot)\n"
            "  -t, --threads N    compute threads (default: every core)\n"
            "      --device DEV   compute device: cpu, cuda or cuda:N (default: $CB_DEVICE,\n"
            "                     else CUDA device 0 when a GPU is present, else cpu)\n"
            "  -v, --verbose      progress on stderr\n"
            "  -q, --quiet        print nothing but errors\n"
            "  -h, --help         this help\n"
            "      --version      print the version\n"
            "\n"
            "Exit status: 0 success, 64 usage error, 65 bad model, 66 missing model or\n"
            "store, 69 compute device not available, 70 internal error, 73 cannot write\n"
            "the profile, 74 I/O error.\n");
}

enum { OPT_DEVICE = 200, OPT_VERSION = 256, OPT_STORE, OPT_LENGTHS, OPT_RATIOS, OPT_REPEAT, OPT_PLOT, OPT_NOWRITE };

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

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

/* Load every layer of a KV file the way cb-run's loader does: read it from
 * the tier, verify and convert it, and place it in a cache on the compute
 * device (rotated to position 0).  Returns the file's MB/s, or -1. */
static double load_all(const cb_model *m, const char *path, cb_kvcache *kv, float *k, float *v, cb_error *err)
{
    cb_kvfile *kf;
    double t0 = now_ms();
    if (cb_kvfile_open(&kf, path, err) != CB_OK)
        return -1;
    const cb_kv_meta *mt = cb_kvfile_meta(kf);
    for (int32_t l = 0; l < mt->n_layer; l++)
        if (cb_kvfile_read_layer(kf, l, k, v, err) != CB_OK ||
            cb_kvcache_load(kv, l, 0, mt->n_tokens, k, v, mt->pos0) != CB_OK) {
            cb_kvfile_free(kf);
            return -1;
        }
    cb_model_sync(m); /* on a GPU, until the copies are done */
    double mb = (double)cb_kvfile_size(kf) / 1e6, ms = now_ms() - t0;
    cb_kvfile_free(kf);
    return mb / (ms / 1e3);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"store", required_argument, 0, OPT_STORE},
        {"lengths", required_argument, 0, OPT_LENGTHS}, {"ratios", required_argument, 0, OPT_RATIOS},
        {"repeat", required_argument, 0, OPT_REPEAT}, {"output", required_argument, 0, 'o'},
        {"plot", required_argument, 0, OPT_PLOT}, {"no-write", no_argument, 0, OPT_NOWRITE},
        {"device", required_argument, 0, OPT_DEVICE},
        {"threads", required_argument, 0, 't'},   {"verbose", no_argument, 0, 'v'},
        {"quiet", no_argument, 0, 'q'},           {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, OPT_VERSION}, {0, 0, 0, 0},
    };
    const char *device = NULL;
    const char *model_opt = NULL, *store_opt = NULL, *plot = NULL, *fmt = "md";
    double lens_d[16] = {512, 1024, 2048, 4096, 8192}, ratios[16] = {0.05, 0.1, 0.15, 0.25, 0.5};
    int n_lens = 5, n_ratios = 5, repeat = 3, n_threads = 0, write = 1, c, lens_given = 0;
    char store_buf[4096];

    cli_prog = "cb-profile";
    while ((c = getopt_long(argc, argv, "m:o:t:vqh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_opt = optarg; break;
        case OPT_STORE: store_opt = optarg; break;
        case OPT_DEVICE: device = optarg; break;
        case OPT_LENGTHS:
            if ((n_lens = parse_list(optarg, lens_d, 16, 2, 1 << 20)) < 1) {
                cli_err("--lengths %s: give up to 16 lengths, e.g. 512,1024", optarg);
                return CLI_EX_USAGE;
            }
            lens_given = 1;
            break;
        case OPT_RATIOS:
            if ((n_ratios = parse_list(optarg, ratios, 16, 0.001, 1)) < 1) {
                cli_err("--ratios %s: give up to 16 ratios in (0, 1]", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case OPT_REPEAT:
            repeat = atoi(optarg);
            if (repeat < 1 || repeat > 100) {
                cli_err("--repeat %s: 1 to 100", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case 'o':
            if (strcmp(optarg, "md") && strcmp(optarg, "json")) {
                cli_err("-o %s: md or json", optarg);
                return CLI_EX_USAGE;
            }
            fmt = optarg;
            break;
        case OPT_PLOT: plot = optarg; break;
        case OPT_NOWRITE: write = 0; break;
        case 't': n_threads = atoi(optarg); break;
        case 'v': cli_verbosity = 2; break;
        case 'q': cli_verbosity = 0; break;
        case 'h': usage(stdout); return cli_finish(0);
        case OPT_VERSION: cli_version(); return cli_finish(0);
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("unexpected argument '%s'", argv[optind]);
        return CLI_EX_USAGE;
    }
    const char *store_dir = store_opt ? store_opt : cb_store_default_dir(store_buf, sizeof store_buf);
    cb_model *m = NULL;
    cb_store *store = NULL;
    cb_error err;
    cb_model_params mp = {n_threads, cli_device(device)};
    int code = 0;
    cb_profile *prof = calloc(1, sizeof *prof);
    float *logits = NULL, *kb = NULL, *vb = NULL;
    double *samples = NULL;

    if (!prof)
        return CLI_EX_SOFTWARE;
    if (cb_model_load(&m, cli_model_path(model_opt), &mp, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    if (cb_store_open(&store, store_dir, 1, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    char fp_hex[33];
    cb_hash128_hex(cb_model_fingerprint(m), fp_hex);
    snprintf(prof->model, sizeof prof->model, "%s", fp_hex);
    snprintf(prof->backend, sizeof prof->backend, "%s", cb_model_backend(m));
    prof->n_layer = hp->n_layer;
    if (n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc > 0 ? (int)nc : 1;
    }
    prof->threads = n_threads;
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    static const cb_type kvt[4] = {CB_TYPE_F32, CB_TYPE_F16, CB_TYPE_BF16, CB_TYPE_Q8_0};
    for (int i = 0; i < 4; i++) /* K and V of every layer */
        prof->kv_bytes_per_token[i] = 2.0 * (double)hp->n_layer * (double)cb_type_row_bytes(kvt[i], w);
    /* lengths within the context */
    int nl = 0;
    int64_t lens[16];
    for (int i = 0; i < n_lens; i++)
        if ((int64_t)lens_d[i] <= hp->n_ctx_train)
            lens[nl++] = (int64_t)lens_d[i];
        else if (lens_given)
            cli_err("note: length %.0f is past the model's context (%d): skipped", lens_d[i], hp->n_ctx_train);
    logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    samples = malloc(sizeof(double) * (size_t)repeat);
    if (!logits || !samples) {
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    for (int li = 0; li < nl; li++) {
        int64_t L = lens[li];
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)L), *rows = malloc(sizeof(int32_t) * (size_t)L);
        cb_kvcache *kv = NULL;
        cb_fwd *f = NULL;
        if (!toks || !rows || cb_kvcache_new(&kv, m, (int32_t)L, CB_TYPE_F16) != CB_OK ||
            cb_fwd_new(&f, m, (int32_t)L) != CB_OK) {
            cli_err("out of memory at length %lld", (long long)L);
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        for (int64_t i = 0; i < L; i++)
            toks[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
        /* full prefill, whole prompt in one batch like a blend does */
        for (int r = 0; r < repeat; r++) {
            double t0 = now_ms();
            int32_t *pos = rows;
            for (int64_t i = 0; i < L; i++)
                pos[i] = (int32_t)i;
            cb_fwd_embed(f, toks, pos, (int32_t)L);
            for (int32_t l = 0; l < hp->n_layer; l++)
                cb_fwd_layer(f, kv, l, NULL, 0);
            cb_model_sync(m); /* a device queues the work: time its completion */
            samples[r] = (now_ms() - t0) / hp->n_layer;
        }
        cb_profile_point *pp = &prof->prefill[prof->n_prefill++];
        pp->length = L;
        pp->ratio = 1.0;
        pp->ms_per_layer = median(samples, repeat, &pp->spread);
        cli_info("length %lld: full prefill %.2f ms per layer", (long long)L, pp->ms_per_layer);
        /* selective recompute: a ratio of rows, spread over the prompt, at a
         * middle layer, attending over the whole (filled) cache */
        for (int ri = 0; ri < n_ratios; ri++) {
            int32_t n = (int32_t)(ratios[ri] * (double)L + 0.5);
            if (n < 1)
                n = 1;
            for (int32_t i = 0; i < n; i++)
                rows[i] = (int32_t)((int64_t)i * L / n);
            rows[n - 1] = (int32_t)(L - 1);
            int32_t layer = hp->n_layer / 2;
            for (int r = 0; r < repeat; r++) {
                double t0 = now_ms();
                cb_fwd_layer(f, kv, layer, rows, n);
                cb_model_sync(m);
                samples[r] = now_ms() - t0;
            }
            cb_profile_point *rp = &prof->recompute[prof->n_recompute++];
            rp->length = L;
            rp->ratio = ratios[ri];
            rp->ms_per_layer = median(samples, repeat, &rp->spread);
            cli_info("length %lld: ratio %.2f recompute %.2f ms per layer", (long long)L, ratios[ri],
                     rp->ms_per_layer);
        }
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        free(toks);
        free(rows);
    }
    /* KV load throughput of every tier: a 1024-token f16 KV file */
    {
        int32_t L = 1024 < hp->n_ctx_train - 8 ? 1024 : hp->n_ctx_train - 8;
        cb_tokens lead = {0};
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)L);
        cb_kvcache *kv = NULL;
        cb_fwd *f = NULL;
        void *buf = NULL;
        size_t size = 0;
        kb = malloc(sizeof(float) * (size_t)(L * w));
        vb = malloc(sizeof(float) * (size_t)(L * w));
        for (int32_t i = 0; toks && i < L; i++)
            toks[i] = (int32_t)((i * 104729 + 7) % hp->n_vocab);
        if (!toks || !kb || !vb || cb_kv_lead_in(m, &lead) != CB_OK ||
            cb_kvcache_new(&kv, m, L + (int32_t)lead.n, CB_TYPE_F32) != CB_OK || cb_fwd_new(&f, m, 512) != CB_OK ||
            cb_kv_precompute(f, kv, lead.ids, (int32_t)lead.n, toks, L, CB_TYPE_F16, &buf, &size) != CB_OK) {
            cli_err("cannot build the test KV file");
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        cb_tokens_free(&lead);
        free(toks);
        cb_kvcache *lkv = NULL; /* where the loads land: cb-run's f16 cache on the device */
        if (cb_kvcache_new(&lkv, m, L, CB_TYPE_F16) != CB_OK) {
            cli_err("out of memory for a %d-token cache", L);
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        for (int t = 0; t < cb_store_n_tiers(store) && t < 16; t++) {
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
            for (int r = 0; r < repeat; r++) {
                drop_cache(path);
                cold[r] = load_all(m, path, lkv, kb, vb, &err);
                warm[r] = load_all(m, path, lkv, kb, vb, &err);
            }
            unlink(path);
            cb_profile_tier *pt = &prof->tiers[prof->n_tiers++];
            snprintf(pt->name, sizeof pt->name, "%s", ti.name);
            pt->cold_mbs = median(cold, repeat, &sc);
            pt->warm_mbs = median(warm, repeat, &sw);
            cli_info("tier %s: %.0f MB/s cold, %.0f MB/s warm", ti.name, pt->cold_mbs, pt->warm_mbs);
        }
        cb_kvcache_free(lkv);
        free(buf);
    }
    /* write the profile into the store */
    char *json = NULL;
    if (cb_profile_to_json(prof, &json) != CB_OK) {
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    if (write) {
        char name[256], path[4096 + 256];
        cb_profile_name(cb_model_fingerprint(m), prof->backend, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", store_dir, name);
        if (cb_file_write_atomic(path, json, strlen(json), &err) != CB_OK) {
            cli_err("%s", err.msg);
            code = cli_exit_code(err.status);
        } else {
            cli_info("profile written to %s", path);
        }
    }
    if (!strcmp(fmt, "json")) {
        printf("%s\n", json);
    } else {
        printf("model %s (%s), device %s, %d layers; medians of %d runs\n\n", cli_model_path(model_opt), fp_hex,
               cb_model_device(m), prof->n_layer, repeat);
        printf("| length | full prefill ms/layer | full prefill ms |");
        for (int ri = 0; ri < n_ratios; ri++)
            printf(" recompute r=%.2f ms/layer |", ratios[ri]);
        printf("\n|---|---|---|");
        for (int ri = 0; ri < n_ratios; ri++)
            printf("---|");
        printf("\n");
        for (int i = 0; i < prof->n_prefill; i++) {
            printf("| %lld | %.2f | %.0f |", (long long)prof->prefill[i].length, prof->prefill[i].ms_per_layer,
                   prof->prefill[i].ms_per_layer * prof->n_layer);
            for (int j = 0; j < prof->n_recompute; j++)
                if (prof->recompute[j].length == prof->prefill[i].length)
                    printf(" %.2f |", prof->recompute[j].ms_per_layer);
            printf("\n");
        }
        printf("\n| tier | cold MB/s | warm MB/s | load ms for 1024 f16 tokens (cold) |\n|---|---|---|---|\n");
        for (int t = 0; t < prof->n_tiers; t++)
            printf("| %s | %.0f | %.0f | %.1f |\n", prof->tiers[t].name, prof->tiers[t].cold_mbs,
                   prof->tiers[t].warm_mbs, cb_profile_load_ms(prof, prof->tiers[t].name, 1024, CB_TYPE_F16, 1));
        printf("\nKV bytes per token: f32 %.0f, f16 %.0f, bf16 %.0f, q8_0 %.0f\n", prof->kv_bytes_per_token[0],
               prof->kv_bytes_per_token[1], prof->kv_bytes_per_token[2], prof->kv_bytes_per_token[3]);
    }
    free(json);
    if (plot) {
        char dat[] = "/tmp/cb-profile-XXXXXX";
        int fd = mkstemp(dat);
        FILE *df = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!df) {
            cli_err("--plot: cannot write a temporary file");
            code = CLI_EX_CANTCREAT;
            goto done;
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
        int off = snprintf(cmd, sizeof cmd,
                           "gnuplot -e \"set terminal png size 900,600; set output '%s'; set xlabel 'recompute ratio'; "
                           "set ylabel 'ms per layer'; set grid; set key left top; set title 'recompute time per layer "
                           "(%s, %d threads)'; plot ",
                           plot, prof->backend, prof->threads);
        for (int i = 0; i < prof->n_prefill; i++)
            off += snprintf(cmd + off, sizeof cmd - (size_t)off, "%s'%s' index %d using 1:2 with linespoints title '%lld tokens'",
                            i ? ", " : "", dat, i, (long long)prof->prefill[i].length);
        snprintf(cmd + off, sizeof cmd - (size_t)off, "\"");
        if (system(cmd) != 0) {
            cli_err("--plot: gnuplot failed (is it installed? apt-get install gnuplot-nox)");
            code = CLI_EX_CANTCREAT;
        }
        unlink(dat);
    }
done:
    free(samples);
    free(logits);
    free(kb);
    free(vb);
    free(prof);
    cb_store_close(store);
    cb_model_free(m);
    return cli_finish(code);
}
