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
 * sees keys 0..p only.
 *
 * Loading is pipelined: a loader thread reads and places layer l+1 of every
 * cached segment while layer l is computed; computing a layer waits only
 * until that layer is in place (it must: the computation overwrites the
 * selected rows' K/V in it).  On a GPU "in place" is two steps: the host
 * waits until the loader has queued the layer's copies, the device until
 * they are done (an event per cache layer, see cb_kvcache_load). */
#include "cbcore.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

cb_blend_params cb_blend_defaults(void)
{
    cb_blend_params p;
    memset(&p, 0, sizeof p);
    p.mode = CB_MODE_BLEND;
    p.strategy = CB_STRATEGY_HKVD;
    p.check_layer = 1;
    p.n_ratios = 1;
    p.ratios[0] = 0.15f;
    p.deviation_v = 1;
    p.sink_tokens = 4;
    return p;
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
    int32_t ready;      /* layers 0..ready-1 are in place */
    cb_status st;
    cb_error err;
    double busy_ms, t_begin;
    uint64_t bytes;
} loader;

static void loader_run(loader *ld)
{
    float *k = malloc(sizeof(float) * (size_t)(ld->max_seg * ld->w));
    float *v = malloc(sizeof(float) * (size_t)(ld->max_seg * ld->w));
    cb_status st = k && v ? CB_OK : CB_ERR_NOMEM;
    cb_error err;

    if (st != CB_OK)
        cb_error_set(&err, st, "blend: out of memory");
    for (int32_t l = 0; l < ld->n_layer && st == CB_OK; l++) {
        double t0 = now_ms();
        for (int32_t s = 0; s < ld->n_segs && st == CB_OK; s++) {
            if (!ld->use[s])
                continue;
            cb_kvfile *kf = ld->segs[s].kv;
            if ((st = cb_kvfile_read_layer(kf, l, k, v, &err)) != CB_OK)
                break;
            st = cb_kvcache_load(ld->kv, l, ld->start[s], ld->segs[s].n, k, v, cb_kvfile_meta(kf)->pos0);
            if (st != CB_OK)
                cb_error_set(&err, st, "blend: cannot place segment %d", s);
            ld->bytes += cb_kvfile_size(kf) / (uint64_t)ld->n_layer;
        }
        if (ld->limit_mbs > 0) { /* an emulated slow tier: never faster than limit_mbs */
            double due = ld->t_begin + (double)ld->bytes / (ld->limit_mbs * 1e3), now = now_ms();
            if (due > now) {
                struct timespec ts = {(time_t)((due - now) / 1e3), (long)(fmod(due - now, 1e3) * 1e6)};
                nanosleep(&ts, NULL);
            }
        }
        pthread_mutex_lock(&ld->mu);
        ld->busy_ms += now_ms() - t0;
        if (st == CB_OK)
            ld->ready = l + 1;
        else
            ld->st = st, ld->err = err;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
    }
    { /* a device queues the copies: wait for them on every exit (after an
       * error too: the caller frees the cache once this thread is joined),
       * and count them as loading time */
        double t0 = now_ms();
        cb_model_sync(ld->m);
        pthread_mutex_lock(&ld->mu);
        ld->busy_ms += now_ms() - t0;
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

/* Wait until layer l is in place; adds the time waited to *stall. */
static cb_status loader_wait(loader *ld, int32_t l, double *stall, cb_error *err)
{
    cb_status st;
    double t0 = now_ms();
    pthread_mutex_lock(&ld->mu);
    while (ld->ready <= l && ld->st == CB_OK)
        pthread_cond_wait(&ld->cv, &ld->mu);
    st = ld->ready > l ? CB_OK : ld->st;
    if (st != CB_OK && err)
        *err = ld->err;
    pthread_mutex_unlock(&ld->mu);
    *stall += now_ms() - t0;
    return st;
}

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

cb_status cb_blend_prefill(cb_fwd *f, cb_kvcache *kv, const cb_segment *segs, int32_t n_segs,
                           const cb_blend_params *p, float *logits, cb_blend_stats *stats, cb_error *err)
{
    const cb_model *m = cb_fwd_model(f);
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t total = 0, max_seg = 0;
    cb_status st = CB_OK;
    double t_start = now_ms();
    int32_t *ids = NULL, *pos = NULL, *rows = NULL, *seg_of = NULL, *start = NULL;
    uint8_t *use = NULL, *cached = NULL, *keep = NULL;
    float *fresh = NULL, *qbuf = NULL;
    int32_t *top = NULL;
    scored *sc = NULL;
    loader ld;
    pthread_t ld_thread;
    int ld_started = 0;
    double stall = 0;

    memset(&ld, 0, sizeof ld);
    pthread_mutex_init(&ld.mu, NULL);
    pthread_cond_init(&ld.cv, NULL);
    memset(stats, 0, sizeof *stats);
    if (n_segs < 1 || p->n_ratios < 1 || p->n_ratios > CB_BLEND_MAX_STEPS || p->check_layer < 1 ||
        p->check_layer + p->n_ratios > hp->n_layer)
        return cb_error_set(err, CB_ERR_INVALID, "blend: check layer %d with %d ratios does not fit %d layers",
                            p->check_layer, p->n_ratios, hp->n_layer);
    for (int32_t s = 0; s < n_segs; s++) {
        total += segs[s].n;
        max_seg = segs[s].n > max_seg ? segs[s].n : max_seg;
        if (segs[s].kv) {
            if ((st = cb_kvfile_check_model(segs[s].kv, m, err)) != CB_OK)
                return st;
            if (cb_kvfile_meta(segs[s].kv)->n_tokens != segs[s].n)
                return cb_error_set(err, CB_ERR_INVALID, "blend: segment %d has %d tokens, its KV file %d", s,
                                    segs[s].n, cb_kvfile_meta(segs[s].kv)->n_tokens);
        }
    }
    if (total < 1 || total > cb_kvcache_n_ctx(kv))
        return cb_error_set(err, CB_ERR_RANGE, "blend: a prompt of %lld tokens does not fit the context of %d",
                            (long long)total, cb_kvcache_n_ctx(kv));
    ids = malloc(sizeof(int32_t) * (size_t)total);
    pos = malloc(sizeof(int32_t) * (size_t)total);
    rows = malloc(sizeof(int32_t) * (size_t)total);
    seg_of = malloc(sizeof(int32_t) * (size_t)total);
    start = malloc(sizeof(int32_t) * (size_t)n_segs);
    use = calloc((size_t)n_segs, 1);
    cached = calloc((size_t)total, 1);
    keep = calloc((size_t)total, 1);
    sc = malloc(sizeof(scored) * (size_t)total);
    if (!ids || !pos || !rows || !seg_of || !start || !use || !cached || !keep || !sc) {
        st = cb_error_set(err, CB_ERR_NOMEM, "blend: out of memory");
        goto out;
    }
    for (int32_t s = 0, at = 0; s < n_segs; s++) {
        start[s] = at;
        for (int32_t j = 0; j < segs[s].n; j++, at++) {
            ids[at] = segs[s].ids[j];
            pos[at] = at;
            seg_of[at] = s;
        }
    }
    /* Which caches are used. */
    if (p->mode == CB_MODE_PREFIX) {
        for (int32_t s = 0; s < n_segs; s++)
            if (segs[s].kv) {
                use[s] = is_true_prefix(segs, s, start[s]);
                break;
            }
    } else if (p->mode == CB_MODE_REUSE || p->mode == CB_MODE_BLEND) {
        for (int32_t s = 0; s < n_segs; s++)
            use[s] = segs[s].kv != NULL;
    }
    int64_t n_cached = 0;
    for (int64_t r = 0; r < total; r++)
        if (use[seg_of[r]] && r != total - 1) /* the last row is always computed: its logits are needed */
            cached[r] = 1, n_cached++;
    stats->n_prompt_tokens = (int32_t)total;
    stats->n_cached_tokens = (int32_t)n_cached;

    if ((st = cb_fwd_embed(f, ids, pos, (int32_t)total)) != CB_OK) {
        cb_error_set(err, st, "blend: prompt does not fit the batch (%lld tokens)", (long long)total);
        goto out;
    }
    /* Start loading every used cache, layer by layer, at its new position. */
    int any = 0;
    for (int32_t s = 0; s < n_segs; s++)
        any |= use[s];
    ld.m = m;
    ld.segs = segs;
    ld.n_segs = n_segs;
    ld.n_layer = hp->n_layer;
    ld.use = use;
    ld.start = start;
    ld.kv = kv;
    ld.max_seg = max_seg;
    ld.w = w;
    ld.limit_mbs = p->load_limit_mbs;
    ld.ready = any ? 0 : hp->n_layer;
    ld.t_begin = now_ms();
    if (any) {
        if (p->sequential_load || pthread_create(&ld_thread, NULL, loader_main, &ld) != 0)
            loader_run(&ld);
        else
            ld_started = 1;
    }

    /* rows = the computed set: fresh rows, plus the selected cached ones. */
    int32_t n_rows = 0;
    for (int64_t r = 0; r < total; r++)
        if (!cached[r])
            rows[n_rows++] = (int32_t)r;
    if (p->mode != CB_MODE_BLEND) {
        for (int32_t l = 0; l < hp->n_layer; l++)
            if ((st = loader_wait(&ld, l, &stall, err)) != CB_OK)
                goto out;
            else if (n_cached == 0 ? (st = cb_fwd_layer(f, kv, l, NULL, 0)) != CB_OK
                              : (st = cb_fwd_layer(f, kv, l, rows, n_rows)) != CB_OK)
                goto layer_fail;
    } else {
        /* layers before the check layer: every row */
        for (int32_t l = 0; l < p->check_layer; l++)
            if ((st = loader_wait(&ld, l, &stall, err)) != CB_OK)
                goto out;
            else if ((st = cb_fwd_layer(f, kv, l, NULL, 0)) != CB_OK)
                goto layer_fail;
        /* candidates: all cached rows */
        for (int64_t r = 0; r < total; r++)
            keep[r] = cached[r];
        int64_t n_cand = n_cached;
        if (p->strategy == CB_STRATEGY_QUERY) /* the candidates' fresh keys, on the host */
            fresh = malloc(sizeof(float) * (size_t)(total * w));
        top = malloc(sizeof(int32_t) * (size_t)total);
        if ((p->strategy == CB_STRATEGY_QUERY && !fresh) || !top) {
            st = cb_error_set(err, CB_ERR_NOMEM, "blend: out of memory");
            goto out;
        }
        for (int32_t step = 0; step < p->n_ratios; step++) {
            int32_t l = p->check_layer + step;
            if ((st = loader_wait(&ld, l, &stall, err)) != CB_OK)
                goto out;
            int64_t want = (int64_t)ceilf(p->ratios[step] * (float)n_cached);
            int32_t n_c = 0;
            int32_t *cand = rows; /* reuse: candidate cached rows, by position */
            for (int64_t r = 0; r < total; r++)
                if (keep[r])
                    cand[n_c++] = (int32_t)r;
            if (want > n_c)
                want = n_c;
            if (want < n_c && n_c > 0) {
                if (p->strategy == CB_STRATEGY_QUERY) {
                    /* attention of the last segment's rows (the question) over
                     * the candidates' fresh keys at this layer */
                    int32_t qs = start[n_segs - 1], nq = (int32_t)(total - qs);
                    int64_t dq = (int64_t)hp->n_head * hp->head_dim;
                    int32_t *qrows = malloc(sizeof(int32_t) * (size_t)nq);
                    qbuf = realloc(qbuf, sizeof(float) * (size_t)(nq * dq));
                    if (!qrows || !qbuf) {
                        free(qrows);
                        st = cb_error_set(err, CB_ERR_NOMEM, "blend: out of memory");
                        goto out;
                    }
                    for (int32_t i = 0; i < nq; i++)
                        qrows[i] = qs + i;
                    st = cb_fwd_layer_qkv(f, l, qrows, nq, qbuf, NULL, NULL);
                    if (st == CB_OK)
                        st = cb_fwd_layer_qkv(f, l, cand, n_c, NULL, fresh, NULL);
                    free(qrows);
                    if (st != CB_OK)
                        goto layer_fail;
                    int grp = hp->n_head / hp->n_head_kv;
                    float scale = 1.0f / sqrtf((float)hp->head_dim);
                    float *srow = malloc(sizeof(float) * (size_t)n_c);
                    if (!srow) {
                        st = cb_error_set(err, CB_ERR_NOMEM, "blend: out of memory");
                        goto out;
                    }
                    for (int32_t c = 0; c < n_c; c++)
                        sc[c] = (scored){0.0f, cand[c]};
                    for (int32_t i = 0; i < nq; i++)
                        for (int32_t h = 0; h < hp->n_head; h++) {
                            const float *qv = qbuf + i * dq + (int64_t)h * hp->head_dim;
                            int32_t kh = h / grp;
                            float mx = -INFINITY, sum = 0;
                            for (int32_t c = 0; c < n_c; c++) {
                                const float *kv_ = fresh + c * w + (int64_t)kh * hp->head_dim;
                                float dot = 0;
                                for (int32_t e = 0; e < hp->head_dim; e++)
                                    dot += qv[e] * kv_[e];
                                srow[c] = dot * scale;
                                mx = srow[c] > mx ? srow[c] : mx;
                            }
                            for (int32_t c = 0; c < n_c; c++)
                                sum += (srow[c] = expf(srow[c] - mx));
                            for (int32_t c = 0; c < n_c; c++)
                                sc[c].score += srow[c] / sum;
                        }
                    free(srow);
                    qsort(sc, (size_t)n_c, sizeof *sc, by_score_desc);
                    for (int32_t c = 0; c < n_c; c++)
                        keep[sc[c].row] = c < want;
                } else {
                    /* deviation of fresh K (or V) from the loaded cache,
                     * ranked on the backend: only the chosen rows come back */
                    if ((st = cb_fwd_deviation(f, kv, l, p->deviation_v, cand, n_c, (int32_t)want, top)) != CB_OK)
                        goto layer_fail;
                    for (int32_t c = 0; c < n_c; c++)
                        keep[cand[c]] = 0;
                    for (int64_t c = 0; c < want; c++)
                        keep[top[c]] = 1;
                }
                if (p->strategy == CB_STRATEGY_SINK)
                    for (int32_t s = 0; s < n_segs; s++)
                        if (use[s])
                            for (int32_t j = 0; j < p->sink_tokens && j < segs[s].n; j++)
                                if (cached[start[s] + j])
                                    keep[start[s] + j] = 1;
            }
            n_cand = 0;
            n_rows = 0;
            for (int64_t r = 0; r < total; r++) {
                if (keep[r])
                    n_cand++;
                if (keep[r] || !cached[r])
                    rows[n_rows++] = (int32_t)r;
            }
            stats->n_selected[step] = (int32_t)n_cand;
            if ((st = cb_fwd_layer(f, kv, l, rows, n_rows)) != CB_OK)
                goto layer_fail;
        }
        stats->n_recomputed_tokens = (int32_t)n_cand;
        for (int32_t l = p->check_layer + p->n_ratios; l < hp->n_layer; l++)
            if ((st = loader_wait(&ld, l, &stall, err)) != CB_OK)
                goto out;
            else if ((st = cb_fwd_layer(f, kv, l, rows, n_rows)) != CB_OK)
                goto layer_fail;
    }
    {
        int32_t last = (int32_t)(total - 1);
        if ((st = cb_fwd_logits(f, &last, 1, logits)) != CB_OK)
            goto layer_fail;
    }
    stats->prefill_ms = now_ms() - t_start;
    if (ld_started) {
        pthread_join(ld_thread, NULL);
        ld_started = 0;
    }
    stats->load_ms = ld.busy_ms;
    stats->load_bytes = ld.bytes;
    stats->stall_ms = stall;
    stats->recompute_ms = stats->prefill_ms - stall - (p->sequential_load ? ld.busy_ms : 0);
    stats->overlapped_ms = p->sequential_load ? 0 : ld.busy_ms - stall > 0 ? ld.busy_ms - stall : 0;
    if (p->mode == CB_MODE_FULL)
        stats->n_recomputed_tokens = 0;
    st = CB_OK;
    goto out;
layer_fail:
    cb_error_set(err, st, "blend: layer computation failed: %s", cb_strerror(st));
out:
    if (ld_started)
        pthread_join(ld_thread, NULL);
    pthread_mutex_destroy(&ld.mu);
    pthread_cond_destroy(&ld.cv);
    free(ids), free(pos), free(rows), free(seg_of), free(start), free(use), free(cached), free(keep);
    free(fresh), free(top), free(qbuf), free(sc);
    return st;
}
