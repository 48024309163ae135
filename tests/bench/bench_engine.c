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
 * Every scenario also prints rss_kb (getrusage: the peak so far).  $CB_BENCH_DEVICE
 * picks the device (default cpu, the one llama.cpp is compared on);
 * CB_BENCH_ACT8=1 turns on the 8-bit activations (cb_model_params.act8).
 * Prompts are fixed pseudo-random ids, as in llamacpp_engine.py. */
#include "cbcore.h"

#include <cblas.h>
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

static long rss_kb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void sgemm_rate(int threads)
{
    int n = 1024;
    float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4), *c = calloc((size_t)n * n, 4);
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
    const char *dev = getenv("CB_BENCH_DEVICE");
    const char *a8 = getenv("CB_BENCH_ACT8");
    cb_model_params mp = {threads, dev && *dev ? dev : "cpu", a8 && !strcmp(a8, "1")};
    double t_load = now();
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        return 65;
    }
    printf("device %s\nload_s %.2f\n", cb_model_device(m), now() - t_load);
    const cb_hparams *hp = cb_model_hparams(m);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    for (int a = 3; a < argc; a++) {
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
        double t0 = now();
        if (cb_model_eval(f, kv, t, C, 0, logits) != CB_OK)
            return 70;
        double dt = now() - t0;
        if (!strcmp(kind, "prefill")) {
            printf("prefill_%d_tok_s %.1f\n", L, L / dt);
        } else if (!strcmp(kind, "decode")) {
            printf("prefill_%d_tok_s %.1f\n", C, C / dt);
            t0 = now();
            for (int i = 0; i < N; i++)
                cb_model_eval(f, kv, &t[C + i], 1, C + i, logits);
            printf("decode_%d_tok_s %.2f\n", L, N / (now() - t0));
        } else if (B) {
            double best = 1e9;
            for (int r = 0; r < 3; r++) {
                t0 = now();
                cb_model_eval(f, kv, t + C, B, C, logits);
                dt = now() - t0;
                best = dt < best ? dt : best;
            }
            printf("batch_%d_%d_ms %.2f\nbatch_%d_%d_rows_s %.1f\n", B, C, best * 1e3, B, C, B / best);
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
