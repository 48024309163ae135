/* blend.c - prefill a prompt from cached chunk KV: prefix caching, full KV
 * reuse, and CacheBlend's selective recompute.
 *
 * Blend, for the rows of a prompt (cached rows C, computed rows F = the
 * rest, always including the last row):
 *   load     every cached segment's K/V at every layer, K rotated from the
 *            positions it was computed at to its place in the prompt
 *   layers < check: every row (layer 0's hidden states feed the check)
 *   check l: the strategy keeps ratio x |C| of the candidate cached rows
 *            (hkvd: those whose fresh K (or V) is farthest, squared L2,
 *            from the loaded one), with F; the layer runs for those rows
 *            only, writing their K/V over the loaded ones.  With several
 *            ratios the next layers filter the survivors again (gradual
 *            filtering).
 *   later:   the last selection only.
 * A strategy may instead run the whole blend its own way (probe).  The
 * strategies are a table (strategy.h), each in a file of its own
 * (strategy_*.c); this file lays the rows out, loads and runs the layers.
 * Attention is the engine's exact causal mask: a selected row at position p
 * sees keys 0..p only.  The first cache, when everything before it is
 * exactly the lead-in it was computed after, at the same positions (a true
 * prefix, as prefix caching requires), holds what full prefill computes:
 * its rows are exact, never computed and never candidates: the ratios'
 * budgets (of all cached rows) go to the other cached rows.  So do the
 * caches after it while each is a true prefix too (a chunk's cache computed
 * after the chunk before it, cb-precompute --context).  The keys of
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
#include "blend_load.h"
#include "strategy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

cb_blend_params cb_blend_defaults(void)
{
    cb_blend_params p;
    memset(&p, 0, sizeof p);
    p.mode = CB_MODE_BLEND;
    p.strategy = CB_STRATEGY_AUTO; /* probe, measured best (EVAL.md), but hkvd on short
                                    * prompts (blend_choose) */
    p.check_layer = 1;
    p.n_ratios = 1;
    p.ratios[0] = 0.15f;
    p.deviation_v = 1;
    p.sink_tokens = 4;
    p.adapt_min = 0.05f;
    p.adapt_max = 0.5f;
    p.probe_rows = 0;     /* all the question's rows: measured better than its last 8 (EVAL.md) */
    p.probe_depth = 0.0f; /* by cost: cb_blend_probe_layers (EVAL.md) */
    p.probe_values = 1;   /* the mass times the value rows' norms: strategy_probe.c */
    p.key_temp = 0.0f;    /* the model's: cb_blend_key_temp */
    p.speedup = 4.0f;     /* the ratio by the rows' cost, 0.15 at least: plan_afford */
    p.stale_scale = 0.0f; /* the model's: cb_blend_stale_scale */
    return p;
}

/* The architecture's defaults (model.c's table) where p gives none: the
 * measurements behind them are in EVAL.md ("The stale scale" and the key
 * temperatures of the earlier rounds). */
float cb_blend_key_temp(const cb_model *m, const cb_blend_params *p)
{
    return p->key_temp > 0.0f ? p->key_temp : cb_model_key_temp(m);
}

float cb_blend_stale_scale(const cb_model *m, const cb_blend_params *p)
{
    return p->stale_scale > 0.0f ? p->stale_scale : cb_model_stale_scale(m);
}

cb_status blend_stale_bias(blend_plan *pl)
{
    float scale = pl->p->stale_scale;
    if (scale == 1.0f)
        return CB_OK;
    uint8_t *stale = malloc((size_t)pl->total);
    if (!stale)
        return CB_ERR_NOMEM;
    for (int64_t r = 0; r < pl->total; r++)
        stale[r] = pl->cached[r] == ROW_CAND && !pl->keep[r];
    cb_status st = cb_kvcache_set_stale(pl->kv, stale, (int32_t)pl->total, logf(scale));
    free(stale);
    if (st == CB_ERR_UNSUPPORTED) /* a backend without the bias: the blend runs as if 1 */
        pl->stale_unsupported = 1, st = CB_OK;
    return st;
}

/* The rule is kv.h's.  Why: half the layers select as well as all of them
 * where the first pass is a large share of the rows computed, and worse
 * where it is a small one; fewer than half did worse still (EVAL.md,
 * probe's depth on MuSiQue's short and many-chunk shapes). */
int32_t cb_blend_probe_layers(const cb_blend_params *p, int32_t n_layer, int64_t n_rows,
                              int64_t want, int windowed)
{
    float d = p->probe_depth;
    if (d <= 0.0f && windowed)
        d = 1.0f;
    if (d <= 0.0f) { /* by cost: the first pass at most a quarter of the second, half the layers
                      * at least */
        d = (float)(n_rows + want) / (4.0f * (float)(n_rows > 0 ? n_rows : 1));
        d = d < 0.5f ? 0.5f : d > 1.0f ? 1.0f : d;
    }
    int32_t n = (int32_t)ceilf(d * (float)n_layer - 1e-4f);
    return n < 1 ? 1 : n > n_layer ? n_layer : n;
}

/* ------------------------------------------------------------ the plan */

/* auto: probe's parameters (one ratio; an adaptive one makes it probe) */
static cb_status auto_check(const cb_blend_params *p, cb_error *err)
{
    return blend_probe.check(p, err);
}

static const blend_strategy blend_auto = {
    .id = CB_STRATEGY_AUTO,
    .name = "auto",
    .check = auto_check,
    .adaptive = 1,
};

/* The strategies, by cb_blend_strategy (strategy.h). */
static const blend_strategy *const strategies[] = {
    [CB_STRATEGY_HKVD] = &blend_hkvd,     [CB_STRATEGY_SINK] = &blend_sink,
    [CB_STRATEGY_QUERY] = &blend_query,   [CB_STRATEGY_PROBE] = &blend_probe,
    [CB_STRATEGY_RUNS] = &blend_runs,     [CB_STRATEGY_AUTO] = &blend_auto,
    [CB_STRATEGY_RANDOM] = &blend_random,
};

const blend_strategy *blend_strategy_of(cb_blend_strategy id)
{
    if ((unsigned)id >= sizeof strategies / sizeof strategies[0])
        return NULL;
    return strategies[id];
}

const char *cb_blend_strategy_name(cb_blend_strategy id)
{
    const blend_strategy *sg = blend_strategy_of(id);
    return sg ? sg->name : NULL;
}

int blend_by_score_desc(const void *a, const void *b)
{
    const blend_scored *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (x->row > y->row) - (x->row < y->row);
}

static void plan_free(blend_plan *pl)
{
    free(pl->ids), free(pl->pos), free(pl->seg_of), free(pl->start), free(pl->use);
    free(pl->cached), free(pl->keep), free(pl->rows), free(pl->cost);
    cb_spans_free(pl->waits);
}

/* Check the segments against the model and the cache; the prompt's size. */
static cb_status plan_check(blend_plan *pl, cb_error *err)
{
    const cb_model *m = cb_fwd_model(pl->f);
    const cb_blend_params *p = pl->p;
    const blend_strategy *sg = blend_strategy_of(p->strategy);
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
    if (!(p->stale_scale >= 0.0f && p->stale_scale < 1e30f))
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: the stale scale must be positive (or 0: the model's), not %g",
                            (double)p->stale_scale);
    if (!(p->speedup >= 0.0f && p->speedup < 1e30f))
        return cb_error_set(
            err, CB_ERR_INVALID,
            "blend: the speedup must be positive (or 0: the ratio as given), not %g",
            (double)p->speedup);
    if (!(p->costs.load >= 0.0f && p->costs.load < 1e30f && p->costs.attn >= 0.0f &&
          p->costs.attn < 1e30f && p->costs.score >= 0.0f && p->costs.score < 1e30f))
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: the cost figures must be positive (or 0: the built-in)");
    if (p->speedup > 0 && p->mode == CB_MODE_BLEND && p->adapt_mass == 0 && p->n_ratios != 1)
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: a speedup sets one ratio, not %d (give it as 0 for gradual "
                            "filtering)",
                            p->n_ratios);
    if (p->ratio_auto && (p->speedup > 0 || p->adapt_mass > 0 || p->n_ratios != 1))
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: the loading controller sets one ratio, with no speedup and no "
                            "adaptive ratio");
    if (!(p->probe_depth >= 0.0f && p->probe_depth <= 1.0f))
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: probe's depth is a share of the layers in (0, 1] (0: by "
                            "cost), not %g",
                            (double)p->probe_depth);
    if (!sg)
        return cb_error_set(err, CB_ERR_INVALID, "blend: no strategy %d", (int)p->strategy);
    if (sg->check && (st = sg->check(p, err)) != CB_OK)
        return st;
    if (p->adapt_mass < 0 || p->adapt_mass > 1 ||
        (p->adapt_mass > 0 &&
         (!sg->adaptive || p->adapt_min < 0 || p->adapt_min > p->adapt_max || p->adapt_max > 1)))
        return cb_error_set(
            err, CB_ERR_INVALID,
            "blend: an adaptive ratio needs the probe strategy, a mass in (0, 1] and 0 <= min <= "
            "max <= 1");
    for (int32_t s = 0; s < pl->n_segs; s++) {
        const cb_segment *g = &pl->segs[s];
        pl->total += g->n;
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
int cb_blend_true_prefix(const cb_segment *segs, int32_t s, int32_t start)
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

static void plan_costs(blend_plan *pl);

/* Lay the rows out, decide which caches the mode uses, and which rows are
 * cached; the computed set starts as every row that is not; their costs. */
static cb_status plan_rows(blend_plan *pl, cb_error *err)
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
    pl->cost = malloc(sizeof(double) * (size_t)total);
    if (!pl->ids || !pl->pos || !pl->rows || !pl->seg_of || !pl->start || !pl->use || !pl->cached ||
        !pl->keep || !pl->cost)
        return cb_error_set(err, CB_ERR_NOMEM, "blend: out of memory");
    for (int32_t s = 0, at = 0; s < n_segs; s++) {
        pl->start[s] = at;
        for (int32_t j = 0; j < pl->segs[s].n; j++, at++) {
            pl->ids[at] = pl->segs[s].ids[j];
            pl->pos[at] = at;
            pl->seg_of[at] = s;
        }
    }
    if (pl->p->mode == CB_MODE_PREFIX) { /* the leading caches that are true prefixes */
        for (int32_t s = 0; s < n_segs; s++)
            if (pl->segs[s].kv && !(pl->use[s] = cb_blend_true_prefix(pl->segs, s, pl->start[s])))
                break;
    } else if (pl->p->mode == CB_MODE_REUSE || pl->p->mode == CB_MODE_BLEND) {
        for (int32_t s = 0; s < n_segs; s++)
            pl->use[s] = pl->segs[s].kv != NULL;
    }
    for (int64_t r = 0; r < total; r++)
        if (pl->use[pl->seg_of[r]] &&
            r != total - 1) /* the last row is always computed: its logits are needed */
            pl->cached[r] = ROW_CAND, pl->n_cached++;
    pl->exact_end = 0;
    if (pl->p->mode == CB_MODE_BLEND || pl->p->mode == CB_MODE_REUSE)
        for (int32_t s = 0; s < n_segs; s++) {
            if (!pl->use[s])
                continue;
            /* the leading caches, while each is a true prefix (the first
             * chunk; the second too when its cache was computed after the
             * first, cb-precompute --context) */
            if (!cb_blend_true_prefix(pl->segs, s, pl->start[s]))
                break;
            for (int32_t j = 0; j < pl->segs[s].n; j++)
                if (pl->cached[pl->start[s] + j])
                    pl->cached[pl->start[s] + j] = ROW_EXACT, pl->n_exact++;
            pl->exact_end = s + 1;
        }
    pl->n_rows = 0;
    for (int64_t r = 0; r < total; r++)
        if (!pl->cached[r])
            pl->rows[pl->n_rows++] = (int32_t)r;
    plan_costs(pl);
    return CB_OK;
}

/* ------------------------------------------------------------- fusion */

cb_status blend_wait(blend_plan *pl, int32_t l, cb_error *err)
{
    cb_spans_begin(pl->waits);
    cb_status st = blend_loader_wait(pl->ld, l, &pl->stall, err);
    if (st == CB_OK) /* (the layer's operations wait on it again: for nothing) */
        cb_kvcache_after_loads(pl->kv, l);
    cb_spans_end(pl->waits);
    return st;
}

cb_status blend_run_layers(blend_plan *pl, int32_t lo, int32_t hi, const int32_t *rows,
                           int32_t n_rows, int *layer_err, cb_error *err)
{
    cb_status st;
    for (int32_t l = lo; l < hi; l++) {
        if ((st = blend_wait(pl, l, err)) != CB_OK)
            return st;
        st = l == pl->hp->n_layer - 1
                 ? cb_fwd_last_layer(pl->f, pl->kv, rows, n_rows, (int32_t)pl->total - 1)
                 : cb_fwd_layer(pl->f, pl->kv, l, rows, n_rows);
        if (st != CB_OK)
            return *layer_err = 1, st;
    }
    return CB_OK;
}

int64_t blend_rows_from_keep(blend_plan *pl)
{
    int64_t n_kept = 0;
    pl->n_rows = 0;
    for (int64_t r = 0; r < pl->total; r++) {
        n_kept += pl->keep[r];
        if (pl->keep[r] || !pl->cached[r])
            pl->rows[pl->n_rows++] = (int32_t)r;
    }
    return n_kept;
}

/* One check layer: narrow the candidates (cached rows still kept) to
 * ratio x the cached rows by the strategy, then compute the layer for the
 * fresh rows and the survivors. */
static cb_status check_layer(blend_plan *pl, const blend_strategy *sg, int32_t step, int *layer_err,
                             cb_error *err, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    int32_t l = p->check_layer + step, n_c = 0;
    int32_t *cand = pl->rows; /* reuse: candidate cached rows, by position */
    int64_t want = (int64_t)ceilf(p->ratios[step] * (float)pl->n_cached), n_kept;
    cb_status st;

    if ((st = blend_wait(pl, l, err)) != CB_OK)
        return st;
    for (int64_t r = 0; r < pl->total; r++)
        if (pl->keep[r])
            cand[n_c++] = (int32_t)r;
    if (want > n_c)
        want = n_c;
    if (want < n_c && n_c > 0 && (st = sg->select(pl, l, cand, n_c, want)) != CB_OK)
        return *layer_err = st != CB_ERR_NOMEM, st;
    n_kept = blend_rows_from_keep(pl);
    stats->n_selected[step] = (int32_t)n_kept;
    stats->n_recomputed_tokens = (int32_t)n_kept;
    if ((st = blend_stale_bias(pl)) != CB_OK)
        return st;
    if ((st = cb_fwd_layer(pl->f, pl->kv, l, pl->rows, pl->n_rows)) != CB_OK)
        *layer_err = 1;
    return st;
}

/* The strategy a blend runs: the one asked for, or auto's choice.  Auto is
 * probe, but hkvd where the recompute budget is under three times the
 * uncached rows (the question, the template, the separators), as on
 * prompts of short chunks: there probe's first pass costs more than an
 * eighth of the second, and hkvd answered as well in less time (EVAL.md,
 * MuSiQue's short shape); on longer shapes probe answered better.  Probe
 * stays with an adaptive ratio (it needs probe's scores), a fixed probe
 * depth, sliding windows, and nothing to recompute. */
static const blend_strategy *blend_choose(const blend_plan *pl, const cb_blend_params *p)
{
    if (p->strategy != CB_STRATEGY_AUTO)
        return blend_strategy_of(p->strategy);
    int64_t want = (int64_t)ceilf(p->ratios[p->n_ratios - 1] * (float)pl->n_cached);
    if (p->adapt_mass > 0 || p->probe_depth > 0 || pl->hp->n_swa_layers > 0 || want == 0 ||
        want >= 3 * (int64_t)pl->n_rows) /* (at 0, probe is reuse: no first pass) */
        return &blend_probe;
    return &blend_hkvd;
}

/* The cost model: the one model behind the policies that choose a ratio,
 * --speedup (cb_blend_params.speedup) and the loading controller
 * (--ratio auto, cb_blend_params.ratio_auto: plan_auto).
 * It prices the rows a blend computes, each at each layer its products
 * with the layer's weights and its attention over the keys it sees, in
 * units of one row's products through every layer.  A row at position p
 * costs 1 + key_cost x the keys it sees (p + 1; a sliding window's at
 * most; the layers' mean), where key_cost is a key's 2 n_head head_dim
 * multiply-adds over a layer's weights' (the MLP's three matrices, Q, K,
 * V and O) times the figure costs.attn; full prefill costs the sum over
 * the prompt's rows.  Besides the rows:
 *   - loading: each cached row's K and V bytes (every layer's, in the
 *     cache's type) x costs.load, the loader's time a byte (c_read); it
 *     adds to the cost on the CPU, where the loader takes the cores the
 *     layers need, and not where it overlaps the compute, as a device's
 *     copies do (c_load);
 *   - the keys the attention computes and masks: the backend takes
 *     cb_model_attn_rows query rows at a time, each against every key up
 *     to the last of them, so n rows spread over s positions compute about
 *     (min(n, B) - 1) / 2 x s keys more than they see (pass_waste); probe's
 *     first pass, whose uncached rows lie between the chunks and then
 *     together, is counted block by block as its rows lie;
 *   - probe's scoring: the scoring rows' attention again x costs.score.
 * The logits and the elementwise operations are left out.  The figures
 * are the caller's (a store's profile, cb-profile(1)) where given, else
 * the model's built-in ones (cb_model_load_cost, _attn_cost,
 * _score_cost).  Each term is there because the predicted speedup missed
 * the measured one without it (EVAL.md, "--speedup prices loading, masked
 * keys and scoring"). */
static double pass_waste(const blend_plan *pl, int64_t n, int64_t span)
{
    int64_t B = pl->attn_rows;
    if (B <= 1 || n <= 1)
        return 0;
    return pl->key_cost * (double)((n < B ? n : B) - 1) / 2.0 * (double)span;
}

double blend_sel_waste(const blend_plan *pl, int64_t n_sel)
{
    return pass_waste(pl, pl->total - pl->n_cached + n_sel, pl->span);
}

static void plan_costs(blend_plan *pl)
{
    const cb_hparams *hp = pl->hp;
    const cb_model *m = cb_fwd_model(pl->f);
    double q = (double)hp->n_head * hp->head_dim, kv = (double)hp->n_head_kv * hp->head_dim;
    double weights = (double)hp->n_embd * (2 * q + 2 * kv) + 3.0 * hp->n_embd * hp->n_ff;
    double key_cost = pl->plan.costs.attn * 2 * q / weights, L = hp->n_layer;
    double score_cost = pl->plan.costs.score;
    int32_t nq = blend_probe_nq(pl), seen = 0;
    pl->c_full = pl->c_unc = pl->c_cand = pl->c_score = 0;
    for (int64_t r = pl->total - 1; r >= 0; r--) {
        double keys = 0;
        for (int32_t l = 0; l < hp->n_layer; l++) {
            int32_t w = cb_model_layer_window(m, l);
            keys += w > 0 && r + 1 > w ? (double)w : (double)(r + 1);
        }
        pl->cost[r] = 1 + key_cost * keys / L;
        pl->c_full += pl->cost[r];
        if (pl->cached[r] == ROW_CAND)
            pl->c_cand += pl->cost[r];
        if (pl->cached[r])
            continue;
        pl->c_unc += pl->cost[r];
        if (seen++ < nq) /* scoring: the attention again x score_cost, no products */
            pl->c_score += (pl->cost[r] - 1) * score_cost;
    }
    pl->key_cost = key_cost;
    pl->attn_rows = cb_model_attn_rows(m);
    pl->span = pl->total;
    for (int64_t r = 0; r < pl->total && pl->cached[r] == ROW_EXACT; r++)
        pl->span--; /* a blend computes none of the exact prefix */
    pl->c_full += pass_waste(pl, pl->total, pl->total);
    double extra = 0; /* the first pass's blocks of uncached rows, as they lie */
    for (int64_t i = 0, B = pl->attn_rows; B > 1 && i < pl->n_rows; i += B) {
        int64_t e = i + B < pl->n_rows ? i + B : pl->n_rows;
        for (int64_t k = i; k < e; k++)
            extra += pl->rows[e - 1] - pl->rows[k];
    }
    pl->c_first_waste = key_cost * extra;
    double row_bytes = 2.0 * L * (double)cb_type_row_bytes(cb_kvcache_type(pl->kv), pl->w);
    pl->c_read = (double)pl->n_cached * row_bytes * pl->plan.costs.load / (weights * L);
    pl->c_load = strcmp(cb_model_backend(m), "cpu") == 0 ? pl->c_read : 0;
}

/* The cost of a blend whose selection costs sel (n_sel rows), nl layers of
 * probe's first pass: probe runs the uncached rows through them, scoring
 * with the question's, then those and the selection through every layer;
 * a check-layer strategy computes every row but the exact ones in the
 * layers before the check layer, then the uncached rows and the
 * selection in the rest.  Each with the loading and its passes' masked
 * keys (plan_costs). */
static double blend_cost(const blend_plan *pl, const cb_blend_params *p, int probe, double sel,
                         int64_t n_sel, int32_t nl)
{
    double L = pl->hp->n_layer, u = pl->c_unc;
    double last = u + sel + blend_sel_waste(pl, n_sel);
    if (probe)
        return (u + pl->c_score + pl->c_first_waste) * nl / L + last + pl->c_load;
    double cl = p->check_layer;
    double all = u + pl->c_cand + pass_waste(pl, pl->total - pl->n_exact, pl->span);
    return all * cl / L + last * (L - cl) / L + pl->c_load;
}

/* The predicted cost of a budget of w (before any selection: the
 * candidates' mean cost a row), probe's first pass as that budget would
 * run it */
static double cost_of(const blend_plan *pl, const cb_blend_params *p, int probe, int64_t w)
{
    int64_t n_cand = pl->n_cached - pl->n_exact;
    double sel = n_cand > 0 ? pl->c_cand * (double)w / (double)n_cand : 0;
    return blend_cost(pl, p, probe, sel, w, probe ? blend_probe_pass(pl, w) : 0);
}

/* The largest budget, at least lo, whose cost is at most limit (the cost
 * grows with the budget: bisection). */
static int64_t afford(const blend_plan *pl, const cb_blend_params *p, int probe, int64_t lo,
                      double limit)
{
    int64_t hi = pl->n_cached - pl->n_exact;
    if (lo >= hi)
        return lo;
    if (cost_of(pl, p, probe, hi) <= limit)
        return hi;
    while (hi - lo > 1) { /* cost(lo) within the limit or lo the floor; cost(hi) over it */
        int64_t mid = lo + (hi - lo) / 2;
        if (cost_of(pl, p, probe, mid) <= limit)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

float blend_ratio_of(int64_t w, int64_t n)
{
    if (w <= 0 || n <= 0)
        return 0.0f;
    float r = (float)w / (float)n;
    while (r > 0.0f && (int64_t)ceilf(r * (float)n) > w)
        r = nextafterf(r, 0.0f);
    while ((int64_t)ceilf(r * (float)n) < w)
        r = nextafterf(r, 2.0f);
    return r;
}

/* A policy's budget: the most rows, at least the given ratio's, whose cost
 * is at most limit, into q's one ratio, and under auto the strategy too
 * (auto's rule on probe's budget; hkvd then gets its own, its first
 * layer's rows counted); the bound is `bound`, or "min" where the given
 * ratio already costs more.  The budget is predicted at the candidates'
 * mean cost; under a speedup probe, which selects after its first pass,
 * then selects by the costs of the rows it scores highest (pl->budget:
 * what the limit leaves after the first pass and the uncached rows; the
 * fewest rows pl->budget_min).  The budget's cost is returned. */
static double plan_afford(blend_plan *pl, cb_blend_params *q, cb_blend_stats *stats, double limit,
                          const char *bound)
{
    const cb_blend_params *p = pl->p;
    int64_t lo = (int64_t)ceilf(p->ratios[0] * (float)pl->n_cached), w;
    const blend_strategy *sg = blend_strategy_of(p->strategy);
    int probe = p->strategy == CB_STRATEGY_PROBE || p->strategy == CB_STRATEGY_AUTO;
    w = afford(pl, p, probe, lo, limit);
    q->ratios[0] = blend_ratio_of(w, pl->n_cached);
    if (p->strategy == CB_STRATEGY_AUTO) {
        sg = blend_choose(pl, q);
        if (sg->id != CB_STRATEGY_PROBE) {
            w = afford(pl, p, 0, lo, limit);
            q->ratios[0] = blend_ratio_of(w, pl->n_cached);
        }
        q->strategy = sg->id;
    }
    probe = sg->id == CB_STRATEGY_PROBE;
    double cost = cost_of(pl, p, probe, w);
    stats->ratio_bound = cost <= limit ? bound : "min";
    int32_t nl = probe && p->speedup > 0 ? blend_probe_pass(pl, w) : 0;
    if (nl > 0) { /* probe's selection by the costs of the rows it picks */
        pl->budget = limit - blend_cost(pl, p, 1, 0.0, 0, nl) + blend_sel_waste(pl, 0);
        pl->budget = pl->budget > 0 ? pl->budget : 0;
        pl->budget_min = lo;
    }
    return cost;
}

/* The loading controller (--ratio auto): the most rows whose computing,
 * the blend's cost less what loading adds to it, is at most the loading's
 * own time, so that the recompute of layer l hides under the loading of
 * layer l + 1 (summed over the layers: the loader runs one layer ahead);
 * at least the given ratio (the floor, --min-ratio), at most every
 * candidate.  The predictions go to stats as shares of full prefill. */
static void plan_auto(blend_plan *pl, cb_blend_params *q, cb_blend_stats *stats)
{
    double cost = plan_afford(pl, q, stats, pl->c_read + pl->c_load, "load");
    stats->pred_load = (float)(pl->c_read / pl->c_full);
    stats->pred_recompute = (float)((cost - pl->c_load) / pl->c_full);
}

/* The cost model's figures into the plan: the caller's where given (> 0),
 * else the model's built-in ones; stats says which. */
static void plan_figures(blend_plan *pl, cb_blend_stats *stats)
{
    const cb_blend_costs *g = &pl->p->costs;
    const cb_model *m = cb_fwd_model(pl->f);
    cb_blend_costs *c = &pl->plan.costs;
    c->load = g->load > 0 ? g->load : cb_model_load_cost(m);
    c->attn = g->attn > 0 ? g->attn : cb_model_attn_cost(m);
    c->score = g->score > 0 ? g->score : cb_model_score_cost(m);
    stats->costs = *c;
    stats->costs_given = (g->load > 0) | (g->attn > 0) << 1 | (g->score > 0) << 2;
}

/* The policy, resolved once before any layer runs into pl->plan, the
 * parameters every later step reads (pl->p points there afterwards; the
 * strategies never write it): the ratio (the given one, a speedup's or
 * the loading controller's), the strategy (auto's choice), the key
 * temperature and the stale scale (the caller's, else the
 * architecture's), with the cost figures
 * (plan_figures).  The model's stale scale was measured on probe's blends
 * (and random's, which compute as probe's); on hkvd's short prompts it
 * kept F1 but not full prefill's answers (EVAL.md, "The stale scale"), so
 * the other strategies run without one unless it is given. */
static void plan_policy(blend_plan *pl, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    const cb_model *m = cb_fwd_model(pl->f);
    cb_blend_params *q = &pl->plan;
    if (p->mode == CB_MODE_BLEND && p->ratio_auto)
        plan_auto(pl, q, stats);
    else if (p->mode == CB_MODE_BLEND && p->speedup > 0 && p->adapt_mass <= 0)
        plan_afford(pl, q, stats, pl->c_full / p->speedup, "speedup");
    if (p->mode == CB_MODE_BLEND) {
        q->strategy = blend_choose(pl, q)->id;
        stats->strategy = q->strategy;
        stats->ratio = q->ratios[q->n_ratios - 1];
    }
    q->key_temp =
        p->mode == CB_MODE_BLEND || p->mode == CB_MODE_REUSE ? cb_blend_key_temp(m, p) : 1.0f;
    q->stale_scale = 1.0f;
    if (p->mode == CB_MODE_BLEND && (p->stale_scale > 0.0f || q->strategy == CB_STRATEGY_PROBE ||
                                     q->strategy == CB_STRATEGY_RANDOM))
        q->stale_scale = cb_blend_stale_scale(m, p);
    stats->key_temp = q->key_temp;
    stats->plan_ratio = stats->ratio;
    stats->plan_bound = stats->ratio_bound;
}

/* Blend: the strategy's own way, or every row before the check layer, the
 * check layers' selections, then the last selection in the layers after. */
static cb_status fuse(blend_plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    const blend_strategy *sg = blend_strategy_of(p->strategy);
    cb_status st;
    if (sg->fuse)
        return sg->fuse(pl, layer_err, err, stats);
    pl->n_rows = 0; /* before the check layer: every row but the exact ones */
    for (int64_t r = 0; r < pl->total && pl->n_exact > 0; r++)
        if (pl->cached[r] != ROW_EXACT)
            pl->rows[pl->n_rows++] = (int32_t)r;
    if ((st = blend_run_layers(pl, 0, p->check_layer, pl->n_exact > 0 ? pl->rows : NULL, pl->n_rows,
                               layer_err, err)) != CB_OK)
        return st;
    for (int64_t r = 0; r < pl->total; r++) /* candidates: all cached rows that can deviate */
        pl->keep[r] = pl->cached[r] == ROW_CAND;
    for (int32_t step = 0; step < p->n_ratios; step++)
        if ((st = check_layer(pl, sg, step, layer_err, err, stats)) != CB_OK)
            return st;
    return blend_run_layers(pl, p->check_layer + p->n_ratios, pl->hp->n_layer, pl->rows, pl->n_rows,
                            layer_err, err);
}

/* Everything but blend: every layer for the computed set (all rows when
 * nothing is cached). */
static cb_status prefill_plain(blend_plan *pl, int *layer_err, cb_error *err)
{
    if (pl->n_cached == 0)
        return blend_run_layers(pl, 0, pl->hp->n_layer, NULL, 0, layer_err, err);
    return blend_run_layers(pl, 0, pl->hp->n_layer, pl->rows, pl->n_rows, layer_err, err);
}

cb_status cb_blend_prefill(cb_fwd *f, cb_kvcache *kv, const cb_segment *segs, int32_t n_segs,
                           const cb_blend_params *p, float *logits, cb_blend_stats *stats,
                           cb_error *err)
{
    blend_plan pl = {.f = f,
                     .kv = kv,
                     .segs = segs,
                     .n_segs = n_segs,
                     .p = p,
                     .plan = *p,
                     .hp = cb_model_hparams(cb_fwd_model(f)),
                     .budget = -1};
    loader ld;
    double t_start = cb_now_ms();
    int layer_err = 0;
    cb_status st;

    memset(stats, 0, sizeof *stats);
    stats->stall_clock = "host";
    stats->failed_segment = -1;
    cb_kvcache_set_stale(kv, NULL, 0, 0.0f); /* a cache used before: a new prompt */
    stats->ratio_bound = "given";
    stats->ratio = p->mode == CB_MODE_FULL    ? 1.0f
                   : p->mode == CB_MODE_BLEND ? p->ratios[p->n_ratios - 1]
                                              : 0.0f;
    if ((st = plan_check(&pl, err)) != CB_OK)
        goto out;
    plan_figures(&pl, stats);
    if ((st = plan_rows(&pl, err)) != CB_OK)
        goto out;
    plan_policy(&pl, stats);
    pl.p = p = &pl.plan; /* from here on the plan alone */
    stats->n_prompt_tokens = (int32_t)pl.total;
    stats->n_cached_tokens = (int32_t)pl.n_cached;
    stats->n_exact_tokens = (int32_t)pl.n_exact;
    if ((st = cb_fwd_embed(f, pl.ids, pl.pos, (int32_t)pl.total)) != CB_OK) {
        if (st == CB_ERR_INVALID)
            cb_error_set(err, st, "blend: prompt does not fit the batch (%lld tokens)",
                         (long long)pl.total);
        else
            cb_error_set(err, st, "blend: embedding the prompt: %s",
                         cb_model_strerror(cb_fwd_model(f), st));
        goto out;
    }
    pl.ld = &ld;
    pl.waits = cb_spans_new(cb_fwd_model(f)); /* (NULL: the host's clock alone) */
    blend_loader_start(&ld, cb_fwd_model(f), segs, n_segs, pl.use, pl.start, pl.exact_end, kv, p);
    st = p->mode == CB_MODE_BLEND ? fuse(&pl, &layer_err, err, stats)
                                  : prefill_plain(&pl, &layer_err, err);
    if (st == CB_OK) {
        int32_t last = (int32_t)(pl.total - 1);
        if ((st = cb_fwd_logits(f, &last, 1, logits)) != CB_OK)
            layer_err = 1;
    }
    stats->prefill_ms = cb_now_ms() - t_start;
    blend_loader_stop(&ld);
    stats->stale_scale = pl.stale_unsupported ? 1.0f : p->stale_scale;
    if (st != CB_OK && ld.st != CB_OK && !layer_err)
        stats->failed_segment = ld.failed_seg;
    if (st == CB_ERR_NOMEM && !layer_err)
        cb_error_set(err, st, "blend: out of memory");
    else if (st != CB_OK && layer_err)
        cb_error_set(err, st, "blend: layer computation failed: %s",
                     cb_model_strerror(cb_fwd_model(f), st));
    if (st != CB_OK)
        goto out;
    stats->load_ms = ld.busy_ms;
    stats->load_threads = ld.threads;
    stats->load_bytes = ld.bytes;
    { /* the waits as the computing thread's work saw them: on a device,
       * by its events (the host's clock sees only when the loader queued a
       * layer, not when its copies were done) */
        double w = cb_spans_ms(pl.waits);
        stats->stall_ms = w >= 0 ? w : pl.stall;
        if (w >= 0 && cb_model_marks_on_device(cb_fwd_model(f)))
            stats->stall_clock = "device";
    }
    stats->recompute_ms =
        stats->prefill_ms - stats->stall_ms - (p->sequential_load ? ld.busy_ms : 0);
    stats->overlapped_ms = p->sequential_load                 ? 0
                           : ld.busy_ms - stats->stall_ms > 0 ? ld.busy_ms - stats->stall_ms
                                                              : 0;
    if (p->mode == CB_MODE_FULL)
        stats->n_recomputed_tokens = 0;
    if (p->mode == CB_MODE_BLEND && p->n_ratios == 1) { /* the rows it selected, as computed */
        int probe = stats->strategy == CB_STRATEGY_PROBE || stats->strategy == CB_STRATEGY_RANDOM;
        double sel = 0;
        int64_t n_sel = 0;
        for (int64_t r = 0; r < pl.total; r++)
            if (pl.keep[r])
                sel += pl.cost[r], n_sel++;
        stats->pred_speedup = (float)(pl.c_full / blend_cost(&pl, p, probe, sel, n_sel,
                                                             probe ? stats->probe_layers : 0));
    }
out:
    plan_free(&pl);
    return st;
}
