/* bench_core - speed of the foundation pieces on this machine:
 *   open   : cb_gguf_open + cb_vocab_load of a model (median of runs)
 *   tok    : cb_tok_encode throughput over a text file (MB/s, tokens/s)
 *   dequant: cb_dequant_row throughput per tensor type (Melem/s)
 * usage: bench_core MODEL TEXTFILE
 * Prints one "key value" line per figure, for tests/bench/run.sh. */
#include "../../lib/core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int main(int argc, char **argv)
{
    cb_error err;
    double t[9];
    if (argc != 3) {
        fprintf(stderr, "usage: bench_core MODEL TEXTFILE\n");
        return 64;
    }
    for (int r = 0; r < 9; r++) {
        cb_gguf *g;
        cb_vocab *v;
        double t0 = now();
        if (cb_gguf_open(&g, argv[1], &err) != CB_OK || cb_vocab_load(&v, g, &err) != CB_OK) {
            fprintf(stderr, "bench_core: %s\n", err.msg);
            return 65;
        }
        t[r] = now() - t0;
        cb_vocab_free(v);
        cb_gguf_free(g);
    }
    qsort(t, 9, sizeof t[0], cmp_d);
    printf("open_vocab_ms %.2f\n", t[4] * 1e3);

    cb_gguf *g;
    cb_vocab *v;
    cb_gguf_open(&g, argv[1], &err);
    cb_vocab_load(&v, g, &err);
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 66;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n)
        return 74;
    fclose(f);
    cb_tokens ids = {0};
    for (int r = 0; r < 5; r++) {
        ids.n = 0;
        double t0 = now();
        cb_tok_encode(v, text, (size_t)n, 0, &ids);
        t[r] = now() - t0;
    }
    qsort(t, 5, sizeof t[0], cmp_d);
    printf("tok_bytes %ld\ntok_tokens %zu\ntok_s %.4f\ntok_mb_s %.2f\n", n, ids.n, t[2],
           (double)n / t[2] / 1e6);
    cb_tokens_free(&ids);
    free(text);

    /* Dequantization of every quantized tensor type present, over 16M elements. */
    static const cb_type types[] = {CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q8_0, CB_TYPE_Q4_0,
                                    CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1, CB_TYPE_Q4_K,
                                    CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    const int64_t row = 4096, rows = 4096;
    float *src = malloc(sizeof(float) * row), *dst = malloc(sizeof(float) * row);
    for (int64_t i = 0; i < row; i++)
        src[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        size_t rb = cb_type_row_bytes(types[k], row);
        uint8_t *q = malloc(rb * 64);
        for (int r = 0; r < 64; r++)
            cb_quant_row(types[k], src, q + rb * (size_t)r, row);
        double t0 = now();
        for (int64_t r = 0; r < rows; r++)
            cb_dequant_row(types[k], q + rb * (size_t)(r % 64), dst, row);
        double dt = now() - t0;
        printf("dequant_%s_melem_s %.0f\n", cb_type_name(types[k]),
               (double)(row * rows) / dt / 1e6);
        free(q);
    }
    free(src);
    free(dst);
    cb_vocab_free(v);
    cb_gguf_free(g);
    return 0;
}
