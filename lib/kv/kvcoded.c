/* kvcoded.c - the "coded" element type of KV files (cbkv(5)): scalar
 * quantization by a step tied to each group's spread, then entropy coding,
 * after CacheGen (Liu et al., "CacheGen: KV Cache Compression and Streaming
 * for Fast Large Language Model Serving", SIGCOMM 2024).
 *
 * Keys are quantized per channel over the chunk's tokens (a channel keeps
 * its outliers to itself), values per token over the channels.  A group's
 * level is q = round((x - mu) / d), mu the group's mean and d its standard
 * deviation over s ("steps per deviation", the layer's bit allocation),
 * widened where needed so that |q| <= 127: every group then has about the
 * same distribution of levels, which one Huffman table per layer's K (and
 * one per V) codes near its entropy.  The levels are one byte each and go
 * through zstd's literal stage alone (ZSTD_compressSequences with no
 * matches: on such data zstd's matches cost more than they save, 0.3 bits
 * a symbol at level 3), decoded by the plain ZSTD_decompress.
 *
 * Measured on the KV of 349-token chunks of prose (Qwen2.5-Coder 0.5B and
 * 1.5B, cb-precompute --kv-type f32): levels at s = 2 carry 3.05 bits of
 * order-0 entropy, at s = 1.2 2.35 bits, in every layer alike; the literal
 * stage codes them 2% over that.  A key's level minus the token before's
 * has 0.1 to 0.4 bits less in the middle layers and more in the first and
 * last, so the encoder codes each layer's keys both ways and keeps the
 * smaller; values' differences have more entropy than their levels
 * everywhere and are not used.  The first third of the layers gets more
 * steps (CB_CODED_S_EARLY) than the rest (CB_CODED_S_LATE): early layers
 * feed every later one.  The writer scales all of them by one factor so
 * that a file takes a quarter of f16's bytes (kvfile.c, CB_CODED_SHARE):
 * at a sixth, on the 0.5B's nq20 development questions, the default
 * blend's answers from such files agreed with full prefill's 27 points
 * less often than from f16 files; at a quarter the difference is within
 * its interval (tests/bench/results/EVAL.md).
 * Each layer records its s, so a file describes itself whatever the table
 * here says.
 *
 * At a sixth, the 1.5B's KV of 336 to 366-token chunks took 4,695 to 4,779
 * bytes a token (f16: 28,672; kivi4: 9,213 with pages) at s of about 1.6
 * in the first third and 1.07 after, and relative RMS errors of K 0.003 to
 * 0.2 by layer (0.14 on average; kivi4 0.038, q8_0 0.008) and of V 0.18
 * in the first third, 0.27 after (kivi4 0.085, q8_0 0.006): what about 2.5
 * bits an element allows; a quarter allows about 3.7.
 *
 * Layout of one layer of n tokens of width w, little endian:
 *
 *   0   4  key mode: 0 levels, 1 each token's levels minus the token
 *          before's, modulo 256 (the first token's as they are)
 *   4   4  s of the keys (f32)
 *   8   4  s of the values (f32)
 *   12  4  zk: bytes of the keys' zstd frame
 *   16  4  zv: bytes of the values' zstd frame
 *   20  12 zero
 *   32  4w keys' mu (f16) [w], then d (f16) [w], one a channel
 *   ..  4n values' mu (f16) [n], then d (f16) [n], one a token
 *   ..  zk a zstd frame of n*w bytes: the keys' symbols token by token, a
 *          token's w channels in order (int8 levels, or mode 1's bytes)
 *   ..  zv a zstd frame of n*w bytes: the values' levels, likewise
 *
 * Decoding gives f16(q*d + mu) with d and mu widened to f32 and the product
 * and the sum each rounded to f32 (no fused multiply-add), as kivi4's. */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_compressSequences, ZSTD_initStaticDCtx */
#include "kv.h"

#include "../backend/qmm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define HDR 32

float cb_coded_steps(int32_t l, int32_t n_layer)
{
    return 3 * l < n_layer ? CB_CODED_S_EARLY : CB_CODED_S_LATE;
}

static uint64_t params_bytes(int32_t n, int64_t w)
{
    return HDR + 4 * (uint64_t)w + 4 * (uint64_t)n;
}

uint64_t cb_coded_bound(int32_t n, int64_t w)
{
    if (n < 1 || w < 1)
        return 0;
    return params_bytes(n, w) + 2 * (uint64_t)ZSTD_compressBound((size_t)n * (size_t)w);
}

size_t cb_coded_scratch(int32_t n, int64_t w)
{
    return ZSTD_estimateDCtxSize() + 2 * sizeof(float) * (size_t)w + (size_t)n * (size_t)w + 64;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

/* ------------------------------------------------------------- encoding */

/* The group x[0], x[st], ... x[(cnt-1)*st]: its mu and d as stored (f16)
 * and each one's level, q[i*qs] = round((x - mu) / d) in -127..127, with
 * mu and d rounded first, so that their rounding is not added twice. */
static void quant_group(const float *x, int64_t st, int64_t cnt, float s, uint16_t *muh,
                        uint16_t *dh, int8_t *q, int64_t qs)
{
    double sum = 0, var = 0;
    for (int64_t i = 0; i < cnt; i++)
        sum += x[i * st];
    float mean = (float)(sum / (double)cnt);
    *muh = cb_f32_to_f16(mean);
    float mu = cb_f16_to_f32(*muh), dev = 0;
    for (int64_t i = 0; i < cnt; i++) {
        float e = x[i * st] - mu;
        var += (double)e * e;
        dev = fabsf(e) > dev ? fabsf(e) : dev;
    }
    float d = (float)sqrt(var / (double)cnt) / s;
    d = d > dev / 127 ? d : dev / 127;
    *dh = isfinite(d) ? cb_f32_to_f16(d) : 0;
    d = cb_f16_to_f32(*dh);
    float id = d > 0 && isfinite(d) ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < cnt; i++) {
        float v = rintf((x[i * st] - mu) * id);
        q[i * qs] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
}

/* n bytes of symbols as a zstd frame of literals alone into out (cap
 * bytes): its size, or 0 on failure. */
static size_t literals(ZSTD_CCtx *cc, const uint8_t *sym, size_t n, uint8_t *out, size_t cap)
{
    ZSTD_Sequence none = {0};
    size_t z = ZSTD_compressSequences(cc, out, cap, &none, 0, sym, n);
    return ZSTD_isError(z) ? 0 : z;
}

cb_status cb_coded_encode(const float *k, const float *v, int32_t n, int64_t w, float sk, float sv,
                          uint8_t *out, uint64_t cap, uint64_t *len)
{
    size_t nw = (size_t)n * (size_t)w, bound = ZSTD_compressBound(nw);
    int8_t *lv = NULL;
    uint8_t *dl = NULL, *zd = NULL;
    ZSTD_CCtx *cc = NULL;
    cb_status st = CB_ERR_NOMEM;

    if (n < 1 || w < 1 || !(sk > 0) || !(sv > 0) || cap < cb_coded_bound(n, w))
        return CB_ERR_INVALID;
    lv = malloc(nw);
    dl = malloc(nw);
    zd = malloc(bound);
    cc = ZSTD_createCCtx();
    if (!lv || !dl || !zd || !cc)
        goto fail;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 3)) ||
        ZSTD_isError(
            ZSTD_CCtx_setParameter(cc, ZSTD_c_blockDelimiters, ZSTD_sf_noBlockDelimiters))) {
        st = CB_ERR_INTERNAL;
        goto fail;
    }
    memset(out, 0, HDR);
    uint8_t *kp = out + HDR, *vp = kp + 4 * w, *body = vp + 4 * (int64_t)n;
    for (int64_t c = 0; c < w; c++) {
        uint16_t muh, dh;
        quant_group(k + c, w, n, sk, &muh, &dh, lv + c, w);
        wr16(kp + 2 * c, muh);
        wr16(kp + 2 * (w + c), dh);
    }
    /* keys: levels, or differences along the tokens, whichever is smaller */
    memcpy(dl, lv, (size_t)w);
    for (size_t i = (size_t)w; i < nw; i++)
        dl[i] = (uint8_t)((uint8_t)lv[i] - (uint8_t)lv[i - (size_t)w]);
    size_t zk = literals(cc, (const uint8_t *)lv, nw, body, bound);
    size_t zk1 = literals(cc, dl, nw, zd, bound);
    st = CB_ERR_INTERNAL;
    if (!zk || !zk1)
        goto fail;
    uint32_t mode = zk1 < zk;
    if (mode) {
        memcpy(body, zd, zk1);
        zk = zk1;
    }
    for (int32_t t = 0; t < n; t++) {
        uint16_t muh, dh;
        quant_group(v + (int64_t)t * w, 1, w, sv, &muh, &dh, lv + (int64_t)t * w, 1);
        wr16(vp + 2 * t, muh);
        wr16(vp + 2 * ((int64_t)n + t), dh);
    }
    size_t zv = literals(cc, (const uint8_t *)lv, nw, body + zk, bound);
    if (!zv)
        goto fail;
    wr32(out, mode);
    memcpy(out + 4, &sk, 4);
    memcpy(out + 8, &sv, 4);
    wr32(out + 12, (uint32_t)zk);
    wr32(out + 16, (uint32_t)zv);
    *len = params_bytes(n, w) + zk + zv;
    st = CB_OK;
fail:
    free(lv);
    free(dl);
    free(zd);
    ZSTD_freeCCtx(cc);
    return st;
}

/* ------------------------------------------------------------- decoding */

/* One row of w elements: f16(q[c]*d[c] + mu[c]) (portable) */
static void dec_row(const int8_t *q, const float *d, const float *mu, uint16_t *out, int64_t w)
{
    for (int64_t c = 0; c < w; c++)
        out[c] = cb_f32_to_f16((float)q[c] * d[c] + mu[c]);
}

/* One row with a token's d and mu: f16(q[c]*d + mu) (portable) */
static void dec_row1(const int8_t *q, float d, float mu, uint16_t *out, int64_t w)
{
    for (int64_t c = 0; c < w; c++)
        out[c] = cb_f32_to_f16((float)q[c] * d + mu);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* The same eight at a time with AVX2 and F16C: the product and the sum
 * rounded apart (no FMA), the conversion to nearest even as
 * cb_f32_to_f16 rounds. */
#define KV_AVX2 __attribute__((target("avx2,f16c")))

KV_AVX2 static inline __m256 levels8(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

KV_AVX2 static inline void store8(uint16_t *out, __m256 x)
{
    _mm_storeu_si128((__m128i *)out,
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

KV_AVX2 static void dec_row_avx2(const int8_t *q, const float *d, const float *mu, uint16_t *out,
                                 int64_t w)
{
    int64_t c = 0;
    for (; c + 8 <= w; c += 8)
        store8(out + c, _mm256_add_ps(_mm256_mul_ps(levels8(q + c), _mm256_loadu_ps(d + c)),
                                      _mm256_loadu_ps(mu + c)));
    dec_row(q + c, d + c, mu + c, out + c, w - c);
}

KV_AVX2 static void dec_row1_avx2(const int8_t *q, float d, float mu, uint16_t *out, int64_t w)
{
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(mu);
    int64_t c = 0;
    for (; c + 8 <= w; c += 8)
        store8(out + c, _mm256_add_ps(_mm256_mul_ps(levels8(q + c), vd), vm));
    dec_row1(q + c, d, mu, out + c, w - c);
}

static int have_simd(void) { return qmm_cpu_avx2(); }
#else
#define dec_row_avx2 dec_row
#define dec_row1_avx2 dec_row1
static int have_simd(void) { return 0; }
#endif

/* n*w bytes from the zstd frame at in (z bytes) into sym: 0, or -1 when
 * the frame is not exactly that. */
static int unframe(ZSTD_DCtx *dc, const uint8_t *in, size_t z, uint8_t *sym, size_t nw)
{
    size_t r = ZSTD_decompressDCtx(dc, sym, nw, in, z);
    return ZSTD_isError(r) || r != nw ? -1 : 0;
}

cb_status cb_coded_decode(const uint8_t *in, uint64_t len, int32_t n, int64_t w, uint16_t *k,
                          uint16_t *v, void *scratch, int simd)
{
    int fast = simd && have_simd();
    size_t nw = (size_t)n * (size_t)w, dsz = ZSTD_estimateDCtxSize();
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    ZSTD_DCtx *dc = ZSTD_initStaticDCtx(base, dsz);
    float *d = (float *)(base + (dsz + 63) / 64 * 64), *mu = d + w;
    int8_t *sym = (int8_t *)(mu + w);

    if (n < 1 || w < 1 || !dc || len < params_bytes(n, w))
        return CB_ERR_FORMAT;
    uint32_t mode = rd32(in);
    uint64_t zk = rd32(in + 12), zv = rd32(in + 16);
    if (mode > 1 || zk + zv > len - params_bytes(n, w))
        return CB_ERR_FORMAT;
    const uint8_t *kp = in + HDR, *vp = kp + 4 * w, *body = vp + 4 * (int64_t)n;
    if (unframe(dc, body, zk, (uint8_t *)sym, nw) != 0)
        return CB_ERR_FORMAT;
    for (int64_t c = 0; c < w; c++) {
        mu[c] = cb_f16_to_f32(rd16(kp + 2 * c));
        d[c] = cb_f16_to_f32(rd16(kp + 2 * (w + c)));
    }
    for (int32_t t = 0; t < n; t++) {
        int8_t *q = sym + (int64_t)t * w;
        if (mode && t > 0) /* a running sum modulo 256 */
            for (int64_t c = 0; c < w; c++)
                q[c] = (int8_t)(uint8_t)((uint8_t)q[c] + (uint8_t)q[c - w]);
        if (fast)
            dec_row_avx2(q, d, mu, k + (int64_t)t * w, w);
        else
            dec_row(q, d, mu, k + (int64_t)t * w, w);
    }
    if (unframe(dc, body + zk, zv, (uint8_t *)sym, nw) != 0)
        return CB_ERR_FORMAT;
    for (int32_t t = 0; t < n; t++) {
        float dt = cb_f16_to_f32(rd16(vp + 2 * ((int64_t)n + t))),
              mt = cb_f16_to_f32(rd16(vp + 2 * t));
        if (fast)
            dec_row1_avx2(sym + (int64_t)t * w, dt, mt, v + (int64_t)t * w, w);
        else
            dec_row1(sym + (int64_t)t * w, dt, mt, v + (int64_t)t * w, w);
    }
    return CB_OK;
}
