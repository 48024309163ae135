/* test_quant.c - tensor types: the type table, f16/bf16 conversions, and the
 * dequantizers checked against a reference written here from ggml's block
 * layouts (element by element, not loop by loop), plus blocks built byte by
 * byte with hand-worked values, and the library's fixture quantizers.
 *
 * Nothing here calls the library to produce the data it checks the library
 * with: the reference f16 encoder/decoder, the quantizers and the decoder
 * below are this file's own. */
#include "../../lib/core/core.h"
#include "../../lib/core/dequant.h"
#include "test.h"

#include <float.h>
#include <stdint.h>

#define N_COLS 512 /* two K-quant super-blocks, 16 legacy blocks */
#define N_ROWS 6

/* ------------------------------------------------------------ helpers */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t lcg_state = 0x853c49e6748fea9bULL;

static uint32_t lcg_next(void)
{
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg_state >> 32);
}

/* uniform in [-1, 1) */
static float lcg_unit(void) { return (float)((double)lcg_next() / 2147483648.0 - 1.0); }

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] + 256 * p[1]); }
static void put16(uint8_t *p, uint16_t v)
{
    p[0] = v & 0xff;
    p[1] = v >> 8;
}

/* Half to float by its definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m. */
static float ref_h2f(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexpf((float)m, -24);
    else
        v = ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Float to half by search: the nearest half, the even one on a tie. */
static uint16_t ref_f2h(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f), below, above, dl, du;
    int lo = 0, hi = 0x7bff;
    if (isnan(f))
        return 0x7e00;
    if (a >= 65520.0) /* halfway to 2^16 and beyond */
        return sign | 0x7c00;
    while (lo < hi) { /* the largest half <= a */
        int mid = (lo + hi + 1) / 2;
        if (ref_h2f((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    below = ref_h2f((uint16_t)lo);
    above = lo < 0x7bff ? ref_h2f((uint16_t)(lo + 1)) : 65536.0;
    dl = a - below;
    du = above - a;
    if (du < dl || (du == dl && (lo & 1)))
        lo++;
    return sign | (uint16_t)lo;
}

static float ref_bf2f(uint16_t h)
{
    int e = (h >> 7) & 255, m = h & 127;
    float v;
    if (e == 255)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexpf((float)m, -133);
    else
        v = ldexpf((float)(m + 128), e - 134);
    return (h & 0x8000) ? -v : v;
}

static uint16_t ref_f2bf(float f)
{
    uint32_t u = bits_of(f), mag = u & 0x7fffffff;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000), lo = (uint16_t)(mag >> 16);
    double a = fabs((double)f), dl, du;
    if (isnan(f))
        return 0x7fc0;
    if (mag == 0x7f800000)
        return sign | 0x7f80;
    dl = a - ref_bf2f(lo);
    du = (lo == 0x7f7f ? ldexp(1.0, 128) : (double)ref_bf2f((uint16_t)(lo + 1))) - a;
    if (du < dl || (du == dl && (lo & 1)))
        lo++;
    return sign | lo;
}

static int same_bits(float a, float b)
{
    return bits_of(a) == bits_of(b) || (isnan(a) && isnan(b));
}

/* ------------------------------------------- ggml layouts, element-wise */

static const cb_type supported[] = {
    CB_TYPE_F32,  CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0, CB_TYPE_Q4_1, CB_TYPE_Q5_0,
    CB_TYPE_Q5_1, CB_TYPE_Q8_0, CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K,
};
#define N_SUPPORTED (int)(sizeof supported / sizeof supported[0])

static int is_plain(cb_type t) { return t == CB_TYPE_F32 || t == CB_TYPE_F16 || t == CB_TYPE_BF16; }

/* Block geometry from ggml-common.h's struct definitions. */
static int ref_block_elems(cb_type t)
{
    return is_plain(t)                                                     ? 1
           : (t == CB_TYPE_Q4_K || t == CB_TYPE_Q5_K || t == CB_TYPE_Q6_K) ? 256
                                                                           : 32;
}

static int ref_block_bytes(cb_type t)
{
    switch (t) {
    case CB_TYPE_F32: return 4;
    case CB_TYPE_F16:
    case CB_TYPE_BF16: return 2;
    case CB_TYPE_Q4_0: return 2 + 16;                /* d, qs[16] */
    case CB_TYPE_Q4_1: return 2 + 2 + 16;            /* d, m, qs[16] */
    case CB_TYPE_Q5_0: return 2 + 4 + 16;            /* d, qh[4], qs[16] */
    case CB_TYPE_Q5_1: return 2 + 2 + 4 + 16;        /* d, m, qh[4], qs[16] */
    case CB_TYPE_Q8_0: return 2 + 32;                /* d, qs[32] */
    case CB_TYPE_Q4_K: return 2 + 2 + 12 + 128;      /* d, dmin, scales, qs */
    case CB_TYPE_Q5_K: return 2 + 2 + 12 + 32 + 128; /* + qh[32] */
    case CB_TYPE_Q6_K: return 128 + 64 + 16 + 2;     /* ql, qh, scales, d */
    default: return 0;
    }
}

/* Byte offset of element e's low bits and whether they are the high nibble. */
static int nib(const uint8_t *p, int i, int high) { return high ? p[i] >> 4 : p[i] & 15; }
static int bit(const uint8_t *p, int k) { return (p[k / 8] >> (k % 8)) & 1; }
static void put_nib(uint8_t *p, int i, int high, int v)
{
    p[i] |= (uint8_t)((v & 15) << (high ? 4 : 0));
}
static void put_bit(uint8_t *p, int k, int v) { p[k / 8] |= (uint8_t)((v & 1) << (k % 8)); }

/* The raw quant of element e of a block (unsigned, before any -8/-16/-32). */
static int ref_get_q(cb_type t, const uint8_t *b, int e)
{
    switch (t) {
    case CB_TYPE_Q4_0: return nib(b + 2, e % 16, e / 16);
    case CB_TYPE_Q4_1: return nib(b + 4, e % 16, e / 16);
    case CB_TYPE_Q5_0: return nib(b + 6, e % 16, e / 16) | bit(b + 2, e) << 4;
    case CB_TYPE_Q5_1: return nib(b + 8, e % 16, e / 16) | bit(b + 4, e) << 4;
    case CB_TYPE_Q8_0: return (int8_t)b[2 + e];
    /* K: groups of 64 share 32 bytes, first 32 elements low nibbles */
    case CB_TYPE_Q4_K: return nib(b + 16, 32 * (e / 64) + e % 32, (e / 32) % 2);
    case CB_TYPE_Q5_K:
        /* 5th bit: bit (e/32) of qh[e%32] */
        return nib(b + 48, 32 * (e / 64) + e % 32, (e / 32) % 2) |
               bit(b + 16, 8 * (e % 32) + e / 32) << 4;
    case CB_TYPE_Q6_K: {
        /* halves of 128; in a half, quarter k of 32: low nibble of ql[l] (k=0),
         * ql[l+32] (k=1), high nibbles of those (k=2,3); 2 bits 2k of qh[l] */
        int n = e / 128, k = (e % 128) / 32, l = e % 32;
        int lo = nib(b, 64 * n + 32 * (k % 2) + l, k / 2);
        int hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
        return lo | hi << 4;
    }
    default: return 0;
    }
}

static void ref_put_q(cb_type t, uint8_t *b, int e, int q)
{
    switch (t) {
    case CB_TYPE_Q4_0: put_nib(b + 2, e % 16, e / 16, q); break;
    case CB_TYPE_Q4_1: put_nib(b + 4, e % 16, e / 16, q); break;
    case CB_TYPE_Q5_0:
        put_nib(b + 6, e % 16, e / 16, q);
        put_bit(b + 2, e, q >> 4);
        break;
    case CB_TYPE_Q5_1:
        put_nib(b + 8, e % 16, e / 16, q);
        put_bit(b + 4, e, q >> 4);
        break;
    case CB_TYPE_Q8_0: b[2 + e] = (uint8_t)(int8_t)q; break;
    case CB_TYPE_Q4_K: put_nib(b + 16, 32 * (e / 64) + e % 32, (e / 32) % 2, q); break;
    case CB_TYPE_Q5_K:
        put_nib(b + 48, 32 * (e / 64) + e % 32, (e / 32) % 2, q);
        put_bit(b + 16, 8 * (e % 32) + e / 32, q >> 4);
        break;
    case CB_TYPE_Q6_K: {
        int n = e / 128, k = (e % 128) / 32, l = e % 32;
        put_nib(b, 64 * n + 32 * (k % 2) + l, k / 2, q);
        b[128 + 32 * n + l] |= (uint8_t)(((q >> 4) & 3) << (2 * k));
        break;
    }
    default: break;
    }
}

/* q4_K/q5_K scales[12]: bytes 0-3 hold scale j (low 6 bits) and the top 2
 * bits of scale j+4; bytes 4-7 the same for the mins; bytes 8-11 the low 4
 * bits of scale j+4 (low nibble) and min j+4 (high nibble). */
static void ref_k_scale(const uint8_t *s, int j, int *sc, int *m)
{
    int k = j % 4;
    if (j < 4) {
        *sc = s[k] & 0x3f;
        *m = s[4 + k] & 0x3f;
    } else {
        *sc = (s[k] >> 6) * 16 + (s[8 + k] & 15);
        *m = (s[4 + k] >> 6) * 16 + (s[8 + k] >> 4);
    }
}

static void ref_put_k_scale(uint8_t *s, int j, int sc, int m)
{
    int k = j % 4;
    if (j < 4) {
        s[k] |= (uint8_t)sc;
        s[4 + k] |= (uint8_t)m;
    } else {
        s[k] |= (uint8_t)((sc >> 4) << 6);
        s[4 + k] |= (uint8_t)((m >> 4) << 6);
        s[8 + k] |= (uint8_t)((sc & 15) | (m & 15) << 4);
    }
}

/* Element e of a block, with ggml's float expressions (same operation order:
 * the dequantizers must match them bit for bit). */
static float ref_elem(cb_type t, const uint8_t *b, int e)
{
    int q = ref_get_q(t, b, e), sc, m;
    switch (t) {
    case CB_TYPE_F32:
        return float_of((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                        (uint32_t)b[3] << 24);
    case CB_TYPE_F16: return ref_h2f(get16(b));
    case CB_TYPE_BF16: return ref_bf2f(get16(b));
    case CB_TYPE_Q4_0: return (float)(q - 8) * ref_h2f(get16(b));
    case CB_TYPE_Q5_0: return (float)(q - 16) * ref_h2f(get16(b));
    case CB_TYPE_Q8_0: return (float)q * ref_h2f(get16(b));
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_1: return (float)q * ref_h2f(get16(b)) + ref_h2f(get16(b + 2));
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
        ref_k_scale(b + 4, e / 32, &sc, &m);
        return ref_h2f(get16(b)) * (float)sc * (float)q - ref_h2f(get16(b + 2)) * (float)m;
    case CB_TYPE_Q6_K:
        return ref_h2f(get16(b + 208)) * (float)(int8_t)b[192 + e / 16] * (float)(q - 32);
    default: return NAN;
    }
}

/* Decode n elements of a row with the reference. */
static void ref_dequant(cb_type t, const uint8_t *src, float *dst, int n)
{
    int be = ref_block_elems(t), bb = ref_block_bytes(t);
    for (int i = 0; i < n; i++)
        dst[i] = ref_elem(t, src + (size_t)(i / be) * bb, i % be);
}

/* --------------------------------------------- reference quantizers */

static int iround(float v) { return (int)lroundf(v); }
static int iclamp(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Deliberately another scheme than the library's: symmetric amax scales,
 * round-half-away, and 6/8-bit sub-block factors rounded to nearest. */
static void ref_quant_block(cb_type t, const float *x, uint8_t *b)
{
    int be = ref_block_elems(t);
    float amax = 0, lo = x[0], hi = x[0];
    memset(b, 0, (size_t)ref_block_bytes(t));
    for (int e = 0; e < be; e++) {
        amax = fmaxf(amax, fabsf(x[e]));
        lo = fminf(lo, x[e]);
        hi = fmaxf(hi, x[e]);
    }
    switch (t) {
    case CB_TYPE_F32: memcpy(b, x, 4); break;
    case CB_TYPE_F16: put16(b, ref_f2h(x[0])); break;
    case CB_TYPE_BF16: put16(b, (uint16_t)(bits_of(x[0]) >> 16)); break; /* truncation */
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q8_0: {
        int half = t == CB_TYPE_Q4_0 ? 8 : t == CB_TYPE_Q5_0 ? 16 : 128;
        uint16_t dh = ref_f2h(amax / (float)(half - 1));
        float d = ref_h2f(dh);
        put16(b, dh);
        for (int e = 0; e < 32; e++) {
            int q = d > 0 ? iclamp(iround(x[e] / d), -half, half - 1) : 0;
            ref_put_q(t, b, e, t == CB_TYPE_Q8_0 ? q : q + half);
        }
        break;
    }
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_1: {
        int nmax = t == CB_TYPE_Q4_1 ? 15 : 31;
        uint16_t dh = ref_f2h((hi - lo) / (float)nmax), mh = ref_f2h(lo);
        float d = ref_h2f(dh), m = ref_h2f(mh);
        put16(b, dh);
        put16(b + 2, mh);
        for (int e = 0; e < 32; e++)
            ref_put_q(t, b, e, d > 0 ? iclamp(iround((x[e] - m) / d), 0, nmax) : 0);
        break;
    }
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K: {
        int nmax = t == CB_TYPE_Q4_K ? 15 : 31;
        float s[8], mn[8], smax = 0, mmax = 0;
        for (int j = 0; j < 8; j++) {
            float l = 0, h = -FLT_MAX;
            for (int e = 32 * j; e < 32 * j + 32; e++) {
                l = fminf(l, x[e]);
                h = fmaxf(h, x[e]);
            }
            s[j] = (h - l) / (float)nmax;
            mn[j] = -l;
            smax = fmaxf(smax, s[j]);
            mmax = fmaxf(mmax, mn[j]);
        }
        uint16_t dh = ref_f2h(smax / 63), mh = ref_f2h(mmax / 63);
        float d = ref_h2f(dh), dmin = ref_h2f(mh);
        put16(b, dh);
        put16(b + 2, mh);
        for (int j = 0; j < 8; j++) {
            int sc = d > 0 ? iclamp(iround(s[j] / d), 0, 63) : 0;
            int m = dmin > 0 ? iclamp(iround(mn[j] / dmin), 0, 63) : 0;
            float step = d * (float)sc, off = dmin * (float)m;
            ref_put_k_scale(b + 4, j, sc, m);
            for (int e = 32 * j; e < 32 * j + 32; e++)
                ref_put_q(t, b, e, step > 0 ? iclamp(iround((x[e] + off) / step), 0, nmax) : 0);
        }
        break;
    }
    case CB_TYPE_Q6_K: {
        float s[16], smax = 0;
        for (int j = 0; j < 16; j++) {
            float a = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                a = fmaxf(a, fabsf(x[e]));
            s[j] = a / 31;
            smax = fmaxf(smax, s[j]);
        }
        uint16_t dh = ref_f2h(smax / 127);
        float d = ref_h2f(dh);
        put16(b + 208, dh);
        for (int j = 0; j < 16; j++) {
            int sc = d > 0 ? iclamp(iround(s[j] / d), -127, 127) : 0;
            float step = d * (float)sc;
            b[192 + j] = (uint8_t)(int8_t)sc;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                ref_put_q(t, b, e, (step > 0 ? iclamp(iround(x[e] / step), -32, 31) : 0) + 32);
        }
        break;
    }
    default: break;
    }
}

/* ------------------------------------------------------- test data */

/* Rows that exercise the scale choices: a sinusoid plus noise, sub-blocks of
 * very different magnitudes, all positive, all negative, zero and constant
 * blocks, and large and small amplitudes. */
static void make_data(float *x)
{
    for (int r = 0; r < N_ROWS; r++) {
        float *row = x + r * N_COLS;
        for (int i = 0; i < N_COLS; i++) {
            float v;
            switch (r) {
            case 0: v = sinf(0.05f * (float)i) + 0.3f * lcg_unit(); break;
            case 1: v = lcg_unit() * ldexpf(1.0f, -((i / 16) % 8)); break;
            case 2: v = 0.5f + 0.5f * lcg_unit(); break;
            case 3: v = -2.0f + 0.25f * cosf(0.3f * (float)i) + 0.1f * lcg_unit(); break;
            case 4: v = i < 64 ? 0.0f : i < 128 ? 0.75f : i < 256 ? 0.0f : lcg_unit(); break;
            default: v = (i < 256 ? 100.0f : 0.01f) * lcg_unit(); break;
            }
            row[i] = v;
        }
    }
}

/* Per-type error allowance, as a fraction of the largest magnitude in the
 * element's block (32 elements, or the 256 of a K-quant super-block): one
 * quantization step with a little room for the f16 scales. */
static double err_frac(cb_type t)
{
    switch (t) {
    case CB_TYPE_Q8_0: return 1.0 / 127;
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q4_K: return 1.02 / 8;
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1:
    case CB_TYPE_Q5_K: return 1.02 / 16;
    case CB_TYPE_Q6_K: return 1.05 / 32;
    default: return 0;
    }
}

/* Check y against x: the plain types element-wise, the quantized ones
 * against err_frac both in the worst case and in RMS (which must be well
 * under one step, as rounding gives about 0.29 of one). */
static void check_close(cb_type t, const float *x, const float *y, int n, const char *what)
{
    int be = ref_block_elems(t);
    double worst = 0, sum2 = 0;
    int cnt = 0, bad = -1;
    for (int b0 = 0; b0 < n; b0 += be) {
        float amax = 0;
        for (int i = b0; i < b0 + be; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        for (int i = b0; i < b0 + be; i++) {
            double err = fabs((double)y[i] - x[i]), lim;
            switch (t) {
            case CB_TYPE_F32: lim = 0; break;
            case CB_TYPE_F16: lim = fabs(x[i]) * 0x1p-11 + 0x1p-25; break;
            case CB_TYPE_BF16: lim = fabs(x[i]) * 0x1p-7; break; /* the reference truncates */
            default: lim = err_frac(t) * amax; break;
            }
            if (err > lim && bad < 0)
                bad = i;
            if (lim > 0) {
                worst = fmax(worst, err / lim);
                sum2 += (err / lim) * (err / lim);
                cnt++;
            }
        }
    }
    CHECKF(bad < 0, "%s %s: element %d: %.9g for %.9g", what, cb_type_name(t), bad,
           bad < 0 ? 0.0 : y[bad], bad < 0 ? 0.0 : x[bad]);
    if (!is_plain(t) && cnt)
        CHECKF(sqrt(sum2 / cnt) < 0.4, "%s %s: rms error %.3f of the allowance (worst %.3f)", what,
               cb_type_name(t), sqrt(sum2 / cnt), worst);
}

/* Compare the library's output with the reference bit for bit. */
static void check_bits(cb_type t, const float *got, const float *want, int n)
{
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (!same_bits(got[i], want[i]))
            bad = i;
    CHECKF(bad < 0, "%s element %d: got %.9g (0x%08x), want %.9g (0x%08x)", cb_type_name(t), bad,
           bad < 0 ? 0.0 : got[bad], bad < 0 ? 0u : bits_of(got[bad]), bad < 0 ? 0.0 : want[bad],
           bad < 0 ? 0u : bits_of(want[bad]));
}

/* ------------------------------------------------------ type table */

static void test_table(void)
{
    /* ggml's type_traits (ggml.c) with block sizes from ggml-common.h */
    static const struct {
        int id;
        const char *name;
        int64_t blck;
        size_t size;
    } want[] = {
        {0, "f32", 1, 4},
        {1, "f16", 1, 2},
        {2, "q4_0", 32, 2 + 16},
        {3, "q4_1", 32, 4 + 16},
        {6, "q5_0", 32, 2 + 4 + 16},
        {7, "q5_1", 32, 4 + 4 + 16},
        {8, "q8_0", 32, 2 + 32},
        {9, "q8_1", 32, 4 + 32},
        {10, "q2_K", 256, 16 + 64 + 4},
        {11, "q3_K", 256, 32 + 64 + 12 + 2},
        {12, "q4_K", 256, 4 + 12 + 128},
        {13, "q5_K", 256, 4 + 12 + 32 + 128},
        {14, "q6_K", 256, 128 + 64 + 16 + 2},
        {15, "q8_K", 256, 4 + 256 + 2 * 16},
        {16, "iq2_xxs", 256, 2 + 2 * 32},
        {17, "iq2_xs", 256, 2 + 2 * 32 + 8},
        {18, "iq3_xxs", 256, 2 + 3 * 256 / 8},
        {19, "iq1_s", 256, 2 + 32 + 2 * 8},
        {20, "iq4_nl", 32, 2 + 16},
        {21, "iq3_s", 256, 2 + 64 + 8 + 32 + 4},
        {22, "iq2_s", 256, 2 + 64 + 8 + 8},
        {23, "iq4_xs", 256, 2 + 2 + 4 + 128},
        {24, "i8", 1, 1},
        {25, "i16", 1, 2},
        {26, "i32", 1, 4},
        {27, "i64", 1, 8},
        {28, "f64", 1, 8},
        {29, "iq1_m", 256, 32 + 16 + 8},
        {30, "bf16", 1, 2},
        {34, "tq1_0", 256, (256 - 4 * 256 / 64) / 5 + 256 / 64 + 2},
        {35, "tq2_0", 256, 64 + 2},
    };
    static const int gaps[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, 39, 40, 1000};

    tcase("type table: name, block elements and bytes of every ggml type");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cb_type t = (cb_type)want[i].id;
        const char *nm = cb_type_name(t);
        CHECKF(nm && strcmp(nm, want[i].name) == 0, "id %d: name %s", want[i].id,
               nm ? nm : "(null)");
        CHECKF(cb_type_block_elems(t) == want[i].blck, "%s: %lld elements", want[i].name,
               (long long)cb_type_block_elems(t));
        CHECKF(cb_type_block_bytes(t) == want[i].size, "%s: %zu bytes, want %zu", want[i].name,
               cb_type_block_bytes(t), want[i].size);
    }

    tcase("type table: removed and out-of-range ids are unknown");
    for (size_t i = 0; i < sizeof gaps / sizeof gaps[0]; i++) {
        cb_type t = (cb_type)gaps[i];
        CHECKF(cb_type_name(t) == NULL, "id %d", gaps[i]);
        CHECKF(cb_type_block_elems(t) == 0, "id %d", gaps[i]);
        CHECKF(cb_type_block_bytes(t) == 0, "id %d", gaps[i]);
        CHECKF(cb_type_row_bytes(t, 256) == 0, "id %d", gaps[i]);
        CHECKF(!cb_type_is_supported(t), "id %d", gaps[i]);
    }

    tcase("row bytes");
    CHECK(cb_type_row_bytes(CB_TYPE_Q4_K, 256) == 144);
    CHECK(cb_type_row_bytes(CB_TYPE_Q4_K, 4096) == 16 * 144);
    CHECK(cb_type_row_bytes(CB_TYPE_Q5_K, 256) == 176);
    CHECK(cb_type_row_bytes(CB_TYPE_Q6_K, 256) == 210);
    CHECK(cb_type_row_bytes(CB_TYPE_Q8_0, 32) == 34);
    CHECK(cb_type_row_bytes(CB_TYPE_Q8_0, 576) == 18 * 34);
    CHECK(cb_type_row_bytes(CB_TYPE_Q4_0, 64) == 36);
    CHECK(cb_type_row_bytes(CB_TYPE_BF16, 7) == 14);
    CHECK(cb_type_row_bytes(CB_TYPE_F16, 1) == 2);
    CHECK(cb_type_row_bytes(CB_TYPE_F32, 3) == 12);
    CHECK(cb_type_row_bytes(CB_TYPE_IQ4_XS, 256) == 136);
    CHECK(cb_type_row_bytes(CB_TYPE_IQ4_NL, 64) == 36);
    CHECK(cb_type_row_bytes(CB_TYPE_F32, 0) == 0);
    CHECK(cb_type_row_bytes(CB_TYPE_Q4_K, 100) == 0); /* not a multiple */
    CHECK(cb_type_row_bytes(CB_TYPE_Q8_0, 33) == 0);
    CHECK(cb_type_row_bytes(CB_TYPE_F32, -4) == 0);
    CHECK(cb_type_row_bytes(CB_TYPE_F64, INT64_MAX - 7) == 0); /* overflows size_t */

    tcase("supported types");
    for (int id = -1; id < CB_TYPE_COUNT_ + 2; id++) {
        int want_sup = 0;
        for (int i = 0; i < N_SUPPORTED; i++)
            want_sup |= (int)supported[i] == id;
        CHECKF(cb_type_is_supported((cb_type)id) == want_sup, "id %d", id);
    }
}

/* ------------------------------------------------------- conversions */

static void test_f16(void)
{
    tcase("f16: exact values");
    CHECK(cb_f32_to_f16(1.0f) == 0x3c00);
    CHECK(cb_f32_to_f16(-2.0f) == 0xc000);
    CHECK(cb_f32_to_f16(65504.0f) == 0x7bff);        /* largest half */
    CHECK(cb_f32_to_f16(0x1p-24f) == 0x0001);        /* smallest subnormal */
    CHECK(cb_f32_to_f16(0x1p-14f) == 0x0400);        /* smallest normal */
    CHECK(cb_f32_to_f16(1023 * 0x1p-24f) == 0x03ff); /* largest subnormal */
    CHECK(cb_f32_to_f16(0.0f) == 0x0000);
    CHECK(cb_f32_to_f16(-0.0f) == 0x8000);
    CHECK(cb_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(cb_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK((cb_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (cb_f32_to_f16(NAN) & 0x3ff) != 0);
    CHECK((cb_f32_to_f16(float_of(0x7f800001)) & 0x3ff) != 0); /* signalling nan stays nan */
    CHECK(cb_f16_to_f32(0x3c00) == 1.0f);
    CHECK(cb_f16_to_f32(0xc000) == -2.0f);
    CHECK(cb_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(cb_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(cb_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(cb_f16_to_f32(0x3555) == 0x1.554p-2f); /* 0.333251953125 */
    CHECK(cb_f16_to_f32(0x7c00) == INFINITY);
    CHECK(cb_f16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(cb_f16_to_f32(0x7e00)) && isnan(cb_f16_to_f32(0xfc01)));
    CHECK(bits_of(cb_f16_to_f32(0x8000)) == 0x80000000u);

    tcase("f16: rounding to nearest even, overflow and underflow");
    CHECK(cb_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);     /* tie: 0x3c00 is even */
    CHECK(cb_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie: up to even */
    CHECK(cb_f32_to_f16(nextafterf(1.0f + 0x1p-11f, 2)) == 0x3c01);
    CHECK(cb_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(cb_f32_to_f16(65520.0f) == 0x7c00); /* tie: rounds to inf */
    CHECK(cb_f32_to_f16(-1e6f) == 0xfc00);
    CHECK(cb_f32_to_f16(FLT_MAX) == 0x7c00);
    CHECK(cb_f32_to_f16(0x1p-25f) == 0x0000); /* tie with 0: even */
    CHECK(cb_f32_to_f16(nextafterf(0x1p-25f, 1)) == 0x0001);
    CHECK(cb_f32_to_f16(3 * 0x1p-25f) == 0x0002); /* tie 1|2: even */
    CHECK(cb_f32_to_f16(1e-9f) == 0x0000);
    CHECK(cb_f32_to_f16(-1e-9f) == 0x8000);
    CHECK(cb_f32_to_f16(float_of(1)) == 0x0000);         /* f32 subnormal */
    CHECK(cb_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400); /* tie 0x3ff|0x400: even */
    CHECK(cb_f32_to_f16(2047 * 0x1p-10f) == 0x3fff);     /* 1.9990234375, exact */
    CHECK(cb_f32_to_f16(2.0f - 0x1p-11f) == 0x4000);     /* tie: carries into the exponent */

    tcase("f16: every half decodes as defined and encodes back");
    {
        int bad_dec = -1, bad_rt = -1;
        for (int h = 0; h < 65536; h++) {
            float f = cb_f16_to_f32((uint16_t)h);
            if (!same_bits(f, ref_h2f((uint16_t)h)) && bad_dec < 0)
                bad_dec = h;
            if (!isnan(f) && cb_f32_to_f16(f) != h && bad_rt < 0)
                bad_rt = h;
            if (isnan(f) && (cb_f32_to_f16(f) & 0x7fff) <= 0x7c00 && bad_rt < 0)
                bad_rt = h;
        }
        CHECKF(bad_dec < 0, "decode of 0x%04x", bad_dec);
        CHECKF(bad_rt < 0, "round trip of 0x%04x", bad_rt);
    }

    tcase("f16: midpoints of every pair of halves round to even; random floats as the reference");
    {
        int bad = -1, badr = -1;
        uint32_t badbits = 0;
        for (int h = 0; h < 0x7bff; h++) {
            float lo = ref_h2f((uint16_t)h), hi = ref_h2f((uint16_t)(h + 1));
            float mid = lo + (hi - lo) / 2; /* exact: 12 significant bits */
            uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            if ((cb_f32_to_f16(mid) != even || cb_f32_to_f16(-mid) != (0x8000 | even) ||
                 cb_f32_to_f16(nextafterf(mid, 0)) != h ||
                 cb_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1) &&
                bad < 0)
                bad = h;
        }
        CHECKF(bad < 0, "midpoint above 0x%04x", bad);
        for (int i = 0; i < 200000; i++) {
            /* exponents from f32 subnormals up past the half range */
            uint32_t u = (lcg_next() & 0x807fffffu) | (uint32_t)(lcg_next() % 160) << 23;
            float f = float_of(u);
            if (cb_f32_to_f16(f) != ref_f2h(f) && badr < 0) {
                badr = i;
                badbits = u;
            }
        }
        CHECKF(badr < 0, "0x%08x: got 0x%04x, want 0x%04x", badbits,
               cb_f32_to_f16(float_of(badbits)), ref_f2h(float_of(badbits)));
    }
}

static void test_bf16(void)
{
    tcase("bf16: exact values, rounding, nan");
    CHECK(cb_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(cb_f32_to_bf16(-2.0f) == 0xc000);
    CHECK(cb_f32_to_bf16(3.140625f) == 0x4049);
    CHECK(cb_f32_to_bf16(float_of(0x3f808000)) == 0x3f80); /* tie: even */
    CHECK(cb_f32_to_bf16(float_of(0x3f818000)) == 0x3f82); /* tie: up to even */
    CHECK(cb_f32_to_bf16(float_of(0x3f808001)) == 0x3f81);
    CHECK(cb_f32_to_bf16(float_of(0x3f80ffff)) == 0x3f81);
    CHECK(cb_f32_to_bf16(float_of(0x3f817fff)) == 0x3f81);
    CHECK(cb_f32_to_bf16(FLT_MAX) == 0x7f80); /* past the last bf16 */
    CHECK(cb_f32_to_bf16(INFINITY) == 0x7f80);
    CHECK(cb_f32_to_bf16(-INFINITY) == 0xff80);
    CHECK(cb_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(cb_f32_to_bf16(float_of(0x00018000)) == 0x0002); /* subnormal tie: even */
    {
        uint16_t qn = cb_f32_to_bf16(NAN), sn = cb_f32_to_bf16(float_of(0x7f800001));
        uint16_t nn = cb_f32_to_bf16(float_of(0xffc00000));
        CHECKF((qn & 0x7f80) == 0x7f80 && (qn & 0x7f), "0x%04x", qn);
        CHECKF((sn & 0x7f80) == 0x7f80 && (sn & 0x7f), "signalling nan gave 0x%04x", sn);
        CHECKF((nn & 0xff80) == 0xff80 && (nn & 0x7f), "-nan gave 0x%04x", nn);
    }
    CHECK(cb_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(cb_bf16_to_f32(0xc000) == -2.0f);
    CHECK(cb_bf16_to_f32(0x4049) == 3.140625f);
    CHECK(cb_bf16_to_f32(0x7f80) == INFINITY);
    CHECK(isnan(cb_bf16_to_f32(0x7fc0)));

    tcase("bf16: every value decodes as defined; random floats round as the reference");
    {
        int bad = -1, badr = -1;
        uint32_t badbits = 0;
        for (int h = 0; h < 65536; h++) {
            float f = cb_bf16_to_f32((uint16_t)h);
            if ((!same_bits(f, ref_bf2f((uint16_t)h)) || (!isnan(f) && cb_f32_to_bf16(f) != h)) &&
                bad < 0)
                bad = h;
        }
        CHECKF(bad < 0, "0x%04x", bad);
        for (int i = 0; i < 200000; i++) {
            uint32_t u = lcg_next();
            if (i % 4 == 0) /* many exact ties */
                u = (u & 0xffff0000u) | 0x8000;
            float f = float_of(u);
            uint16_t got = cb_f32_to_bf16(f), want = ref_f2bf(f);
            if (isnan(f) ? !isnan(cb_bf16_to_f32(got)) : got != want) {
                if (badr < 0) {
                    badr = i;
                    badbits = u;
                }
            }
        }
        CHECKF(badr < 0, "0x%08x: got 0x%04x, want 0x%04x", badbits,
               cb_f32_to_bf16(float_of(badbits)), ref_f2bf(float_of(badbits)));
    }
}

/* ------------------------------------------------ hand-built blocks */

/* Dequantize the hand-built block at an odd address (no alignment needed). */
static void deq_hand(cb_type t, const uint8_t *blk, size_t size, float *y, int64_t n)
{
    uint8_t buf[512];
    memcpy(buf + 1, blk, size);
    CHECK_OK(cb_dequant_row(t, buf + 1, y, n));
}

static void test_hand_blocks(void)
{
    float y[256];

    tcase("hand block f32");
    {
        /* 0x3f800000 = 1.0, 0xc0000000 = -2.0, little-endian */
        static const uint8_t b[] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
        deq_hand(CB_TYPE_F32, b, sizeof b, y, 2);
        CHECK(y[0] == 1.0f && y[1] == -2.0f);
    }

    tcase("hand block f16");
    {
        /* 0x3c00 = 1.0, 0xc000 = -2.0, 0x7bff = 65504, 0x0001 = 2^-24, 0x7c00 = inf */
        static const uint8_t b[] = {0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00, 0x00, 0x7c};
        deq_hand(CB_TYPE_F16, b, sizeof b, y, 5);
        CHECK(y[0] == 1.0f && y[1] == -2.0f && y[2] == 65504.0f);
        CHECK(y[3] == 5.9604644775390625e-8f && isinf(y[4]) && y[4] > 0);
    }

    tcase("hand block bf16");
    {
        /* 0x3f80 = 1.0; 0x4049 = 2 * (1 + 0x49/128) = 3.140625; 0xbf80 = -1.0 */
        static const uint8_t b[] = {0x80, 0x3f, 0x49, 0x40, 0x80, 0xbf};
        deq_hand(CB_TYPE_BF16, b, sizeof b, y, 3);
        CHECK(y[0] == 1.0f && y[1] == 3.140625f && y[2] == -1.0f);
    }

    tcase("hand block q4_0");
    {
        /* d = 0x3800 = 0.5; qs[0] = 0x9a: element 0 = (0xa-8)*0.5 = 1.0,
         * element 16 = (0x9-8)*0.5 = 0.5; qs[15] = 0x0f: element 15 =
         * (15-8)*0.5 = 3.5, element 31 = (0-8)*0.5 = -4.0; qs 0x88 give 0. */
        uint8_t b[18];
        memset(b, 0x88, sizeof b);
        b[0] = 0x00, b[1] = 0x38, b[2] = 0x9a, b[2 + 15] = 0x0f;
        deq_hand(CB_TYPE_Q4_0, b, sizeof b, y, 32);
        CHECK(y[0] == 1.0f && y[16] == 0.5f && y[15] == 3.5f && y[31] == -4.0f);
        CHECK(y[1] == 0.0f && y[17] == 0.0f);
    }

    tcase("hand block q4_1");
    {
        /* d = 0x3c00 = 1.0, m = 0xbc00 = -1.0; qs[0] = 0x3f: element 0 =
         * 15*1 - 1 = 14, element 16 = 3*1 - 1 = 2; qs[1] = 0: elements 1 and
         * 17 = -1. */
        uint8_t b[20] = {0x00, 0x3c, 0x00, 0xbc, 0x3f};
        deq_hand(CB_TYPE_Q4_1, b, sizeof b, y, 32);
        CHECK(y[0] == 14.0f && y[16] == 2.0f && y[1] == -1.0f && y[17] == -1.0f);
    }

    tcase("hand block q5_0");
    {
        /* d = 1.0; qh = 0x80010001 (bytes 01 00 01 80): 5th bits of elements
         * 0, 16 and 31.  qs[0] = 0x21: element 0 = (1|16)-16 = 1, element 16
         * = (2|16)-16 = 2.  qs[15] = 0xf0: element 31 = (15|16)-16 = 15,
         * element 15 = (0|0)-16 = -16.  qs[1] = 0: element 1 = -16. */
        uint8_t b[22] = {0x00, 0x3c, 0x01, 0x00, 0x01, 0x80, 0x21};
        b[6 + 15] = 0xf0;
        deq_hand(CB_TYPE_Q5_0, b, sizeof b, y, 32);
        CHECK(y[0] == 1.0f && y[16] == 2.0f && y[31] == 15.0f && y[15] == -16.0f);
        CHECK(y[1] == -16.0f && y[17] == -16.0f);
    }

    tcase("hand block q5_1");
    {
        /* d = 0x3800 = 0.5, m = 0x4000 = 2.0; qh bits 2 and 20 (bytes 04 00
         * 10 00).  qs[2] = 0x31: element 2 = (1|16)*0.5 + 2 = 10.5, element
         * 18 = 3*0.5 + 2 = 3.5.  qs[4] = 0xf0: element 20 = (15|16)*0.5 + 2 =
         * 17.5, element 4 = 0*0.5 + 2 = 2. */
        uint8_t b[24] = {0x00, 0x38, 0x00, 0x40, 0x04, 0x00, 0x10, 0x00};
        b[8 + 2] = 0x31;
        b[8 + 4] = 0xf0;
        deq_hand(CB_TYPE_Q5_1, b, sizeof b, y, 32);
        CHECK(y[2] == 10.5f && y[18] == 3.5f && y[20] == 17.5f && y[4] == 2.0f);
        CHECK(y[0] == 2.0f);
    }

    tcase("hand block q8_0");
    {
        /* d = 0x3400 = 0.25; qs 0x7f = 127 -> 31.75, 0x80 = -128 -> -32,
         * 0xfe = -2 -> -0.5. */
        uint8_t b[34] = {0x00, 0x34, 0x7f, 0x80};
        b[2 + 31] = 0xfe;
        deq_hand(CB_TYPE_Q8_0, b, sizeof b, y, 32);
        CHECK(y[0] == 31.75f && y[1] == -32.0f && y[31] == -0.5f && y[2] == 0.0f);
    }

    tcase("hand block q4_K");
    {
        /* d = 1.0, dmin = 0x3800 = 0.5.  Sub-block 0: scale 2, min 1
         * (scales[0] = 2, scales[4] = 1); sub-block 1: scale 3, min 4.
         * Sub-block 5: scale 37 = 0b10_0101, min 50 = 0b11_0010: low nibbles
         * in scales[9] = 0x25, top bits 2 into scales[1] bits 6-7 (0x80|3 =
         * 0x83) and 3 into scales[5] (0xc0|4 = 0xc4).
         * qs[0] = 0x75: element 0 (sub 0, low nibble) = 1*2*5 - 0.5*1 = 9.5;
         * element 32 (sub 1, high nibble) = 1*3*7 - 0.5*4 = 19.
         * Element 160 = sub 5 = group 2, high nibble of qs[64] = 0xa:
         * 37*10 - 0.5*50 = 345.  Element 1 (quant 0) = -0.5, element 128
         * (sub 4: scale 0, min 0) = 0. */
        uint8_t b[144] = {0x00, 0x3c, 0x00, 0x38};
        uint8_t *sc = b + 4, *qs = b + 16;
        sc[0] = 2, sc[4] = 1, sc[1] = 0x83, sc[5] = 0xc4, sc[9] = 0x25;
        qs[0] = 0x75, qs[64] = 0xa0;
        deq_hand(CB_TYPE_Q4_K, b, sizeof b, y, 256);
        CHECK(y[0] == 9.5f && y[32] == 19.0f && y[160] == 345.0f);
        CHECK(y[1] == -0.5f && y[128] == 0.0f);
        CHECK(y[161] == -25.0f); /* 37*0 - 0.5*50 */
    }

    tcase("hand block q5_K");
    {
        /* d = 1.0, dmin = 1.0.  Sub-block 0: scale 1, min 2.  Sub-block 7:
         * scale 63 = 0b11_1111, min 0: scales[11] = 0x0f, scales[3] = 0xc0.
         * qh[0] = 0x01 (5th bit of element 0), qs[0] = 0x03: element 0 =
         * 1*(3+16) - 2 = 17; element 1 = 0 - 2 = -2.  Element 255 = sub 7,
         * group 3, high half, l = 31: high nibble of qs[96+31] = 0xe and qh[31]
         * bit 7: 63*(14+16) - 0 = 1890; element 224 (same group, l = 0) = 0. */
        uint8_t b[176] = {0x00, 0x3c, 0x00, 0x3c};
        uint8_t *sc = b + 4, *qh = b + 16, *qs = b + 48;
        sc[0] = 1, sc[4] = 2, sc[3] = 0xc0, sc[11] = 0x0f;
        qh[0] = 0x01, qs[0] = 0x03;
        qs[96 + 31] = 0xe0, qh[31] = 0x80;
        deq_hand(CB_TYPE_Q5_K, b, sizeof b, y, 256);
        CHECK(y[0] == 17.0f && y[1] == -2.0f && y[255] == 1890.0f && y[224] == 0.0f);
        CHECK(y[32] == 0.0f); /* sub 1: scale 0, min 0 */
    }

    tcase("hand block q6_K");
    {
        /* d = 0x3800 = 0.5 at byte 208; scales[0] = 2, scales[2] = -1,
         * scales[15] = 127.  Element 0: low nibble of ql[0] = 5, bits 0-1 of
         * qh[0] = 2: q = 5 + 32 - 32 = 5 -> 0.5*2*5 = 5.  Element 32: low
         * nibble of ql[32] = 15, bits 2-3 of qh[0] = 3: q = 63-32 = 31 ->
         * 0.5*-1*31 = -15.5.  Element 255: second half, quarter 3, l = 31:
         * high nibble of ql[64+32+31] = 1, bits 6-7 of qh[32+31] = 2: q =
         * 33-32 = 1 -> 0.5*127*1 = 63.5.  Element 1 (all zero bits): q = -32
         * -> 0.5*2*-32 = -32. */
        uint8_t b[210] = {0};
        uint8_t *ql = b, *qh = b + 128;
        int8_t sc[16] = {2, 0, -1};
        sc[15] = 127;
        memcpy(b + 192, sc, 16);
        b[208] = 0x00, b[209] = 0x38;
        ql[0] = 0x05, qh[0] = 0x02 | 0x0c, ql[32] = 0x0f;
        ql[127] = 0x10, qh[63] = 0x80;
        deq_hand(CB_TYPE_Q6_K, b, sizeof b, y, 256);
        CHECK(y[0] == 5.0f && y[32] == -15.5f && y[255] == 63.5f && y[1] == -32.0f);
        CHECK(y[64] == 0.0f); /* scales[4] = 0 */
    }
}

/* ---------------------------------------- against the reference decoder */

/* Random bytes in every quant, scale and min field (the f16 factors kept
 * finite), decoded by the library at an odd address and by the reference. */
static void test_random_blocks(void)
{
    for (int k = 0; k < N_SUPPORTED; k++) {
        cb_type t = supported[k];
        int be = ref_block_elems(t), bb = ref_block_bytes(t);
        int nblk = be == 1 ? 1024 : 4096 / be, n = nblk * be;
        uint8_t *raw = malloc((size_t)nblk * bb + 1);
        float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        uint8_t *blk = raw + 1;

        tcase("random %s blocks: dequant bit-exact with the reference", cb_type_name(t));
        for (int i = 0; i < nblk * bb; i++)
            blk[i] = (uint8_t)lcg_next();
        for (int i = 0; i < nblk; i++) {
            uint8_t *b = blk + (size_t)i * bb;
            switch (t) {
            case CB_TYPE_F32: /* finite values over a wide range */
                memcpy(b, &(float){ldexpf(lcg_unit(), (int)(lcg_next() % 60) - 30)}, 4);
                break;
            case CB_TYPE_Q4_K:
            case CB_TYPE_Q5_K:
                put16(b + 2, ref_f2h(lcg_unit()));
                /* fall through */
            case CB_TYPE_Q4_0:
            case CB_TYPE_Q4_1:
            case CB_TYPE_Q5_0:
            case CB_TYPE_Q5_1:
            case CB_TYPE_Q8_0:
                put16(b, ref_f2h(lcg_unit() * 4));
                if (t == CB_TYPE_Q4_1 || t == CB_TYPE_Q5_1)
                    put16(b + 2, ref_f2h(lcg_unit() * 4));
                break;
            case CB_TYPE_Q6_K: put16(b + 208, ref_f2h(lcg_unit())); break;
            default: break; /* f16, bf16: every pattern, nan and inf included */
            }
        }
        CHECK_OK(cb_dequant_row(t, blk, got, n));
        ref_dequant(t, blk, want, n);
        check_bits(t, got, want, n);
        if (be > 1) { /* the CUDA products' eight at a time: the same bits */
            int bad = 0;
            tcase("random %s blocks: cb_dq8 (eight elements at a time) = the row's dequant",
                  cb_type_name(t));
            for (int i = 0; i < nblk; i++)
                for (int e0 = 0; e0 < be; e0 += 8) {
                    float y[8];
                    cb_dq8((int)t, blk + (size_t)i * bb, e0, y);
                    bad += memcmp(y, got + (size_t)i * be + e0, sizeof y) != 0;
                }
            CHECKF(bad == 0, "%d of %d groups of eight differ", bad, n / 8);
        }
        free(raw);
        free(got);
        free(want);
    }
}

/* The reference quantizer's blocks, decoded by the library: the same floats
 * as the reference decoder's, and close to the data. */
static void test_ref_quant(const float *x)
{
    const int n = N_ROWS * N_COLS;
    for (int k = 0; k < N_SUPPORTED; k++) {
        cb_type t = supported[k];
        int be = ref_block_elems(t), bb = ref_block_bytes(t);
        size_t row_bytes = (size_t)(N_COLS / be) * bb;
        uint8_t *q = malloc(row_bytes * N_ROWS + 3);
        uint8_t *qq = q + 3; /* unaligned */
        float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);

        tcase("reference-quantized %s: dequant bit-exact and close to the data", cb_type_name(t));
        for (int i = 0; i < n / be; i++)
            ref_quant_block(t, x + (size_t)i * be, qq + (size_t)i * bb);
        for (int r = 0; r < N_ROWS; r++) /* row by row, as the loader does */
            CHECK_OK(cb_dequant_row(t, qq + r * row_bytes, got + r * N_COLS, N_COLS));
        ref_dequant(t, qq, want, n);
        check_bits(t, got, want, n);
        check_close(t, x, got, n, "reference quantizer");
        /* all rows in one call give the same */
        CHECK_OK(cb_dequant_row(t, qq, want, n));
        CHECK(memcmp(got, want, sizeof(float) * n) == 0);
        free(q);
        free(got);
        free(want);
    }
}

static void test_lib_quant(const float *x)
{
    const int n = N_ROWS * N_COLS;
    for (int k = 0; k < N_SUPPORTED; k++) {
        cb_type t = supported[k];
        size_t rb = cb_type_row_bytes(t, n);
        uint8_t *q = malloc(rb + 1);
        float *y = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);

        tcase("cb_quant_row %s: round trip within one step", cb_type_name(t));
        CHECK(rb == (size_t)(n / ref_block_elems(t)) * ref_block_bytes(t));
        CHECK_OK(cb_quant_row(t, x, q + 1, n));
        CHECK_OK(cb_dequant_row(t, q + 1, y, n));
        check_close(t, x, y, n, "cb_quant_row");
        /* its blocks decode under the reference too (they are valid ggml) */
        ref_dequant(t, q + 1, want, n);
        check_bits(t, y, want, n);
        if (t == CB_TYPE_F16 || t == CB_TYPE_BF16) {
            int bad = -1;
            for (int i = 0; i < n && bad < 0; i++) {
                uint16_t h = get16(q + 1 + 2 * i);
                if (h != (t == CB_TYPE_F16 ? ref_f2h(x[i]) : ref_f2bf(x[i])))
                    bad = i;
            }
            CHECKF(bad < 0, "element %d rounded differently from the reference", bad);
        }
        free(q);
        free(y);
        free(want);
    }

    /* The library rounds q4_K/q5_K's 6-bit factors up so that no sub-block
     * range is cut short: every value within half of its own sub-block's
     * step (read back from the block), not just of the super-block's. */
    for (int k = 0; k < 2; k++) {
        cb_type t = k ? CB_TYPE_Q5_K : CB_TYPE_Q4_K;
        int bb = ref_block_bytes(t), bad = -1;
        uint8_t *q = malloc((size_t)(n / 256) * bb);
        float *y = malloc(sizeof(float) * n);

        tcase("cb_quant_row %s: nothing clamped, error within half a sub-block step",
              cb_type_name(t));
        CHECK_OK(cb_quant_row(t, x, q, n));
        CHECK_OK(cb_dequant_row(t, q, y, n));
        for (int i = 0; i < n && bad < 0; i++) {
            const uint8_t *b = q + (size_t)(i / 256) * bb;
            int sc, m;
            ref_k_scale(b + 4, (i % 256) / 32, &sc, &m);
            float step = ref_h2f(get16(b)) * (float)sc, off = ref_h2f(get16(b + 2)) * (float)m;
            if (fabsf(y[i] - x[i]) > 0.5f * step + 4 * FLT_EPSILON * (fabsf(x[i]) + off))
                bad = i;
        }
        CHECKF(bad < 0, "element %d: %.9g for %.9g", bad, bad < 0 ? 0.0 : y[bad],
               bad < 0 ? 0.0 : x[bad]);
        free(q);
        free(y);
    }

    tcase("cb_quant_row q8_0 and q4_0: ggml's reference scheme");
    {
        /* ggml's quantize_row_q8_0_ref: d = amax/127, q = round(x/d).
         * x = 0..31 scaled so amax = 127 * 0.5: d = 0.5, q[j] = j. */
        float v[32];
        uint8_t b[34];
        for (int j = 0; j < 32; j++)
            v[j] = 0.5f * (float)(j * 127 / 31);
        CHECK_OK(cb_quant_row(CB_TYPE_Q8_0, v, b, 32));
        CHECK(get16(b) == 0x3800);
        CHECK(b[2 + 0] == 0 && b[2 + 31] == 127 && b[2 + 1] == 4);
        /* quantize_row_q4_0_ref: d = max/-8 with max the signed extreme:
         * v[0] = -4 gives d = 0.5 and q = x/d + 8: -4 -> 0, 3.5 -> 15, 0 -> 8,
         * and +4 -> 16, clamped to 15. */
        for (int j = 0; j < 32; j++)
            v[j] = 0;
        v[0] = -4.0f, v[1] = 3.5f, v[16] = 4.0f;
        CHECK_OK(cb_quant_row(CB_TYPE_Q4_0, v, b, 32));
        CHECK(get16(b) == 0x3800);
        CHECK(b[2] == (0x0 | 0xf << 4) && b[3] == (0xf | 0x8 << 4) && b[4] == 0x88);
    }

    tcase("cb_quant_row: zero and constant blocks");
    {
        float z[256] = {0}, c[256];
        uint8_t b[1024];
        float y[256];
        for (int i = 0; i < 256; i++)
            c[i] = -0.375f;
        for (int k = 0; k < N_SUPPORTED; k++) {
            cb_type t = supported[k];
            int m = ref_block_elems(t) == 1 ? 64 : ref_block_elems(t);
            CHECK_OK(cb_quant_row(t, z, b, m));
            CHECK_OK(cb_dequant_row(t, b, y, m));
            for (int i = 0; i < m; i++)
                CHECKF(y[i] == 0.0f, "%s zeros: element %d = %g", cb_type_name(t), i, y[i]);
            CHECK_OK(cb_quant_row(t, c, b, m));
            CHECK_OK(cb_dequant_row(t, b, y, m));
            /* within one step of the constant */
            for (int i = 0; i < m; i++)
                CHECKF(fabsf(y[i] + 0.375f) <= 0.375f * (float)err_frac(t),
                       "%s constant: element %d = %g", cb_type_name(t), i, y[i]);
        }
    }
}

static void test_errors(void)
{
    float x[512] = {0}, y[512];
    uint8_t b[1024];

    tcase("errors: bad n and unsupported types");
    CHECK(cb_dequant_row(CB_TYPE_Q4_0, b, y, 33) == CB_ERR_INVALID);
    CHECK(cb_dequant_row(CB_TYPE_Q4_K, b, y, 128) == CB_ERR_INVALID);
    CHECK(cb_dequant_row(CB_TYPE_Q6_K, b, y, 257) == CB_ERR_INVALID);
    CHECK(cb_dequant_row(CB_TYPE_F32, b, y, -1) == CB_ERR_INVALID);
    CHECK(cb_dequant_row(CB_TYPE_F16, NULL, y, 4) == CB_ERR_INVALID);
    CHECK(cb_quant_row(CB_TYPE_Q8_0, x, b, 31) == CB_ERR_INVALID);
    CHECK(cb_quant_row(CB_TYPE_Q5_K, x, b, 300) == CB_ERR_INVALID);
    CHECK(cb_quant_row(CB_TYPE_BF16, x, b, -2) == CB_ERR_INVALID);
    CHECK(cb_dequant_row(CB_TYPE_Q2_K, b, y, 256) == CB_ERR_UNSUPPORTED);
    CHECK(cb_dequant_row(CB_TYPE_IQ4_XS, b, y, 256) == CB_ERR_UNSUPPORTED);
    CHECK(cb_dequant_row(CB_TYPE_Q8_1, b, y, 32) == CB_ERR_UNSUPPORTED);
    CHECK(cb_dequant_row(CB_TYPE_I32, b, y, 4) == CB_ERR_UNSUPPORTED);
    CHECK(cb_dequant_row((cb_type)4, b, y, 32) == CB_ERR_UNSUPPORTED);
    CHECK(cb_dequant_row((cb_type)99, b, y, 32) == CB_ERR_UNSUPPORTED);
    CHECK(cb_quant_row(CB_TYPE_Q3_K, x, b, 256) == CB_ERR_UNSUPPORTED);
    CHECK(cb_quant_row(CB_TYPE_TQ2_0, x, b, 256) == CB_ERR_UNSUPPORTED);
    CHECK(cb_dequant_row(CB_TYPE_Q4_K, b, y, 0) == CB_OK);
    CHECK(cb_quant_row(CB_TYPE_Q4_K, x, b, 0) == CB_OK);
}

int main(void)
{
    static float x[N_ROWS * N_COLS];

    TEST_BEGIN();
    make_data(x);
    test_table();
    test_f16();
    test_bf16();
    test_hand_blocks();
    test_random_blocks();
    test_ref_quant(x);
    test_lib_quant(x);
    test_errors();
    TEST_END();
}
