/* bench_kernels - the 8-bit activation kernels alone (lib/backend/qgemm.h),
 * on random weights of each block type, with THREADS threads:
 *   rowprod  the one-row product (decode) over 64 MB of weights, so that
 *            they stream from memory: rowprod_TYPE_gb_s (weight bytes read
 *            per second), next to rowprod_TYPE_bw_gb_s, the same threads
 *            reading a plain 1 GB buffer in turns with it (membw_gb_s:
 *            that alone, first)
 *   blocked  a 512-row batch through packed panels (prefill):
 *            blocked_TYPE_gmacs (multiply-adds per second, packing
 *            included) and blocked_TYPE_pack_pct (its share)
 *   attn     decode's attention: one query row over 4,096 keys of an f16
 *            cache in every layer, shaped as SmolLM2-135M's and
 *            Qwen2.5-1.5B's, through the CPU backend: attn_MODEL_gb_s (cache
 *            bytes read per second; the whole cache streams from memory),
 *            and attn_MODEL_bw_gb_s, the plain read in turns with it
 * A figure and its plain read alternate, best of 5 (7) each: on a shared
 * machine the bandwidth moves by 20% from one minute to the next, and a
 * share of a read taken minutes apart says as much about the minute.
 * usage: bench_kernels THREADS [rowprod|blocked|attn]...  The kernels are the
 * ones the CPU backend picks (kernels_isa says which).  rowprod's shape
 * from the environment: CB_ROWPROD_NIN (inputs a row, default 1536),
 * CB_ROWPROD_KB (weights, default 65536: from memory; a few hundred: from
 * cache, passes repeated), CB_ROWPROD_ROWS (activation rows, default 1),
 * CB_ROWPROD_TYPE (one type); with more than one row,
 * rowprod_TYPE_ROWS_gmacs too.  CB_KERNELS_ISA=c|avx2|avxvnni|avx512|
 * avx512vnni takes that set's kernels (one the CPU lacks: its best);
 * CB_ROWS_MIN=N gives the few-row kernel N rows and more (99: none),
 * CB_ROWS_ALL=1 every type it has (not only those qg_gemv gives it). */
#include "../../lib/backend/backend.h"
#include "../../lib/backend/qgemm.h"
#include "cbcore.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t env_or(const char *name, int64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoll(v) : dflt;
}

/* CB_BENCH_CPUTIME=1: the process's CPU time instead of the wall clock (on
 * a machine shared with other work, for comparing kernels, one thread) */
static double now(void)
{
    struct timespec ts;
    clock_gettime(getenv("CB_BENCH_CPUTIME") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t rng = 1;
static float frand(void)
{
    rng = rng * 1103515245u + 12345u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static qg_kernels K;

typedef struct job {
    cb_type t;
    const uint8_t *w, *xq;
    size_t rb;
    int64_t n_in, o0, o1, n_out;
    float *y;
    const uint64_t *buf; /* membw */
    size_t nbuf;
    uint64_t sum;
} job;

static int rp_reps = 1, rp_rows = 1; /* passes over the weights; activation rows */

static void *rowprod_run(void *arg)
{
    job *j = arg;
    size_t ab = qg_act_bytes(j->t, j->n_in);
    for (int k = 0; k < rp_reps; k++)
        qg_gemv(&K, j->t, j->w, j->rb, j->n_in, j->xq, ab, rp_rows, j->o0, j->o1, j->y, j->n_out);
    return NULL;
}

static void *membw_run(void *arg)
{
    job *j = arg;
    uint64_t s[4] = {0};
    for (size_t i = 0; i + 4 <= j->nbuf; i += 4)
        for (int k = 0; k < 4; k++)
            s[k] ^= j->buf[i + k];
    j->sum = s[0] ^ s[1] ^ s[2] ^ s[3];
    return NULL;
}

/* the plain read's buffer (1 GB), for bw_pass */
static uint64_t *bw_buf;
static const size_t bw_n = (size_t)1 << 27;

static double timed(void *(*fn)(void *), job *proto, int64_t n, int T, int rounds, double *bw);

/* GB/s of T threads reading bw_buf once */
static double bw_pass(int T)
{
    if (!bw_buf) {
        if (!(bw_buf = malloc(sizeof *bw_buf * bw_n))) {
            fprintf(stderr, "bench_kernels: no memory for the 1 GB read buffer\n");
            exit(71);
        }
        memset(bw_buf, 1, sizeof *bw_buf * bw_n);
    }
    job bw = {.buf = bw_buf, .nbuf = bw_n};
    return (double)(sizeof *bw_buf * bw_n) / timed(membw_run, &bw, 0, T, 1, NULL) / 1e9;
}

/* the best time of `rounds` runs of fn over T threads splitting [0, n);
 * with bw, each run is preceded by a plain read of bw_buf, and *bw is the
 * best of those (GB/s) */
static double timed(void *(*fn)(void *), job *proto, int64_t n, int T, int rounds, double *bw)
{
    pthread_t th[64];
    job j[64];
    double best = 1e9;
    if (bw)
        *bw = 0;
    for (int r = 0; r < rounds; r++) {
        if (bw) {
            double g = bw_pass(T);
            *bw = g > *bw ? g : *bw;
        }
        double t0 = now();
        for (int i = 0; i < T; i++) {
            j[i] = *proto;
            j[i].o0 = n * i / T / 64 * 64, j[i].o1 = i == T - 1 ? n : n * (i + 1) / T / 64 * 64;
            if (proto->buf) {
                j[i].buf = proto->buf + proto->nbuf / (size_t)T * (size_t)i;
                j[i].nbuf = proto->nbuf / (size_t)T;
            }
            pthread_create(&th[i], NULL, fn, &j[i]);
        }
        for (int i = 0; i < T; i++)
            pthread_join(th[i], NULL);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

static uint8_t *random_weights(cb_type t, int64_t n_in, int64_t n_out)
{
    size_t rb = cb_type_row_bytes(t, n_in);
    uint8_t *w = malloc(rb * (size_t)n_out);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t j = 0; j < n_in; j++)
            row[j] = 0.05f * frand();
        cb_quant_row(t, row, w + (size_t)o * rb, n_in);
    }
    free(row);
    return w;
}

static uint8_t *quantized_rows(cb_type t, int64_t n_in, int64_t n)
{
    size_t ab = qg_act_bytes(t, n_in);
    uint8_t *xq = malloc(ab * (size_t)n);
    float *x = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < n_in; j++)
            x[j] = frand();
        if (qg_is_k(t))
            K.quant_k(x, n_in, (qg_q8k *)(void *)(xq + (size_t)r * ab));
        else
            K.quant_0(x, n_in, (qmm_q8 *)(void *)(xq + (size_t)r * ab));
    }
    free(x);
    return xq;
}

static const cb_type types[] = {CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K, CB_TYPE_Q4_0,
                                CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q8_0};

static void rowprod(int T)
{
    printf("membw_gb_s %.1f\n", bw_pass(T));
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cb_type t = types[i];
        if (getenv("CB_ROWPROD_TYPE") && strcmp(getenv("CB_ROWPROD_TYPE"), cb_type_name(t)))
            continue;
        int64_t n_in = env_or("CB_ROWPROD_NIN", 1536), kb = env_or("CB_ROWPROD_KB", 65536),
                rb = (int64_t)cb_type_row_bytes(t, n_in), n_out = (kb << 10) / rb / 64 * 64;
        rp_reps = kb < 65536 ? (int)(65536 / kb) : 1;
        rp_rows = (int)env_or("CB_ROWPROD_ROWS", 1);
        job j = {.t = t, .rb = (size_t)rb, .n_in = n_in, .n_out = n_out};
        uint8_t *w = random_weights(t, n_in, n_out), *xq = quantized_rows(t, n_in, rp_rows);
        float *y = malloc(sizeof(float) * (size_t)n_out * (size_t)rp_rows);
        j.w = w, j.xq = xq, j.y = y;
        double bw, dt = timed(rowprod_run, &j, n_out, T, 5, &bw);
        printf("rowprod_%s_gb_s %.1f\nrowprod_%s_bw_gb_s %.1f\n", cb_type_name(t),
               (double)rb * (double)n_out * rp_reps / dt / 1e9, cb_type_name(t), bw);
        if (rp_rows > 1)
            printf("rowprod_%s_%d_gmacs %.1f\n", cb_type_name(t), rp_rows,
                   (double)n_in * (double)n_out * rp_rows * rp_reps / dt / 1e9);
        free(w), free(xq), free(y);
    }
}

static void blocked(void)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cb_type t = types[i];
        int64_t n_in = 1536, n_out = 2048, n = 512;
        size_t rb = cb_type_row_bytes(t, n_in), ab = qg_act_bytes(t, n_in);
        uint8_t *w = random_weights(t, n_in, n_out), *xq = quantized_rows(t, n_in, n);
        uint8_t *panel = malloc(qg_panel_bytes(t, n_in, K.layout.p));
        float *y = malloc(sizeof(float) * (size_t)(n * n_out));
        double best = 1e9, pack = 0;
        for (int r = 0; r < 5; r++) {
            double t0 = now(), tp = 0;
            for (int64_t o0 = 0; o0 < n_out; o0 += K.layout.p) {
                double a = now();
                qg_pack(t, w, rb, n_in, o0, K.layout.p, panel, &K);
                tp += now() - a;
                K.gemm(t, panel, n_in, xq, ab, n, K.layout.p, y + o0, n_out);
            }
            double dt = now() - t0;
            if (dt < best)
                best = dt, pack = tp;
        }
        printf("blocked_%s_gmacs %.1f\nblocked_%s_pack_pct %.1f\n", cb_type_name(t),
               (double)n * (double)n_in * (double)n_out / best / 1e9, cb_type_name(t),
               100 * pack / best);
        free(w), free(xq), free(panel), free(y);
    }
}

/* every layer's attention for one new token at position n_keys - 1, as
 * decode runs it, over caches that together exceed the last-level cache */
static void attn(int T)
{
    static const struct {
        const char *name;
        int n_head, n_head_kv, hd, n_layer;
    } shapes[] = {{"smollm2", 9, 3, 64, 30}, {"qwen1.5b", 12, 2, 128, 28}};
    int64_t n_keys = env_or("CB_ATTN_KEYS", 4096), reps = n_keys < 4096 ? 4096 / n_keys : 1;
    cb_backend *be = cb_backend_cpu_new(T);
    if (!be)
        return;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int nh = shapes[i].n_head, nkv = shapes[i].n_head_kv, hd = shapes[i].hd,
            nl = shapes[i].n_layer;
        int64_t w = (int64_t)nkv * hd;
        size_t cb = sizeof(uint16_t) * (size_t)(n_keys * w);
        void **kv = calloc(2 * (size_t)nl, sizeof *kv);
        float *q = malloc(sizeof(float) * (size_t)nh * hd), *out = malloc(sizeof *out * nh * hd);
        for (int e = 0; e < nh * hd; e++)
            q[e] = frand();
        for (int l = 0; l < 2 * nl; l++) {
            uint16_t *c = kv[l] = be->ops->alloc(be, cb);
            for (int64_t e = 0; c && e < n_keys * w; e++)
                c[e] = (uint16_t)(0x3000 | (frand() > 0 ? 0 : 0x8000) | (rng >> 12 & 0x3ff));
        }
        int32_t pos = (int32_t)(n_keys - 1);
        double best = 1e9, bw = 0;
        for (int r = 0; r < 7; r++) {
            double g = bw_pass(T);
            bw = g > bw ? g : bw;
            double t0 = now();
            for (int64_t p = 0; p < reps * nl; p++)
                be->ops->attention(be, q, &pos, 1, kv[p % nl * 2], kv[p % nl * 2 + 1], CB_TYPE_F16,
                                   nh, nkv, hd, 1.0f / 8, 0, out);
            double dt = now() - t0;
            best = dt < best ? dt : best;
        }
        printf("attn_%s_gb_s %.1f\nattn_%s_bw_gb_s %.1f\n", shapes[i].name,
               2.0 * nl * reps * (double)cb / best / 1e9, shapes[i].name, bw);
        for (int l = 0; l < 2 * nl; l++)
            be->ops->dealloc(be, kv[l]);
        free(kv), free(q), free(out);
    }
    be->ops->free(be);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_kernels THREADS rowprod|blocked|attn...\n");
        return 64;
    }
    int T = atoi(argv[1]);
    T = T < 1 ? 1 : T > 64 ? 64 : T;
    qg_select(1, &K);
    const char *isa = getenv("CB_KERNELS_ISA");
    for (int i = QG_ISA_C; isa && i <= QG_ISA_AVX512VNNI; i++) {
        qg_kernels k;
        qg_select_isa(i, &k);
        if (!strcmp(k.isa, isa))
            K = k;
    }
    if (getenv("CB_ROWS_MIN"))
        K.rows_min = atoi(getenv("CB_ROWS_MIN"));
    if (getenv("CB_ROWS_ALL"))
        K.rows_types = ~0u;
    printf("kernels_isa %s\n", K.isa);
    for (int a = 2; a < argc; a++) {
        if (!strcmp(argv[a], "rowprod"))
            rowprod(T);
        else if (!strcmp(argv[a], "blocked"))
            blocked();
        else if (!strcmp(argv[a], "attn"))
            attn(T);
        else {
            fprintf(stderr, "bench_kernels: unknown scenario '%s'\n", argv[a]);
            return 64;
        }
    }
    return 0;
}
