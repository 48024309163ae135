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

AI __m256 bcast_f16(const uint8_t *p)
{
    return _mm256_set1_ps(_cvtsh_ss(cb_dq_rd16(p)));
}

/* ---------------------------------------------------------- decoders */

/* eight bytes p[0..7] zero-extended into 32-bit lanes (one vpmovzxbd from
 * memory); nibbles are then one and or one shift away */
AI __m256i u8x8_32(const uint8_t *p)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

AI __m256i lo4(__m256i b)
{
    return _mm256_and_si256(b, _mm256_set1_epi32(0x0f));
}

AI __m256i hi4(__m256i b)
{
    return _mm256_srli_epi32(b, 4);
}

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
        v[k] = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 16 * k))), 16));
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
        v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * k)))), d);
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
        __m256i h = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u8x8_32(b + 16 + 8 * k), s), one), 4);
        v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_or_si256(nib_k(b + 48, s, k), h)), sc, mn);
    }
}

/* q6_K group s = (half n = s/4, quarter k = s%4): element 128n + 32k + l */
AI void dec_q6_k(const uint8_t *b, int s, __m256 v[4])
{
    int n = s >> 2, k = s & 3;
    float d = _cvtsh_ss(cb_dq_rd16(b + 208));
    const uint8_t *ql = b + 64 * n + 32 * (k & 1), *qh = b + 128 + 32 * n;
    const __m256i m4 = _mm256_set1_epi32(0x0f), m2 = _mm256_set1_epi32(3), c32 = _mm256_set1_epi32(32);
    for (int j = 0; j < 4; j++) {
        __m256 ds = _mm256_set1_ps(d * (float)(int8_t)b[192 + 8 * n + 2 * k + (j >> 1)]);
        __m256i lo = _mm256_and_si256(_mm256_srli_epi32(u8x8_32(ql + 8 * j), 4 * (k >> 1)), m4);
        __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u8x8_32(qh + 8 * j), 2 * k), m2), 4);
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

/* One weight row against R activation rows: groups of SUBS*32 elements of
 * BB bytes; a plain-type tail (n_in not a multiple of 32) by the reference
 * decoder. */
#define ROW_DOT(R, SUBS, BB, DEC)                                                                              \
    do {                                                                                                       \
        enum { NA = (R) == 1 ? 4 : 2 };                                                                        \
        __m256 acc[R][NA];                                                                                     \
        for (int r = 0; r < (R); r++)                                                                          \
            for (int a = 0; a < NA; a++)                                                                       \
                acc[r][a] = _mm256_setzero_ps();                                                               \
        const uint8_t *blk = row;                                                                              \
        const float *xp = x;                                                                                   \
        for (int64_t bi = 0; bi < nb; bi++, blk += (BB))                                                       \
            for (int s = 0; s < (SUBS); s++, xp += 32) {                                                       \
                __m256 v[4];                                                                                   \
                DEC(blk, s, v);                                                                                \
                for (int r = 0; r < (R); r++)                                                                  \
                    for (int k = 0; k < 4; k++)                                                                \
                        acc[r][k % NA] = _mm256_fmadd_ps(v[k], _mm256_loadu_ps(xp + r * ldx + 8 * k),         \
                                                         acc[r][k % NA]);                                      \
            }                                                                                                  \
        for (int r = 0; r < (R); r++) {                                                                        \
            __m256 tot = acc[r][0];                                                                              \
            for (int a = 1; a < NA; a++)                                                                       \
                tot = _mm256_add_ps(tot, acc[r][a]);                                                               \
            out[r] = hsum(tot);                                                                                  \
        }                                                                                                      \
    } while (0)

#define KERNELS(NAME, SUBS, BB, DEC)                                                                           \
    static void dot_##NAME(cb_type t, const uint8_t *w, size_t rb, int64_t n_in, const float *x, int64_t ldx,  \
                           int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)                              \
    {                                                                                                          \
        int64_t nb = n_in / (32 * (SUBS)), tail = n_in - nb * 32 * (SUBS);                                     \
        for (int64_t o = o0; o < o1; o++) {                                                                    \
            const uint8_t *row = w + (size_t)o * rb;                                                           \
            float out[QMM_ROWS];                                                                               \
            switch (nr) {                                                                                      \
            case 1: ROW_DOT(1, SUBS, BB, DEC); break;                                                          \
            case 2: ROW_DOT(2, SUBS, BB, DEC); break;                                                          \
            case 3: ROW_DOT(3, SUBS, BB, DEC); break;                                                          \
            default: ROW_DOT(4, SUBS, BB, DEC); break;                                                         \
            }                                                                                                  \
            if (tail) {                                                                                        \
                float buf[32];                                                                                 \
                cb_dequant_row(t, row + nb * (BB), buf, tail);                                                 \
                for (int r = 0; r < nr; r++)                                                                   \
                    for (int64_t j = 0; j < tail; j++)                                                         \
                        out[r] += buf[j] * x[r * ldx + nb * 32 * (SUBS) + j];                                  \
            }                                                                                                  \
            for (int r = 0; r < nr; r++)                                                                       \
                y[r * ldy + o] = out[r];                                                                       \
        }                                                                                                      \
    }                                                                                                          \
    static void rows_##NAME(cb_type t, const uint8_t *w, size_t rb, int64_t n_in, int64_t o0, int64_t o1,      \
                            float *dst)                                                                        \
    {                                                                                                          \
        int64_t nb = n_in / (32 * (SUBS)), tail = n_in - nb * 32 * (SUBS);                                     \
        for (int64_t o = o0; o < o1; o++, dst += n_in) {                                                       \
            const uint8_t *blk = w + (size_t)o * rb;                                                           \
            float *d = dst;                                                                                    \
            for (int64_t bi = 0; bi < nb; bi++, blk += (BB))                                                   \
                for (int s = 0; s < (SUBS); s++, d += 32) {                                                    \
                    __m256 v[4];                                                                               \
                    DEC(blk, s, v);                                                                            \
                    for (int k = 0; k < 4; k++)                                                                \
                        _mm256_storeu_ps(d + 8 * k, v[k]);                                                     \
                }                                                                                              \
            if (tail)                                                                                          \
                cb_dequant_row(t, blk, d, tail);                                                               \
        }                                                                                                      \
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
 * to even, as nearbyintf does in the default mode) */
static void quant8(const float *x, int64_t n, qmm_q8 *xq)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t g = 0; g < n / 32; g++, x += 32, xq++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, _mm256_and_ps(v[k], absm));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid));
            sum = _mm256_add_epi32(sum, q[k]);
        }
        /* the packs interleave 128-bit lanes: dwords come out as elements
         * 0-3, 8-11, 16-19, 24-27, 4-7, ...; put them back in order */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)xq->q, p);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        xq->d = d;
        xq->s = d * (float)_mm_cvtsi128_si32(s4);
    }
}

/* 16 bytes of nibbles as 32 bytes: the low nibbles, then the high ones */
AI __m256i nib16(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
}

/* bit j of x as 16 in byte j (q5 types' fifth bits) */
AI __m256i bits16(uint32_t x)
{
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                          3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16));
}

/* Group decoders: the integers w (32 bytes), a and b of qmm_group8 (K
 * types: from ka/kb, which their block's PREP filled), and for q6_K its two
 * per-16 scales as 16-bit lanes (sc) */
AI void g8_q4_0(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)g, (void)sc, (void)ka, (void)kb;
    *w = nib16(b + 2);
    *a = _cvtsh_ss(cb_dq_rd16(b));
    *bb = -8.0f * *a;
}

AI void g8_q4_1(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)g, (void)sc, (void)ka, (void)kb;
    *w = nib16(b + 4);
    *a = _cvtsh_ss(cb_dq_rd16(b));
    *bb = _cvtsh_ss(cb_dq_rd16(b + 2));
}

AI void g8_q5_0(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)g, (void)sc, (void)ka, (void)kb;
    *w = _mm256_or_si256(nib16(b + 6), bits16(cb_dq_rd32(b + 2)));
    *a = _cvtsh_ss(cb_dq_rd16(b));
    *bb = -16.0f * *a;
}

AI void g8_q5_1(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)g, (void)sc, (void)ka, (void)kb;
    *w = _mm256_or_si256(nib16(b + 8), bits16(cb_dq_rd32(b + 4)));
    *a = _cvtsh_ss(cb_dq_rd16(b));
    *bb = _cvtsh_ss(cb_dq_rd16(b + 2));
}

AI void g8_q8_0(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)g, (void)sc, (void)ka, (void)kb;
    *w = _mm256_loadu_si256((const __m256i *)(b + 2));
    *a = _cvtsh_ss(cb_dq_rd16(b));
    *bb = 0;
}

/* q4_K/q5_K: every sub-block's scale d*sc and offset -dmin*m, once a
 * block (the groups' decoders take theirs).  The twelve bytes of 6-bit
 * scales and mins (cb_dq_scale_min) unpacked four at a time in 32-bit
 * words: bytes 0-3 give sc 0-3, 4-7 m 0-3, and 8-11 the low four bits of
 * sc 4-7 and m 4-7, whose top two bits are bytes 0-3's and 4-7's. */
AI void k8_prep(const uint8_t *b, float *ka, float *kb)
{
    float d = _cvtsh_ss(cb_dq_rd16(b)), dmin = _cvtsh_ss(cb_dq_rd16(b + 2));
    uint32_t w0 = cb_dq_rd32(b + 4), w1 = cb_dq_rd32(b + 8), w2 = cb_dq_rd32(b + 12);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_lo = w1 & 0x3f3f3f3fu, m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    __m128i v = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    _mm256_storeu_ps(ka, _mm256_mul_ps(sc, _mm256_set1_ps(d)));
    _mm256_storeu_ps(kb, _mm256_mul_ps(m, _mm256_set1_ps(-dmin))); /* = -(dmin * m), exactly */
}

/* ------------------------------------ the one-row kernel's scale vectors */

/* Eight groups' a and b (qmm_group8) as vectors: the eight sub-blocks of a
 * K block, or eight consecutive 32-blocks of BB bytes (the first four
 * bytes of each, its f16 d and, for q4_1/q5_1, m: eight scalar loads, which
 * measured faster here than vpgatherdd) */
AI __m256 f16lo8(__m256i w)
{
    __m256i p = _mm256_packus_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0xffff)), _mm256_setzero_si256());
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
}

AI __m256i gather8(const uint8_t *b, int bb)
{
    return _mm256_setr_epi32((int)cb_dq_rd32(b), (int)cb_dq_rd32(b + bb), (int)cb_dq_rd32(b + 2 * bb),
                             (int)cb_dq_rd32(b + 3 * bb), (int)cb_dq_rd32(b + 4 * bb), (int)cb_dq_rd32(b + 5 * bb),
                             (int)cb_dq_rd32(b + 6 * bb), (int)cb_dq_rd32(b + 7 * bb));
}

AI void v8_q4_0(const uint8_t *b, __m256 *a, __m256 *bb)
{
    *a = f16lo8(gather8(b, CB_Q4_0_BYTES));
    *bb = _mm256_mul_ps(*a, _mm256_set1_ps(-8.0f));
}

AI void v8_q4_1(const uint8_t *b, __m256 *a, __m256 *bb)
{
    __m256i w = gather8(b, CB_Q4_1_BYTES);
    *a = f16lo8(w);
    *bb = f16lo8(_mm256_srli_epi32(w, 16));
}

AI void v8_q5_0(const uint8_t *b, __m256 *a, __m256 *bb)
{
    *a = f16lo8(gather8(b, CB_Q5_0_BYTES));
    *bb = _mm256_mul_ps(*a, _mm256_set1_ps(-16.0f));
}

AI void v8_q5_1(const uint8_t *b, __m256 *a, __m256 *bb)
{
    __m256i w = gather8(b, CB_Q5_1_BYTES);
    *a = f16lo8(w);
    *bb = f16lo8(_mm256_srli_epi32(w, 16));
}

AI void v8_q8_0(const uint8_t *b, __m256 *a, __m256 *bb)
{
    *a = f16lo8(gather8(b, CB_Q8_0_BYTES));
    *bb = _mm256_setzero_ps();
}

AI void v8_k45(const uint8_t *b, __m256 *a, __m256 *bb)
{
    float ka[8], kb[8];
    k8_prep(b, ka, kb);
    *a = _mm256_loadu_ps(ka);
    *bb = _mm256_loadu_ps(kb);
}

AI void v8_q6_k(const uint8_t *b, __m256 *a, __m256 *bb)
{
    *a = _mm256_set1_ps(_cvtsh_ss(cb_dq_rd16(b + 208)));
    *bb = _mm256_setzero_ps();
}

/* q6_K: d (its per-16 scales go into the integers) */
AI void k6_prep(const uint8_t *b, float *ka, float *kb)
{
    ka[0] = _cvtsh_ss(cb_dq_rd16(b + 208));
    kb[0] = 0;
}

/* the 32-element types: nothing a block */
AI void no_prep(const uint8_t *b, float *ka, float *kb)
{
    (void)b, (void)ka, (void)kb;
}

AI __m256i nib_k8(const uint8_t *qs, int g)
{
    __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (g >> 1)));
    return _mm256_and_si256(g & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(15));
}

AI void g8_q4_k(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)sc;
    *w = nib_k8(b + 16, g);
    *a = ka[g];
    *bb = kb[g];
}

AI void g8_q5_k(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    (void)sc;
    __m256i h = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(b + 16)), g),
                                 _mm256_set1_epi8(1));
    *w = _mm256_or_si256(nib_k8(b + 48, g), _mm256_slli_epi16(h, 4));
    *a = ka[g];
    *bb = kb[g];
}

/* q6_K group g = (half n = g/4, quarter k = g%4), as dec_q6_k: w = q - 32
 * (signed), its two scales in sc */
AI void g8_q6_k(const uint8_t *b, int g, const float *ka, const float *kb, __m256i *w, float *a, float *bb,
                __m256i *sc)
{
    int n = g >> 2, k = g & 3;
    __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32 * (k & 1)));
    __m256i hi = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
    lo = _mm256_and_si256(_mm256_srli_epi16(lo, 4 * (k >> 1)), _mm256_set1_epi8(15));
    hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 2 * k), _mm256_set1_epi8(3)), 4);
    *w = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
    const int8_t *s = (const int8_t *)b + 192 + 8 * n + 2 * k;
    *sc = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
    *a = ka[0];
    *bb = kb[0];
}

/* Integer dot products of a group's weights w and activations x (signed
 * bytes), as eight 32-bit partial sums: unsigned w (0..31) straight into
 * vpmaddubsw; signed w (q8_0, q6_K) as |w| times x with w's sign (no
 * 16-bit pair can overflow: 2 * 128 * 127 < 32768) */
AI __m256i isum_u(__m256i w, __m256i x, __m256i sc)
{
    (void)sc;
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

AI __m256i isum_s(__m256i w, __m256i x, __m256i sc)
{
    (void)sc;
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                             _mm256_set1_epi16(1));
}

AI __m256i isum_s16(__m256i w, __m256i x, __m256i sc)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), sc);
}

/* One weight row against R quantized activation rows, PER groups a block
 * of BB bytes */
#define ROW_DOTQ(R, PER, BB, PREP, DEC, ISUM)                                                                  \
    do {                                                                                                       \
        __m256 acc[R];                                                                                         \
        float mac[R];                                                                                          \
        for (int r = 0; r < (R); r++) {                                                                        \
            acc[r] = _mm256_setzero_ps();                                                                      \
            mac[r] = 0;                                                                                        \
        }                                                                                                      \
        const uint8_t *blk = row;                                                                              \
        const qmm_q8 *xg = xq;                                                                                 \
        for (int64_t bi = 0; bi < nb; bi++, blk += (BB)) {                                                     \
            float ka[8], kb[8];                                                                                \
            PREP(blk, ka, kb);                                                                                 \
            for (int g = 0; g < (PER); g++, xg++) {                                                            \
                __m256i wv, sc = _mm256_setzero_si256();                                                       \
                float a, b;                                                                                    \
                DEC(blk, g, ka, kb, &wv, &a, &b, &sc);                                                         \
                for (int r = 0; r < (R); r++) {                                                                \
                    const qmm_q8 *x = xg + r * ldxq;                                                           \
                    __m256i is = ISUM(wv, _mm256_loadu_si256((const __m256i *)x->q), sc);                      \
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(a * x->d), acc[r]);        \
                    mac[r] += b * x->s;                                                                        \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
        for (int r = 0; r < (R); r++)                                                                          \
            out[r] = hsum(acc[r]) + mac[r];                                                                    \
    } while (0)

/* One weight row against one activation row (decode), eight groups at a
 * time: their scales a (times the activations' d) and offsets b (times the
 * activations' s) as two vectors, so that each group's own work is its
 * integer dot product and one multiply-add, in two chains (even and odd
 * groups).  xd, xs: the activation groups' d and s, contiguous.  Groups
 * past the last eight (32-element types) take ROW_DOTQ(1)'s steps. */
#define ROW_DOTQ1(PER, BB, V8, DEC, ISUM)                                                                      \
    do {                                                                                                       \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), macv = _mm256_setzero_ps();            \
        float mac = 0, ka[8] = {0}, kb[8] = {0}, ad[8];                                                        \
        const uint8_t *blk = row;                                                                              \
        int64_t g0 = 0, ng = nb * (PER);                                                                       \
        for (; g0 + 8 <= ng; g0 += 8, blk += (PER) == 1 ? 8 * (BB) : (BB)) {                                  \
            __m256 va, vb;                                                                                     \
            V8(blk, &va, &vb);                                                                                 \
            _mm256_storeu_ps(ad, _mm256_mul_ps(va, _mm256_loadu_ps(xd + g0)));                                 \
            macv = _mm256_fmadd_ps(vb, _mm256_loadu_ps(xs + g0), macv);                                        \
            for (int k = 0; k < 8; k += 2) {                                                                   \
                __m256i w0, w1, sc0 = _mm256_setzero_si256(), sc1 = _mm256_setzero_si256();                    \
                float a_, b_;                                                                                  \
                DEC((PER) == 1 ? blk + k * (BB) : blk, (PER) == 1 ? 0 : k, ka, kb, &w0, &a_, &b_, &sc0);       \
                DEC((PER) == 1 ? blk + (k + 1) * (BB) : blk, (PER) == 1 ? 0 : k + 1, ka, kb, &w1, &a_, &b_,    \
                    &sc1);                                                                                     \
                __m256i i0 = ISUM(w0, _mm256_loadu_si256((const __m256i *)xq[g0 + k].q), sc0);                 \
                __m256i i1 = ISUM(w1, _mm256_loadu_si256((const __m256i *)xq[g0 + k + 1].q), sc1);             \
                acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_broadcast_ss(ad + k), acc0);             \
                acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_broadcast_ss(ad + k + 1), acc1);         \
            }                                                                                                  \
        }                                                                                                      \
        for (; g0 < ng; g0++, blk += (BB)) { /* (PER) == 1 here: ng % 8 blocks */                             \
            __m256i wv, sc = _mm256_setzero_si256();                                                           \
            float a, b;                                                                                        \
            DEC(blk, 0, ka, kb, &wv, &a, &b, &sc);                                                             \
            __m256i is = ISUM(wv, _mm256_loadu_si256((const __m256i *)xq[g0].q), sc);                          \
            acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(a * xd[g0]), acc0);                  \
            mac += b * xs[g0];                                                                                 \
        }                                                                                                      \
        out[0] = hsum(_mm256_add_ps(acc0, acc1)) + (hsum(macv) + mac);                                         \
    } while (0)

/* the one-row kernel's activation scales, contiguous (at most XD_MAX groups:
 * 64K inputs; wider rows take ROW_DOTQ(1)) */
enum { XD_MAX = 2048 };

#define KERNEL_Q8(NAME, PER, BB, PREP, V8, DEC, ISUM)                                                          \
    static void dotq_##NAME(cb_type t, const uint8_t *w, size_t rb, int64_t n_in, const qmm_q8 *xq,            \
                            int64_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)               \
    {                                                                                                          \
        (void)t;                                                                                               \
        int64_t nb = n_in / (32 * (PER));                                                                      \
        float xd[XD_MAX], xs[XD_MAX];                                                                          \
        int one = nr == 1 && n_in / 32 <= XD_MAX;                                                              \
        for (int64_t g = 0; one && g < n_in / 32; g++)                                                         \
            xd[g] = xq[g].d, xs[g] = xq[g].s;                                                                  \
        for (int64_t o = o0; o < o1; o++) {                                                                    \
            const uint8_t *row = w + (size_t)o * rb;                                                           \
            float out[QMM_ROWS];                                                                               \
            switch (one ? 0 : nr) {                                                                            \
            case 0: ROW_DOTQ1(PER, BB, V8, DEC, ISUM); break;                                                  \
            case 1: ROW_DOTQ(1, PER, BB, PREP, DEC, ISUM); break;                                              \
            case 2: ROW_DOTQ(2, PER, BB, PREP, DEC, ISUM); break;                                              \
            case 3: ROW_DOTQ(3, PER, BB, PREP, DEC, ISUM); break;                                              \
            default: ROW_DOTQ(4, PER, BB, PREP, DEC, ISUM); break;                                             \
            }                                                                                                  \
            for (int r = 0; r < nr; r++)                                                                       \
                y[r * ldy + o] = out[r];                                                                       \
        }                                                                                                      \
    }

KERNEL_Q8(q4_0, 1, CB_Q4_0_BYTES, no_prep, v8_q4_0, g8_q4_0, isum_u)
KERNEL_Q8(q4_1, 1, CB_Q4_1_BYTES, no_prep, v8_q4_1, g8_q4_1, isum_u)
KERNEL_Q8(q5_0, 1, CB_Q5_0_BYTES, no_prep, v8_q5_0, g8_q5_0, isum_u)
KERNEL_Q8(q5_1, 1, CB_Q5_1_BYTES, no_prep, v8_q5_1, g8_q5_1, isum_u)
KERNEL_Q8(q8_0, 1, CB_Q8_0_BYTES, no_prep, v8_q8_0, g8_q8_0, isum_s)
KERNEL_Q8(q4_k, 8, CB_Q4_K_BYTES, k8_prep, v8_k45, g8_q4_k, isum_u)
KERNEL_Q8(q5_k, 8, CB_Q5_K_BYTES, k8_prep, v8_k45, g8_q5_k, isum_u)
KERNEL_Q8(q6_k, 8, CB_Q6_K_BYTES, k6_prep, v8_q6_k, g8_q6_k, isum_s16)

/* s[j] = e^(s[j] - m) (arguments <= 0) for j < n; returns their sum.  The
 * polynomial of qmm_exp_neg (Cephes' exp2f, relative error < 2e-7),
 * eight lanes at a time. */
float qmm_avx2_exp_sum(float *s, int64_t n, float m)
{
    const __m256 vm = _mm256_set1_ps(m), lo = _mm256_set1_ps(-87.0f), l2e = _mm256_set1_ps(1.44269504088896341f);
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
        __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127)), 23);
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

void qmm_avx2_f16_row(const uint16_t *s, float *d, int64_t n)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j))));
    for (; j < n; j++)
        d[j] = _cvtsh_ss(s[j]);
}

/* ---------------------------------------------------------- attention */

/* qk for M rows: each key's row converted once, 8 lanes at a time, into M
 * accumulators (two per row, even and odd lanes of 8, when M <= 3) */
AI void att_qk_m(const float *q, const int M, int hd, const uint16_t *k, int64_t ldk, int64_t nk, float *s,
                 int64_t lds)
{
    const int two = M <= 3 && hd % 16 == 0;
    for (int64_t c = 0; c < nk; c++) {
        const uint16_t *kr = k + c * ldk;
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

void qmm_avx2_att_qk(const float *q, int m, int hd, const uint16_t *k, int64_t ldk, int64_t nk, float *s, int64_t lds)
{
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
}

/* pv for M rows: the output in registers, 16 lanes a row (8 when M > 4),
 * one pass over the keys for each such slice of it */
AI void att_pv_m(const float *p, const int M, int64_t lds, const uint16_t *v, int64_t ldv, int64_t nk, int hd,
                 float *o)
{
    const int two = M <= 4;
    int e = 0;
    for (; two && e + 16 <= hd; e += 16) {
        __m256 a0[QMM_ATT_M], a1[QMM_ATT_M];
        for (int r = 0; r < M; r++) {
            a0[r] = _mm256_loadu_ps(o + r * hd + e);
            a1[r] = _mm256_loadu_ps(o + r * hd + e + 8);
        }
        for (int64_t c = 0; c < nk; c++) {
            const uint16_t *vr = v + c * ldv + e;
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
    for (; e < hd; e += 8) {
        __m256 a0[QMM_ATT_M];
        for (int r = 0; r < M; r++)
            a0[r] = _mm256_loadu_ps(o + r * hd + e);
        for (int64_t c = 0; c < nk; c++) {
            __m256 v0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + c * ldv + e)));
            for (int r = 0; r < M; r++)
                a0[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * lds + c), v0, a0[r]);
        }
        for (int r = 0; r < M; r++)
            _mm256_storeu_ps(o + r * hd + e, a0[r]);
    }
}

void qmm_avx2_att_pv(const float *p, int m, int64_t lds, const uint16_t *v, int64_t ldv, int64_t nk, int hd, float *o)
{
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
}

int qmm_avx2_get(cb_type t, qmm_kernels *k)
{
    k->dotq = NULL;
    switch (t) {
#define CASE(T, NAME, Q)                                                                                       \
    case T:                                                                                                    \
        k->dot = dot_##NAME;                                                                                   \
        k->rows = rows_##NAME;                                                                                 \
        k->dotq = Q;                                                                                           \
        break;
        CASE(CB_TYPE_F32, f32, NULL)
        CASE(CB_TYPE_F16, f16, NULL)
        CASE(CB_TYPE_BF16, bf16, NULL)
        CASE(CB_TYPE_Q4_0, q4_0, dotq_q4_0)
        CASE(CB_TYPE_Q4_1, q4_1, dotq_q4_1)
        CASE(CB_TYPE_Q5_0, q5_0, dotq_q5_0)
        CASE(CB_TYPE_Q5_1, q5_1, dotq_q5_1)
        CASE(CB_TYPE_Q8_0, q8_0, dotq_q8_0)
        CASE(CB_TYPE_Q4_K, q4_k, dotq_q4_k)
        CASE(CB_TYPE_Q5_K, q5_k, dotq_q5_k)
        CASE(CB_TYPE_Q6_K, q6_k, dotq_q6_k)
#undef CASE
    default:
        return 0;
    }
    k->quant = quant8;
    k->isa = "avx2";
    return 1;
}
#endif
