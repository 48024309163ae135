/* cpu_attn.c - the CPU backend's attention: blocks of keys read from the
 * f16 (or f32) cache into small per-thread f32 tiles, online softmax, the
 * query heads sharing a KV head together; keys split over threads for
 * decode, their partial results merged after.  And blending's attention
 * mass (attn_mass), with the host fallback for backends without it. */
#include "../core/dequant.h"
#include "blas.h"
#include "cpu_impl.h"
#include "opmath.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A task: the query rows [i0, i1) for heads [h0, h1) (all sharing KV head
 * hk), over keys [ka, kb) of one split; rows are (row, head) pairs,
 * r = (i - i0) * nh + (h - h0). */
typedef struct att_job {
    cpu_ctx *c;
    const float *q;
    const int32_t *pos;
    int64_t n;
    const void *k, *v;
    cb_type t;
    int n_head, n_head_kv, hd, window;
    float scale;
    float *out;
    int nh, n_hsub;     /* heads per task, head subgroups per KV head */
    int64_t mq, n_qb;   /* query rows per task, query blocks */
    int n_split;        /* key splits (1: no partials) */
    int32_t kmin, kmax; /* the keys any row sees: [kmin, kmax) */
    /* the 8-bit products (att_task8): every KV head's keys and values
     * [a8_base, a8_base + a8_n) packed at c->a8, a8_head bytes a head */
    int64_t a8_base, a8_n, a8_nch;
    size_t a8_head, a8_kpb, a8_vpb; /* a K panel: p keys of 2 hd (two parts) */
    float *a8_kmean; /* [n_head_kv, hd]: the keys' mean, taken out before quantizing */
    /* cpu_set_key_bias's: kbias[c] (the bias, or 0) added to key c's
     * scores, c < n_stale, for the rows at positions below until (kbias
     * NULL: none) */
    const float *kbias;
    int64_t n_stale;
    int32_t until;
} att_job;

/* rows c0..c1 of KV head hk of a cache into an f32 tile [c1-c0, hd];
 * f16 rows by f16_row when the CPU has F16C (gcc leaves this loop scalar) */
__attribute__((optimize("O3"))) static void load_tile(const void *cache, cb_type t, int64_t width,
                                                      int hk, int hd, int64_t c0, int64_t c1,
                                                      float *restrict dst, qmm_f16_fn f16_row)
{
    for (int64_t c = c0; c < c1; c++, dst += hd) {
        if (t == CB_TYPE_F32) {
            memcpy(dst, (const float *)cache + c * width + (int64_t)hk * hd,
                   sizeof(float) * (size_t)hd);
            continue;
        }
        const uint16_t *s = (const uint16_t *)cache + c * width + (int64_t)hk * hd;
        if (f16_row) {
            f16_row(s, dst, hd);
            continue;
        }
        for (int e = 0; e < hd; e++)
            dst[e] = cb_dq_f16(s[e]);
    }
}

/* query row i's scores s[0..nk) of keys c0.. with the key bias added to
 * the flagged keys' (before the softmax step masks the keys it does not
 * see) */
__attribute__((optimize("O3"))) static void key_bias(const att_job *j, int64_t i, float *restrict s,
                                                     int64_t nk, int64_t c0)
{
    if (!j->kbias || j->pos[i] >= j->until || c0 >= j->n_stale)
        return;
    int64_t e = c0 + nk < j->n_stale ? nk : j->n_stale - c0;
    const float *restrict b = j->kbias + c0;
    for (int64_t c = 0; c < e; c++)
        s[c] += b[c];
}

/* the online-softmax step for one row of scores s[0..nk) (keys c0..):
 * keys outside [lo, hi] get probability 0 */
__attribute__((optimize("O3"))) static void softmax_step(float *restrict s, int64_t nk, int64_t c0,
                                                         int64_t lo, int64_t hi, float *mx,
                                                         float *l, float *restrict o, int hd,
                                                         qmm_exp_sum_fn exp_sum)
{
    int64_t a = lo > c0 ? lo - c0 : 0, e = hi + 1 - c0 < nk ? hi + 1 - c0 : nk;
    if (a >= e) {
        memset(s, 0, sizeof(float) * (size_t)nk);
        return;
    }
    /* eight running maxima and sums, so that the loops vectorize without
     * reassociating one sum */
    float m8[8], s8[8] = {0};
    int64_t j = a;
    for (int k = 0; k < 8; k++)
        m8[k] = *mx;
    for (; j + 8 <= e; j += 8)
        for (int k = 0; k < 8; k++)
            m8[k] = s[j + k] > m8[k] ? s[j + k] : m8[k];
    float m = m8[0];
    for (int k = 1; k < 8; k++)
        m = m8[k] > m ? m8[k] : m;
    for (; j < e; j++)
        m = s[j] > m ? s[j] : m;
    if (m > *mx) {
        float alpha = *mx == -INFINITY ? 0.0f : qmm_exp_neg(*mx - m);
        *l *= alpha;
        for (int d = 0; d < hd; d++)
            o[d] *= alpha;
        *mx = m;
    }
    for (j = 0; j < a; j++)
        s[j] = 0;
    for (j = e; j < nk; j++)
        s[j] = 0;
    if (exp_sum) {
        *l += exp_sum(s + a, e - a, m);
        return;
    }
    for (j = a; j + 8 <= e; j += 8)
        for (int k = 0; k < 8; k++) {
            float p = qmm_exp_neg(s[j + k] - m);
            s[j + k] = p;
            s8[k] += p;
        }
    float sum = ((s8[0] + s8[4]) + (s8[1] + s8[5])) + ((s8[2] + s8[6]) + (s8[3] + s8[7]));
    for (; j < e; j++) {
        s[j] = qmm_exp_neg(s[j] - m);
        sum += s[j];
    }
    *l += sum;
}

__attribute__((optimize("O3"))) static void axpy(float *restrict o, float p,
                                                 const float *restrict v, int n)
{
    for (int d = 0; d < n; d++)
        o[d] += p * v[d];
}

/* a task's rows r = (i - i0) * nh + (h - h0) set up: queries scaled, no
 * keys seen yet */
__attribute__((optimize("O3"))) static void rows_begin(const att_job *j, thread_scratch *ts,
                                                       int64_t i0, int64_t i1, int h0, int nh)
{
    int hd = j->hd;
    int64_t ldq = (int64_t)j->n_head * hd;
    for (int64_t i = i0; i < i1; i++)
        for (int h = h0; h < h0 + nh; h++) {
            int64_t r = (i - i0) * nh + (h - h0);
            const float *src = j->q + i * ldq + (int64_t)h * hd;
            for (int e = 0; e < hd; e++)
                ts->q[r * hd + e] = src[e] * j->scale;
            ts->mx[r] = -INFINITY;
            ts->l[r] = 0;
            memset(ts->o + r * hd, 0, sizeof(float) * (size_t)hd);
        }
}

/* a task's rows done: their outputs, or their partial results in split sp */
__attribute__((optimize("O3"))) static void rows_end(const att_job *j, const thread_scratch *ts,
                                                     int64_t i0, int64_t i1, int h0, int nh, int sp)
{
    int hd = j->hd;
    int64_t ldq = (int64_t)j->n_head * hd;
    for (int64_t r = 0; r < (i1 - i0) * nh; r++) {
        int64_t i = i0 + r / nh;
        int h = h0 + (int)(r % nh);
        if (j->n_split == 1) {
            float inv = 1.0f / ts->l[r];
            for (int e = 0; e < hd; e++)
                j->out[i * ldq + (int64_t)h * hd + e] = ts->o[r * hd + e] * inv;
        } else {
            float *p = j->c->parts + ((i * j->n_head + h) * j->n_split + sp) * (hd + 2);
            p[0] = ts->mx[r];
            p[1] = ts->l[r];
            memcpy(p + 2, ts->o + r * hd, sizeof(float) * (size_t)hd);
        }
    }
}

/* the first key query row i sees (its window's start; 0 without one) */
static int64_t first_key(const att_job *j, int64_t i)
{
    return j->window > 0 && j->pos[i] >= j->window ? j->pos[i] - j->window + 1 : 0;
}

/* a task's place: its key split, KV head, heads [h0, h0 + nh), query
 * rows [i0, i1) (M (row, head) pairs) and the keys those rows see at most,
 * [lo, hi] */
typedef struct att_place {
    int sp, hk, h0, nh;
    int64_t i0, i1, M, lo, hi;
} att_place;

static att_place place_of(const att_job *j, int64_t task)
{
    att_place a;
    a.sp = (int)(task % j->n_split);
    int64_t rest = task / j->n_split, qb = rest % j->n_qb;
    int hs = (int)(rest / j->n_qb % j->n_hsub), G = j->n_head / j->n_head_kv;
    a.hk = (int)(rest / j->n_qb / j->n_hsub);
    a.h0 = a.hk * G + hs * j->nh;
    a.nh = (a.h0 + j->nh < (a.hk + 1) * G ? a.h0 + j->nh : (a.hk + 1) * G) - a.h0;
    a.i0 = qb * j->mq, a.i1 = a.i0 + j->mq < j->n ? a.i0 + j->mq : j->n;
    a.M = (a.i1 - a.i0) * a.nh;
    a.lo = INT64_MAX, a.hi = -1;
    for (int64_t i = a.i0; i < a.i1; i++) {
        int64_t lo = first_key(j, i);
        a.lo = lo < a.lo ? lo : a.lo;
        a.hi = j->pos[i] > a.hi ? j->pos[i] : a.hi;
    }
    return a;
}

/* the rows [*ia, *ib) of [i0, i1) that see keys [c0, c1): leading rows
 * before them and trailing ones whose window starts after them see nothing
 * of them (rows in position order, as a prefill's or blend's are: all but
 * the first and last such rows are computed, masked, in any order) */
static void tile_rows(const att_job *j, int64_t i0, int64_t i1, int64_t c0, int64_t c1, int64_t *ia,
                      int64_t *ib)
{
    *ia = i0, *ib = i1;
    while (*ia < *ib && j->pos[*ia] < c0)
        (*ia)++;
    while (*ib > *ia && j->window > 0 && j->pos[*ib - 1] - j->window + 1 >= c1)
        (*ib)--;
}

static void att_task(void *arg, int64_t task, int tid)
{
    const att_job *j = arg;
    thread_scratch *ts = &j->c->ts[tid];
    att_place a = place_of(j, task);
    int sp = a.sp, hk = a.hk, h0 = a.h0, nh = a.nh, hd = j->hd;
    int64_t i0 = a.i0, i1 = a.i1, M = a.M;
    int64_t width = (int64_t)j->n_head_kv * hd;
    int64_t span = j->kmax - j->kmin;
    int64_t ka = j->kmin + span * sp / j->n_split, kb = j->kmin + span * (sp + 1) / j->n_split;

    rows_begin(j, ts, i0, i1, h0, nh);
    ka = ka > a.lo ? ka : a.lo;
    kb = kb < a.hi + 1 ? kb : a.hi + 1;
    /* one query row (a block's last; decode itself takes att_task_dec), its
     * heads that share KV head hk, on an f16 cache: products that read the
     * cache directly (no tile in f32, no call per key).  One row sees every
     * key in [ka, kb), so no probability is 0 by the mask and no masked
     * key's value enters its sum (several rows keep the tiles, whose loop
     * skips zero probabilities). */
    int fused = i1 - i0 == 1 && M <= QMM_ATT_M && j->t == CB_TYPE_F16 && hd % 8 == 0 &&
                j->c->att_qk && j->c->att_pv;
    const uint16_t *kh16 = (const uint16_t *)j->k + (int64_t)hk * hd,
                   *vh16 = (const uint16_t *)j->v + (int64_t)hk * hd;
    for (int64_t c0 = ka; c0 < kb; c0 += ATT_KB) {
        int64_t c1 = c0 + ATT_KB < kb ? c0 + ATT_KB : kb, nk = c1 - c0, ia, ib;
        tile_rows(j, i0, i1, c0, c1, &ia, &ib);
        int64_t ra = (ia - i0) * nh, rn = (ib - ia) * nh;
        float *sa = ts->s + ra * ATT_KB, *qa = ts->q + ra * hd, *oa = ts->o + ra * hd;
        if (rn == 0)
            continue;
        if (fused) {
            j->c->att_qk(qa, (int)rn, hd, kh16 + c0 * width, width, nk, sa, ATT_KB);
        } else {
            load_tile(j->k, j->t, width, hk, hd, c0, c1, ts->k, j->c->f16_row);
            if (rn >= 8) {
                cb_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rn, (int)nk, hd, 1.0f, qa,
                         hd, ts->k, hd, 0.0f, sa, ATT_KB);
            } else {
                for (int64_t r = 0; r < rn; r++)
                    for (int64_t c = 0; c < nk; c++)
                        sa[r * ATT_KB + c] = qmm_dot8(qa + r * hd, ts->k + c * hd, hd);
            }
        }
        for (int64_t r = ra; r < ra + rn; r++) {
            int64_t i = i0 + r / nh;
            int64_t lo = first_key(j, i);
            key_bias(j, i, ts->s + r * ATT_KB, nk, c0);
            softmax_step(ts->s + r * ATT_KB, nk, c0, lo, j->pos[i], &ts->mx[r], &ts->l[r],
                         ts->o + r * hd, hd, j->c->exp_sum);
        }
        if (fused) {
            j->c->att_pv(sa, (int)rn, ATT_KB, vh16 + c0 * width, width, nk, hd, oa);
            continue;
        }
        load_tile(j->v, j->t, width, hk, hd, c0, c1, ts->v, j->c->f16_row);
        if (rn >= 8) {
            cb_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rn, hd, (int)nk, 1.0f, sa,
                     ATT_KB, ts->v, hd, 1.0f, oa, hd);
        } else {
            for (int64_t r = 0; r < rn; r++)
                for (int64_t c = 0; c < nk; c++)
                    if (sa[r * ATT_KB + c] != 0.0f)
                        axpy(oa + r * hd, sa[r * ATT_KB + c], ts->v + c * hd, hd);
        }
    }
    rows_end(j, ts, i0, i1, h0, nh, sp);
}

/* ------------------------------------------------- 8-bit attention */

/* With 8-bit activations (the default path) the attention of a batch of
 * query rows (prefill, a blend's recomputed rows) multiplies in 8-bit
 * integers through qgemm.h's panel kernels, as the products with weights
 * do; softmax (maxima, exponentials, sums) stays f32.
 *   scores  each query row (scaled) quantized per 32 values (qmm_q8); each
 *           key less the mean of the call's keys (per KV head and
 *           dimension) in two q8_0 parts, the key per 32 values and what
 *           that rounding left, per 32 values again (about 15 bits), packed
 *           as panels of p keys of 2 hd values (the kernels' layout),
 *           multiplied with the query row twice over: s = q . (k - mean),
 *           which is q . k less a constant of the row, the same softmax.
 *           The mean takes out what every key shares (Qwen2's keys carry a
 *           large bias in a few dimensions, which would otherwise set
 *           their blocks' scales), the second part what rotates with the
 *           position.  First-token KL to --exact's (the default path's
 *           products' own error included): the 1.5B's full prefill of 8
 *           MuSiQue prompts (~3,600 tokens), mean 2.0e-2 with keys in one
 *           part and no mean, 3.2e-3 with the mean (f32 attention:
 *           3.7e-3); the 0.5B on make parity's 25 prompts, 3.8e-3 with
 *           one part and the mean, 1.5e-3 with two (f32: 1.2e-3);
 *   output  each value row quantized with one scale per key and head
 *           (sv = max|v| / 127), packed as panels of p dimensions over the
 *           keys (blocks of 32 keys, scale 1); each tile's probabilities
 *           times sv quantized per 32 keys as the activations.
 * Keys and values are quantized once per call, for every query row of it,
 * at key blocks that start at multiples of 32; every quantization is of one
 * query row, one key or one value row (the keys' after the call's mean is
 * taken out).  Tiles start where the f32 path's do, at 32 below it at
 * most.  Only with kernels that have a dot-product instruction (VNNI) or
 * the portable ones (qg_kernels.att8): on AVX2 the f32 tiles are faster. */

enum { A8_BLOCK = QG_OFF_0_BYTES /* a packed q8_0 block's bytes per panel row */ };

/* s[k] *= sv[k] for k < n, s[k] = 0 for n <= k < n32 */
__attribute__((optimize("O3"))) static void a8_scale(float *restrict s, const float *restrict sv,
                                                     int64_t n, int64_t n32)
{
    for (int64_t k = 0; k < n; k++)
        s[k] *= sv[k];
    for (int64_t k = n; k < n32; k++)
        s[k] = 0;
}

/* m[d] += the sum of x[r][d] over r < n (rows of hd) */
__attribute__((optimize("O3"))) static void a8_colsum(float *restrict m, const float *restrict x,
                                                      int64_t n, int hd)
{
    for (int64_t r = 0; r < n; r++)
        for (int d = 0; d < hd; d++)
            m[d] += x[r * hd + d];
}

__attribute__((optimize("O3"))) static void a8_sub(float *restrict x, const float *restrict m,
                                                   int hd)
{
    for (int d = 0; d < hd; d++)
        x[d] -= m[d];
}

__attribute__((optimize("O3"))) static void a8_add(float *restrict o, const float *restrict t,
                                                   int64_t n)
{
    for (int64_t e = 0; e < n; e++)
        o[e] += t[e];
}

/* the mean of KV head hk's keys [kmin, kmax), into a8_kmean (one thread a
 * head: the same bits on any number) */
static void a8_mean_task(void *arg, int64_t hk, int tid)
{
    const att_job *j = arg;
    cpu_ctx *c = j->c;
    float *k = c->ts[tid].k, *m = j->a8_kmean + hk * j->hd;
    int hd = j->hd;
    memset(m, 0, sizeof(float) * (size_t)hd);
    for (int64_t k0 = j->kmin; k0 < j->kmax; k0 += ATT_KB) {
        int64_t k1 = k0 + ATT_KB < j->kmax ? k0 + ATT_KB : j->kmax;
        load_tile(j->k, j->t, (int64_t)j->n_head_kv * hd, (int)hk, hd, k0, k1, k, c->f16_row);
        a8_colsum(m, k, k1 - k0, hd);
    }
    /* a NaN or infinite key (a broken model) leaves its dimension as it is:
     * the mean would carry it into every key */
    float inv = 1.0f / (float)(j->kmax - j->kmin);
    for (int d = 0; d < hd; d++)
        m[d] = isfinite(m[d]) ? m[d] * inv : 0.0f;
}

/* the packed keys and values of keys [k0, k1) (a chunk of at most ATT_KB,
 * k0 - a8_base a multiple of 32) of KV head hk; keys from kmax on are
 * zero */
static void a8_prep_task(void *arg, int64_t task, int tid)
{
    const att_job *j = arg;
    cpu_ctx *c = j->c;
    thread_scratch *ts = &c->ts[tid];
    int p = c->qg.layout.p, hd = j->hd, hk = (int)(task / j->a8_nch);
    int64_t width = (int64_t)j->n_head_kv * hd, base = j->a8_base;
    int64_t k0 = base + task % j->a8_nch * ATT_KB,
            k1 = k0 + ATT_KB < base + j->a8_n ? k0 + ATT_KB : base + j->a8_n,
            ke = k1 < j->kmax ? k1 : j->kmax;
    size_t bb = (size_t)A8_BLOCK * (size_t)p;
    uint8_t *kp = c->a8 + (size_t)hk * j->a8_head, *vp = kp + (size_t)(j->a8_n / p) * j->a8_kpb;
    float *sv = (float *)(void *)(vp + (size_t)(hd / p) * j->a8_vpb);
    float one = 1.0f;

    memset(kp + (size_t)((k0 - base) / p) * j->a8_kpb, 0, (size_t)((k1 - k0) / p) * j->a8_kpb);
    for (int dp = 0; dp < hd / p; dp++) {
        uint8_t *b0 = vp + (size_t)dp * j->a8_vpb + (size_t)((k0 - base) / 32) * bb;
        memset(b0, 0, (size_t)((k1 - k0) / 32) * bb);
        for (int64_t b = 0; b < (k1 - k0) / 32; b++)
            for (int i = 0; i < p; i++)
                memcpy(b0 + (size_t)b * bb + (size_t)QG_OFF_0_D * (size_t)p + 4 * (size_t)i, &one,
                       4);
    }
    for (int64_t key = ke > k0 ? ke : k0; key < k1; key++)
        sv[key - base] = 0;
    if (ke <= k0)
        return;
    load_tile(j->k, j->t, width, hk, hd, k0, ke, ts->k, c->f16_row);
    load_tile(j->v, j->t, width, hk, hd, k0, ke, ts->v, c->f16_row);
    for (int64_t key = k0; key < ke; key++) {
        int64_t rel = key - base;
        int lane = (int)(rel % p);
        qmm_q8 xq[2 * ATT_HD / 32];
        float *kr = ts->k + (key - k0) * hd, res[ATT_HD];
        a8_sub(kr, j->a8_kmean + hk * hd, hd);
        c->qg.quant_0(kr, hd, xq);
        for (int d = 0; d < hd; d++)
            res[d] = kr[d] - xq[d / 32].d * (float)xq[d / 32].q[d % 32];
        c->qg.quant_0(res, hd, xq + hd / 32);
        uint8_t *pan = kp + (size_t)(rel / p) * j->a8_kpb;
        for (int b = 0; b < 2 * hd / 32; b++) {
            uint8_t *blk = pan + (size_t)b * bb;
            for (int ch = 0; ch < 8; ch++)
                memcpy(blk + ((size_t)ch * (size_t)p + (size_t)lane) * 4, xq[b].q + 4 * ch, 4);
            memcpy(blk + (size_t)QG_OFF_0_D * (size_t)p + 4 * (size_t)lane, &xq[b].d, 4);
        }
        /* the value row: one scale, finite (a NaN is no maximum; an
         * infinite one gives 0), so that a masked key's probability stays
         * 0 times it */
        const float *v = ts->v + (key - k0) * hd;
        float m = 0;
        for (int d = 0; d < hd; d++)
            m = fabsf(v[d]) > m ? fabsf(v[d]) : m;
        m = m <= FLT_MAX ? m : 0.0f;
        float inv = m > 0 ? 127.0f / m : 0.0f;
        sv[rel] = m / 127.0f;
        uint8_t *vb = vp + (size_t)(rel / 32) * bb;
        size_t at = ((size_t)(rel % 32 / 4) * (size_t)p) * 4 + (size_t)(rel % 4);
        for (int d = 0; d < hd; d++)
            vb[(size_t)(d / p) * j->a8_vpb + at + (size_t)(d % p) * 4] =
                (uint8_t)(int8_t)lrintf(v[d] * inv);
    }
}

/* the packed form's sizes for a8_n keys (a multiple of 32) of heads of
 * hd: a K panel, a V panel, a head's whole; returns the bytes of n_kv
 * heads and their keys' means */
static size_t a8_sizes(const cpu_ctx *c, int64_t a8_n, int hd, int n_kv, size_t *kpb, size_t *vpb,
                       size_t *head)
{
    int p = c->qg.layout.p;
    *kpb = qg_panel_bytes(CB_TYPE_Q8_0, 2 * hd, p);
    *vpb = qg_panel_bytes(CB_TYPE_Q8_0, a8_n, p);
    *head =
        ((size_t)(a8_n / p) * *kpb + (size_t)(hd / p) * *vpb + sizeof(float) * (size_t)a8_n + 63) /
        64 * 64;
    return *head * (size_t)n_kv + sizeof(float) * (size_t)n_kv * (size_t)hd;
}

/* c->a8 of need bytes at least; 0 where the memory is not there */
static int a8_grow(cpu_ctx *c, size_t need)
{
    if (need <= c->a8_bytes)
        return 1;
    uint8_t *a = aligned_alloc(64, (need + 63) / 64 * 64);
    if (!a)
        return 0;
    free(c->a8);
    c->a8 = a, c->a8_bytes = need;
    return 1;
}

void cpu_reserve_keys(cb_backend *b, int64_t n_keys, int n_head_kv, int hd)
{
    cpu_ctx *c = CTX(b);
    size_t kpb, vpb, head;
    /* on failure: grown by the first call, or f32 */
    if (c->act8 && c->qg.att8 && hd % 32 == 0 && hd <= ATT_HD)
        a8_grow(c, a8_sizes(c, (n_keys + 31) / 32 * 32, hd, n_head_kv, &kpb, &vpb, &head));
}

/* j's keys and values packed for att_task8 (c->a8 grown where the caches
 * are longer than reserved); 0 where the memory is not there (the f32
 * tiles then) */
static int a8_prep(att_job *j)
{
    cpu_ctx *c = j->c;
    j->a8_base = j->kmin / 32 * 32;
    j->a8_n = (j->kmax - j->a8_base + 31) / 32 * 32;
    j->a8_nch = (j->a8_n + ATT_KB - 1) / ATT_KB;
    if (!a8_grow(c, a8_sizes(c, j->a8_n, j->hd, j->n_head_kv, &j->a8_kpb, &j->a8_vpb, &j->a8_head)))
        return 0;
    j->a8_kmean = (float *)(void *)(c->a8 + j->a8_head * (size_t)j->n_head_kv);
    cb_pool_for(c->pool, a8_mean_task, j, j->n_head_kv);
    cb_pool_for(c->pool, a8_prep_task, j, (int64_t)j->n_head_kv * j->a8_nch);
    return 1;
}

/* att_task's work through the 8-bit products (above) */
static void att_task8(void *arg, int64_t task, int tid)
{
    const att_job *j = arg;
    cpu_ctx *c = j->c;
    thread_scratch *ts = &c->ts[tid];
    att_place a = place_of(j, task);
    int sp = a.sp, hk = a.hk, h0 = a.h0, nh = a.nh, hd = j->hd, p = c->qg.layout.p;
    int64_t i0 = a.i0, i1 = a.i1, M = a.M;
    int64_t base = j->a8_base, n32 = j->a8_n / 32;
    /* the splits at multiples of 32 keys */
    int64_t ka = base + n32 * sp / j->n_split * 32, kb = base + n32 * (sp + 1) / j->n_split * 32;
    size_t abq = sizeof(qmm_q8) * (size_t)(2 * hd / 32), abp = sizeof(qmm_q8) * (ATT_KB / 32),
           bb = (size_t)A8_BLOCK * (size_t)p;
    uint8_t *qx = (uint8_t *)ts->v, *px = qx + (size_t)ATT_M * sizeof(qmm_q8) * (2 * ATT_HD / 32);
    float *tmp = ts->k;
    const uint8_t *kp = c->a8 + (size_t)hk * j->a8_head,
                  *vp = kp + (size_t)(j->a8_n / p) * j->a8_kpb;
    const float *sv = (const float *)(const void *)(vp + (size_t)(hd / p) * j->a8_vpb);

    rows_begin(j, ts, i0, i1, h0, nh);
    for (int64_t r = 0; r < M; r++) { /* the row twice over: once for each part of the keys */
        c->qg.quant_0(ts->q + r * hd, hd, (qmm_q8 *)(void *)(qx + (size_t)r * abq));
        memcpy(qx + (size_t)r * abq + abq / 2, qx + (size_t)r * abq, abq / 2);
    }
    ka = ka > a.lo / 32 * 32 ? ka : a.lo / 32 * 32;
    kb = kb < a.hi + 1 ? kb : a.hi + 1;
    for (int64_t c0 = ka; c0 < kb; c0 += ATT_KB) {
        int64_t c1 = c0 + ATT_KB < kb ? c0 + ATT_KB : kb, nk = c1 - c0, nk32 = (nk + 31) / 32 * 32;
        int64_t ia, ib;
        tile_rows(j, i0, i1, c0, c1, &ia, &ib);
        int64_t ra = (ia - i0) * nh, rn = (ib - ia) * nh;
        float *sa = ts->s + ra * ATT_KB, *oa = ts->o + ra * hd;
        if (rn == 0)
            continue;
        for (int64_t t = 0; t < nk; t += p)
            c->qg.gemm(CB_TYPE_Q8_0, kp + (size_t)((c0 - base + t) / p) * j->a8_kpb, 2 * hd,
                       qx + (size_t)ra * abq, abq, rn, nk - t < p ? (int)(nk - t) : p, sa + t,
                       ATT_KB);
        for (int64_t r = ra; r < ra + rn; r++) {
            int64_t i = i0 + r / nh;
            int64_t lo = first_key(j, i);
            float *s = ts->s + r * ATT_KB;
            key_bias(j, i, s, nk, c0);
            softmax_step(s, nk, c0, lo, j->pos[i], &ts->mx[r], &ts->l[r], ts->o + r * hd, hd,
                         c->exp_sum);
            a8_scale(s, sv + (c0 - base), nk, nk32);
            c->qg.quant_0(s, nk32, (qmm_q8 *)(void *)(px + (size_t)(r - ra) * abp));
        }
        for (int dp = 0; dp < hd / p; dp++)
            c->qg.gemm(CB_TYPE_Q8_0, vp + (size_t)dp * j->a8_vpb + (size_t)((c0 - base) / 32) * bb,
                       nk32, px, abp, rn, p, tmp + dp * p, hd);
        a8_add(oa, tmp, rn * hd);
    }
    rows_end(j, ts, i0, i1, h0, nh, sp);
}

/* decode on an f16 cache (one query row; at most QMM_ATT_M heads share a
 * KV head): a task is a range of keys in every head.  The heads' slices of
 * ATT_SUB keys are multiplied one head after the other, so that the cache
 * rows are read whole and in order, as a stream the hardware prefetches:
 * one head's slice of each row at a time read at a third to half the
 * memory's rate.  The row sees every key in [ka, kb), so none is masked. */
static void att_task_dec(void *arg, int64_t task, int tid)
{
    const att_job *j = arg;
    thread_scratch *ts = &j->c->ts[tid];
    int sp = (int)task, hd = j->hd, H = j->n_head, nkv = j->n_head_kv, G = H / nkv;
    int64_t width = (int64_t)nkv * hd, span = j->kmax - j->kmin;
    int64_t ka = j->kmin + span * sp / j->n_split, kb = j->kmin + span * (sp + 1) / j->n_split;
    int64_t p = j->pos[0], lo = first_key(j, 0);
    const uint16_t *k16 = j->k, *v16 = j->v;

    rows_begin(j, ts, 0, 1, 0, H);
    ka = ka > lo ? ka : lo;
    kb = kb < p + 1 ? kb : p + 1;
    for (int64_t c0 = ka; c0 < kb; c0 += ATT_KB) {
        int64_t nk = c0 + ATT_KB < kb ? ATT_KB : kb - c0;
        for (int64_t b = 0; b < nk; b += ATT_SUB)
            for (int hk = 0; hk < nkv; hk++)
                j->c->att_qk(ts->q + (int64_t)hk * G * hd, G, hd,
                             k16 + (c0 + b) * width + (int64_t)hk * hd, width,
                             nk - b < ATT_SUB ? nk - b : ATT_SUB, ts->s + hk * G * ATT_KB + b,
                             ATT_KB);
        for (int r = 0; r < H; r++) {
            key_bias(j, 0, ts->s + r * ATT_KB, nk, c0);
            softmax_step(ts->s + r * ATT_KB, nk, c0, lo, p, &ts->mx[r], &ts->l[r], ts->o + r * hd,
                         hd, j->c->exp_sum);
        }
        for (int64_t b = 0; b < nk; b += ATT_SUB)
            for (int hk = 0; hk < nkv; hk++)
                j->c->att_pv(ts->s + hk * G * ATT_KB + b, G, ATT_KB,
                             v16 + (c0 + b) * width + (int64_t)hk * hd, width,
                             nk - b < ATT_SUB ? nk - b : ATT_SUB, hd, ts->o + (int64_t)hk * G * hd);
    }
    rows_end(j, ts, 0, 1, 0, H, sp);
}

/* out = the splits' partial results combined (each: max, sum, o) */
static void att_merge(const att_job *j)
{
    int hd = j->hd;
    int64_t ldq = (int64_t)j->n_head * hd;
    for (int64_t i = 0; i < j->n; i++)
        for (int h = 0; h < j->n_head; h++) {
            const float *p = j->c->parts + (i * j->n_head + h) * j->n_split * (hd + 2);
            float m = -INFINITY, l = 0;
            float *o = j->out + i * ldq + (int64_t)h * hd;
            for (int s = 0; s < j->n_split; s++)
                m = p[s * (hd + 2)] > m ? p[s * (hd + 2)] : m;
            memset(o, 0, sizeof(float) * (size_t)hd);
            for (int s = 0; s < j->n_split; s++) {
                const float *ps = p + s * (hd + 2);
                if (ps[0] == -INFINITY)
                    continue;
                float a = qmm_exp_neg(ps[0] - m);
                l += a * ps[1];
                axpy(o, a, ps + 2, hd);
            }
            float inv = 1.0f / l;
            for (int e = 0; e < hd; e++)
                o[e] *= inv;
        }
}

void cpu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                   const void *v, cb_type t, int n_head, int n_head_kv, int hd, float scale,
                   int window, float *out)
{
    cpu_ctx *c = CTX(b);
    int nt = cb_pool_size(c->pool), G = n_head / n_head_kv;
    att_job j = {.c = c,
                 .q = q,
                 .pos = pos,
                 .n = n,
                 .k = k,
                 .v = v,
                 .t = t,
                 .n_head = n_head,
                 .n_head_kv = n_head_kv,
                 .hd = hd,
                 .window = window,
                 .scale = scale,
                 .out = out,
                 .kbias = c->kb_n > 0 ? c->kb_bias : NULL,
                 .n_stale = c->kb_n,
                 .until = c->kb_until};
    j.nh = G < ATT_M ? G : ATT_M;
    j.n_hsub = (G + j.nh - 1) / j.nh;
    j.mq = ATT_M / j.nh;
    j.n_qb = (n + j.mq - 1) / j.mq;
    j.kmin = INT32_MAX;
    j.kmax = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t lo = window > 0 && pos[i] >= window ? pos[i] - window + 1 : 0;
        j.kmin = lo < j.kmin ? lo : j.kmin;
        j.kmax = pos[i] + 1 > j.kmax ? pos[i] + 1 : j.kmax;
    }
    if (n == 1 && t == CB_TYPE_F16 && hd % 8 == 0 && G <= QMM_ATT_M && n_head <= ATT_M &&
        c->att_qk && c->att_pv) {
        /* decode: tasks over the keys alone, at least ATT_KB / 2 each, in
         * equal shares of the threads where there are enough keys */
        int64_t span = j.kmax - j.kmin, want = span / (ATT_KB / 2);
        int64_t fit = ATT_PARTS / (n_head * (int64_t)(hd + 2));
        want = want < 4 * nt ? want : 4 * nt;
        want = want > nt ? want / nt * nt : want;
        want = want < fit ? want : fit;
        j.n_split = want > 1 ? (int)want : 1;
        cb_blas_single();
        cb_pool_for(c->pool, att_task_dec, &j, j.n_split);
        if (j.n_split > 1)
            att_merge(&j);
        return;
    }
    /* few tasks and many keys (decode): split the keys too */
    int64_t tasks = (int64_t)n_head_kv * j.n_hsub * j.n_qb;
    j.n_split = 1;
    if (tasks < 4 * nt && j.kmax - j.kmin >= 2 * ATT_KB) {
        int64_t want = (4 * nt + tasks - 1) / tasks, most = (j.kmax - j.kmin) / ATT_KB;
        int64_t fit = ATT_PARTS / (n * n_head * (int64_t)(hd + 2));
        while ((tasks * want) % nt) /* equal shares: 3 KV heads on 2 threads in 12 tasks, not 9 */
            want++;
        want = want < most ? want : most;
        want = want < fit ? want : fit;
        j.n_split = want > 1 ? (int)want : 1;
    }
    /* the default path's 8-bit products, where there are rows enough */
    int a8 = c->act8 && c->qg.att8 && n >= ATT8_MIN_ROWS && hd % 32 == 0 && hd <= ATT_HD &&
             (t == CB_TYPE_F16 || t == CB_TYPE_F32) && a8_prep(&j);
    cb_blas_single();
    cb_pool_for(c->pool, a8 ? att_task8 : att_task, &j, tasks * j.n_split);
    if (j.n_split > 1)
        att_merge(&j);
}

cb_status cpu_set_key_bias(cb_backend *b, const uint8_t *stale, int64_t n, float bias,
                           int32_t until)
{
    cpu_ctx *c = CTX(b);
    c->kb_n = 0;
    if (n <= 0 || !stale)
        return CB_OK;
    if (n > c->kb_cap) {
        float *p = realloc(c->kb_bias, sizeof(float) * (size_t)n);
        if (!p)
            return CB_ERR_NOMEM;
        c->kb_bias = p, c->kb_cap = n;
    }
    for (int64_t k = 0; k < n; k++) /* a vector add in the softmax's loop, not a test a key */
        c->kb_bias[k] = stale[k] ? bias : 0.0f;
    c->kb_n = n, c->kb_until = until;
    return CB_OK;
}

/* ------------------------------------------------------ attention mass */

/* attn_mass on host memory (keys f32 [n_keys, n_head_kv*hd]; vn NULL or
 * the value rows' norms [n_keys, n_head_kv]): each head's logits of every
 * row over every key are one product into its scores [n, n_keys]; each
 * row's softmax over the keys its mask leaves it, times vn, added to mass.
 * Two steps, each split over the pool's threads when there is a pool: the
 * heads' scores and softmax sums, head by head, then the mass by ranges of
 * keys, each key's terms added in one order (head, then row) whatever the
 * split, so that every split gives the same bits.  The heads go a group at
 * a time, as many as MASS_BYTES of scores hold (one at least). */
enum { MASS_BYTES = 64 << 20, MASS_KEYS = 256 /* the least keys a range takes */ };

/* the ranges n_keys keys go in over nt threads: MASS_KEYS a range at least */
static int mass_parts(int64_t n_keys, int nt)
{
    int64_t parts = n_keys / MASS_KEYS;
    return parts < 1 ? 1 : parts < nt ? (int)parts : nt;
}

typedef struct mass_job {
    const float *q, *keys, *vn;
    const int32_t *pos;
    int64_t n, n_keys;
    int n_head, n_head_kv, hd, window;
    int h0, nh;  /* the group: heads h0 .. h0 + nh - 1 */
    int n_parts; /* the key ranges of the sums */
    float scale;
    qmm_exp_sum_fn exp_sum;
    float *s;   /* [nh][n][n_keys]: the exponentials of the scores */
    float *inv; /* [nh][n]: the inverses of their rows' sums */
    float *mass;
} mass_job;

/* head h0 + g: its scores, each row's exponentials and their sum */
static void mass_scores(void *arg, int64_t g, int tid)
{
    const mass_job *j = arg;
    int h = j->h0 + (int)g, grp = j->n_head / j->n_head_kv;
    int64_t dq = (int64_t)j->n_head * j->hd, w = (int64_t)j->n_head_kv * j->hd, nk = j->n_keys;
    float *s = j->s + g * j->n * nk;
    cb_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->n, (int)nk, j->hd, j->scale,
             j->q + (int64_t)h * j->hd, (int)dq, j->keys + (int64_t)(h / grp) * j->hd, (int)w, 0.0f,
             s, (int)nk);
    for (int64_t i = 0; i < j->n; i++) {
        int64_t e = (int64_t)j->pos[i] + 1, c0 = j->window > 0 && e > j->window ? e - j->window : 0;
        float *a = s + i * nk, mx = -INFINITY, sum = 0;
        for (int64_t c = c0; c < e; c++)
            mx = a[c] > mx ? a[c] : mx;
        if (j->exp_sum)
            sum = j->exp_sum(a + c0, e - c0, mx);
        else
            for (int64_t c = c0; c < e; c++)
                sum += (a[c] = expf(a[c] - mx));
        j->inv[g * j->n + i] = 1.0f / sum;
    }
}

/* keys [ka, kb) of range `part`: the group's terms added into the mass */
static void mass_add(void *arg, int64_t part, int tid)
{
    const mass_job *j = arg;
    int grp = j->n_head / j->n_head_kv, nkv = j->n_head_kv;
    int64_t nk = j->n_keys, ka = nk * part / j->n_parts, kb = nk * (part + 1) / j->n_parts;
    float *restrict mass = j->mass;
    for (int g = 0; g < j->nh; g++) {
        int kh = (j->h0 + g) / grp;
        for (int64_t i = 0; i < j->n; i++) {
            int64_t e = (int64_t)j->pos[i] + 1,
                    c0 = j->window > 0 && e > j->window ? e - j->window : 0;
            const float *a = j->s + (g * j->n + i) * nk;
            float inv = j->inv[g * j->n + i];
            c0 = c0 > ka ? c0 : ka;
            e = e < kb ? e : kb;
            if (j->vn)
                for (int64_t c = c0; c < e; c++)
                    mass[c] += a[c] * inv * j->vn[c * nkv + kh];
            else
                for (int64_t c = c0; c < e; c++)
                    mass[c] += a[c] * inv;
        }
    }
}

/* pool NULL: on the calling thread */
static cb_status mass_host(cb_pool *pool, const float *q, const int32_t *pos, int64_t n,
                           const float *keys, const float *vn, int64_t n_keys, int n_head,
                           int n_head_kv, int hd, float scale, int window, qmm_exp_sum_fn exp_sum,
                           float *mass)
{
    int nt = pool ? cb_pool_size(pool) : 1;
    int64_t per_head = n * n_keys, fit = MASS_BYTES / (int64_t)sizeof(float) / per_head;
    int nh = fit < 1 ? 1 : fit < n_head ? (int)fit : n_head;
    mass_job j = {.q = q,
                  .keys = keys,
                  .vn = vn,
                  .pos = pos,
                  .n = n,
                  .n_keys = n_keys,
                  .n_head = n_head,
                  .n_head_kv = n_head_kv,
                  .hd = hd,
                  .window = window,
                  .n_parts = mass_parts(n_keys, nt),
                  .scale = scale,
                  .exp_sum = exp_sum,
                  .mass = mass};
    j.s = malloc(sizeof(float) * (size_t)(nh * per_head));
    j.inv = malloc(sizeof(float) * (size_t)(nh * n));
    if (!j.s || !j.inv) {
        free(j.s), free(j.inv);
        return CB_ERR_NOMEM;
    }
    for (j.h0 = 0; j.h0 < n_head; j.h0 += j.nh) {
        j.nh = n_head - j.h0 < nh ? n_head - j.h0 : nh;
        if (pool) {
            cb_pool_for(pool, mass_scores, &j, j.nh);
            cb_pool_for(pool, mass_add, &j, j.n_parts);
            continue;
        }
        for (int g = 0; g < j.nh; g++)
            mass_scores(&j, g, 0);
        for (int p = 0; p < j.n_parts; p++)
            mass_add(&j, p, 0);
    }
    free(j.s), free(j.inv);
    return CB_OK;
}

/* the L2 norms of slices j0 .. j1-1 of a value cache (type t: f16, or f32
 * [n, n_kv*hd]), each KV head's slice of a row (slice j: row j / n_kv),
 * each a sum in order of the values as f32 */
static void norms_of(const void *v, cb_type t, int64_t j0, int64_t j1, int hd, float *vn)
{
    for (int64_t j = j0; j < j1; j++) {
        float s2 = 0.0f;
        for (int e = 0; e < hd; e++) {
            float x = t == CB_TYPE_F32 ? ((const float *)v)[j * hd + e]
                                       : (float)((const _Float16 *)v)[j * hd + e];
            s2 += x * x;
        }
        vn[j] = sqrtf(s2);
    }
}

/* ... of the first n rows: [n, n_kv] */
static float *value_norms(const void *v, cb_type t, int64_t n, int n_kv, int hd)
{
    float *vn = malloc(sizeof(float) * (size_t)(n * n_kv));
    if (vn)
        norms_of(v, t, 0, n * n_kv, hd, vn);
    return vn;
}

/* attn_mass's inputs from the cache, by ranges of rows over the threads:
 * the keys as f32 [n, width] (as kv_read converts them) and the value
 * rows' norms (vn NULL: none) */
typedef struct mass_prep {
    const void *k, *v;
    cb_type t;
    int64_t n, width;
    int n_kv, hd, parts;
    qmm_f16_fn f16_row;
    float *keys, *vn;
} mass_prep;

static void mass_prep_rows(void *arg, int64_t p, int tid)
{
    const mass_prep *j = arg;
    int64_t r0 = j->n * p / j->parts, r1 = j->n * (p + 1) / j->parts;
    if (j->t == CB_TYPE_F32)
        memcpy(j->keys + r0 * j->width, (const float *)j->k + r0 * j->width,
               sizeof(float) * (size_t)((r1 - r0) * j->width));
    else if (j->f16_row)
        j->f16_row((const uint16_t *)j->k + r0 * j->width, j->keys + r0 * j->width,
                   (r1 - r0) * j->width);
    else
        for (int64_t e = r0 * j->width; e < r1 * j->width; e++)
            j->keys[e] = (float)((const _Float16 *)j->k)[e];
    if (j->vn)
        norms_of(j->v, j->t, r0 * j->n_kv, r1 * j->n_kv, j->hd, j->vn);
}

cb_status cpu_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                        const void *v, cb_type t, int64_t n_keys, int n_head, int n_head_kv, int hd,
                        float scale, int window, float *mass)
{
    if (n == 0)
        return CB_OK;
    cpu_ctx *c = CTX(b);
    int64_t width = (int64_t)n_head_kv * hd;
    mass_prep j = {.k = k,
                   .v = v,
                   .t = t,
                   .n = n_keys,
                   .width = width,
                   .n_kv = n_head_kv,
                   .hd = hd,
                   .parts = mass_parts(n_keys, cb_pool_size(c->pool)),
                   .f16_row = c->f16_row};
    j.keys = malloc(sizeof(float) * (size_t)(n_keys * width));
    j.vn = v ? malloc(sizeof(float) * (size_t)(n_keys * n_head_kv)) : NULL;
    cb_status st = CB_ERR_NOMEM;
    if (j.keys && (!v || j.vn)) {
        cb_pool_for(c->pool, mass_prep_rows, &j, j.parts);
        cb_blas_single();
        st = mass_host(c->pool, q, pos, n, j.keys, j.vn, n_keys, n_head, n_head_kv, hd, scale,
                       window, c->exp_sum, mass);
    }
    free(j.keys), free(j.vn);
    return st;
}

/* A backend without attn_mass: the host computes it as the CPU does, on
 * copies (what blending did for every backend before the operation). */
static cb_status mass_fallback(cb_backend *b, const float *q, const int32_t *pos, int64_t n,
                               const void *k, const void *v, cb_type t, int64_t n_keys, int n_head,
                               int n_head_kv, int hd, float scale, int window, float *mass)
{
    int64_t w = (int64_t)n_head_kv * hd, dq = (int64_t)n_head * hd;
    cb_status st = CB_ERR_NOMEM;
    if (cb_blas_load())
        return CB_ERR_UNSUPPORTED;
    int32_t *at = malloc(sizeof(int32_t) * (size_t)n_keys);
    float *hq = malloc(sizeof(float) * (size_t)(n * dq)),
          *hk = malloc(sizeof(float) * (size_t)(n_keys * w)),
          *hv = v ? malloc(sizeof(float) * (size_t)(n_keys * w)) : NULL, *vn = NULL,
          *hm = malloc(sizeof(float) * (size_t)n_keys);
    float *tmp = b->ops->alloc_tmp ? b->ops->alloc_tmp(b, sizeof(float) * (size_t)(n_keys * w))
                                   : b->ops->alloc(b, sizeof(float) * (size_t)(n_keys * w));
    if (at && hq && hk && (!v || hv) && hm && tmp) {
        for (int64_t j = 0; j < n_keys; j++)
            at[j] = (int32_t)j;
        if (v) {
            b->ops->kv_read(b, v, t, w, at, n_keys, tmp);
            b->ops->download(b, hv, tmp, sizeof(float) * (size_t)(n_keys * w));
            vn = value_norms(hv, CB_TYPE_F32, n_keys, n_head_kv, hd);
        }
        b->ops->kv_read(b, k, t, w, at, n_keys, tmp);
        b->ops->download(b, hk, tmp, sizeof(float) * (size_t)(n_keys * w));
        b->ops->download(b, hq, q, sizeof(float) * (size_t)(n * dq));
        b->ops->download(b, hm, mass, sizeof(float) * (size_t)n_keys);
        if (!v || vn)
            st = mass_host(NULL, hq, pos, n, hk, vn, n_keys, n_head, n_head_kv, hd, scale, window,
                           qmm_exp_sum(1), hm);
        if (st == CB_OK)
            b->ops->upload(b, mass, hm, sizeof(float) * (size_t)n_keys);
    }
    if (tmp)
        b->ops->dealloc(b, tmp);
    free(at), free(hq), free(hk), free(hv), free(vn), free(hm);
    return st;
}

cb_status cb_backend_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n,
                               const void *k, const void *v, cb_type t, int64_t n_keys, int n_head,
                               int n_head_kv, int hd, float scale, int window, float *mass)
{
    cb_status st = cb_backend_status(b); /* after a fault: nothing (backend.h) */
    if (st != CB_OK)
        return st;
    if (b->ops->attn_mass)
        return b->ops->attn_mass(b, q, pos, n, k, v, t, n_keys, n_head, n_head_kv, hd, scale,
                                 window, mass);
    if (n == 0)
        return CB_OK;
    return mass_fallback(b, q, pos, n, k, v, t, n_keys, n_head, n_head_kv, hd, scale, window, mass);
}
