/* test_kvcoded.c - the coded KV element type (lib/kv/kvcoded.c) against a
 * plain loop written here from its layout: the decoders (portable and the
 * CPU's fastest) give the reference's bits for any valid layer and for the
 * encoder's; a round trip stays within half a step of each group, and its
 * error follows the steps per deviation asked for; cut or flipped layers
 * are refused or decoded without reading or writing out of bounds (run
 * under ASan by make san-test). */
#include "../../lib/kv/kv.h"
#include "test.h"

#include <stdint.h>
#include <zstd.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float frnd(void) { return (float)(rnd() % 2000001) / 1e6f - 1.0f; } /* [-1, 1] */
/* about normal: the sum of four uniforms, deviation 1 */
static float nrnd(void) { return (frnd() + frnd() + frnd() + frnd()) * 0.866f; }

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

static uint16_t elem(int q, uint16_t d, uint16_t mu)
{
    return cb_f32_to_f16((float)q * cb_f16_to_f32(d) + cb_f16_to_f32(mu));
}

/* The reference decoder, element by element from the layout: 0, or -1
 * when the frames are not n*w bytes each. */
static int ref_decode(const uint8_t *in, int32_t n, int64_t w, uint16_t *k, uint16_t *v)
{
    size_t nw = (size_t)n * (size_t)w;
    uint32_t mode = get32(in), zk = get32(in + 12), zv = get32(in + 16);
    const uint8_t *kp = in + 32, *vp = kp + 4 * w, *body = vp + 4 * n;
    uint8_t *sk = malloc(nw), *sv = malloc(nw);
    int ok =
        ZSTD_decompress(sk, nw, body, zk) == nw && ZSTD_decompress(sv, nw, body + zk, zv) == nw;
    for (int64_t c = 0; ok && c < w; c++) {
        int acc = 0;
        for (int32_t t = 0; t < n; t++) {
            int s = sk[t * w + c];
            acc = mode && t > 0 ? (acc + s) & 255 : s;
            k[t * w + c] =
                elem(acc < 128 ? acc : acc - 256, get16(kp + 2 * (w + c)), get16(kp + 2 * c));
        }
    }
    for (int32_t t = 0; ok && t < n; t++)
        for (int64_t c = 0; c < w; c++)
            v[t * w + c] = elem((int8_t)sv[t * w + c], get16(vp + 2 * (n + t)), get16(vp + 2 * t));
    free(sk), free(sv);
    return ok ? 0 : -1;
}

static const int32_t NS[] = {1, 2, 7, 33, 100};
static const int64_t WS[] = {1, 12, 64, 256};

/* A layer built here: random f16 parameters (finite, some subnormal or
 * negative), random symbols (every byte, -128 too) through plain zstd
 * frames, either key mode; into out (cb_coded_bound bytes). */
static void hand_layer(uint8_t *out, int32_t n, int64_t w, uint32_t mode)
{
    size_t nw = (size_t)n * (size_t)w, cap = ZSTD_compressBound(nw);
    uint8_t *sym = malloc(nw);
    memset(out, 0, 32);
    put32(out, mode);
    uint8_t *p = out + 32;
    for (int64_t i = 0; i < 2 * (w + n); i++)
        put16(p + 2 * i, cb_f32_to_f16(frnd() * (i % 7 == 0 ? 1e-5f : 3.0f)));
    p += 4 * (w + n);
    for (int f = 0; f < 2; f++) {
        for (size_t i = 0; i < nw; i++)
            sym[i] = (uint8_t)(rnd() % (f ? 256 : 9));
        size_t z = ZSTD_compress(p, cap, sym, nw, 3);
        put32(out + 12 + 4 * f, (uint32_t)z);
        p += z;
    }
    free(sym);
}

static void test_decode_bits(void)
{
    tcase("coded: decoding any valid layer equals the reference loop bit for bit (portable, "
          "SIMD)");
    for (size_t a = 0; a < sizeof NS / sizeof *NS; a++)
        for (size_t b = 0; b < sizeof WS / sizeof *WS; b++)
            for (uint32_t mode = 0; mode < 2; mode++) {
                int32_t n = NS[a];
                int64_t w = WS[b];
                size_t nw = (size_t)n * (size_t)w;
                uint64_t cap = cb_coded_bound(n, w);
                uint8_t *in = calloc(1, cap), *scratch = malloc(cb_coded_scratch(n, w));
                uint16_t *k[3], *v[3];
                for (int i = 0; i < 3; i++)
                    k[i] = malloc(2 * nw), v[i] = malloc(2 * nw);
                hand_layer(in, n, w, mode);
                CHECK(ref_decode(in, n, w, k[0], v[0]) == 0);
                CHECK_OK(cb_coded_decode(in, cap, n, w, k[1], v[1], scratch, 0));
                CHECK_OK(cb_coded_decode(in, cap, n, w, k[2], v[2], scratch, 1));
                for (int i = 1; i < 3; i++)
                    CHECKF(!memcmp(k[0], k[i], 2 * nw) && !memcmp(v[0], v[i], 2 * nw),
                           "n %d w %lld mode %u: %s decoder differs", n, (long long)w, mode,
                           i == 1 ? "portable" : "SIMD");
                for (int i = 0; i < 3; i++)
                    free(k[i]), free(v[i]);
                free(in), free(scratch);
            }
}

/* One layer of structured data: keys with outlier channels (every 37th 20x
 * larger and offset, as models' keys have) that drift along the tokens or
 * not (smooth 1: each token the one before plus a little), values about
 * normal per token with a token's own scale. */
static void structured(float *k, float *v, int32_t n, int64_t w, int smooth)
{
    for (int64_t c = 0; c < w; c++) {
        float x = nrnd();
        for (int32_t t = 0; t < n; t++) {
            x = smooth ? x + 0.1f * nrnd() : nrnd();
            k[t * w + c] = c % 37 == 5 ? 20 * x + 40 : x;
        }
    }
    for (int32_t t = 0; t < n; t++) {
        float scale = 0.2f + (float)(rnd() % 100) / 20;
        for (int64_t c = 0; c < w; c++)
            v[t * w + c] = scale * nrnd();
    }
}

static void test_roundtrip(void)
{
    tcase("coded: the encoder's layers decode as the reference does; within half a step per "
          "group; relative error by the steps asked for");
    static const float S[] = {1.0f, 1.5f, 4.0f};
    int modes[2] = {0, 0};
    for (size_t a = 0; a < sizeof NS / sizeof *NS; a++)
        for (size_t b = 0; b < sizeof WS / sizeof *WS; b++)
            for (int smooth = 0; smooth < 2; smooth++) {
                int32_t n = NS[a];
                int64_t w = WS[b];
                size_t nw = (size_t)n * (size_t)w;
                float s = S[(a + b) % 3];
                uint64_t cap = cb_coded_bound(n, w), len = 0;
                uint8_t *out = malloc(cap), *scratch = malloc(cb_coded_scratch(n, w));
                float *k = malloc(4 * nw), *v = malloc(4 * nw);
                uint16_t *dk = malloc(2 * nw), *dv = malloc(2 * nw), *rk = malloc(2 * nw),
                         *rv = malloc(2 * nw);
                structured(k, v, n, w, smooth);
                CHECK_OK(cb_coded_encode(k, v, n, w, s, s, out, cap, &len));
                CHECK(len <= cap && get32(out) < 2);
                modes[get32(out)]++;
                float sk, sv;
                memcpy(&sk, out + 4, 4), memcpy(&sv, out + 8, 4);
                CHECK(sk == s && sv == s);
                CHECK_OK(cb_coded_decode(out, len, n, w, dk, dv, scratch, 1));
                CHECK(ref_decode(out, n, w, rk, rv) == 0);
                CHECK(!memcmp(dk, rk, 2 * nw) && !memcmp(dv, rv, 2 * nw));
                /* each element within half its group's step, plus the f16
                 * roundings of the element (1/1024 of it) */
                const uint8_t *kp = out + 32, *vp = kp + 4 * w;
                int far = 0;
                double err = 0, dev = 0;
                for (int32_t t = 0; t < n; t++)
                    for (int64_t c = 0; c < w; c++) {
                        float dkc = cb_f16_to_f32(get16(kp + 2 * (w + c))),
                              dvt = cb_f16_to_f32(get16(vp + 2 * (n + t)));
                        float xk = k[t * w + c], yk = cb_f16_to_f32(dk[t * w + c]);
                        float xv = v[t * w + c], yv = cb_f16_to_f32(dv[t * w + c]);
                        far += fabsf(xk - yk) > 0.5f * dkc * 1.01f + fabsf(xk) / 1024 + 1e-6f;
                        far += fabsf(xv - yv) > 0.5f * dvt * 1.01f + fabsf(xv) / 1024 + 1e-6f;
                        err += (double)(xv - yv) * (xv - yv);
                        dev += (double)dvt * dvt * s * s; /* the token's deviation, squared */
                    }
                CHECKF(far == 0, "n %d w %lld s %.1f: %d elements beyond half a step", n,
                       (long long)w, s, far);
                /* a uniform quantizer's error is a step / sqrt(12), 0.29 / s
                 * of the deviation */
                if (nw >= 1000)
                    CHECKF(sqrt(err / dev) <= 0.32 / s, "n %d w %lld s %.1f: V error %.3f", n,
                           (long long)w, s, sqrt(err / dev));
                free(out), free(scratch), free(k), free(v), free(dk), free(dv), free(rk), free(rv);
            }
    tcase("coded: keys that drift along the tokens are coded as differences, others as levels");
    CHECKF(modes[0] > 0 && modes[1] > 0, "levels %d, differences %d", modes[0], modes[1]);
}

/* A layer cut short anywhere is refused; one with flipped bytes decodes
 * or is refused, within its bounds (ASan watches). */
static void test_corrupt(void)
{
    tcase("coded: cut layers are refused; flipped ones never read or write out of bounds");
    int32_t n = 40;
    int64_t w = 64;
    size_t nw = (size_t)n * (size_t)w;
    uint64_t cap = cb_coded_bound(n, w), len = 0;
    uint8_t *out = malloc(cap), *scratch = malloc(cb_coded_scratch(n, w));
    float *k = malloc(4 * nw), *v = malloc(4 * nw);
    uint16_t *dk = malloc(2 * nw), *dv = malloc(2 * nw);
    structured(k, v, n, w, 1);
    CHECK_OK(cb_coded_encode(k, v, n, w, 1.5f, 1.5f, out, cap, &len));
    int took = 0, refused = 0;
    for (uint64_t cut = 0; cut < len; cut += 1 + cut / 16) {
        uint8_t *c = malloc(cut ? cut : 1); /* exactly cut bytes: ASan sees a read past */
        memcpy(c, out, cut);
        took += cb_coded_decode(c, cut, n, w, dk, dv, scratch, 1) == CB_OK;
        free(c);
    }
    CHECKF(took == 0, "%d cut layers decoded", took);
    uint8_t *c = malloc(len);
    for (int i = 0; i < 400; i++) {
        memcpy(c, out, len);
        for (int j = 0; j <= i % 3; j++)
            c[rnd() % (i % 2 ? len : 32 + 4 * (uint64_t)(w + n))] ^= (uint8_t)(1 + rnd() % 255);
        refused += cb_coded_decode(c, len, n, w, dk, dv, scratch, i % 2) != CB_OK;
    }
    printf("# 400 flipped layers: %d refused, the rest decoded\n", refused);
    CHECK(refused > 0);
    CHECK(cb_coded_decode(out, len, 0, w, dk, dv, scratch, 1) == CB_ERR_FORMAT);
    free(c), free(out), free(scratch), free(k), free(v), free(dk), free(dv);
}

int main(void)
{
    TEST_BEGIN();
    test_decode_bits();
    test_roundtrip();
    test_corrupt();
    TEST_END();
}
