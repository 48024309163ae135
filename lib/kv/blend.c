/* blend.c - prefill a prompt from cached chunk KV: prefix caching, full KV
 * reuse, and CacheBlend's selective recompute.
 *
 * Blend, for the rows of a prompt (cached rows C, computed rows F = the
 * rest, always including the last row):
 *   load     every cached segment's K/V at every layer, K rotated from the
 *            positions it was computed at to its place in the prompt
 *   layers < check: every row (layer 0's hidden states feed the check)
 *   check l: fresh K (or V) of the candidate rows; the deviation of a cached
 *            row is the squared L2 distance between fresh and loaded; keep
 *            the top ratio x |C| cached rows (strategy-dependent), with F;
 *            the layer runs for those rows only, writing their K/V over the
 *            loaded ones.  With several ratios the next layers filter the
 *            survivors again (gradual filtering).
 *   later:   the last selection only.
 * Attention is the engine's exact causal mask: a selected row at position p
 * sees keys 0..p only.  The first cache, when everything before it is
 * exactly the lead-in it was computed after, at the same positions (a true
 * prefix, as prefix caching requires), holds what full prefill computes:
 * its rows are exact, never computed and never candidates: the ratios'
 * budgets (of all cached rows) go to the other cached rows.  The keys of
 * the other caches may be divided by a temperature as they are loaded
 * (key_temp, after APE; by default the architecture's, cb_blend_key_temp):
 * the attention the computed rows give the tokens that keep their loaded
 * K/V; recomputed rows overwrite theirs.  The check-layer strategies
 * compute every row in the layers before the check layer, where nothing
 * loaded is used and so nothing is tempered: at a temperature other than
 * 1 their ratio 0 is reuse but for those layers (probe's is reuse).
 *
 * Loading is pipelined: a loader thread reads and places layer l+1 of every
 * cached segment while layer l is computed; computing a layer waits only
 * until that layer is in place (it must: the computation overwrites the
 * selected rows' K/V in it).  On a GPU "in place" is two steps: the host
 * waits until the loader has queued the layer's copies, the device until
 * they are done (an event per cache layer, see cb_kvcache_load). */
#include "kv.h"
#include "../backend/blas.h"
#include "../backend/qmm.h"
#include "../infer/model_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

cb_blend_params cb_blend_defaults(void)
{
    cb_blend_params p;
    memset(&p, 0, sizeof p);
    p.mode = CB_MODE_BLEND;
    p.strategy = CB_STRATEGY_PROBE; /* measured best (issue 15); hkvd is the paper's */
    p.check_layer = 1;
    p.n_ratios = 1;
    p.ratios[0] = 0.15f;
    p.deviation_v = 1;
    p.sink_tokens = 4;
    p.adapt_min = 0.05f;
    p.adapt_max = 0.5f;
    p.probe_rows = 0;  /* all the question's rows: measured better than its last 8 (issue 15) */
    p.key_temp = 0.0f; /* the model's: cb_blend_key_temp */
    return p;
}

/* Key temperatures measured on MuSiQue (issue 15): gemma3 1.05 (Gemma-3-270M:
 * first-token KL lower on 45 of 50 questions, KL recovery 20% -> 50% on
 * questions 1-30, 33% -> 57% on 31-50); on the others nothing that held
 * out of sample (SmolLM2: 1.1 helped questions 1-30, not 31-80). */
float cb_blend_key_temp(const cb_model *m, const cb_blend_params *p)
{
    if (p->key_temp > 0.0f)
        return p->key_temp;
    return strcmp(cb_model_hparams(m)->arch, "gemma3") == 0 ? 1.05f : 1.0f;
}

/* ------------------------------------------------------------- loader */

typedef struct loader {
    const cb_model *m;
    const cb_segment *segs;
    int32_t n_segs, n_layer;
    const uint8_t *use;
    const int32_t *start;
    cb_kvcache *kv;
    int64_t max_seg, w;
    double limit_mbs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t ready; /* layers 0..ready-1 are in place */
    cb_status st;
    cb_error err;
    int32_t failed_seg; /* the segment whose file failed to read, or -1 */
    int32_t exact_seg;  /* a true prefix's segment (its keys stay as they are), or -1 */
    float key_scale;    /* the other caches' keys are multiplied by it (1 / key_temp) */
    double busy_ms, t_begin;
    uint64_t bytes;
    pthread_t thread;
    int started; /* the thread runs (else loading ran on the caller's) */
} loader;

static void loader_run(loader *ld)
{
    float *k = malloc(sizeof(float) * (size_t)(ld->max_seg * ld->w));
    float *v = malloc(sizeof(float) * (size_t)(ld->max_seg * ld->w));
    cb_status st = k && v ? CB_OK : CB_ERR_NOMEM;
    cb_error err;
    int32_t bad_seg = -1;

    if (st != CB_OK)
        cb_error_set(&err, st, "blend: out of memory");
    for (int32_t l = 0; l < ld->n_layer && st == CB_OK; l++) {
        double t0 = cb_now_ms();
        for (int32_t s = 0; s < ld->n_segs && st == CB_OK; s++) {
            if (!ld->use[s])
                continue;
            cb_kvfile *kf = ld->segs[s].kv;
            if ((st = cb_kvfile_read_layer(kf, l, k, v, &err)) != CB_OK) {
                bad_seg = s;
                break;
            }
            if (ld->key_scale != 1.0f && s != ld->exact_seg)
                for (int64_t e = 0; e < (int64_t)ld->segs[s].n * ld->w; e++)
                    k[e] *= ld->key_scale;
            st = cb_kvcache_load(ld->kv, l, ld->start[s], ld->segs[s].n, k, v,
                                 cb_kvfile_meta(kf)->pos0);
            if (st != CB_OK)
                cb_error_set(&err, st, "blend: cannot place segment %d", s);
            ld->bytes += cb_kvfile_size(kf) / (uint64_t)ld->n_layer;
        }
        if (ld->limit_mbs > 0) { /* an emulated slow tier: never faster than limit_mbs */
            double due = ld->t_begin + (double)ld->bytes / (ld->limit_mbs * 1e3), now = cb_now_ms();
            if (due > now) {
                struct timespec ts = {(time_t)((due - now) / 1e3),
                                      (long)(fmod(due - now, 1e3) * 1e6)};
                nanosleep(&ts, NULL);
            }
        }
        pthread_mutex_lock(&ld->mu);
        ld->busy_ms += cb_now_ms() - t0;
        if (st == CB_OK)
            ld->ready = l + 1;
        else
            ld->st = st, ld->err = err, ld->failed_seg = bad_seg;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
    }
    { /* a device queues the copies: wait for them on every exit (after an
       * error too: the caller frees the cache once this thread is joined),
       * and count them as loading time */
        double t0 = cb_now_ms();
        cb_model_sync(ld->m);
        pthread_mutex_lock(&ld->mu);
        ld->busy_ms += cb_now_ms() - t0;
        pthread_mutex_unlock(&ld->mu);
    }
    if (st != CB_OK && ld->st == CB_OK) {
        pthread_mutex_lock(&ld->mu);
        ld->st = st;
        ld->err = err;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
    }
    free(k);
    free(v);
}

static void *loader_main(void *arg)
{
    loader_run(arg);
    return NULL;
}

/* Start loading every used cache, layer by layer, at its new position
 * (the keys of all but segment exact_seg divided by the key temperature): on a
 * thread of its own, or right here with p->sequential_load (or when no
 * thread can be made).  Nothing to load: every layer is ready at once. */
static void loader_start(loader *ld, const cb_model *m, const cb_segment *segs, int32_t n_segs,
                         const uint8_t *use, const int32_t *start, int32_t exact_seg,
                         cb_kvcache *kv, int64_t max_seg, const cb_blend_params *p)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int any = 0;
    for (int32_t s = 0; s < n_segs; s++)
        any |= use[s];
    memset(ld, 0, sizeof *ld);
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv, NULL);
    ld->m = m;
    ld->segs = segs;
    ld->n_segs = n_segs;
    ld->n_layer = hp->n_layer;
    ld->use = use;
    ld->start = start;
    ld->kv = kv;
    ld->max_seg = max_seg;
    ld->w = (int64_t)hp->n_head_kv * hp->head_dim;
    ld->limit_mbs = p->load_limit_mbs;
    ld->ready = any ? 0 : hp->n_layer;
    ld->failed_seg = -1;
    ld->exact_seg = exact_seg;
    ld->key_scale = p->mode == CB_MODE_BLEND || p->mode == CB_MODE_REUSE
                        ? 1.0f / cb_blend_key_temp(m, p)
                        : 1.0f;
    ld->t_begin = cb_now_ms();
    if (!any)
        return;
    if (p->sequential_load || pthread_create(&ld->thread, NULL, loader_main, ld) != 0)
        loader_run(ld);
    else
        ld->started = 1;
}

/* Wait for the loader to finish (it always runs to the end or to its
 * first error) and release it. */
static void loader_stop(loader *ld)
{
    if (ld->started)
        pthread_join(ld->thread, NULL);
    ld->started = 0;
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
}

/* Wait until layer l is in place; adds the time waited to *stall. */
static cb_status loader_wait(loader *ld, int32_t l, double *stall, cb_error *err)
{
    cb_status st;
    double t0 = cb_now_ms();
    pthread_mutex_lock(&ld->mu);
    while (ld->ready <= l && ld->st == CB_OK)
        pthread_cond_wait(&ld->cv, &ld->mu);
    st = ld->ready > l ? CB_OK : ld->st;
    if (st != CB_OK && err)
        *err = ld->err;
    pthread_mutex_unlock(&ld->mu);
    *stall += cb_now_ms() - t0;
    return st;
}

/* ------------------------------------------------------------ the plan */

typedef struct scored {
    float score;
    int32_t row;
} scored;

static int by_score_desc(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (x->row > y->row) - (x->row < y->row);
}

/* cached[r]: computed (0), loaded and a candidate for recompute, or loaded
 * and exact (a true prefix's: never recomputed) */
enum { ROW_CAND = 1, ROW_EXACT = 2 };

/* The prompt's rows and what happens to them. */
typedef struct plan {
    cb_fwd *f;
    cb_kvcache *kv;
    const cb_hparams *hp;
    const cb_segment *segs;
    const cb_blend_params *p;
    int32_t n_segs;
    int64_t total, max_seg, n_cached, w;
    int64_t n_exact;             /* cached rows of a true prefix (cached[r] == ROW_EXACT) */
    int32_t exact_seg;           /* that segment, or -1 */
    int32_t *ids, *pos, *seg_of; /* [total] */
    int32_t *start;              /* [n_segs]: first row of each segment */
    uint8_t *use;                /* [n_segs]: its cache is used */
    uint8_t *cached;             /* [total]: the row's KV comes from a cache (ROW_*) */
    uint8_t *keep;               /* [total]: a cached row still selected for recompute */
    int32_t *rows; /* [total]: the computed rows (fresh ones and selected cached ones) */
    int32_t n_rows;
    int32_t *top; /* [total]: hkvd's choice */
    scored *sc;   /* [total]: query's scores */
    float *fresh; /* query: candidates' fresh keys [total, w] */
    float *qbuf;  /* query: the question's queries [nq, n_head*head_dim] */
    float *srow;  /* query: one head's attention over the candidates [total] */
    loader ld;
    double stall;
    qmm_exp_sum_fn exp_sum; /* probe: the vectorized softmax exponential, or NULL */
} plan;

static void plan_free(plan *pl)
{
    free(pl->ids), free(pl->pos), free(pl->seg_of), free(pl->start), free(pl->use),
        free(pl->cached);
    free(pl->keep), free(pl->rows), free(pl->top), free(pl->sc), free(pl->fresh), free(pl->qbuf),
        free(pl->srow);
}

/* Check the segments against the model and the cache; the prompt's size. */
static cb_status plan_check(plan *pl, cb_error *err)
{
    const cb_model *m = cb_fwd_model(pl->f);
    const cb_blend_params *p = pl->p;
    cb_status st;
    if (pl->n_segs < 1 || p->n_ratios < 1 || p->n_ratios > CB_BLEND_MAX_STEPS ||
        p->check_layer < 1 || p->check_layer + p->n_ratios > pl->hp->n_layer)
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: check layer %d with %d ratios does not fit %d layers",
                            p->check_layer, p->n_ratios, pl->hp->n_layer);
    if (!(p->key_temp >= 0.0f && p->key_temp < 1e30f))
        return cb_error_set(
            err, CB_ERR_INVALID,
            "blend: the key temperature must be positive (or 0: the model's), not %g",
            (double)p->key_temp);
    if (p->strategy == CB_STRATEGY_PROBE && p->n_ratios != 1)
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: probe selects once: give one ratio, not %d", p->n_ratios);
    const char *no_blas =
        p->strategy == CB_STRATEGY_PROBE ? cb_blas_load() : NULL; /* its scores, on the host */
    if (no_blas)
        return cb_error_set(err, CB_ERR_DEVICE, "blend: %s", no_blas);
    if (p->adapt_mass < 0 || p->adapt_mass > 1 ||
        (p->adapt_mass > 0 && (p->strategy != CB_STRATEGY_PROBE || p->adapt_min < 0 ||
                               p->adapt_min > p->adapt_max || p->adapt_max > 1)))
        return cb_error_set(
            err, CB_ERR_INVALID,
            "blend: an adaptive ratio needs the probe strategy, a mass in (0, 1] and 0 <= min <= "
            "max <= 1");
    for (int32_t s = 0; s < pl->n_segs; s++) {
        const cb_segment *g = &pl->segs[s];
        pl->total += g->n;
        pl->max_seg = g->n > pl->max_seg ? g->n : pl->max_seg;
        if (!g->kv)
            continue;
        if ((st = cb_kvfile_check_model(g->kv, m, err)) != CB_OK)
            return st;
        if (cb_kvfile_meta(g->kv)->n_tokens != g->n)
            return cb_error_set(err, CB_ERR_INVALID,
                                "blend: segment %d has %d tokens, its KV file %d", s, g->n,
                                cb_kvfile_meta(g->kv)->n_tokens);
    }
    if (pl->total < 1 || pl->total > cb_kvcache_n_ctx(pl->kv))
        return cb_error_set(err, CB_ERR_RANGE,
                            "blend: a prompt of %lld tokens does not fit the context of %d",
                            (long long)pl->total, cb_kvcache_n_ctx(pl->kv));
    return CB_OK;
}

/* Does everything before segment s equal its file's lead-in, at the
 * positions it was computed at?  Then its cache is exactly what a full
 * prefill computes (prefix caching). */
static int is_true_prefix(const cb_segment *segs, int32_t s, int32_t start)
{
    const cb_kv_meta *mt = cb_kvfile_meta(segs[s].kv);
    if (mt->n_lead != start || mt->pos0 != start)
        return 0;
    int32_t at = 0;
    for (int32_t i = 0; i < s; i++)
        for (int32_t j = 0; j < segs[i].n; j++, at++)
            if (segs[i].ids[j] != mt->lead[at])
                return 0;
    return 1;
}

/* Lay the rows out, decide which caches the mode uses, and which rows are
 * cached; the computed set starts as every row that is not. */
static cb_status plan_rows(plan *pl, cb_error *err)
{
    int64_t total = pl->total;
    int32_t n_segs = pl->n_segs;
    pl->w = (int64_t)pl->hp->n_head_kv * pl->hp->head_dim;
    pl->ids = malloc(sizeof(int32_t) * (size_t)total);
    pl->pos = malloc(sizeof(int32_t) * (size_t)total);
    pl->rows = malloc(sizeof(int32_t) * (size_t)total);
    pl->seg_of = malloc(sizeof(int32_t) * (size_t)total);
    pl->start = malloc(sizeof(int32_t) * (size_t)n_segs);
    pl->use = calloc((size_t)n_segs, 1);
    pl->cached = calloc((size_t)total, 1);
    pl->keep = calloc((size_t)total, 1);
    pl->sc = malloc(sizeof(scored) * (size_t)total);
    if (!pl->ids || !pl->pos || !pl->rows || !pl->seg_of || !pl->start || !pl->use || !pl->cached ||
        !pl->keep || !pl->sc)
        return cb_error_set(err, CB_ERR_NOMEM, "blend: out of memory");
    for (int32_t s = 0, at = 0; s < n_segs; s++) {
        pl->start[s] = at;
        for (int32_t j = 0; j < pl->segs[s].n; j++, at++) {
            pl->ids[at] = pl->segs[s].ids[j];
            pl->pos[at] = at;
            pl->seg_of[at] = s;
        }
    }
    if (pl->p->mode == CB_MODE_PREFIX) {
        for (int32_t s = 0; s < n_segs; s++)
            if (pl->segs[s].kv) {
                pl->use[s] = is_true_prefix(pl->segs, s, pl->start[s]);
                break;
            }
    } else if (pl->p->mode == CB_MODE_REUSE || pl->p->mode == CB_MODE_BLEND) {
        for (int32_t s = 0; s < n_segs; s++)
            pl->use[s] = pl->segs[s].kv != NULL;
    }
    for (int64_t r = 0; r < total; r++)
        if (pl->use[pl->seg_of[r]] &&
            r != total - 1) /* the last row is always computed: its logits are needed */
            pl->cached[r] = ROW_CAND, pl->n_cached++;
    pl->exact_seg = -1;
    if (pl->p->mode == CB_MODE_BLEND || pl->p->mode == CB_MODE_REUSE)
        for (int32_t s = 0; s < n_segs; s++)
            if (pl->use[s]) { /* the first cache: exact when a true prefix */
                pl->exact_seg = is_true_prefix(pl->segs, s, pl->start[s]) ? s : -1;
                for (int32_t j = 0; pl->exact_seg == s && j < pl->segs[s].n; j++)
                    if (pl->cached[pl->start[s] + j])
                        pl->cached[pl->start[s] + j] = ROW_EXACT, pl->n_exact++;
                break;
            }
    pl->n_rows = 0;
    for (int64_t r = 0; r < total; r++)
        if (!pl->cached[r])
            pl->rows[pl->n_rows++] = (int32_t)r;
    return CB_OK;
}

/* ---------------------------------------------------------- strategies */

/* query: the candidates the last segment's rows (the question) attend to
 * most, by softmax attention over the candidates' fresh keys at layer l,
 * summed over the question's rows and heads. */
static cb_status select_query(plan *pl, int32_t l, const int32_t *cand, int32_t n_c, int64_t want)
{
    const cb_hparams *hp = pl->hp;
    int32_t qs = pl->start[pl->n_segs - 1], nq = (int32_t)(pl->total - qs);
    int64_t dq = (int64_t)hp->n_head * hp->head_dim;
    int grp = hp->n_head / hp->n_head_kv;
    float scale = cb_fwd_model(pl->f)->attn_scale; /* the engine's */
    int32_t *qrows = malloc(sizeof(int32_t) * (size_t)nq);
    float *nb = realloc(pl->qbuf, sizeof(float) * (size_t)(nq * dq));
    cb_status st;

    if (nb)
        pl->qbuf = nb;
    if (!qrows || !nb || (!pl->srow && !(pl->srow = malloc(sizeof(float) * (size_t)pl->total)))) {
        free(qrows);
        return CB_ERR_NOMEM;
    }
    for (int32_t i = 0; i < nq; i++)
        qrows[i] = qs + i;
    st = cb_fwd_layer_qkv(pl->f, l, qrows, nq, pl->qbuf, NULL, NULL);
    if (st == CB_OK)
        st = cb_fwd_layer_qkv(pl->f, l, cand, n_c, NULL, pl->fresh, NULL);
    free(qrows);
    if (st != CB_OK)
        return st;
    for (int32_t c = 0; c < n_c; c++)
        pl->sc[c] = (scored){0.0f, cand[c]};
    for (int32_t i = 0; i < nq; i++)
        for (int32_t h = 0; h < hp->n_head; h++) {
            const float *qv = pl->qbuf + i * dq + (int64_t)h * hp->head_dim;
            int32_t kh = h / grp;
            float mx = -INFINITY, sum = 0, *srow = pl->srow;
            for (int32_t c = 0; c < n_c; c++) {
                const float *kv_ = pl->fresh + c * pl->w + (int64_t)kh * hp->head_dim;
                float dot = 0;
                for (int32_t e = 0; e < hp->head_dim; e++)
                    dot += qv[e] * kv_[e];
                srow[c] = dot * scale;
                mx = srow[c] > mx ? srow[c] : mx;
            }
            for (int32_t c = 0; c < n_c; c++)
                sum += (srow[c] = expf(srow[c] - mx));
            for (int32_t c = 0; c < n_c; c++)
                pl->sc[c].score += srow[c] / sum;
        }
    qsort(pl->sc, (size_t)n_c, sizeof *pl->sc, by_score_desc);
    for (int32_t c = 0; c < n_c; c++)
        pl->keep[pl->sc[c].row] = c < want;
    return CB_OK;
}

/* hkvd: the candidates whose fresh K (or V) deviates most from the loaded
 * cache, ranked on the backend: only the chosen rows come back. */
static cb_status select_hkvd(plan *pl, int32_t l, const int32_t *cand, int32_t n_c, int64_t want)
{
    cb_status st =
        cb_fwd_deviation(pl->f, pl->kv, l, pl->p->deviation_v, cand, n_c, (int32_t)want, pl->top);
    if (st != CB_OK)
        return st;
    for (int32_t c = 0; c < n_c; c++)
        pl->keep[cand[c]] = 0;
    for (int64_t c = 0; c < want; c++)
        pl->keep[pl->top[c]] = 1;
    return CB_OK;
}

/* runs: half the budget to the most deviating rows (anchors), the rest to
 * the cached row after each anchor, in anchor order, so that recomputed
 * tokens see recomputed neighbours; what is left (a successor already
 * chosen or not cached) goes to the next most deviating rows. */
static cb_status select_runs(plan *pl, int32_t l, const int32_t *cand, int32_t n_c, int64_t want)
{
    cb_status st = cb_fwd_deviation(pl->f, pl->kv, l, pl->p->deviation_v, cand, n_c, n_c, pl->top);
    int64_t n_anchor = (want + 1) / 2, got = 0;
    if (st != CB_OK)
        return st;
    for (int32_t c = 0; c < n_c; c++)
        pl->keep[cand[c]] = 0;
    for (int64_t a = 0; a < n_anchor; a++)
        pl->keep[pl->top[a]] = 1, got++;
    for (int64_t a = 0; a < n_anchor && got < want; a++) {
        int32_t next = pl->top[a] + 1;
        if (next < pl->total && pl->cached[next] == ROW_CAND && !pl->keep[next] &&
            pl->seg_of[next] == pl->seg_of[pl->top[a]])
            pl->keep[next] = 1, got++;
    }
    for (int64_t a = n_anchor; a < n_c && got < want; a++)
        if (!pl->keep[pl->top[a]])
            pl->keep[pl->top[a]] = 1, got++;
    return CB_OK;
}

/* sink: also the first sink_tokens cached rows of every used cache (but
 * an exact one). */
static void add_sinks(plan *pl)
{
    for (int32_t s = 0; s < pl->n_segs; s++)
        if (pl->use[s])
            for (int32_t j = 0; j < pl->p->sink_tokens && j < pl->segs[s].n; j++)
                if (pl->cached[pl->start[s] + j] == ROW_CAND)
                    pl->keep[pl->start[s] + j] = 1;
}

/* ------------------------------------------------------------- fusion */

/* Layers lo..hi-1 for the current computed set (rows NULL: every row);
 * the model's last layer only as far as the prompt's last row's logits and
 * the cache need (cb_fwd_last_layer). */
static cb_status run_layers(plan *pl, int32_t lo, int32_t hi, const int32_t *rows, int32_t n_rows,
                            int *layer_err, cb_error *err)
{
    cb_status st;
    for (int32_t l = lo; l < hi; l++) {
        if ((st = loader_wait(&pl->ld, l, &pl->stall, err)) != CB_OK)
            return st;
        st = l == pl->hp->n_layer - 1
                 ? cb_fwd_last_layer(pl->f, pl->kv, rows, n_rows, (int32_t)pl->total - 1)
                 : cb_fwd_layer(pl->f, pl->kv, l, rows, n_rows);
        if (st != CB_OK)
            return *layer_err = 1, st;
    }
    return CB_OK;
}

/* probe, at layer l: the softmax attention of the query rows qrows
 * (queries [nq, n_head*hd] in pl->qbuf) over the positions each sees
 * under the engine's mask (0..row, or on a sliding-window layer
 * row-window+1..row; keys [total, w] from the cache), added to every
 * row's mass[total], over every head (only the candidates' count).  The
 * logits of one head are one product (OpenBLAS) into pl->srow [nq, total]. */
static void probe_add(plan *pl, int32_t l, const int32_t *qrows, int32_t nq, const float *keys,
                      float *restrict mass)
{
    const cb_hparams *hp = pl->hp;
    int64_t dq = (int64_t)hp->n_head * hp->head_dim, total = pl->total;
    int grp = hp->n_head / hp->n_head_kv;
    int32_t window = cb_model_layer_window(cb_fwd_model(pl->f), l);
    float scale = cb_fwd_model(pl->f)->attn_scale; /* the engine's */
    for (int32_t h = 0; h < hp->n_head; h++) {
        cb_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, (int)total, hp->head_dim, scale,
                 pl->qbuf + (int64_t)h * hp->head_dim, (int)dq,
                 keys + (int64_t)(h / grp) * hp->head_dim, (int)pl->w, 0.0f, pl->srow, (int)total);
        for (int32_t i = 0; i < nq; i++) {
            int32_t n = qrows[i] + 1,
                    j0 = window > 0 && n > window ? n - window : 0; /* the engine's mask */
            float *a = pl->srow + i * total, mx = -INFINITY, sum = 0;
            for (int32_t j = j0; j < n; j++)
                mx = a[j] > mx ? a[j] : mx;
            if (pl->exp_sum)
                sum = pl->exp_sum(a + j0, n - j0, mx);
            else
                for (int32_t j = j0; j < n; j++)
                    sum += (a[j] = expf(a[j] - mx));
            float inv = 1.0f / sum;
            for (int32_t j = j0; j < n; j++)
                mass[j] += a[j] * inv;
        }
    }
}

/* probe's budget: the given one, or with adapt_mass the fewest top rows
 * (scores sorted in pl->sc[0..n_c)) holding that share of the mass,
 * clamped to [adapt_min, adapt_max] x the cached rows (and to the n_c
 * candidates); the stats say which and why. */
static int64_t probe_budget(plan *pl, int64_t n_c, int64_t want, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    double total = 0, acc = 0;
    int64_t k = 0;
    for (int64_t c = 0; c < n_c; c++)
        total += pl->sc[c].score;
    if (p->adapt_mass > 0 && n_c > 0) {
        int64_t lo = (int64_t)ceilf(p->adapt_min * (float)pl->n_cached);
        int64_t hi = (int64_t)ceilf(p->adapt_max * (float)pl->n_cached);
        lo = lo < n_c ? lo : n_c, hi = hi < n_c ? hi : n_c;
        while (k < n_c && acc < p->adapt_mass * total)
            acc += pl->sc[k++].score;
        stats->ratio_bound = k < lo ? "min" : k > hi ? "max" : "mass";
        want = k < lo ? lo : k > hi ? hi : k;
        stats->ratio = (float)want / (float)pl->n_cached;
    }
    acc = 0;
    for (int64_t c = 0; c < want && c < n_c; c++)
        acc += pl->sc[c].score;
    stats->selected_mass = total > 0 ? (float)(acc / total) : 0.0f;
    return want;
}

/* probe: the uncached rows through every layer against the loaded cache,
 * each layer's attention from the question (the last probe_rows uncached
 * rows of the last segment, or all of them, with the queries that layer
 * computed for them) scoring the cached rows; then
 * the top ratio x cached rows, with the uncached ones, from the embeddings
 * through every layer.  The second pass must recompute the uncached rows
 * too: from layer 0 on they attend to the selected rows' fresh K/V, not
 * the loaded ones the first pass saw.  Only their layer-0 K/V (a function
 * of the embeddings) is the same, a negligible share of the pass (6
 * passages: 43 of 593 rows in 1 of 30 layers), so nothing of the first
 * pass is kept. */
static cb_status fuse_probe(plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    const cb_hparams *hp = pl->hp;
    int32_t qs = pl->start[pl->n_segs - 1], nq = 0, *qrows = NULL;
    int64_t n_cand = pl->n_cached - pl->n_exact, n_c = 0;
    int64_t want = (int64_t)ceilf(pl->p->ratios[pl->p->n_ratios - 1] * (float)pl->n_cached);
    float *keys = NULL, *mass = NULL;
    cb_status st = CB_ERR_NOMEM;

    qrows = malloc(sizeof(int32_t) * (size_t)(pl->total - qs));
    keys = malloc(sizeof(float) * (size_t)(pl->total * pl->w));
    mass = calloc((size_t)pl->total, sizeof(float));
    pl->qbuf = malloc(sizeof(float) * (size_t)((pl->total - qs) * hp->n_head * hp->head_dim));
    pl->srow = malloc(sizeof(float) * (size_t)((pl->total - qs) * pl->total));
    if (!qrows || !keys || !mass || !pl->qbuf || !pl->srow)
        goto out;
    for (int32_t i = 0; i < pl->n_rows;
         i++) /* the last segment's uncached rows: the tail of pl->rows */
        if (pl->rows[i] >= qs)
            qrows[nq++] = pl->rows[i];
    if (pl->p->probe_rows > 0 && nq > pl->p->probe_rows) { /* the last ones */
        memmove(qrows, qrows + nq - pl->p->probe_rows, sizeof(int32_t) * (size_t)pl->p->probe_rows);
        nq = pl->p->probe_rows;
    }
    pl->exp_sum = qmm_exp_sum(1);
    for (int32_t l = 0; l < hp->n_layer && (pl->p->adapt_mass > 0 || (want > 0 && want < n_cand));
         l++) {
        if ((st = loader_wait(&pl->ld, l, &pl->stall, err)) != CB_OK)
            goto out;
        if ((st = cb_fwd_layer(pl->f, pl->kv, l, pl->rows, pl->n_rows)) != CB_OK ||
            (st = cb_fwd_layer_queries(pl->f, pl->n_rows - nq, nq, pl->qbuf)) != CB_OK ||
            (st = cb_kvcache_read(pl->kv, l, 0, 0, (int32_t)pl->total, keys)) != CB_OK) {
            *layer_err = 1;
            goto out;
        }
        probe_add(pl, l, qrows, nq, keys, mass);
    }
    for (int64_t r = 0; r < pl->total; r++) /* the candidates, by score */
        if (pl->cached[r] == ROW_CAND)
            pl->sc[n_c++] = (scored){mass[r], (int32_t)r};
    qsort(pl->sc, (size_t)n_c, sizeof *pl->sc, by_score_desc);
    want = probe_budget(pl, n_c, want, stats);
    memset(pl->keep, 0, (size_t)pl->total);
    for (int64_t c = 0; c < want && c < n_c; c++)
        pl->keep[pl->sc[c].row] = 1;
    pl->n_rows = 0;
    for (int64_t r = 0; r < pl->total; r++)
        if (pl->keep[r] || !pl->cached[r])
            pl->rows[pl->n_rows++] = (int32_t)r;
    stats->n_selected[0] = stats->n_recomputed_tokens = (int32_t)(want < n_c ? want : n_c);
    if ((st = cb_fwd_embed(pl->f, pl->ids, pl->pos, (int32_t)pl->total)) != CB_OK) {
        *layer_err = 1;
        goto out;
    }
    st = run_layers(pl, 0, hp->n_layer, pl->rows, pl->n_rows, layer_err, err);
out:
    free(qrows);
    free(keys);
    free(mass);
    return st;
}

/* One check layer: narrow the candidates (cached rows still kept) to
 * ratio x the cached rows by the strategy, then compute the layer for the
 * fresh rows and the survivors. */
static cb_status check_layer(plan *pl, int32_t step, int *layer_err, cb_error *err,
                             cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    int32_t l = p->check_layer + step, n_c = 0;
    int32_t *cand = pl->rows; /* reuse: candidate cached rows, by position */
    int64_t want = (int64_t)ceilf(p->ratios[step] * (float)pl->n_cached), n_kept = 0;
    cb_status st;

    if ((st = loader_wait(&pl->ld, l, &pl->stall, err)) != CB_OK)
        return st;
    for (int64_t r = 0; r < pl->total; r++)
        if (pl->keep[r])
            cand[n_c++] = (int32_t)r;
    if (want > n_c)
        want = n_c;
    if (want < n_c && n_c > 0) {
        st = p->strategy == CB_STRATEGY_QUERY  ? select_query(pl, l, cand, n_c, want)
             : p->strategy == CB_STRATEGY_RUNS ? select_runs(pl, l, cand, n_c, want)
                                               : select_hkvd(pl, l, cand, n_c, want);
        if (st != CB_OK)
            return *layer_err = st != CB_ERR_NOMEM, st;
        if (p->strategy == CB_STRATEGY_SINK)
            add_sinks(pl);
    }
    pl->n_rows = 0;
    for (int64_t r = 0; r < pl->total; r++) {
        n_kept += pl->keep[r];
        if (pl->keep[r] || !pl->cached[r])
            pl->rows[pl->n_rows++] = (int32_t)r;
    }
    stats->n_selected[step] = (int32_t)n_kept;
    stats->n_recomputed_tokens = (int32_t)n_kept;
    if ((st = cb_fwd_layer(pl->f, pl->kv, l, pl->rows, pl->n_rows)) != CB_OK)
        *layer_err = 1;
    return st;
}

/* Blend: every row before the check layer, the check layers' selections,
 * then the last selection in the layers after. */
static cb_status fuse(plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    cb_status st;
    if (p->strategy == CB_STRATEGY_PROBE)
        return fuse_probe(pl, layer_err, err, stats);
    pl->n_rows = 0; /* before the check layer: every row but the exact ones */
    for (int64_t r = 0; r < pl->total && pl->n_exact > 0; r++)
        if (pl->cached[r] != ROW_EXACT)
            pl->rows[pl->n_rows++] = (int32_t)r;
    if ((st = run_layers(pl, 0, p->check_layer, pl->n_exact > 0 ? pl->rows : NULL, pl->n_rows,
                         layer_err, err)) != CB_OK)
        return st;
    for (int64_t r = 0; r < pl->total; r++) /* candidates: all cached rows that can deviate */
        pl->keep[r] = pl->cached[r] == ROW_CAND;
    if (p->strategy == CB_STRATEGY_QUERY &&
        !(pl->fresh = malloc(sizeof(float) * (size_t)(pl->total * pl->w))))
        return CB_ERR_NOMEM;
    if (!(pl->top = malloc(sizeof(int32_t) * (size_t)pl->total)))
        return CB_ERR_NOMEM;
    for (int32_t step = 0; step < p->n_ratios; step++)
        if ((st = check_layer(pl, step, layer_err, err, stats)) != CB_OK)
            return st;
    return run_layers(pl, p->check_layer + p->n_ratios, pl->hp->n_layer, pl->rows, pl->n_rows,
                      layer_err, err);
}

/* Everything but blend: every layer for the computed set (all rows when
 * nothing is cached). */
static cb_status prefill_plain(plan *pl, int *layer_err, cb_error *err)
{
    if (pl->n_cached == 0)
        return run_layers(pl, 0, pl->hp->n_layer, NULL, 0, layer_err, err);
    return run_layers(pl, 0, pl->hp->n_layer, pl->rows, pl->n_rows, layer_err, err);
}

cb_status cb_blend_prefill(cb_fwd *f, cb_kvcache *kv, const cb_segment *segs, int32_t n_segs,
                           const cb_blend_params *p, float *logits, cb_blend_stats *stats,
                           cb_error *err)
{
    plan pl = {.f = f,
               .kv = kv,
               .segs = segs,
               .n_segs = n_segs,
               .p = p,
               .hp = cb_model_hparams(cb_fwd_model(f))};
    double t_start = cb_now_ms();
    int layer_err = 0;
    cb_status st;

    memset(stats, 0, sizeof *stats);
    stats->failed_segment = -1;
    stats->ratio_bound = "given";
    stats->ratio = p->mode == CB_MODE_FULL    ? 1.0f
                   : p->mode == CB_MODE_BLEND ? p->ratios[p->n_ratios - 1]
                                              : 0.0f;
    if ((st = plan_check(&pl, err)) != CB_OK || (st = plan_rows(&pl, err)) != CB_OK)
        goto out;
    stats->n_prompt_tokens = (int32_t)pl.total;
    stats->n_cached_tokens = (int32_t)pl.n_cached;
    stats->n_exact_tokens = (int32_t)pl.n_exact;
    stats->key_temp = 1.0f;
    if (p->mode == CB_MODE_BLEND || p->mode == CB_MODE_REUSE)
        stats->key_temp = cb_blend_key_temp(cb_fwd_model(f), p);
    if ((st = cb_fwd_embed(f, pl.ids, pl.pos, (int32_t)pl.total)) != CB_OK) {
        cb_error_set(err, st, "blend: prompt does not fit the batch (%lld tokens)",
                     (long long)pl.total);
        goto out;
    }
    loader_start(&pl.ld, cb_fwd_model(f), segs, n_segs, pl.use, pl.start, pl.exact_seg, kv,
                 pl.max_seg, p);
    st = p->mode == CB_MODE_BLEND ? fuse(&pl, &layer_err, err, stats)
                                  : prefill_plain(&pl, &layer_err, err);
    if (st == CB_OK) {
        int32_t last = (int32_t)(pl.total - 1);
        if ((st = cb_fwd_logits(f, &last, 1, logits)) != CB_OK)
            layer_err = 1;
    }
    stats->prefill_ms = cb_now_ms() - t_start;
    loader_stop(&pl.ld);
    if (st != CB_OK && pl.ld.st != CB_OK && !layer_err)
        stats->failed_segment = pl.ld.failed_seg;
    if (st == CB_ERR_NOMEM && !layer_err)
        cb_error_set(err, st, "blend: out of memory");
    else if (st != CB_OK && layer_err)
        cb_error_set(err, st, "blend: layer computation failed: %s", cb_strerror(st));
    if (st != CB_OK)
        goto out;
    stats->load_ms = pl.ld.busy_ms;
    stats->load_bytes = pl.ld.bytes;
    stats->stall_ms = pl.stall;
    stats->recompute_ms = stats->prefill_ms - pl.stall - (p->sequential_load ? pl.ld.busy_ms : 0);
    stats->overlapped_ms = p->sequential_load             ? 0
                           : pl.ld.busy_ms - pl.stall > 0 ? pl.ld.busy_ms - pl.stall
                                                          : 0;
    if (p->mode == CB_MODE_FULL)
        stats->n_recomputed_tokens = 0;
out:
    plan_free(&pl);
    return st;
}
