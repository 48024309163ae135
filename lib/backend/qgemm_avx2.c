/* qgemm_avx2.c - the AVX2 kernels of qgemm.h (compiled with -mavx2 -mfma
 * whatever the build's -march; qg_select calls them only on a CPU that has
 * them): the K form's quantizer, the panels' interleave, the one-row
 * kernels, and qgemm_tile.h's blocked kernel with vpmaddubsw.
 *
 * A kernel step multiplies one packed panel (eight weight rows, four
 * consecutive elements of each in a 32-byte vector) with up to QG_R
 * activation rows: each activation row's four bytes are broadcast to the
 * eight lanes and vpmaddubsw makes, per lane, two 16-bit sums of two
 * products, so that lane i of the result belongs to weight row i.  The
 * 16-bit sums are accumulated over as many chunks as cannot overflow
 * (4-bit weights: 8 chunks, 2 * 15 * 127 * 8 < 32768; 5-bit: 4; 6-bit: 2),
 * then vpmaddwd with the rows' sub-block scales turns them into 32-bit
 * sums: one multiply per four products and a scaled multiply-add per 16
 * to 32 elements, instead of a multiply-add per element pair. */
#if defined(__x86_64__) || defined(__i386__)
#include "qgemm.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __m256i bc32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Keep v in a register here: without it gcc reassociates the 16-bit sums
 * into trees of products that need more registers than there are, and
 * spills (measured: a third of the kernel's speed) */
#define PIN(v) __asm__("" : "+x"(v))

AI __m256i ld(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }

/* ---------------------------------------------------------- activations */

/* qg_quant8k_c's bytes, bit for bit: the maximum ignores NaN as its
 * comparison does (vmaxps returns its second operand on a NaN), vcvtps2dq
 * rounds half to even as nearbyintf does, a NaN quantizes to 0 */
void qg_quant8k_avx2(const float *x, int64_t n, qg_q8k *xq)
{
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t g = 0; g < n / 256; g++, x += 256, xq++) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++)
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * k), absm), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        for (int s = 0; s < 8; s++) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                /* a NaN product (x NaN or infinite) quantizes to 0, as in C */
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 32 * s + 8 * k), vid);
                q[k] = _mm256_and_si256(_mm256_cvtps_epi32(v),
                                        _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
            }
            /* the packs interleave 128-bit lanes: put the dwords back in order */
            __m256i p =
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(void *)(xq->q + 32 * s), p);
            /* sums of 8 bytes each: biased to unsigned, vpsadbw, unbiased */
            __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(p, _mm256_set1_epi8((char)0x80)),
                                          _mm256_setzero_si256());
            int64_t s8[4];
            _mm256_storeu_si256((__m256i *)(void *)s8, sad);
            xq->bs16[2 * s] = (int16_t)(s8[0] + s8[1] - 16 * 128);
            xq->bs16[2 * s + 1] = (int16_t)(s8[2] + s8[3] - 16 * 128);
            xq->bs32[s] = (int16_t)(xq->bs16[2 * s] + xq->bs16[2 * s + 1]);
        }
        xq->d = d;
    }
}

/* --------------------------------------------------------------- packing */

/* r[i] (eight rows' dwords 0..7) transposed: out[d] = dword d of rows 0..7 */
AI void transpose8(const __m256i *r, __m256i *out)
{
    __m256i a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]); /* r0[0] r1[0] r0[1] r1[1] | r0[4] ... */
        a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);         /* dword 0 of rows i..i+3 | dword 4 */
        b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);     /* dword 1 | 5 */
        b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]); /* 2 | 6 */
        b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]); /* 3 | 7 */
    }
    for (int d = 0; d < 4; d++) {
        out[d] = _mm256_permute2x128_si256(b[d], b[4 + d], 0x20);
        out[d + 4] = _mm256_permute2x128_si256(b[d], b[4 + d], 0x31);
    }
}

/* qg_interleave_c: each eight rows' 32-byte pieces transposed as 8 x 8
 * dwords (p 16: two such groups, side by side in each chunk) */
void qg_interleave_avx2(const int8_t *q, int n, int p, uint8_t *dst)
{
    for (int c = 0; c < n; c += 32, dst += 32 * p)
        for (int h = 0; h < p; h += 8) {
            __m256i r[8], o[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_si256((const __m256i *)(const void *)(q + (h + i) * n + c));
            transpose8(r, o);
            for (int d = 0; d < 8; d++)
                _mm256_storeu_si256((__m256i *)(void *)(dst + 4 * p * d + 4 * h), o[d]);
        }
}

/* ------------------------------------------- one activation row (decode) */

/* the first np of the eight results */
AI void store8(__m256 acc, int np, float *y)
{
    if (np == 8) {
        _mm256_storeu_ps(y, acc);
    } else {
        float t[8];
        _mm256_storeu_ps(t, acc);
        memcpy(y, t, sizeof(float) * (size_t)np);
    }
}

/* lane i = the sum of v[i]'s eight lanes (exact: 32-bit integers) */
AI __m256i tree8(const __m256i *v)
{
    __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}

AI uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

AI uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* 16 bytes of nibbles as 32 bytes: the low nibbles, then the high ones */
AI __m256i nib16(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
}

/* bit j of x as 16 in byte j (q5 types' fifth bits) */
AI __m256i bits16(uint32_t x)
{
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16));
}

/* in every 16-bit lane of both halves, 16-bit lane k of s's low half */
static const uint8_t bcast16_idx[8][32] = {
#define I(k)                                                                                      \
    {                                                                                             \
        2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, \
            2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k,        \
            2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1,    \
            2 * k, 2 * k + 1, 2 * k, 2 * k + 1                                                    \
    }
    I(0), I(1), I(2), I(3), I(4),
    I(5), I(6), I(7)
#undef I
};

/* One K block of one weight row against R activation rows xr[r] (their
 * block): each row's integer sum sum_s sc_s sum_j w[j] q[j] spread over 8
 * lanes (vi[r]) and its offsets' sum_s m_s bs32_s over 4 (vm[r]).  The
 * weights are decoded once for the R rows.  kind 4: q4_K, 5: q5_K, 6: q6_K
 * (whose -32 * sc offsets come off vi; vm stays 0). */
AI void kblock(const int kind, const int R, const uint8_t *b, const qg_q8k *const *xr, __m256i *vi,
               __m256i *vm)
{
    __m256i acc[QG_R];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_si256();
    if (kind == 6) {
        __m256i sc =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)));
        const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3,
                                              2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
        for (int n = 0; n < 2; n++) {
            __m256i la = ld(b + 64 * n), lb = ld(b + 64 * n + 32), h = ld(b + 128 + 32 * n);
            const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
            for (int k = 0; k < 4; k++) {
                __m256i l = k & 1 ? lb : la;
                l = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(l, 4) : l, m4);
                __m256i hh = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m2);
                __m256i q = _mm256_or_si256(l, _mm256_slli_epi16(hh, 4));
                /* sub-blocks 8n+2k (elements 0-15: the low half) and 8n+2k+1 */
                __m256i s = _mm256_shuffle_epi8(
                    _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(4 * n + k)), pick);
                for (int r = 0; r < R; r++) {
                    __m256i p =
                        _mm256_maddubs_epi16(q, ld((const uint8_t *)xr[r]->q + 128 * n + 32 * k));
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, s));
                }
            }
        }
        __m256i sc32 = _mm256_slli_epi16(sc, 5);
        for (int r = 0; r < R; r++) {
            vi[r] =
                _mm256_sub_epi32(acc[r], _mm256_madd_epi16(sc32, ld((const uint8_t *)xr[r]->bs16)));
            vm[r] = _mm256_setzero_si256();
        }
        return;
    }
    uint32_t w0 = rd32(b + 4), w1 = rd32(b + 8), w2 = rd32(b + 12);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_lo = w1 & 0x3f3f3f3fu, m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u)
                                                                             << 4;
    __m256i scm =
        _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi));
    __m256i sc2 = _mm256_permute2x128_si256(scm, scm, 0x00); /* sc0..7 in both halves */
    for (int r = 0; r < R; r++) {
        __m128i bs = _mm_loadu_si128((const __m128i *)(const void *)xr[r]->bs32);
        vm[r] = _mm256_set_m128i(_mm_setzero_si128(),
                                 _mm_madd_epi16(_mm256_extracti128_si256(scm, 1), bs));
    }
    __m256i hb = kind == 5 ? ld(b + 16) : _mm256_setzero_si256();
    const uint8_t *qs = b + (kind == 5 ? 48 : 16);
    for (int p = 0; p < 4; p++) {
        __m256i q = ld(qs + 32 * p);
        __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(15));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(15));
        if (kind == 5) {
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(
                lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * p), one), 4));
            hi = _mm256_or_si256(
                hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * p + 1), one), 4));
        }
        __m256i s0 = _mm256_shuffle_epi8(sc2, ld(bcast16_idx[2 * p]));
        __m256i s1 = _mm256_shuffle_epi8(sc2, ld(bcast16_idx[2 * p + 1]));
        for (int r = 0; r < R; r++) {
            __m256i p0 = _mm256_maddubs_epi16(lo, ld((const uint8_t *)xr[r]->q + 64 * p));
            __m256i p1 = _mm256_maddubs_epi16(hi, ld((const uint8_t *)xr[r]->q + 64 * p + 32));
            acc[r] = _mm256_add_epi32(
                acc[r], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
        }
    }
    for (int r = 0; r < R; r++)
        vi[r] = acc[r];
}

/* v's eight 32-bit lanes folded to four (the halves added) */
AI __m128i fold4(__m256i v)
{
    return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* lane i = the sum of v[i]'s four lanes (exact: 32-bit integers) */
AI __m256i tree8x4(const __m128i *v)
{
    __m128i a = _mm_hadd_epi32(v[0], v[1]), b = _mm_hadd_epi32(v[2], v[3]);
    __m128i c = _mm_hadd_epi32(v[4], v[5]), d = _mm_hadd_epi32(v[6], v[7]);
    return _mm256_set_m128i(_mm_hadd_epi32(c, d), _mm_hadd_epi32(a, b));
}

/* The one-row kernels read eight weight rows at a time, each row straight
 * through (a chunk of blocks at a time: one sequential stream over the
 * eight adjacent rows, which the hardware prefetches; reading the eight
 * rows block by block in turn ran at a third of the memory's speed), and
 * keep each row-block's exact integer sums for each of up to QG_R
 * activation rows, which share the weights' decoding (software prefetch
 * ahead of the stream: PF_AHEAD); then, block by block, the eight rows'
 * qg_gemm fused multiply-adds, lane by lane.  The last group's missing
 * rows repeat its last row and are not stored. */
/* blocks a chunk: K types, one activation row (a quarter for more);
 * 32-element types, one activation row; more (compute-bound: their sums
 * stay in L1; chunks of 128 ran at two thirds of the speed) */
enum { GB_K = 64, GB_0 = 512, GB_0R = 16 };
/* Prefetching this far ahead of the block being read (measured: 1 KB
 * ahead reached 9.8 GB/s from memory on q4_K, one thread; 4 KB 11.8;
 * without, 6.7: the hardware's prefetcher alone leaves the loop waiting) */
#ifndef PF_AHEAD
#define PF_AHEAD 4096
#endif
#ifndef PF_AHEAD_0 /* ... the 32-element types' */
#define PF_AHEAD_0 2048
#endif

/* K-quant rows [o0, o1) against R activation rows (x + r * ldx blocks),
 * results at y + r * ldy */
AI void gemv_k(const int kind, const int R, const uint8_t *w, size_t rb, int64_t n_in,
               const qg_q8k *x, int64_t ldx, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    const size_t bb = kind == 4 ? 144 : kind == 5 ? 176 : 210;
    const int gb = R == 1 ? GB_K : GB_K / QG_R; /* blocks a chunk: its sums stay in L1 */
    int64_t nb = n_in / 256;
    __m128i is[GB_K][8], ms[GB_K][8]; /* [r * gb + b][i]: tree8x4 adds a row-block's lanes */
    uint16_t dh[GB_K][8], mh[GB_K][8];
    for (int64_t o = o0; o < o1; o += 8) {
        __m256 acc[QG_R];
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += gb) {
            int nbc = nb - b0 < gb ? (int)(nb - b0) : gb;
            for (int i = 0; i < 8; i++) {
                const uint8_t *row =
                    w + (size_t)(o + i < o1 ? o + i : o1 - 1) * rb + (size_t)b0 * bb;
                for (int b = 0; b < nbc; b++) {
                    const uint8_t *blk = row + (size_t)b * bb;
                    const qg_q8k *xr[QG_R];
                    __m256i vi[QG_R], vm[QG_R];
                    _mm_prefetch((const char *)(blk + PF_AHEAD), _MM_HINT_T0);
                    _mm_prefetch((const char *)(blk + PF_AHEAD + 64), _MM_HINT_T0);
                    _mm_prefetch((const char *)(blk + PF_AHEAD + 128), _MM_HINT_T0);
                    for (int r = 0; r < R; r++)
                        xr[r] = x + r * ldx + b0 + b;
                    kblock(kind, R, blk, xr, vi, vm);
                    for (int r = 0; r < R; r++) {
                        is[r * gb + b][i] = fold4(vi[r]);
                        if (kind != 6)
                            ms[r * gb + b][i] = _mm256_castsi256_si128(vm[r]); /* 4 lanes */
                    }
                    dh[b][i] = rd16(blk + (kind == 6 ? 208 : 0));
                    mh[b][i] = kind == 6 ? 0 : rd16(blk + 2);
                }
            }
            for (int b = 0; b < nbc; b++) {
                __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)dh[b]));
                __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)mh[b]));
                for (int r = 0; r < R; r++) {
                    __m256 dx = _mm256_set1_ps(x[r * ldx + b0 + b].d);
                    __m256 iv = _mm256_cvtepi32_ps(tree8x4(is[r * gb + b]));
                    acc[r] = _mm256_fmadd_ps(iv, _mm256_mul_ps(dv, dx), acc[r]);
                    if (kind != 6) {
                        __m256 sv = _mm256_cvtepi32_ps(tree8x4(ms[r * gb + b]));
                        acc[r] = _mm256_fnmadd_ps(sv, _mm256_mul_ps(mv, dx), acc[r]);
                    }
                }
            }
        }
        for (int r = 0; r < R; r++)
            store8(acc[r], o1 - o < 8 ? (int)(o1 - o) : 8, y + r * ldy + o);
    }
}

/* q8_0 rows [o0, o1) against R activation rows (qmm_q8; the 4- and 5-bit
 * types have gemv_4x below).  For one activation row
 * the eight rows of a group are read whole, one after the other (up to
 * GB_0 blocks a chunk: every row of today's models in one), so that the
 * group is one sequential stream that the prefetch ahead of it keeps in
 * flight (measured, q4_0 rows of 4096 from memory: chunks of half a row
 * 3.8 GB/s a thread, whole rows 8.4); each row-block's sums are folded to
 * four lanes for the second pass. */
AI void gemv_0(const int R, const uint8_t *w, size_t rb, int64_t n_in, const qmm_q8 *x, int64_t ldx,
               int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    const size_t bb = 34;
    const __m256i ones = _mm256_set1_epi16(1);
    const int gb = R == 1 ? GB_0 : GB_0R;
    int64_t nb = n_in / 32;
    /* the row-blocks' sums: one row, folded to four lanes ([b][i]); more,
     * eight ([r * gb + b][i]: the fold costs a tenth of the compute-bound
     * speed, and their chunks are short) */
    __m128i v1[R == 1 ? GB_0 : 1][8];
    __m256i vs[R == 1 ? 1 : QG_R * GB_0R][8];
    uint16_t dh[GB_0][8];
    for (int64_t o = o0; o < o1; o += 8) {
        __m256 acc[QG_R];
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_setzero_ps();
        for (int64_t b0 = 0; b0 < nb; b0 += gb) {
            int nbc = nb - b0 < gb ? (int)(nb - b0) : gb;
            for (int i = 0; i < 8; i++) {
                const uint8_t *row =
                    w + (size_t)(o + i < o1 ? o + i : o1 - 1) * rb + (size_t)b0 * bb;
                for (int b = 0; b < nbc; b++) {
                    const uint8_t *blk = row + (size_t)b * bb;
                    if (R == 1)
                        _mm_prefetch((const char *)(blk + PF_AHEAD_0), _MM_HINT_T0);
                    __m256i q = ld(blk + 2), aw = _mm256_sign_epi8(q, q);
                    for (int r = 0; r < R; r++) {
                        __m256i xv = ld((const uint8_t *)x[r * ldx + b0 + b].q);
                        __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, q));
                        if (R == 1)
                            v1[b][i] = fold4(_mm256_madd_epi16(p, ones));
                        else
                            vs[r * gb + b][i] = _mm256_madd_epi16(p, ones);
                    }
                    dh[b][i] = rd16(blk);
                }
            }
            for (int b = 0; b < nbc; b++) {
                __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)dh[b]));
                __m256 bv = _mm256_setzero_ps(); /* qg_gemm's fma with b = 0, kept */
                for (int r = 0; r < R; r++) {
                    const qmm_q8 *xb = &x[r * ldx + b0 + b];
                    __m256 iv = _mm256_cvtepi32_ps(R == 1 ? tree8x4(v1[b]) : tree8(vs[r * gb + b]));
                    acc[r] = _mm256_fmadd_ps(iv, _mm256_mul_ps(dv, _mm256_set1_ps(xb->d)), acc[r]);
                    acc[r] = _mm256_fmadd_ps(bv, _mm256_set1_ps(xb->s), acc[r]);
                }
            }
        }
        for (int r = 0; r < R; r++)
            store8(acc[r], o1 - o < 8 ? (int)(o1 - o) : 8, y + r * ldy + o);
    }
}

/* The dwords at byte offsets 0 and ho (< 5) of eight rows' blocks, lane i
 * row i's: one 8-byte load a row, paired and picked by shuffles.  Two
 * vpgatherdd did this before, and the samples after them were a quarter of
 * the q5_0 kernel's; without them (Zen 3, AVX2, 2 threads) Qwen2.5-0.5B,
 * whose layers are mostly q5_0, decodes after 512 tokens at 35.8 tok/s
 * where it made 32.2 (medians of 5 alternations). */
AI void rows_dw(const uint8_t *const *rp, size_t at, const int ho, __m256i *d0, __m256i *dh)
{
    __m128i q[8];
    for (int i = 0; i < 8; i++)
        q[i] = _mm_loadl_epi64((const __m128i *)(const void *)(rp[i] + at));
    /* lane 0: rows 0, 1 (x) and 2, 3 (y); lane 1: rows 4, 5 and 6, 7 */
    __m256i x = _mm256_set_m128i(_mm_unpacklo_epi64(q[4], q[5]), _mm_unpacklo_epi64(q[0], q[1]));
    __m256i y = _mm256_set_m128i(_mm_unpacklo_epi64(q[6], q[7]), _mm_unpacklo_epi64(q[2], q[3]));
    /* each lane's two rows a, b to (dword 0 of a, of b, dword ho of a, of b) */
    const __m256i pk = _mm256_setr_epi8(
        0, 1, 2, 3, 8, 9, 10, 11, (char)ho, (char)(ho + 1), (char)(ho + 2), (char)(ho + 3),
        (char)(8 + ho), (char)(9 + ho), (char)(10 + ho), (char)(11 + ho), 0, 1, 2, 3, 8, 9, 10, 11,
        (char)ho, (char)(ho + 1), (char)(ho + 2), (char)(ho + 3), (char)(8 + ho), (char)(9 + ho),
        (char)(10 + ho), (char)(11 + ho));
    x = _mm256_shuffle_epi8(x, pk);
    y = _mm256_shuffle_epi8(y, pk);
    *d0 = _mm256_unpacklo_epi64(x, y);
    *dh = _mm256_unpackhi_epi64(x, y);
}

/* The 4- and 5-bit types' one-row kernel: rows [o0, o1) of q4_0 (kind
 * 40), q4_1 (41), q5_0 (50) or q5_1 (51) against R activation rows, eight
 * weight rows at a time, block by block.  The eight rows' 16 bytes of
 * nibbles are transposed in registers as 8 x 4 dwords, so that vector c
 * holds bytes 4c..4c+3 of every row (elements 4c.. in the low nibbles,
 * 16+4c.. in the high ones), lane i row i; the 5-bit types' fifth bits are
 * spread from their 32-bit masks into the same bytes (a multiply puts bit
 * e of four at bit 8e+4).  Each activation row's matching four bytes are
 * broadcast, as the blocked kernel does, and the vpmaddubsw results summed
 * in 16 bits (8 * 2 * 15 * 127 < 32768; 5-bit: 4 * 2 * 31 * 127) before
 * vpmaddwd: every row's exact block sum lands in its lane with no
 * horizontal adds, and the rows' d (and m) are gathered as one vector.
 * The eight rows are read block by block, eight streams, which the
 * hardware's prefetchers do not follow: the next eight rows are
 * prefetched as one stream, 8 * bb bytes a block (measured, q4_0 rows of
 * 1536 from memory, 2 threads: 17 GB/s, where gemv_0 made 10-12).  The
 * same sums and the same f32 operations as gemv_0 (qg_gemm's, in the same
 * order). */
AI void gemv_4x(const int kind, const int R, const uint8_t *w, size_t rb, int64_t n_in,
                const qmm_q8 *x, int64_t ldx, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    const int q5 = kind >= 50, has_m = kind == 41 || kind == 51;
    const int bb = kind == 40 ? 18 : kind == 41 ? 20 : kind == 50 ? 22 : 24;
    const int qo = kind == 40 ? 2 : kind == 41 ? 4 : kind == 50 ? 6 : 8, ho = has_m ? 4 : 2;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i b4 = _mm256_set1_epi32(0x10101010), spread = _mm256_set1_epi32(0x02040810),
                  f4 = _mm256_set1_epi32(15);
    /* per 128-bit lane: the four dwords' low halves (d), then their high
     * halves (m of q4_1 and q5_1) */
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                          1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    int64_t nb = n_in / 32;
    for (int64_t o = o0; o < o1; o += 8) {
        const uint8_t *rp[8];
        for (int i = 0; i < 8; i++)
            rp[i] = w + (size_t)(o + i < o1 ? o + i : o1 - 1) * rb;
        __m256 acc[QG_R];
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const size_t at = (size_t)b * (size_t)bb;
            const char *ahead = (const char *)(rp[0] + 8 * rb) + 8 * at;
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            _mm_prefetch(ahead + 128, _MM_HINT_T0);
#define LD2(i, j)                                                                                  \
    _mm256_inserti128_si256(                                                                       \
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(rp[i] + at + qo))), \
        _mm_loadu_si128((const __m128i *)(const void *)(rp[j] + at + qo)), 1)
            __m256i r0 = LD2(0, 4), r1 = LD2(1, 5), r2 = LD2(2, 6), r3 = LD2(3, 7);
#undef LD2
            __m256i a0 = _mm256_unpacklo_epi32(r0, r1), a1 = _mm256_unpackhi_epi32(r0, r1);
            __m256i a2 = _mm256_unpacklo_epi32(r2, r3), a3 = _mm256_unpackhi_epi32(r2, r3);
            __m256i v[4] = {_mm256_unpacklo_epi64(a0, a2), _mm256_unpackhi_epi64(a0, a2),
                            _mm256_unpacklo_epi64(a1, a3), _mm256_unpackhi_epi64(a1, a3)};
            __m256i lo[4], hi[4];
            for (int c = 0; c < 4; c++) {
                lo[c] = _mm256_and_si256(v[c], m4);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16(v[c], 4), m4);
            }
            __m256i g, qh;
            rows_dw(rp, at, ho, &g, &qh);
            if (q5) { /* bit 4c+e (16+4c+e) of the mask to bit 4 of lo[c] (hi[c]) byte e */
                for (int c = 0; c < 4; c++) {
                    __m256i tl = _mm256_and_si256(_mm256_srli_epi32(qh, 4 * c), f4);
                    __m256i th = _mm256_and_si256(_mm256_srli_epi32(qh, 16 + 4 * c), f4);
                    lo[c] = _mm256_or_si256(lo[c],
                                            _mm256_and_si256(_mm256_mullo_epi32(tl, spread), b4));
                    hi[c] = _mm256_or_si256(hi[c],
                                            _mm256_and_si256(_mm256_mullo_epi32(th, spread), b4));
                }
            }
            g = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, pick), 0xd8);
            __m256 dv = _mm256_cvtph_ps(_mm256_castsi256_si128(g));
            __m256 bv = has_m ? _mm256_cvtph_ps(_mm256_extracti128_si256(g, 1))
                              : _mm256_mul_ps(dv, _mm256_set1_ps(q5 ? -16.0f : -8.0f));
            for (int r = 0; r < R; r++) {
                const qmm_q8 *xb = &x[r * ldx + b];
                __m256i sl = _mm256_maddubs_epi16(lo[0], bc32(xb->q)),
                        sh = _mm256_maddubs_epi16(hi[0], bc32(xb->q + 16));
                for (int c = 1; c < 4; c++) {
                    sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[c], bc32(xb->q + 4 * c)));
                    sh =
                        _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[c], bc32(xb->q + 16 + 4 * c)));
                }
                __m256i is =
                    q5 ? _mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones))
                       : _mm256_madd_epi16(_mm256_add_epi16(sl, sh), ones);
                __m256 iv = _mm256_cvtepi32_ps(is);
                acc[r] = _mm256_fmadd_ps(iv, _mm256_mul_ps(dv, _mm256_set1_ps(xb->d)), acc[r]);
                acc[r] = _mm256_fmadd_ps(bv, _mm256_set1_ps(xb->s), acc[r]);
            }
        }
        for (int r = 0; r < R; r++)
            store8(acc[r], o1 - o < 8 ? (int)(o1 - o) : 8, y + r * ldy + o);
    }
}

/* the entry points: one function per (type, row count), the kernels
 * instantiated with constant R */
typedef void (*gemv_fn)(const uint8_t *w, size_t rb, int64_t n_in, const uint8_t *x, size_t ldx,
                        int64_t o0, int64_t o1, float *y, int64_t ldy);
#define GEMV_K(KIND, R)                                                                       \
    static void gemv_k##KIND##_##R(const uint8_t *w, size_t rb, int64_t n, const uint8_t *x,  \
                                   size_t ldx, int64_t o0, int64_t o1, float *y, int64_t ldy) \
    {                                                                                         \
        gemv_k(KIND, R, w, rb, n, (const qg_q8k *)(const void *)x,                            \
               (int64_t)(ldx / sizeof(qg_q8k)), o0, o1, y, ldy);                              \
    }
#define GEMV_0(KIND, R)                                                                       \
    static void gemv_0##KIND##_##R(const uint8_t *w, size_t rb, int64_t n, const uint8_t *x,  \
                                   size_t ldx, int64_t o0, int64_t o1, float *y, int64_t ldy) \
    {                                                                                         \
        const qmm_q8 *xq = (const qmm_q8 *)(const void *)x;                                   \
        int64_t ld = (int64_t)(ldx / sizeof(qmm_q8));                                         \
        if (KIND == 80)                                                                       \
            gemv_0(R, w, rb, n, xq, ld, o0, o1, y, ldy);                                      \
        else                                                                                  \
            gemv_4x(KIND, R, w, rb, n, xq, ld, o0, o1, y, ldy);                               \
    }
#define GEMV_ALL(M, KIND) M(KIND, 1) M(KIND, 2) M(KIND, 3) M(KIND, 4)
GEMV_ALL(GEMV_K, 4)
GEMV_ALL(GEMV_K, 5)
GEMV_ALL(GEMV_K, 6)
GEMV_ALL(GEMV_0, 40)
GEMV_ALL(GEMV_0, 41)
GEMV_ALL(GEMV_0, 50)
GEMV_ALL(GEMV_0, 51)
GEMV_ALL(GEMV_0, 80)
#define GEMV_TAB(P, KIND)                                        \
    {                                                            \
        NULL, P##KIND##_1, P##KIND##_2, P##KIND##_3, P##KIND##_4 \
    }

void qg_gemv_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                  size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    static const gemv_fn k4[] = GEMV_TAB(gemv_k, 4), k5[] = GEMV_TAB(gemv_k, 5),
                         k6[] = GEMV_TAB(gemv_k, 6), q40[] = GEMV_TAB(gemv_0, 40),
                         q41[] = GEMV_TAB(gemv_0, 41), q50[] = GEMV_TAB(gemv_0, 50),
                         q51[] = GEMV_TAB(gemv_0, 51), q80[] = GEMV_TAB(gemv_0, 80);
    const gemv_fn *f;
    switch (t) {
    case CB_TYPE_Q4_0: f = q40; break;
    case CB_TYPE_Q4_1: f = q41; break;
    case CB_TYPE_Q5_0: f = q50; break;
    case CB_TYPE_Q5_1: f = q51; break;
    case CB_TYPE_Q8_0: f = q80; break;
    case CB_TYPE_Q4_K: f = k4; break;
    case CB_TYPE_Q5_K: f = k5; break;
    case CB_TYPE_Q6_K: f = k6; break;
    default: return;
    }
    for (int r = 0; r < nr; r += QG_R) {
        int n = nr - r < QG_R ? nr - r : QG_R;
        f[n](w, row_bytes, n_in, xq + (size_t)r * ldxq, ldxq, o0, o1, y + r * ldy, ldy);
    }
}

/* ------------------------------------------------ the packer's decoder */

AI float f16(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* qg_decode_c's integers and scales, the integers 32 at a time */
void qg_decode_avx2(cb_type t, const uint8_t *b, int8_t *q, qg_scales *o)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    switch (t) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1:
    case CB_TYPE_Q8_0: {
        __m256i v = t == CB_TYPE_Q4_0   ? nib16(b + 2)
                    : t == CB_TYPE_Q4_1 ? nib16(b + 4)
                    : t == CB_TYPE_Q5_0 ? _mm256_or_si256(nib16(b + 6), bits16(rd32(b + 2)))
                    : t == CB_TYPE_Q5_1 ? _mm256_or_si256(nib16(b + 8), bits16(rd32(b + 4)))
                                        : ld(b + 2);
        _mm256_storeu_si256((__m256i *)(void *)q, v);
        o->d = f16(b);
        /* qmm_group8's offsets: -8 d, m, -16 d, m, 0 */
        o->dmin = t == CB_TYPE_Q4_0   ? -8.0f * o->d
                  : t == CB_TYPE_Q5_0 ? -16.0f * o->d
                  : t == CB_TYPE_Q8_0 ? 0.0f
                                      : f16(b + 2);
        return;
    }
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K: {
        int k5 = t == CB_TYPE_Q5_K;
        const uint8_t *qs = b + (k5 ? 48 : 16);
        __m256i hb = k5 ? ld(b + 16) : _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i v = ld(qs + 32 * p);
            __m256i lo = _mm256_and_si256(v, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (k5) {
                const __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(
                    lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * p), one), 4));
                hi = _mm256_or_si256(
                    hi,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * p + 1), one), 4));
            }
            _mm256_storeu_si256((__m256i *)(void *)(q + 64 * p), lo);
            _mm256_storeu_si256((__m256i *)(void *)(q + 64 * p + 32), hi);
        }
        /* the twelve bytes of 6-bit scales and mins, four at a time (kblock) */
        uint32_t w0 = rd32(b + 4), w1 = rd32(b + 8), w2 = rd32(b + 12);
        uint32_t sc4[2] = {w0 & 0x3f3f3f3fu, (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4};
        uint32_t m4b[2] = {w1 & 0x3f3f3f3fu, ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u)
                                                                             << 4};
        for (int s = 0; s < 8; s++) {
            o->sc[s] = (int16_t)((sc4[s >> 2] >> (8 * (s & 3))) & 0xff);
            o->mn[s] = (int16_t)((m4b[s >> 2] >> (8 * (s & 3))) & 0xff);
        }
        o->d = f16(b), o->dmin = f16(b + 2);
        return;
    }
    case CB_TYPE_Q6_K: {
        const __m256i m2 = _mm256_set1_epi8(3);
        for (int n = 0; n < 2; n++) {
            __m256i la = ld(b + 64 * n), lb = ld(b + 64 * n + 32), h = ld(b + 128 + 32 * n);
            for (int k = 0; k < 4; k++) {
                __m256i l = k & 1 ? lb : la;
                l = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(l, 4) : l, m4);
                __m256i hh = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m2);
                _mm256_storeu_si256((__m256i *)(void *)(q + 128 * n + 32 * k),
                                    _mm256_or_si256(l, _mm256_slli_epi16(hh, 4)));
            }
        }
        const int8_t *sc = (const int8_t *)b + 192;
        for (int k = 0; k < 16; k++)
            o->sc[k] = sc[k], o->mn[k] = (int16_t)(32 * sc[k]);
        o->d = f16(b + 208), o->dmin = 0;
        return;
    }
    default: return;
    }
}

/* ------------------------------------------------------- the packer */

/* a 32-element block's integers as 32 bytes (qg_decode_c's), and its d and
 * offset */
AI __m256i dec32(cb_type t, const uint8_t *b, float *d, float *off)
{
    *d = f16(b);
    switch (t) {
    case CB_TYPE_Q4_0: *off = -8.0f * *d; return nib16(b + 2);
    case CB_TYPE_Q4_1: *off = f16(b + 2); return nib16(b + 4);
    case CB_TYPE_Q5_0:
        *off = -16.0f * *d;
        return _mm256_or_si256(nib16(b + 6), bits16(rd32(b + 2)));
    case CB_TYPE_Q5_1: *off = f16(b + 2); return _mm256_or_si256(nib16(b + 8), bits16(rd32(b + 4)));
    default: *off = 0.0f; return ld(b + 2); /* q8_0 */
    }
}

/* qg_pack for the 32-element types: each row's blocks decoded straight
 * through a chunk (one stream), then each block's eight rows transposed
 * into place, its d and offsets stored as vectors */
static void pack32(cb_type t, const uint8_t *w, size_t rb, int64_t nb, int64_t o0, int nr,
                   uint8_t *dst, int p)
{
    enum { CH = 32 };
    const size_t bb = cb_type_row_bytes(t, 32), pbb = (size_t)QG_OFF_0_BYTES * (size_t)p;
    __m256i v[CH][8];
    float d[CH][8], off[CH][8];
    for (int h = 0; h < p; h += 8)
        for (int64_t b0 = 0; b0 < nb; b0 += CH) {
            int nbc = nb - b0 < CH ? (int)(nb - b0) : CH;
            for (int ii = 0; ii < 8; ii++) {
                int i = h + ii;
                const uint8_t *row = w + (size_t)(o0 + (i < nr ? i : 0)) * rb + (size_t)b0 * bb;
                for (int b = 0; b < nbc; b++) {
                    if (i >= nr) { /* past the panel's rows: zeros */
                        v[b][ii] = _mm256_setzero_si256();
                        d[b][ii] = off[b][ii] = 0.0f;
                        continue;
                    }
                    if ((b & 3) == 0)
                        _mm_prefetch((const char *)(row + (size_t)b * bb + 2048), _MM_HINT_T0);
                    v[b][ii] = dec32(t, row + (size_t)b * bb, &d[b][ii], &off[b][ii]);
                }
            }
            for (int b = 0; b < nbc; b++) {
                uint8_t *o = dst + (size_t)(b0 + b) * pbb;
                __m256i tr[8];
                transpose8(v[b], tr);
                for (int c = 0; c < 8; c++)
                    _mm256_storeu_si256((__m256i *)(void *)(o + 4 * (c * p + h)), tr[c]);
                _mm256_storeu_ps((float *)(void *)(o + 4 * (QG_OFF_0_D / 4 * p + h)),
                                 _mm256_loadu_ps(d[b]));
                _mm256_storeu_ps((float *)(void *)(o + 4 * (QG_OFF_0_B / 4 * p + h)),
                                 _mm256_loadu_ps(off[b]));
            }
        }
}

/* qg_pack for the K-quants: each row's blocks decoded straight through a
 * chunk, its scales stored in place, then each block interleaved */
static void packk(cb_type t, const uint8_t *w, size_t rb, int64_t nb, int64_t o0, int nr,
                  uint8_t *dst, qg_layout l)
{
    enum { QBUF = 32768 };
    const int p = l.p, ch = QBUF / (256 * p), q6 = t == CB_TYPE_Q6_K;
    const size_t bb = cb_type_row_bytes(t, 256),
                 pbb = (size_t)p * (q6 ? QG_OFF_K6_BYTES : QG_OFF_K45_BYTES);
    const int ns = q6 ? 16 : 8, mn_off = q6 ? QG_OFF_K6_MN : QG_OFF_K45_MN,
              d_off = q6 ? QG_OFF_K6_D : QG_OFF_K45_D;
    int8_t q[QBUF];
    if (nr < p)
        memset(q, 0, sizeof q);
    for (int64_t b0 = 0; b0 < nb; b0 += ch) {
        int nbc = nb - b0 < ch ? (int)(nb - b0) : ch;
        for (int i = 0; i < nr; i++) {
            const uint8_t *row = w + (size_t)(o0 + i) * rb + (size_t)b0 * bb;
            for (int b = 0; b < nbc; b++) {
                uint8_t *o = dst + (size_t)(b0 + b) * pbb;
                qg_scales sc;
                _mm_prefetch((const char *)(row + (size_t)b * bb + 2048), _MM_HINT_T0);
                qg_decode_avx2(t, row + (size_t)b * bb, q + (b * p + i) * 256, &sc);
                for (int k = 0; k < ns; k++) {
                    int32_t v =
                        l.sc32 ? sc.sc[k] : (int32_t)((uint32_t)(uint16_t)sc.sc[k] * 0x10001u);
                    memcpy(o + 4 * ((QG_OFF_K_SC / 4 + k) * p + i), &v, 4);
                }
                for (int k = 0; k < ns / 2; k++) {
                    int16_t m2[2] = {sc.mn[2 * k], sc.mn[2 * k + 1]};
                    memcpy(o + 4 * ((mn_off / 4 + k) * p + i), m2, 4);
                }
                memcpy(o + 4 * (d_off / 4 * p + i), &sc.d, 4);
                memcpy(o + 4 * ((d_off / 4 + 1) * p + i), &sc.dmin, 4);
            }
        }
        for (int b = 0; b < nbc; b++)
            qg_interleave_avx2(q + b * p * 256, 256, p, dst + (size_t)(b0 + b) * pbb);
    }
}

void qg_pack_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int nr,
                  uint8_t *dst, qg_layout l)
{
    int k = qg_is_k(t);
    int64_t nb = n_in / (k ? 256 : 32);
    if (nr < l.p) /* the missing rows' scales and offsets: zero */
        memset(dst, 0, qg_panel_bytes(t, n_in, l.p));
    if (k)
        packk(t, w, row_bytes, nb, o0, nr, dst, l);
    else
        pack32(t, w, row_bytes, nb, o0, nr, dst, l.p);
}

/* --------------------------------------------- the blocked kernel (AVX2) */

#define QGT_GEMM qg_gemm_avx2
#define QGT_P 8
#define QGT_VNNI 0
typedef __m256i vi;
typedef __m256 vf;
#define VI_LD(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define VI_BC32(p) bc32(p)
#define VI_ZERO _mm256_setzero_si256()
#define VI_SET16(v) _mm256_set1_epi16(v)
#define VI_ADD16 _mm256_add_epi16
#define VI_ADD32 _mm256_add_epi32
#define VI_SUB32 _mm256_sub_epi32
#define VI_MADD _mm256_madd_epi16
#define VI_MADDUBS _mm256_maddubs_epi16
/* |w| times x with w's sign: no 16-bit pair can overflow (2 * 128 * 127 < 32768) */
#define VI_SDOT(acc, w, x)                                                                \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w),  \
                                                                 _mm256_sign_epi8(x, w)), \
                                            _mm256_set1_epi16(1)))
#define VF_LD(p) _mm256_loadu_ps((const float *)(const void *)(p))
#define VF_ZERO _mm256_setzero_ps()
#define VF_SET1 _mm256_set1_ps
#define VF_MUL _mm256_mul_ps
#define VF_FMADD _mm256_fmadd_ps
#define VF_FNMADD _mm256_fnmadd_ps
#define VF_CVT _mm256_cvtepi32_ps
#define VF_ST(p, v) _mm256_storeu_ps(p, v)
#include "qgemm_tile.h"

/* and the few-row kernel of qgemm_rows.h, vpdpbusd's four products a lane
 * as vpmaddubsw + vpmaddwd: the same 32-bit sums where no 16-bit pair of
 * products passes 32767, so for weights of 6 bits or fewer (2 * 63 * 127 <
 * 32768).  q8_0's come to it as w + 128 and would: its rows go to the
 * one-row kernel (qg_rows_avx2 below). */
#define QI(f) f
#define DPB(acc, w, x) \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
#define QGR_NAME rows_avx2
static void rows_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                      const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y,
                      int64_t ldy);
#include "qgemm_rows.h"

void qg_rows_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                  size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    if (t == CB_TYPE_Q8_0)
        qg_gemv_avx2(t, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy);
    else
        rows_avx2(t, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy);
}
#endif
