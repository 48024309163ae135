/* bench_engine - prefill and decode speed of our engine.
 * usage: bench_engine MODEL THREADS [LENGTHS...]   (default 512 1024 2048 4096)
 * $CB_BENCH_DEVICE picks the device (default cpu, the one llama.cpp is
 * compared on; run.sh also measures cuda when a GPU is present).
 * Prints "key value" lines: sgemm GFLOP/s of this machine (1024^3, OpenBLAS),
 * then per length the prefill time, tokens/s and achieved GFLOP/s, then
 * decode tokens/s (64 tokens after a 512-token prompt).  Prompts are fixed
 * pseudo-random ids; batches of 512 as in llama.cpp's default. */
#include "cbcore.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern void openblas_set_num_threads(int n);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    cb_model *m;
    cb_error err;
    if (argc < 3) {
        fprintf(stderr, "usage: bench_engine MODEL THREADS [LENGTHS...]\n");
        return 64;
    }
    const char *dev = getenv("CB_BENCH_DEVICE");
    cb_model_params mp = {atoi(argv[2]), dev && *dev ? dev : "cpu"};
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        return 65;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    printf("device %s\n", cb_model_device(m));

    /* the machine's sgemm rate, same threads */
    if (strcmp(cb_model_backend(m), "cpu") == 0) {
        int n = 1024;
        float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4), *c = calloc((size_t)n * n, 4);
        for (int i = 0; i < n * n; i++)
            a[i] = b[i] = (float)(i % 7) * 0.1f;
        openblas_set_num_threads(mp.n_threads);
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

    /* FLOPs per token in the weight products (all layers; logits of one row) */
    double d = hp->n_embd, dq = (double)hp->n_head * hp->head_dim, dkv = (double)hp->n_head_kv * hp->head_dim;
    double w_layer = d * dq * 2 + d * dkv * 2 + 3 * d * hp->n_ff;
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    int n_len = argc > 3 ? argc - 3 : 4;
    int lens[16] = {512, 1024, 2048, 4096};
    for (int i = 0; i < n_len && argc > 3 && i < 16; i++)
        lens[i] = atoi(argv[3 + i]);
    for (int li = 0; li < n_len; li++) {
        int L = lens[li];
        int32_t *t = malloc(sizeof(int32_t) * (size_t)L);
        for (int i = 0; i < L; i++)
            t[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
        cb_kvcache *kv;
        cb_fwd *f;
        if (cb_kvcache_new(&kv, m, L + 64, CB_TYPE_F16) != CB_OK || cb_fwd_new(&f, m, 512) != CB_OK)
            return 70;
        double t0 = now();
        cb_model_eval(f, kv, t, L, 0, logits);
        double dt = now() - t0;
        double flops = 2.0 * w_layer * hp->n_layer * L + 2.0 * d * hp->n_vocab +
                       4.0 * dq * ((double)L * (L + 1) / 2) * hp->n_layer;
        printf("prefill_%d_s %.4f\nprefill_%d_tok_s %.1f\nprefill_%d_gflops %.1f\n", L, dt, L, L / dt, L,
               flops / dt / 1e9);
        if (L == 512) {
            int32_t tok = t[L - 1];
            double g0 = now();
            for (int i = 0; i < 64; i++)
                cb_model_eval(f, kv, &tok, 1, L + i, logits);
            printf("decode_tok_s %.1f\n", 64 / (now() - g0));
        }
        fflush(stdout);
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        free(t);
    }
    free(logits);
    cb_model_free(m);
    return 0;
}
