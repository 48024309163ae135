/* kvcache.c - a KV cache: every layer's K and V on the model's backend,
 * made, sized and freed; the rows a blend left stale (cb_kvcache_set_stale),
 * whose bias forward.c's attention applies.  Its row I/O is forward.c's,
 * its loaders kvload.c's. */
#include "model_impl.h"

#include <stdlib.h>
#include <string.h>

cb_status cb_kvcache_new(cb_kvcache **out, const cb_model *m, int32_t n_ctx, cb_type type)
{
    const cb_hparams *hp = &m->hp;
    cb_kvcache *kv;
    size_t esz = type == CB_TYPE_F32 ? 4 : 2;

    if ((type != CB_TYPE_F16 && type != CB_TYPE_F32) || n_ctx < 1)
        return CB_ERR_INVALID;
    kv = calloc(1, sizeof *kv);
    if (!kv)
        return CB_ERR_NOMEM;
    kv->m = m;
    kv->type = type;
    kv->n_ctx = n_ctx;
    kv->width = (int64_t)hp->n_head_kv * hp->head_dim;
    kv->k = calloc((size_t)hp->n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)hp->n_layer, sizeof *kv->v);
    kv->loaded = calloc((size_t)hp->n_layer, sizeof *kv->loaded);
    if (!kv->k || !kv->v || !kv->loaded)
        goto fail;
    for (int l = 0; l < hp->n_layer; l++) {
        kv->k[l] = m->be->ops->alloc(m->be, esz * (size_t)(n_ctx * kv->width));
        kv->v[l] = m->be->ops->alloc(m->be, esz * (size_t)(n_ctx * kv->width));
        if (!kv->k[l] || !kv->v[l])
            goto fail;
        if (m->be->ops->event_new && !(kv->loaded[l] = m->be->ops->event_new(m->be)))
            goto fail;
    }
    if (m->be->ops->event_new && !(kv->handed = m->be->ops->event_new(m->be)))
        goto fail;
    if (m->be->ops->reserve_keys)
        m->be->ops->reserve_keys(m->be, n_ctx, hp->n_head_kv, hp->head_dim);
    *out = kv;
    return CB_OK;
fail:
    cb_kvcache_free(kv);
    return cb_backend_nomem(m->be);
}

void cb_kvcache_free(cb_kvcache *kv)
{
    if (!kv)
        return;
    cb_backend *be = kv->m->be;
    for (int l = 0; l < kv->m->hp.n_layer; l++) {
        if (kv->k)
            be->ops->dealloc(be, kv->k[l]);
        if (kv->v)
            be->ops->dealloc(be, kv->v[l]);
        if (kv->loaded && kv->loaded[l])
            be->ops->event_free(be, kv->loaded[l]);
    }
    if (kv->handed)
        be->ops->event_free(be, kv->handed);
    free(kv->k);
    free(kv->v);
    free(kv->loaded);
    free(kv->stale);
    free(kv);
}

cb_status cb_kvcache_set_stale(cb_kvcache *kv, const uint8_t *stale, int32_t n, float bias)
{
    kv->n_stale = 0;
    if (n <= 0 || !stale)
        return CB_OK;
    if (!kv->m->be->ops->set_key_bias)
        return CB_ERR_UNSUPPORTED;
    if (n > kv->n_ctx)
        return CB_ERR_RANGE;
    if (!kv->stale && !(kv->stale = malloc((size_t)kv->n_ctx)))
        return CB_ERR_NOMEM;
    memcpy(kv->stale, stale, (size_t)n);
    kv->n_stale = n;
    kv->stale_bias = bias;
    return CB_OK;
}

uint64_t cb_kvcache_bytes(const cb_model *m, int32_t n_ctx, cb_type type)
{
    const cb_hparams *hp = &m->hp;
    uint64_t esz = type == CB_TYPE_F32 ? 4 : 2;
    return n_ctx < 1 ? 0
                     : 2 * esz * (uint64_t)hp->n_layer * (uint64_t)n_ctx * (uint64_t)hp->n_head_kv *
                           (uint64_t)hp->head_dim;
}

int32_t cb_kvcache_n_ctx(const cb_kvcache *kv) { return kv->n_ctx; }
cb_type cb_kvcache_type(const cb_kvcache *kv) { return kv->type; }
const cb_model *cb_kvcache_model(const cb_kvcache *kv) { return kv->m; }
