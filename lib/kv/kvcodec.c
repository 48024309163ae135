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

/* 32 elements from 16 bytes of nibbles and each element's d and m: the
 * portable decoder */
static void dec32(const uint8_t *qs, const float *d, const float *m, uint16_t *out)
{
    for (int j = 0; j < 16; j++) {
        out[j] = cb_f32_to_f16((float)(qs[j] & 15) * d[j] + m[j]);
        out[j + 16] = cb_f32_to_f16((float)(qs[j] >> 4) * d[j + 16] + m[j + 16]);
    }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* dec32 with AVX2 and F16C (the same operations, eight at a time; the
 * conversion rounds to nearest even as cb_f32_to_f16 does) */
__attribute__((target("avx2,f16c"))) static void dec32_avx2(const uint8_t *qs, const float *d,
                                                            const float *m, uint16_t *out)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) {
        __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
        __m256 x =
            _mm256_add_ps(_mm256_mul_ps(q, _mm256_loadu_ps(d + 8 * i)), _mm256_loadu_ps(m + 8 * i));
        _mm_storeu_si128((__m128i *)(out + 8 * i),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

static int have_simd(void) { return qmm_cpu_avx2(); }
#else
static void dec32_avx2(const uint8_t *qs, const float *d, const float *m, uint16_t *out)
{
    dec32(qs, d, m, out);
}
static int have_simd(void) { return 0; }
#endif

cb_status cb_kivi4_decode(const uint8_t *in, int32_t n, int64_t w, uint16_t *k, uint16_t *v,
                          float *scratch, int simd)
{
    void (*dec)(const uint8_t *, const float *, const float *, uint16_t *) =
        simd && have_simd() ? dec32_avx2 : dec32;
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
        for (int32_t t = 0; t < r; t++, p += w / 2)
            for (int64_t c0 = 0; c0 < w; c0 += 32)
                dec(p + c0 / 2, d + c0, m + c0, k + (int64_t)(t0 + t) * w + c0);
    }
    for (int64_t i = 0; i < (int64_t)n * w; i += 32, p += 20) {
        float dd = cb_f16_to_f32(rd16(p)), mm = cb_f16_to_f32(rd16(p + 2));
        float db[32], mb[32];
        for (int j = 0; j < 32; j++)
            db[j] = dd, mb[j] = mm;
        dec(p + 4, db, mb, v + i);
    }
    return CB_OK;
}
