/* strategy_query.c - query: the candidates the last segment's rows (the
 * question) attend to most, by softmax attention over the candidates'
 * fresh keys at the check layer, summed over the question's rows and
 * heads.  No options of its own. */
#include "strategy.h"

#include <math.h>
#include <stdlib.h>

/* sc[c].score += each head's softmax of question row q's attention over
 * the candidates' keys [n_c, w] */
static void query_scores(const blend_plan *pl, float scale, const float *q, const float *keys,
                         int32_t n_c, float *srow, blend_scored *sc)
{
    const cb_hparams *hp = pl->hp;
    int grp = hp->n_head / hp->n_head_kv;
    for (int32_t h = 0; h < hp->n_head; h++) {
        const float *qv = q + (int64_t)h * hp->head_dim;
        int32_t kh = h / grp;
        float mx = -INFINITY, sum = 0;
        for (int32_t c = 0; c < n_c; c++) {
            const float *kv_ = keys + c * pl->w + (int64_t)kh * hp->head_dim;
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
}

static cb_status select_query(blend_plan *pl, int32_t l, const int32_t *cand, int32_t n_c,
                              int64_t want)
{
    int32_t qs = pl->start[pl->n_segs - 1], nq = (int32_t)(pl->total - qs);
    int64_t dq = (int64_t)pl->hp->n_head * pl->hp->head_dim;
    float scale = cb_model_attn_scale(cb_fwd_model(pl->f)); /* the engine's */
    int32_t *qrows = malloc(sizeof(int32_t) * (size_t)nq);
    float *q = malloc(sizeof(float) * (size_t)(nq * dq));         /* [nq, n_head*head_dim] */
    float *fresh = malloc(sizeof(float) * (size_t)(n_c * pl->w)); /* candidates' keys [n_c, w] */
    float *srow = malloc(sizeof(float) * (size_t)n_c);            /* one head's attention */
    blend_scored *sc = malloc(sizeof *sc * (size_t)n_c);
    cb_status st = CB_ERR_NOMEM;

    if (!qrows || !q || !fresh || !srow || !sc)
        goto out;
    for (int32_t i = 0; i < nq; i++)
        qrows[i] = qs + i;
    st = cb_fwd_layer_qkv(pl->f, l, qrows, nq, q, NULL, NULL);
    if (st == CB_OK)
        st = cb_fwd_layer_qkv(pl->f, l, cand, n_c, NULL, fresh, NULL);
    if (st != CB_OK)
        goto out;
    for (int32_t c = 0; c < n_c; c++)
        sc[c] = (blend_scored){0.0f, cand[c]};
    for (int32_t i = 0; i < nq; i++)
        query_scores(pl, scale, q + i * dq, fresh, n_c, srow, sc);
    qsort(sc, (size_t)n_c, sizeof *sc, blend_by_score_desc);
    for (int32_t c = 0; c < n_c; c++)
        pl->keep[sc[c].row] = c < want;
out:
    free(qrows), free(q), free(fresh), free(srow), free(sc);
    return st;
}

const blend_strategy blend_query = {
    .id = CB_STRATEGY_QUERY,
    .name = "query",
    .select = select_query,
};
