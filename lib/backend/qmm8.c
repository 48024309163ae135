/* qmm8.c - the 8-bit activations' per-32 form (qmm_q8, llama.cpp's Q8_0)
 * and the integer form of the weight blocks, portable (the products that
 * use them: qgemm.h):
 *   activations  d = max|x| / 127, q[j] = round-half-even(x[j] * (1/d))
 *                (q = 0 when d = 0, or x NaN or infinite), s = d * sum q;
 *   weights      value[j] = a * w[j] + b with integers w (qmm_group8). */
#include "../core/dequant.h"
#include "qmm.h"

#include <math.h>

float qmm_quant_group(const float *x, int n, int8_t *q)
{
    float amax = 0;
    for (int j = 0; j < n; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++) {
        float v = x[j] * id; /* NaN when x is NaN or infinite: q = 0 (no conversion of a NaN) */
        q[j] = (int8_t)(v == v ? (int)nearbyintf(v)
                               : 0); /* the default rounding: half to even, as vcvtps2dq */
    }
    return d;
}

void qmm_quant8_c(const float *x, int64_t n, qmm_q8 *xq)
{
    for (int64_t g = 0; g < n / 32; g++, x += 32, xq++) {
        int sum = 0;
        xq->d = qmm_quant_group(x, 32, xq->q);
        for (int j = 0; j < 32; j++)
            sum += xq->q[j];
        xq->s = xq->d * (float)sum;
    }
}

/* Group g of a block (q4_0..q8_0: g = 0; K types: sub-block g < 8) as
 * value[j] = a * w[j] + b.  The forms the AVX2 kernels use too: unsigned
 * w with the offset in b for q4/q5 types; signed w for q8_0 and for q6_K,
 * whose w[j] = sc * (q - 32) carries its per-16 scales (a = d). */
void qmm_group8(cb_type t, const uint8_t *b, int g, int16_t w[32], float *a, float *bb)
{
    int sc, m;
    *bb = 0;
    switch (t) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
        for (int j = 0; j < 16; j++) {
            w[j] = b[(t == CB_TYPE_Q4_0 ? 2 : 4) + j] & 15;
            w[j + 16] = b[(t == CB_TYPE_Q4_0 ? 2 : 4) + j] >> 4;
        }
        *a = cb_dq_d(b, 0);
        *bb = t == CB_TYPE_Q4_0 ? -8.0f * *a : cb_dq_d(b, 2);
        return;
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1: {
        int o = t == CB_TYPE_Q5_0 ? 2 : 4;
        uint32_t qh = cb_dq_rd32(b + o);
        for (int j = 0; j < 16; j++) {
            w[j] = (int16_t)((b[o + 4 + j] & 15) | ((qh >> j) & 1) << 4);
            w[j + 16] = (int16_t)((b[o + 4 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        }
        *a = cb_dq_d(b, 0);
        *bb = t == CB_TYPE_Q5_0 ? -16.0f * *a : cb_dq_d(b, 2);
        return;
    }
    case CB_TYPE_Q8_0:
        for (int j = 0; j < 32; j++)
            w[j] = (int8_t)b[2 + j];
        *a = cb_dq_d(b, 0);
        return;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K: {
        int k5 = t == CB_TYPE_Q5_K;
        const uint8_t *qs = b + (k5 ? 48 : 16) + 32 * (g >> 1);
        for (int j = 0; j < 32; j++) {
            w[j] = (int16_t)(g & 1 ? qs[j] >> 4 : qs[j] & 15);
            if (k5)
                w[j] = (int16_t)(w[j] | ((b[16 + j] >> g) & 1) << 4);
        }
        cb_dq_scale_min(g, b + 4, &sc, &m);
        *a = cb_dq_d(b, 0) * (float)sc;
        *bb = -(cb_dq_d(b, 2) * (float)m);
        return;
    }
    case CB_TYPE_Q6_K: {
        int n = g >> 2, k = g & 3;
        const uint8_t *ql = b + 64 * n + 32 * (k & 1), *qh = b + 128 + 32 * n;
        for (int j = 0; j < 32; j++) {
            int q = ((ql[j] >> (4 * (k >> 1))) & 15) | ((qh[j] >> (2 * k)) & 3) << 4;
            w[j] = (int16_t)((int8_t)b[192 + 8 * n + 2 * k + (j >> 4)] * (q - 32));
        }
        *a = cb_dq_d(b, 208);
        return;
    }
    default: *a = 0; return;
    }
}
