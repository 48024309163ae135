/* qmm.h - products with weight rows kept in their GGUF type (private to the
 * CPU backend, lib/backend/cpu.c).
 *
 * A weight matrix W [n_out, n_in] stays as the GGUF stores it: n_out rows
 * of row_bytes each (cb_type_row_bytes), blocks of 32 or 256 elements.  Two
 * kernels per type:
 *   dot   y[r*ldy + o] = sum_j W[o, j] * x[r*ldx + j] for rows r < nr (at
 *         most QMM_ROWS; QMM_ONE_PAIRED: one row with the bits of a row
 *         among several) and outputs o in [o0, o1): each weight block is
 *         decoded once into f32 lanes and multiplied into every row
 *         (decode and small batches);
 *   rows  dst [o1-o0, n_in] = W rows o0..o1 in f32 (a panel for sgemm,
 *         prefill).
 * Accumulation is f32 (activations stay f32); the decoded weights equal
 * cb_dequant_row's up to one rounding (a fused multiply-add).
 *
 * These are the exact path's (--exact); the default 8-bit activation
 * products are qgemm.h's, which read the per-32 activation form and the
 * weights' integer form defined here (qmm8.c).
 *
 * Two implementations: AVX2+FMA+F16C (qmm_avx2.c, built with those flags
 * whatever the build's -march) chosen at run time when the CPU has them,
 * and portable C (qmm.c) otherwise. */
#ifndef CB_QMM_H
#define CB_QMM_H

#include "../core/core.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define QMM_ROWS 4
/* dot's nr for one row with the bits it gets among 2..QMM_ROWS rows (a
 * lone row otherwise takes more partial sums): half the work of the pair
 * of copies that gave those bits before */
#define QMM_ONE_PAIRED (-1)

/* Sum of a[j] b[j] over n in eight partial sums (so that gcc vectorizes it
 * without reassociating one sum), combined pairwise: the attention scores'
 * and the portable kernels' dot product. */
__attribute__((optimize("O3"))) static inline float qmm_dot8(const float *restrict a,
                                                             const float *restrict b, int64_t n)
{
    float s[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++)
            s[k] += a[j + k] * b[j + k];
    for (; j < n; j++)
        s[0] += a[j] * b[j];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* e^x for x <= 0 (softmax after subtracting the max), written so that gcc
 * vectorizes the loops calling it: x log2(e) = n + f with |f| <= 1/2, 2^f
 * from Cephes' exp2f polynomial (relative error < 2e-7), 2^n by exponent
 * bits.  libm's expf is a call per element and was a quarter of prefill
 * time at 4K tokens. */
static inline float qmm_exp_neg(float x)
{
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504088896341f, n = __builtin_rintf(t), f = t - n;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    /* NaN (a model with NaN weights) stays NaN; converting it to int is UB */
    int32_t bits = ((n == n ? (int32_t)n : 0) + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}


typedef void (*qmm_dot_fn)(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                           const float *x, int64_t ldx, int nr, int64_t o0, int64_t o1, float *y,
                           int64_t ldy);
typedef void (*qmm_rows_fn)(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0,
                            int64_t o1, float *dst);

/* 32 activations quantized: x[j] ~ d * q[j], s = d * sum q */
typedef struct qmm_q8 {
    float d, s;
    int8_t q[32];
} qmm_q8;

/* xq[n/32] = x[n] quantized (n a multiple of 32) */
typedef void (*qmm_quant_fn)(const float *x, int64_t n, qmm_q8 *xq);

typedef struct qmm_kernels {
    qmm_dot_fn dot;
    qmm_rows_fn rows;
    qmm_quant_fn quant; /* the per-32 activation quantizer (the same for every type) */
    const char *isa;    /* "avx2" or "c" */
} qmm_kernels;

/* The kernels for type t (one of cb_type_is_supported's); simd 0 forces the
 * portable ones (tests compare both), 1 picks the best the CPU runs.
 * Returns 0 for an unsupported type. */
int qmm_select(cb_type t, int simd, qmm_kernels *k);

/* s[j] = e^(s[j] - m) for j < n (every s[j] <= m); returns their sum.
 * The AVX2 version when simd and the CPU has it, else NULL (the caller's
 * own loop). */
typedef float (*qmm_exp_sum_fn)(float *s, int64_t n, float m);
qmm_exp_sum_fn qmm_exp_sum(int simd);
float qmm_avx2_exp_sum(float *s, int64_t n, float m);

/* silu(x) * u as x * sigmoid(x) * u, the sigmoid from e = e^-|x| by
 * qmm_exp_neg: 1 / (1 + e) for x >= 0, e / (1 + e) below (the 8-bit
 * path's SwiGLU, element by element) */
static inline float qmm_swiglu1(float x, float u)
{
    float e = qmm_exp_neg(-fabsf(x));
    return x * ((x >= 0.0f ? 1.0f : e) / (1.0f + e)) * u;
}

/* y[j] = qmm_swiglu1(g[j], u[j]), j < n, bit for bit: the same operations
 * in the same order, without fused multiply-adds, eight lanes at a time.
 * The AVX2 version when simd and the CPU has it, else NULL (the caller's
 * own loop, which gcc vectorizes only with AVX-512's masks).  y may be g
 * or u. */
typedef void (*qmm_swiglu_fn)(const float *g, const float *u, float *y, int64_t n);
qmm_swiglu_fn qmm_swiglu(int simd);
void qmm_avx2_swiglu(const float *g, const float *u, float *y, int64_t n);

/* d[j] = the f16 values s[j] in f32, j < n (exact); the F16C version when
 * simd and the CPU has it, else NULL (the caller's own loop). */
typedef void (*qmm_f16_fn)(const uint16_t *s, float *d, int64_t n);
qmm_f16_fn qmm_f16_row(int simd);
void qmm_avx2_f16_row(const uint16_t *s, float *d, int64_t n);

/* Attention's small products on an f16 cache, with the conversion fused
 * in (decode: the query heads that share a KV head, M = 1..7 rows; hd a
 * multiple of 8).  qk: s[r*lds + c] = q[r*hd ..] . k[c*ldk ..], c < nk;
 * pv: o[r*hd + e] += sum over c < nk of p[r*lds + c] * v[c*ldv + e], in
 * key order.  The F16C+FMA versions when simd and the CPU has them, else
 * NULL (the caller converts tiles and uses its own loops). */
typedef void (*qmm_att_qk_fn)(const float *q, int m, int hd, const uint16_t *k, int64_t ldk,
                              int64_t nk, float *s, int64_t lds);
typedef void (*qmm_att_pv_fn)(const float *p, int m, int64_t lds, const uint16_t *v, int64_t ldv,
                              int64_t nk, int hd, float *o);
enum { QMM_ATT_M = 7 }; /* the most rows the fused products take */
qmm_att_qk_fn qmm_att_qk(int simd);
qmm_att_pv_fn qmm_att_pv(int simd);
void qmm_avx2_att_qk(const float *q, int m, int hd, const uint16_t *k, int64_t ldk, int64_t nk,
                     float *s, int64_t lds);
void qmm_avx2_att_pv(const float *p, int m, int64_t lds, const uint16_t *v, int64_t ldv, int64_t nk,
                     int hd, float *o);

/* The activations' quantizer: the AVX2 one when simd and the CPU has it
 * (both give the same bytes).  It asks CPUID: call it once, at setup. */
qmm_quant_fn qmm_quant(int simd);

/* 1 when this CPU has AVX2, FMA and F16C (asked once) */
int qmm_cpu_avx2(void);

/* "avx2" or "c": the kernels qmm_select(t, simd, ...) picks on this CPU. */
const char *qmm_isa(int simd);

/* The portable kernels (qmm.c) and, when compiled in, the AVX2 ones
 * (qmm_avx2.c; NULL from qmm_avx2_get for a type it does not cover). */
void qmm_dot_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const float *x,
               int64_t ldx, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy);
void qmm_rows_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int64_t o1,
                float *dst);
int qmm_avx2_get(cb_type t, qmm_kernels *k);

/* The per-32 activation quantizer, portable (qmm8.c), and the integer
 * form of group g of a weight block: value[j] = a * w[j] + b (the tests'
 * reference checks it against cb_dequant_row).  qmm_has_q8: the block
 * types that have an integer form (the 8-bit products'). */
void qmm_quant8_c(const float *x, int64_t n, qmm_q8 *xq);
/* q[n] = one group of n activations quantized (the math above); returns d */
float qmm_quant_group(const float *x, int n, int8_t *q);
void qmm_group8(cb_type t, const uint8_t *b, int g, int16_t w[32], float *a, float *bb);
int qmm_has_q8(cb_type t);

#endif
