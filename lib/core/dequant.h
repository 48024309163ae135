/* dequant.h - the per-element formulas of the GGUF block types, written once
 * for the CPU dequantizer (lib/core/quant.c) and the CUDA dequantization
 * kernels (lib/cuda/cuda.cu).  Plain C99 that also compiles as CUDA: every
 * function is CB_HD (host and device), takes the block's bytes and an index
 * inside it, and returns the floats ggml's reference code computes, in the
 * same order of operations, so both backends see bit-identical weights
 * before their own rounding (CUDA then stores them as f16 or bf16).
 *
 * Block layouts (byte offsets, all fields little-endian, read byte by byte
 * so that no alignment is needed):
 *   q4_0  (32, 18 B)  d:f16 @0, qs[16] @2      elem j = lo nibble of qs[j],
 *                                              elem j+16 = hi nibble; (q-8)*d
 *   q4_1  (32, 20 B)  d @0, m @2, qs[16] @4    q*d + m
 *   q5_0  (32, 22 B)  d @0, qh:u32 @2, qs @6   5th bit of elem j is qh bit j;
 *                                              (q-16)*d
 *   q5_1  (32, 24 B)  d @0, m @2, qh @4, qs @8 q*d + m
 *   q8_0  (32, 34 B)  d @0, qs:i8[32] @2       q*d
 *   q4_K  (256, 144 B) d @0, dmin @2, scales[12] @4, qs[128] @16
 *   q5_K  (256, 176 B) d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
 *         8 sub-blocks of 32: x = d*sc*q - dmin*m with 6-bit sc, m packed in
 *         scales[] (see cb_dq_scale_min); elements 64g..64g+31 are the low
 *         nibbles of qs[32g..32g+31], 64g+32.. the high nibbles; q5_K's 5th
 *         bits are qh[l] bit 2g (low half) and bit 2g+1 (high half).
 *   q6_K  (256, 210 B) ql[128] @0, qh[64] @128, scales:i8[16] @192, d @208
 *         two halves of 128; in half n, element l+32k (k = 0..3, l < 32) has
 *         its low 4 bits in ql[64n + l + 32*(k&1)] (low nibble for k < 2,
 *         high for k >= 2), its high 2 bits in qh[32n + l] bits 2k..2k+1 and
 *         its scale in scales[8n + l/16 + 2k]; x = d*sc*(q-32).
 *
 * The unit of work is what both loops want: a pair (q4_0..q5_1 give
 * elements j and j+16 of a block, j < 16; q8_0 one element), a pair of
 * elements 64g+l and 64g+32+l for q4_K/q5_K, four elements of a q6_K half. */
#ifndef CB_DEQUANT_H
#define CB_DEQUANT_H

#include <stdint.h>

#ifdef __CUDACC__
#define CB_HD static __host__ __device__ __forceinline__
#else
#define CB_HD static inline
#include <string.h>
#endif

/* a*b + c and a*b - c rounded twice, as the CPU computes them (built with
 * -ffp-contract=off, C11's rule): nvcc fuses such a pair into one FMA
 * unless told not to, which would move q4_1, q5_1, q4_K and q5_K weights
 * by an ulp on the device */
#ifdef __CUDA_ARCH__
#define CB_DQ_MADD(a, b, c) __fadd_rn(__fmul_rn((a), (b)), (c))
#define CB_DQ_MSUB(a, b, c) __fsub_rn(__fmul_rn((a), (b)), (c))
#else
#define CB_DQ_MADD(a, b, c) ((a) * (b) + (c))
#define CB_DQ_MSUB(a, b, c) ((a) * (b) - (c))
#endif

/* Bytes per block and elements per block of the block types. */
enum {
    CB_QK = 32, /* q4_0 .. q8_0 */
    CB_QK_K = 256,
    CB_Q4_0_BYTES = 18,
    CB_Q4_1_BYTES = 20,
    CB_Q5_0_BYTES = 22,
    CB_Q5_1_BYTES = 24,
    CB_Q8_0_BYTES = 34,
    CB_Q4_K_BYTES = 144,
    CB_Q5_K_BYTES = 176,
    CB_Q6_K_BYTES = 210
};

CB_HD uint16_t cb_dq_rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

CB_HD uint32_t cb_dq_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

CB_HD float cb_dq_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

CB_HD uint32_t cb_dq_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* IEEE half to float, exact: every half is a float.  Branch-free selects. */
CB_HD float cb_dq_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t em = h & 0x7fff;
    /* normal: rebias the exponent from 15 to 127 */
    uint32_t normal = (em << 13) + ((127u - 15u) << 23);
    /* zero and subnormal: em * 2^-24, exact in float */
    uint32_t sub = cb_dq_f32_bits((float)em * 0x1p-24f);
    /* inf and nan, the payload kept */
    uint32_t special = 0x7f800000u | (em & 0x3ff) << 13;
    uint32_t r = em >= 0x7c00 ? special : em >= 0x0400 ? normal : sub;
    return cb_dq_bits_f32(sign | r);
}

CB_HD float cb_dq_bf16(uint16_t h) { return cb_dq_bits_f32((uint32_t)h << 16); }

/* Each type has a header part (the block's scales, decoded once per block
 * or sub-block) and an element part (the quants of one or a few elements
 * with those scales); a loop or a thread calls both. */

CB_HD float cb_dq_d(const uint8_t *b, int off) { return cb_dq_f16(cb_dq_rd16(b + off)); }

/* q4_0: elements j and j+16 (j < 16) from q = qs[j], d = f16 @0 */
CB_HD void cb_dq_q4_0(uint8_t q, float d, float *y0, float *y1)
{
    *y0 = (float)((q & 0x0f) - 8) * d;
    *y1 = (float)((q >> 4) - 8) * d;
}

/* q4_1: q = qs[j] @4, d @0, m @2 */
CB_HD void cb_dq_q4_1(uint8_t q, float d, float m, float *y0, float *y1)
{
    *y0 = CB_DQ_MADD((float)(q & 0x0f), d, m);
    *y1 = CB_DQ_MADD((float)(q >> 4), d, m);
}

/* q5_0: q = qs[j] @6, qh = u32 @2 */
CB_HD void cb_dq_q5_0(uint8_t q, uint32_t qh, int j, float d, float *y0, float *y1)
{
    int h0 = (int)(qh >> j & 1) << 4, h1 = (int)(qh >> (j + 16) & 1) << 4;
    *y0 = (float)(((q & 0x0f) | h0) - 16) * d;
    *y1 = (float)(((q >> 4) | h1) - 16) * d;
}

/* q5_1: q = qs[j] @8, qh = u32 @4, d @0, m @2 */
CB_HD void cb_dq_q5_1(uint8_t q, uint32_t qh, int j, float d, float m, float *y0, float *y1)
{
    int h0 = (int)(qh >> j & 1) << 4, h1 = (int)(qh >> (j + 16) & 1) << 4;
    *y0 = CB_DQ_MADD((float)((q & 0x0f) | h0), d, m);
    *y1 = CB_DQ_MADD((float)((q >> 4) | h1), d, m);
}

/* q8_0: element j from q = qs[j] @2 */
CB_HD float cb_dq_q8_0(int8_t q, float d) { return (float)q * d; }

/* The 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block:
 * sub-blocks 0-3 keep theirs in the low 6 bits of s[j] and s[j+4]; 4-7 keep
 * their low 4 bits in the nibbles of s[j+4] and their top 2 bits in the top
 * bits of s[j-4] (scale) and s[j] (min). */
CB_HD void cb_dq_scale_min(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* q4_K/q5_K group g (< 4) = sub-blocks 2g, 2g+1: f[0..3] = d*sc0, dmin*m0,
 * d*sc1, dmin*m1 (ggml's order of operations: (d*sc)*q - dmin*m) */
CB_HD void cb_dq_k_group(const uint8_t *b, int g, float f[4])
{
    const float d = cb_dq_d(b, 0), dmin = cb_dq_d(b, 2);
    int s0, m0, s1, m1;
    cb_dq_scale_min(2 * g, b + 4, &s0, &m0);
    cb_dq_scale_min(2 * g + 1, b + 4, &s1, &m1);
    f[0] = d * (float)s0;
    f[1] = dmin * (float)m0;
    f[2] = d * (float)s1;
    f[3] = dmin * (float)m1;
}

/* q4_K: elements 64g+l and 64g+32+l from q = qs[32g+l] @16 */
CB_HD void cb_dq_q4_k(uint8_t q, const float f[4], float *y0, float *y1)
{
    *y0 = CB_DQ_MSUB(f[0], (float)(q & 0x0f), f[1]);
    *y1 = CB_DQ_MSUB(f[2], (float)(q >> 4), f[3]);
}

/* q5_K: q = qs[32g+l] @48, qh = qh[l] @16 */
CB_HD void cb_dq_q5_k(uint8_t q, uint8_t qh, int g, const float f[4], float *y0, float *y1)
{
    int h0 = (qh >> (2 * g) & 1) << 4, h1 = (qh >> (2 * g + 1) & 1) << 4;
    *y0 = CB_DQ_MSUB(f[0], (float)((q & 0x0f) | h0), f[1]);
    *y1 = CB_DQ_MSUB(f[2], (float)((q >> 4) | h1), f[3]);
}

/* q6_K half n: ds[k] = d * scales[8n + k] (k < 8), d = f16 @208 */
CB_HD void cb_dq_q6_k_scales(const uint8_t *b, int n, float ds[8])
{
    const float d = cb_dq_d(b, 208);
    for (int k = 0; k < 8; k++)
        ds[k] = d * (float)(int8_t)b[192 + 8 * n + k]; /* ggml's order: (d*sc)*q */
}

/* q6_K: elements 128n + l + 32k (k < 4) of half n from a = ql[64n+l],
 * c = ql[64n+l+32], h = qh[32n+l] */
CB_HD void cb_dq_q6_k(uint8_t a, uint8_t c, uint8_t h, int l, const float ds[8], float y[4])
{
    int is = l / 16;
    y[0] = ds[is] * (float)(((a & 0x0f) | (h & 3) << 4) - 32);
    y[1] = ds[is + 2] * (float)(((c & 0x0f) | (h >> 2 & 3) << 4) - 32);
    y[2] = ds[is + 4] * (float)(((a >> 4) | (h >> 4 & 3) << 4) - 32);
    y[3] = ds[is + 6] * (float)(((c >> 4) | (h >> 6 & 3) << 4) - 32);
}

/* Eight consecutive elements e0..e0+7 of a block of type t (ggml's type
 * ids: 2 q4_0, 3 q4_1, 6 q5_0, 7 q5_1, 8 q8_0, 12 q4_K, 13 q5_K, 14 q6_K;
 * e0 a multiple of 8 inside the block) into y, by the functions above:
 * what a lane of the CUDA backend's products on weights kept in their
 * blocks decodes at a time (cuda_mm.cu's k_qgemv, with t a constant).
 * Eight such elements share their scales (a K-quant sub-block, a q6_K
 * scale), decoded once.  An unknown t gives zeros. */
CB_HD void cb_dq8(int t, const uint8_t *b, int e0, float y[8])
{
    float y0 = 0.0f, y1 = 0.0f;
    if (t == 8) {
        const float d = cb_dq_d(b, 0);
        for (int i = 0; i < 8; i++)
            y[i] = cb_dq_q8_0((int8_t)b[2 + e0 + i], d);
    } else if (t == 2 || t == 3 || t == 6 || t == 7) {
        /* element j < 16 is the low half of byte j, j + 16 its high half */
        const int j0 = e0 & 15, hi = e0 >= 16;
        const float d = cb_dq_d(b, 0);
        for (int i = 0; i < 8; i++) {
            const int j = j0 + i;
            if (t == 2)
                cb_dq_q4_0(b[2 + j], d, &y0, &y1);
            else if (t == 3)
                cb_dq_q4_1(b[4 + j], d, cb_dq_d(b, 2), &y0, &y1);
            else if (t == 6)
                cb_dq_q5_0(b[6 + j], cb_dq_rd32(b + 2), j, d, &y0, &y1);
            else
                cb_dq_q5_1(b[8 + j], cb_dq_rd32(b + 4), j, d, cb_dq_d(b, 2), &y0, &y1);
            y[i] = hi ? y1 : y0;
        }
    } else if (t == 12 || t == 13) {
        /* group g: elements 64g + l (low nibbles) and 64g + 32 + l (high) */
        const int g = e0 / 64, l0 = e0 % 32, hi = e0 % 64 >= 32;
        float f[4];
        cb_dq_k_group(b, g, f);
        for (int i = 0; i < 8; i++) {
            const int l = l0 + i;
            if (t == 12)
                cb_dq_q4_k(b[16 + 32 * g + l], f, &y0, &y1);
            else
                cb_dq_q5_k(b[48 + 32 * g + l], b[16 + l], g, f, &y0, &y1);
            y[i] = hi ? y1 : y0;
        }
    } else if (t == 14) {
        /* half n, elements 128n + l + 32k, as cb_dq_q6_k_scales and
         * cb_dq_q6_k give them (one scale, d * scales[8n + l/16 + 2k], for
         * the eight), without their arrays: a GPU thread keeps an array it
         * indexes by a variable in memory, not registers */
        const int n = e0 / 128, k = e0 % 128 / 32, l0 = e0 % 32;
        const float s = cb_dq_d(b, 208) * (float)(int8_t)b[192 + 8 * n + l0 / 16 + 2 * k];
        for (int i = 0; i < 8; i++) {
            const int l = l0 + i;
            const uint8_t ql = b[64 * n + l + 32 * (k & 1)], qh = b[128 + 32 * n + l];
            const int q = ((k >= 2 ? ql >> 4 : ql & 0x0f) | (qh >> (2 * k) & 3) << 4) - 32;
            y[i] = s * (float)q;
        }
    } else {
        for (int i = 0; i < 8; i++)
            y[i] = 0.0f;
    }
}

#endif
