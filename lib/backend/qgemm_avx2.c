/* qgemm_avx2.c - the AVX2 kernels of qgemm.h (compiled with -mavx2 -mfma
 * whatever the build's -march; qg_select calls them only on a CPU that has
 * them).
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

/* the part offsets of a packed block (qgemm.c's enum) */
enum {
    K_SC = 2048, K45_MN = 2048 + 256, K45_D = 2048 + 256 + 128, K45_BYTES = 2048 + 256 + 128 + 64,
    K6_MN = 2048 + 512, K6_D = 2048 + 512 + 256, K6_BYTES = 2048 + 512 + 256 + 64,
    B0_D = 256, B0_B = 288, B0_BYTES = 320,
};

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

AI __m256i ld(const uint8_t *p)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

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
                q[k] = _mm256_and_si256(_mm256_cvtps_epi32(v), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
            }
            /* the packs interleave 128-bit lanes: put the dwords back in order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(void *)(xq->q + 32 * s), p);
            /* sums of 8 bytes each: biased to unsigned, vpsadbw, unbiased */
            __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(p, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
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

/* qg_interleave_c: eight rows' 32-byte pieces transposed as 8 x 8 dwords */
void qg_interleave_avx2(const int8_t *q, int n, uint8_t *dst)
{
    for (int c = 0; c < n; c += 32, dst += 32 * QG_P) {
        __m256i r[8], a[8], b[8];
        for (int i = 0; i < 8; i++)
            r[i] = _mm256_loadu_si256((const __m256i *)(const void *)(q + i * n + c));
        for (int i = 0; i < 8; i += 2) {
            a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]); /* r0[0] r1[0] r0[1] r1[1] | r0[4] ... */
            a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
            b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);     /* dword 0 of rows i..i+3 | dword 4 */
            b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]); /* dword 1 | 5 */
            b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]); /* 2 | 6 */
            b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]); /* 3 | 7 */
        }
        for (int d = 0; d < 4; d++) {
            _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * d), _mm256_permute2x128_si256(b[d], b[4 + d], 0x20));
            _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * (d + 4)),
                                _mm256_permute2x128_si256(b[d], b[4 + d], 0x31));
        }
    }
}

/* ------------------------------------------------------------- kernels */

/* the R rows' 8 results (lanes past np not stored) */
AI void store_rows(const __m256 *acc, int R, int np, float *y, int64_t ldy)
{
    for (int r = 0; r < R; r++) {
        if (np == QG_P) {
            _mm256_storeu_ps(y + r * ldy, acc[r]);
        } else {
            float t[8];
            _mm256_storeu_ps(t, acc[r]);
            memcpy(y + r * ldy, t, sizeof(float) * (size_t)np);
        }
    }
}

/* K-quant panel x R activation rows.  kind 4: q4_K (8 chunks a 16-bit
 * sum), 5: q5_K (4), 6: q6_K (2, scales per 16, the -32 in mn) */
AI void tile_k(const int kind, const int R, const uint8_t *panel, int64_t nb, const uint8_t *x0, size_t ldx,
               float *y, int64_t ldy, int np)
{
    const int bb = kind == 6 ? K6_BYTES : K45_BYTES, per = kind == 4 ? 8 : kind == 5 ? 4 : 2;
    __m256 acc[QG_R];
    const qg_q8k *xr[QG_R];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        xr[r] = (const qg_q8k *)(const void *)(x0 + (size_t)r * ldx);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * (size_t)bb;
        __m256i iacc[QG_R];
        for (int r = 0; r < R; r++)
            iacc[r] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const uint8_t *ws = blk + 256 * s;
            for (int k0 = 0; k0 < 8; k0 += per) {
                __m256i a16[QG_R];
                for (int r = 0; r < R; r++)
                    a16[r] = _mm256_setzero_si256();
                for (int k = k0; k < k0 + per; k++) {
                    __m256i w = ld(ws + 32 * k);
                    for (int r = 0; r < R; r++) {
                        a16[r] = _mm256_add_epi16(a16[r], _mm256_maddubs_epi16(w, bc32(xr[r][b].q + 32 * s + 4 * k)));
                        PIN(a16[r]);
                    }
                }
                /* q6_K: chunks 0-3 are sub-block 2s of 16, 4-7 are 2s+1 */
                __m256i sc = ld(blk + K_SC + 32 * (kind == 6 ? 2 * s + (k0 >= 4) : s));
                for (int r = 0; r < R; r++) {
                    iacc[r] = _mm256_add_epi32(iacc[r], _mm256_madd_epi16(a16[r], sc));
                    PIN(iacc[r]);
                }
            }
        }
        if (kind == 6) {
            for (int p = 0; p < 8; p++) {
                __m256i mn = ld(blk + K6_MN + 32 * p);
                for (int r = 0; r < R; r++) {
                    iacc[r] = _mm256_sub_epi32(iacc[r], _mm256_madd_epi16(mn, bc32(&xr[r][b].bs16[2 * p])));
                    PIN(iacc[r]);
                }
            }
            __m256 dv = _mm256_loadu_ps((const float *)(const void *)(blk + K6_D));
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_mul_ps(dv, _mm256_set1_ps(xr[r][b].d)),
                                         acc[r]);
        } else {
            __m256i mi[QG_R];
            for (int r = 0; r < R; r++)
                mi[r] = _mm256_setzero_si256();
            for (int p = 0; p < 4; p++) {
                __m256i mn = ld(blk + K45_MN + 32 * p);
                for (int r = 0; r < R; r++) {
                    mi[r] = _mm256_add_epi32(mi[r], _mm256_madd_epi16(mn, bc32(&xr[r][b].bs32[2 * p])));
                    PIN(mi[r]);
                }
            }
            __m256 dv = _mm256_loadu_ps((const float *)(const void *)(blk + K45_D));
            __m256 mv = _mm256_loadu_ps((const float *)(const void *)(blk + K45_D + 32));
            for (int r = 0; r < R; r++) {
                __m256 dx = _mm256_set1_ps(xr[r][b].d);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r]), _mm256_mul_ps(dv, dx), acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mi[r]), _mm256_mul_ps(mv, dx), acc[r]);
            }
        }
    }
    store_rows(acc, R, np, y, ldy);
}

/* 32-element panel x R rows.  kind 4: 4-bit unsigned (8 chunks a 16-bit
 * sum), 5: 5-bit (4), 8: q8_0's signed bytes (|w| times x with w's sign,
 * a 32-bit sum a chunk) */
AI void tile_0(const int kind, const int R, const uint8_t *panel, int64_t nb, const uint8_t *x0, size_t ldx,
               float *y, int64_t ldy, int np)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[QG_R];
    const qmm_q8 *xr[QG_R];
    for (int r = 0; r < R; r++) {
        acc[r] = _mm256_setzero_ps();
        xr[r] = (const qmm_q8 *)(const void *)(x0 + (size_t)r * ldx);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * B0_BYTES;
        __m256i is[QG_R];
        for (int r = 0; r < R; r++)
            is[r] = _mm256_setzero_si256();
        if (kind == 8) {
            for (int k = 0; k < 8; k++) {
                __m256i w = ld(blk + 32 * k), aw = _mm256_sign_epi8(w, w);
                for (int r = 0; r < R; r++) {
                    __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bc32(xr[r][b].q + 4 * k), w));
                    is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(p, ones));
                    PIN(is[r]);
                }
            }
        } else {
            const int per = kind == 4 ? 8 : 4;
            for (int k0 = 0; k0 < 8; k0 += per) {
                __m256i a16[QG_R];
                for (int r = 0; r < R; r++)
                    a16[r] = _mm256_setzero_si256();
                for (int k = k0; k < k0 + per; k++) {
                    __m256i w = ld(blk + 32 * k);
                    for (int r = 0; r < R; r++) {
                        a16[r] = _mm256_add_epi16(a16[r], _mm256_maddubs_epi16(w, bc32(xr[r][b].q + 4 * k)));
                        PIN(a16[r]);
                    }
                }
                for (int r = 0; r < R; r++) {
                    is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(a16[r], ones));
                    PIN(is[r]);
                }
            }
        }
        __m256 dv = _mm256_loadu_ps((const float *)(const void *)(blk + B0_D));
        __m256 bv = _mm256_loadu_ps((const float *)(const void *)(blk + B0_B));
        for (int r = 0; r < R; r++) {
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r]), _mm256_mul_ps(dv, _mm256_set1_ps(xr[r][b].d)), acc[r]);
            acc[r] = _mm256_fmadd_ps(bv, _mm256_set1_ps(xr[r][b].s), acc[r]);
        }
    }
    store_rows(acc, R, np, y, ldy);
}

/* ------------------------------------------- one activation row (decode) */

/* lane i = the sum of v[i]'s eight lanes (exact: 32-bit integers) */
AI __m256i tree8(const __m256i *v)
{
    __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
    __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
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
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                          3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16));
}

/* in every 16-bit lane of both halves, 16-bit lane k of s's low half */
static const uint8_t bcast16_idx[8][32] = {
#define I(k) {2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k,   \
              2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, \
              2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1}
    I(0), I(1), I(2), I(3), I(4), I(5), I(6), I(7)
#undef I
};

/* One K block of one weight row against x: the block's integer sum
 * sum_s sc_s sum_j w[j] q[j] spread over 8 lanes (*vi) and the offsets'
 * sum_s m_s bs32_s over 4 (*vm).  kind 4: q4_K, 5: q5_K, 6: q6_K (whose
 * -32 * sc offsets come off vi; vm stays 0). */
AI void kblock(const int kind, const uint8_t *b, const qg_q8k *x, __m256i *vi, __m256i *vm)
{
    __m256i acc = _mm256_setzero_si256();
    if (kind == 6) {
        __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)));
        const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                              2, 3, 2, 3, 2, 3, 2, 3);
        for (int n = 0; n < 2; n++) {
            __m256i la = ld(b + 64 * n), lb = ld(b + 64 * n + 32), h = ld(b + 128 + 32 * n);
            const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
            for (int k = 0; k < 4; k++) {
                __m256i l = k & 1 ? lb : la;
                l = _mm256_and_si256(k & 2 ? _mm256_srli_epi16(l, 4) : l, m4);
                __m256i hh = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m2);
                __m256i q = _mm256_or_si256(l, _mm256_slli_epi16(hh, 4));
                __m256i p = _mm256_maddubs_epi16(q, ld((const uint8_t *)x->q + 128 * n + 32 * k));
                /* sub-blocks 8n+2k (elements 0-15: the low half) and 8n+2k+1 */
                __m256i s = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(4 * n + k)), pick);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
            }
        }
        __m256i off = _mm256_madd_epi16(_mm256_slli_epi16(sc, 5), ld((const uint8_t *)x->bs16));
        *vi = _mm256_sub_epi32(acc, off);
        *vm = _mm256_setzero_si256();
        return;
    }
    uint32_t w0 = rd32(b + 4), w1 = rd32(b + 8), w2 = rd32(b + 12);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_lo = w1 & 0x3f3f3f3fu, m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    __m256i scm = _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi));
    __m256i sc2 = _mm256_permute2x128_si256(scm, scm, 0x00); /* sc0..7 in both halves */
    __m128i mm = _mm_madd_epi16(_mm256_extracti128_si256(scm, 1), _mm_loadu_si128((const __m128i *)(const void *)x->bs32));
    *vm = _mm256_set_m128i(_mm_setzero_si128(), mm);
    __m256i hb = kind == 5 ? ld(b + 16) : _mm256_setzero_si256();
    const uint8_t *qs = b + (kind == 5 ? 48 : 16);
    for (int p = 0; p < 4; p++) {
        __m256i q = ld(qs + 32 * p);
        __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(15)), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(15));
        if (kind == 5) {
            const __m256i one = _mm256_set1_epi8(1);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * p), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * p + 1), one), 4));
        }
        __m256i p0 = _mm256_maddubs_epi16(lo, ld((const uint8_t *)x->q + 64 * p));
        __m256i p1 = _mm256_maddubs_epi16(hi, ld((const uint8_t *)x->q + 64 * p + 32));
        __m256i s0 = _mm256_shuffle_epi8(sc2, ld(bcast16_idx[2 * p])), s1 = _mm256_shuffle_epi8(sc2, ld(bcast16_idx[2 * p + 1]));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
    }
    *vi = acc;
}

/* K-quant rows [o0, o1) against one activation row, eight rows at a time
 * (the last group's missing rows repeat its last row, not stored): per
 * block, the eight rows' integer sums as one vector (tree8), then
 * qg_gemm's two fused multiply-adds, lane by lane */
AI void gemv_k(const int kind, const uint8_t *w, size_t rb, int64_t n_in, const qg_q8k *x, int64_t o0, int64_t o1,
               float *y)
{
    const size_t bb = kind == 4 ? 144 : kind == 5 ? 176 : 210;
    int64_t nb = n_in / 256;
    for (int64_t o = o0; o < o1; o += 8) {
        const uint8_t *row[8];
        for (int i = 0; i < 8; i++)
            row[i] = w + (size_t)(o + i < o1 ? o + i : o1 - 1) * rb;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i vi[8], vm[8];
            uint16_t dh[8], mh[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *blk = row[i] + (size_t)b * bb;
                kblock(kind, blk, x + b, &vi[i], &vm[i]);
                dh[i] = rd16(blk + (kind == 6 ? 208 : 0));
                mh[i] = kind == 6 ? 0 : rd16(blk + 2);
            }
            __m256 dx = _mm256_set1_ps(x[b].d);
            __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)dh));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tree8(vi)), _mm256_mul_ps(dv, dx), acc);
            if (kind != 6) {
                __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)mh));
                acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(tree8(vm)), _mm256_mul_ps(mv, dx), acc);
            }
        }
        store_rows(&acc, 1, o1 - o < 8 ? (int)(o1 - o) : 8, y + o, 0);
    }
}

/* 32-element rows [o0, o1) against one activation row (qmm_q8), eight at
 * a time as gemv_k.  kind 40: q4_0, 41: q4_1, 50: q5_0, 51: q5_1, 80: q8_0 */
AI void gemv_0(const int kind, const uint8_t *w, size_t rb, int64_t n_in, const qmm_q8 *x, int64_t o0, int64_t o1,
               float *y)
{
    const size_t bb = kind == 40 ? 18 : kind == 41 ? 20 : kind == 50 ? 22 : kind == 51 ? 24 : 34;
    const __m256i ones = _mm256_set1_epi16(1);
    int64_t nb = n_in / 32;
    for (int64_t o = o0; o < o1; o += 8) {
        const uint8_t *row[8];
        for (int i = 0; i < 8; i++)
            row[i] = w + (size_t)(o + i < o1 ? o + i : o1 - 1) * rb;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i vi[8], xv = ld((const uint8_t *)x[b].q);
            uint16_t dh[8], mh[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t *blk = row[i] + (size_t)b * bb;
                __m256i p;
                dh[i] = rd16(blk);
                mh[i] = rd16(blk + 2);
                if (kind == 80) {
                    __m256i q = ld(blk + 2);
                    p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
                } else {
                    __m256i q = kind == 40   ? nib16(blk + 2)
                                : kind == 41 ? nib16(blk + 4)
                                : kind == 50 ? _mm256_or_si256(nib16(blk + 6), bits16(rd32(blk + 2)))
                                             : _mm256_or_si256(nib16(blk + 8), bits16(rd32(blk + 4)));
                    p = _mm256_maddubs_epi16(q, xv);
                }
                vi[i] = _mm256_madd_epi16(p, ones);
            }
            __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)dh));
            __m256 bv = kind == 41 || kind == 51 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)mh))
                        : kind == 40         ? _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f))
                        : kind == 50         ? _mm256_mul_ps(dv, _mm256_set1_ps(-16.0f))
                                             : _mm256_setzero_ps();
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tree8(vi)), _mm256_mul_ps(dv, _mm256_set1_ps(x[b].d)), acc);
            acc = _mm256_fmadd_ps(bv, _mm256_set1_ps(x[b].s), acc);
        }
        store_rows(&acc, 1, o1 - o < 8 ? (int)(o1 - o) : 8, y + o, 0);
    }
}

static void gemv_q4k(const uint8_t *w, size_t rb, int64_t n, const uint8_t *x, int64_t o0, int64_t o1, float *y)
{
    gemv_k(4, w, rb, n, (const qg_q8k *)(const void *)x, o0, o1, y);
}
static void gemv_q5k(const uint8_t *w, size_t rb, int64_t n, const uint8_t *x, int64_t o0, int64_t o1, float *y)
{
    gemv_k(5, w, rb, n, (const qg_q8k *)(const void *)x, o0, o1, y);
}
static void gemv_q6k(const uint8_t *w, size_t rb, int64_t n, const uint8_t *x, int64_t o0, int64_t o1, float *y)
{
    gemv_k(6, w, rb, n, (const qg_q8k *)(const void *)x, o0, o1, y);
}
#define GEMV0(NAME, KIND)                                                                                        \
    static void gemv_##NAME(const uint8_t *w, size_t rb, int64_t n, const uint8_t *x, int64_t o0, int64_t o1,     \
                            float *y)                                                                            \
    {                                                                                                            \
        gemv_0(KIND, w, rb, n, (const qmm_q8 *)(const void *)x, o0, o1, y);                                      \
    }
GEMV0(q4_0, 40)
GEMV0(q4_1, 41)
GEMV0(q5_0, 50)
GEMV0(q5_1, 51)
GEMV0(q8_0, 80)

void qg_gemv_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq, int64_t o0,
                  int64_t o1, float *y)
{
    switch (t) {
    case CB_TYPE_Q4_0: gemv_q4_0(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q4_1: gemv_q4_1(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q5_0: gemv_q5_0(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q5_1: gemv_q5_1(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q8_0: gemv_q8_0(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q4_K: gemv_q4k(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q5_K: gemv_q5k(w, row_bytes, n_in, xq, o0, o1, y); break;
    case CB_TYPE_Q6_K: gemv_q6k(w, row_bytes, n_in, xq, o0, o1, y); break;
    default: break;
    }
}

typedef void (*tile_fn)(const uint8_t *panel, int64_t nb, const uint8_t *x0, size_t ldx, float *y, int64_t ldy,
                        int np);

#define TILES(F, KIND)                                                                                           \
    static void F##KIND##_1(const uint8_t *p, int64_t nb, const uint8_t *x, size_t lx, float *y, int64_t ly, int np) \
    {                                                                                                            \
        F(KIND, 1, p, nb, x, lx, y, ly, np);                                                                     \
    }                                                                                                            \
    static void F##KIND##_2(const uint8_t *p, int64_t nb, const uint8_t *x, size_t lx, float *y, int64_t ly, int np) \
    {                                                                                                            \
        F(KIND, 2, p, nb, x, lx, y, ly, np);                                                                     \
    }                                                                                                            \
    static void F##KIND##_3(const uint8_t *p, int64_t nb, const uint8_t *x, size_t lx, float *y, int64_t ly, int np) \
    {                                                                                                            \
        F(KIND, 3, p, nb, x, lx, y, ly, np);                                                                     \
    }                                                                                                            \
    static void F##KIND##_4(const uint8_t *p, int64_t nb, const uint8_t *x, size_t lx, float *y, int64_t ly, int np) \
    {                                                                                                            \
        F(KIND, 4, p, nb, x, lx, y, ly, np);                                                                     \
    }                                                                                                            \
    static const tile_fn F##KIND[QG_R + 1] = {NULL, F##KIND##_1, F##KIND##_2, F##KIND##_3, F##KIND##_4};

TILES(tile_k, 4)
TILES(tile_k, 5)
TILES(tile_k, 6)
TILES(tile_0, 4)
TILES(tile_0, 5)
TILES(tile_0, 8)

void qg_gemm_avx2(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq, int64_t n, int np,
                  float *y, int64_t ldy)
{
    const tile_fn *f;
    int64_t nb;
    switch (t) {
    case CB_TYPE_Q4_K: f = tile_k4, nb = n_in / 256; break;
    case CB_TYPE_Q5_K: f = tile_k5, nb = n_in / 256; break;
    case CB_TYPE_Q6_K: f = tile_k6, nb = n_in / 256; break;
    case CB_TYPE_Q4_0: case CB_TYPE_Q4_1: f = tile_04, nb = n_in / 32; break;
    case CB_TYPE_Q5_0: case CB_TYPE_Q5_1: f = tile_05, nb = n_in / 32; break;
    case CB_TYPE_Q8_0: f = tile_08, nb = n_in / 32; break;
    default: return;
    }
    for (int64_t r = 0; r < n; r += QG_R) {
        int nr = n - r < QG_R ? (int)(n - r) : QG_R;
        f[nr](panel, nb, xq + (size_t)r * ldxq, ldxq, y + r * ldy, ldy, np);
    }
}
#endif
