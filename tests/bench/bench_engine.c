/* bench_engine - our engine's speed on one scenario, and this process's
 * peak RSS (run.sh starts one process per scenario, so each row has its
 * own).
 * usage: bench_engine MODEL THREADS SCENARIO...
 *   sgemm           OpenBLAS sgemm GFLOP/s of this machine (1024^3, THREADS)
 *   prefill:L       L prompt tokens in batches of 512: prefill_L_tok_s
 *   decode:L:N      an L-token prompt (prefill_L_tok_s), then N tokens one
 *                   at a time: decode_L_tok_s
 *   batch:B:C       after a C-token prompt, B rows at positions C..C+B-1 in
 *                   one batch (blend's recomputed rows, a question), best of
 *                   three: batch_B_C_ms and batch_B_C_rows_s
 *   seqs:S:L        S sequences, each after an L-token prompt (copies of one
 *                   prefill), decoded together 32 steps by cb_fwd_decode,
 *                   as cb-run decodes (S = 1: a lone answer, --batch: more):
 *                   seqs_S_L_tok_s, the tokens of all S per second
 *   kl:L            the 8-bit activations against the exact path: an
 *                   L-token prompt of English text fed one token at a time
 *                   to both (every product of the act8 model through its
 *                   8-bit kernels, its KV cache included); kl_L_first: the
 *                   KL (nats) of the next-token distribution after the
 *                   prompt, kl_L_mean / kl_L_median / kl_L_max over every
 *                   position (Qwen2.5's first position, whose massive
 *                   activations 8-bit rounding per 256 values distorts,
 *                   can dominate the mean),
 *                   kl_L_top1: the share of positions where the top tokens
 *                   agree
 *   membw           this machine's memory read bandwidth with THREADS
 *                   threads (each streaming its share of 1 GiB, best of 5):
 *                   membw_gb_s (the decode figures' yardstick)
 * decode also prints decode_L_gb_s: the weight bytes a token reads (every
 * 2-D weight but an untied token embedding) times the token rate.
 * CB_BENCH_TURNS=R: decode takes turns with other engines (turns.py runs
 * them): it waits for a line on stdin before the prefill and before each
 * of R rounds of N/R tokens, and prints turn_s (the round's seconds) after
 * each; decode_L_tok_s is N over the rounds' sum.
 * Every scenario also prints rss_kb (getrusage: the peak so far).  $CB_BENCH_DEVICE
 * picks the device (default cpu, the one llama.cpp is compared on);
 * CB_BENCH_EXACT=1 runs the exact path (cb_model_params.exact; default:
 * 8-bit activations).
 * Prompts are fixed pseudo-random ids, as in llamacpp_engine.py. */
#include "../../lib/infer/infer.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

extern void openblas_set_num_threads(int n);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long env_int(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

/* CB_BENCH_TURNS: what was printed goes out, then a line from stdin says
 * that this engine's turn has come; 0 at its end */
static int wait_turn(void)
{
    char line[64];
    fflush(stdout);
    return fgets(line, sizeof line, stdin) != NULL;
}

static long rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static const char kl_text[] =
    "The river rises in the hills north of the town and runs south through farmland for about forty "
    "miles before it reaches the sea. In the nineteenth century it carried timber and grain to the port, "
    "and the mills along its banks employed most of the people who lived in the valley. When the railway "
    "came, the river trade declined, and many of the old mills were turned into houses, shops and, in one "
    "case, a small museum that tells the story of the valley's industry. Today the river is known mostly "
    "for its fishing and for the walking path that follows it from its source to the coast. ";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* kl:L on model path with threads: exact vs 8-bit activations */
static int kl_rows(const char *path, int threads, int L)
{
    cb_model *m[2] = {NULL, NULL};
    cb_kvcache *kv[2] = {NULL, NULL};
    cb_fwd *f[2] = {NULL, NULL};
    cb_error err;
    cb_tokens t = {0};
    for (int a = 0; a < 2; a++) {
        cb_model_params mp = {threads, "cpu", !a, NULL}; /* m[0] exact, m[1] the default */
        if (cb_model_load(&m[a], path, &mp, &err) != CB_OK) {
            fprintf(stderr, "bench_engine: %s\n", err.msg);
            return 65;
        }
    }
    const cb_vocab *v = cb_model_vocab(m[0]);
    while ((int)t.n < L) /* BOS as the model wants it, then the text again and again */
        if (cb_tok_encode(v, kl_text, sizeof kl_text - 1, t.n ? 0 : CB_TOK_ADD_SPECIAL, &t) !=
            CB_OK)
            return 70;
    int nv = cb_model_hparams(m[0])->n_vocab;
    float *lg[2] = {malloc(sizeof(float) * (size_t)nv), malloc(sizeof(float) * (size_t)nv)};
    for (int a = 0; a < 2; a++)
        if (cb_kvcache_new(&kv[a], m[a], L + 8, CB_TYPE_F16) != CB_OK ||
            cb_fwd_new(&f[a], m[a], 8) != CB_OK)
            return 70;
    double sum = 0, mx = 0, k = 0, *all = malloc(sizeof(double) * (size_t)L);
    int agree = 0;
    for (int i = 0; i < L; i++) {
        for (int a = 0; a < 2; a++)
            if (cb_model_eval(f[a], kv[a], &t.ids[i], 1, i, lg[a]) != CB_OK)
                return 70;
        int same;
        k = cb_logits_kl(lg[0], lg[1], nv, &same);
        all[i] = k;
        sum += k;
        mx = k > mx ? k : mx;
        agree += same;
    }
    qsort(all, (size_t)L, sizeof *all, cmp_double);
    printf(
        "kl_%d_first %.3e\nkl_%d_mean %.3e\nkl_%d_median %.3e\nkl_%d_max %.3e\nkl_%d_top1 %.3f\n",
        L, k, L, sum / L, L, all[L / 2], L, mx, L, (double)agree / L);
    free(all);
    for (int a = 0; a < 2; a++) {
        cb_fwd_free(f[a]);
        cb_kvcache_free(kv[a]);
        cb_model_free(m[a]);
        free(lg[a]);
    }
    cb_tokens_free(&t);
    return 0;
}

/* membw: T threads each read their share of 1 GiB with 32-byte loads */
typedef struct bw_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_arg;

static void *bw_read(void *arg)
{
    bw_arg *a = arg;
    uint64_t s[4] = {0};
    for (size_t i = 0; i + 4 <= a->n; i += 4)
        for (int k = 0; k < 4; k++)
            s[k] ^= a->p[i + k];
    a->sum = s[0] ^ s[1] ^ s[2] ^ s[3];
    return NULL;
}

static void membw(int threads)
{
    size_t n = (size_t)1 << 27; /* 1 GiB of uint64 */
    uint64_t *buf = malloc(sizeof *buf * n);
    pthread_t th[64];
    bw_arg a[64];
    double best = 1e9;
    if (!buf)
        return;
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    memset(buf, 1, sizeof *buf * n);
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (int i = 0; i < threads; i++) {
            a[i] = (bw_arg){buf + n / (size_t)threads * (size_t)i, n / (size_t)threads, 0};
            pthread_create(&th[i], NULL, bw_read, &a[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(th[i], NULL);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    printf("membw_gb_s %.1f\n", (double)(sizeof *buf * n) / best / 1e9);
    free(buf);
}

/* the bytes of weights one decode step reads: every 2-D tensor but the
 * token embedding, which a decode step reads one row of, unless the
 * model has no output.weight (tied: the logits read all of it) */
static double decode_bytes(const char *path)
{
    cb_gguf *g;
    cb_error err;
    double sum = 0;
    if (cb_gguf_open(&g, path, &err) != CB_OK)
        return 0;
    int tied = cb_gguf_find_tensor(g, "output.weight") < 0;
    for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++) {
        cb_tensor_info ti;
        if (cb_gguf_tensor(g, i, &ti) != CB_OK || ti.n_dims < 2)
            continue;
        if (!tied && ti.name.len == 17 && memcmp(ti.name.data, "token_embd.weight", 17) == 0)
            continue;
        sum += (double)ti.nbytes;
    }
    cb_gguf_free(g);
    return sum;
}

/* seqs:S:L: S sequences after an L-token prompt, decoded together */
static int seqs_rate(cb_model *m, int S, int L)
{
    enum { STEPS = 32 };
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    cb_kvcache *kv[64] = {0};
    cb_fwd *f = NULL, *fd = NULL;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)L), tok[64], pos[64];
    float *rows = malloc(sizeof(float) * (size_t)(L * w)),
          *lg = malloc(sizeof(float) * (size_t)S * hp->n_vocab);
    int ok = t && rows && lg && cb_fwd_new(&f, m, L) == CB_OK &&
             cb_fwd_new(&fd, m, cb_fwd_decode_rows(m, S)) == CB_OK;
    for (int i = 0; ok && i < L; i++)
        t[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    for (int s = 0; ok && s < S; s++)
        ok = cb_kvcache_new(&kv[s], m, L + STEPS, CB_TYPE_F16) == CB_OK;
    ok = ok && cb_model_eval(f, kv[0], t, L, 0, NULL) == CB_OK;
    for (int s = 1; ok && s < S; s++) /* the same prompt's cache in each */
        for (int l = 0; ok && l < hp->n_layer; l++)
            for (int which = 0; ok && which < 2; which++)
                ok = cb_kvcache_read(kv[0], l, which, 0, L, rows) == CB_OK &&
                     cb_kvcache_write(kv[s], l, which, 0, L, rows) == CB_OK;
    double t0 = now();
    for (int i = 0; ok && i < STEPS; i++) {
        for (int s = 0; s < S; s++) {
            tok[s] = (int32_t)((s * 31 + i * 7919 + 13) % hp->n_vocab);
            pos[s] = L + i;
        }
        ok = cb_fwd_decode(fd, kv, tok, pos, S, lg) == CB_OK;
    }
    if (ok)
        printf("seqs_%d_%d_tok_s %.2f\n", S, L, S * STEPS / (now() - t0));
    fflush(stdout);
    for (int s = 0; s < S; s++)
        cb_kvcache_free(kv[s]);
    cb_fwd_free(f), cb_fwd_free(fd);
    free(t), free(rows), free(lg);
    return ok ? 0 : 1;
}

static void sgemm_rate(int threads)
{
    int n = 1024;
    float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4),
          *c = calloc((size_t)n * n, 4);
    for (int i = 0; i < n * n; i++)
        a[i] = b[i] = (float)(i % 7) * 0.1f;
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    printf("sgemm_gflops %.1f\n", 2.0 * n * n * n / best / 1e9);
    free(a), free(b), free(c);
}

int main(int argc, char **argv)
{
    cb_model *m;
    cb_error err;
    if (argc < 4) {
        fprintf(stderr, "usage: bench_engine MODEL THREADS SCENARIO...\n");
        return 64;
    }
    int threads = atoi(argv[2]);
    if (argc == 4 && strcmp(argv[3], "sgemm") == 0) {
        sgemm_rate(threads);
        return 0;
    }
    if (argc == 4 && strcmp(argv[3], "membw") == 0) {
        membw(threads);
        return 0;
    }
    int kl_len = 0;
    if (argc == 4 && sscanf(argv[3], "kl:%d", &kl_len) == 1 && kl_len > 0) {
        int code = kl_rows(argv[1], threads, kl_len);
        printf("rss_kb %ld\n", rss_kb());
        return code;
    }
    const char *dev = getenv("CB_BENCH_DEVICE");
    const char *ex = getenv("CB_BENCH_EXACT");
    /* the fingerprint remembered where the programs keep it (load_s is what a cb-run pays) */
    char fpc[1024];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    snprintf(fpc, sizeof fpc, "%s%s/cacheblend/fingerprints",
             xdg && *xdg ? xdg
             : home      ? home
                         : ".",
             xdg && *xdg ? "" : "/.cache");
    cb_model_params mp = {threads, dev && *dev ? dev : "cpu", ex && !strcmp(ex, "1"), fpc};
    double t_load = now();
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        return 65;
    }
    printf("device %s\nload_s %.2f\n", cb_model_device(m), now() - t_load);
    const cb_hparams *hp = cb_model_hparams(m);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    for (int a = 3; a < argc; a++) {
        int S = 0, SL = 0;
        if (sscanf(argv[a], "seqs:%d:%d", &S, &SL) == 2) {
            if (S < 1 || S > 64 || SL < 1 || seqs_rate(m, S, SL) != 0) {
                fprintf(stderr, "bench_engine: scenario '%s' failed\n", argv[a]);
                return 70;
            }
            continue;
        }
        int L = 0, N = 0;
        char kind[16] = "";
        if (sscanf(argv[a], "%15[a-z]:%d:%d", kind, &L, &N) < 2 || L < 1) {
            fprintf(stderr, "bench_engine: bad scenario '%s'\n", argv[a]);
            return 64;
        }
        int B = strcmp(kind, "batch") == 0 ? L : 0, C = B ? N : L; /* batch:B:C */
        int n_tok = C + (B ? B : N);
        int32_t *t = malloc(sizeof(int32_t) * (size_t)(n_tok + 1));
        for (int i = 0; i < n_tok + 1; i++)
            t[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
        cb_kvcache *kv;
        cb_fwd *f;
        if (cb_kvcache_new(&kv, m, n_tok + 8, CB_TYPE_F16) != CB_OK ||
            cb_fwd_new(&f, m, B > 512 ? B : 512) != CB_OK)
            return 70;
        int turns = strcmp(kind, "decode") ? 0 : (int)env_int("CB_BENCH_TURNS", 0);
        turns = turns > N ? N : turns;
        if (turns > 0 && !wait_turn())
            return 70;
        double t0 = now();
        if (cb_model_eval(f, kv, t, C, 0, logits) != CB_OK)
            return 70;
        double dt = now() - t0;
        if (!strcmp(kind, "prefill")) {
            printf("prefill_%d_tok_s %.1f\n", L, L / dt);
        } else if (!strcmp(kind, "decode")) {
            printf("prefill_%d_tok_s %.1f\n", C, C / dt);
            double spent = 0;
            for (int r = 0, i = 0; r < (turns ? turns : 1); r++) {
                int until = turns ? N * (r + 1) / turns : N;
                if (turns && !wait_turn())
                    return 70;
                t0 = now();
                for (; i < until; i++)
                    cb_model_eval(f, kv, &t[C + i], 1, C + i, logits);
                spent += now() - t0;
                if (turns)
                    printf("turn_s %.4f\n", now() - t0);
            }
            double rate = N / spent;
            printf("decode_%d_tok_s %.2f\ndecode_%d_gb_s %.2f\n", L, rate, L,
                   decode_bytes(argv[1]) * rate / 1e9);
        } else if (B) {
            double best = 1e9;
            for (int r = 0; r < 3; r++) {
                t0 = now();
                cb_model_eval(f, kv, t + C, B, C, logits);
                dt = now() - t0;
                best = dt < best ? dt : best;
            }
            printf("batch_%d_%d_ms %.2f\nbatch_%d_%d_rows_s %.1f\n", B, C, best * 1e3, B, C,
                   B / best);
        } else {
            fprintf(stderr, "bench_engine: bad scenario '%s'\n", argv[a]);
            return 64;
        }
        fflush(stdout);
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        free(t);
    }
    printf("rss_kb %ld\n", rss_kb());
    free(logits);
    cb_model_free(m);
    return 0;
}
