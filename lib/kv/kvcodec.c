/* kvcodec.c - the coded element types of KV files (cbkv(5)), which are not
 * ggml's row-wise blocks.
 *
 * kivi4: 4-bit keys quantized per channel and values per token, after KIVI
 * (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
 * Cache", 2024).  Keys have outlier channels (a few channels are large for
 * every token), so a group along the channel axis would spend its 16 levels
 * on the outlier; a group along the token axis of one channel sees one
 * channel's range.  Values have no such channels and are grouped per token.
 * Both are asymmetric (a scale d and a minimum m per group of 32, f16), so
 * an element is q*d + m, q in 0..15: 5 bits an element with the group's
 * two f16, 20 bytes per 32 elements.
 *
 * Layout of one layer of n tokens of width w (n_head_kv*head_dim, a
 * multiple of 32), K then V, little endian:
 *
 *   K: for each group g of 32 tokens (the last one r = n - 32g < 32 tokens
 *      when n is not a multiple of 32):
 *        d[w]  f16, channel c's scale over the group's tokens
 *        m[w]  f16, channel c's minimum
 *        r rows of w/2 bytes, token by token: in each run of 32 channels
 *        c0..c0+31, byte j (j < 16) holds q of channel c0+j in its low
 *        nibble and of c0+j+16 in its high nibble (ggml's q4 order)
 *   V: n rows, each w/32 blocks of 20 bytes: d f16, m f16, then 16 bytes of
 *      nibbles in the same order (exactly ggml's q4_1 block)
 *
 * The K group stores its scales as rows over the channels, so a token's row
 * decodes with contiguous loads like a V row does.  Decoding gives f16, the
 * cache's type: f16(q*d + m), with d and m widened to f32 and the product
 * and the sum each rounded to f32 (no fused multiply-add), so every decoder
 * here gives the same bits. */
#include "kv.h"

#include "../backend/qmm.h"

#include <math.h>
#include <string.h>

#define G CB_KIVI4_GROUP

uint64_t cb_kivi4_k_bytes(int32_t n, int64_t w)
{
    if (n < 1 || w < 32 || w % 32)
        return 0;
    uint64_t groups = ((uint64_t)n + G - 1) / G;
    return groups * 4 * (uint64_t)w + (uint64_t)n * (uint64_t)w / 2;
}

uint64_t cb_kivi4_v_bytes(int32_t n, int64_t w)
{
    if (n < 1 || w < 32 || w % 32)
        return 0;
    return (uint64_t)n * (uint64_t)w / 32 * 20;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ------------------------------------------------------------- encoding */

/* The f16 scale and minimum of values x[0], x[s], ... x[(cnt-1)*s], and
 * each one's level: q = round((x - m) / d) in 0..15, with d and m as
 * stored (rounded to f16), so the rounding of d and m is not added to the
 * error twice. */
static void quant_group(const float *x, int64_t s, int32_t cnt, uint16_t *dh, uint16_t *mh,
                        uint8_t *q)
{
    float mn = x[0], mx = x[0];
    for (int32_t i = 1; i < cnt; i++) {
        float v = x[i * s];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    *dh = cb_f32_to_f16((mx - mn) / 15);
    *mh = cb_f32_to_f16(mn);
    float d = cb_f16_to_f32(*dh), m = cb_f16_to_f32(*mh);
    float id = d > 0 && isfinite(d) ? 1.0f / d : 0.0f;
    for (int32_t i = 0; i < cnt; i++) {
        float v = (x[i * s] - m) * id;
        int k = v > 0 ? (int)(v + 0.5f) : 0;
        q[i] = (uint8_t)(k > 15 ? 15 : k);
    }
}

/* q[32] of one run of channels packed into 16 bytes (ggml's q4 order) */
static void pack32(const uint8_t *q, uint8_t *out)
{
    for (int j = 0; j < 16; j++)
        out[j] = (uint8_t)(q[j] | q[j + 16] << 4);
}

cb_status cb_kivi4_encode(const float *k, const float *v, int32_t n, int64_t w, uint8_t *out)
{
    uint8_t q[G];
    if (!cb_kivi4_k_bytes(n, w))
        return CB_ERR_INVALID;
    uint8_t *p = out;
    for (int32_t t0 = 0; t0 < n; t0 += G) {
        int32_t r = n - t0 < G ? n - t0 : G;
        uint8_t *dp = p, *mp = p + 2 * w, *rows = p + 4 * w;
        memset(rows, 0, (size_t)r * (size_t)(w / 2));
        /* the group's levels, channel by channel, into its rows */
        for (int64_t c = 0; c < w; c++) {
            uint16_t dh, mh;
            quant_group(k + (int64_t)t0 * w + c, w, r, &dh, &mh, q);
            wr16(dp + 2 * c, dh);
            wr16(mp + 2 * c, mh);
            int64_t byte = c / 32 * 16 + c % 16, hi = c % 32 >= 16;
            for (int32_t t = 0; t < r; t++) {
                uint8_t *b = rows + (int64_t)t * (w / 2) + byte;
                *b = (uint8_t)(hi ? (*b & 0x0f) | q[t] << 4 : (*b & 0xf0) | q[t]);
            }
        }
        p = rows + (int64_t)r * (w / 2);
    }
    for (int32_t t = 0; t < n; t++)
        for (int64_t c0 = 0; c0 < w; c0 += 32, p += 20) {
            uint16_t dh, mh;
            quant_group(v + (int64_t)t * w + c0, 1, 32, &dh, &mh, q);
            wr16(p, dh);
            wr16(p + 2, mh);
            pack32(q, p + 4);
        }
    return CB_OK;
}

/* ------------------------------------------------------------- decoding */

/* A key row: w channels from w/2 bytes of nibbles, each channel's d and m
 * (the portable decoder) */
static void dec_k_row(const uint8_t *q, const float *d, const float *m, uint16_t *out, int64_t w)
{
    for (int64_t c0 = 0; c0 < w; c0 += 32, q += 16)
        for (int j = 0; j < 16; j++) {
            int64_t c = c0 + j;
            out[c] = cb_f32_to_f16((float)(q[j] & 15) * d[c] + m[c]);
            out[c + 16] = cb_f32_to_f16((float)(q[j] >> 4) * d[c + 16] + m[c + 16]);
        }
}

/* A value row: w/32 blocks of 20 bytes (the portable decoder) */
static void dec_v_row(const uint8_t *b, uint16_t *out, int64_t w)
{
    for (int64_t c0 = 0; c0 < w; c0 += 32, b += 20) {
        float d = cb_f16_to_f32(rd16(b)), m = cb_f16_to_f32(rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            out[c0 + j] = cb_f32_to_f16((float)(b[4 + j] & 15) * d + m);
            out[c0 + j + 16] = cb_f32_to_f16((float)(b[4 + j] >> 4) * d + m);
        }
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* The same operations eight at a time with AVX2 and F16C: the product and
 * the sum rounded apart (no FMA), the conversion to nearest even as
 * cb_f32_to_f16 rounds. */
#define KV_AVX2 __attribute__((target("avx2,f16c")))

/* the 32 levels of 16 bytes of nibbles, as four vectors of 8 floats in
 * element order: the low nibbles are elements 0..15, the high 16..31 */
KV_AVX2 static inline void levels32(const uint8_t *q, __m256 out[4])
{
    __m128i b = _mm_loadu_si128((const __m128i *)q), mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

KV_AVX2 static inline void store8(uint16_t *out, __m256 x)
{
    _mm_storeu_si128((__m128i *)out,
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

KV_AVX2 static void dec_k_row_avx2(const uint8_t *q, const float *d, const float *m, uint16_t *out,
                                   int64_t w)
{
    __m256 l[4];
    for (int64_t c0 = 0; c0 < w; c0 += 32, q += 16) {
        levels32(q, l);
        for (int i = 0; i < 4; i++)
            store8(out + c0 + 8 * i,
                   _mm256_add_ps(_mm256_mul_ps(l[i], _mm256_loadu_ps(d + c0 + 8 * i)),
                                 _mm256_loadu_ps(m + c0 + 8 * i)));
    }
}

KV_AVX2 static void dec_v_row_avx2(const uint8_t *b, uint16_t *out, int64_t w)
{
    __m256 l[4];
    for (int64_t c0 = 0; c0 < w; c0 += 32, b += 20) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(rd16(b))), m = _mm256_set1_ps(_cvtsh_ss(rd16(b + 2)));
        levels32(b + 4, l);
        for (int i = 0; i < 4; i++)
            store8(out + c0 + 8 * i, _mm256_add_ps(_mm256_mul_ps(l[i], d), m));
    }
}

static int have_simd(void) { return qmm_cpu_avx2(); }
#else
#define dec_k_row_avx2 dec_k_row
#define dec_v_row_avx2 dec_v_row
static int have_simd(void) { return 0; }
#endif

cb_status cb_kivi4_decode(const uint8_t *in, int32_t n, int64_t w, uint16_t *k, uint16_t *v,
                          float *scratch, int simd)
{
    int fast = simd && have_simd();
    float *d = scratch, *m = scratch + w;
    if (!cb_kivi4_k_bytes(n, w))
        return CB_ERR_INVALID;
    const uint8_t *p = in;
    for (int32_t t0 = 0; t0 < n; t0 += G) {
        int32_t r = n - t0 < G ? n - t0 : G;
        for (int64_t c = 0; c < w; c++) {
            d[c] = cb_f16_to_f32(rd16(p + 2 * c));
            m[c] = cb_f16_to_f32(rd16(p + 2 * w + 2 * c));
        }
        p += 4 * w;
        for (int32_t t = 0; t < r; t++, p += w / 2) {
            uint16_t *row = k + (int64_t)(t0 + t) * w;
            if (fast)
                dec_k_row_avx2(p, d, m, row, w);
            else
                dec_k_row(p, d, m, row, w);
        }
    }
    for (int32_t t = 0; t < n; t++, p += w / 32 * 20) {
        if (fast)
            dec_v_row_avx2(p, v + (int64_t)t * w, w);
        else
            dec_v_row(p, v + (int64_t)t * w, w);
    }
    return CB_OK;
}
