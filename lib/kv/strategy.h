/* strategy.h - blend's plan and its selection strategies (private to
 * lib/kv).
 *
 * blend.c lays the prompt's rows out (the plan), loads the caches and runs
 * the layers; a strategy decides which cached rows are recomputed.  Each
 * is one entry of a table (blend_strategy_of), defined in a file of its
 * own (strategy_*.c): its name, its checks of the parameters, and either
 *   select  a check-layer strategy: at each check layer, given the rows
 *           still candidates, mark the ones it keeps in pl->keep (blend.c
 *           runs the layers before, between and after), or
 *   fuse    a strategy that runs the whole blend itself (probe).
 * A new strategy: its enum value in cbcore.h, a strategy_<name>.c with its
 * entry, the entry in blend.c's table, and its name in src/cli.c. */
#ifndef CB_KV_STRATEGY_H
#define CB_KV_STRATEGY_H

#include "kv.h"

/* cached[r]: computed (0), loaded and a candidate for recompute, or loaded
 * and exact (a true prefix's: never recomputed) */
enum { ROW_CAND = 1, ROW_EXACT = 2 };

typedef struct blend_loader blend_loader; /* blend.c's: the KV loader thread */

/* The prompt's rows and what happens to them. */
typedef struct blend_plan {
    cb_fwd *f;
    cb_kvcache *kv;
    const cb_hparams *hp;
    const cb_segment *segs;
    /* the caller's parameters until the policy is resolved (blend.c,
     * plan_policy), then plan: every default resolved, the ratio and
     * strategy chosen; read-only from then on */
    const cb_blend_params *p;
    cb_blend_params plan;
    int32_t n_segs;
    int64_t total, n_cached, w;  /* w: a K or V row's width (n_head_kv * head_dim) */
    int64_t n_exact;             /* cached rows of true prefixes (ROW_EXACT) */
    int32_t exact_end;           /* those segments: the cached ones before it */
    int32_t *ids, *pos, *seg_of; /* [total] */
    int32_t *start;              /* [n_segs]: first row of each segment */
    uint8_t *use;                /* [n_segs]: its cache is used */
    uint8_t *cached;             /* [total]: the row's KV comes from a cache (ROW_*) */
    uint8_t *keep;               /* [total]: a cached row still selected for recompute */
    int32_t *rows; /* [total]: the computed rows (fresh ones and selected cached ones) */
    int32_t n_rows;
    blend_loader *ld;
    double stall;          /* ms waited for the loader, on the host's clock */
    cb_spans *waits;       /* the same waits on the computing thread's work (a device's clock) */
    int stale_unsupported; /* the backend has no stale bias: run as at 1 */
    /* the cost model (blend.c, plan_costs): each row's cost [total] in
     * units of a row's products through every layer, and its sums: every
     * row (full prefill), the uncached rows, the candidates, the keys
     * probe's scoring rows see; with a speedup and probe's first pass, the
     * budget its selection (its rows' costs and blend_sel_waste) keeps to
     * (< 0: none) and the fewest rows */
    double *cost, c_full, c_unc, c_cand, c_score, budget;
    int64_t budget_min;
    /* and what the rows' own costs leave out: loading the caches (the
     * loader's time, c_read, and what it adds to the computing's, c_load);
     * the keys the attention's blocks of attn_rows rows compute beyond
     * those their rows see (key_cost each: over the span of positions a
     * pass's rows cover, and in probe's first pass over the uncached rows) */
    double c_read, c_load, c_first_waste, key_cost;
    int64_t span;
    int32_t attn_rows;
} blend_plan;

typedef struct blend_strategy {
    cb_blend_strategy id;
    const char *name; /* as the programs spell it */
    /* Its own checks of the parameters (NULL: none), before any work. */
    cb_status (*check)(const cb_blend_params *p, cb_error *err);
    /* A check-layer strategy: at layer l, keep `want` (< n_c) of the
     * candidates cand[n_c] (cached rows, by position): pl->keep[r] = 1 for
     * the kept, 0 for the others (a strategy may keep more, as sink does). */
    cb_status (*select)(blend_plan *pl, int32_t l, const int32_t *cand, int32_t n_c, int64_t want);
    /* Or the whole blend from the embedded prompt to the last layer, the
     * stats' selection fields filled (*layer_err set when a layer failed). */
    cb_status (*fuse)(blend_plan *pl, int *layer_err, cb_error *err, cb_blend_stats *stats);
    int adaptive; /* 1: takes adapt_mass (an adaptive ratio) */
} blend_strategy;

/* The entries (strategy_*.c) and the table: the entry of id, or NULL. */
extern const blend_strategy blend_hkvd, blend_sink, blend_query, blend_probe, blend_runs,
    blend_random;
const blend_strategy *blend_strategy_of(cb_blend_strategy id);

/* What blend.c gives the strategies. */

/* Wait until layer l of every cache is in place (a strategy that reads the
 * cache must): the host for the loader's thread, then the computing
 * thread's work for the loads it queued.  The time waited goes to
 * pl->stall (the host's clock) and pl->waits (the work's). */
cb_status blend_wait(blend_plan *pl, int32_t l, cb_error *err);
/* Layers lo..hi-1 for rows[n_rows] (NULL: every row); the model's last
 * layer only as far as the prompt's last row's logits and the cache need. */
cb_status blend_run_layers(blend_plan *pl, int32_t lo, int32_t hi, const int32_t *rows,
                           int32_t n_rows, int *layer_err, cb_error *err);
/* pl->rows = every row kept or not cached, in order; returns how many of
 * them are cached (kept) rows. */
int64_t blend_rows_from_keep(blend_plan *pl);
/* After a selection (pl->keep): the computed rows' attention to the stale
 * rows (candidates not kept) scaled by the plan's stale scale from here on
 * (a backend without the operation: as is, pl->stale_unsupported set). */
cb_status blend_stale_bias(blend_plan *pl);
/* The layers probe's first pass runs for a budget of `want` cached rows
 * (pl->n_rows the uncached ones): cb_blend_probe_layers', or none when the
 * budget needs no scores (nothing or everything kept, no adaptive ratio). */
int32_t blend_probe_pass(const blend_plan *pl, int64_t want);
/* The question's rows probe scores with: how many of the last uncached
 * rows (pl->rows before a selection) are the last segment's, at most
 * probe_rows of them when that is given. */
int32_t blend_probe_nq(const blend_plan *pl);
/* The keys the final pass's attention computes and masks with n_sel
 * cached rows selected (plan_costs), in the rows' cost units. */
double blend_sel_waste(const blend_plan *pl, int64_t n_sel);
/* The ratio whose budget (ceil of it x n) is exactly w. */
float blend_ratio_of(int64_t w, int64_t n);

/* A row's score, for sorting: by_score_desc orders higher scores first,
 * equal ones by lower row. */
typedef struct blend_scored {
    float score;
    int32_t row;
} blend_scored;
int blend_by_score_desc(const void *a, const void *b);

#endif
