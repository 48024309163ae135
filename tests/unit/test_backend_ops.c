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
#include "../../lib/backend/blas.h"
#include "../../lib/backend/opmath.h"
#include "../../lib/backend/qgemm.h"
#include "../../lib/backend/qmm.h"
#include "cbcore.h"
#include "test.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ inputs */

static uint64_t rng_s;

static void seed(uint64_t s) { rng_s = s * 0x9e3779b97f4a7c15ull + 1; }

static double urand(void) /* [0, 1) */
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (double)(rng_s >> 11) * 0x1p-53;
}

static float frand(float a) /* [-a, a) */ { return (float)((2.0 * urand() - 1.0) * a); }

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

static void bfree(cb_backend *be, void *d) { be->ops->dealloc(be, d); }

#define MAXOUT (12 << 20) /* floats: the 40 MB round trip */

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
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(n * n_in, 1.0f),
          *bias = rand_vec(n_out, 0.5f);
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

/* Four products in a row on one f16 weight, past the few-row kernel
 * (cuBLAS, each input scaled to f16's range by its largest magnitude),
 * inputs of magnitude 1e4, 1e-7, 1e-7 and 1: each output divided by its
 * input's magnitude, so that each product weighs alike in the nmse.  A
 * scale left over from an earlier product (CUDA's amax slots under
 * CB_CUDA_FUSE=1, which no memset clears) would put the 1e-7 inputs among
 * f16's subnormals (a few levels apart): nmse ~1e-2. */
static int64_t c_matmul_seq(cb_backend *be, float *out)
{
    enum { N = 12, IN = 256, OUT = 40, K = 4 };
    static const float mag[K] = {1e4f, 1e-7f, 1e-7f, 1.0f};
    seed(77);
    float *wf = rand_vec(IN * OUT, 1.0f), *x0 = rand_vec(N * IN, 1.0f);
    float *x = malloc(sizeof(float) * K * N * IN);
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N * IN; i++)
            x[k * N * IN + i] = x0[i] * mag[k];
    size_t rb = cb_type_row_bytes(CB_TYPE_F16, IN);
    uint8_t *wq = malloc(rb * OUT);
    for (int o = 0; o < OUT; o++)
        cb_quant_row(CB_TYPE_F16, wf + o * IN, wq + (size_t)o * rb, IN);
    if (!be) {
        float *w = malloc(sizeof(float) * IN * OUT);
        for (int o = 0; o < OUT; o++)
            cb_dequant_row(CB_TYPE_F16, wq + (size_t)o * rb, w + o * IN, IN);
        for (int k = 0; k < K; k++)
            for (int i = 0; i < N; i++)
                for (int o = 0; o < OUT; o++) {
                    double sum = 0;
                    for (int j = 0; j < IN; j++)
                        sum += (double)x[(k * N + i) * IN + j] * w[o * IN + j];
                    out[(k * N + i) * OUT + o] = (float)(sum / mag[k]);
                }
        free(w);
    } else {
        cb_bweight *w = be->ops->weight_new(be, CB_TYPE_F16, IN, OUT, wq, NULL);
        float *dx = bput(be, x, sizeof(float) * K * N * IN);
        float *dy = be->ops->alloc(be, sizeof(float) * K * N * OUT);
        for (int k = 0; k < K; k++) /* queued back to back, read after */
            be->ops->matmul(be, w, dx + k * N * IN, dy + k * N * OUT, N);
        bget(be, out, dy, sizeof(float) * K * N * OUT);
        for (int k = 0; k < K; k++)
            for (int i = 0; i < N * OUT; i++)
                out[k * N * OUT + i] /= mag[k];
        bfree(be, dx), bfree(be, dy);
        be->ops->weight_free(be, w);
    }
    free(wf), free(x0), free(x), free(wq);
    return K * N * OUT;
}

/* The 8-bit activation path's math, plain: each group of 32 activations
 * (256 for the K-quants: llama.cpp's Q8_K) quantized (d = max|x| / 127,
 * q = x / d rounded half to even), then the double sum of the decoded
 * weights times d * q (qgemm.h).  act8_exact = 1: c_matmul's exact
 * reference instead (the f32 product the approximation is measured
 * against). */
static int act8_exact;

static int64_t c_matmul_act8(cb_backend *be, float *out)
{
    if (be || act8_exact)
        return c_matmul(be, out);
    int64_t n = mm_n, n_in = mm_in, n_out = mm_out;
    seed(1);
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(n * n_in, 1.0f);
    size_t rb = cb_type_row_bytes(mm_type, n_in);
    uint8_t *wq = malloc(rb * (size_t)n_out);
    float *w = malloc(sizeof(float) * (size_t)(n_in * n_out));
    double *xd = malloc(sizeof(double) * (size_t)(n * n_in));
    for (int64_t o = 0; o < n_out; o++) {
        cb_quant_row(mm_type, wf + o * n_in, wq + (size_t)o * rb, n_in);
        cb_dequant_row(mm_type, wq + (size_t)o * rb, w + o * n_in, n_in);
    }
    int gl = (int)cb_type_block_elems(mm_type); /* 256 for the K-quants (Q8_K), else 32 (Q8_0) */
    for (int64_t g = 0; g < n * n_in / gl; g++) {
        float amax = 0;
        for (int j = 0; j < gl; j++)
            amax = fmaxf(amax, fabsf(x[gl * g + j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < gl; j++)
            xd[gl * g + j] = (double)d * nearbyintf(x[gl * g + j] * id);
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < n_out; o++) {
            double s = 0;
            for (int64_t j = 0; j < n_in; j++)
                s += xd[i * n_in + j] * w[o * n_in + j];
            out[i * n_out + o] = (float)s;
        }
    free(wf), free(x), free(wq), free(w), free(xd);
    return n * n_out;
}

/* qmm_group8's integers and factors give cb_dequant_row's values (up to
 * the one rounding each does), for every group of a random row */
static int64_t c_group8(cb_backend *be, float *out)
{
    int64_t n_in = 512;
    seed(3);
    float *wf = rand_vec(n_in, 1.0f);
    size_t rb = cb_type_row_bytes(mm_type, n_in);
    uint8_t *wq = malloc(rb);
    cb_quant_row(mm_type, wf, wq, n_in);
    if (!be) {
        cb_dequant_row(mm_type, wq, out, n_in);
    } else {
        int per = cb_type_block_elems(mm_type) / 32;
        for (int64_t g = 0; g < n_in / 32; g++) {
            int16_t wi[32];
            float a, b;
            qmm_group8(mm_type, wq + (size_t)(g / per) * cb_type_row_bytes(mm_type, 32 * per),
                       (int)(g % per), wi, &a, &b);
            for (int j = 0; j < 32; j++)
                out[32 * g + j] = (float)((double)a * wi[j] + b);
        }
    }
    free(wf), free(wq);
    return n_in;
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

static int64_t rms_n = 5; /* rows */

static int64_t c_rmsnorm(cb_backend *be, float *out)
{
    int64_t n = rms_n, d = 300; /* d: not a multiple of a warp or a block */
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
        float *dx = bput(be, x, sizeof(float) * (size_t)(n * d)),
              *dg = bput(be, g, sizeof(float) * (size_t)d);
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

static int rope_neox, rope_nrot, rope_shift, rope_ff;

/* frequency divisors for the rope_ff cases: 1 for the fast pairs, 8 for the
 * slow ones, a ramp between (the shape of Llama 3's rope_freqs) */
static float ff_of(int i, int n_rot)
{
    double t = (double)i / (n_rot / 2);
    return (float)(t < 0.25 ? 1.0 : t > 0.75 ? 8.0 : 1.0 + 14.0 * (t - 0.25));
}

static void ref_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot,
                     double base, int neox)
{
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++)
            for (int i = 0; i < n_rot / 2; i++) {
                double th =
                    pos[t] * pow(base, -2.0 * i / n_rot) / (rope_ff ? ff_of(i, n_rot) : 1.0);
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
        float ffh[512], *ff = NULL;
        for (int i = 0; i < rope_nrot / 2; i++)
            ffh[i] = ff_of(i, rope_nrot);
        if (rope_ff)
            ff = bput(be, ffh, sizeof(float) * (size_t)(rope_nrot / 2));
        float *d = bput(be, x, bytes);
        be->ops->rope(be, d, pos, n, n_head, hd, rope_nrot, 10000.0f, ff, rope_neox);
        if (rope_shift)
            be->ops->rope(be, d, delta, n, n_head, hd, rope_nrot, 10000.0f, ff, rope_neox);
        bget(be, out, d, bytes);
        bfree(be, d);
        if (ff)
            bfree(be, ff);
    }
    free(x);
    return n * n_head * hd;
}

static int ew_op; /* 0 add, 1 swiglu, 2 geglu, 3 scale */
static int64_t ew_n = 1000;

static int64_t c_elementwise(cb_backend *be, float *out)
{
    int64_t n = ew_n;
    seed(5);
    float *a = rand_vec(n, 6.0f), *b = rand_vec(n, 2.0f);
    size_t bytes = sizeof(float) * (size_t)n;
    if (!be) {
        for (int64_t i = 0; i < n; i++) {
            double x = a[i], y = b[i];
            out[i] =
                (float)(ew_op == 0   ? x + y
                        : ew_op == 1 ? x / (1.0 + exp(-x)) * y
                        : ew_op == 2
                            ? 0.5 * x *
                                  (1.0 + tanh(sqrt(2.0 / M_PI) * x * (1.0 + 0.044715 * x * x))) * y
                            : x * 25.298221281347036);
        }
    } else {
        float *da = bput(be, a, bytes), *db = bput(be, b, bytes);
        if (ew_op == 0)
            be->ops->add(be, da, db, n);
        else if (ew_op == 1)
            be->ops->swiglu(be, da, db, da, n);
        else if (ew_op == 2)
            be->ops->geglu(be, da, db, da, n);
        else
            be->ops->scale(be, da, 25.298221281347036f, n);
        bget(be, out, da, bytes);
        bfree(be, da), bfree(be, db);
    }
    free(a), free(b);
    return n;
}

/* ------------------------------------------------------------ caches */

static cb_type kv_type;

static float round_kv(float x) { return kv_type == CB_TYPE_F16 ? (float)(_Float16)x : x; }

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

static int att_hd, att_nq, att_window, att_ctx = 150, att_nan, att_heads = 6, att_kv_heads = 2,
                                       att_sorted, att_consec;
/* 1: two channels of every key head 20 times the rest (Qwen2's keys have such) */
static int att_big_k;
/* != 0: set_key_bias flags every third key (1, 4, 7, ...) with this bias
 * for the rows below position att_until (blending's stale scale) */
static float att_stale;
static int32_t att_until;
static int att_flagged(int64_t c) { return att_stale != 0.0f && c % 3 == 1; }
static int att_biased(int32_t pos) { return att_stale != 0.0f && pos < att_until; }

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The double reference's softmax of one query row and head (qh, its hd
 * values) over the keys at kh (rows w apart) its position sees: 0..pos, or
 * with window > 0 the last window of them.  s[lo..pos] gets the
 * exponentials (of the scaled logits less their maximum), *lo the first;
 * returns their sum. */
static double ref_softmax(const float *qh, const float *kh, int64_t w, int hd, int32_t pos,
                          int window, float scale, double *s, int64_t *lo)
{
    double mx = -INFINITY, sum = 0;
    *lo = window > 0 && pos >= window ? pos - window + 1 : 0;
    for (int64_t c = *lo; c <= pos; c++) {
        double d = 0;
        for (int e = 0; e < hd; e++)
            d += (double)qh[e] * kh[c * w + e];
        s[c] = d * scale + (att_biased(pos) && att_flagged(c) ? att_stale : 0.0);
        mx = s[c] > mx ? s[c] : mx;
    }
    for (int64_t c = *lo; c <= pos; c++)
        sum += (s[c] = exp(s[c] - mx));
    return sum;
}

/* n query positions over n_keys keys, out of order: the last key, the
 * first, then drawn from the generator (seeded by the caller) */
static int32_t *scattered_pos(int64_t n, int64_t n_keys)
{
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        pos[i] = i == 0 ? (int32_t)n_keys - 1 : i == 1 ? 0 : (int32_t)(urand() * (double)n_keys);
    return pos;
}

/* attention of att_nq query rows at arbitrary positions (out of order,
 * gaps, the last key) over an att_ctx-row cache, att_heads heads over
 * att_kv_heads KV heads; att_window > 0: a sliding-window layer.
 * att_sorted: the positions in ascending order, as blend's recomputed
 * rows are (the CPU skips the rows a key tile is wholly masked for), with
 * rows on and beside the CPU's tile edges (multiples of 256 from 0, and
 * from where two splits of 1300 keys meet). */
static int64_t c_attention(cb_backend *be, float *out)
{
    int n_head = att_heads, n_head_kv = att_kv_heads, hd = att_hd;
    int64_t n_ctx = att_ctx, n = att_nq, dq = (int64_t)n_head * hd, w = (int64_t)n_head_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    seed(7);
    int32_t *pos = scattered_pos(n, n_ctx);
    for (int64_t i = 0; att_consec && i < n; i++) /* a prefill's rows: 0, 1, 2, ... */
        pos[i] = (int32_t)(i % n_ctx);
    if (att_sorted) {
        static const int32_t edges[] = {255, 256, 257, 511, 512, 649,  650,
                                        651, 767, 768, 905, 906, 1023, 1024};
        for (size_t e = 0; e < sizeof edges / sizeof edges[0] && (int64_t)e + 2 < n; e++)
            if (edges[e] < n_ctx)
                pos[e + 2] = edges[e];
        qsort(pos, (size_t)n, sizeof *pos, cmp_i32);
    }
    float *q = rand_vec(n * dq, 2.0f), *k = rand_vec(n_ctx * w, 2.0f),
          *v = rand_vec(n_ctx * w, 1.0f);
    for (int64_t i = 0; i < n_ctx * w; i++) {
        if (att_big_k && (i % hd == 3 || i % hd == hd - 9))
            k[i] = 20.0f + k[i];
        k[i] = round_kv(k[i]), v[i] = round_kv(v[i]);
    }
    if (att_nan)
        q[0] = NAN; /* row 0, head 0 */
    if (!be) {
        double *s = malloc(sizeof(double) * (size_t)n_ctx);
        for (int64_t i = 0; i < n; i++)
            for (int h = 0; h < n_head; h++) {
                int kh = h / (n_head / n_head_kv);
                int64_t lo;
                double sum = ref_softmax(q + i * dq + h * hd, k + kh * hd, w, hd, pos[i],
                                         att_window, scale, s, &lo);
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
        void *kc = be->ops->alloc(be, esz * (size_t)(n_ctx * w)),
             *vc = be->ops->alloc(be, esz * (size_t)(n_ctx * w));
        float *dk = bput(be, k, sizeof(float) * (size_t)(n_ctx * w));
        float *dv = bput(be, v, sizeof(float) * (size_t)(n_ctx * w));
        float *dq_ = bput(be, q, sizeof(float) * (size_t)(n * dq));
        float *dout = be->ops->alloc(be, sizeof(float) * (size_t)(n * dq));
        be->ops->kv_write(be, kc, kv_type, w, dk, all, n_ctx);
        be->ops->kv_write(be, vc, kv_type, w, dv, all, n_ctx);
        uint8_t *flags = malloc((size_t)n_ctx);
        for (int64_t c = 0; c < n_ctx; c++)
            flags[c] = (uint8_t)att_flagged(c);
        if (att_stale != 0.0f)
            be->ops->set_key_bias(be, flags, n_ctx, att_stale, att_until);
        free(flags);
        be->ops->attention(be, dq_, pos, n, kc, vc, kv_type, n_head, n_head_kv, hd, scale,
                           att_window, dout);
        if (att_stale != 0.0f)
            be->ops->set_key_bias(be, NULL, 0, 0.0f, 0);
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

/* blending's attention mass (probe's score): am_nq query rows at
 * scattered positions (out of order, both ends) over an am_keys-row cache,
 * am_heads heads over am_kv_heads KV heads, am_window > 0 a sliding-window
 * layer, am_values: each probability times the L2 norm of the key's value
 * row in its KV head; added to a mass that already holds something */
static int am_nq = 20, am_keys = 150, am_window, am_heads = 6, am_kv_heads = 2, am_hd = 64,
           am_values;

static int64_t c_attn_mass(cb_backend *be, float *out)
{
    int n_head = am_heads, n_head_kv = am_kv_heads, hd = am_hd;
    int64_t n_keys = am_keys, n = am_nq, dq = (int64_t)n_head * hd, w = (int64_t)n_head_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    seed(19);
    int32_t *pos = scattered_pos(n, n_keys);
    float *q = rand_vec(n * dq, 2.0f), *k = rand_vec(n_keys * w, 2.0f),
          *m0 = rand_vec(n_keys, 1.0f), *v = rand_vec(n_keys * w, 1.5f);
    for (int64_t i = 0; i < n_keys * w; i++)
        k[i] = round_kv(k[i]), v[i] = round_kv(v[i]);
    if (!be) {
        double *s = malloc(sizeof(double) * (size_t)n_keys),
               *mass = malloc(sizeof(double) * (size_t)n_keys);
        for (int64_t j = 0; j < n_keys; j++)
            mass[j] = m0[j];
        for (int h = 0; h < n_head; h++)
            for (int64_t i = 0; i < n; i++) {
                int kh = h / (n_head / n_head_kv);
                int64_t lo;
                double sum = ref_softmax(q + i * dq + h * hd, k + kh * hd, w, hd, pos[i], am_window,
                                         scale, s, &lo);
                for (int64_t c = lo; c <= pos[i]; c++) {
                    double vn = 0;
                    for (int e = 0; e < hd && am_values; e++)
                        vn += (double)v[c * w + kh * hd + e] * v[c * w + kh * hd + e];
                    mass[c] += s[c] / sum * (am_values ? sqrt(vn) : 1.0);
                }
            }
        for (int64_t j = 0; j < n_keys; j++)
            out[j] = (float)mass[j];
        free(s), free(mass);
    } else {
        size_t esz = kv_type == CB_TYPE_F32 ? 4 : 2;
        int32_t *all = malloc(sizeof(int32_t) * (size_t)n_keys);
        for (int64_t i = 0; i < n_keys; i++)
            all[i] = (int32_t)i;
        void *kc = be->ops->alloc(be, esz * (size_t)(n_keys * w)),
             *vc = be->ops->alloc(be, esz * (size_t)(n_keys * w));
        float *dk = bput(be, k, sizeof(float) * (size_t)(n_keys * w));
        float *dv = bput(be, v, sizeof(float) * (size_t)(n_keys * w));
        float *dq_ = bput(be, q, sizeof(float) * (size_t)(n * dq));
        float *dm = bput(be, m0, sizeof(float) * (size_t)n_keys);
        be->ops->kv_write(be, kc, kv_type, w, dk, all, n_keys);
        be->ops->kv_write(be, vc, kv_type, w, dv, all, n_keys);
        cb_status st = cb_backend_attn_mass(be, dq_, pos, n, kc, am_values ? vc : NULL, kv_type,
                                            n_keys, n_head, n_head_kv, hd, scale, am_window, dm);
        bget(be, out, dm, sizeof(float) * (size_t)n_keys);
        if (st != CB_OK)
            out[0] = NAN; /* fails the comparison */
        bfree(be, kc), bfree(be, vc), bfree(be, dk), bfree(be, dv), bfree(be, dq_), bfree(be, dm);
        free(all);
    }
    free(pos), free(q), free(k), free(m0), free(v);
    return n_keys;
}

/* A backend without attn_mass (the CPU's table less it): the host
 * fallback on copies, on one thread, gives the CPU's operation's bits,
 * also where the operation splits the heads and the keys over its
 * threads (1,100 keys: ranges of them summed by each thread) */
static void test_attn_mass_fallback(cb_backend *cpu_be, float *o_op, float *o_fb)
{
    cb_backend_ops ops = *cpu_be->ops;
    cb_backend fb = *cpu_be;
    ops.attn_mass = NULL;
    fb.ops = &ops;
    for (int ci = 0; ci < 2; ci++) {
        am_window = ci ? 0 : 7, am_keys = ci ? 1100 : 150, am_nq = ci ? 37 : 20;
        am_heads = ci ? 12 : 6, am_hd = ci ? 128 : 64;
        for (am_values = 0; am_values < 2; am_values++) {
            int64_t n = c_attn_mass(cpu_be, o_op);
            c_attn_mass(&fb, o_fb);
            tcase("cpu  attn_mass's host fallback (no operation) equals the operation, %d keys%s",
                  am_keys, am_values ? ", by value" : "");
            CHECK(memcmp(o_op, o_fb, sizeof(float) * (size_t)n) == 0);
        }
    }
    am_values = 0, am_window = 0, am_keys = 150, am_nq = 20, am_heads = 6, am_hd = 64;
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

/* ======================================================================
 * Cases from the CUDA backend's review (issue 18): each is written to
 * catch one way the device path could compute wrong numbers or fail on
 * first contact; on the CPU they check the same contract (and some of the
 * reasoning: the f16 scaling choice, NaN's place in topk).
 * ====================================================================== */

/* Round to f16 and to bf16 (round to nearest even), as the device does. */
static float to_f16(float x) { return (float)(_Float16)x; }

static float to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* cb_op_f16_scale_exp: max * 2^e lands in [2^14, 2^15) over 80 binades and
 * every value of the block then fits f16; 0, inf and NaN leave it alone;
 * the clamp (|e| <= 60, so that alpha stays a normal f32) covers
 * magnitudes from 2^-45 to 2^75. */
static void r18_scale_exp(void)
{
    int bad = 0;
    tcase("f16 scale exponent: max 2^e in [2^14, 2^15), the block finite in f16");
    for (int b = -40; b <= 40; b++)
        for (int k = 0; k <= 16; k++) {
            float amax =
                k < 16 ? ldexpf(1.0f + (float)k / 16.0f, b) : nextafterf(ldexpf(1.0f, b + 1), 0.0f);
            int e = cb_op_f16_scale_exp(amax);
            double s = ldexp(amax, e);
            if (s < 16384.0 || s >= 32768.0 || !isfinite(to_f16(ldexpf(amax, e))) ||
                !isfinite(to_f16(ldexpf(-amax, e))))
                bad++;
        }
    CHECKF(bad == 0, "%d magnitudes misplaced", bad);
    CHECK(cb_op_f16_scale_exp(0.0f) == 0);
    CHECK(cb_op_f16_scale_exp(INFINITY) == 0);
    CHECK(cb_op_f16_scale_exp(NAN) == 0);
    CHECK(cb_op_f16_scale_exp(3.0e38f) == -CB_F16_EXP_MAX);
    CHECK(isfinite(
        to_f16(ldexpf(nextafterf(ldexpf(1.0f, 75), 0.0f), cb_op_f16_scale_exp(ldexpf(1.0f, 74))))));
    CHECK(cb_op_f16_scale_exp(1e-30f) == CB_F16_EXP_MAX);
    CHECK(cb_op_f16_scale_exp(65504.0f * 4) == -3);
}

/* The choice for matrix products, measured: y = x . W^T with x like a
 * down-projection input (SwiGLU outputs: heavy tails, plus "massive
 * activations", a few channels in the 1e3..3e5 range, as reported for
 * Llama/Qwen-class models) and W q8_0-like N(0, 0.02) weights.  Each
 * option rounds the operands as the device would and accumulates in double
 * (cuBLAS: f32); error = normalized mean squared error against the exact
 * product.  f16 without scaling overflows to inf; f16 with a per-call
 * power-of-two scale keeps f16's 11-bit precision; bf16 has the range but
 * 8 bits. */
static double r18_mm_err(const float *x, const float *w, int64_t n, int64_t n_in, int64_t n_out,
                         int opt)
{
    float amax = 0, wmax = 0;
    for (int64_t i = 0; i < n * n_in; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    for (int64_t i = 0; i < n_out * n_in; i++)
        wmax = fabsf(w[i]) > wmax ? fabsf(w[i]) : wmax;
    int ex = opt == 1 ? cb_op_f16_scale_exp(amax) : 0,
        ew = opt == 1 ? cb_op_f16_scale_exp(wmax) : 0;
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < n_out; o++) {
            double ref = 0, got = 0;
            for (int64_t j = 0; j < n_in; j++) {
                float a = x[i * n_in + j], b = w[o * n_in + j];
                ref += (double)a * b;
                if (opt == 2)
                    got += (double)to_bf16(a) * to_bf16(b);
                else
                    got += (double)to_f16(ldexpf(a, ex)) * to_f16(ldexpf(b, ew));
            }
            got = ldexp(got, -(ex + ew));
            if (!isfinite(got))
                return INFINITY;
            e += (got - ref) * (got - ref);
            s += ref * ref;
        }
    return e / s;
}

static void r18_mm_choice(void)
{
    int64_t n = 8, n_in = 1024, n_out = 64;
    float *x = malloc(sizeof(float) * (size_t)(n * n_in)),
          *w = malloc(sizeof(float) * (size_t)(n_out * n_in));
    seed(1801);
    for (int64_t i = 0; i < n_out * n_in; i++)
        w[i] = (float)((urand() + urand() + urand() - 1.5) * 0.04);
    for (int pass = 0; pass < 3; pass++) {
        /* 0: ordinary activations; 1: massive activations (1e3..3e5);
         * 2: tiny activations (1e-6: f16 subnormals without scaling) */
        for (int64_t i = 0; i < n * n_in; i++) {
            double g = 4 * (urand() - 0.5), u = 4 * (urand() - 0.5);
            x[i] = (float)(g / (1 + exp(-g)) * u * (pass == 2 ? 1e-6 : 1.0));
        }
        if (pass == 1)
            for (int64_t i = 0; i < n; i++) {
                x[i * n_in + 7] = (float)(3e5 * (i % 2 ? -1 : 1));
                x[i * n_in + 300] = 2500.0f;
                x[i * n_in + 911] = -7.0e4f;
            }
        double e16 = r18_mm_err(x, w, n, n_in, n_out, 0), es = r18_mm_err(x, w, n, n_in, n_out, 1),
               ebf = r18_mm_err(x, w, n, n_in, n_out, 2);
        static const char *what[3] = {"ordinary", "outliers to 3e5", "tiny (1e-6)"};
        tcase("f16 product choice, %s activations: nmse f16 %.1e, f16 + 2^e scale %.1e, bf16 %.1e",
              what[pass], e16, es, ebf);
        CHECKF(es < 1e-6, "scaled f16 nmse %.2e", es);
        CHECKF(es * 4 < ebf, "scaled f16 (%.2e) should beat bf16 (%.2e) by its 3 more bits", es,
               ebf);
        if (pass == 1)
            CHECKF(isinf(e16), "unscaled f16 should overflow (nmse %.2e)", e16);
        if (pass == 0)
            CHECKF(es <= e16 * 1.01, "%.3e vs %.3e", es,
                   e16); /* in range a power of two changes (almost) nothing */
        if (pass == 2)
            CHECKF(es * 10 < e16,
                   "scaling should lift tiny inputs out of the subnormals (%.2e vs %.2e)", es, e16);
    }
    free(x), free(w);
}

/* matmul with inputs (and f32 weights) above f16's 65504 */
static int64_t c_matmul_big(cb_backend *be, float *out)
{
    int64_t n = 6, n_in = 256, n_out = 40;
    seed(1802);
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(n * n_in, 1.0f);
    for (int64_t i = 0; i < n; i++) {
        x[i * n_in + 3] = 2.5e5f, x[i * n_in + 100] = -9.0e4f, x[i * n_in + 101] = 7.0e4f;
        if (i == 5)
            for (int64_t j = 0; j < n_in; j++)
                x[i * n_in + j] =
                    1e5f * (j % 2 ? 1 : -1) + (float)j; /* every value out of f16's range */
    }
    if (mm_type == CB_TYPE_F32)
        for (int64_t o = 0; o < n_out; o++)
            wf[o * n_in + (o * 7) % n_in] = 1.2e5f;
    size_t rb = cb_type_row_bytes(mm_type, n_in);
    uint8_t *wq = malloc(rb * (size_t)n_out);
    for (int64_t o = 0; o < n_out; o++)
        cb_quant_row(mm_type, wf + o * n_in, wq + (size_t)o * rb, n_in);
    if (!be) {
        float *w = malloc(sizeof(float) * (size_t)(n_in * n_out));
        for (int64_t o = 0; o < n_out; o++)
            cb_dequant_row(mm_type, wq + (size_t)o * rb, w + o * n_in, n_in);
        for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < n_out; o++) {
                double s = 0.0;
                for (int64_t j = 0; j < n_in; j++)
                    s += (double)x[i * n_in + j] * w[o * n_in + j];
                out[i * n_out + o] = (float)s;
            }
        free(w);
    } else {
        cb_bweight *w = be->ops->weight_new(be, mm_type, n_in, n_out, wq, NULL);
        float *dx = bput(be, x, sizeof(float) * (size_t)(n * n_in));
        float *dy = be->ops->alloc(be, sizeof(float) * (size_t)(n * n_out));
        be->ops->matmul(be, w, dx, dy, n);
        bget(be, out, dy, sizeof(float) * (size_t)(n * n_out));
        bfree(be, dx), bfree(be, dy);
        be->ops->weight_free(be, w);
    }
    free(wf), free(x), free(wq);
    return n * n_out;
}

/* topk over NaN, +-inf, ties and signed zeros with k = n: the reference
 * selects by hand, NaN below every number, ties by lower index */
static int64_t c_topk_nan(cb_backend *be, float *out)
{
    int64_t n = topk_n, k = n;
    seed(1803);
    float *x = malloc(sizeof(float) * (size_t)n);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)k);
    for (int64_t i = 0; i < n; i++) {
        int r = (int)(urand() * 10);
        x[i] = r == 0   ? NAN
               : r == 1 ? INFINITY
               : r == 2 ? -INFINITY
               : r == 3 ? -0.0f
               : r == 4 ? 0.0f
                        : (float)(int)(urand() * 5);
    }
    x[0] = NAN, x[n - 1] = INFINITY;
    for (int64_t r = 0; r < k; r++)
        idx[r] = -7;
    if (!be) {
        char *taken = calloc((size_t)n, 1);
        for (int64_t r = 0; r < k; r++) {
            int64_t best = -1;
            for (int64_t i = 0; i < n; i++) {
                if (taken[i])
                    continue;
                if (best < 0 || (isnan(x[best]) && !isnan(x[i])) ||
                    (!isnan(x[i]) && x[i] > x[best]))
                    best = i;
            }
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

/* RoPE at base 1e6 (qwen2) at positions up to 32K, then shifted by
 * negative deltas (a chunk moved earlier), against rope at pos + delta.
 * The angle is pos * inv_freq in f32 on both backends; a device powf one
 * bit off the host's would move it by up to 1e-3 rad at 32K. */
static int r18_rope_nrot, r18_rope_neox, r18_rope_shift;

static int64_t c_rope_long(cb_backend *be, float *out)
{
    enum { N = 48 };
    int n_head = 4, hd = 128;
    int32_t pos[N], delta[N], sum[N];
    seed(1804);
    for (int i = 0; i < N; i++) {
        pos[i] = i == 0 ? 32767 : i == 1 ? 0 : i == 2 ? 32000 : (int32_t)(urand() * 32768);
        delta[i] = -(int32_t)(urand() * (pos[i] + 1)); /* pos + delta >= 0 */
        sum[i] = pos[i] + delta[i];
    }
    size_t bytes = sizeof(float) * (size_t)(N * n_head * hd);
    float *x = rand_vec(N * n_head * hd, 2.0f);
    if (!be) {
        memcpy(out, x, bytes);
        ref_rope(out, r18_rope_shift ? sum : pos, N, n_head, hd, r18_rope_nrot, 1e6, r18_rope_neox);
    } else {
        float *d = bput(be, x, bytes);
        be->ops->rope(be, d, pos, N, n_head, hd, r18_rope_nrot, 1e6f, NULL, r18_rope_neox);
        if (r18_rope_shift)
            be->ops->rope(be, d, delta, N, n_head, hd, r18_rope_nrot, 1e6f, NULL, r18_rope_neox);
        bget(be, out, d, bytes);
        bfree(be, d);
    }
    free(x);
    return N * n_head * hd;
}

/* Attention at model sizes: att_big describes the case.  The reference and
 * (for the CPU-vs-reference check) the CPU backend take r18_sample rows
 * spread over the query; CPU vs CUDA takes all of them. */
static struct {
    int hd, n_head, n_head_kv, window;
    int64_t n_ctx, nq;
} att_big;
static int r18_sample;

/* plain double-precision attention of rows [n] at pos over caches k, v
 * (already rounded as stored), into out */
static void ref_attention(const float *q, const int32_t *pos, int64_t n, const float *k,
                          const float *v, int n_head, int n_head_kv, int hd, float scale,
                          int window, int64_t n_ctx, float *out)
{
    int64_t dq = (int64_t)n_head * hd, w = (int64_t)n_head_kv * hd;
    double *s = malloc(sizeof(double) * (size_t)n_ctx), *o = malloc(sizeof(double) * (size_t)hd);
    for (int64_t i = 0; i < n; i++)
        for (int h = 0; h < n_head; h++) {
            int kh = h / (n_head / n_head_kv);
            double mx = -INFINITY, sum = 0;
            int64_t lo = window > 0 && pos[i] >= window ? pos[i] - window + 1 : 0;
            for (int64_t c = lo; c <= pos[i]; c++) {
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)q[i * dq + h * hd + e] * k[c * w + kh * hd + e];
                s[c] = d * scale;
                mx = s[c] > mx ? s[c] : mx;
            }
            for (int e = 0; e < hd; e++)
                o[e] = 0;
            for (int64_t c = lo; c <= pos[i]; c++) {
                double p = exp(s[c] - mx);
                sum += p;
                for (int e = 0; e < hd; e++)
                    o[e] += p * v[c * w + kh * hd + e];
            }
            for (int e = 0; e < hd; e++)
                out[i * dq + h * hd + e] = (float)(o[e] / sum);
        }
    free(s), free(o);
}

static int64_t c_attention_big(cb_backend *be, float *out)
{
    int n_head = att_big.n_head, n_head_kv = att_big.n_head_kv, hd = att_big.hd;
    int64_t n_ctx = att_big.n_ctx, nq = att_big.nq, dq = (int64_t)n_head * hd,
            w = (int64_t)n_head_kv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)nq);
    seed(1805 + (uint64_t)hd);
    /* scattered positions, out of order, repeats, both ends of the cache */
    for (int64_t i = 0; i < nq; i++)
        pos[i] = i == 0   ? (int32_t)(n_ctx - 1)
                 : i == 1 ? 0
                 : i == 2 ? 1
                          : (int32_t)(urand() * (double)n_ctx);
    float *q = rand_vec(nq * dq, 2.0f), *k = rand_vec(n_ctx * w, 2.0f),
          *v = rand_vec(n_ctx * w, 1.0f);
    for (int64_t i = 0; i < n_ctx * w; i++)
        k[i] = round_kv(k[i]), v[i] = round_kv(v[i]);
    /* the rows this run computes: all, or a spread sample */
    int64_t n = r18_sample ? r18_sample : nq;
    if (r18_sample)
        for (int64_t i = 0; i < n; i++) {
            int64_t src = i * (nq - 1) / (n - 1);
            memmove(q + i * dq, q + src * dq, sizeof(float) * (size_t)dq);
            pos[i] = pos[src];
        }
    if (!be) {
        ref_attention(q, pos, n, k, v, n_head, n_head_kv, hd, scale, att_big.window, n_ctx, out);
    } else {
        size_t esz = kv_type == CB_TYPE_F32 ? 4 : 2;
        int32_t *all = malloc(sizeof(int32_t) * (size_t)n_ctx);
        for (int64_t i = 0; i < n_ctx; i++)
            all[i] = (int32_t)(n_ctx - 1 - i);
        /* written in reverse row order, from reversed rows: the same cache */
        float *kr = malloc(sizeof(float) * (size_t)(n_ctx * w)),
              *vr = malloc(sizeof(float) * (size_t)(n_ctx * w));
        for (int64_t i = 0; i < n_ctx; i++) {
            memcpy(kr + i * w, k + (n_ctx - 1 - i) * w, sizeof(float) * (size_t)w);
            memcpy(vr + i * w, v + (n_ctx - 1 - i) * w, sizeof(float) * (size_t)w);
        }
        void *kc = be->ops->alloc(be, esz * (size_t)(n_ctx * w)),
             *vc = be->ops->alloc(be, esz * (size_t)(n_ctx * w));
        float *dk = bput(be, kr, sizeof(float) * (size_t)(n_ctx * w));
        float *dv = bput(be, vr, sizeof(float) * (size_t)(n_ctx * w));
        float *dq_ = bput(be, q, sizeof(float) * (size_t)(n * dq));
        float *dout = be->ops->alloc(be, sizeof(float) * (size_t)(n * dq));
        be->ops->kv_write(be, kc, kv_type, w, dk, all, n_ctx);
        be->ops->kv_write(be, vc, kv_type, w, dv, all, n_ctx);
        be->ops->attention(be, dq_, pos, n, kc, vc, kv_type, n_head, n_head_kv, hd, scale,
                           att_big.window, dout);
        bget(be, out, dout, sizeof(float) * (size_t)(n * dq));
        bfree(be, kc), bfree(be, vc), bfree(be, dk), bfree(be, dv), bfree(be, dq_), bfree(be, dout);
        free(all), free(kr), free(vr);
    }
    free(pos), free(q), free(k), free(v);
    return n * dq;
}

/* On a device backend (one with a queue: event_new), queue a few ms of
 * work on this thread's queue, so that what the caller queues next waits
 * behind it (what a race needs to show); nothing on the CPU. */
static void busy(cb_backend *be, int reps)
{
    int64_t w = 4096, n = 4096; /* 64 MB */
    if (!be->ops->event_new)
        return;
    int32_t *at = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        at[i] = (int32_t)(n - 1 - i);
    void *cache = be->ops->alloc(be, sizeof(float) * (size_t)(n * w));
    float *src = be->ops->alloc(be, sizeof(float) * (size_t)(n * w));
    for (int r = 0; r < reps; r++)
        be->ops->kv_write(be, cache, CB_TYPE_F32, w, src, at, n);
    bfree(be, cache), bfree(be, src); /* after the writes, in queue order */
    free(at);
}

/* More than 16,384 staged indices in one operation (a staging slot's
 * growth), then 200 indexed operations queued back to back (more than the
 * 64 staging slots: the host refills a slot while the device may still be
 * behind), each with its own index array; later writes overwrite earlier
 * ones, so the result depends on every array and on their order. */
static int64_t c_staging(cb_backend *be, float *out)
{
    int64_t w = 8, n_ctx = 20000, n_ops = 200, per = 50;
    seed(1806);
    float *src = rand_vec(n_ctx * w, 1.0f);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_ctx),
            *rd = malloc(sizeof(int32_t) * (size_t)n_ctx);
    int32_t *at = malloc(sizeof(int32_t) * (size_t)(n_ops * per));
    for (int64_t i = 0; i < n_ctx; i++)
        perm[i] = (int32_t)i, rd[i] = (int32_t)i;
    for (int64_t i = n_ctx - 1; i > 0; i--) {
        int64_t j = (int64_t)(urand() * (double)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
        j = (int64_t)(urand() * (double)(i + 1));
        t = rd[i], rd[i] = rd[j], rd[j] = t;
    }
    /* distinct rows within an operation (a device writes one operation's
     * rows in parallel: which of two writes to one row lands is not
     * defined, nor needed: a prompt's positions are distinct); repeated
     * across operations, where queue order decides */
    for (int64_t op = 0; op < n_ops; op++)
        for (int64_t i = 0; i < per; i++) {
            int32_t r;
            int dup;
            do {
                r = (int32_t)(urand() * (double)n_ctx), dup = 0;
                for (int64_t k = 0; k < i; k++)
                    dup |= at[op * per + k] == r;
            } while (dup);
            at[op * per + i] = r;
        }
    if (!be) {
        float *cache = malloc(sizeof(float) * (size_t)(n_ctx * w));
        for (int64_t i = 0; i < n_ctx; i++)
            memcpy(cache + perm[i] * w, src + i * w, sizeof(float) * (size_t)w);
        for (int64_t op = 0; op < n_ops; op++)
            for (int64_t i = 0; i < per; i++) /* op's rows: src rows op*per.. */
                memcpy(cache + at[op * per + i] * w, src + (op * per + i) * w,
                       sizeof(float) * (size_t)w);
        for (int64_t i = 0; i < n_ctx; i++)
            memcpy(out + i * w, cache + rd[i] * w, sizeof(float) * (size_t)w);
        free(cache);
    } else {
        void *cache = be->ops->alloc(be, sizeof(float) * (size_t)(n_ctx * w));
        float *ds = bput(be, src, sizeof(float) * (size_t)(n_ctx * w));
        float *dd = be->ops->alloc(be, sizeof(float) * (size_t)(n_ctx * w));
        int32_t *tmp = malloc(sizeof(int32_t) * (size_t)per);
        busy(be, 100); /* the 200 operations queue up behind this */
        be->ops->kv_write(be, cache, CB_TYPE_F32, w, ds, perm, n_ctx);
        for (int64_t op = 0; op < n_ops; op++) {
            /* one reused host array, rewritten for every call: the backend
             * must have copied it out before returning */
            memcpy(tmp, at + op * per, sizeof(int32_t) * (size_t)per);
            be->ops->kv_write(be, cache, CB_TYPE_F32, w, ds + op * per * w, tmp, per);
        }
        be->ops->kv_read(be, cache, CB_TYPE_F32, w, rd, n_ctx, dd);
        bget(be, out, dd, sizeof(float) * (size_t)(n_ctx * w));
        bfree(be, cache), bfree(be, ds), bfree(be, dd);
        free(tmp);
    }
    free(src), free(perm), free(rd), free(at);
    return n_ctx * w;
}

/* Index arrays that repeat (the CUDA backend's memo, CB_CUDA_MEMO=1, sends
 * one only when its contents differ from the last few it sent): gathers
 * from one host array rewritten between calls, each call's rows written to
 * a place of their own.  The contents go A, B, A, A's first half (the same
 * bytes, shorter), twelve others (more than the memo holds: A's entry is
 * refilled while gathers that read it may still be queued behind a busy
 * device), then A again, and a RoPE table staged between them (the memo
 * holds both kinds). */
static int64_t c_memo(cb_backend *be, float *out)
{
    enum { W = 8, N_SRC = 600, PER = 40, N_CALLS = 17 };
    seed(1907);
    float *src = rand_vec(N_SRC * W, 1.0f);
    int32_t pat[14][PER], order[N_CALLS], lens[N_CALLS], buf[PER];
    for (int p = 0; p < 14; p++)
        for (int i = 0; i < PER; i++)
            pat[p][i] = (int32_t)(urand() * N_SRC);
    /* A = 0, B = 1, then 2..13 */
    int k = 0;
    order[k] = 0, lens[k++] = PER;
    order[k] = 1, lens[k++] = PER;
    order[k] = 0, lens[k++] = PER;
    order[k] = 0, lens[k++] = PER / 2;
    for (int p = 2; p < 14; p++)
        order[k] = p, lens[k++] = PER;
    order[k] = 0, lens[k++] = PER;
    int64_t n_out = 0;
    for (int c = 0; c < N_CALLS; c++)
        n_out += (int64_t)lens[c] * W;
    if (!be) {
        for (int c = 0, at = 0; c < N_CALLS; c++)
            for (int i = 0; i < lens[c]; i++, at += W)
                memcpy(out + at, src + pat[order[c]][i] * W, sizeof(float) * W);
    } else {
        float *ds = bput(be, src, sizeof(float) * N_SRC * W);
        float *dd = be->ops->alloc(be, sizeof(float) * (size_t)n_out);
        float *dr = be->ops->alloc(be, sizeof(float) * 4 * 64);
        int32_t pos[4] = {3, 9, 27, 81};
        busy(be, 30); /* what follows queues up behind this */
        for (int c = 0, at = 0; c < N_CALLS; c++) {
            memcpy(buf, pat[order[c]], sizeof(int32_t) * (size_t)lens[c]);
            be->ops->gather(be, ds, buf, lens[c], W, dd + at);
            at += lens[c] * W;
            if (c % 5 == 0) /* a RoPE table and positions through the memo too */
                be->ops->rope(be, dr, pos, 4, 1, 64, 64, 10000.0f, NULL, 0);
            memset(buf, 0xff, sizeof buf); /* the backend must not read it later */
        }
        bget(be, out, dd, sizeof(float) * (size_t)n_out);
        bfree(be, ds), bfree(be, dd), bfree(be, dr);
    }
    free(src);
    return n_out;
}

/* 40 MB through upload and download (five staging buffers' worth) */
static int64_t c_roundtrip40(cb_backend *be, float *out)
{
    int64_t n = 10 << 20;
    seed(1807);
    float *x = rand_vec(n, 1.0f);
    if (!be) {
        memcpy(out, x, sizeof(float) * (size_t)n);
    } else {
        float *d = bput(be, x, sizeof(float) * (size_t)n);
        memset(x, 0, sizeof(float) * (size_t)n); /* upload returned: src is ours again */
        bget(be, out, d, sizeof(float) * (size_t)n);
        bfree(be, d);
    }
    free(x);
    return n;
}

/* 40 MB through host_alloc memory and upload_async, as cb-run's loader
 * sends a layer (CB_CUDA_PIN=1): a 4 MB buffer refilled after each sync,
 * its pieces sent without a wait; upload where the backend has none */
static int64_t c_async40(cb_backend *be, float *out)
{
    int64_t n = 10 << 20, piece = 1 << 20;
    seed(1809);
    float *x = rand_vec(n, 1.0f);
    if (!be) {
        memcpy(out, x, sizeof(float) * (size_t)n);
    } else {
        float *d = be->ops->alloc(be, sizeof(float) * (size_t)n);
        float *h = be->ops->host_alloc ? be->ops->host_alloc(be, sizeof(float) * (size_t)piece)
                                       : malloc(sizeof(float) * (size_t)piece);
        for (int64_t off = 0; off < n && d && h; off += piece) {
            if (be->ops->sync) /* the last piece's copy has left h */
                be->ops->sync(be);
            memcpy(h, x + off, sizeof(float) * (size_t)piece);
            (be->ops->upload_async ? be->ops->upload_async : be->ops->upload)(
                be, d + off, h, sizeof(float) * (size_t)piece);
        }
        bget(be, out, d, sizeof(float) * (size_t)n);
        if (be->ops->host_free)
            be->ops->host_free(be, h);
        else
            free(h);
        bfree(be, d);
    }
    free(x);
    return n;
}

/* An allocation the device cannot satisfy returns NULL (reported by the
 * caller as out of memory), and the backend works on afterwards. */
static int64_t c_alloc_fail(cb_backend *be, float *out)
{
    float x[64];
    seed(1808);
    for (int i = 0; i < 64; i++)
        x[i] = frand(1.0f);
    out[0] = 1.0f;
    if (!be) {
        memcpy(out + 1, x, sizeof x);
    } else {
        /* 4 EiB: more than any x86-64 address space, so it fails where
         * the kernel overcommits too (16 TiB succeeded on a 128 GiB VM) */
        void *huge = be->ops->alloc(be, (size_t)1 << 62);
        out[0] = huge == NULL;
        be->ops->dealloc(be, huge);
        float *d = bput(be, x, sizeof x);
        bget(be, out + 1, d, sizeof x);
        bfree(be, d);
    }
    return 65;
}

/* A weight made on one thread and used on another after a join (no sync):
 * weight_new must hand back a weight whose upload and dequantization are
 * done.  64 MB of f32 (eight staging buffers: the last copies are still in
 * flight when upload returns) after a busy queue: on a device, a weight_new
 * that returned early would leave the product reading a weight not yet
 * there. */
typedef struct wt_arg {
    cb_backend *be;
    const uint8_t *wq;
    const float *bias;
    int64_t n_in, n_out;
    cb_bweight *w;
} wt_arg;

static void *wt_main(void *p)
{
    wt_arg *a = p;
    busy(a->be, 50);
    a->w = a->be->ops->weight_new(a->be, CB_TYPE_F32, a->n_in, a->n_out, a->wq, a->bias);
    return NULL;
}

static int64_t c_weight_thread(cb_backend *be, float *out)
{
    int64_t n = 3, n_in = 4096, n_out = 4096;
    seed(1809);
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(n * n_in, 1.0f),
          *bias = rand_vec(n_out, 0.5f);
    const float *wq = wf; /* f32: the GGUF bytes are the values */
    if (!be) {
        const float *w = wf;
        for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < n_out; o++) {
                double s = bias[o];
                for (int64_t j = 0; j < n_in; j++)
                    s += (double)x[i * n_in + j] * w[o * n_in + j];
                out[i * n_out + o] = (float)s;
            }
    } else {
        pthread_t th;
        wt_arg a = {be, (const uint8_t *)wq, bias, n_in, n_out, NULL};
        pthread_create(&th, NULL, wt_main, &a);
        pthread_join(th, NULL);
        float *dx = bput(be, x, sizeof(float) * (size_t)(n * n_in));
        float *dy = be->ops->alloc(be, sizeof(float) * (size_t)(n * n_out));
        be->ops->matmul(be, a.w, dx, dy, n);
        bget(be, out, dy, sizeof(float) * (size_t)(n * n_out));
        bfree(be, dx), bfree(be, dy);
        be->ops->weight_free(be, a.w);
    }
    free(wf), free(x), free(bias);
    return n * n_out;
}

/* The KV loader's real pattern (blend.c, cb_kvcache_load_rows): a loader
 * thread places layer after layer from a file's f16 rows, in two pieces
 * (the second at an offset into the cache, as a chunk's rows land): V
 * uploaded into its rows as it is; K uploaded to scratch, expanded to f32
 * (kv_read), multiplied by the key scale, moved by RoPE by a negative delta
 * and written into its rows; the scratch freed and the layer's event
 * recorded; it tells the computing thread through a mutex.  The computing
 * thread waits for the layer, orders its work after the event and runs
 * attention on the layer while the loader goes on.  No join before the
 * last layer is computed, no sync on the loader's side. */
enum { LD_LAYERS = 4, LD_HEADS = 4, LD_KV = 2, LD_HD = 64, LD_CTX = 640, LD_NQ = 96 };
#define LD_KEY_SCALE (1.0f / 1.05f)

typedef struct ld_arg {
    cb_backend *be;
    void *kc[LD_LAYERS], *vc[LD_LAYERS], *ev[LD_LAYERS];
    const uint16_t *k, *v; /* [LD_LAYERS][LD_CTX, LD_KV*LD_HD] f16 host, roped at from_pos */
    const int32_t *delta;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;
} ld_arg;

/* scratch as blend.c's loader takes it (be_tmp in forward.c) */
static void *ld_tmp(cb_backend *be, size_t bytes)
{
    return be->ops->alloc_tmp ? be->ops->alloc_tmp(be, bytes) : be->ops->alloc(be, bytes);
}

static void *ld_main(void *p)
{
    ld_arg *a = p;
    cb_backend *be = a->be;
    int64_t w = LD_KV * LD_HD;
    int32_t at[LD_CTX];
    busy(be, 30);
    for (int l = 0; l < LD_LAYERS; l++) {
        for (int piece = 0; piece < 2; piece++) {
            int32_t p0 = piece ? LD_CTX / 3 : 0, n = piece ? LD_CTX - LD_CTX / 3 : LD_CTX / 3;
            size_t rb = 2 * (size_t)w, off = (size_t)(l * LD_CTX + p0) * (size_t)w;
            void *raw = ld_tmp(be, rb * (size_t)n);
            float *tmp = ld_tmp(be, sizeof(float) * (size_t)(n * w));
            be->ops->upload(be, (char *)a->vc[l] + (size_t)p0 * rb, a->v + off, rb * (size_t)n);
            for (int rep = 0; rep < 8; rep++) /* keep the loader's queue long */
                be->ops->upload(be, raw, a->k + off, rb * (size_t)n);
            for (int32_t i = 0; i < n; i++)
                at[i] = i;
            be->ops->kv_read(be, raw, CB_TYPE_F16, w, at, n, tmp);
            be->ops->scale(be, tmp, LD_KEY_SCALE, n * w);
            be->ops->rope(be, tmp, a->delta, n, LD_KV, LD_HD, LD_HD, 1e6f, NULL, 1);
            for (int32_t i = 0; i < n; i++)
                at[i] = p0 + i;
            be->ops->kv_write(be, a->kc[l], CB_TYPE_F16, w, tmp, at, n);
            be->ops->dealloc(be, raw);
            be->ops->dealloc(be, tmp);
        }
        if (a->ev[l])
            be->ops->event_record(be, a->ev[l]);
        pthread_mutex_lock(&a->mu);
        a->ready = l + 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
    }
    if (be->ops->sync) /* on every exit, as blend.c's loader: before the caller frees the caches */
        be->ops->sync(be);
    return NULL;
}

static int64_t c_loader(cb_backend *be, float *out)
{
    int64_t w = LD_KV * LD_HD, dq = LD_HEADS * LD_HD;
    float scale = 1.0f / sqrtf((float)LD_HD);
    int32_t delta[LD_CTX], pos[LD_NQ];
    seed(1810);
    /* the chunk was computed at 20000.., lands at 0..: shift by -20000 */
    for (int i = 0; i < LD_CTX; i++)
        delta[i] = -20000;
    for (int i = 0; i < LD_NQ; i++)
        pos[i] = i == 0 ? LD_CTX - 1 : (int32_t)(urand() * LD_CTX);
    float *k = rand_vec(LD_LAYERS * LD_CTX * w, 2.0f), *v = rand_vec(LD_LAYERS * LD_CTX * w, 1.0f);
    float *q = rand_vec(LD_LAYERS * LD_NQ * dq, 2.0f);
    uint16_t *k16 = malloc(2 * (size_t)(LD_LAYERS * LD_CTX * w)),
             *v16 = malloc(2 * (size_t)(LD_LAYERS * LD_CTX * w));
    int32_t from[LD_CTX];
    for (int i = 0; i < LD_CTX; i++)
        from[i] = 20000 + i;
    for (int l = 0; l < LD_LAYERS; l++) /* the stored keys: roped at their old positions */
        ref_rope(k + l * LD_CTX * w, from, LD_CTX, LD_KV, LD_HD, LD_HD, 1e6, 1);
    /* the file's rows: f16, and what they hold exactly */
    cb_quant_row(CB_TYPE_F16, k, k16, LD_LAYERS * LD_CTX * w);
    cb_quant_row(CB_TYPE_F16, v, v16, LD_LAYERS * LD_CTX * w);
    cb_dequant_row(CB_TYPE_F16, k16, k, LD_LAYERS * LD_CTX * w);
    cb_dequant_row(CB_TYPE_F16, v16, v, LD_LAYERS * LD_CTX * w);
    if (!be) {
        float *kk = malloc(sizeof(float) * (size_t)(LD_CTX * w)),
              *vv = malloc(sizeof(float) * (size_t)(LD_CTX * w));
        for (int l = 0; l < LD_LAYERS; l++) {
            for (int64_t i = 0; i < LD_CTX * w; i++)
                kk[i] = k[l * LD_CTX * w + i] * LD_KEY_SCALE;
            ref_rope(kk, delta, LD_CTX, LD_KV, LD_HD, LD_HD, 1e6, 1);
            for (int64_t i = 0; i < LD_CTX * w; i++)
                kk[i] = to_f16(kk[i]), vv[i] = to_f16(v[l * LD_CTX * w + i]);
            ref_attention(q + l * LD_NQ * dq, pos, LD_NQ, kk, vv, LD_HEADS, LD_KV, LD_HD, scale, 0,
                          LD_CTX, out + l * LD_NQ * dq);
        }
        free(kk), free(vv);
    } else {
        ld_arg a;
        pthread_t th;
        memset(&a, 0, sizeof a);
        a.be = be, a.k = k16, a.v = v16, a.delta = delta;
        pthread_mutex_init(&a.mu, NULL);
        pthread_cond_init(&a.cv, NULL);
        for (int l = 0; l < LD_LAYERS; l++) {
            a.kc[l] = be->ops->alloc(be, 2 * (size_t)(LD_CTX * w));
            a.vc[l] = be->ops->alloc(be, 2 * (size_t)(LD_CTX * w));
            a.ev[l] = be->ops->event_new ? be->ops->event_new(be) : NULL;
        }
        float *dq_ = bput(be, q, sizeof(float) * (size_t)(LD_LAYERS * LD_NQ * dq));
        float *dout = be->ops->alloc(be, sizeof(float) * (size_t)(LD_LAYERS * LD_NQ * dq));
        pthread_create(&th, NULL, ld_main, &a);
        for (int l = 0; l < LD_LAYERS; l++) {
            pthread_mutex_lock(&a.mu);
            while (a.ready <= l)
                pthread_cond_wait(&a.cv, &a.mu);
            pthread_mutex_unlock(&a.mu);
            if (a.ev[l])
                be->ops->event_wait(be, a.ev[l]);
            be->ops->attention(be, dq_ + l * LD_NQ * dq, pos, LD_NQ, a.kc[l], a.vc[l], CB_TYPE_F16,
                               LD_HEADS, LD_KV, LD_HD, scale, 0, dout + l * LD_NQ * dq);
        }
        bget(be, out, dout, sizeof(float) * (size_t)(LD_LAYERS * LD_NQ * dq));
        pthread_join(th, NULL);
        for (int l = 0; l < LD_LAYERS; l++) {
            bfree(be, a.kc[l]), bfree(be, a.vc[l]);
            if (a.ev[l])
                be->ops->event_free(be, a.ev[l]);
        }
        bfree(be, dq_), bfree(be, dout);
        pthread_mutex_destroy(&a.mu);
        pthread_cond_destroy(&a.cv);
    }
    free(k), free(v), free(q), free(k16), free(v16);
    return LD_LAYERS * LD_NQ * dq;
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
/* A second CUDA backend with the tensor-core attention (CB_CUDA_FA=1; the
 * first one's attention is the scalar kernel, the reference), and the
 * bound the attention cases set for it (0: a case it does not take).  Its
 * inputs are rounded to f16 (Q, K, V and the softmax weights: unit
 * roundoff 4.9e-4).  A line-by-line transliteration of the kernel into
 * numpy (its tiles, masks, splits and merge; the tensor-core products as
 * f16 tiles summed in f32) gave nmse 4e-8 to 6e-8 against double
 * precision on these cases' shapes with f16 caches, 1.2e-7 to 1.4e-7 with
 * f32 ones (K and V rounded in the kernel): bound 2e-6. */
static cb_backend *cuda_fa;
static double fa_bound;
#define FA_BOUND 2e-6
/* A third CUDA backend keeping block-quantized weights in their GGUF
 * blocks (CB_CUDA_QW=1), and the bound a matmul or get_rows case of a
 * block type sets for it (0: a case it does not take).  Its few-row
 * products take the weights' exact values (no rounding to f16): f32 sums
 * in another order than the CPU's, nmse ~1e-14 (bound 1e-10); its
 * embedding rows are the CPU's bit for bit (QW_EXACT); more rows go
 * through f16 tiles, the first backend's rounding and bound. */
static cb_backend *cuda_qw;
static double qw_bound;
#define QW_EXACT (-1.0)     /* qw_bound: bit for bit */
enum { FA_CASE_ROWS = 16 }; /* cuda_attn.cu's FA_MIN_ROWS: fewer rows take the scalar kernel */

/* The reference vs the CPU backend within cpu_bound; the CPU vs CUDA
 * backend within cuda_bound (bounds < 0: exact equality). */
/* whether name holds one of list's '|'-separated parts (an empty part
 * matches nothing) */
static int name_in(const char *list, const char *name)
{
    char part[128];
    while (*list) {
        size_t n = strcspn(list, "|");
        snprintf(part, sizeof part, "%.*s", (int)(n < sizeof part ? n : sizeof part - 1), list);
        if (n > 0 && strstr(name, part))
            return 1;
        list += n + (list[n] == '|');
    }
    return 0;
}

/* $CB_OPS_ONLY: run only the cases whose name holds one of its
 * '|'-separated parts; $CB_OPS_SKIP: not those whose name holds one of
 * its parts; the others skipped (a sanitizer over a few cases, or over
 * all but the slow ones) */
static int case_wanted(const char *name)
{
    const char *only = getenv("CB_OPS_ONLY"), *skip = getenv("CB_OPS_SKIP");
    if (only && *only && !name_in(only, name))
        return 0;
    return !(skip && *skip && name_in(skip, name));
}

/* a case $CB_OPS_ONLY or $CB_OPS_SKIP leaves out: its two lines skipped; 1 if so */
static int case_skip(const char *name, const char *cpu_what, const char *cuda_what)
{
    char nm[192];
    if (case_wanted(name))
        return 0;
    snprintf(nm, sizeof nm, "cpu  %s %s", name, cpu_what);
    tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
    snprintf(nm, sizeof nm, "cuda %s %s", name, cuda_what);
    tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
    if (fa_bound > 0) {
        snprintf(nm, sizeof nm, "cuda-fa %s vs cpu", name);
        tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
    }
    if (qw_bound != 0) {
        snprintf(nm, sizeof nm, "cuda-qw %s vs cpu", name);
        tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
    }
    return 1;
}

/* The case fn on backend be into got against ref (n values), as test
 * line nm: within bound (< 0: exact equality); fn's count */
static int64_t vs_ref(cb_backend *be, const float *ref, float *got, const char *nm, case_fn fn,
                      int64_t n, double bound)
{
    int64_t n_be = fn(be, got);
    double e = nmse(ref, got, n);
    tcase("%s (nmse %.2e, bound %.0e)", nm, e, bound);
    CHECK(n_be == n);
    if (bound < 0)
        CHECK(memcmp(ref, got, sizeof(float) * (size_t)n) == 0);
    else
        CHECKF(e <= bound, "nmse %.3e > %.0e", e, bound);
    return n_be;
}

/* An attention case on the tensor-core kernel against the CPU's o_cpu (n
 * values), when the case sets fa_bound */
static void run_fa(const char *name, case_fn fn, int64_t n)
{
    char nm[192];
    if (fa_bound <= 0)
        return;
    snprintf(nm, sizeof nm, "cuda-fa %s vs cpu", name);
    if (!cuda_fa) {
        tskip(nm, cuda ? "CB_CUDA_FA: the device has no shared memory for its tiles" : cuda_why);
        return;
    }
    vs_ref(cuda_fa, o_cpu, o_cuda, nm, fn, n, fa_bound);
}

/* qw_bound for a product of n rows of weight type t (get_rows: n 1):
 * the exact bound where cuda_qw's few-row kernel takes it (up to 8 rows,
 * with CB_CUDA_GEMV=0 too: the blocks are never dequantized into tiles for
 * so few), tiles_bound (the first CUDA backend's) past it; 0 for the types
 * it does not keep */
static double qw_case_bound(cb_type t, int64_t n, double tiles_bound)
{
    if (cb_type_block_elems(t) == 1)
        return 0;
    return n <= 8 ? 1e-10 : tiles_bound;
}

/* A matmul or get_rows case on the weights kept in their blocks, against
 * the CPU's o_cpu (n values), when the case sets qw_bound */
static void run_qw(const char *name, case_fn fn, int64_t n)
{
    char nm[192];
    if (qw_bound == 0)
        return;
    snprintf(nm, sizeof nm, "cuda-qw %s vs cpu", name);
    if (!cuda_qw) {
        tskip(nm, cuda ? "CB_CUDA_QW: the backend did not open" : cuda_why);
        return;
    }
    vs_ref(cuda_qw, o_cpu, o_cuda, nm, fn, n, qw_bound);
}

static void run_case(const char *name, case_fn fn, double cpu_bound, double cuda_bound)
{
    if (case_skip(name, "vs reference", "vs cpu"))
        return;
    int64_t n_ref = fn(NULL, o_ref);
    char nm[160];
    snprintf(nm, sizeof nm, "cpu  %-28s vs reference", name);
    int64_t n_cpu = vs_ref(cpu, o_ref, o_cpu, nm, fn, n_ref, cpu_bound);
    snprintf(nm, sizeof nm, "cuda %-28s vs cpu", name);
    if (cuda)
        vs_ref(cuda, o_cpu, o_cuda, nm, fn, n_cpu, cuda_bound);
    else
        tskip(nm, cuda_why);
    run_fa(name, fn, n_cpu);
    run_qw(name, fn, n_cpu);
}

/* The CPU backend's portable kernels (no SIMD) vs the reference: the same
 * cases the dispatched kernels pass, on every machine. */
static void run_case_c(const char *name, case_fn fn, double bound)
{
    if (!case_wanted(name)) {
        char nm[192];
        snprintf(nm, sizeof nm, "cpu-c %s vs reference", name);
        tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
        return;
    }
    int64_t n_ref = fn(NULL, o_ref), n_c = fn(cpu_c, o_cpu);
    double e = nmse(o_ref, o_cpu, n_ref);
    tcase("cpu-c %-27s vs reference (nmse %.2e, bound %.0e)", name, e, bound);
    CHECK(n_ref == n_c);
    CHECKF(e <= bound, "nmse %.3e > %.0e", e, bound);
}


/* test_key_bias's case `name` on the CUDA backends (the scalar kernel;
 * the tensor-core one from FA_CASE_ROWS rows): with the bias against the
 * reference (the attention cases' bounds), then cleared */
static void key_bias_cuda(const char *name, float bias, float *scratch)
{
    cb_backend *bes[2] = {cuda, att_nq >= FA_CASE_ROWS ? cuda_fa : NULL};
    const char *tag[2] = {"cuda", "cuda-fa"};
    const double bound[2] = {1e-9, FA_BOUND};
    for (int b = 0; b < 2; b++) {
        if (!bes[b])
            continue;
        att_stale = bias;
        int64_t n = c_attention(NULL, o_ref);
        c_attention(bes[b], o_cuda);
        att_stale = 0.0f;
        c_attention(bes[b], scratch);
        double e = nmse(o_ref, o_cuda, n), moved = nmse(o_ref, scratch, n);
        tcase("%s %s vs reference (nmse %.2e, bound %.0e; without the bias %.2e)", tag[b], name, e,
              bound[b], moved);
        CHECKF(e <= bound[b] && moved > 1e-3, "nmse %.3e, without %.3e", e, moved);
        c_attention(NULL, o_ref);
        e = nmse(o_ref, scratch, n);
        tcase("%s %s cleared: as without it (nmse %.2e)", tag[b], name, e);
        CHECKF(e <= bound[b], "nmse %.3e", e);
    }
}

/* A batch's decoding sets each sequence's flags in turn, at every layer
 * (CUDA keeps the last 8 bias rows it sent): 10 flag sets (every k-th key
 * of the first 60 + 10 k keys, each with its own bias: a row refilled for
 * a longer set grows), visited 0..9, then 9..0, then 3 three times, one
 * decode row over 150 f16 keys each time, every visit queued before any
 * result is read (a row rewritten under an attention still queued would
 * show).  Each visit gives the bits of the set's first visit, and no two
 * sets give the same output (so a visit that used another set's row
 * fails). */
static void key_bias_rows_case(cb_backend *be, const char *label)
{
    enum { NSET = 10, NCTX = 150, HD = 64, NH = 6, NKV = 2 };
    static const int order[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 8,
                                7, 6, 5, 4, 3, 2, 1, 0, 3, 3, 3};
    const int64_t w = NKV * HD, dq = NH * HD, nv = (int64_t)(sizeof order / sizeof order[0]);
    char name[160];
    snprintf(name, sizeof name, "%s key bias: 10 sequences' flags in turn, each visit as its first",
             label);
    if (!case_wanted(name)) {
        tskip(name, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
        return;
    }
    seed(13);
    float *q = rand_vec(dq, 2.0f), *k = rand_vec(NCTX * w, 2.0f), *v = rand_vec(NCTX * w, 1.0f);
    float *got = malloc(sizeof(float) * (size_t)(nv * dq));
    int32_t *all = malloc(sizeof(int32_t) * NCTX), pos[1] = {NCTX - 1};
    uint8_t flags[NSET][NCTX];
    for (int i = 0; i < NCTX; i++)
        all[i] = i;
    for (int s = 0; s < NSET; s++)
        for (int c = 0; c < NCTX; c++)
            flags[s][c] = (uint8_t)(c % (s + 2) == 0);
    void *kc = be->ops->alloc(be, 2 * (size_t)(NCTX * w)),
         *vc = be->ops->alloc(be, 2 * (size_t)(NCTX * w));
    float *dk = bput(be, k, sizeof(float) * (size_t)(NCTX * w)),
          *dv = bput(be, v, sizeof(float) * (size_t)(NCTX * w));
    float *dqv = bput(be, q, sizeof(float) * (size_t)dq),
          *dout = be->ops->alloc(be, sizeof(float) * (size_t)(nv * dq));
    be->ops->kv_write(be, kc, CB_TYPE_F16, w, dk, all, NCTX);
    be->ops->kv_write(be, vc, CB_TYPE_F16, w, dv, all, NCTX);
    int same = 1, first[NSET];
    for (int s = 0; s < NSET; s++)
        first[s] = -1;
    for (int64_t i = 0; i < nv; i++) {
        int s = order[i];
        cb_status st =
            be->ops->set_key_bias(be, flags[s], 60 + 10 * s, -0.3f * (float)(s + 1), INT32_MAX);
        be->ops->attention(be, dqv, pos, 1, kc, vc, CB_TYPE_F16, NH, NKV, HD, 0.125f, 0,
                           dout + i * dq);
        be->ops->set_key_bias(be, NULL, 0, 0.0f, 0);
        same &= st == CB_OK;
        if (first[s] < 0)
            first[s] = (int)i;
    }
    bget(be, got, dout, sizeof(float) * (size_t)(nv * dq));
    for (int64_t i = 0; i < nv; i++)
        same &= memcmp(got + i * dq, got + first[order[i]] * dq, sizeof(float) * (size_t)dq) == 0;
    int distinct = 1;
    for (int a = 0; a < NSET; a++)
        for (int c = a + 1; c < NSET; c++)
            distinct &=
                memcmp(got + first[a] * dq, got + first[c] * dq, sizeof(float) * (size_t)dq) != 0;
    tcase("%s, bit for bit", name);
    CHECK(same && distinct);
    bfree(be, kc), bfree(be, vc), bfree(be, dk), bfree(be, dv), bfree(be, dqv), bfree(be, dout);
    free(q), free(k), free(v), free(got), free(all);
}

/* set_key_bias (blending's stale scale): every third key's scores raised
 * or lowered for the rows below 3/4 of the cache (all rows for the few-row
 * cases, whose first row is the last key's), against the reference
 * with the same bias, on each CPU path: the f32 tiles (exact), the 8-bit
 * products (8 rows and more, the default), decode's one row on the f16
 * cache, the portable kernels; and the bias must change the output (the
 * case fails if it is ignored), and be gone once cleared. */
static void test_key_bias(void)
{
    static const struct {
        int f16, nq, ctx, sorted, act8;
        float bias;
    } cs[] = {
        {1, 40, 150, 0, 0, -1.05f}, {0, 40, 150, 0, 0, 0.7f},     {1, 200, 1300, 1, 0, -1.05f},
        {1, 40, 150, 0, 1, -1.05f}, {1, 200, 1300, 1, 1, -0.36f}, {1, 1, 1300, 0, 0, -1.05f},
        {1, 3, 1300, 0, 0, -1.05f},
    };
    cb_backend *a8 = cb_backend_cpu_new(2);
    a8->ops->set_act8(a8, 1);
    float *o_none = malloc(sizeof(float) * MAXOUT);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char name[160];
        kv_type = cs[i].f16 ? CB_TYPE_F16 : CB_TYPE_F32;
        att_hd = 64, att_nq = cs[i].nq, att_ctx = cs[i].ctx, att_sorted = cs[i].sorted;
        att_window = 0, att_until = att_nq < 8 ? att_ctx : att_ctx * 3 / 4;
        cb_backend *be = cs[i].act8 ? a8 : cpu;
        int q8 = cs[i].act8 && att_nq >= 8;
        double bound = q8 ? 3e-4 : 1e-10;
        snprintf(name, sizeof name, "key bias %+.2f %s %d rows%s %d keys, %s", cs[i].bias,
                 cs[i].f16 ? "f16" : "f32", att_nq, att_sorted ? " sorted" : "", att_ctx,
                 q8 ? "8-bit products" : "f32 tiles");
        if (!case_wanted(name)) { /* a skipped line for each line it would print */
            static const char *what[3] = {"cpu  %s vs reference", "cpu  %s cleared",
                                          "cpu-c %s vs reference"};
            for (int w = 0; w < (cs[i].act8 ? 2 : 3); w++) {
                char nm[200];
                snprintf(nm, sizeof nm, what[w], name);
                tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
            }
            for (int w = 0; !cs[i].act8 && cuda && cuda->ops->set_key_bias && w < 2; w++) {
                char nm[200];
                snprintf(nm, sizeof nm, w ? "cuda %s cleared" : "cuda %s vs reference", name);
                tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
            }
            continue;
        }
        att_stale = cs[i].bias;
        int64_t n = c_attention(NULL, o_ref);
        c_attention(be, o_cpu);
        double e = nmse(o_ref, o_cpu, n);
        att_stale = 0.0f;
        c_attention(be, o_none);
        double moved = nmse(o_ref, o_none, n);
        tcase("cpu  %s vs reference (nmse %.2e, bound %.0e; without the bias %.2e)", name, e, bound,
              moved);
        CHECKF(e <= bound && moved > 1e-3, "nmse %.3e, without %.3e", e, moved);
        c_attention(NULL, o_ref);
        e = nmse(o_ref, o_none, n);
        tcase("cpu  %s cleared: as without it (nmse %.2e)", name, e);
        CHECKF(e <= bound, "nmse %.3e", e);
        if (!cs[i].act8) {
            att_stale = cs[i].bias;
            c_attention(NULL, o_ref);
            c_attention(cpu_c, o_cpu);
            att_stale = 0.0f;
            e = nmse(o_ref, o_cpu, n);
            tcase("cpu-c %s vs reference (nmse %.2e)", name, e);
            CHECKF(e <= 1e-10, "nmse %.3e", e);
        }
        if (!cs[i].act8 && cuda && cuda->ops->set_key_bias)
            key_bias_cuda(name, cs[i].bias, o_none);
    }
    key_bias_rows_case(cpu, "cpu ");
    if (cuda && cuda->ops->set_key_bias)
        key_bias_rows_case(cuda, "cuda");
    att_ctx = 150, att_sorted = 0, att_nq = 40;
    if (!cuda || !cuda->ops->set_key_bias)
        tskip("cuda key bias", !cuda ? cuda_why
                                     : "the CUDA backend has no set_key_bias (CB_CUDA_KBIAS=0: "
                                       "blends there without the stale scale)");
    free(o_none);
    a8->ops->free(a8);
}

/* Found by fuzz_model: a model with NaN weights gave the softmax NaN
 * scores, and its exp converted NaN to an int (undefined; UBSan's
 * float-cast-overflow, which SAN=1 enables).  The NaN must stay in its own
 * head's row; every other row and head is as without it. */
static void test_attention_nan(void)
{
    att_hd = 64, att_nq = 40, att_window = 0, kv_type = CB_TYPE_F32, att_nan = 1;
    int64_t n = c_attention(NULL, o_ref);
    c_attention(cpu, o_cpu);
    att_nan = 0;
    int nan_ok = 1;
    for (int e = 0; e < att_hd; e++)
        nan_ok &= isnan(o_cpu[e]) != 0;
    double err = nmse(o_ref + att_hd, o_cpu + att_hd, n - att_hd);
    tcase(
        "cpu  attention with a NaN query: NaN stays in its head (nmse of the rest %.2e) (fuzz finding)",
        err);
    CHECK(nan_ok);
    CHECKF(err <= 1e-10, "nmse %.3e", err);
}

/* Timing marks (backend.h's mark_new and mark_ms, the device's clock
 * for blending's stall): a pair never recorded, or half recorded, reads
 * negative and leaves no fault; a recorded pair around queued work reads
 * more than nothing and no more than the host waited in all. */
static void test_marks(cb_backend *be, const char *tag)
{
    char nm[96];
    snprintf(nm, sizeof nm, "%s timing marks", tag);
    if (!be || !be->ops->mark_new) {
        tskip(nm, !be ? cuda_why : "none: the host's clock times its operations (cb_model_mark_*)");
        return;
    }
    void *a = be->ops->mark_new(be), *z = be->ops->mark_new(be);
    CHECK(a && z);
    if (!a || !z)
        return;
    double never = be->ops->mark_ms(be, a, z);
    be->ops->event_record(be, a);
    double half = be->ops->mark_ms(be, a, z);
    tcase("%s: never recorded %.1f, one of two %.1f (negative), no fault", nm, never, half);
    CHECK(never < 0 && half < 0 && cb_backend_status(be) == CB_OK);
    double t0 = cb_now_ms();
    be->ops->event_record(be, a);
    busy(be, 20);
    be->ops->event_record(be, z);
    double ms = be->ops->mark_ms(be, a, z), host = cb_now_ms() - t0;
    tcase("%s: 20 x 64 MB of writes between two marks: %.3f ms (the host waited %.3f ms in all)",
          nm, ms, host);
    CHECKF(ms > 0 && ms <= host + 0.5 && cb_backend_status(be) == CB_OK, "%.3f ms, host %.3f ms",
           ms, host);
    be->ops->event_free(be, a);
    be->ops->event_free(be, z);
}

/* Graphs (backend.h's graph_begin and graph_end; CUDA under
 * CB_CUDA_GRAPH=1): a decode-like step (norm, Q/K/V products, RoPE, the
 * cache rows, attention over them with and without a key bias, the output
 * product and the residual) recorded and replayed must give the bits of
 * the same step queued as usual afterwards on a state of its own, step
 * after step: positions that move (the graph updated), a jump from 64
 * keys to 900 (the attention's split changes the graph's shape: made
 * anew), key-bias rows never sent before and a scratch allocation (the
 * recording refuses them: graph_end returns 0 and the step is queued
 * again, as cb_fwd_decode does).  A recording dropped with a key bias set
 * changes nothing, and leaves no bias on the next attention. */
enum { GR_D = 256, GR_HD = 64, GR_NH = 4, GR_NKV = 2, GR_CTX = 1024, GR_STEPS = 9 };

typedef struct gr_state {
    float *x, *xn, *q, *k, *v, *att, *y;
    void *kc, *vc;
} gr_state;

static void gr_step(cb_backend *be, gr_state *s, cb_bweight *const *w, const float *g, int32_t pos,
                    const uint8_t *stale, int breaker)
{
    const cb_backend_ops *o = be->ops;
    const int64_t dkv = GR_NKV * GR_HD;
    o->rmsnorm(be, s->x, g, s->xn, 1, GR_D, 1e-5f);
    if (breaker && o->alloc_tmp) /* scratch, which no recording may allocate */
        o->alloc_tmp(be, 64);
    o->matmul(be, w[0], s->xn, s->q, 1);
    o->matmul(be, w[1], s->xn, s->k, 1);
    o->matmul(be, w[2], s->xn, s->v, 1);
    o->rope(be, s->q, &pos, 1, GR_NH, GR_HD, GR_HD, 10000.0f, NULL, 1);
    o->rope(be, s->k, &pos, 1, GR_NKV, GR_HD, GR_HD, 10000.0f, NULL, 1);
    o->kv_write(be, s->kc, CB_TYPE_F16, dkv, s->k, &pos, 1);
    o->kv_write(be, s->vc, CB_TYPE_F16, dkv, s->v, &pos, 1);
    if (stale && o->set_key_bias)
        o->set_key_bias(be, stale, pos / 2, -0.8f, INT32_MAX);
    o->attention(be, s->q, &pos, 1, s->kc, s->vc, CB_TYPE_F16, GR_NH, GR_NKV, GR_HD, 0.125f, 0,
                 s->att);
    if (stale && o->set_key_bias)
        o->set_key_bias(be, NULL, 0, 0.0f, 0);
    o->matmul(be, w[3], s->att, s->y, 1);
    o->add(be, s->x, s->y, GR_D);
}

/* A dropped recording of one product past the few-row kernel leaves the
 * products' input scale as the device has it: a product of inputs of
 * magnitude 1e4 queued, one recorded and dropped, then one of inputs of
 * 1e-7, which must take its own scale (CUDA's amax slots under
 * CB_CUDA_FUSE=1: the dropped product's turn of slot undone; else the
 * third takes the first's slot, still holding 1e4, and its inputs fall
 * among f16's subnormals, nmse ~2e-2 against the bound 1e-5). */
static void gr_scale_after_drop(cb_backend *be, const char *tag, cb_bweight *w, const float *wh)
{
    enum { N = 12 };
    float *x = rand_vec(N * GR_D, 1.0f), *big = malloc(sizeof(float) * N * GR_D);
    float *tiny = malloc(sizeof(float) * N * GR_D), *got = malloc(sizeof(float) * N * GR_D);
    for (int i = 0; i < N * GR_D; i++)
        big[i] = x[i] * 1e4f, tiny[i] = x[i] * 1e-7f;
    float *db = bput(be, big, sizeof(float) * N * GR_D),
          *dt = bput(be, tiny, sizeof(float) * N * GR_D);
    float *dy = be->ops->alloc(be, sizeof(float) * N * GR_D);
    be->ops->matmul(be, w, db, dy, N);
    int dropped = be->ops->graph_begin(be, 2);
    if (dropped) {
        be->ops->matmul(be, w, dt, dy, N);
        dropped = be->ops->graph_end(be, 0) == 0;
    }
    be->ops->matmul(be, w, dt, dy, N);
    bget(be, got, dy, sizeof(float) * N * GR_D);
    double e = 0, r2 = 0;
    for (int i = 0; i < N; i++)
        for (int o = 0; o < GR_D; o++) {
            double ref = 0;
            for (int j = 0; j < GR_D; j++)
                ref += (double)x[i * GR_D + j] * wh[o * GR_D + j];
            double d = got[i * GR_D + o] / 1e-7 - ref;
            e += d * d, r2 += ref * ref;
        }
    tcase("%s graphs: a dropped recording's product leaves the next its own input scale (nmse "
          "%.2e, bound 1e-5)",
          tag, e / r2);
    CHECK(dropped && e / r2 <= 1e-5 && cb_backend_status(be) == CB_OK);
    bfree(be, db), bfree(be, dt), bfree(be, dy);
    free(x), free(big), free(tiny), free(got);
}

static void test_graph_ops(cb_backend *be, const char *tag)
{
    char nm[200];
    snprintf(nm, sizeof nm, "%s graphs: a recorded step replays the bits of a queued one, %d steps",
             tag, GR_STEPS);
    if (!be || !be->ops->graph_begin) {
        tskip(nm, !be ? cuda_why
                      : "the backend has no graphs (CB_CUDA_GRAPH=0, or CB_CUDA_MEMO=0 or "
                        "CB_CUDA_SYNC=1, without which it records none)");
        return;
    }
    if (!case_wanted(nm)) {
        tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
        return;
    }
    /* bias rows of 31 keys (step 2; step 3 the same row), 451 and 452;
     * step 5's recording allocates */
    static const int32_t at[GR_STEPS] = {60, 61, 62, 63, 900, 901, 902, 903, 904};
    static const int with_bias[GR_STEPS] = {0, 0, 1, 1, 0, 0, 1, 0, 1};
    const int64_t dkv = GR_NKV * GR_HD;
    seed(4242);
    float *wh[4] = {rand_vec(GR_D * GR_D, 0.06f), rand_vec(dkv * GR_D, 0.06f),
                    rand_vec(dkv * GR_D, 0.06f), rand_vec(GR_D * GR_D, 0.06f)};
    const int64_t n_out[4] = {GR_D, dkv, dkv, GR_D};
    cb_bweight *w[4];
    for (int i = 0; i < 4; i++)
        w[i] = be->ops->weight_new(be, CB_TYPE_F32, GR_D, n_out[i], wh[i], NULL);
    float *gh = rand_vec(GR_D, 1.0f), *x0 = rand_vec(GR_D, 1.0f);
    float *kh = rand_vec(GR_CTX * dkv, 1.5f), *vh = rand_vec(GR_CTX * dkv, 1.0f);
    int32_t *all = malloc(sizeof(int32_t) * GR_CTX);
    uint8_t *stale = malloc(GR_CTX);
    for (int i = 0; i < GR_CTX; i++)
        all[i] = i, stale[i] = (uint8_t)(i % 3 == 0);
    float *g = bput(be, gh, sizeof(float) * GR_D);
    float *dk = bput(be, kh, sizeof(float) * (size_t)(GR_CTX * dkv)),
          *dv = bput(be, vh, sizeof(float) * (size_t)(GR_CTX * dkv));
    gr_state st[2];
    for (int i = 0; i < 2; i++) {
        gr_state *s = &st[i];
        s->x = bput(be, x0, sizeof(float) * GR_D);
        s->xn = be->ops->alloc(be, sizeof(float) * GR_D);
        s->q = be->ops->alloc(be, sizeof(float) * GR_D);
        s->k = be->ops->alloc(be, sizeof(float) * dkv);
        s->v = be->ops->alloc(be, sizeof(float) * dkv);
        s->att = be->ops->alloc(be, sizeof(float) * GR_D);
        s->y = be->ops->alloc(be, sizeof(float) * GR_D);
        s->kc = be->ops->alloc(be, 2 * (size_t)(GR_CTX * dkv));
        s->vc = be->ops->alloc(be, 2 * (size_t)(GR_CTX * dkv));
        be->ops->kv_write(be, s->kc, CB_TYPE_F16, dkv, dk, all, GR_CTX);
        be->ops->kv_write(be, s->vc, CB_TYPE_F16, dkv, dv, all, GR_CTX);
    }
    float xa[GR_D], xb[GR_D];
    int same = 0, ran = 0, redone = 0, moved = 0;
    for (int i = 0; i < GR_STEPS; i++) {
        const uint8_t *sb = with_bias[i] ? stale : NULL;
        /* recorded first, so that what it refuses (a bias row, scratch to
         * grow) is not already there from the step queued as usual */
        if (be->ops->graph_begin(be, 1)) {
            gr_step(be, &st[1], w, g, at[i], sb, i == 5);
            if (be->ops->graph_end(be, 1))
                ran++;
            else
                redone++, gr_step(be, &st[1], w, g, at[i], sb, 0);
        } else {
            redone++, gr_step(be, &st[1], w, g, at[i], sb, 0);
        }
        gr_step(be, &st[0], w, g, at[i], sb, 0);
        bget(be, xa, st[0].x, sizeof xa);
        bget(be, xb, st[1].x, sizeof xb);
        same += memcmp(xa, xb, sizeof xa) == 0;
        moved += memcmp(xa, x0, sizeof xa) != 0;
    }
    /* a recording dropped (run 0) with a key bias set (a row sent before)
     * and never cleared leaves the state as it was, and the next step,
     * queued as usual without a bias, takes none */
    bget(be, xa, st[1].x, sizeof xa);
    int dropped = be->ops->graph_begin(be, 1);
    if (dropped) {
        be->ops->set_key_bias(be, stale, at[2] / 2, -0.8f, INT32_MAX);
        gr_step(be, &st[1], w, g, 905, NULL, 0);
        dropped = be->ops->graph_end(be, 0) == 0;
    }
    bget(be, xb, st[1].x, sizeof xb);
    int unchanged = memcmp(xa, xb, sizeof xa) == 0;
    gr_step(be, &st[1], w, g, 905, NULL, 0);
    gr_step(be, &st[0], w, g, 905, NULL, 0);
    bget(be, xa, st[0].x, sizeof xa);
    bget(be, xb, st[1].x, sizeof xb);
    tcase("%s (%d replayed, %d queued again, %d the same)", nm, ran, redone, same);
    CHECKF(same == GR_STEPS && moved == GR_STEPS && ran >= 3 && redone >= 4 &&
               cb_backend_status(be) == CB_OK,
           "%d of %d steps the same, %d replayed, %d queued again, status %d", same, GR_STEPS, ran,
           redone, cb_backend_status(be));
    tcase("%s graphs: a recording not run changes nothing, and leaves no key bias", tag);
    CHECK(dropped && unchanged && memcmp(xa, xb, sizeof xa) == 0 && cb_backend_status(be) == CB_OK);
    gr_scale_after_drop(be, tag, w[0], wh[0]);
    for (int i = 0; i < 2; i++) {
        gr_state *s = &st[i];
        bfree(be, s->x), bfree(be, s->xn), bfree(be, s->q), bfree(be, s->k), bfree(be, s->v);
        bfree(be, s->att), bfree(be, s->y), bfree(be, s->kc), bfree(be, s->vc);
    }
    for (int i = 0; i < 4; i++)
        be->ops->weight_free(be, w[i]), free(wh[i]);
    bfree(be, g), bfree(be, dk), bfree(be, dv);
    free(gh), free(x0), free(kh), free(vh), free(all), free(stale);
}

/* ------------------------------------------- the review's cases: driver */

/* run_case for the model-sized attention: the reference and the CPU on a
 * sample of rows (the plain loop is slow), then CPU vs CUDA on all. */
static void run_case_sampled(const char *name, case_fn fn, double cpu_bound, double cuda_bound)
{
    if (case_skip(name, "vs reference, 24 rows", "vs cpu, all rows"))
        return;
    r18_sample = 24;
    int64_t n_ref = fn(NULL, o_ref), n_cpu = fn(cpu, o_cpu);
    double e = nmse(o_ref, o_cpu, n_ref);
    tcase("cpu  %s vs reference, 24 rows (nmse %.2e, bound %.0e)", name, e, cpu_bound);
    CHECK(n_ref == n_cpu);
    CHECKF(e <= cpu_bound, "nmse %.3e > %.0e", e, cpu_bound);
    r18_sample = 0;
    if (!cuda) {
        char nm[160];
        snprintf(nm, sizeof nm, "cuda %s vs cpu", name);
        tskip(nm, cuda_why);
        run_fa(name, fn, 0);
        return;
    }
    n_cpu = fn(cpu, o_cpu);
    char nm[160];
    snprintf(nm, sizeof nm, "cuda %s vs cpu, all rows", name);
    vs_ref(cuda, o_cpu, o_cuda, nm, fn, n_cpu, cuda_bound);
    run_fa(name, fn, n_cpu);
}

/* Error reports, in a child process (a kernel fault spoils the CUDA
 * context for the rest of the process, and CB_CUDA_SYNC is read when the
 * backend opens).  The child prints what the backend reports: "status N:
 * MESSAGE" (cb_backend_status, fault_msg).  mode "nonfinite": CB_CUDA_SYNC=1,
 * ordinary operations pass the per-operation checks, and a product whose
 * output is not finite is a fault that names the product.  mode "fault": a
 * kernel writes through a bad pointer; the next allocation returns NULL and
 * the backend's status is the device fault itself (so callers do not report
 * it as out of memory).  mode "fault-sync": the same under CB_CUDA_SYNC=1,
 * where the report names the operation that faulted. */
static void r18_report(cb_backend *be)
{
    printf("status %d: %s\n", (int)cb_backend_status(be),
           cb_backend_status(be) != CB_OK ? be->fault_msg : "");
    fflush(stdout);
}

static int r18_child(const char *mode)
{
    cb_backend *be;
    cb_error err;
    int64_t n_in = 64, n_out = 8;
    if (strcmp(mode, "fault") != 0)
        setenv("CB_CUDA_SYNC", "1", 1);
    if (cb_backend_open(&be, "cuda", 0, &err) != CB_OK)
        return 3;
    if (strncmp(mode, "fault", 5) == 0) {
        float src[16] = {0};
        int32_t at[1] = {0};
        float *d = bput(be, src, sizeof src);
        printf("faulting\n");
        fflush(stdout);
        be->ops->kv_write(be, (void *)(uintptr_t)0x100, CB_TYPE_F32, 16, d, at, 1);
        void *p = be->ops->alloc(be, 1024);
        printf("alloc after the fault returned %s\n", p ? "memory" : "NULL");
        r18_report(be);
        return 0;
    }
    float *x = rand_vec(n_in, 1.0f), y[8], *wf = rand_vec(n_in * n_out, 1.0f);
    uint16_t wq[64 * 8];
    for (int64_t o = 0; o < n_out; o++)
        cb_quant_row(CB_TYPE_F16, wf + o * n_in, wq + o * n_in, n_in);
    cb_bweight *w = be->ops->weight_new(be, CB_TYPE_F16, n_in, n_out, wq, NULL);
    float *dx = bput(be, x, sizeof(float) * (size_t)n_in), *dy = be->ops->alloc(be, sizeof y);
    be->ops->matmul(be, w, dx, dy, 1);
    bget(be, y, dy, sizeof y);
    if (cb_backend_status(be) == CB_OK)
        printf("finite product passed\n");
    fflush(stdout);
    x[5] = INFINITY;
    be->ops->upload(be, dx, x, sizeof(float) * (size_t)n_in);
    be->ops->matmul(be, w, dx, dy, 1);
    r18_report(be);
    return 0;
}

/* run this program as a child in mode `mode`; its stdout and stderr */
static char *r18_run_child(const char *self, const char *mode)
{
    char cmd[1200], *log = malloc(16384);
    size_t len = 0;
    snprintf(cmd, sizeof cmd, "'%s' --child %s 2>&1", self, mode);
    FILE *f = popen(cmd, "r");
    if (f) {
        len = fread(log, 1, 16383, f);
        pclose(f);
    }
    log[len] = 0;
    return log;
}

static void r18_error_checks(const char *self)
{
    static const char *names[3] = {
        "CB_CUDA_SYNC=1: checks pass, a non-finite product is a fault naming it",
        "a kernel fault is reported as itself at the next call, not as out of memory",
        "CB_CUDA_SYNC=1: a kernel fault is reported at the operation that caused it"};
    char dev[32];
    snprintf(dev, sizeof dev, "status %d: ", (int)CB_ERR_DEVICE);
    if (!cuda) {
        for (int i = 0; i < 3; i++)
            tskip(names[i], cuda_why);
        return;
    }
    char *log = r18_run_child(self, "nonfinite");
    tcase("%s", names[0]);
    CHECKF(strstr(log, "finite product passed") != NULL, "the checked operations failed: %s", log);
    CHECKF(strstr(log, "status 0:") == NULL && strstr(log, "inf or NaN") != NULL &&
               strstr(log, "matmul") != NULL,
           "no report: %s", log);
    free(log);
    log = r18_run_child(self, "fault");
    tcase("%s", names[1]);
    CHECKF(strstr(log, "faulting") != NULL, "the child did not start: %s", log);
    CHECKF(strstr(log, "alloc after the fault returned NULL") != NULL, "alloc: %s", log);
    CHECKF(strstr(log, dev) != NULL &&
               (strstr(log, "illegal") != NULL || strstr(log, "launch failure") != NULL) &&
               strstr(log, "out of memory") == NULL,
           "report: %s", log);
    free(log);
    log = r18_run_child(self, "fault-sync");
    tcase("%s", names[2]);
    CHECKF(strstr(log, dev) != NULL && strstr(log, "kv_write:") != NULL &&
               (strstr(log, "illegal") != NULL || strstr(log, "launch failure") != NULL),
           "report: %s", log);
    free(log);
}

/* The 8-bit activation path (cb_model_params.act8): on every block type
 * that has it, the dispatched and the portable kernels against (1) the
 * plain double loop of the same math (activations quantized, then the
 * product), bound 1e-10 (measured up to ~1e-13: the f32 sums and the
 * weights' a*w+b against the decoder's one rounding); (2) the exact f32
 * product, bound 1e-4 (8-bit activations: an error of up to a 254th of each
 * 32-group's largest value (256 for the K-quants in batches); measured
 * 1.2e-5 to 6e-5 on uniform inputs); (3) each other, 1e-11 (measured up
 * to ~2e-13: the same integers, f32 sums in another order; the blocked
 * kernels of batches past 12 rows agree bit for bit).  Shapes cover the
 * blocked kernels' tails: rows not a multiple of their 4, outputs not a
 * multiple of their 8-row panels.  And the quantizers agree bit for bit
 * with the portable ones, ties and zeros included. */
/* matmul_multi (one job for the products of one input) gives, bit for bit,
 * what matmul gives for each weight: three weights of types ty and
 * different widths (the second with a bias), 1, 5, 8 and 12 rows and 20
 * (the per-weight fallback), inputs of n_in, on backend be.  Types that
 * differ take one product per weight on a device keeping weights in their
 * blocks; three of one type one launch. */
static void multi_case(cb_backend *be, const char *label, const cb_type ty[3], int64_t n_in)
{
    static const int64_t outs[3] = {72, 40, 20}, ns[5] = {1, 5, 8, 12, 20};
    seed(7);
    float *x = rand_vec(20 * n_in, 1.0f), *bias = rand_vec(40, 0.5f);
    float *dx = bput(be, x, sizeof(float) * 20 * (size_t)n_in);
    cb_bweight *w[3];
    uint8_t *wq[3];
    float *y1[3], *y2[3], *d1[3], *d2[3];
    for (int k = 0; k < 3; k++) {
        /* magnitudes 1, 16 and 1/16: each weight its own power-of-two
         * scale on a device, so that a product given another's fails */
        float *wf = rand_vec(n_in * outs[k], k == 0 ? 1.0f : k == 1 ? 16.0f : 0.0625f);
        size_t rb = cb_type_row_bytes(ty[k], n_in);
        wq[k] = malloc(rb * (size_t)outs[k]);
        for (int64_t o = 0; o < outs[k]; o++)
            cb_quant_row(ty[k], wf + o * n_in, wq[k] + (size_t)o * rb, n_in);
        w[k] = be->ops->weight_new(be, ty[k], n_in, outs[k], wq[k], k == 1 ? bias : NULL);
        y1[k] = malloc(sizeof(float) * 20 * (size_t)outs[k]);
        y2[k] = malloc(sizeof(float) * 20 * (size_t)outs[k]);
        d1[k] = be->ops->alloc(be, sizeof(float) * 20 * (size_t)outs[k]);
        d2[k] = be->ops->alloc(be, sizeof(float) * 20 * (size_t)outs[k]);
        free(wf);
    }
    for (int i = 0; i < 5; i++) {
        int same = 1;
        for (int k = 0; k < 3; k++)
            be->ops->matmul(be, w[k], dx, d1[k], ns[i]);
        be->ops->matmul_multi(be, (const cb_bweight *const *)w, 3, dx, d2, ns[i]);
        for (int k = 0; k < 3; k++) {
            bget(be, y1[k], d1[k], sizeof(float) * (size_t)(ns[i] * outs[k]));
            bget(be, y2[k], d2[k], sizeof(float) * (size_t)(ns[i] * outs[k]));
            same &= memcmp(y1[k], y2[k], sizeof(float) * (size_t)(ns[i] * outs[k])) == 0;
        }
        tcase("%s matmul_multi %s+%s(bias)+%s x %lld, %lld rows = matmul each, bit for bit", label,
              cb_type_name(ty[0]), cb_type_name(ty[1]), cb_type_name(ty[2]), (long long)n_in,
              (long long)ns[i]);
        CHECK(same);
    }
    for (int k = 0; k < 3; k++) {
        be->ops->weight_free(be, w[k]);
        bfree(be, d1[k]), bfree(be, d2[k]);
        free(wq[k]), free(y1[k]), free(y2[k]);
    }
    bfree(be, dx);
    free(x), free(bias);
}

/* A row one value dominates (max|x|^2 > half the sum of squares) goes
 * through the exact kernels on the 8-bit path (cpu.c, outlier_row): alone,
 * in 5 rows (the one-row kernel) and in 20 (packed panels), it gets the
 * exact path's bits for two copies of it, and the other rows what they get
 * without it.  A row with two equal large values (half the energy, not
 * more) stays on the 8-bit path. */
static void outlier_cases(cb_backend *a8)
{
    static const cb_type ty[] = {CB_TYPE_Q4_K, CB_TYPE_Q6_K, CB_TYPE_Q8_0, CB_TYPE_Q5_0};
    static const int64_t ns[] = {1, 5, 20};
    int64_t n_in = 512, n_out = 40;
    for (size_t t = 0; t < sizeof ty / sizeof ty[0]; t++) {
        seed(11);
        float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(20 * n_in, 1.0f);
        size_t rb = cb_type_row_bytes(ty[t], n_in);
        uint8_t *wq = malloc(rb * (size_t)n_out);
        for (int64_t o = 0; o < n_out; o++)
            cb_quant_row(ty[t], wf + o * n_in, wq + (size_t)o * rb, n_in);
        cb_bweight *wa = a8->ops->weight_new(a8, ty[t], n_in, n_out, wq, NULL),
                   *we = cpu->ops->weight_new(cpu, ty[t], n_in, n_out, wq, NULL);
        float *y = malloc(sizeof(float) * 20 * (size_t)n_out),
              *yn = malloc(sizeof *yn * 20 * n_out),
              *ye = malloc(sizeof(float) * 2 * (size_t)n_out), xx[2 * 512];
        a8->ops->matmul(a8, wa, x, yn, 20);        /* no outlier yet */
        x[0 * n_in + 9] = 60.0f;                   /* row 0: 3,600 of ~3,770 */
        x[3 * n_in + 7] = 60.0f;                   /* row 3 too */
        x[4 * n_in + 1] = x[4 * n_in + 2] = 13.0f; /* row 4: 2 x 169 of ~509: stays */
        memcpy(xx, x + 3 * n_in, sizeof(float) * (size_t)n_in);
        memcpy(xx + n_in, xx, sizeof(float) * (size_t)n_in);
        cpu->ops->matmul(cpu, we, xx, ye, 2);
        float *yo = malloc(sizeof(float) * 20 * (size_t)n_out);
        a8->ops->matmul(a8, wa, x + 4 * n_in, yo, 1);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int64_t n = ns[k], r0 = n == 1 ? 3 : 0;
            a8->ops->matmul(a8, wa, x + r0 * n_in, y, n);
            int ok = memcmp(y + (3 - r0) * n_out, ye, sizeof(float) * (size_t)n_out) == 0;
            for (int64_t r = 1; r < n && n > 1; r++)
                if (r != 3 && r != 4)
                    ok &= memcmp(y + r * n_out, yn + r * n_out, sizeof(float) * (size_t)n_out) == 0;
            if (n > 4)
                ok &= memcmp(y + 4 * n_out, yo, sizeof(float) * (size_t)n_out) == 0;
            tcase("act8 %s: a row one value dominates, in %lld rows = the exact path's bits; the "
                  "others' unchanged",
                  cb_type_name(ty[t]), (long long)n);
            CHECK(ok);
        }
        /* row 4 (two large values) is not the exact product: the 8-bit one */
        cpu->ops->matmul(cpu, we, x + 4 * n_in, ye, 2);
        tcase("act8 %s: a row two values share stays on the 8-bit path", cb_type_name(ty[t]));
        CHECK(memcmp(yo, ye, sizeof(float) * (size_t)n_out) != 0);
        a8->ops->weight_free(a8, wa);
        cpu->ops->weight_free(cpu, we);
        free(wf), free(x), free(wq), free(y), free(yn), free(ye), free(yo);
    }
}

/* The exact kernels' QMM_ONE_PAIRED: one row with the bits it gets among
 * 2, 3 and 4 rows (cpu.c's rows one value dominates go through it), on
 * every type, with the kernels this CPU runs and the portable ones. */
static void paired_cases(void)
{
    static const cb_type ty[] = {CB_TYPE_F32,  CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0,
                                 CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1, CB_TYPE_Q8_0,
                                 CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    int64_t n_in = 512, n_out = 24;
    seed(5);
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec(4 * n_in, 2.0f);
    float y1[24], y4[4 * 24];
    for (size_t t = 0; t < sizeof ty / sizeof ty[0]; t++)
        for (int simd = 1; simd >= 0; simd--) {
            qmm_kernels k;
            size_t rb = cb_type_row_bytes(ty[t], n_in);
            uint8_t *wq = malloc(rb * (size_t)n_out);
            for (int64_t o = 0; o < n_out; o++)
                cb_quant_row(ty[t], wf + o * n_in, wq + (size_t)o * rb, n_in);
            CHECK(qmm_select(ty[t], simd, &k));
            k.dot(ty[t], wq, rb, n_in, x, n_in, QMM_ONE_PAIRED, 0, n_out, y1, n_out);
            int ok = 1;
            for (int nr = 2; nr <= QMM_ROWS; nr++) {
                k.dot(ty[t], wq, rb, n_in, x, n_in, nr, 0, n_out, y4, n_out);
                ok &= memcmp(y1, y4, sizeof y1) == 0;
            }
            tcase("qmm %s %s: one paired row = row 0 of 2, 3 and 4 rows, bit for bit", k.isa,
                  cb_type_name(ty[t]));
            CHECK(ok);
            free(wq);
        }
    free(wf), free(x);
}

/* The default path's attention (cpu_attn.c's 8-bit products: queries and
 * keys per 32 values, values per key, the probabilities per 32 keys) on
 * the shapes of the exact path's cases: against the double-precision
 * reference, the exact path and the portable kernels, and on 1 thread
 * against 2.  Fewer than 8 rows, and a head dimension not a multiple of 32,
 * keep the f32 tiles: the exact path's bound.  The 8-bit bound, 3e-4: on
 * these uniform random rows (scores of a few units, nearly flat softmax,
 * outputs means of many values) the roundings of q and of the
 * probabilities (1/254 of a block's largest value) move the outputs by
 * about 1% (nmse 0.3-1.1e-4); the portable softmax's sums may flip one of
 * the probabilities' roundings (1e-7).  Keys with two channels 20 times
 * the rest (Qwen2's keys carry such) stay at the others' error: their mean
 * is taken out, and a key is quantized in two parts (one part and no mean:
 * 9.5e-4). */
static void act8_attention_cases(cb_backend *a8, cb_backend *a8c)
{
    static const struct {
        int f16, hd, heads, kv, nq, ctx, window, sorted, consec, big_k;
    } cs[] = {
        {1, 64, 6, 2, 40, 150, 0, 0, 0, 0},     {0, 64, 6, 2, 40, 150, 0, 0, 0, 0},
        {1, 128, 6, 2, 40, 150, 0, 0, 0, 0},    {1, 40, 6, 2, 40, 150, 0, 0, 0, 0},
        {1, 64, 6, 2, 40, 150, 7, 0, 0, 0},     {1, 64, 6, 2, 40, 1300, 300, 0, 0, 0},
        {1, 64, 6, 2, 200, 1300, 0, 1, 0, 0},   {0, 64, 6, 2, 700, 1300, 70, 1, 0, 0},
        {1, 128, 6, 2, 330, 1300, 0, 0, 1, 0},  {1, 64, 6, 2, 330, 1300, 300, 0, 1, 0},
        {1, 128, 12, 2, 330, 1300, 0, 0, 1, 1}, {1, 64, 4, 4, 90, 1300, 0, 1, 0, 0},
        {1, 64, 6, 2, 8, 1300, 0, 1, 0, 0},     {1, 64, 6, 2, 7, 1300, 0, 1, 0, 0},
        {1, 64, 6, 2, 1, 1300, 0, 0, 0, 0},
    };
    char name[160];
    cb_backend *a1 = cb_backend_cpu_new(1);
    a1->ops->set_act8(a1, 1);
    /* this CPU's kernels take the 8-bit attention only with a dot-product
     * instruction (qg_kernels.att8; on AVX2 the f32 tiles); the portable
     * ones always, so that its bits are shown on every CPU */
    qg_kernels best;
    qg_select(1, &best);
    float *o_c = malloc(sizeof(float) * MAXOUT), *o_1 = malloc(sizeof(float) * MAXOUT),
          *o_x = malloc(sizeof(float) * MAXOUT);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        kv_type = cs[i].f16 ? CB_TYPE_F16 : CB_TYPE_F32;
        att_hd = cs[i].hd, att_heads = cs[i].heads, att_kv_heads = cs[i].kv, att_nq = cs[i].nq;
        att_ctx = cs[i].ctx, att_window = cs[i].window, att_sorted = cs[i].sorted;
        att_consec = cs[i].consec, att_big_k = cs[i].big_k;
        int q8c = att_nq >= 8 && att_hd % 32 == 0, q8 = q8c && best.att8;
        snprintf(name, sizeof name, "attention %s hd %d %dx%d heads %d rows%s %d keys window %d%s",
                 cs[i].f16 ? "f16" : "f32", att_hd, att_heads / att_kv_heads, att_kv_heads, att_nq,
                 att_sorted   ? " sorted"
                 : att_consec ? " prefill"
                              : "",
                 att_ctx, att_window, att_big_k ? ", keys' outlier channels" : "");
        /* the same tasks on 1 thread and on 2 (the keys split only where
         * tasks are fewer than 4 a thread: then as many splits as threads
         * want) */
        int g = att_heads / att_kv_heads;
        int64_t tasks = att_kv_heads * (int64_t)((att_nq + 256 / g - 1) / (256 / g));
        int same_tasks = att_nq >= 8 && (tasks >= 8 || att_ctx < 512);
        if (!case_wanted(name)) { /* a skipped line for each line it would print */
            static const char *what[4] = {"vs reference", "vs the exact path", "vs portable",
                                          "on 1 thread = on 2"};
            for (int w = 0; w < 3 + same_tasks; w++) {
                char nm[240];
                snprintf(nm, sizeof nm, "act8 %s %s", name, what[w]);
                tskip(nm, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
            }
            continue;
        }
        int64_t n = c_attention(NULL, o_ref);
        c_attention(a8, o_cpu);
        c_attention(a8c, o_c);
        c_attention(a1, o_1);
        c_attention(cpu, o_x);
        double e = nmse(o_ref, o_cpu, n), ec = nmse(o_ref, o_c, n), ex = nmse(o_x, o_cpu, n),
               es = nmse(o_c, o_cpu, n), bound = q8 ? 3e-4 : 1e-10, bc = q8c ? 3e-4 : 1e-10;
        tcase("act8 %s vs reference (nmse %.2e, portable %.2e; bounds %.0e, %.0e: %s)", name, e, ec,
              bound, bc,
              q8    ? "8-bit products"
              : q8c ? "the f32 tiles, and the portable 8-bit products"
                    : "the f32 tiles");
        CHECKF(e <= bound && ec <= bc, "nmse %.3e / %.3e", e, ec);
        tcase("act8 %s vs the exact path (nmse %.2e, %s)", name, ex,
              q8    ? "> 0: the 8-bit products ran"
              : q8c ? "0: this CPU's kernels take the f32 tiles"
                    : "0: the f32 tiles");
        CHECK(q8 ? ex > 0 : ex == 0);
        if (q8c && !q8) {
            char nm[240];
            snprintf(nm, sizeof nm, "act8 %s vs portable", name);
            tskip(nm, "this CPU's kernels take the f32 tiles: no 8-bit kernel to compare");
        } else {
            tcase("act8 %s %s vs portable (nmse %.2e, bound %.0e)", name, a8->desc, es,
                  q8 ? 1e-7 : 1e-9);
            CHECKF(es <= (q8 ? 1e-7 : 1e-9), "nmse %.3e", es);
        }
        if (same_tasks) {
            tcase("act8 %s on 1 thread = on 2, bit for bit", name);
            CHECK(memcmp(o_1, o_cpu, sizeof(float) * (size_t)n) == 0);
        }
    }
    att_heads = 6, att_kv_heads = 2, att_ctx = 150, att_window = 0, att_sorted = 0, att_consec = 0,
    att_big_k = 0;
    free(o_c), free(o_1), free(o_x);
    a1->ops->free(a1);
}

static void act8_cases(void)
{
    static const cb_type q8_types[] = {CB_TYPE_Q4_0, CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1,
                                       CB_TYPE_Q8_0, CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    /* the last: one row of 15 32-blocks (the one-row kernel takes eight
     * groups at a time, then one: the 32-element types only) */
    static const int64_t shapes[][3] = {
        {1, 512, 48},  {3, 512, 48}, {4, 1280, 20}, {2, 2048, 9},   {11, 256, 40},   {1, 480, 20},
        {13, 512, 40}, {16, 256, 8}, {30, 768, 21}, {64, 1280, 24}, {101, 2048, 17}, {14, 480, 13}};
    char name[128];
    cb_backend *a8 = cb_backend_cpu_new(2), *a8c = cb_backend_cpu_new_ex(2, 0);
    a8->ops->set_act8(a8, 1);
    a8c->ops->set_act8(a8c, 1);
    printf("# 8-bit activations: %s; portable: %s\n", a8->desc, a8c->desc);
    static const cb_type mixed[3] = {CB_TYPE_Q4_1, CB_TYPE_Q8_0, CB_TYPE_Q6_K},
                         q8[3] = {CB_TYPE_Q8_0, CB_TYPE_Q8_0, CB_TYPE_Q8_0},
                         bf[3] = {CB_TYPE_BF16, CB_TYPE_BF16, CB_TYPE_BF16};
    multi_case(cpu, "cpu ", mixed, 512);
    multi_case(a8, "act8", mixed, 512);
    multi_case(cpu, "cpu ", q8, 896);
    multi_case(cpu, "cpu ", bf, 512);
    /* CUDA's, with the few-row kernel: one launch for the three (up to 8
     * rows), past them the input converted to f16 (bf16) once for the
     * three cuBLAS products; on the blocks, one launch for three of one
     * type (Qwen2.5-0.5B's width), past 8 rows their tiles */
    if (cuda && cuda->ops->matmul_multi) {
        multi_case(cuda, "cuda", mixed, 512);
        multi_case(cuda, "cuda", bf, 512);
    } else
        tskip("cuda matmul_multi = matmul each, bit for bit",
              cuda ? "CB_CUDA_GEMV=0: no matmul_multi" : cuda_why);
    if (cuda_qw && cuda_qw->ops->matmul_multi) {
        multi_case(cuda_qw, "cuda-qw", mixed, 512);
        multi_case(cuda_qw, "cuda-qw", q8, 896);
    } else {
        tskip("cuda-qw matmul_multi = matmul each, bit for bit",
              cuda_qw ? "CB_CUDA_GEMV=0: no matmul_multi"
              : cuda  ? "CB_CUDA_QW: the backend did not open"
                      : cuda_why);
    }
    outlier_cases(a8);
    act8_attention_cases(a8, a8c);
    float *o_c = malloc(sizeof(float) * MAXOUT);
    for (size_t i = 0; i < sizeof q8_types / sizeof q8_types[0]; i++) {
        mm_type = q8_types[i], mm_bias = 0;
        snprintf(name, sizeof name, "qmm_group8 %s = dequant", cb_type_name(mm_type));
        int64_t n = c_group8(NULL, o_ref);
        c_group8(a8, o_cpu);
        double e = nmse(o_ref, o_cpu, n);
        tcase("act8 %-30s (nmse %.2e, bound 1e-13)", name, e);
        CHECKF(e <= 1e-13, "nmse %.3e", e);
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            mm_n = shapes[k][0], mm_in = shapes[k][1], mm_out = shapes[k][2];
            if (mm_in % cb_type_block_elems(mm_type) != 0)
                continue;
            snprintf(name, sizeof name, "matmul %s %lldx%lldx%lld", cb_type_name(mm_type),
                     (long long)mm_n, (long long)mm_in, (long long)mm_out);
            act8_exact = 0;
            n = c_matmul_act8(NULL, o_ref);
            c_matmul_act8(a8, o_cpu);
            c_matmul_act8(a8c, o_c);
            double ea = nmse(o_ref, o_cpu, n), ec = nmse(o_ref, o_c, n), eac = nmse(o_c, o_cpu, n);
            tcase("act8 %-30s vs same-math reference (nmse %.2e, portable %.2e; bound 1e-10)", name,
                  ea, ec);
            CHECKF(ea <= 1e-10 && ec <= 1e-10, "nmse %.3e / %.3e", ea, ec);
            tcase("act8 %-30s %s vs portable (nmse %.2e, bound 1e-11)", name, qmm_isa(1), eac);
            CHECKF(eac <= 1e-11, "nmse %.3e", eac);
            act8_exact = 1;
            c_matmul_act8(NULL, o_ref);
            e = nmse(o_ref, o_cpu, n);
            tcase("act8 %-30s vs exact f32 product (nmse %.2e, bound 1e-4)", name, e);
            CHECKF(e <= 1e-4 && e > 0, "nmse %.3e", e);
        }
        /* one row of 2,056 groups: past the one-row kernel's 2,048, the
         * general kernel; f32 sums of 65,792 terms, so 1e-9 */
        mm_n = 1, mm_in = 65792, mm_out = 16, act8_exact = 0;
        snprintf(name, sizeof name, "matmul %s 1x65792x16", cb_type_name(mm_type));
        n = c_matmul_act8(NULL, o_ref);
        c_matmul_act8(a8, o_cpu);
        c_matmul_act8(a8c, o_c);
        e = nmse(o_ref, o_cpu, n);
        double e2 = nmse(o_ref, o_c, n);
        tcase("act8 %-30s vs same-math reference (nmse %.2e, portable %.2e; bound 1e-9)", name, e,
              e2);
        CHECKF(e <= 1e-9 && e2 <= 1e-9, "nmse %.3e / %.3e", e, e2);
    }
    act8_exact = 0;
    paired_cases();
    /* the quantizers: random values, exact ties (k + 0.5 steps), zeros, a
     * group of zeros, huge and tiny values */
    qmm_kernels k;
    qmm_select(CB_TYPE_Q4_0, 1, &k);
    int64_t nx = 32 * 64;
    float *x = rand_vec(nx, 3.0f);
    for (int64_t j = 0; j < 32; j++) {
        x[32 + j] = j == 31 ? 127.0f : (float)(j - 16) + 0.5f; /* d = 1: every other value a tie */
        x[64 + j] = 0;
        x[96 + j] = j % 3 ? 0 : 1e30f;
        x[128 + j] = x[j] * 1e-30f;
    }
    x[160 + 7] = NAN;
    qmm_q8 *qa = malloc(sizeof *qa * (size_t)(nx / 32)),
           *qc = malloc(sizeof *qc * (size_t)(nx / 32));
    k.quant(x, nx, qa);
    qmm_quant8_c(x, nx, qc);
    tcase("act8 quantizer %s = portable, bit for bit (ties, zeros, 1e30, 1e-30, NaN)", k.isa);
    CHECK(memcmp(qa, qc, sizeof *qa * (size_t)(nx / 32)) == 0);
    /* the K form: the same values as 256-groups (NaN too: ignored by the
     * maximum, quantized to 0), and its sums per 16 and 32 */
    qg_kernels g;
    qg_select(1, &g);
    x[200] = NAN;
    qg_q8k *ka = malloc(sizeof *ka * (size_t)(nx / 256)),
           *kc = malloc(sizeof *kc * (size_t)(nx / 256));
    g.quant_k(x, nx, ka);
    qg_quant8k_c(x, nx, kc);
    int sums = 1;
    for (int64_t b = 0; b < nx / 256; b++)
        for (int s = 0; s < 16; s++) {
            int t = 0;
            for (int j = 0; j < 16; j++)
                t += kc[b].q[16 * s + j];
            sums &= kc[b].bs16[s] == t && (s % 2 || kc[b].bs32[s / 2] == t + kc[b].bs16[s + 1]);
        }
    tcase("act8 K quantizer %s = portable, bit for bit; its sums per 16 and 32 are the sums",
          g.isa);
    CHECK(memcmp(ka, kc, sizeof *ka * (size_t)(nx / 256)) == 0 && sums && kc[0].q[200] == 0);
    free(ka), free(kc);
    free(x), free(qa), free(qc), free(o_c);
    a8->ops->free(a8);
    a8c->ops->free(a8c);
}

/* The row-stability contract (backend.h), which cb_fwd_decode's batches
 * of independent sequences rest on: in every product whose row count is a
 * multiple of the backend's rows_step up to its rows_max (here at most 24:
 * the 8-bit path's panels and one-row kernel both), through matmul and
 * through matmul_multi, each row gets the bits it gets in a product of
 * rows_step rows with other company (row 0 of the smallest stable
 * product), for every weight type and an input width that is not a
 * multiple of 32 for the plain types.  The rows sit at every index, and
 * the other rows' values (including huge ones) must not matter. */
static void rows_stable_case(cb_backend *be, const char *label, cb_type t, int64_t n_in)
{
    int64_t n_out = 36, nmax = 24;
    seed(11);
    float *wf = rand_vec(n_in * n_out, 1.0f), *x = rand_vec((nmax + 2) * n_in, 1.0f);
    float *alone = malloc(sizeof(float) * (size_t)(nmax * n_out)),
          *y = malloc(sizeof(float) * (size_t)(nmax * n_out));
    float *y2 = malloc(sizeof(float) * (size_t)(nmax * n_out)),
          *xs = malloc(sizeof(float) * (size_t)(nmax * n_in));
    size_t rb = cb_type_row_bytes(t, n_in);
    uint8_t *wq = malloc(rb * (size_t)n_out);
    for (int64_t o = 0; o < n_out; o++)
        cb_quant_row(t, wf + o * n_in, wq + (size_t)o * rb, n_in);
    for (int64_t j = 0; j < n_in;
         j++) /* the company of the smallest products: other values, one huge */
        x[(nmax + 1) * n_in + j] = j % 7 ? 3e4f : -0.5f;
    cb_bweight *w = be->ops->weight_new(be, t, n_in, n_out, wq, NULL);
    /* the sizes the backend declares once it has this weight */
    const int64_t step = be->rows_step;
    nmax = be->rows_max < nmax ? be->rows_max : nmax;
    const cb_bweight *ws[2] = {w, w};
    float *dx = be->ops->alloc(be, sizeof(float) * (size_t)(nmax * n_in));
    float *dy = be->ops->alloc(be, sizeof(float) * (size_t)(nmax * n_out));
    float *dy2 = be->ops->alloc(be, sizeof(float) * (size_t)(nmax * n_out));
    float *outs[2] = {dy, dy2};
    /* each row alone: at index 0 of a rows_step-row product */
    for (int64_t r = 0; r < nmax; r++) {
        memcpy(xs, x + r * n_in, sizeof(float) * (size_t)n_in);
        for (int64_t k = 1; k < step; k++)
            memcpy(xs + k * n_in, x + (nmax + 1) * n_in, sizeof(float) * (size_t)n_in);
        be->ops->upload(be, dx, xs, sizeof(float) * (size_t)(step * n_in));
        be->ops->matmul(be, w, dx, dy, step);
        bget(be, alone + r * n_out, dy, sizeof(float) * (size_t)n_out);
    }
    int bad = 0, bad_multi = 0, checked = 0;
    for (int64_t n = step; n <= nmax; n += step)
        for (int64_t shift = 0; shift<n; shift += n> 4 ? 3 : 1) {
            /* rows r at index (r + shift) % n */
            for (int64_t r = 0; r < n; r++)
                memcpy(xs + (r + shift) % n * n_in, x + r * n_in, sizeof(float) * (size_t)n_in);
            be->ops->upload(be, dx, xs, sizeof(float) * (size_t)(n * n_in));
            be->ops->matmul(be, w, dx, dy, n);
            bget(be, y, dy, sizeof(float) * (size_t)(n * n_out));
            if (be->ops->matmul_multi) {
                be->ops->matmul_multi(be, ws, 2, dx, outs, n);
                bget(be, y2, dy2, sizeof(float) * (size_t)(n * n_out));
            } else {
                memcpy(y2, y, sizeof(float) * (size_t)(n * n_out));
            }
            for (int64_t r = 0; r < n; r++, checked++) {
                bad += memcmp(y + (r + shift) % n * n_out, alone + r * n_out,
                              sizeof(float) * (size_t)n_out) != 0;
                bad_multi += memcmp(y2 + (r + shift) % n * n_out, alone + r * n_out,
                                    sizeof(float) * (size_t)n_out) != 0;
            }
        }
    tcase("%s rows stable: %s %lld wide, %lld-row steps to %lld rows, every index (%d rows)", label,
          cb_type_name(t), (long long)n_in, (long long)step, (long long)nmax, checked);
    CHECKF(bad == 0 && bad_multi == 0,
           "rows whose bits differ from alone: matmul %d, matmul_multi %d", bad, bad_multi);
    bfree(be, dx), bfree(be, dy), bfree(be, dy2);
    be->ops->weight_free(be, w);
    free(wf), free(x), free(alone), free(y), free(y2), free(xs), free(wq);
}

/* The fused operations (CUDA under CB_CUDA_FUSE=1): rope_qk gives, bit for
 * bit, what rope on Q and then on K gives, kv_write_kv what kv_write of K
 * and of V does, and add_rmsnorm what add and then rmsnorm give, on the
 * backend's own separate operations (which the cases above check against
 * the CPU): RoPE normal and neox, whole and partial, with and without
 * frequency factors; caches of f32 and f16; rows of 100, 576 and 1536
 * values (a partial pass of the block's threads, SmolLM2's, Qwen2.5-1.5B's),
 * the output over the added rows as forward.c has it. */
static void fused_case(cb_backend *be, const char *label)
{
    enum { N = 5, NH = 12, NKV = 2, HD = 64, W = NKV * HD, NC = 40 };
    const size_t qb = sizeof(float) * N * NH * HD, kb = sizeof(float) * N * NKV * HD;
    int32_t pos[N] = {0, 7, 8, 300, 4095};
    seed(2024);
    float *q = rand_vec(N * NH * HD, 1.0f), *k = rand_vec(N * NKV * HD, 1.0f);
    float *ffh = rand_vec(HD / 2, 0.5f), *q1 = malloc(qb), *q2 = malloc(qb), *k1 = malloc(kb),
          *k2 = malloc(kb);
    for (int i = 0; i < HD / 2; i++)
        ffh[i] = 1.0f + fabsf(ffh[i]);
    float *ff = bput(be, ffh, sizeof(float) * (HD / 2));
    for (int neox = 0; neox < 2; neox++)
        for (int rot = 32; rot <= HD; rot += 32)
            for (int withff = 0; withff < 2; withff++) {
                float *dq1 = bput(be, q, qb), *dk1 = bput(be, k, kb), *dq2 = bput(be, q, qb),
                      *dk2 = bput(be, k, kb);
                const float *f = withff ? ff : NULL;
                be->ops->rope(be, dq1, pos, N, NH, HD, rot, 1e6f, f, neox);
                be->ops->rope(be, dk1, pos, N, NKV, HD, rot, 1e6f, f, neox);
                be->ops->rope_qk(be, dq2, dk2, pos, N, NH, NKV, HD, rot, 1e6f, f, neox);
                bget(be, q1, dq1, qb), bget(be, q2, dq2, qb), bget(be, k1, dk1, kb),
                    bget(be, k2, dk2, kb);
                tcase("%s rope_qk = rope of Q, of K, bit for bit (%s, rot %d%s)", label,
                      neox ? "neox" : "normal", rot, withff ? ", freq factors" : "");
                CHECK(memcmp(q1, q2, qb) == 0 && memcmp(k1, k2, kb) == 0 && memcmp(q1, q, qb) != 0);
                bfree(be, dq1), bfree(be, dk1), bfree(be, dq2), bfree(be, dk2);
            }
    int32_t at[N] = {3, 39, 0, 17, 18};
    for (int f16 = 0; f16 < 2; f16++) {
        cb_type ty = f16 ? CB_TYPE_F16 : CB_TYPE_F32;
        size_t cb = (f16 ? 2 : 4) * (size_t)(NC * W);
        uint8_t *h1 = malloc(4 * cb), *h2 = h1 + cb, *h3 = h2 + cb, *h4 = h3 + cb;
        void *c[4];
        for (int i = 0; i < 4; i++)
            c[i] = be->ops->alloc(be, cb); /* zeroed */
        float *ks = bput(be, k, kb), *vs = bput(be, q, kb);
        be->ops->kv_write(be, c[0], ty, W, ks, at, N);
        be->ops->kv_write(be, c[1], ty, W, vs, at, N);
        be->ops->kv_write_kv(be, c[2], c[3], ty, W, ks, vs, at, N);
        bget(be, h1, c[0], cb), bget(be, h2, c[1], cb), bget(be, h3, c[2], cb),
            bget(be, h4, c[3], cb);
        tcase("%s kv_write_kv = kv_write of K, of V, bit for bit (%s cache)", label,
              cb_type_name(ty));
        CHECK(memcmp(h1, h3, cb) == 0 && memcmp(h2, h4, cb) == 0 && memcmp(h1, h2, cb) != 0);
        for (int i = 0; i < 4; i++)
            bfree(be, c[i]);
        bfree(be, ks), bfree(be, vs);
        free(h1);
    }
    for (int di = 0; di < 3; di++) {
        static const int ds[3] = {100, 576, 1536};
        const int64_t d = ds[di];
        const size_t xb = sizeof(float) * (size_t)(N * d);
        float *x = rand_vec(N * d, 3.0f), *y = rand_vec(N * d, 1.0f), *g = rand_vec(d, 1.0f);
        float *h = malloc(4 * xb), *hx1 = h, *hx2 = h + N * d, *ho1 = h + 2 * N * d,
              *ho2 = h + 3 * N * d;
        float *dg = bput(be, g, sizeof(float) * (size_t)d), *dx1 = bput(be, x, xb),
              *dy1 = bput(be, y, xb), *dx2 = bput(be, x, xb), *dy2 = bput(be, y, xb);
        be->ops->add(be, dx1, dy1, N * d);
        be->ops->rmsnorm(be, dx1, dg, dy1, N, d, 1e-6f);
        be->ops->add_rmsnorm(be, dx2, dy2, dg, dy2, N, d, 1e-6f);
        bget(be, hx1, dx1, xb), bget(be, hx2, dx2, xb), bget(be, ho1, dy1, xb),
            bget(be, ho2, dy2, xb);
        tcase("%s add_rmsnorm = add, then rmsnorm, bit for bit (rows of %d)", label, (int)d);
        CHECK(memcmp(hx1, hx2, xb) == 0 && memcmp(ho1, ho2, xb) == 0 && memcmp(hx1, x, xb) != 0 &&
              memcmp(ho1, y, xb) != 0);
        bfree(be, dg), bfree(be, dx1), bfree(be, dy1), bfree(be, dx2), bfree(be, dy2);
        free(x), free(y), free(g), free(h);
    }
    bfree(be, ff);
    free(q), free(k), free(ffh), free(q1), free(q2), free(k1), free(k2);
}

static void fused_cases(void)
{
    if (cuda && cuda->ops->rope_qk && cuda->ops->kv_write_kv && cuda->ops->add_rmsnorm) {
        fused_case(cuda, "cuda");
        return;
    }
    tskip("cuda rope_qk, kv_write_kv and add_rmsnorm = the separate operations, bit for bit",
          cuda ? "CB_CUDA_FUSE=0: no fused operations" : cuda_why);
}

static void rows_stable_cases(void)
{
    static const cb_type types[] = {CB_TYPE_F32,  CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0,
                                    CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1, CB_TYPE_Q8_0,
                                    CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    struct {
        cb_backend *be;
        const char *label;
    } bes[] = {{cpu, "cpu  "}, {cpu_c, "cpu-c"}};
    for (size_t b = 0; b < sizeof bes / sizeof bes[0]; b++)
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            int plain = cb_type_block_elems(types[i]) == 1;
            rows_stable_case(bes[b].be, bes[b].label, types[i], 512);
            if (plain && b == 0)
                rows_stable_case(bes[b].be, bes[b].label, types[i], 100);
        }
    /* the 8-bit path, a fresh backend a type: a block type alone gives
     * 1-row steps to any count; a plain type's weight brings back the
     * exact kernels' 2 and 12 */
    for (int simd = 1; simd >= 0; simd--)
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            cb_backend *a8 = cb_backend_cpu_new_ex(2, simd);
            a8->ops->set_act8(a8, 1);
            rows_stable_case(a8, simd ? "act8 " : "act8-c", types[i], 512);
            int plain = cb_type_block_elems(types[i]) == 1;
            tcase("act8 with a %s weight declares %s", cb_type_name(types[i]),
                  plain ? "the exact kernels' row steps" : "any row count stable");
            CHECK(plain ? a8->rows_step == CB_ROWS_STEP && a8->rows_max == CB_ROWS_MAX
                        : a8->rows_step == 1 && a8->rows_max >= 1 << 20);
            a8->ops->free(a8);
        }
    /* the few-row kernel (CB_CUDA_GEMV=1): 16-byte steps on the 16-bit
     * weights (512 wide) and single elements (100) */
    if (cuda && !cuda->ops->rows_unstable && cuda->rows_step > 0) {
        rows_stable_case(cuda, "cuda ", CB_TYPE_Q8_0, 512);
        rows_stable_case(cuda, "cuda ", CB_TYPE_Q4_K, 512);
        rows_stable_case(cuda, "cuda ", CB_TYPE_BF16, 512);
        rows_stable_case(cuda, "cuda ", CB_TYPE_F32, 100);
    }
    /* and k_qgemv on the blocks, two weights a launch through matmul_multi */
    if (cuda_qw && !cuda_qw->ops->rows_unstable && cuda_qw->rows_step > 0) {
        rows_stable_case(cuda_qw, "cuda-qw", CB_TYPE_Q8_0, 512);
        rows_stable_case(cuda_qw, "cuda-qw", CB_TYPE_Q4_K, 512);
        rows_stable_case(cuda_qw, "cuda-qw", CB_TYPE_Q6_K, 512);
        rows_stable_case(cuda_qw, "cuda-qw", CB_TYPE_Q4_1, 512);
    }
}

static void r18_cases(const char *self)
{
    char name[160];
    r18_scale_exp();
    r18_mm_choice();

    static const cb_type big_types[] = {CB_TYPE_F32, CB_TYPE_F16, CB_TYPE_Q8_0, CB_TYPE_Q4_K};
    for (size_t i = 0; i < sizeof big_types / sizeof big_types[0]; i++) {
        mm_type = big_types[i];
        snprintf(name, sizeof name, "matmul %s, inputs to 2.5e5", cb_type_name(mm_type));
        qw_bound = qw_case_bound(mm_type, 6, 1e-5); /* (c_matmul_big's 6 rows) */
        run_case(name, c_matmul_big, 1e-12, 1e-5);
        qw_bound = 0;
    }

    for (int neox = 0; neox < 2; neox++)
        for (int part = 0; part < 2; part++)
            for (int shift = 0; shift < 2; shift++) {
                r18_rope_neox = neox, r18_rope_nrot = part ? 64 : 128, r18_rope_shift = shift;
                snprintf(name, sizeof name, "rope base 1e6 to 32K %s rot %d%s",
                         neox ? "neox" : "normal", r18_rope_nrot, shift ? " - shift" : "");
                /* vs the double reference: f32 angles at 32K (llama.cpp's too) */
                run_case(name, c_rope_long, 1e-5, 1e-10);
            }

    static const struct {
        int hd, n_head, n_head_kv, window, f16;
    } att[] = {
        {256, 8, 8, 0, 1}, {256, 8, 1, 0, 1},   {256, 8, 1, 512, 1}, {256, 8, 8, 1000, 0},
        {80, 8, 8, 0, 0},  {80, 8, 1, 333, 1},  {96, 8, 1, 0, 1},    {96, 8, 8, 2048, 0},
        {112, 8, 8, 0, 1}, {112, 8, 1, 700, 0},
    };
    for (size_t i = 0; i < sizeof att / sizeof att[0]; i++) {
        att_big.hd = att[i].hd, att_big.n_head = att[i].n_head,
        att_big.n_head_kv = att[i].n_head_kv;
        att_big.window = att[i].window, att_big.n_ctx = 2304, att_big.nq = 1100;
        kv_type = att[i].f16 ? CB_TYPE_F16 : CB_TYPE_F32;
        snprintf(name, sizeof name, "attention %s hd %d %s 2304 keys 1100 rows%s",
                 att[i].f16 ? "f16" : "f32", att[i].hd,
                 att[i].n_head == att[i].n_head_kv ? "MHA" : "GQA 8:1",
                 att[i].window ? " window" : "");
        if (att[i].window)
            snprintf(name + strlen(name), sizeof name - strlen(name), " %d", att[i].window);
        fa_bound = FA_BOUND;
        run_case_sampled(name, c_attention_big, 1e-10, 1e-9);
        fa_bound = 0;
    }

    topk_n = 1000;
    run_case("topk n of n, NaN/inf/-0/ties (1000)", c_topk_nan, -1, -1);
    topk_n = 7;
    run_case("topk n of n, NaN/inf/-0/ties (7)", c_topk_nan, -1, -1);
    run_case("20000 staged indices, 200 indexed ops queued", c_staging, -1, -1);
    run_case("index arrays repeated, rewritten, evicted", c_memo, -1, -1);
    run_case("upload/download 40 MB", c_roundtrip40, -1, -1);
    run_case("host_alloc + upload_async 40 MB (CB_CUDA_PIN)", c_async40, -1, -1);
    run_case("alloc of 4 EiB fails, then works on", c_alloc_fail, -1, -1);
    run_case("weight made on one thread, used on another", c_weight_thread, 1e-12, 1e-5);
    run_case("loader pattern: f16 rows, K expanded, scaled, shifted; event; attention", c_loader,
             1e-5, 1e-8);
    r18_error_checks(self);
}

/* threads of this process, from /proc (-1 where there is none) */
static int n_threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* OpenBLAS is loaded by the library when first needed, with one thread for
 * its start: linked, its constructor started a thread a core before main
 * (and on a 16-core VM under ulimit -v 1G failed to, and raised SIGINT).
 * First in main: nothing here has loaded it or started a thread yet. */
static void blas_on_demand(void)
{
    int before = n_threads_now(), set_before = getenv("OPENBLAS_NUM_THREADS") != NULL;
    const char *why = cb_blas_load();
    int after = n_threads_now();
    tcase("OpenBLAS loaded on demand: %s; threads %d -> %d", why ? why : "loaded", before, after);
    CHECK(why == NULL && cb_sgemm != NULL);
    CHECKF(set_before || after == before, "OpenBLAS started %d threads as it loaded",
           after - before);
    CHECKF(set_before || getenv("OPENBLAS_NUM_THREADS") == NULL,
           "OPENBLAS_NUM_THREADS left set to %s", getenv("OPENBLAS_NUM_THREADS"));
    CHECK(cb_blas_load() == NULL); /* once */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 1, 0}, c[4];
    cb_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 2, 2, 3, 1.0f, a, 3, b, 3, 0.0f, c, 2);
    CHECK(c[0] == -2 && c[1] == 4 && c[2] == -2 && c[3] == 13);
}

/* y = the 8-bit path's SwiGLU of g and u (n elements) on be */
static void swiglu_on(cb_backend *be, const float *g, const float *u, float *y, int64_t n)
{
    size_t bytes = sizeof(float) * (size_t)n;
    float *dg = bput(be, g, bytes), *du = bput(be, u, bytes);
    be->ops->swiglu(be, dg, du, dg, n);
    bget(be, y, dg, bytes);
    bfree(be, dg), bfree(be, du);
}

/* The 8-bit path's SwiGLU kernel the CPU picks (qmm_avx2_swiglu on AVX2)
 * gives the portable loop's bits (cpu.c's swiglu_fast), on random values
 * and on the edges of its exponential: zeros, the clamp at -87, values
 * past it, infinities, subnormals, a NaN (NaN on both), each in every
 * lane of the 8-lane vectors (every third value is one of 25 edges) */
static void test_swiglu_kernel(cb_backend *simd8)
{
    static const char *name = "act8 swiglu, the CPU's kernel = the portable loop, bit for bit";
    if (!case_wanted(name)) {
        tskip(name, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
        return;
    }
    if (!qmm_swiglu(1)) {
        tskip(name, "this CPU has no AVX2: the portable loop is its kernel");
        return;
    }
    cb_backend *port = cb_backend_cpu_new_ex(1, 0);
    enum { N = 4099 };
    float *g = rand_vec(N, 12.0f), *u = rand_vec(N, 2.0f), ya[N], yb[N];
    static const float edge[] = {0.0f,    -0.0f,    1e-40f,   -1e-40f,   60.2f,  -60.2f, 86.9f,
                                 -86.9f,  87.0f,    -87.0f,   87.3f,     -87.3f, 100.0f, -100.0f,
                                 1e30f,   -1e30f,   INFINITY, -INFINITY, NAN,    0.5f,   -0.5f,
                                 3.4e38f, -3.4e38f, 1.0f,     -2.0f};
    /* 25 edges, every third value: edge e at k = 3 (e + 25 t), lane 3 (e + t) mod 8 */
    for (int k = 0; k < N; k += 3)
        g[k] = edge[(k / 3) % (int)(sizeof edge / sizeof *edge)];
    tcase("%s (%d values)", name, N);
    CHECK(port != NULL);
    if (port) {
        swiglu_on(simd8, g, u, ya, N);
        swiglu_on(port, g, u, yb, N);
        int64_t bad = 0;
        for (int64_t i = 0; i < N; i++)
            bad += isnan(ya[i]) || isnan(yb[i]) ? isnan(ya[i]) != isnan(yb[i])
                                                : memcmp(&ya[i], &yb[i], sizeof(float)) != 0;
        CHECKF(bad == 0, "%lld of %d differ", (long long)bad, N);
        port->ops->free(port);
    }
    free(g), free(u);
}

/* The CPU's elementwise operations split over its threads (RMSNorm over
 * 150 rows, add and the gated activations over 100,003 elements; scale,
 * which the KV loader calls, stays on the caller's) give one thread's
 * bits, and the reference's values; then the 8-bit path's SwiGLU (its own
 * exponential: cpu.c's swiglu_fast), on 1,000 and 100,003 elements */
static void test_elementwise_threads(cb_backend *cpu_be, float *o2, float *o1)
{
    static const char *const names[5] = {"add", "swiglu", "geglu", "scale", "rmsnorm"};
    cb_backend *one = cb_backend_cpu_new(1), *one8 = cb_backend_cpu_new(1),
               *two8 = cb_backend_cpu_new(2);
    tcase("cpu  backends of one and two threads open");
    CHECK(one && one8 && two8);
    if (!one || !one8 || !two8)
        goto done;
    one->ops->set_act8(one, 0);
    ew_n = 100003, rms_n = 150;
    for (int op = 0; op < 5; op++) {
        char name[64], line[128];
        ew_op = op;
        snprintf(name, sizeof name, "%s, %s elements", names[op], op < 4 ? "100003" : "45000");
        snprintf(line, sizeof line, "cpu  %s on 2 threads = on 1, bit for bit", name);
        if (!case_wanted(name)) {
            tskip(line, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
        } else {
            int64_t n = op < 4 ? c_elementwise(cpu_be, o2) : c_rmsnorm(cpu_be, o2);
            if (op < 4)
                c_elementwise(one, o1);
            else
                c_rmsnorm(one, o1);
            tcase("%s", line);
            CHECK(memcmp(o1, o2, sizeof(float) * (size_t)n) == 0);
        }
        run_case(name, op < 4 ? c_elementwise : c_rmsnorm, 1e-12, 1e-10);
    }
    ew_op = 1;
    for (ew_n = 1000; ew_n < 200000; ew_n = ew_n * 100 + 3) {
        char name[64];
        snprintf(name, sizeof name, "act8 swiglu, %lld elements", (long long)ew_n);
        if (!case_wanted(name)) {
            tskip(name, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
            tskip(name, "left out by $CB_OPS_ONLY or $CB_OPS_SKIP");
            continue;
        }
        int64_t n = c_elementwise(NULL, o_ref);
        c_elementwise(two8, o2);
        c_elementwise(one8, o1);
        double e = nmse(o_ref, o2, n);
        tcase("act8 swiglu, %lld elements, vs reference (nmse %.2e, bound 1e-12)", (long long)n, e);
        CHECKF(e <= 1e-12 && e > 0, "nmse %.3e", e);
        tcase("act8 swiglu, %lld elements, on 2 threads = on 1, bit for bit", (long long)n);
        CHECK(memcmp(o1, o2, sizeof(float) * (size_t)n) == 0);
    }
    test_swiglu_kernel(one8);
done:
    ew_n = 1000, rms_n = 5, ew_op = 0;
    if (one)
        one->ops->free(one);
    if (one8)
        one8->ops->free(one8);
    if (two8)
        two8->ops->free(two8);
}

int main(int argc, char **argv)
{
    cb_error err;
    char name[64];
    if (argc > 2 && strcmp(argv[1], "--child") == 0)
        return r18_child(argv[2]);
    TEST_BEGIN();
    blas_on_demand();
    o_ref = malloc(sizeof(float) * MAXOUT);
    o_cpu = malloc(sizeof(float) * MAXOUT);
    o_cuda = malloc(sizeof(float) * MAXOUT);
    cpu = cb_backend_cpu_new(2);
    cpu_c = cb_backend_cpu_new_ex(2, 0);
    /* the exact path: every bound below but act8_cases' is stated for it */
    cpu->ops->set_act8(cpu, 0);
    cpu_c->ops->set_act8(cpu_c, 0);
    printf("# CPU backend: %s; portable: %s\n", cpu->desc, cpu_c->desc);
    /* the device's attention mass is these cases' to check, whatever the
     * environment says (CB_CUDA_MASS=0 turns it off in lib/cuda/cuda.cu) */
    unsetenv("CB_CUDA_MASS");
    /* and so is the few-row product kernel, behind CB_CUDA_GEMV=1 in the
     * programs until a GPU run has checked it: on here unless the
     * environment says 0 (which tests cuBLAS's path for every row count) */
    if (!getenv("CB_CUDA_GEMV"))
        setenv("CB_CUDA_GEMV", "1", 1);
    /* and the memo of staged index arrays, behind CB_CUDA_MEMO=1 likewise,
     * and the fused operations, behind CB_CUDA_FUSE=1 */
    if (!getenv("CB_CUDA_MEMO"))
        setenv("CB_CUDA_MEMO", "1", 1);
    if (!getenv("CB_CUDA_FUSE"))
        setenv("CB_CUDA_FUSE", "1", 1);
    /* and the key bias (blending's stale scale), behind CB_CUDA_KBIAS=1 */
    if (!getenv("CB_CUDA_KBIAS"))
        setenv("CB_CUDA_KBIAS", "1", 1);
    /* and the loader's page-locked reads, behind CB_CUDA_PIN=1 */
    if (!getenv("CB_CUDA_PIN"))
        setenv("CB_CUDA_PIN", "1", 1);
    /* and graphs, behind CB_CUDA_GRAPH=1 (only test_graph_ops records) */
    if (!getenv("CB_CUDA_GRAPH"))
        setenv("CB_CUDA_GRAPH", "1", 1);
    /* the scalar attention kernel is the reference the first backend
     * tests; the tensor-core one (CB_CUDA_FA=1) gets a backend of its own */
    char *fa_env = getenv("CB_CUDA_FA") ? strdup(getenv("CB_CUDA_FA")) : NULL;
    setenv("CB_CUDA_FA", "0", 1);
    if (cb_backend_open(&cuda, "cuda", 0, &err) != CB_OK) {
        cuda = NULL;
        snprintf(cuda_why, sizeof cuda_why, "no CUDA device (see the first line)");
        printf("# CUDA cases skipped: %s\n", err.msg);
    } else {
        printf("# CUDA backend: %s\n", cuda->desc);
        setenv("CB_CUDA_FA", "1", 1);
        if (cb_backend_open(&cuda_fa, "cuda", 0, &err) != CB_OK)
            cuda_fa = NULL;
        /* and the weights kept in their blocks (CB_CUDA_QW=1) one of theirs */
        char *qw_env = getenv("CB_CUDA_QW") ? strdup(getenv("CB_CUDA_QW")) : NULL;
        setenv("CB_CUDA_FA", "0", 1);
        setenv("CB_CUDA_QW", "1", 1);
        if (cb_backend_open(&cuda_qw, "cuda", 0, &err) != CB_OK)
            cuda_qw = NULL;
        else
            printf("# CUDA backend with block weights (CB_CUDA_QW=1): %s\n", cuda_qw->desc);
        if (qw_env)
            setenv("CB_CUDA_QW", qw_env, 1);
        else
            unsetenv("CB_CUDA_QW");
        free(qw_env);
    }
    if (fa_env)
        setenv("CB_CUDA_FA", fa_env, 1);
    else
        unsetenv("CB_CUDA_FA");
    free(fa_env);

    /* matmul over every weight type the loader reads; the device keeps
     * weights in f16 (bf16 for bf16) and rounds the input rows likewise */
    static const cb_type types[] = {CB_TYPE_F32,  CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0,
                                    CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1, CB_TYPE_Q8_0,
                                    CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        mm_type = types[i];
        mm_n = 7, mm_in = 512, mm_out = 48, mm_bias = 0;
        snprintf(name, sizeof name, "matmul %s 7x512x48", cb_type_name(mm_type));
        qw_bound = qw_case_bound(mm_type, mm_n, 1e-5);
        run_case(name, c_matmul, 1e-12, mm_type == CB_TYPE_BF16 ? 1e-4 : 1e-5);
        snprintf(name, sizeof name, "get_rows %s", cb_type_name(mm_type));
        /* on the blocks: dequant.h's values, the CPU's bits (no FMA) */
        qw_bound = cb_type_block_elems(mm_type) == 1 ? 0 : QW_EXACT;
        run_case(name, c_get_rows, mm_type == CB_TYPE_F32 ? -1 : 0,
                 mm_type == CB_TYPE_BF16  ? -1
                 : mm_type == CB_TYPE_F32 ? 1e-6
                                          : 1e-6);
        qw_bound = 0;
    }
    /* The CPU kernels on every type and batch shape: one row (decode), 3
     * (a partial group of the 4-row kernel), 9 (the dot kernels in groups of
     * 4, 4 and 1; they take up to 12 rows), 16 and 100 (dequantized panels
     * into sgemm, several panels, a ragged last one), an input longer than
     * the portable kernel's chunk; plain types also with an input not a
     * multiple of 32.  Bound: nmse 1e-12 against the double-precision loop
     * over the decoded weights (measured: ~5e-14, f32 sums of 256..1280
     * products). */
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        static const int64_t shapes[][3] = {{1, 512, 48},  {3, 512, 48},    {9, 512, 40},
                                            {16, 256, 40}, {100, 256, 300}, {2, 1280, 20}};
        mm_type = types[i], mm_bias = 0;
        int plain = cb_type_block_elems(mm_type) == 1;
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0] + (size_t)plain; k++) {
            if (k < sizeof shapes / sizeof shapes[0])
                mm_n = shapes[k][0], mm_in = shapes[k][1], mm_out = shapes[k][2];
            else
                mm_n = 5, mm_in = 100, mm_out = 21;
            snprintf(name, sizeof name, "matmul %s %lldx%lldx%lld", cb_type_name(mm_type),
                     (long long)mm_n, (long long)mm_in, (long long)mm_out);
            qw_bound = qw_case_bound(mm_type, mm_n, 1e-5);
            run_case(name, c_matmul, 1e-12, mm_type == CB_TYPE_BF16 ? 1e-4 : 1e-5);
            qw_bound = 0;
            run_case_c(name, c_matmul, 1e-12);
        }
    }
    mm_type = CB_TYPE_F16, mm_n = 1, mm_in = 256, mm_out = 100, mm_bias = 0;
    run_case("matmul f16 1x256x100 (decode)", c_matmul, 1e-12, 1e-5);
    mm_type = CB_TYPE_F32, mm_n = 5, mm_in = 96, mm_out = 33, mm_bias = 1;
    run_case("matmul f32 5x96x33 + bias", c_matmul, 1e-12, 1e-5);
    /* the CUDA few-row kernel at its most rows, nine 256-element steps a
     * lane, a last block of warps past the weight's rows */
    mm_type = CB_TYPE_Q4_K, mm_n = 8, mm_in = 2304, mm_out = 300, mm_bias = 1;
    qw_bound = qw_case_bound(mm_type, mm_n, 1e-5);
    run_case("matmul q4_K 8x2304x300 + bias", c_matmul, 1e-12, 1e-5);
    /* and on the blocks: q6_K (the output heads' type) past a tile of rows
     * (dq_rows: 4M values in whole 32s of rows, here 1,792 rows of 2,304), with a bias; q5_0
     * with 8 rows over 9 steps a lane */
    mm_type = CB_TYPE_Q6_K, mm_n = 24, mm_in = 2304, mm_out = 2000, mm_bias = 1;
    qw_bound = qw_case_bound(mm_type, mm_n, 1e-5);
    run_case("matmul q6_K 24x2304x2000 + bias", c_matmul, 1e-12, 1e-5);
    mm_type = CB_TYPE_Q5_0, mm_n = 8, mm_in = 2304, mm_out = 70, mm_bias = 0;
    qw_bound = qw_case_bound(mm_type, mm_n, 1e-5);
    run_case("matmul q5_0 8x2304x70", c_matmul, 1e-12, 1e-5);
    /* a width of 28 blocks of 32 (Qwen2.5-0.5B's 896): the few-row
     * kernel's lanes take unequal numbers of steps */
    for (int t = 0; t < 2; t++) {
        mm_type = t ? CB_TYPE_Q5_0 : CB_TYPE_Q8_0, mm_n = 3, mm_in = 896, mm_out = 37, mm_bias = t;
        snprintf(name, sizeof name, "matmul %s 3x896x37%s", cb_type_name(mm_type),
                 t ? " + bias" : "");
        qw_bound = qw_case_bound(mm_type, mm_n, 1e-5);
        run_case(name, c_matmul, 1e-12, 1e-5);
    }
    qw_bound = 0;
    /* products in a row whose inputs differ by ten orders of magnitude:
     * each takes its own scale */
    run_case("matmul f16 12x256x40 x4, 1e4..1e-7", c_matmul_seq, 1e-12, 1e-5);

    c_inplace = 0;
    run_case("rmsnorm", c_rmsnorm, 1e-12, 1e-10);
    c_inplace = 1;
    run_case("rmsnorm in place", c_rmsnorm, 1e-12, 1e-10);

    for (int neox = 0; neox < 2; neox++)
        for (int part = 0; part < 2; part++)
            for (int shift = 0; shift < 2; shift++)
                for (int ff = 0; ff < 2; ff++) {
                    rope_neox = neox, rope_nrot = part ? 32 : 64, rope_shift = shift, rope_ff = ff;
                    snprintf(name, sizeof name, "rope %s rot %d%s%s", neox ? "neox" : "normal",
                             rope_nrot, shift ? " + shift" : "", ff ? " freq factors" : "");
                    run_case(name, c_rope, 1e-8, 1e-8);
                }
    rope_ff = 0;
    ew_op = 0;
    run_case("add", c_elementwise, 1e-14, -1);
    ew_op = 1;
    run_case("swiglu", c_elementwise, 1e-12, 1e-10);
    ew_op = 2;
    run_case("geglu", c_elementwise, 1e-12, 1e-10);
    ew_op = 3;
    run_case("scale", c_elementwise, 1e-14, 1e-12);

    for (int f16 = 0; f16 < 2; f16++) {
        kv_type = f16 ? CB_TYPE_F16 : CB_TYPE_F32;
        snprintf(name, sizeof name, "kv_write/kv_read %s", f16 ? "f16" : "f32");
        run_case(name, c_kv, -1, -1);
        for (int hdi = 0; hdi < 4; hdi++) {
            static const int hds[4] = {64, 40, 128, 72}; /* 40, 72: not whole 16-wide tiles */
            att_hd = hds[hdi];
            att_nq = 40;
            snprintf(name, sizeof name, "attention %s hd %d 40 rows", f16 ? "f16" : "f32", att_hd);
            fa_bound = FA_BOUND;
            run_case(name, c_attention, 1e-10, 1e-9);
            fa_bound = 0;
        }
        /* Qwen2's keys: two channels of every key head far above the rest
         * (the tensor-core kernel rounds Q to f16; an emulation of it in
         * numpy gave nmse 3e-8 to 4e-8 here, as without them: the outlier
         * channels shift every key's score alike) */
        att_hd = 64, att_nq = 40, att_big_k = 1;
        snprintf(name, sizeof name, "attention %s hd 64 40 rows, keys' outlier channels",
                 f16 ? "f16" : "f32");
        fa_bound = FA_BOUND;
        run_case(name, c_attention, 1e-10, 1e-9);
        fa_bound = 0, att_big_k = 0;
        att_hd = 64, att_nq = 1;
        snprintf(name, sizeof name, "attention %s hd 64 1 row", f16 ? "f16" : "f32");
        run_case(name, c_attention, 1e-10, 1e-9);
        /* windows: narrower than a CUDA key tile, several tiles, and wider than the cache */
        for (int wi = 0; wi < 3; wi++) {
            static const int wins[3] = {7, 70, 512};
            att_hd = 64, att_nq = 40, att_window = wins[wi];
            snprintf(name, sizeof name, "attention %s hd 64 40 rows window %d", f16 ? "f16" : "f32",
                     att_window);
            fa_bound = FA_BOUND;
            run_case(name, c_attention, 1e-10, 1e-9);
            fa_bound = 0;
        }
        /* a long cache: the CPU splits the keys of few rows over threads
         * and merges (decode), and tiles them for many rows */
        att_ctx = 1300, att_hd = 64;
        for (int ci = 0; ci < 5; ci++) { /* 16 rows: the tensor-core kernel's fewest, split keys */
            static const int nqs[5] = {1, 3, 1, 40, 16}, wins[5] = {0, 0, 70, 300, 0};
            att_nq = nqs[ci], att_window = wins[ci];
            snprintf(name, sizeof name, "attention %s 1300 keys %d rows window %d",
                     f16 ? "f16" : "f32", att_nq, att_window);
            fa_bound = att_nq >= FA_CASE_ROWS ? FA_BOUND : 0;
            run_case(name, c_attention, 1e-10, 1e-9);
            fa_bound = 0;
            run_case_c(name, c_attention, 1e-10); /* the portable softmax */
        }
        /* blend's rows: scattered but in position order (prefill's are
         * consecutive), some beside tile edges; windows end tiles early */
        att_sorted = 1;
        for (int ci = 0; ci < 4; ci++) {
            static const int nqs[4] = {200, 200, 700, 90}, wins[4] = {0, 300, 70, 0};
            att_nq = nqs[ci], att_window = wins[ci];
            snprintf(name, sizeof name,
                     "attention %s 1300 keys %d rows in position order, window %d",
                     f16 ? "f16" : "f32", att_nq, att_window);
            fa_bound = FA_BOUND;
            run_case(name, c_attention, 1e-10, 1e-9);
            fa_bound = 0;
        }
        att_sorted = 0;
        /* a prefill's rows (positions 0, 1, 2, ...): the tensor-core
         * kernel's causal tiles, whole and partial (330 = 5 tiles of 64
         * rows and 10 more) */
        att_consec = 1, att_nq = 330;
        for (int wi = 0; wi < 2; wi++) {
            att_window = wi ? 300 : 0;
            snprintf(name, sizeof name, "attention %s prefill 330 rows window %d",
                     f16 ? "f16" : "f32", att_window);
            fa_bound = FA_BOUND;
            run_case(name, c_attention, 1e-10, 1e-9);
            fa_bound = 0;
        }
        att_consec = 0;
        /* decode's shapes on the f16 cache: one row's 1-7 heads sharing a KV
         * head, which the CPU multiplies on the cache directly (with F16C;
         * the portable path converts tiles), and two to five rows (tiles) */
        for (int ci = 0; f16 && ci < 10; ci++) {
            static const int heads[10][2] = {{6, 2}, {4, 2},  {4, 4}, {10, 2}, {14, 2},
                                             {8, 2}, {12, 2}, {6, 2}, {4, 4},  {6, 2}};
            static const int nqs[10] = {1, 1, 1, 1, 1, 1, 1, 2, 5, 1};
            static const int hds[10] = {64, 64, 40, 128, 64, 48, 64, 64, 128, 40};
            static const int wins[10] = {0, 0, 0, 70, 0, 300, 0, 0, 70, 70};
            att_heads = heads[ci][0], att_kv_heads = heads[ci][1], att_nq = nqs[ci],
            att_hd = hds[ci];
            att_window = wins[ci];
            snprintf(name, sizeof name,
                     "attention f16 1300 keys, %d x %d heads/KV head, hd %d, window %d", att_nq,
                     att_heads / att_kv_heads, att_hd, att_window);
            run_case(name, c_attention, 1e-10, 1e-9);
            run_case_c(name, c_attention, 1e-10);
        }
        att_heads = 6, att_kv_heads = 2, att_hd = 64;
        att_ctx = 150;
        att_window = 0;
        snprintf(name, sizeof name, "deviation %s", f16 ? "f16" : "f32");
        run_case(name, c_deviation, 1e-12, 1e-10);
        /* attention mass: GQA (3 and 8 heads a KV head), none (4 x 4),
         * windows narrower than the cache and wider, one row; then
         * model-sized heads over more keys (the device's tiles of keys and
         * rows end inside, its shared memory at head dimension 256) */
        for (int ci = 0; ci < 7; ci++) {
            static const int heads[7][2] = {{6, 2}, {4, 4},  {8, 1}, {6, 2},
                                            {6, 2}, {12, 2}, {8, 1}};
            static const int wins[7] = {0, 0, 0, 9, 400, 0, 700},
                             nqs[7] = {20, 20, 20, 20, 1, 37, 9};
            static const int hds[7] = {64, 64, 64, 64, 64, 128, 256},
                             keys[7] = {150, 150, 150, 150, 150, 1100, 1033};
            am_heads = heads[ci][0], am_kv_heads = heads[ci][1], am_window = wins[ci];
            am_nq = nqs[ci], am_hd = hds[ci], am_keys = keys[ci];
            for (am_values = 0; am_values < 2; am_values++) {
                snprintf(name, sizeof name,
                         "attn_mass %s %d rows %d/%d heads hd %d %d keys win %d%s",
                         f16 ? "f16" : "f32", am_nq, am_heads, am_kv_heads, am_hd, am_keys,
                         am_window, am_values ? " by V" : "");
                run_case(name, c_attn_mass, 1e-10, 1e-9);
                run_case_c(name, c_attn_mass, 1e-10); /* the portable softmax */
            }
        }
        am_heads = 6, am_kv_heads = 2, am_window = 0, am_nq = 20, am_hd = 64, am_keys = 150;
        am_values = 0;
    }
    test_attention_nan();
    test_key_bias();
    kv_type = CB_TYPE_F16;
    test_attn_mass_fallback(cpu, o_cpu, o_cuda);
    test_elementwise_threads(cpu, o_cpu, o_cuda);
    run_case("gather + scatter", c_gather_scatter, -1, -1);
    topk_n = 10;
    run_case("topk 4 of 10 (ties)", c_topk, -1, -1);
    topk_n = 3000;
    run_case("topk 1001 of 3000 (ties)", c_topk, -1, -1);
    run_case("upload/download 12 MB", c_roundtrip, -1, -1);
    run_case("two threads at once", c_threads, -1, -1);
    run_case("event hand-over between threads", c_event, -1, -1);
    test_marks(cpu, "cpu ");
    test_marks(cuda, "cuda");
    test_graph_ops(cuda, "cuda");
    act8_cases();
    rows_stable_cases();
    fused_cases();
    r18_cases(argv[0]);

    if (cuda)
        cuda->ops->free(cuda);
    if (cuda_fa)
        cuda_fa->ops->free(cuda_fa);
    if (cuda_qw)
        cuda_qw->ops->free(cuda_qw);
    cpu->ops->free(cpu);
    cpu_c->ops->free(cpu_c);
    free(o_ref), free(o_cpu), free(o_cuda);
    TEST_END();
}
