/* test_kvcodec.c - the coded KV element types (lib/kv/kvcodec.c) against
 * plain loops written here from cbkv(5)'s layout: the decoders (portable
 * and the CPU's fastest) give the reference's bits for any bytes, the
 * encoder gives the reference's bytes, a round trip stays within half a
 * step of each group, and keys grouped per channel beat per-token groups on
 * data with outlier channels (why keys are grouped so). */
#include "../../lib/kv/kv.h"
#include "test.h"

#include <stdint.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frnd(void) { return (float)(rnd() % 2000001) / 1e6f - 1.0f; } /* [-1, 1] */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Where channel c of a row of 32-channel runs keeps its nibble: byte
 * c/32*16 + c%16, the high nibble for c%32 >= 16 */
static int nib(const uint8_t *row, int64_t c)
{
    uint8_t b = row[c / 32 * 16 + c % 16];
    return c % 32 >= 16 ? b >> 4 : b & 15;
}

static uint16_t elem(int q, uint16_t d, uint16_t m)
{
    return cb_f32_to_f16((float)q * cb_f16_to_f32(d) + cb_f16_to_f32(m));
}

/* The reference decoder: element by element from the layout. */
static void ref_decode(const uint8_t *in, int32_t n, int64_t w, uint16_t *k, uint16_t *v)
{
    const uint8_t *p = in;
    for (int32_t g = 0; g * 32 < n; g++) {
        int32_t r = n - g * 32 < 32 ? n - g * 32 : 32;
        const uint8_t *d = p, *m = p + 2 * w, *rows = p + 4 * w;
        for (int32_t t = 0; t < r; t++)
            for (int64_t c = 0; c < w; c++)
                k[(g * 32 + t) * w + c] =
                    elem(nib(rows + t * (w / 2), c), get16(d + 2 * c), get16(m + 2 * c));
        p = rows + r * (w / 2);
    }
    for (int32_t t = 0; t < n; t++)
        for (int64_t c = 0; c < w; c++) {
            const uint8_t *b = p + (t * (w / 32) + c / 32) * 20;
            v[t * w + c] = elem(nib(b + 4, c % 32), get16(b), get16(b + 2));
        }
}

/* The reference quantizer of one group (values x[i*s], i < cnt): scale
 * (max-min)/15 and min, as f16; levels from the f16 ones, rounded half up
 * and clamped to 0..15. */
static void ref_group(const float *x, int64_t s, int32_t cnt, uint16_t *d, uint16_t *m, int *q)
{
    float mn = x[0], mx = x[0];
    for (int32_t i = 0; i < cnt; i++)
        mn = x[i * s] < mn ? x[i * s] : mn, mx = x[i * s] > mx ? x[i * s] : mx;
    *d = cb_f32_to_f16((mx - mn) / 15);
    *m = cb_f32_to_f16(mn);
    float df = cb_f16_to_f32(*d), mf = cb_f16_to_f32(*m);
    for (int32_t i = 0; i < cnt; i++) {
        float y = df > 0 ? (x[i * s] - mf) * (1.0f / df) : 0;
        int l = y > 0 ? (int)(y + 0.5f) : 0;
        q[i] = l > 15 ? 15 : l;
    }
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_nib(uint8_t *row, int64_t c, int q)
{
    uint8_t *b = &row[c / 32 * 16 + c % 16];
    *b = (uint8_t)(c % 32 >= 16 ? (*b & 0x0f) | q << 4 : (*b & 0xf0) | q);
}

/* The reference encoder (out zeroed). */
static void ref_encode(const float *k, const float *v, int32_t n, int64_t w, uint8_t *out)
{
    int q[32];
    uint8_t *p = out;
    for (int32_t g = 0; g * 32 < n; g++) {
        int32_t r = n - g * 32 < 32 ? n - g * 32 : 32;
        uint8_t *rows = p + 4 * w;
        for (int64_t c = 0; c < w; c++) {
            uint16_t d, m;
            ref_group(k + g * 32 * w + c, w, r, &d, &m, q);
            put16(p + 2 * c, d), put16(p + 2 * w + 2 * c, m);
            for (int32_t t = 0; t < r; t++)
                put_nib(rows + t * (w / 2), c, q[t]);
        }
        p = rows + r * (w / 2);
    }
    for (int32_t t = 0; t < n; t++)
        for (int64_t c0 = 0; c0 < w; c0 += 32, p += 20) {
            uint16_t d, m;
            ref_group(v + t * w + c0, 1, 32, &d, &m, q);
            put16(p, d), put16(p + 2, m);
            for (int j = 0; j < 32; j++)
                put_nib(p + 4, j, q[j]);
        }
}

static const int32_t NS[] = {1, 5, 31, 32, 33, 70};
static const int64_t WS[] = {32, 64, 256};

static void test_sizes(void)
{
    tcase("kivi4: sizes from the layout; widths not a multiple of 32 refused");
    CHECK(cb_kivi4_k_bytes(1, 32) == 4 * 32 + 16 && cb_kivi4_v_bytes(1, 32) == 20);
    CHECK(cb_kivi4_k_bytes(33, 256) == 2 * 4 * 256 + 33 * 128);
    CHECK(cb_kivi4_v_bytes(33, 256) == 33 * 8 * 20);
    CHECK(cb_kivi4_k_bytes(64, 256) + cb_kivi4_v_bytes(64, 256) == 64 * 256 * 2 * 5 / 8);
    CHECK(cb_kivi4_k_bytes(4, 48) == 0 && cb_kivi4_v_bytes(4, 48) == 0);
    CHECK(cb_kivi4_k_bytes(0, 32) == 0 && cb_kivi4_k_bytes(1, 0) == 0);
    float x[48] = {0};
    uint8_t out[64];
    CHECK(cb_kivi4_encode(x, x, 1, 48, out) == CB_ERR_INVALID);
}

/* Any bytes decode to the reference's bits, on both paths (scales and
 * minimums random f16 of moderate size, nibbles random). */
static void test_decode_bits(void)
{
    tcase("kivi4: decoding random bytes equals the reference loop bit for bit (portable, SIMD)");
    for (size_t a = 0; a < sizeof NS / sizeof *NS; a++)
        for (size_t b = 0; b < sizeof WS / sizeof *WS; b++) {
            int32_t n = NS[a];
            int64_t w = WS[b];
            uint64_t bk = cb_kivi4_k_bytes(n, w), bv = cb_kivi4_v_bytes(n, w);
            uint8_t *in = malloc(bk + bv);
            uint16_t *k[3], *v[3];
            float *scratch = malloc(sizeof(float) * 2 * (size_t)w);
            for (int i = 0; i < 3; i++)
                k[i] = malloc(2 * (size_t)(n * w)), v[i] = malloc(2 * (size_t)(n * w));
            for (uint64_t i = 0; i < bk + bv; i++)
                in[i] = (uint8_t)rnd();
            /* the f16 fields: finite, some subnormal or negative */
            uint8_t *p = in;
            for (int32_t g = 0; g * 32 < n; g++) {
                int32_t r = n - g * 32 < 32 ? n - g * 32 : 32;
                for (int64_t c = 0; c < 2 * w; c++)
                    put16(p + 2 * c, cb_f32_to_f16(frnd() * (c % 7 == 0 ? 1e-5f : 3.0f)));
                p += 4 * w + r * (w / 2);
            }
            for (int64_t i = 0; i < (int64_t)n * w / 32; i++, p += 20)
                put16(p, cb_f32_to_f16(frnd())), put16(p + 2, cb_f32_to_f16(frnd() * 8));
            ref_decode(in, n, w, k[0], v[0]);
            CHECK_OK(cb_kivi4_decode(in, n, w, k[1], v[1], scratch, 0));
            CHECK_OK(cb_kivi4_decode(in, n, w, k[2], v[2], scratch, 1));
            for (int i = 1; i < 3; i++)
                CHECKF(!memcmp(k[0], k[i], 2 * (size_t)(n * w)) &&
                           !memcmp(v[0], v[i], 2 * (size_t)(n * w)),
                       "n %d w %lld: %s decoder differs", n, (long long)w,
                       i == 1 ? "portable" : "SIMD");
            for (int i = 0; i < 3; i++)
                free(k[i]), free(v[i]);
            free(in), free(scratch);
        }
}

/* Data with outlier channels (every 37th channel 20x larger and offset, as
 * models' keys have), encoded: the reference's bytes; decoded: within half
 * a step of its group (plus the f16 roundings of d, m and the element). */
static void test_roundtrip(void)
{
    tcase("kivi4: encoding equals the reference; round trip within half a step per group");
    for (size_t a = 0; a < sizeof NS / sizeof *NS; a++)
        for (size_t b = 0; b < sizeof WS / sizeof *WS; b++) {
            int32_t n = NS[a];
            int64_t w = WS[b];
            size_t e = (size_t)(n * w);
            uint64_t bk = cb_kivi4_k_bytes(n, w), bv = cb_kivi4_v_bytes(n, w);
            float *x = malloc(sizeof(float) * e), *y = malloc(sizeof(float) * e);
            uint8_t *lib = malloc(bk + bv), *ref = calloc(1, bk + bv);
            uint16_t *dk = malloc(2 * e), *dv = malloc(2 * e);
            float *scratch = malloc(sizeof(float) * 2 * (size_t)w);
            for (size_t i = 0; i < e; i++) {
                int64_t c = (int64_t)(i % (size_t)w);
                x[i] = c % 37 == 3 ? 20 * frnd() + 15 : frnd();
                y[i] = frnd() * 2;
            }
            memset(lib, 0xa5, bk + bv); /* the encoder writes every byte */
            CHECK_OK(cb_kivi4_encode(x, y, n, w, lib));
            ref_encode(x, y, n, w, ref);
            CHECKF(!memcmp(lib, ref, bk + bv), "n %d w %lld: bytes differ from the reference", n,
                   (long long)w);
            CHECK_OK(cb_kivi4_decode(lib, n, w, dk, dv, scratch, 1));
            /* bound per element from its group's stored d and m */
            double worst = 0;
            const uint8_t *p = lib;
            for (int32_t g = 0; g * 32 < n; g++) {
                int32_t r = n - g * 32 < 32 ? n - g * 32 : 32;
                for (int32_t t = g * 32; t < g * 32 + r; t++)
                    for (int64_t c = 0; c < w; c++) {
                        double d = cb_f16_to_f32(get16(p + 2 * c)),
                               m = cb_f16_to_f32(get16(p + 2 * w + 2 * c));
                        double xh = cb_f16_to_f32(dk[t * w + c]), err = fabs(xh - x[t * w + c]);
                        double bound = 0.5 * d + 15 * d / 1024 + fabs(m) / 2048 + fabs(xh) / 2048;
                        worst = err / (bound + 1e-7) > worst ? err / (bound + 1e-7) : worst;
                    }
                p += 4 * w + r * (w / 2);
            }
            for (int64_t i = 0; i < (int64_t)e; i += 32, p += 20) {
                double d = cb_f16_to_f32(get16(p)), m = cb_f16_to_f32(get16(p + 2));
                for (int j = 0; j < 32; j++) {
                    double xh = cb_f16_to_f32(dv[i + j]), err = fabs(xh - y[i + j]);
                    double bound = 0.5 * d + 15 * d / 1024 + fabs(m) / 2048 + fabs(xh) / 2048;
                    worst = err / (bound + 1e-7) > worst ? err / (bound + 1e-7) : worst;
                }
            }
            CHECKF(worst <= 1.0, "n %d w %lld: error %.3f of its bound", n, (long long)w, worst);
            free(x), free(y), free(lib), free(ref), free(dk), free(dv), free(scratch);
        }
}

/* The same outlier-channel data as keys (groups per channel) and as values
 * (groups per token): the keys' layout loses less. */
static void test_outlier_channels(void)
{
    tcase("kivi4: with outlier channels, per-channel groups beat per-token groups");
    int32_t n = 64;
    int64_t w = 128;
    size_t e = (size_t)(n * w);
    float *x = malloc(sizeof(float) * e), *scratch = malloc(sizeof(float) * 2 * (size_t)w);
    uint8_t *buf = malloc(cb_kivi4_k_bytes(n, w) + cb_kivi4_v_bytes(n, w));
    uint16_t *dk = malloc(2 * e), *dv = malloc(2 * e);
    for (size_t i = 0; i < e; i++)
        x[i] = i % (size_t)w % 41 == 5 ? 30 + 10 * frnd() : frnd();
    CHECK_OK(cb_kivi4_encode(x, x, n, w, buf));
    CHECK_OK(cb_kivi4_decode(buf, n, w, dk, dv, scratch, 1));
    double ek = 0, ev = 0;
    for (size_t i = 0; i < e; i++) {
        double a = cb_f16_to_f32(dk[i]) - x[i], b = cb_f16_to_f32(dv[i]) - x[i];
        ek += a * a, ev += b * b;
    }
    printf("# squared error: per channel %.4g, per token %.4g\n", ek, ev);
    CHECKF(ek * 4 < ev, "per channel %.4g, per token %.4g", ek, ev);
    free(x), free(scratch), free(buf), free(dk), free(dv);
}

int main(void)
{
    TEST_BEGIN();
    test_sizes();
    test_decode_bits();
    test_roundtrip();
    test_outlier_channels();
    TEST_END();
}
