/* quant.c - tensor element types: the ggml type table, dequantization of the
 * types the model loader reads, simple quantizers for test fixtures, and the
 * f16/bf16 conversions.
 *
 * Block layouts are ggml's (ggml/src/ggml-common.h); dequant.h describes
 * them and holds the per-element formulas, shared with the CUDA backend.
 *
 * The dequantizers compute exactly ggml's float expressions, in the same
 * order, so that their outputs are bit-identical to ggml's reference code.
 * The inner loops have fixed trip counts and no calls so gcc vectorizes them
 * (measured: 1.3-6e9 weights/s per core for the block types at -O2). */
#include "core.h"
#include "dequant.h"

#include <math.h>
#include <string.h>

/* ------------------------------------------------------------ type table */

struct cb_type_traits {
    const char *name;
    int64_t blck; /* elements per block */
    size_t size;  /* bytes per block */
};

/* ggml's type_traits: names as ggml_type_name() prints them; the removed ids
 * (4, 5, 31-33, 36-38) and anything past TQ2_0 stay zero = unknown. */
static const struct cb_type_traits type_traits[CB_TYPE_COUNT_] = {
    [CB_TYPE_F32] = {"f32", 1, 4},
    [CB_TYPE_F16] = {"f16", 1, 2},
    [CB_TYPE_Q4_0] = {"q4_0", 32, 18},
    [CB_TYPE_Q4_1] = {"q4_1", 32, 20},
    [CB_TYPE_Q5_0] = {"q5_0", 32, 22},
    [CB_TYPE_Q5_1] = {"q5_1", 32, 24},
    [CB_TYPE_Q8_0] = {"q8_0", 32, 34},
    [CB_TYPE_Q8_1] = {"q8_1", 32, 36},   /* d, s: f16; qs[32] */
    [CB_TYPE_Q2_K] = {"q2_K", 256, 84},  /* scales[16] qs[64] d dmin */
    [CB_TYPE_Q3_K] = {"q3_K", 256, 110}, /* hmask[32] qs[64] scales[12] d */
    [CB_TYPE_Q4_K] = {"q4_K", 256, 144},
    [CB_TYPE_Q5_K] = {"q5_K", 256, 176},
    [CB_TYPE_Q6_K] = {"q6_K", 256, 210},
    [CB_TYPE_Q8_K] = {"q8_K", 256, 292},      /* d:f32 qs[256] bsums:i16[16] */
    [CB_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66}, /* d qs:u16[32] */
    [CB_TYPE_IQ2_XS] = {"iq2_xs", 256, 74},   /* d qs:u16[32] scales[8] */
    [CB_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98}, /* d qs[96] */
    [CB_TYPE_IQ1_S] = {"iq1_s", 256, 50},     /* d qs[32] qh:u16[8] */
    [CB_TYPE_IQ4_NL] = {"iq4_nl", 32, 18},    /* d qs[16] */
    [CB_TYPE_IQ3_S] = {"iq3_s", 256, 110},    /* d qs[64] qh[8] signs[32] scales[4] */
    [CB_TYPE_IQ2_S] = {"iq2_s", 256, 82},     /* d qs[64] qh[8] scales[8] */
    [CB_TYPE_IQ4_XS] = {"iq4_xs", 256, 136},  /* d scales_h:u16 scales_l[4] qs[128] */
    [CB_TYPE_I8] = {"i8", 1, 1},
    [CB_TYPE_I16] = {"i16", 1, 2},
    [CB_TYPE_I32] = {"i32", 1, 4},
    [CB_TYPE_I64] = {"i64", 1, 8},
    [CB_TYPE_F64] = {"f64", 1, 8},
    [CB_TYPE_IQ1_M] = {"iq1_m", 256, 56}, /* qs[32] qh[16] scales[8] */
    [CB_TYPE_BF16] = {"bf16", 1, 2},
    [CB_TYPE_TQ1_0] = {"tq1_0", 256, 54}, /* qs[48] qh[4] d */
    [CB_TYPE_TQ2_0] = {"tq2_0", 256, 66}, /* qs[64] d */
};

/* NULL for ids outside the table or in one of its gaps. */
static const struct cb_type_traits *traits_of(cb_type t)
{
    if ((int)t < 0 || (int)t >= CB_TYPE_COUNT_ || type_traits[t].blck == 0)
        return NULL;
    return &type_traits[t];
}

const char *cb_type_name(cb_type t)
{
    if (t == CB_TYPE_KIVI4) /* not a tensor type: no traits, only a name */
        return "kivi4";
    if (t == CB_TYPE_CODED)
        return "coded";
    const struct cb_type_traits *tt = traits_of(t);
    return tt ? tt->name : NULL;
}

int64_t cb_type_block_elems(cb_type t)
{
    const struct cb_type_traits *tt = traits_of(t);
    return tt ? tt->blck : 0;
}

size_t cb_type_block_bytes(cb_type t)
{
    const struct cb_type_traits *tt = traits_of(t);
    return tt ? tt->size : 0;
}

/* Also 0 for n < 0 and when the size does not fit in size_t, so that a GGUF
 * reader can treat 0 as "reject" for any n > 0. */
size_t cb_type_row_bytes(cb_type t, int64_t n)
{
    const struct cb_type_traits *tt = traits_of(t);
    uint64_t nb;
    if (!tt || n < 0 || n % tt->blck != 0)
        return 0;
    nb = (uint64_t)(n / tt->blck);
    if (nb > SIZE_MAX / tt->size)
        return 0;
    return (size_t)nb * tt->size;
}

int cb_type_is_supported(cb_type t)
{
    switch (t) {
    case CB_TYPE_F32:
    case CB_TYPE_F16:
    case CB_TYPE_BF16:
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1:
    case CB_TYPE_Q8_0:
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

/* ------------------------------------------------------ f16 / bf16 */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline float f16_to_f32(uint16_t h) { return cb_dq_f16(h); }

static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
    uint32_t a = x & 0x7fffffff;

    if (a >= 0x7f800000u) /* inf, or nan kept quiet with the payload's top bits */
        return sign | 0x7c00 | (a > 0x7f800000u ? 0x200 | (a >> 13 & 0x3ff) : 0);
    if (a >= 0x477ff000u) /* >= 65520, halfway from 65504 to 2^16: rounds up */
        return sign | 0x7c00;
    if (a >= 0x38800000u) { /* >= 2^-14: a normal half */
        uint32_t r = a - ((127u - 15u) << 23);
        r += 0xfff + (r >> 13 & 1); /* round to nearest even; may carry into exp */
        return sign | (uint16_t)(r >> 13);
    }
    /* a subnormal half (or zero): count units of 2^-24 */
    {
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffff) | 0x800000; /* value = m * 2^(e-150) */
        uint32_t shift = 126 - e;               /* bits below 2^-24 */
        uint32_t q, rem, half;
        if (shift > 24) /* below 2^-25: rounds to zero */
            return sign;
        q = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++; /* 0x400 is the smallest normal, correctly encoded */
        return sign | (uint16_t)q;
    }
}

static inline float bf16_to_f32(uint16_t h) { return cb_dq_bf16(h); }

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000u) /* nan: truncating could make it inf */
        return (uint16_t)(x >> 16 | 0x40);
    return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}

float cb_f16_to_f32(uint16_t h) { return f16_to_f32(h); }
uint16_t cb_f32_to_f16(float f) { return f32_to_f16(f); }
float cb_bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t cb_f32_to_bf16(float f) { return f32_to_bf16(f); }

/* ----------------------------------------------------- dequantization */

/* Each deq_* takes nb blocks (or elements for the plain types); the
 * formulas are dequant.h's, shared with the CUDA kernels. */

static void deq_f16(const uint8_t *restrict p, float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = cb_dq_f16(cb_dq_rd16(p + 2 * i));
}

static void deq_bf16(const uint8_t *restrict p, float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = cb_dq_bf16(cb_dq_rd16(p + 2 * i));
}

static void deq_q4_0(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q4_0_BYTES, y += 32) {
        const float d = cb_dq_d(b, 0);
        for (int j = 0; j < 16; j++)
            cb_dq_q4_0(b[2 + j], d, &y[j], &y[j + 16]);
    }
}

static void deq_q4_1(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q4_1_BYTES, y += 32) {
        const float d = cb_dq_d(b, 0), m = cb_dq_d(b, 2);
        for (int j = 0; j < 16; j++)
            cb_dq_q4_1(b[4 + j], d, m, &y[j], &y[j + 16]);
    }
}

/* O3 for the 5-bit types: at -O2 gcc 12 does not vectorize the per-element
 * 5th-bit select through dequant.h's functions (1.3 vs 5.3 Gelem/s) */
__attribute__((optimize("O3"))) static void deq_q5_0(const uint8_t *restrict b, float *restrict y,
                                                     int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q5_0_BYTES, y += 32) {
        const float d = cb_dq_d(b, 0);
        const uint32_t qh = cb_dq_rd32(b + 2);
        for (int j = 0; j < 16; j++)
            cb_dq_q5_0(b[6 + j], qh, j, d, &y[j], &y[j + 16]);
    }
}

__attribute__((optimize("O3"))) static void deq_q5_1(const uint8_t *restrict b, float *restrict y,
                                                     int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q5_1_BYTES, y += 32) {
        const float d = cb_dq_d(b, 0), m = cb_dq_d(b, 2);
        const uint32_t qh = cb_dq_rd32(b + 4);
        for (int j = 0; j < 16; j++)
            cb_dq_q5_1(b[8 + j], qh, j, d, m, &y[j], &y[j + 16]);
    }
}

static void deq_q8_0(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q8_0_BYTES, y += 32) {
        const float d = cb_dq_d(b, 0);
        for (int j = 0; j < 32; j++)
            y[j] = cb_dq_q8_0((int8_t)b[2 + j], d);
    }
}

static void deq_q4_k(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q4_K_BYTES)
        for (int g = 0; g < 4; g++, y += 64) {
            float f[4];
            cb_dq_k_group(b, g, f);
            for (int l = 0; l < 32; l++)
                cb_dq_q4_k(b[16 + 32 * g + l], f, &y[l], &y[l + 32]);
        }
}

__attribute__((optimize("O3"))) static void deq_q5_k(const uint8_t *restrict b, float *restrict y,
                                                     int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q5_K_BYTES)
        for (int g = 0; g < 4; g++, y += 64) {
            float f[4];
            cb_dq_k_group(b, g, f);
            for (int l = 0; l < 32; l++)
                cb_dq_q5_k(b[48 + 32 * g + l], b[16 + l], g, f, &y[l], &y[l + 32]);
        }
}

static void deq_q6_k(const uint8_t *restrict b, float *restrict y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, b += CB_Q6_K_BYTES)
        for (int n = 0; n < 2; n++, y += 128) {
            float ds[8];
            cb_dq_q6_k_scales(b, n, ds);
            for (int l = 0; l < 32; l++) {
                float q[4];
                cb_dq_q6_k(b[64 * n + l], b[64 * n + l + 32], b[128 + 32 * n + l], l, ds, q);
                y[l] = q[0];
                y[l + 32] = q[1];
                y[l + 64] = q[2];
                y[l + 96] = q[3];
            }
        }
}

/* Shared argument checks: CB_OK with *nblk = blocks (or elements). */
static cb_status check_row(cb_type t, const void *src, const void *dst, int64_t n, int64_t *nblk)
{
    int64_t bs;
    if (!cb_type_is_supported(t))
        return CB_ERR_UNSUPPORTED;
    bs = type_traits[t].blck;
    if (n < 0 || n % bs != 0 || (n > 0 && (!src || !dst)))
        return CB_ERR_INVALID;
    *nblk = n / bs;
    return CB_OK;
}

cb_status cb_dequant_row(cb_type t, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    int64_t nb;
    cb_status st = check_row(t, src, dst, n, &nb);
    if (st != CB_OK || n == 0)
        return st;
    switch (t) {
    case CB_TYPE_F32: memcpy(dst, s, (size_t)n * sizeof(float)); break;
    case CB_TYPE_F16: deq_f16(s, dst, n); break;
    case CB_TYPE_BF16: deq_bf16(s, dst, n); break;
    case CB_TYPE_Q4_0: deq_q4_0(s, dst, nb); break;
    case CB_TYPE_Q4_1: deq_q4_1(s, dst, nb); break;
    case CB_TYPE_Q5_0: deq_q5_0(s, dst, nb); break;
    case CB_TYPE_Q5_1: deq_q5_1(s, dst, nb); break;
    case CB_TYPE_Q8_0: deq_q8_0(s, dst, nb); break;
    case CB_TYPE_Q4_K: deq_q4_k(s, dst, nb); break;
    case CB_TYPE_Q5_K: deq_q5_k(s, dst, nb); break;
    case CB_TYPE_Q6_K: deq_q6_k(s, dst, nb); break;
    default: return CB_ERR_INTERNAL; /* cb_type_is_supported and this disagree */
    }
    return CB_OK;
}

/* ------------------------------------------------------- quantization */

/* The legacy types follow ggml's reference quantizers (quantize_row_*_ref),
 * so fixtures match what llama.cpp's tools would write for the same floats.
 * The K-quants use a plain min/max scheme instead of ggml's search: round
 * the 6- and 8-bit sub-block factors up, never down, so that every sub-block
 * range stays covered and no value is clamped by more than rounding. */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Nearest int of a float already known to be in a small range. */
static inline int nearest(float v) { return (int)lrintf(v); }

/* The smallest half >= v (v >= 0, finite, <= 65504): scales stored this way
 * never fall short of what a block needs. */
static uint16_t f16_up(float v)
{
    uint16_t h = f32_to_f16(v);
    if (f16_to_f32(h) < v && h < 0x7bff)
        h++;
    return h;
}

/* Signed value of largest magnitude (first one on ties), as ggml picks it. */
static float signed_absmax(const float *x, int n)
{
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < lo)
            lo = x[j];
        if (x[j] > hi)
            hi = x[j];
    }
    *mn = lo;
    *mx = hi;
}

/* q4_0/q5_0: d = max/-2^(bits-1), so the largest magnitude maps to -2^(bits-1). */
static void quant_q4_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 18) {
        const float d = signed_absmax(x, 32) / -8;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        wr16(b, f32_to_f16(d));
        for (int j = 0; j < 16; j++) {
            int q0 = clampi((int)(x[j] * id + 8.5f), 0, 15);
            int q1 = clampi((int)(x[j + 16] * id + 8.5f), 0, 15);
            b[2 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void quant_q4_1(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 20) {
        float mn, mx;
        min_max(x, 32, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        wr16(b, f32_to_f16(d));
        wr16(b + 2, f32_to_f16(mn));
        for (int j = 0; j < 16; j++) {
            int q0 = clampi((int)((x[j] - mn) * id + 0.5f), 0, 15);
            int q1 = clampi((int)((x[j + 16] - mn) * id + 0.5f), 0, 15);
            b[4 + j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void quant_q5_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 22) {
        const float d = signed_absmax(x, 32) / -16;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        wr16(b, f32_to_f16(d));
        for (int j = 0; j < 16; j++) {
            int q0 = clampi((int)(x[j] * id + 16.5f), 0, 31);
            int q1 = clampi((int)(x[j + 16] * id + 16.5f), 0, 31);
            b[6 + j] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        wr16(b + 2, (uint16_t)qh);
        wr16(b + 4, (uint16_t)(qh >> 16));
    }
}

static void quant_q5_1(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 24) {
        float mn, mx;
        min_max(x, 32, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        wr16(b, f32_to_f16(d));
        wr16(b + 2, f32_to_f16(mn));
        for (int j = 0; j < 16; j++) {
            int q0 = clampi((int)((x[j] - mn) * id + 0.5f), 0, 31);
            int q1 = clampi((int)((x[j + 16] - mn) * id + 0.5f), 0, 31);
            b[8 + j] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        wr16(b + 4, (uint16_t)qh);
        wr16(b + 6, (uint16_t)(qh >> 16));
    }
}

static void quant_q8_0(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 32, b += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        wr16(b, f32_to_f16(d));
        for (int j = 0; j < 32; j++)
            b[2 + j] = (uint8_t)(int8_t)clampi((int)roundf(x[j] * id), -127, 127);
    }
}

/* One q4_K (nmax 15) or q5_K (nmax 31) super-block: fills d, dmin (at hdr),
 * the packed scales[12] and the quants L[256] in 0..nmax.  Each sub-block j
 * of 32 is x ~= d*ls[j]*q - dmin*lm[j]; the offset dmin*lm[j] must reach
 * down to min(0, min x) and d*ls[j]*nmax up from there to max x. */
static void quant_kx_block(const float *x, int nmax, uint8_t *hdr, uint8_t *scales, uint8_t *L)
{
    float lo[8], hi[8], s[8], max_off = 0, max_s = 0;
    int ls[8], lm[8];

    for (int j = 0; j < 8; j++) {
        min_max(x + 32 * j, 32, &lo[j], &hi[j]);
        if (lo[j] > 0) /* the offset can only be subtracted */
            lo[j] = 0;
        max_off = fmaxf(max_off, -lo[j]);
    }
    const uint16_t dmin_h = f16_up(max_off / 63);
    const float dmin = f16_to_f32(dmin_h);
    for (int j = 0; j < 8; j++) {
        lm[j] = dmin > 0 ? clampi((int)ceilf(-lo[j] / dmin), 0, 63) : 0;
        s[j] = (hi[j] + dmin * (float)lm[j]) / (float)nmax;
        max_s = fmaxf(max_s, s[j]);
    }
    const uint16_t d_h = f16_up(max_s / 63);
    const float d = f16_to_f32(d_h);
    for (int j = 0; j < 8; j++)
        ls[j] = d > 0 ? clampi((int)ceilf(s[j] / d), 0, 63) : 0;

    wr16(hdr, d_h);
    wr16(hdr + 2, dmin_h);
    for (int j = 0; j < 4; j++) { /* the layout get_scale_min reads */
        scales[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0x0f) | (lm[j + 4] & 0x0f) << 4);
    }
    for (int j = 0; j < 8; j++) {
        /* the very products the dequantizer forms */
        const float dd = d * (float)ls[j], off = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++) {
            const float v = x[32 * j + l];
            L[32 * j + l] = (uint8_t)(dd > 0 ? clampi(nearest((v + off) / dd), 0, nmax) : 0);
        }
    }
}

static void quant_q4_k(const float *x, uint8_t *b, int64_t nb)
{
    uint8_t L[256];
    for (int64_t i = 0; i < nb; i++, x += 256, b += 144) {
        quant_kx_block(x, 15, b, b + 4, L);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                b[16 + 32 * g + l] = (uint8_t)(L[64 * g + l] | L[64 * g + 32 + l] << 4);
    }
}

static void quant_q5_k(const float *x, uint8_t *b, int64_t nb)
{
    uint8_t L[256];
    for (int64_t i = 0; i < nb; i++, x += 256, b += 176) {
        uint8_t *qh = b + 16, *qs = b + 48;
        quant_kx_block(x, 31, b, b + 4, L);
        memset(qh, 0, 32);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                int q0 = L[64 * g + l], q1 = L[64 * g + 32 + l];
                qs[32 * g + l] = (uint8_t)((q0 & 0x0f) | (q1 & 0x0f) << 4);
                qh[l] |= (uint8_t)((q0 >> 4) << (2 * g) | (q1 >> 4) << (2 * g + 1));
            }
        }
    }
}

/* q6_K: sub-block scale s = max/-32 (largest magnitude to q = -32), then the
 * int8 factors of d rounded away from zero so |d*sc| >= |s|. */
static void quant_q6_k(const float *x, uint8_t *b, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += 256, b += 210) {
        float s[16], max_s = 0;
        int sc[16];
        uint8_t L[256];

        for (int j = 0; j < 16; j++) {
            s[j] = signed_absmax(x + 16 * j, 16) / -32;
            max_s = fmaxf(max_s, fabsf(s[j]));
        }
        const uint16_t d_h = f16_up(max_s / 127);
        const float d = f16_to_f32(d_h);
        for (int j = 0; j < 16; j++) {
            int a = d > 0 ? clampi((int)ceilf(fabsf(s[j]) / d), 0, 127) : 0;
            sc[j] = s[j] < 0 ? -a : a;
        }
        for (int j = 0; j < 16; j++) {
            const float dd = d * (float)sc[j];
            for (int l = 0; l < 16; l++) {
                int q = dd != 0 ? clampi(nearest(x[16 * j + l] / dd), -32, 31) : 0;
                L[16 * j + l] = (uint8_t)(q + 32);
            }
        }
        for (int n = 0; n < 2; n++) {
            uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
            const uint8_t *Ln = L + 128 * n;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Ln[l] & 0x0f) | (Ln[l + 64] & 0x0f) << 4);
                ql[l + 32] = (uint8_t)((Ln[l + 32] & 0x0f) | (Ln[l + 96] & 0x0f) << 4);
                qh[l] = (uint8_t)(Ln[l] >> 4 | (Ln[l + 32] >> 4) << 2 | (Ln[l + 64] >> 4) << 4 |
                                  (Ln[l + 96] >> 4) << 6);
            }
        }
        for (int j = 0; j < 16; j++)
            b[192 + j] = (uint8_t)(int8_t)sc[j];
        wr16(b + 208, d_h);
    }
}

/* Inputs are expected finite and, for the f16-scaled types, within half
 * range (|x| well under 65504); anything else gives unspecified quants. */
cb_status cb_quant_row(cb_type t, const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    int64_t nb;
    cb_status st = check_row(t, src, dst, n, &nb);
    if (st != CB_OK || n == 0)
        return st;
    switch (t) {
    case CB_TYPE_F32: memcpy(d, src, (size_t)n * sizeof(float)); break;
    case CB_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            wr16(d + 2 * i, f32_to_f16(src[i]));
        break;
    case CB_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            wr16(d + 2 * i, f32_to_bf16(src[i]));
        break;
    case CB_TYPE_Q4_0: quant_q4_0(src, d, nb); break;
    case CB_TYPE_Q4_1: quant_q4_1(src, d, nb); break;
    case CB_TYPE_Q5_0: quant_q5_0(src, d, nb); break;
    case CB_TYPE_Q5_1: quant_q5_1(src, d, nb); break;
    case CB_TYPE_Q8_0: quant_q8_0(src, d, nb); break;
    case CB_TYPE_Q4_K: quant_q4_k(src, d, nb); break;
    case CB_TYPE_Q5_K: quant_q5_k(src, d, nb); break;
    case CB_TYPE_Q6_K: quant_q6_k(src, d, nb); break;
    default: return CB_ERR_INTERNAL;
    }
    return CB_OK;
}
