/* test_backend_ops.c - every backend operation, on every backend, against an
 * independent reference (in the manner of ggml's test-backend-ops).
 *
 * Each case builds its inputs from a fixed seed, runs one operation through
 * a backend's table (upload, op, download) and returns the result.  The
 * CPU backend is compared with plain double-precision loops written here;
 * the CUDA backend, when a GPU is present, with the CPU backend, by the
 * normalized mean squared error sum (a - b)^2 / sum b^2 under a bound per
 * case (set by what the device path rounds: f16/bf16 weights and matmul
 * inputs, f16 caches).  Without a GPU the CUDA cases are skipped, saying
 * why. */
#include "../../lib/backend/backend.h"
#include "cbcore.h"
#include "test.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ inputs */

static uint64_t rng_s;

static void seed(uint64_t s)
{
    rng_s = s * 0x9e3779b97f4a7c15ull + 1;
}

static double urand(void) /* [0, 1) */
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * 0x1p-53;
}

static float frand(float a) /* [-a, a) */
{
    return (float)((2.0 * urand() - 1.0) * a);
}

static float *rand_vec(int64_t n, float a)
{
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = frand(a);
    return v;
}

/* backend helpers: host -> backend copies that the caller frees with bfree */
static float *bput(cb_backend *be, const void *h, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes);
    be->ops->upload(be, d, h, bytes);
    return d;
}

static void bget(cb_backend *be, void *h, const void *d, size_t bytes)
{
    be->ops->download(be, h, d, bytes);
}

static void bfree(cb_backend *be, void *d)
{
    be->ops->dealloc(be, d);
}

#define MAXOUT (1 << 22)

/* A case: run on backend be (NULL: the plain reference) into out; returns
 * the number of values. */
typedef int64_t (*case_fn)(cb_backend *be, float *out);

/* ------------------------------------------------------------ matmul */

static cb_type mm_type;
static int64_t mm_n, mm_in, mm_out;
static int mm_bias;

static int64_t c_matmul(cb_backend *be, float *out)
{
    int64_t n = mm_n, n_in = mm_in, n_out = mm_out;
    seed(1);
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(n * n_in, 1.0f), *bias = rand_vec(n_out, 0.5f);
    size_t rb = cb_type_row_bytes(mm_type, n_in);
    uint8_t *wq = malloc(rb * (size_t)n_out);
    for (int64_t o = 0; o < n_out; o++)
        cb_quant_row(mm_type, wf + o * n_in, wq + (size_t)o * rb, n_in);
    if (!be) {
        /* the weights the backend sees: the type's decoding (tested
         * against its own reference in test_quant) */
        float *w = malloc(sizeof(float) * (size_t)(n_in * n_out));
        for (int64_t o = 0; o < n_out; o++)
            cb_dequant_row(mm_type, wq + (size_t)o * rb, w + o * n_in, n_in);
        for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < n_out; o++) {
                double s = mm_bias ? bias[o] : 0.0;
                for (int64_t j = 0; j < n_in; j++)
                    s += (double)x[i * n_in + j] * w[o * n_in + j];
                out[i * n_out + o] = (float)s;
            }
        free(w);
    } else {
        cb_bweight *w = be->ops->weight_new(be, mm_type, n_in, n_out, wq, mm_bias ? bias : NULL);
        float *dx = bput(be, x, sizeof(float) * (size_t)(n * n_in));
        float *dy = be->ops->alloc(be, sizeof(float) * (size_t)(n * n_out));
        be->ops->matmul(be, w, dx, dy, n);
        bget(be, out, dy, sizeof(float) * (size_t)(n * n_out));
        bfree(be, dx);
        bfree(be, dy);
        be->ops->weight_free(be, w);
    }
    free(wf), free(x), free(bias), free(wq);
    return n * n_out;
}

/* get_rows of a weight of type mm_type: [n_out, n_in] table, 9 ids */
static int64_t c_get_rows(cb_backend *be, float *out)
{
    int64_t n_in = 256, n_rows = 40, n = 9;
    int32_t ids[9] = {3, 0, 39, 3, 17, 17, 1, 38, 20};
    seed(2);
    float *wf = rand_vec(n_in * n_rows, 1.0f);
    size_t rb = cb_type_row_bytes(mm_type, n_in);
    uint8_t *wq = malloc(rb * (size_t)n_rows);
    for (int64_t o = 0; o < n_rows; o++)
        cb_quant_row(mm_type, wf + o * n_in, wq + (size_t)o * rb, n_in);
    if (!be) {
        for (int64_t i = 0; i < n; i++)
            cb_dequant_row(mm_type, wq + (size_t)ids[i] * rb, out + i * n_in, n_in);
    } else {
        cb_bweight *w = be->ops->weight_new(be, mm_type, n_in, n_rows, wq, NULL);
        float *d = be->ops->alloc(be, sizeof(float) * (size_t)(n * n_in));
        be->ops->get_rows(be, w, ids, n, d);
        bget(be, out, d, sizeof(float) * (size_t)(n * n_in));
        bfree(be, d);
        be->ops->weight_free(be, w);
    }
    free(wf), free(wq);
    return n * n_in;
}

/* ---------------------------------------------------- elementwise ops */

static int c_inplace;

static int64_t c_rmsnorm(cb_backend *be, float *out)
{
    int64_t n = 5, d = 300; /* d: not a multiple of a warp or a block */
    float eps = 1e-5f;
    seed(3);
    float *x = rand_vec(n * d, 3.0f), *g = rand_vec(d, 1.0f);
    if (!be) {
        for (int64_t i = 0; i < n; i++) {
            double ss = 0;
            for (int64_t j = 0; j < d; j++)
                ss += (double)x[i * d + j] * x[i * d + j];
            double sc = 1.0 / sqrt(ss / (double)d + eps);
            for (int64_t j = 0; j < d; j++)
                out[i * d + j] = (float)(x[i * d + j] * sc * g[j]);
        }
    } else {
        float *dx = bput(be, x, sizeof(float) * (size_t)(n * d)), *dg = bput(be, g, sizeof(float) * (size_t)d);
        float *dy = c_inplace ? dx : be->ops->alloc(be, sizeof(float) * (size_t)(n * d));
        be->ops->rmsnorm(be, dx, dg, dy, n, d, eps);
        bget(be, out, dy, sizeof(float) * (size_t)(n * d));
        if (dy != dx)
            bfree(be, dy);
        bfree(be, dx), bfree(be, dg);
    }
    free(x), free(g);
    return n * d;
}

static int rope_neox, rope_nrot, rope_shift;

static void ref_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot, double base, int neox)
{
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++)
            for (int i = 0; i < n_rot / 2; i++) {
                double th = pos[t] * pow(base, -2.0 * i / n_rot);
                int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                float *v = x + (t * n_head + h) * hd;
                double x0 = v[a], x1 = v[b];
                v[a] = (float)(x0 * cos(th) - x1 * sin(th));
                v[b] = (float)(x0 * sin(th) + x1 * cos(th));
            }
}

/* rope at positions pos; with rope_shift, rope at pos then by delta (the
 * loaded-K shift), compared with rope at pos + delta */
static int64_t c_rope(cb_backend *be, float *out)
{
    int64_t n = 6;
    int n_head = 3, hd = 64;
    int32_t pos[6] = {0, 1, 7, 300, 2047, 4000}, delta[6] = {5, 5, 5, 5, 5, 5}, sum[6];
    seed(4);
    float *x = rand_vec(n * n_head * hd, 2.0f);
    size_t bytes = sizeof(float) * (size_t)(n * n_head * hd);
    for (int i = 0; i < 6; i++)
        sum[i] = pos[i] + delta[i];
    if (!be) {
        memcpy(out, x, bytes);
        ref_rope(out, rope_shift ? sum : pos, n, n_head, hd, rope_nrot, 10000.0, rope_neox);
    } else {
        float *d = bput(be, x, bytes);
        be->ops->rope(be, d, pos, n, n_head, hd, rope_nrot, 10000.0f, rope_neox);
        if (rope_shift)
            be->ops->rope(be, d, delta, n, n_head, hd, rope_nrot, 10000.0f, rope_neox);
        bget(be, out, d, bytes);
        bfree(be, d);
    }
    free(x);
    return n * n_head * hd;
}

static int ew_op; /* 0 add, 1 swiglu, 2 gelu */

static int64_t c_elementwise(cb_backend *be, float *out)
{
    int64_t n = 1000;
    seed(5);
    float *a = rand_vec(n, 6.0f), *b = rand_vec(n, 2.0f);
    size_t bytes = sizeof(float) * (size_t)n;
    if (!be) {
        for (int64_t i = 0; i < n; i++) {
            double x = a[i], y = b[i];
            out[i] = (float)(ew_op == 0   ? x + y
                             : ew_op == 1 ? x / (1.0 + exp(-x)) * y
                                          : 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * x * (1.0 + 0.044715 * x * x))));
        }
    } else {
        float *da = bput(be, a, bytes), *db = bput(be, b, bytes);
        if (ew_op == 0)
            be->ops->add(be, da, db, n);
        else if (ew_op == 1)
            be->ops->swiglu(be, da, db, da, n);
        else
            be->ops->gelu(be, da, da, n);
        bget(be, out, da, bytes);
        bfree(be, da), bfree(be, db);
    }
    free(a), free(b);
    return n;
}

/* ------------------------------------------------------------ caches */

static cb_type kv_type;

static float round_kv(float x)
{
    return kv_type == CB_TYPE_F16 ? (float)(_Float16)x : x;
}

/* write 7 rows at scattered positions of a 20-row cache, read back 9 rows
 * (some never written: zeros) */
static int64_t c_kv(cb_backend *be, float *out)
{
    int64_t w = 96, n_ctx = 20, n = 7, nr = 9;
    int32_t at[7] = {19, 0, 5, 6, 12, 3, 11}, rd[9] = {0, 1, 3, 5, 6, 11, 12, 19, 2};
    seed(6);
    float *src = rand_vec(n * w, 4.0f);
    if (!be) {
        float *cache = calloc((size_t)(n_ctx * w), sizeof(float));
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < w; j++)
                cache[at[i] * w + j] = round_kv(src[i * w + j]);
        for (int64_t i = 0; i < nr; i++)
            memcpy(out + i * w, cache + rd[i] * w, sizeof(float) * (size_t)w);
        free(cache);
    } else {
        size_t esz = kv_type == CB_TYPE_F32 ? 4 : 2;
        void *cache = be->ops->alloc(be, esz * (size_t)(n_ctx * w));
        float *ds = bput(be, src, sizeof(float) * (size_t)(n * w));
        float *dd = be->ops->alloc(be, sizeof(float) * (size_t)(nr * w));
        be->ops->kv_write(be, cache, kv_type, w, ds, at, n);
        be->ops->kv_read(be, cache, kv_type, w, rd, nr, dd);
        bget(be, out, dd, sizeof(float) * (size_t)(nr * w));
        bfree(be, cache), bfree(be, ds), bfree(be, dd);
    }
    free(src);
    return nr * w;
}

static int att_hd, att_nq, att_window, att_ctx = 150;

/* attention of att_nq query rows at arbitrary positions (out of order,
 * gaps, the last key) over a 150-row cache, 6 heads over 2 KV heads;
 * att_window > 0: a sliding-window layer */
static int64_t c_attention(cb_backend *be, float *out)
{
    int n_head = 6, n_head_kv = 2, hd = att_hd;
    int64_t n_ctx = att_ctx, n = att_nq, dq = (int64_t)n_head * hd, w = (int64_t)n_head_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    seed(7);
    for (int64_t i = 0; i < n; i++)
        pos[i] = i == 0 ? (int32_t)n_ctx - 1 : i == 1 ? 0 : (int32_t)(urand() * (double)n_ctx);
    float *q = rand_vec(n * dq, 2.0f), *k = rand_vec(n_ctx * w, 2.0f), *v = rand_vec(n_ctx * w, 1.0f);
    for (int64_t i = 0; i < n_ctx * w; i++)
        k[i] = round_kv(k[i]), v[i] = round_kv(v[i]);
    if (!be) {
        double *s = malloc(sizeof(double) * (size_t)n_ctx);
        for (int64_t i = 0; i < n; i++)
            for (int h = 0; h < n_head; h++) {
                int kh = h / (n_head / n_head_kv);
                double mx = -INFINITY, sum = 0;
                int64_t lo = att_window > 0 && pos[i] >= att_window ? pos[i] - att_window + 1 : 0;
                for (int64_t c = lo; c <= pos[i]; c++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)q[i * dq + h * hd + e] * k[c * w + kh * hd + e];
                    s[c] = d * scale;
                    mx = s[c] > mx ? s[c] : mx;
                }
                for (int64_t c = lo; c <= pos[i]; c++)
                    sum += (s[c] = exp(s[c] - mx));
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int64_t c = lo; c <= pos[i]; c++)
                        o += s[c] / sum * v[c * w + kh * hd + e];
                    out[i * dq + h * hd + e] = (float)o;
                }
            }
        free(s);
    } else {
        size_t esz = kv_type == CB_TYPE_F32 ? 4 : 2;
        int32_t *all = malloc(sizeof(int32_t) * (size_t)n_ctx);
        for (int64_t i = 0; i < n_ctx; i++)
            all[i] = (int32_t)i;
        void *kc = be->ops->alloc(be, esz * (size_t)(n_ctx * w)), *vc = be->ops->alloc(be, esz * (size_t)(n_ctx * w));
        float *dk = bput(be, k, sizeof(float) * (size_t)(n_ctx * w));
        float *dv = bput(be, v, sizeof(float) * (size_t)(n_ctx * w));
        float *dq_ = bput(be, q, sizeof(float) * (size_t)(n * dq));
        float *dout = be->ops->alloc(be, sizeof(float) * (size_t)(n * dq));
        be->ops->kv_write(be, kc, kv_type, w, dk, all, n_ctx);
        be->ops->kv_write(be, vc, kv_type, w, dv, all, n_ctx);
        be->ops->attention(be, dq_, pos, n, kc, vc, kv_type, n_head, n_head_kv, hd, scale, att_window, dout);
        bget(be, out, dout, sizeof(float) * (size_t)(n * dq));
        bfree(be, kc), bfree(be, vc), bfree(be, dk), bfree(be, dv), bfree(be, dq_), bfree(be, dout);
        free(all);
    }
    free(pos), free(q), free(k), free(v);
    return n * dq;
}

/* ------------------------------------------------- gather, scatter */

static int64_t c_gather_scatter(cb_backend *be, float *out)
{
    int64_t d = 70, n_src = 12, n = 5;
    int32_t idx[5] = {11, 0, 4, 5, 9};
    seed(8);
    float *src = rand_vec(n_src * d, 1.0f), *dst0 = rand_vec(n_src * d, 1.0f);
    /* out = gather(src, idx) followed by dst0 with those rows scattered to idx[] reversed */
    int32_t ridx[5] = {9, 5, 4, 0, 11};
    if (!be) {
        for (int64_t i = 0; i < n; i++)
            memcpy(out + i * d, src + idx[i] * d, sizeof(float) * (size_t)d);
        memcpy(out + n * d, dst0, sizeof(float) * (size_t)(n_src * d));
        for (int64_t i = 0; i < n; i++)
            memcpy(out + n * d + ridx[i] * d, out + i * d, sizeof(float) * (size_t)d);
    } else {
        float *ds = bput(be, src, sizeof(float) * (size_t)(n_src * d));
        float *dd = bput(be, dst0, sizeof(float) * (size_t)(n_src * d));
        float *dg = be->ops->alloc(be, sizeof(float) * (size_t)(n * d));
        be->ops->gather(be, ds, idx, n, d, dg);
        be->ops->scatter(be, dg, ridx, n, d, dd);
        bget(be, out, dg, sizeof(float) * (size_t)(n * d));
        bget(be, out + n * d, dd, sizeof(float) * (size_t)(n_src * d));
        bfree(be, ds), bfree(be, dd), bfree(be, dg);
    }
    free(src), free(dst0);
    return n * d + n_src * d;
}

/* ------------------------------------------------- blending: selection */

static int64_t c_deviation(cb_backend *be, float *out)
{
    int64_t w = 192, n_ctx = 30, n = 11;
    int32_t at[11] = {29, 0, 1, 2, 10, 11, 12, 20, 25, 26, 3};
    seed(9);
    float *cache = rand_vec(n_ctx * w, 1.0f), *src = rand_vec(n * w, 1.0f);
    for (int64_t i = 0; i < n_ctx * w; i++)
        cache[i] = round_kv(cache[i]);
    if (!be) {
        for (int64_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t j = 0; j < w; j++) {
                double d = (double)src[i * w + j] - cache[at[i] * w + j];
                s += d * d;
            }
            out[i] = (float)s;
        }
    } else {
        size_t esz = kv_type == CB_TYPE_F32 ? 4 : 2;
        int32_t all[30];
        for (int i = 0; i < 30; i++)
            all[i] = i;
        void *c = be->ops->alloc(be, esz * (size_t)(n_ctx * w));
        float *dc = bput(be, cache, sizeof(float) * (size_t)(n_ctx * w));
        float *ds = bput(be, src, sizeof(float) * (size_t)(n * w));
        float *dev = be->ops->alloc(be, sizeof(float) * (size_t)n);
        be->ops->kv_write(be, c, kv_type, w, dc, all, n_ctx);
        be->ops->deviation(be, ds, c, kv_type, w, at, n, dev);
        bget(be, out, dev, sizeof(float) * (size_t)n);
        bfree(be, c), bfree(be, dc), bfree(be, ds), bfree(be, dev);
    }
    free(cache), free(src);
    return n;
}

static int64_t topk_n;

/* top k of values with many ties: the order (larger first, ties by lower
 * index) must be exact */
static int64_t c_topk(cb_backend *be, float *out)
{
    int64_t n = topk_n, k = n / 3 + 1;
    seed(10);
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(int)(urand() * 50); /* ties */
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)k);
    if (!be) {
        char *taken = calloc((size_t)n, 1);
        for (int64_t r = 0; r < k; r++) {
            int64_t best = -1;
            for (int64_t i = 0; i < n; i++)
                if (!taken[i] && (best < 0 || x[i] > x[best]))
                    best = i;
            taken[best] = 1;
            idx[r] = (int32_t)best;
        }
        free(taken);
    } else {
        float *dx = bput(be, x, sizeof(float) * (size_t)n);
        be->ops->topk(be, dx, n, k, idx);
        bfree(be, dx);
    }
    for (int64_t r = 0; r < k; r++)
        out[r] = (float)idx[r];
    free(x), free(idx);
    return k;
}

/* ------------------------------------------------ memory and threads */

/* 12 MB through upload and download (more than a staging buffer) */
static int64_t c_roundtrip(cb_backend *be, float *out)
{
    int64_t n = 3 << 20;
    seed(11);
    float *x = rand_vec(n, 1.0f);
    if (!be) {
        memcpy(out, x, sizeof(float) * (size_t)n);
    } else {
        float *d = bput(be, x, sizeof(float) * (size_t)n);
        if (be->ops->sync)
            be->ops->sync(be);
        bget(be, out, d, sizeof(float) * (size_t)n);
        bfree(be, d);
    }
    free(x);
    return n;
}

typedef struct th_arg {
    cb_backend *be;
    float *out;
    int which;
} th_arg;

/* one thread's work: write 64 rows into its own f32 cache, sync */
static void *th_main(void *p)
{
    th_arg *a = p;
    int64_t w = 64, n = 64;
    int32_t at[64];
    seed(12 + (uint64_t)a->which);
    float *src = rand_vec(n * w, 1.0f);
    for (int i = 0; i < 64; i++)
        at[i] = 63 - i;
    if (!a->be) {
        for (int64_t i = 0; i < n; i++)
            memcpy(a->out + at[i] * w, src + i * w, sizeof(float) * (size_t)w);
    } else {
        cb_backend *be = a->be;
        void *cache = be->ops->alloc(be, sizeof(float) * (size_t)(n * w));
        float *ds = bput(be, src, sizeof(float) * (size_t)(n * w));
        for (int rep = 0; rep < 20; rep++)
            be->ops->kv_write(be, cache, CB_TYPE_F32, w, ds, at, n);
        if (be->ops->sync)
            be->ops->sync(be);
        bget(be, a->out, cache, sizeof(float) * (size_t)(n * w));
        bfree(be, cache), bfree(be, ds);
    }
    free(src);
    return NULL;
}

/* two threads at once on one backend (the KV loader's situation) */
static int64_t c_threads(cb_backend *be, float *out)
{
    pthread_t th;
    th_arg a = {be, out, 0}, b = {be, out + 64 * 64, 1};
    pthread_create(&th, NULL, th_main, &a);
    th_main(&b);
    pthread_join(th, NULL);
    return 2 * 64 * 64;
}

typedef struct ev_arg {
    cb_backend *be;
    void *cache, *ev;
    const float *src;
    int32_t *at;
    int64_t n, w;
} ev_arg;

/* the loader's half: queue writes into the cache, mark them */
static void *ev_main(void *p)
{
    ev_arg *a = p;
    cb_backend *be = a->be;
    float *ds = bput(be, a->src, sizeof(float) * (size_t)(a->n * a->w));
    for (int rep = 0; rep < 50; rep++) /* keep the device busy for a while */
        be->ops->kv_write(be, a->cache, CB_TYPE_F32, a->w, ds, a->at, a->n);
    if (a->ev)
        be->ops->event_record(be, a->ev);
    bfree(be, ds); /* freed after the writes, on this thread's queue */
    return NULL;
}

/* one thread queues writes and marks them; after the host hand-off (the
 * join) another reads the rows back, its work ordered after the mark by
 * event_wait alone: no sync anywhere (cb-run's KV loader and compute) */
static int64_t c_event(cb_backend *be, float *out)
{
    int64_t w = 256, n = 4096;
    seed(14);
    float *src = rand_vec(n * w, 1.0f);
    int32_t *at = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        at[i] = (int32_t)(n - 1 - i);
    if (!be) {
        for (int64_t i = 0; i < n; i++)
            memcpy(out + at[i] * w, src + i * w, sizeof(float) * (size_t)w);
    } else {
        pthread_t th;
        ev_arg a = {be, be->ops->alloc(be, sizeof(float) * (size_t)(n * w)), NULL, src, at, n, w};
        if (be->ops->event_new)
            a.ev = be->ops->event_new(be);
        pthread_create(&th, NULL, ev_main, &a);
        pthread_join(th, NULL);
        if (a.ev)
            be->ops->event_wait(be, a.ev);
        int32_t *all = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            all[i] = (int32_t)i;
        float *d = be->ops->alloc(be, sizeof(float) * (size_t)(n * w));
        be->ops->kv_read(be, a.cache, CB_TYPE_F32, w, all, n, d);
        bget(be, out, d, sizeof(float) * (size_t)(n * w));
        bfree(be, d), bfree(be, a.cache);
        if (a.ev)
            be->ops->event_free(be, a.ev);
        free(all);
    }
    free(src), free(at);
    return n * w;
}

/* ------------------------------------------------------------ driver */

static double nmse(const float *ref, const float *got, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        if (!isfinite(got[i]))
            return INFINITY;
        e += d * d;
        s += (double)ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

static cb_backend *cpu, *cpu_c, *cuda;
static char cuda_why[600];
static float *o_ref, *o_cpu, *o_cuda;

/* The reference vs the CPU backend within cpu_bound; the CPU vs CUDA
 * backend within cuda_bound (bounds < 0: exact equality). */
static void run_case(const char *name, case_fn fn, double cpu_bound, double cuda_bound)
{
    int64_t n_ref = fn(NULL, o_ref), n_cpu = fn(cpu, o_cpu);
    double e = nmse(o_ref, o_cpu, n_ref);
    tcase("cpu  %-28s vs reference (nmse %.2e, bound %.0e)", name, e, cpu_bound);
    CHECK(n_ref == n_cpu);
    if (cpu_bound < 0)
        CHECK(memcmp(o_ref, o_cpu, sizeof(float) * (size_t)n_ref) == 0);
    else
        CHECKF(e <= cpu_bound, "nmse %.3e > %.0e", e, cpu_bound);
    if (!cuda) {
        char nm[128];
        snprintf(nm, sizeof nm, "cuda %-28s vs cpu", name);
        tskip(nm, cuda_why);
        return;
    }
    int64_t n_cu = fn(cuda, o_cuda);
    e = nmse(o_cpu, o_cuda, n_cpu);
    tcase("cuda %-28s vs cpu (nmse %.2e, bound %.0e)", name, e, cuda_bound);
    CHECK(n_cu == n_cpu);
    if (cuda_bound < 0)
        CHECK(memcmp(o_cpu, o_cuda, sizeof(float) * (size_t)n_cpu) == 0);
    else
        CHECKF(e <= cuda_bound, "nmse %.3e > %.0e", e, cuda_bound);
}

/* The CPU backend's portable kernels (no SIMD) vs the reference: the same
 * cases the dispatched kernels pass, on every machine. */
static void run_case_c(const char *name, case_fn fn, double bound)
{
    int64_t n_ref = fn(NULL, o_ref), n_c = fn(cpu_c, o_cpu);
    double e = nmse(o_ref, o_cpu, n_ref);
    tcase("cpu-c %-27s vs reference (nmse %.2e, bound %.0e)", name, e, bound);
    CHECK(n_ref == n_c);
    CHECKF(e <= bound, "nmse %.3e > %.0e", e, bound);
}

int main(void)
{
    cb_error err;
    char name[64];
    TEST_BEGIN();
    o_ref = malloc(sizeof(float) * MAXOUT);
    o_cpu = malloc(sizeof(float) * MAXOUT);
    o_cuda = malloc(sizeof(float) * MAXOUT);
    cpu = cb_backend_cpu_new(2);
    cpu_c = cb_backend_cpu_new_ex(2, 0);
    printf("# CPU backend: %s; portable: %s\n", cpu->desc, cpu_c->desc);
    if (cb_backend_open(&cuda, "cuda", 0, &err) != CB_OK) {
        cuda = NULL;
        snprintf(cuda_why, sizeof cuda_why, "no CUDA device (see the first line)");
        printf("# CUDA cases skipped: %s\n", err.msg);
    } else {
        printf("# CUDA backend: %s\n", cuda->desc);
    }

    /* matmul over every weight type the loader reads; the device keeps
     * weights in f16 (bf16 for bf16) and rounds the input rows likewise */
    static const cb_type types[] = {CB_TYPE_F32,  CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0,
                                    CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1, CB_TYPE_Q8_0,
                                    CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        mm_type = types[i];
        mm_n = 7, mm_in = 512, mm_out = 48, mm_bias = 0;
        snprintf(name, sizeof name, "matmul %s 7x512x48", cb_type_name(mm_type));
        run_case(name, c_matmul, 1e-12, mm_type == CB_TYPE_BF16 ? 1e-4 : 1e-5);
        snprintf(name, sizeof name, "get_rows %s", cb_type_name(mm_type));
        run_case(name, c_get_rows, mm_type == CB_TYPE_F32 ? -1 : 0,
                 mm_type == CB_TYPE_BF16 ? -1 : mm_type == CB_TYPE_F32 ? 1e-6 : 1e-6);
    }
    /* The CPU kernels on every type and batch shape: one row (decode), 3
     * (a partial group of the 4-row kernel), 16 and 100 (dequantized panels
     * into sgemm, several panels, a ragged last one), an input longer than
     * the portable kernel's chunk; plain types also with an input not a
     * multiple of 32.  Bound: nmse 1e-12 against the double-precision loop
     * over the decoded weights (measured: ~5e-14, f32 sums of 256..1280
     * products). */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        static const int64_t shapes[][3] = {{1, 512, 48}, {3, 512, 48}, {16, 256, 40}, {100, 256, 300},
                                            {2, 1280, 20}};
        mm_type = types[i], mm_bias = 0;
        int plain = cb_type_block_elems(mm_type) == 1;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0] + (size_t)plain; k++) {
            if (k < sizeof shapes / sizeof shapes[0])
                mm_n = shapes[k][0], mm_in = shapes[k][1], mm_out = shapes[k][2];
            else
                mm_n = 5, mm_in = 100, mm_out = 21;
            snprintf(name, sizeof name, "matmul %s %lldx%lldx%lld", cb_type_name(mm_type), (long long)mm_n,
                     (long long)mm_in, (long long)mm_out);
            run_case(name, c_matmul, 1e-12, mm_type == CB_TYPE_BF16 ? 1e-4 : 1e-5);
            run_case_c(name, c_matmul, 1e-12);
        }
    }
    mm_type = CB_TYPE_F16, mm_n = 1, mm_in = 256, mm_out = 100, mm_bias = 0;
    run_case("matmul f16 1x256x100 (decode)", c_matmul, 1e-12, 1e-5);
    mm_type = CB_TYPE_F32, mm_n = 5, mm_in = 96, mm_out = 33, mm_bias = 1;
    run_case("matmul f32 5x96x33 + bias", c_matmul, 1e-12, 1e-5);

    c_inplace = 0;
    run_case("rmsnorm", c_rmsnorm, 1e-12, 1e-10);
    c_inplace = 1;
    run_case("rmsnorm in place", c_rmsnorm, 1e-12, 1e-10);

    for (int neox = 0; neox < 2; neox++)
        for (int part = 0; part < 2; part++)
            for (int shift = 0; shift < 2; shift++) {
                rope_neox = neox, rope_nrot = part ? 32 : 64, rope_shift = shift;
                snprintf(name, sizeof name, "rope %s rot %d%s", neox ? "neox" : "normal", rope_nrot,
                         shift ? " + shift" : "");
                run_case(name, c_rope, 1e-8, 1e-8);
            }
    ew_op = 0;
    run_case("add", c_elementwise, 1e-14, -1);
    ew_op = 1;
    run_case("swiglu", c_elementwise, 1e-12, 1e-10);
    ew_op = 2;
    run_case("gelu", c_elementwise, 1e-12, 1e-10);

    for (int f16 = 0; f16 < 2; f16++) {
        kv_type = f16 ? CB_TYPE_F16 : CB_TYPE_F32;
        snprintf(name, sizeof name, "kv_write/kv_read %s", f16 ? "f16" : "f32");
        run_case(name, c_kv, -1, -1);
        for (int hdi = 0; hdi < 3; hdi++) {
            static const int hds[3] = {64, 40, 128};
            att_hd = hds[hdi];
            att_nq = 40;
            snprintf(name, sizeof name, "attention %s hd %d 40 rows", f16 ? "f16" : "f32", att_hd);
            run_case(name, c_attention, 1e-10, 1e-9);
        }
        att_hd = 64, att_nq = 1;
        snprintf(name, sizeof name, "attention %s hd 64 1 row", f16 ? "f16" : "f32");
        run_case(name, c_attention, 1e-10, 1e-9);
        /* windows: narrower than a CUDA key tile, several tiles, and wider than the cache */
        for (int wi = 0; wi < 3; wi++) {
            static const int wins[3] = {7, 70, 512};
            att_hd = 64, att_nq = 40, att_window = wins[wi];
            snprintf(name, sizeof name, "attention %s hd 64 40 rows window %d", f16 ? "f16" : "f32", att_window);
            run_case(name, c_attention, 1e-10, 1e-9);
        }
        /* a long cache: the CPU splits the keys of few rows over threads
         * and merges (decode), and tiles them for many rows */
        att_ctx = 1300, att_hd = 64;
        for (int ci = 0; ci < 4; ci++) {
            static const int nqs[4] = {1, 3, 1, 40}, wins[4] = {0, 0, 70, 300};
            att_nq = nqs[ci], att_window = wins[ci];
            snprintf(name, sizeof name, "attention %s 1300 keys %d rows window %d", f16 ? "f16" : "f32", att_nq,
                     att_window);
            run_case(name, c_attention, 1e-10, 1e-9);
        }
        att_ctx = 150;
        att_window = 0;
        snprintf(name, sizeof name, "deviation %s", f16 ? "f16" : "f32");
        run_case(name, c_deviation, 1e-12, 1e-10);
    }
    run_case("gather + scatter", c_gather_scatter, -1, -1);
    topk_n = 10;
    run_case("topk 4 of 10 (ties)", c_topk, -1, -1);
    topk_n = 3000;
    run_case("topk 1001 of 3000 (ties)", c_topk, -1, -1);
    run_case("upload/download 12 MB", c_roundtrip, -1, -1);
    run_case("two threads at once", c_threads, -1, -1);
    run_case("event hand-over between threads", c_event, -1, -1);

    if (cuda)
        cuda->ops->free(cuda);
    cpu->ops->free(cpu);
    cpu_c->ops->free(cpu_c);
    free(o_ref), free(o_cpu), free(o_cuda);
    TEST_END();
}
