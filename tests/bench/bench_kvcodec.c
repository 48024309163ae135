/* bench_kvcodec - what the loader thread spends on a layer of a KV file per
 * element type, from memory (a hot page cache): f16's load is a copy of the
 * stored bytes (pread's) and their checksum; kivi4's adds the decoding to
 * f16 rows (lib/kv/kvcodec.c), on the CPU's fastest decoder and on the
 * portable one; coded's its zstd frames and the decoding (kvcoded.c), each
 * layer its own size.  Synthetic keys and values with outlier channels, TOKENS
 * tokens of WIDTH channels, LAYERS layers (defaults: the default model's
 * 28 layers of 2 KV heads x 128, a 512-token chunk); the median of REPS,
 * in the thread's CPU time (so that a busy machine's waits do not count).
 *
 * usage: bench_kvcodec [TOKENS [WIDTH [LAYERS [REPS]]]]
 * Prints, per path, "NAME bytes_per_token B stored_mb_s S tok_s T" lines:
 * S megabytes of stored bytes a second, T tokens (all layers) a second; a
 * tier that delivers fewer MB/s than S is what limits the load. */
#include "../../lib/kv/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng = 88172645463325252ull;
static float frnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) * 2 - 1;
}

typedef struct job {
    const uint8_t *stored; /* [layers][S] */
    uint8_t *copy;         /* S bytes: what pread fills */
    uint16_t *k, *v;       /* decoded rows */
    float *scratch;
    uint64_t S;          /* the stride of stored's layers */
    const uint64_t *len; /* [layers]: each layer's bytes (coded), or NULL: S */
    int32_t n, layers;
    int64_t w;
    int decode; /* 0 none (f16), 1 kivi4 SIMD, 2 kivi4 portable, 3 coded SIMD, 4 portable */
} job;

static uint64_t sink;

/* this thread's CPU time in ms: on a shared machine, what the work costs
 * rather than how long others kept it waiting */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double run(const job *j)
{
    double t0 = cpu_ms();
    for (int32_t l = 0; l < j->layers; l++) {
        uint64_t len = j->len ? j->len[l] : j->S;
        memcpy(j->copy, j->stored + (uint64_t)l * j->S, len);
        sink += XXH3_64bits(j->copy, len);
        if (j->decode == 1 || j->decode == 2)
            cb_kivi4_decode(j->copy, j->n, j->w, j->k, j->v, j->scratch, j->decode == 1);
        else if (j->decode)
            cb_coded_decode(j->copy, len, j->n, j->w, j->k, j->v, j->scratch, j->decode == 3);
    }
    return cpu_ms() - t0;
}

int main(int argc, char **argv)
{
    int32_t n = argc > 1 ? atoi(argv[1]) : 512, layers = argc > 3 ? atoi(argv[3]) : 28;
    int64_t w = argc > 2 ? atoll(argv[2]) : 256;
    int reps = argc > 4 ? atoi(argv[4]) : 9;
    if (n < 1 || layers < 1 || reps < 1 || reps > 1000 || !cb_kivi4_k_bytes(n, w)) {
        fprintf(stderr,
                "usage: bench_kvcodec [TOKENS [WIDTH (a multiple of 32) [LAYERS [REPS]]]]\n");
        return 64;
    }
    size_t e = (size_t)n * (size_t)w;
    uint64_t S16 = 2 * e * 2, S4 = cb_kivi4_k_bytes(n, w) + cb_kivi4_v_bytes(n, w);
    float *x = malloc(sizeof(float) * e), *y = malloc(sizeof(float) * e);
    uint8_t *f16 = malloc(S16 * (uint64_t)layers), *k4 = malloc(S4 * (uint64_t)layers);
    uint8_t *copy = malloc(S16);
    uint16_t *k = malloc(2 * e), *v = malloc(2 * e);
    uint64_t Sc = cb_coded_bound(n, w), *lc = malloc(sizeof(uint64_t) * (size_t)layers);
    uint8_t *cd = malloc(Sc * (uint64_t)layers), *copy_c = malloc(Sc);
    float *scratch = malloc(cb_coded_scratch(n, w));
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!x || !y || !f16 || !k4 || !copy || !k || !v || !scratch || !t || !lc || !cd || !copy_c)
        return 70;
    for (int32_t l = 0; l < layers; l++) {
        for (size_t i = 0; i < e; i++) {
            x[i] = i % (size_t)w % 37 == 3 ? 8 * frnd() + 6 : frnd();
            y[i] = frnd() / 2;
        }
        uint16_t *h = (uint16_t *)(f16 + S16 * (uint64_t)l);
        for (size_t i = 0; i < e; i++)
            h[i] = cb_f32_to_f16(x[i]), h[e + i] = cb_f32_to_f16(y[i]);
        cb_kivi4_encode(x, y, n, w, k4 + S4 * (uint64_t)l);
        float s = cb_coded_steps(l, layers);
        if (cb_coded_encode(x, y, n, w, s, s, cd + Sc * (uint64_t)l, Sc, &lc[l]) != CB_OK)
            return 70;
    }
    job jobs[5] = {
        {f16, copy, k, v, scratch, S16, NULL, n, layers, w, 0},
        {k4, copy, k, v, scratch, S4, NULL, n, layers, w, 1},
        {k4, copy, k, v, scratch, S4, NULL, n, layers, w, 2},
        {cd, copy_c, k, v, scratch, Sc, lc, n, layers, w, 3},
        {cd, copy_c, k, v, scratch, Sc, lc, n, layers, w, 4},
    };
    static const char *const names[5] = {"f16_load", "kivi4_load", "kivi4_load_portable",
                                         "coded_load", "coded_load_portable"};
    printf("# %d tokens x %lld channels x %d layers, median of %d\n", n, (long long)w, layers,
           reps);
    for (int i = 0; i < 5; i++) {
        run(&jobs[i]); /* warm */
        for (int r = 0; r < reps; r++)
            t[r] = run(&jobs[i]);
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        double ms = t[reps / 2], bytes = (double)jobs[i].S * layers;
        if (jobs[i].len)
            for (int32_t l = 0; l < layers; l++)
                bytes += (double)jobs[i].len[l] - (double)jobs[i].S;
        printf("%s bytes_per_token %.0f stored_mb_s %.0f tok_s %.0f\n", names[i], bytes / n,
               bytes / (ms * 1e3), n / (ms / 1e3));
    }
    free(x), free(y), free(f16), free(k4), free(copy), free(k), free(v), free(scratch), free(t);
    free(lc), free(cd), free(copy_c);
    return sink == 42 ? 1 : 0;
}
