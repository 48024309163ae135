/* strategy_runs.c - runs (after CacheClip): half the budget to the most
 * deviating rows (anchors), the rest to the cached row after each anchor,
 * in anchor order, so that recomputed tokens see recomputed neighbours;
 * what is left (a successor already chosen or not cached) goes to the next
 * most deviating rows.  Options: deviation_v (as hkvd). */
#include "strategy.h"

#include <stdlib.h>

static cb_status select_runs(blend_plan *pl, int32_t l, const int32_t *cand, int32_t n_c,
                             int64_t want)
{
    int32_t *top = malloc(sizeof(int32_t) * (size_t)n_c);
    int64_t n_anchor = (want + 1) / 2, got = 0;
    if (!top)
        return CB_ERR_NOMEM;
    cb_status st = cb_fwd_deviation(pl->f, pl->kv, l, pl->p->deviation_v, cand, n_c, n_c, top);
    if (st != CB_OK) {
        free(top);
        return st;
    }
    for (int32_t c = 0; c < n_c; c++)
        pl->keep[cand[c]] = 0;
    for (int64_t a = 0; a < n_anchor; a++)
        pl->keep[top[a]] = 1, got++;
    for (int64_t a = 0; a < n_anchor && got < want; a++) {
        int32_t next = top[a] + 1;
        if (next < pl->total && pl->cached[next] == ROW_CAND && !pl->keep[next] &&
            pl->seg_of[next] == pl->seg_of[top[a]])
            pl->keep[next] = 1, got++;
    }
    for (int64_t a = n_anchor; a < n_c && got < want; a++)
        if (!pl->keep[top[a]])
            pl->keep[top[a]] = 1, got++;
    free(top);
    return CB_OK;
}

const blend_strategy blend_runs = {
    .id = CB_STRATEGY_RUNS,
    .name = "runs",
    .select = select_runs,
};
