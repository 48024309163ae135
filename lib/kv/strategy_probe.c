/* strategy_probe.c - probe (after ProphetKV): the uncached rows run
 * through every layer against the loaded cache, each layer's attention
 * from the question scoring the cached rows (the backend's attention
 * mass, cb_fwd_mass_add); then the top ratio x the cached rows, with the
 * uncached ones, from the embeddings through every layer.
 *
 * With probe_values (the default) each head's attention to a token counts
 * times the norm of the token's value row in that head: a token adds
 * p x v to the head's output, so what a stale v can change scales with
 * |v| as well as with p.  Tokens the question attends to with little
 * value (the sinks that gather attention, punctuation) then stop crowding
 * out those it reads from.  Measured on MuSiQue's paper shape (EVAL.md,
 * the default speedup, first-token KL to full prefill, paired):
 * Qwen2.5-Coder-0.5B, 40 questions, 0.097 -> 0.076 (lower on 32 of 40;
 * reuse 0.492: 80% -> 85% of its loss recovered), answers identical to
 * full prefill's 28% -> 35%; sqrt(|v|) recovered less (0.089).
 * Qwen2.5-Coder-1.5B, questions 81-120: 0.217 -> 0.181 (lower on 24 of
 * 40; 73% -> 77% recovered), F1 +0.023 +- 0.014; questions 49-150,
 * answers identical to full prefill's 51% -> 56%; |v|^2 did worse.
 *
 * Options: probe_rows (the question's last rows that score, 0: all), probe_depth
 * (the first pass runs and scores that share of the layers, the first
 * ones), adapt_mass, adapt_min and adapt_max (an adaptive ratio),
 * probe_passages (whole passages first: by_passage); one ratio only. */
#include "strategy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static cb_status probe_check(const cb_blend_params *p, cb_error *err)
{
    if (p->n_ratios != 1)
        return cb_error_set(err, CB_ERR_INVALID,
                            "blend: probe selects once: give one ratio, not %d", p->n_ratios);
    return CB_OK;
}

/* probe's budget: the given one, or with adapt_mass the fewest top rows
 * (scores sorted in sc[0..n_c)) holding that share of the mass, clamped
 * to [adapt_min, adapt_max] x the cached rows (and to the n_c
 * candidates), or with a speedup (pl->budget) the most top rows whose
 * costs (their positions known now) fit it, pl->budget_min at least; the
 * stats say which and why. */
static int64_t probe_budget(const blend_plan *pl, const blend_scored *sc, int64_t n_c, int64_t want,
                            cb_blend_stats *stats)
{
    const cb_blend_params *p = pl->p;
    double total = 0, acc = 0;
    int64_t k = 0;
    for (int64_t c = 0; c < n_c; c++)
        total += sc[c].score;
    if (p->adapt_mass > 0 && n_c > 0) {
        int64_t lo = (int64_t)ceilf(p->adapt_min * (float)pl->n_cached);
        int64_t hi = (int64_t)ceilf(p->adapt_max * (float)pl->n_cached);
        lo = lo < n_c ? lo : n_c, hi = hi < n_c ? hi : n_c;
        while (k < n_c && acc < p->adapt_mass * total)
            acc += sc[k++].score;
        stats->ratio_bound = k < lo ? "min" : k > hi ? "max" : "mass";
        want = k < lo ? lo : k > hi ? hi : k;
        stats->ratio = (float)want / (float)pl->n_cached;
    } else if (pl->budget >= 0 && n_c > 0) { /* a speedup: the top rows its budget affords */
        int64_t lo = pl->budget_min < n_c ? pl->budget_min : n_c;
        while (k < n_c && acc + pl->cost[sc[k].row] + blend_sel_waste(pl, k + 1) <= pl->budget)
            acc += pl->cost[sc[k++].row];
        stats->ratio_bound = k < lo ? "min" : "speedup";
        want = k < lo ? lo : k;
        stats->ratio = blend_ratio_of(want, pl->n_cached);
    }
    acc = 0;
    for (int64_t c = 0; c < want && c < n_c; c++)
        acc += sc[c].score;
    stats->selected_mass = total > 0 ? (float)(acc / total) : 0.0f;
    return want;
}

int32_t blend_probe_pass(const blend_plan *pl, int64_t want)
{
    int64_t n_cand = pl->n_cached - pl->n_exact;
    if (pl->p->adapt_mass <= 0 && (want <= 0 || want >= n_cand))
        return 0;
    return cb_blend_probe_layers(pl->p, pl->hp->n_layer, pl->n_rows, want,
                                 pl->hp->n_swa_layers > 0);
}

int32_t blend_probe_nq(const blend_plan *pl)
{
    int32_t qs = pl->start[pl->n_segs - 1], nq = 0;
    for (int32_t i = 0; i < pl->n_rows; i++) /* the last segment's uncached rows */
        nq += pl->rows[i] >= qs;
    if (pl->p->probe_rows > 0 && nq > pl->p->probe_rows) /* the last ones */
        nq = pl->p->probe_rows;
    return nq;
}

/* The first pass: blend_probe_pass's layers for the uncached rows, the
 * question's nq last of them (the tail of pl->rows) adding their
 * attention mass over the prompt's rows into mass[total] (summed on the
 * backend, copied back once). */
static cb_status probe_scores(blend_plan *pl, int32_t nq, int64_t want, float *mass, int *layer_err,
                              cb_error *err, cb_blend_stats *stats)
{
    int32_t nl = blend_probe_pass(pl, want);
    cb_status st = CB_OK;
    if (nl > 0 && (st = cb_fwd_mass_begin(pl->f, (int32_t)pl->total, pl->p->probe_values)) != CB_OK)
        return *layer_err = 1, st;
    for (int32_t l = 0; l < nl && st == CB_OK; l++) {
        if ((st = blend_wait(pl, l, err)) != CB_OK)
            break;
        if ((st = cb_fwd_layer(pl->f, pl->kv, l, pl->rows, pl->n_rows)) != CB_OK ||
            (st = cb_fwd_mass_add(pl->f, pl->kv, l, pl->n_rows - nq, nq)) != CB_OK) {
            *layer_err = 1;
            break;
        }
        stats->probe_layers = l + 1;
    }
    if (nl > 0) {
        cb_status est = cb_fwd_mass_end(pl->f, st == CB_OK ? mass : NULL);
        if (st == CB_OK && est != CB_OK)
            st = est, *layer_err = 1;
    }
    return st;
}

/* The second pass must recompute the uncached rows too: from layer 0 on
 * they attend to the selected rows' fresh K/V, not the loaded ones the
 * first pass saw.  Only their layer-0 K/V (a function of the embeddings)
 * is the same, a negligible share of the pass, so nothing of the first
 * pass is kept.  sc[n_c]: the candidates, best first; the top want are
 * recomputed, with the uncached rows, from the embeddings through every
 * layer. */
static cb_status run_selection(blend_plan *pl, const blend_scored *sc, int64_t n_c, int64_t want,
                               int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    cb_status st;
    memset(pl->keep, 0, (size_t)pl->total);
    for (int64_t c = 0; c < want && c < n_c; c++)
        pl->keep[sc[c].row] = 1;
    blend_rows_from_keep(pl);
    stats->n_selected[0] = stats->n_recomputed_tokens = (int32_t)(want < n_c ? want : n_c);
    if ((st = blend_stale_bias(pl)) != CB_OK)
        return st;
    if ((st = cb_fwd_embed(pl->f, pl->ids, pl->pos, (int32_t)pl->total)) != CB_OK)
        return *layer_err = 1, st;
    return blend_run_layers(pl, 0, pl->hp->n_layer, pl->rows, pl->n_rows, layer_err, err);
}

/* Whole passages first: of the segments, the probe_passages with the most
 * mass among their candidates, each while its candidates fit what is left
 * of the budget want, are moved to the front of sc[n_c] (their rows in
 * score order), the other rows after them in score order.  The answer to a
 * question usually lives in one or two of the passages: recomputing those
 * whole gives their tokens one another's fresh K/V, where scattered
 * tokens see stale neighbours.  Off by default: on nq20's development half
 * it lost to the scattered choice at the same budget (EVAL.md, round 4). */
static cb_status by_passage(const blend_plan *pl, blend_scored *sc, int64_t n_c, int64_t want)
{
    int32_t ns = pl->n_segs, n_pick = pl->p->probe_passages;
    double *mass = calloc((size_t)ns, sizeof *mass);
    int64_t *count = calloc((size_t)ns, sizeof *count);
    uint8_t *pick = calloc((size_t)ns, 1);
    blend_scored *tmp = malloc(sizeof *tmp * (size_t)(n_c > 0 ? n_c : 1));
    cb_status st = CB_ERR_NOMEM;
    if (!mass || !count || !pick || !tmp)
        goto out;
    for (int64_t c = 0; c < n_c; c++) {
        int32_t s = pl->seg_of[sc[c].row];
        mass[s] += sc[c].score;
        count[s]++;
    }
    for (int64_t left = want; n_pick > 0; n_pick--) {
        int32_t best = -1;
        for (int32_t s = 0; s < ns; s++)
            if (!pick[s] && count[s] > 0 && count[s] <= left && (best < 0 || mass[s] > mass[best]))
                best = s;
        if (best < 0)
            break;
        pick[best] = 1;
        left -= count[best];
    }
    int64_t k = 0;
    for (int pass = 1; pass >= 0; pass--) /* the picked segments' rows, then the rest */
        for (int64_t c = 0; c < n_c; c++)
            if (pick[pl->seg_of[sc[c].row]] == pass)
                tmp[k++] = sc[c];
    memcpy(sc, tmp, sizeof *tmp * (size_t)n_c);
    st = CB_OK;
out:
    free(mass);
    free(count);
    free(pick);
    free(tmp);
    return st;
}

static cb_status fuse_probe(blend_plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    int32_t nq = blend_probe_nq(pl);
    int64_t n_c = 0;
    int64_t want = (int64_t)ceilf(pl->p->ratios[pl->p->n_ratios - 1] * (float)pl->n_cached);
    float *mass = calloc((size_t)pl->total, sizeof(float));
    blend_scored *sc = malloc(sizeof *sc * (size_t)pl->total);
    cb_status st = CB_ERR_NOMEM;

    if (!mass || !sc)
        goto out;
    if ((st = probe_scores(pl, nq, want, mass, layer_err, err, stats)) != CB_OK)
        goto out;
    for (int64_t r = 0; r < pl->total; r++) /* the candidates, by score */
        if (pl->cached[r] == ROW_CAND)
            sc[n_c++] = (blend_scored){mass[r], (int32_t)r};
    qsort(sc, (size_t)n_c, sizeof *sc, blend_by_score_desc);
    want = probe_budget(pl, sc, n_c, want, stats);
    if (pl->p->probe_passages > 0 && (st = by_passage(pl, sc, n_c, want)) != CB_OK)
        goto out;
    st = run_selection(pl, sc, n_c, want, layer_err, err, stats);
out:
    free(mass);
    free(sc);
    return st;
}

const blend_strategy blend_probe = {
    .id = CB_STRATEGY_PROBE,
    .name = "probe",
    .check = probe_check,
    .fuse = fuse_probe,
    .adaptive = 1,
};

/* ---------------------------------------------------------------- random */

/* splitmix64: a row's draw from the prompt's seed */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* random: a control, not a method.  The ratio's share of the cached rows,
 * drawn uniformly (seeded by the prompt's token ids: the same prompt draws
 * the same rows), computed as probe computes its selection (every layer,
 * the model's stale scale) but with no first pass: what a selection
 * method wins over chance at the same budget. */
static cb_status fuse_random(blend_plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats)
{
    int64_t n_c = 0;
    int64_t want = (int64_t)ceilf(pl->p->ratios[pl->p->n_ratios - 1] * (float)pl->n_cached);
    blend_scored *sc = malloc(sizeof *sc * (size_t)(pl->total > 0 ? pl->total : 1));
    if (!sc)
        return CB_ERR_NOMEM;
    uint64_t seed = cb_hash128_bytes(pl->ids, sizeof(int32_t) * (size_t)pl->total).lo;
    for (int64_t r = 0; r < pl->total; r++)
        if (pl->cached[r] == ROW_CAND)
            sc[n_c++] = (blend_scored){(float)(mix64(seed ^ (uint64_t)r) >> 40), (int32_t)r};
    qsort(sc, (size_t)n_c, sizeof *sc, blend_by_score_desc);
    stats->ratio = pl->p->ratios[pl->p->n_ratios - 1];
    cb_status st = run_selection(pl, sc, n_c, want, layer_err, err, stats);
    free(sc);
    return st;
}

const blend_strategy blend_random = {
    .id = CB_STRATEGY_RANDOM,
    .name = "random",
    .check = probe_check,
    .fuse = fuse_random,
};
