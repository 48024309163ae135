/* qmm_avx2.c - the AVX2+FMA+F16C kernels of qmm.h.
 *
 * The Makefile compiles this file with -mavx2 -mfma -mf16c whatever the
 * build's -march; qmm_select calls into it only on a CPU that has them.
 *
 * Every type is read as groups of 32 elements (one q4_0..q8_0 block, an
 * eighth of a K block, 32 plain values); a group decodes into four 8-lane
 * f32 vectors v[0..3] (elements 0-7, 8-15, 16-23, 24-31 of the group) with
 * the formulas of dequant.h, and the dot kernel multiplies them into 1..4
 * activation rows held in two (four for one row) accumulators per row. */
#if defined(__x86_64__) || defined(__i386__)
#include "../core/dequant.h"
#include "qmm.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __m256 bcast_f16(const uint8_t *p) { return _mm256_set1_ps(_cvtsh_ss(cb_dq_rd16(p))); }

/* ---------------------------------------------------------- decoders */

/* eight bytes p[0..7] zero-extended into 32-bit lanes (one vpmovzxbd from
 * memory); nibbles are then one and or one shift away */
AI __m256i u8x8_32(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

AI __m256i lo4(__m256i b) { return _mm256_and_si256(b, _mm256_set1_epi32(0x0f)); }

AI __m256i hi4(__m256i b) { return _mm256_srli_epi32(b, 4); }

/* the four 8-lane integer groups of a 32-block's nibbles qs[16]: low
 * nibbles of qs[0..15] are elements 0..15, high nibbles 16..31 */
AI void nib32(const uint8_t *qs, __m256i q[4])
{
    __m256i b0 = u8x8_32(qs), b1 = u8x8_32(qs + 8);
    q[0] = lo4(b0);
    q[1] = lo4(b1);
    q[2] = hi4(b0);
    q[3] = hi4(b1);
}

AI void dec_f32(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_loadu_ps((const float *)b + 8 * k);
}

AI void dec_f16(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16 * k)));
}

AI void dec_bf16(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 16 * k))), 16));
}

AI void dec_q4_0(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    __m256 d = bcast_f16(b), m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    __m256i q[4];
    nib32(b + 2, q);
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m); /* (q-8)*d */
}

AI void dec_q4_1(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    __m256 d = bcast_f16(b), m = bcast_f16(b + 2);
    __m256i q[4];
    nib32(b + 4, q);
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m);
}

/* the 5th bits of elements 8k..8k+7 (bits 8k.. of qh) at bit 4 of 32-bit lanes */
AI __m256i hbit5(__m256i qh, int k)
{
    const __m256i sh = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i bits = _mm256_srlv_epi32(qh, _mm256_add_epi32(sh, _mm256_set1_epi32(8 * k)));
    return _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(1)), 4);
}

AI void dec_q5_0(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    __m256 d = bcast_f16(b), m = _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
    __m256i qh = _mm256_set1_epi32((int)cb_dq_rd32(b + 2)), q[4];
    nib32(b + 6, q);
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(q[k], hbit5(qh, k))), d, m);
}

AI void dec_q5_1(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    __m256 d = bcast_f16(b), m = bcast_f16(b + 2);
    __m256i qh = _mm256_set1_epi32((int)cb_dq_rd32(b + 4)), q[4];
    nib32(b + 8, q);
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(q[k], hbit5(qh, k))), d, m);
}

AI void dec_q8_0(const uint8_t *b, int s, __m256 v[4])
{
    (void)s;
    __m256 d = bcast_f16(b);
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                 _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k)))),
                             d);
}

/* q4_K/q5_K sub-block s (0..7): scale d*sc and offset -dmin*m */
AI void k_scale(const uint8_t *b, int s, __m256 *sc, __m256 *mn)
{
    int isc, im;
    cb_dq_scale_min(s, b + 4, &isc, &im);
    *sc = _mm256_set1_ps(_cvtsh_ss(cb_dq_rd16(b)) * (float)isc);
    *mn = _mm256_set1_ps(-(_cvtsh_ss(cb_dq_rd16(b + 2)) * (float)im));
}

/* elements 8k.. of sub-block s: nibbles of qs[32(s/2) + 8k ..], low for
 * even s, high for odd */
AI __m256i nib_k(const uint8_t *qs, int s, int k)
{
    __m256i q = u8x8_32(qs + 32 * (s >> 1) + 8 * k);
    return s & 1 ? hi4(q) : lo4(q);
}

AI void dec_q4_k(const uint8_t *b, int s, __m256 v[4])
{
    __m256 sc, mn;
    k_scale(b, s, &sc, &mn);
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nib_k(b + 16, s, k)), sc, mn);
}

AI void dec_q5_k(const uint8_t *b, int s, __m256 v[4])
{
    __m256 sc, mn;
    k_scale(b, s, &sc, &mn);
    const __m256i one = _mm256_set1_epi32(1);
    for (int k = 0; k < 4; k++) {
        __m256i h = _mm256_slli_epi32(
            _mm256_and_si256(_mm256_srli_epi32(u8x8_32(b + 16 + 8 * k), s), one), 4);
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(nib_k(b + 48, s, k), h)), sc, mn);
    }
}

/* q6_K group s = (half n = s/4, quarter k = s%4): element 128n + 32k + l */
AI void dec_q6_k(const uint8_t *b, int s, __m256 v[4])
{
    int n = s >> 2, k = s & 3;
    float d = _cvtsh_ss(cb_dq_rd16(b + 208));
    const uint8_t *ql = b + 64 * n + 32 * (k & 1), *qh = b + 128 + 32 * n;
    const __m256i m4 = _mm256_set1_epi32(0x0f), m2 = _mm256_set1_epi32(3),
                  c32 = _mm256_set1_epi32(32);
    for (int j = 0; j < 4; j++) {
        __m256 ds = _mm256_set1_ps(d * (float)(int8_t)b[192 + 8 * n + 2 * k + (j >> 1)]);
        __m256i lo = _mm256_and_si256(_mm256_srli_epi32(u8x8_32(ql + 8 * j), 4 * (k >> 1)), m4);
        __m256i hi = _mm256_slli_epi32(
            _mm256_and_si256(_mm256_srli_epi32(u8x8_32(qh + 8 * j), 2 * k), m2), 4);
        __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, hi), c32);
        v[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), ds);
    }
}

/* ----------------------------------------------------------- kernels */

AI float hsum(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Bytes of the weights' stream prefetched ahead of the block a dot kernel
 * decodes (the rows of a task are one stream): --exact decode of
 * Qwen2.5-0.5B after 64 tokens went from 19.3 to 21.6 tok/s (medians of 3
 * alternations; 1024 and 4096 ahead no better), and SmolLM2's default
 * decode, whose output head takes these kernels (cpu.c, qg_outliers), by
 * 7% (median of 12 alternated pairs; Zen 3, 2 threads). */
#ifndef QMM_PF_AHEAD
#define QMM_PF_AHEAD 2048
#endif

/* One weight row against R activation rows in NA accumulators each (four
 * for a lone row, else two): groups of SUBS*32 elements of BB bytes; a
 * plain-type tail (n_in not a multiple of 32) by the reference decoder. */
#define ROW_DOT(R, NA_, SUBS, BB, DEC)                                                    \
    do {                                                                                  \
        enum { NA = (NA_) };                                                              \
        __m256 acc[R][NA];                                                                \
        for (int r = 0; r < (R); r++)                                                     \
            for (int a = 0; a < NA; a++)                                                  \
                acc[r][a] = _mm256_setzero_ps();                                          \
        const uint8_t *blk = row;                                                         \
        const float *xp = x;                                                              \
        for (int64_t bi = 0; bi < nb; bi++, blk += (BB)) {                                \
            for (int l = 0; l < (BB); l += 64)                                            \
                _mm_prefetch((const char *)blk + QMM_PF_AHEAD + l, _MM_HINT_T0);          \
            for (int s = 0; s < (SUBS); s++, xp += 32) {                                  \
                __m256 v[4];                                                              \
                DEC(blk, s, v);                                                           \
                for (int r = 0; r < (R); r++)                                             \
                    for (int k = 0; k < 4; k++)                                           \
                        acc[r][k % NA] = _mm256_fmadd_ps(                                 \
                            v[k], _mm256_loadu_ps(xp + r * ldx + 8 * k), acc[r][k % NA]); \
            }                                                                             \
        }                                                                                 \
        for (int r = 0; r < (R); r++) {                                                   \
            __m256 tot = acc[r][0];                                                       \
            for (int a = 1; a < NA; a++)                                                  \
                tot = _mm256_add_ps(tot, acc[r][a]);                                      \
            out[r] = hsum(tot);                                                           \
        }                                                                                 \
    } while (0)

#define KERNELS(NAME, SUBS, BB, DEC)                                                             \
    static void dot_##NAME(cb_type t, const uint8_t *w, size_t rb, int64_t n_in, const float *x, \
                           int64_t ldx, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)   \
    {                                                                                            \
        int64_t nb = n_in / (32 * (SUBS)), tail = n_in - nb * 32 * (SUBS);                       \
        const int kind = nr;                                                                     \
        nr = nr == QMM_ONE_PAIRED ? 1 : nr;                                                      \
        for (int64_t o = o0; o < o1; o++) {                                                      \
            const uint8_t *row = w + (size_t)o * rb;                                             \
            float out[QMM_ROWS];                                                                 \
            switch (kind) {                                                                      \
            case QMM_ONE_PAIRED: ROW_DOT(1, 2, SUBS, BB, DEC); break;                            \
            case 1: ROW_DOT(1, 4, SUBS, BB, DEC); break;                                         \
            case 2: ROW_DOT(2, 2, SUBS, BB, DEC); break;                                         \
            case 3: ROW_DOT(3, 2, SUBS, BB, DEC); break;                                         \
            default: ROW_DOT(4, 2, SUBS, BB, DEC); break;                                        \
            }                                                                                    \
            if (tail) {                                                                          \
                float buf[32];                                                                   \
                cb_dequant_row(t, row + nb * (BB), buf, tail);                                   \
                for (int r = 0; r < nr; r++)                                                     \
                    for (int64_t j = 0; j < tail; j++)                                           \
                        out[r] += buf[j] * x[r * ldx + nb * 32 * (SUBS) + j];                    \
            }                                                                                    \
            for (int r = 0; r < nr; r++)                                                         \
                y[r * ldy + o] = out[r];                                                         \
        }                                                                                        \
    }                                                                                            \
    static void rows_##NAME(cb_type t, const uint8_t *w, size_t rb, int64_t n_in, int64_t o0,    \
                            int64_t o1, float *dst)                                              \
    {                                                                                            \
        int64_t nb = n_in / (32 * (SUBS)), tail = n_in - nb * 32 * (SUBS);                       \
        for (int64_t o = o0; o < o1; o++, dst += n_in) {                                         \
            const uint8_t *blk = w + (size_t)o * rb;                                             \
            float *d = dst;                                                                      \
            for (int64_t bi = 0; bi < nb; bi++, blk += (BB))                                     \
                for (int s = 0; s < (SUBS); s++, d += 32) {                                      \
                    __m256 v[4];                                                                 \
                    DEC(blk, s, v);                                                              \
                    for (int k = 0; k < 4; k++)                                                  \
                        _mm256_storeu_ps(d + 8 * k, v[k]);                                       \
                }                                                                                \
            if (tail)                                                                            \
                cb_dequant_row(t, blk, d, tail);                                                 \
        }                                                                                        \
    }

KERNELS(f32, 1, 128, dec_f32)
KERNELS(f16, 1, 64, dec_f16)
KERNELS(bf16, 1, 64, dec_bf16)
KERNELS(q4_0, 1, CB_Q4_0_BYTES, dec_q4_0)
KERNELS(q4_1, 1, CB_Q4_1_BYTES, dec_q4_1)
KERNELS(q5_0, 1, CB_Q5_0_BYTES, dec_q5_0)
KERNELS(q5_1, 1, CB_Q5_1_BYTES, dec_q5_1)
KERNELS(q8_0, 1, CB_Q8_0_BYTES, dec_q8_0)
KERNELS(q4_k, 8, CB_Q4_K_BYTES, dec_q4_k)
KERNELS(q5_k, 8, CB_Q5_K_BYTES, dec_q5_k)
KERNELS(q6_k, 8, CB_Q6_K_BYTES, dec_q6_k)

/* -------------------------------------------- 8-bit activations (qmm8.c) */

/* xq = x quantized: qmm_quant8_c's math, bit for bit (vcvtps2dq rounds half
 * to even, as nearbyintf does in the default mode; NaN ignored by the
 * maximum and quantized to 0) */
static void quant8(const float *x, int64_t n, qmm_q8 *xq)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t g = 0; g < n / 32; g++, x += 32, xq++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(_mm256_and_ps(v[k], absm), m); /* a NaN is ignored, as in C */
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256 p = _mm256_mul_ps(v[k], vid); /* NaN (x NaN or infinite): 0, as in C */
            q[k] = _mm256_and_si256(_mm256_cvtps_epi32(p),
                                    _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_ORD_Q)));
            sum = _mm256_add_epi32(sum, q[k]);
        }
        /* the packs interleave 128-bit lanes: dwords come out as elements
         * 0-3, 8-11, 16-19, 24-27, 4-7, ...; put them back in order */
        __m256i p =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)xq->q, p);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        xq->d = d;
        xq->s = d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* s[j] = e^(s[j] - m) (arguments <= 0) for j < n; returns their sum.  The
 * polynomial of qmm_exp_neg (Cephes' exp2f, relative error < 2e-7),
 * eight lanes at a time. */
float qmm_avx2_exp_sum(float *s, int64_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m), lo = _mm256_set1_ps(-87.0f),
                 l2e = _mm256_set1_ps(1.44269504088896341f);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        /* max(lo, x): a NaN x comes through (the second operand wins) */
        __m256 x = _mm256_max_ps(lo, _mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        __m256 t = _mm256_mul_ps(x, l2e);
        __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 f = _mm256_sub_ps(t, r);
        __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
        __m256i e =
            _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127)), 23);
        p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
        _mm256_storeu_ps(s + j, p);
        acc = _mm256_add_ps(acc, p);
    }
    float sum = hsum(acc);
    for (; j < n; j++) {
        s[j] = qmm_exp_neg(s[j] - m);
        sum += s[j];
    }
    return sum;
}

/* qmm.h's qmm_swiglu: qmm_swiglu1's operations lane by lane, multiplies
 * and adds apart as the C (ISO mode: no contraction) has them */
void qmm_avx2_swiglu(const float *g, const float *u, float *y, int64_t n)
{
    const __m256 lo = _mm256_set1_ps(-87.0f), l2e = _mm256_set1_ps(1.44269504088896341f),
                 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(),
                 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    static const float c[6] = {1.339887440266574e-3f, 9.618437357674640e-3f, 5.550332471162809e-2f,
                               2.402264791363012e-1f, 6.931472028550421e-1f, 1.0f};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(g + j);
        /* e = qmm_exp_neg(-|x|); max(lo, a): a NaN a comes through */
        __m256 a = _mm256_max_ps(lo, _mm256_xor_ps(_mm256_and_ps(x, absm), _mm256_set1_ps(-0.0f)));
        __m256 t = _mm256_mul_ps(a, l2e);
        __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 f = _mm256_sub_ps(t, r);
        __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
        for (int k = 0; k < 6; k++)
            p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(c[k]));
        /* a NaN's exponent: 0, as the C's (its p is NaN all the same) */
        __m256i ni = _mm256_and_si256(_mm256_cvtps_epi32(r),
                                      _mm256_castps_si256(_mm256_cmp_ps(r, r, _CMP_ORD_Q)));
        __m256i eb = _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23);
        __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(eb));
        /* x * ((x >= 0 ? 1 : e) / (1 + e)) * u */
        __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
        __m256 s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u + j)));
    }
    for (; j < n; j++)
        y[j] = qmm_swiglu1(g[j], u[j]);
}

void qmm_avx2_f16_row(const uint16_t *s, float *d, int64_t n)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
    for (; j < n; j++)
        d[j] = _cvtsh_ss(s[j]);
}

/* ---------------------------------------------------------- attention */

/* how many cache rows ahead the products prefetch a head's slice (8 and
 * 16 were within the noise of each other; none was a third slower) */
enum { ATT_PF = 8 };

/* a cache row's hd f16 values into L1, each of their lines (the last too,
 * where the row does not start on a line) */
AI void pf_row(const uint16_t *p, int hd)
{
    for (int e = 0; e < hd; e += 32)
        _mm_prefetch((const char *)(p + e), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + hd - 1), _MM_HINT_T0);
}

/* the sums of a's and b's lanes, in lanes 0 and 1 */
AI __m128 hsum2(__m256 a, __m256 b)
{
    __m256 h = _mm256_hadd_ps(a, b); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    return _mm_hadd_ps(x, x);
}

/* qk for M rows: each key's row converted once, 8 lanes at a time, into M
 * accumulators (two per row, even and odd lanes of 8, when M <= 3; for
 * 4-6 rows two keys at a time, so that twice the accumulators hide the
 * multiply-adds' latency).  The keys ATT_PF rows ahead are prefetched: a
 * KV head's slice of each row is a strided stream that the hardware's
 * prefetchers leave to demand misses. */
AI void att_qk_m(const float *q, const int M, int hd, const uint16_t *k, int64_t ldk, int64_t nk,
                 float *s, int64_t lds)
{
    const int two = M <= 3 && hd % 16 == 0;
    int64_t c = 0;
    for (; !two && M <= 6 && c + 2 <= nk; c += 2) {
        const uint16_t *kr = k + c * ldk;
        pf_row(kr + ATT_PF * ldk, hd);
        pf_row(kr + (ATT_PF + 1) * ldk, hd);
        __m256 a0[QMM_ATT_M], a1[QMM_ATT_M];
        for (int r = 0; r < M; r++)
            a0[r] = a1[r] = _mm256_setzero_ps();
        for (int e = 0; e < hd; e += 8) {
            __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + e)));
            __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + ldk + e)));
            for (int r = 0; r < M; r++) {
                __m256 qv = _mm256_loadu_ps(q + r * hd + e);
                a0[r] = _mm256_fmadd_ps(qv, k0, a0[r]);
                a1[r] = _mm256_fmadd_ps(qv, k1, a1[r]);
            }
        }
        for (int r = 0; r < M; r++) {
            __m128 t = hsum2(a0[r], a1[r]);
            s[r * lds + c] = _mm_cvtss_f32(t);
            s[r * lds + c + 1] = _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
        }
    }
    for (; c < nk; c++) {
        const uint16_t *kr = k + c * ldk;
        pf_row(kr + ATT_PF * ldk, hd);
        __m256 a0[QMM_ATT_M], a1[QMM_ATT_M];
        for (int r = 0; r < M; r++)
            a0[r] = a1[r] = _mm256_setzero_ps();
        if (two) {
            for (int e = 0; e < hd; e += 16) {
                __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + e)));
                __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + e + 8)));
                for (int r = 0; r < M; r++) {
                    a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * hd + e), k0, a0[r]);
                    a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * hd + e + 8), k1, a1[r]);
                }
            }
            for (int r = 0; r < M; r++)
                s[r * lds + c] = hsum(_mm256_add_ps(a0[r], a1[r]));
        } else {
            for (int e = 0; e < hd; e += 8) {
                __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + e)));
                for (int r = 0; r < M; r++)
                    a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * hd + e), k0, a0[r]);
            }
            for (int r = 0; r < M; r++)
                s[r * lds + c] = hsum(a0[r]);
        }
    }
}

void qmm_avx2_att_qk(const float *q, int m, int hd, const uint16_t *k, int64_t ldk, int64_t nk,
                     float *s, int64_t lds)
{
    /* clang-format off */
    switch (m) {
#define QK(M)                                                                                                  \
    case M:                                                                                                    \
        att_qk_m(q, M, hd, k, ldk, nk, s, lds);                                                                \
        break;
        QK(1) QK(2) QK(3) QK(4) QK(5) QK(6) QK(7)
#undef QK
    default:
        break;
    }
    /* clang-format on */
}

/* pv for M rows: the output in registers, 16 lanes a row (8 when M > 6),
 * one pass over the keys for each such slice of it; the first pass
 * prefetches the values ATT_PF rows ahead */
AI void att_pv_m(const float *p, const int M, int64_t lds, const uint16_t *v, int64_t ldv,
                 int64_t nk, int hd, float *o)
{
    const int two = M <= 6;
    int e = 0;
    for (; two && e + 16 <= hd; e += 16) {
        __m256 a0[QMM_ATT_M], a1[QMM_ATT_M];
        for (int r = 0; r < M; r++) {
            a0[r] = _mm256_loadu_ps(o + r * hd + e);
            a1[r] = _mm256_loadu_ps(o + r * hd + e + 8);
        }
        for (int64_t c = 0; c < nk; c++) {
            const uint16_t *vr = v + c * ldv + e;
            if (e == 0)
                pf_row(vr + ATT_PF * ldv, hd);
            __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vr));
            __m256 v1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8)));
            for (int r = 0; r < M; r++) {
                __m256 pr = _mm256_broadcast_ss(p + r * lds + c);
                a0[r] = _mm256_fmadd_ps(pr, v0, a0[r]);
                a1[r] = _mm256_fmadd_ps(pr, v1, a1[r]);
            }
        }
        for (int r = 0; r < M; r++) {
            _mm256_storeu_ps(o + r * hd + e, a0[r]);
            _mm256_storeu_ps(o + r * hd + e + 8, a1[r]);
        }
    }
    for (int first = e == 0; e < hd; e += 8, first = 0) {
        __m256 a0[QMM_ATT_M];
        for (int r = 0; r < M; r++)
            a0[r] = _mm256_loadu_ps(o + r * hd + e);
        for (int64_t c = 0; c < nk; c++) {
            if (first)
                pf_row(v + (c + ATT_PF) * ldv, hd);
            __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + c * ldv + e)));
            for (int r = 0; r < M; r++)
                a0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * lds + c), v0, a0[r]);
        }
        for (int r = 0; r < M; r++)
            _mm256_storeu_ps(o + r * hd + e, a0[r]);
    }
}

void qmm_avx2_att_pv(const float *p, int m, int64_t lds, const uint16_t *v, int64_t ldv, int64_t nk,
                     int hd, float *o)
{
    /* clang-format off */
    switch (m) {
#define PV(M)                                                                                                  \
    case M:                                                                                                    \
        att_pv_m(p, M, lds, v, ldv, nk, hd, o);                                                                \
        break;
        PV(1) PV(2) PV(3) PV(4) PV(5) PV(6) PV(7)
#undef PV
    default:
        break;
    }
    /* clang-format on */
}

int qmm_avx2_get(cb_type t, qmm_kernels *k)
{
    switch (t) {
#define CASE(T, NAME)          \
    case T:                    \
        k->dot = dot_##NAME;   \
        k->rows = rows_##NAME; \
        break;
        CASE(CB_TYPE_F32, f32)
        CASE(CB_TYPE_F16, f16)
        CASE(CB_TYPE_BF16, bf16)
        CASE(CB_TYPE_Q4_0, q4_0)
        CASE(CB_TYPE_Q4_1, q4_1)
        CASE(CB_TYPE_Q5_0, q5_0)
        CASE(CB_TYPE_Q5_1, q5_1)
        CASE(CB_TYPE_Q8_0, q8_0)
        CASE(CB_TYPE_Q4_K, q4_k)
        CASE(CB_TYPE_Q5_K, q5_k)
        CASE(CB_TYPE_Q6_K, q6_k)
#undef CASE
    default: return 0;
    }
    k->quant = quant8;
    k->isa = "avx2";
    return 1;
}
#endif
