/* strategy_hkvd.c - CacheBlend's selection (hkvd: the highest KV
 * deviation) and sink (hkvd and every cache's first tokens).  Options:
 * deviation_v (rank by V's deviation, not K's); sink: sink_tokens. */
#include "strategy.h"

#include <stdlib.h>

/* ---------------------------------------------------------------- hkvd */

/* the candidates whose fresh K (or V) deviates most from the loaded
 * cache, ranked on the backend: only the chosen rows come back */
static cb_status select_hkvd(blend_plan *pl, int32_t l, const int32_t *cand, int32_t n_c,
                             int64_t want)
{
    int32_t *top = malloc(sizeof(int32_t) * (size_t)(want > 0 ? want : 1));
    if (!top)
        return CB_ERR_NOMEM;
    cb_status st =
        cb_fwd_deviation(pl->f, pl->kv, l, pl->p->deviation_v, cand, n_c, (int32_t)want, top);
    if (st == CB_OK) {
        for (int32_t c = 0; c < n_c; c++)
            pl->keep[cand[c]] = 0;
        for (int64_t c = 0; c < want; c++)
            pl->keep[top[c]] = 1;
    }
    free(top);
    return st;
}

const blend_strategy blend_hkvd = {
    .id = CB_STRATEGY_HKVD,
    .name = "hkvd",
    .select = select_hkvd,
};

/* ---------------------------------------------------------------- sink */

/* hkvd's choice, and the first sink_tokens cached rows of every used
 * cache (but an exact one's) */
static cb_status select_sink(blend_plan *pl, int32_t l, const int32_t *cand, int32_t n_c,
                             int64_t want)
{
    cb_status st = select_hkvd(pl, l, cand, n_c, want);
    if (st != CB_OK)
        return st;
    for (int32_t s = 0; s < pl->n_segs; s++)
        if (pl->use[s])
            for (int32_t j = 0; j < pl->p->sink_tokens && j < pl->segs[s].n; j++)
                if (pl->cached[pl->start[s] + j] == ROW_CAND)
                    pl->keep[pl->start[s] + j] = 1;
    return CB_OK;
}

const blend_strategy blend_sink = {
    .id = CB_STRATEGY_SINK,
    .name = "sink",
    .select = select_sink,
};
