/* cpu_attn.c - the CPU backend's attention: blocks of keys read from the
 * f16 (or f32) cache into small per-thread f32 tiles, online softmax, the
 * query heads sharing a KV head together; keys split over threads for
 * decode, their partial results merged after.  And blending's attention
 * mass (attn_mass), with the host fallback for backends without it. */
#include "../core/dequant.h"
#include "blas.h"
#include "cpu_impl.h"
#include "opmath.h"

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

static void att_task(void *arg, int64_t task, int tid)
{
    const att_job *j = arg;
    thread_scratch *ts = &j->c->ts[tid];
    int sp = (int)(task % j->n_split);
    int64_t rest = task / j->n_split, qb = rest % j->n_qb;
    int hs = (int)(rest / j->n_qb % j->n_hsub), hk = (int)(rest / j->n_qb / j->n_hsub);
    int hd = j->hd, G = j->n_head / j->n_head_kv;
    int h0 = hk * G + hs * j->nh, h1 = h0 + j->nh < (hk + 1) * G ? h0 + j->nh : (hk + 1) * G,
        nh = h1 - h0;
    int64_t i0 = qb * j->mq, i1 = i0 + j->mq < j->n ? i0 + j->mq : j->n, M = (i1 - i0) * nh;
    int64_t width = (int64_t)j->n_head_kv * hd;
    int64_t span = j->kmax - j->kmin;
    int64_t ka = j->kmin + span * sp / j->n_split, kb = j->kmin + span * (sp + 1) / j->n_split;
    int64_t lo_all = INT64_MAX, hi_all = -1;

    rows_begin(j, ts, i0, i1, h0, nh);
    for (int64_t i = i0; i < i1; i++) {
        int64_t lo = j->window > 0 && j->pos[i] >= j->window ? j->pos[i] - j->window + 1 : 0;
        lo_all = lo < lo_all ? lo : lo_all;
        hi_all = j->pos[i] > hi_all ? j->pos[i] : hi_all;
    }
    ka = ka > lo_all ? ka : lo_all;
    kb = kb < hi_all + 1 ? kb : hi_all + 1;
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
        int64_t c1 = c0 + ATT_KB < kb ? c0 + ATT_KB : kb, nk = c1 - c0;
        /* the rows that see this tile: leading rows before it and trailing
         * ones whose window starts after it see nothing of it (rows in
         * position order, as a prefill's or blend's are: all but the first
         * and last such rows are computed, masked, in any order) */
        int64_t ia = i0, ib = i1;
        while (ia < ib && j->pos[ia] < c0)
            ia++;
        while (ib > ia && j->window > 0 && j->pos[ib - 1] - j->window + 1 >= c1)
            ib--;
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
            int64_t lo = j->window > 0 && j->pos[i] >= j->window ? j->pos[i] - j->window + 1 : 0;
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
    int64_t p = j->pos[0], lo = j->window > 0 && p >= j->window ? p - j->window + 1 : 0;
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
        for (int r = 0; r < H; r++)
            softmax_step(ts->s + r * ATT_KB, nk, c0, lo, p, &ts->mx[r], &ts->l[r], ts->o + r * hd,
                         hd, j->c->exp_sum);
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
                 .out = out};
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
    cb_blas_single();
    cb_pool_for(c->pool, att_task, &j, tasks * j.n_split);
    if (j.n_split > 1)
        att_merge(&j);
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
