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
    p.speedup = 4.0f;     /* the ratio by the rows' cost, 0.15 at least: blend_speedup */
    p.stale_scale = 0.0f; /* the model's: cb_blend_stale_scale */
    return p;
}

/* Key temperatures measured on MuSiQue (EVAL.md): gemma3 1.05 (Gemma-3-270M:
 * first-token KL lower on 45 of 50 questions, KL recovery 20% -> 50% on
 * questions 1-30, 33% -> 57% on 31-50); on the others nothing that held
 * out of sample (SmolLM2: 1.1 helped questions 1-30, not 31-80).
 * Also measured on Qwen2.5 (EVAL.md, make diag, 20 chunks; first-token KL,
 * paired), none helping probe, so none is here: a logit bias log 0.25 on
 * the stale cached rows (APE's scaling factor; helps reuse on the 0.5B);
 * chunks precomputed with the lead-in 1,000 positions away (helps reuse on
 * both); keys and values rescaled per layer to full prefill's norms (worse
 * for both). */
float cb_blend_key_temp(const cb_model *m, const cb_blend_params *p)
{
    if (p->key_temp > 0.0f)
        return p->key_temp;
    return strcmp(cb_model_hparams(m)->arch, "gemma3") == 0 ? 1.05f : 1.0f;
}

/* The stale scale: after a blend's selection, the rows it computes (the
 * recomputed ones, the question; the generated ones after it) give the
 * stale rows (cached, not recomputed) S times the attention they would: a
 * logit bias ln S (APE's scaling factor, where the blend computes).  The
 * stale rows were computed without the chunks before them, and the rows
 * that read them over-attend them: the question's attention share on the
 * other chunks' rows at Qwen2.5-Coder-0.5B's middle layer is 0.19 over a
 * blend's cache, 0.11 over full prefill's (MuSiQue, 20 chunks, 20
 * questions).  Measured on MuSiQue (EVAL.md), probe, first-token KL to
 * full prefill, paired, 20 questions each: 0.5B, 20 chunks, ratio 0.2,
 * 0.392 with none; 0.5: -0.073 +- 0.035, 0.35: -0.100 +- 0.050 (lower on
 * 17 of 20).  A trial that left the last layer's last row (and decode)
 * unscaled: 0.7 -0.045 +- 0.017, 1.4 +0.049 +- 0.011 (worse on 19); the
 * question's rows alone -0.011, the recomputed rows alone -0.027: both
 * together; in probe's first pass too (its scores moved) less; 6
 * passages, 0.7: -0.021 +- 0.009 (15 of 20); 1.5B, 20 chunks (1.106 with
 * none): 0.7 -0.035 +- 0.071, 0.5 -0.072 +- 0.134, 0.35 -0.076 +- 0.177
 * (lower on 10).  Answers (150 questions, 20 chunks, the terse system
 * message, --for-system): 0.5B, 0.35, F1 0.111 -> 0.134 (+0.022 +-
 * 0.012; 90% of full prefill's), KL 0.475 -> 0.373 (lower on 110),
 * identical answers 23% -> 30%.  The default model, 1.5B, 6 passages,
 * that message, the first 60 questions: KL 0.254 -> 0.175 (-0.080 +-
 * 0.026, lower on 45), identical 58% -> 65%, F1 -0.003 +- 0.021 (113% of
 * full prefill's); 20 chunks, the template's own system message, the
 * first 50: KL 0.860 -> 0.701 (-0.159 +- 0.088, lower on 31), identical
 * 22% -> 36%, F1 -0.003 +- 0.023 (108%).  0.5B, 20 chunks, the terse
 * message, the first 50: KL 0.391 at 0.35, 0.25 -0.003 +- 0.011, 0.5
 * +0.016 +- 0.011: flat around it.  Hence 0.35 on qwen2; the
 * others are unmeasured (1). */
float cb_blend_stale_scale(const cb_model *m, const cb_blend_params *p)
{
    if (p->stale_scale > 0.0f)
        return p->stale_scale;
    return strcmp(cb_model_hparams(m)->arch, "qwen2") == 0 ? 0.35f : 1.0f;
}

cb_status blend_stale_bias(blend_plan *pl)
{
    if (pl->stale_scale == 1.0f)
        return CB_OK;
    uint8_t *stale = malloc((size_t)pl->total);
    if (!stale)
        return CB_ERR_NOMEM;
    for (int64_t r = 0; r < pl->total; r++)
        stale[r] = pl->cached[r] == ROW_CAND && !pl->keep[r];
    cb_status st = cb_kvcache_set_stale(pl->kv, stale, (int32_t)pl->total, logf(pl->stale_scale));
    free(stale);
    if (st == CB_ERR_UNSUPPORTED)
        pl->stale_scale = 1.0f, st = CB_OK;
    return st;
}

/* Measured on MuSiQue (EVAL.md; first-token KL to full prefill, half the
 * layers minus all of them, paired, +- s.e.): short shape (6 passages of
 * ~50 tokens), where the first pass is ~40% of the rows computed: Qwen2.5
 * 1.5B -0.12 +- 0.27 (12 questions), 0.5B +0.00 +- 0.04 (16); many-chunk
 * shape (20 chunks, ~2,300 tokens), where it is ~15%: 1.5B +0.13 +- 0.11
 * (8), 0.5B +0.20 +- 0.12 (12).  Hence the rule in kv.h.  Fewer than half
 * on the short shape (1.5B, 16 questions, session 6): a quarter +0.19 +-
 * 0.16, a sixth +0.19 +- 0.17 over half, where hkvd is +0.17: the floor. */
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
    if (p->speedup > 0 && p->mode == CB_MODE_BLEND && p->adapt_mass == 0 && p->n_ratios != 1)
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: a speedup sets one ratio, not %d (give it as 0 for gradual "
                            "filtering)",
                            p->n_ratios);
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
 * prompts of short chunks: there probe's first pass (those rows through
 * half the layers at least) costs more than an eighth of the second, and
 * on MuSiQue's short shape (6 passages cut to ~50 tokens, 80 questions;
 * EVAL.md) hkvd answered as well in less time.  Qwen2.5-Coder-1.5B, F1
 * and TTFT against full prefill's: with the prompt's head computed, hkvd
 * 0.278 at 2.41x, probe 0.255 at 1.92x; with it cached (30 fewer uncached
 * rows, a budget 1.4 times them), hkvd 0.278 at 3.00x, probe 0.272 at
 * 2.49x.  On 0.5B, F1 hkvd minus probe +0.002 +- 0.012, KL -0.11 +- 0.04.
 * The many-chunk and paper shapes have budgets of 7 and 10 times the
 * uncached rows, where probe's first pass costs 4-6% and probe answered
 * better.  Probe stays with an adaptive ratio (it needs probe's scores), a
 * fixed probe depth, sliding windows, and nothing to recompute. */
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

/* What a speedup budgets (cb_blend_params.speedup): the rows a blend
 * computes, each at each layer its products with the layer's weights and
 * its attention over the keys it sees, in units of one row's products
 * through every layer.  A row at position p costs 1 + key_cost x the keys
 * it sees (p + 1; a sliding window's at most; the layers' mean), where
 * key_cost is a key's 2 n_head head_dim multiply-adds over a layer's
 * weights' (the MLP's three matrices, Q, K, V and O), times the attention's
 * cost per multiply-add against the products' (cb_model_attn_cost); full
 * prefill costs the sum over the prompt's rows.  Probe's scoring costs
 * the scoring rows' attention again, weighed by cb_model_score_cost.  The
 * logits and the elementwise operations are left out.
 * Until 2026-11-30 the rows alone were counted ("on the CPU the rows are the
 * time"): but a blend's rows sit late in the prompt (the question last;
 * probe's selection at 0.62 of it on average on MuSiQue's paper shape)
 * and each sees more keys than full prefill's mean row, so --speedup 4
 * measured 3.41x on Qwen2.5-Coder-1.5B (150 questions, AVX-512 VNNI) and
 * 3.09x on the 0.5B, where attention is a third of full prefill's time
 * (tests/bench/results/EVAL.md).
 * Later on 2026-11-30 it came to count what still left the 0.5B's blends at
 * 3.86-3.99x on an AVX2 Zen 3 (--speedup 4; 150 and 80 questions):
 *   - loading: each cached row's K and V bytes (every layer's, in the
 *     cache's type) x cb_model_load_cost, which is 0 where loading overlaps
 *     the compute (a device) and, on the CPU, whose loader takes the cores
 *     the layers need, 35-40 ms of a 2.1 s blend of 2,406 cached rows;
 *   - the keys the attention computes and masks: the backend takes
 *     cb_model_attn_rows query rows at a time, each against every key up
 *     to the last of them; n rows spread over s positions compute about
 *     (min(n, B) - 1) / 2 x s keys more than they see (pass_waste), whether
 *     they lie together (full prefill: B / 2 a row) or apart (a blend's:
 *     measured 42,035 a layer, 5% of its final pass's keys, where this
 *     gives 41,580); probe's first pass, whose uncached rows lie between
 *     the chunks and then together (the question), is counted block by
 *     block as its rows lie (24,000 a layer there, 21%);
 *   - probe's scoring at its own cost (above), which was taken as the
 *     attention's until then and measured 1.3-1.56 times it.
 * Measured after (150 and 80 questions): 4.05x on both (EVAL.md). */
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
    double key_cost = cb_model_attn_cost(m) * 2 * q / weights, L = hp->n_layer;
    double score_cost = cb_model_score_cost(m);
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
    pl->c_load = (double)pl->n_cached * row_bytes * cb_model_load_cost(m) / (weights * L);
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

/* The largest budget, at least lo, whose cost is at most full prefill's
 * / s (the cost grows with the budget: bisection). */
static int64_t afford(const blend_plan *pl, const cb_blend_params *p, int probe, int64_t lo,
                      double s)
{
    int64_t hi = pl->n_cached - pl->n_exact;
    double limit = pl->c_full / s;
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

/* A speedup: the budget it affords, at least the given ratio's, and under
 * auto the strategy too (auto's rule on probe's budget; hkvd then gets its
 * own, its first layer's rows counted).  eff is p with them: an explicit
 * strategy and one ratio.  The budget is predicted at the candidates' mean
 * cost; probe, which selects after its first pass, then selects by the
 * costs of the rows it scores highest (pl->budget: what the speedup leaves
 * after the first pass and the uncached rows).  Without a speedup (or with
 * an adaptive ratio, which sets its own) eff is p. */
static void blend_speedup(blend_plan *pl, cb_blend_params *eff, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    *eff = *p;
    if (p->speedup <= 0 || p->mode != CB_MODE_BLEND || p->adapt_mass > 0)
        return;
    int64_t lo = (int64_t)ceilf(p->ratios[0] * (float)pl->n_cached), w;
    const blend_strategy *sg = blend_strategy_of(p->strategy);
    int probe = p->strategy == CB_STRATEGY_PROBE || p->strategy == CB_STRATEGY_AUTO;
    w = afford(pl, p, probe, lo, p->speedup);
    eff->ratios[0] = blend_ratio_of(w, pl->n_cached);
    if (p->strategy == CB_STRATEGY_AUTO) {
        sg = blend_choose(pl, eff);
        if (sg->id != CB_STRATEGY_PROBE) {
            w = afford(pl, p, 0, lo, p->speedup);
            eff->ratios[0] = blend_ratio_of(w, pl->n_cached);
        }
        eff->strategy = sg->id;
    }
    probe = sg->id == CB_STRATEGY_PROBE;
    stats->ratio = eff->ratios[0];
    stats->ratio_bound = cost_of(pl, p, probe, w) <= pl->c_full / p->speedup ? "speedup" : "min";
    int32_t nl = probe ? blend_probe_pass(pl, w) : 0;
    if (nl > 0) { /* probe's selection by the costs of the rows it picks */
        pl->budget =
            pl->c_full / p->speedup - blend_cost(pl, p, 1, 0.0, 0, nl) + blend_sel_waste(pl, 0);
        pl->budget = pl->budget > 0 ? pl->budget : 0;
        pl->budget_min = lo;
    }
}

/* Blend: the strategy's own way, or every row before the check layer, the
 * check layers' selections, then the last selection in the layers after. */
static cb_status fuse(blend_plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    const blend_strategy *sg = blend_choose(pl, p);
    cb_status st;
    stats->strategy = sg->id;
    /* the model's stale scale is probe's (measured there); on hkvd's short
     * prompts it kept F1 but not full prefill's answers (0.5B, 150
     * questions: 66 -> 49 identical) */
    if (p->stale_scale <= 0.0f && sg->id != CB_STRATEGY_PROBE && sg->id != CB_STRATEGY_RANDOM)
        pl->stale_scale = 1.0f;
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
                     .hp = cb_model_hparams(cb_fwd_model(f)),
                     .budget = -1};
    cb_blend_params eff;
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
    if ((st = plan_check(&pl, err)) != CB_OK || (st = plan_rows(&pl, err)) != CB_OK)
        goto out;
    blend_speedup(&pl, &eff, stats);
    pl.p = p = &eff;
    stats->n_prompt_tokens = (int32_t)pl.total;
    stats->n_cached_tokens = (int32_t)pl.n_cached;
    stats->n_exact_tokens = (int32_t)pl.n_exact;
    stats->key_temp = 1.0f;
    if (p->mode == CB_MODE_BLEND || p->mode == CB_MODE_REUSE)
        stats->key_temp = cb_blend_key_temp(cb_fwd_model(f), p);
    pl.stale_scale = p->mode == CB_MODE_BLEND ? cb_blend_stale_scale(cb_fwd_model(f), p) : 1.0f;
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
    stats->stale_scale = pl.stale_scale;
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
