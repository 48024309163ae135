/* kvload.c - loading stored KV rows into a cache: f32 rows from the host
 * (cb_kvcache_load), a KV file's rows as they are (cb_kvcache_load_rows),
 * and a layer of several segments at once (cb_kvcache_load_segs, cb-run's
 * loader).  Keys computed at one position are moved to another by the
 * layer's own RoPE, R(p) = R(p - q) R(q), on the backend. */
#include "model_impl.h"

#include <stdlib.h>
#include <string.h>

/* The loaders' scratch for n rows placed at pos.. of one layer */
typedef struct kv_place {
    int32_t *at;    /* [n]: the cache rows, pos + i */
    int32_t *delta; /* [n]: pos - from_pos0, the keys' move (R(p) = R(p - q) R(q)) */
    float *tmp;     /* [n, width] f32 on the backend */
} kv_place;

static int load_args_ok(const cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n,
                        int32_t from_pos0)
{
    return layer >= 0 && layer < kv->m->hp.n_layer && n >= 0 && pos >= 0 && pos <= kv->n_ctx - n &&
           from_pos0 >= 0;
}

/* The arguments checked (CB_ERR_RANGE) and, for n > 0, the scratch made
 * (else the backend's out-of-memory status, nothing held) */
static cb_status place_begin(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n,
                             int32_t from_pos0, kv_place *pl)
{
    cb_backend *be = kv->m->be;
    memset(pl, 0, sizeof *pl);
    if (!load_args_ok(kv, layer, pos, n, from_pos0))
        return CB_ERR_RANGE;
    if (n == 0)
        return CB_OK;
    pl->at = malloc(sizeof(int32_t) * (size_t)n);
    pl->delta = malloc(sizeof(int32_t) * (size_t)n);
    pl->tmp = be_tmp(be, sizeof(float) * (size_t)n * (size_t)kv->width);
    if (!pl->at || !pl->delta || !pl->tmp) {
        free(pl->at);
        free(pl->delta);
        be->ops->dealloc(be, pl->tmp);
        return cb_backend_nomem(be);
    }
    for (int32_t i = 0; i < n; i++) {
        pl->at[i] = pos + i;
        pl->delta[i] = pos - from_pos0;
    }
    return CB_OK;
}

/* K in pl->tmp, computed at from_pos0.., moved to pos.. by the layer's own
 * RoPE (a global and a sliding-window layer differ) and written to its rows */
static void place_keys(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, int32_t from_pos0,
                       const kv_place *pl)
{
    const cb_model *m = kv->m;
    cb_backend *be = m->be;
    if (pos != from_pos0)
        be->ops->rope(be, pl->tmp, pl->delta, n, m->hp.n_head_kv, m->hp.head_dim, m->hp.n_rot,
                      m->layers[layer].rope_base, m->layers[layer].rope_ff, m->hp.rope_neox);
    be->ops->kv_write(be, kv->k[layer], kv->type, kv->width, pl->tmp, pl->at, n);
}

/* The scratch freed and the layer marked loaded */
static cb_status place_end(cb_kvcache *kv, int32_t layer, kv_place *pl)
{
    cb_backend *be = kv->m->be;
    be->ops->dealloc(be, pl->tmp);
    free(pl->at);
    free(pl->delta);
    if (kv->loaded[layer]) /* other threads' work on this layer waits for this mark */
        be->ops->event_record(be, kv->loaded[layer]);
    return cb_backend_status(be);
}

cb_status cb_kvcache_load(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, const float *k,
                          const float *v, int32_t from_pos0)
{
    cb_backend *be = kv->m->be;
    size_t bytes = sizeof(float) * (size_t)n * (size_t)kv->width;
    kv_place pl;
    cb_status st = place_begin(kv, layer, pos, n, from_pos0, &pl);

    if (st != CB_OK || n == 0)
        return st;
    be->ops->upload(be, pl.tmp, k, bytes);
    place_keys(kv, layer, pos, n, from_pos0, &pl);
    be->ops->upload(be, pl.tmp, v, bytes);
    be->ops->kv_write(be, kv->v[layer], kv->type, kv->width, pl.tmp, pl.at, n);
    return place_end(kv, layer, &pl);
}

/* The loader's path for rows of another type than the cache's (a Q8_0 or
 * BF16 file, an f32 file in an f16 cache): f32 on the host, then as
 * cb_kvcache_load. */
static cb_status load_rows_f32(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, cb_type t,
                               const void *k, const void *v, int32_t from_pos0, float key_scale)
{
    size_t row = cb_type_row_bytes(t, kv->width), e = (size_t)n * (size_t)kv->width;
    float *fk = malloc(sizeof(float) * e), *fv = malloc(sizeof(float) * e);
    cb_status st = fk && fv ? CB_OK : CB_ERR_NOMEM;
    for (int32_t i = 0; i < n && st == CB_OK; i++)
        if ((st = cb_dequant_row(t, (const char *)k + i * row, fk + i * kv->width, kv->width)) ==
            CB_OK)
            st = cb_dequant_row(t, (const char *)v + i * row, fv + i * kv->width, kv->width);
    for (size_t i = 0; st == CB_OK && key_scale != 1.0f && i < e; i++)
        fk[i] *= key_scale;
    if (st == CB_OK)
        st = cb_kvcache_load(kv, layer, pos, n, fk, fv, from_pos0);
    free(fk);
    free(fv);
    return st;
}

void cb_kv_scratch_free(const cb_kvcache *kv, cb_kv_scratch *sc)
{
    cb_backend *be = kv->m->be;
    int32_t group = sc->group, async = sc->async;
    be->ops->dealloc(be, sc->tmp);
    free(sc->at);
    free(sc->delta);
    memset(sc, 0, sizeof *sc);
    sc->group = group, sc->async = async;
}

int32_t cb_kv_scratch_group(const cb_kvcache *kv, const cb_kv_scratch *sc)
{
    /* a device: all of them (fewer operations to issue); the CPU: one (its
     * rows still in the cache when its keys are read back) */
    return sc->group > 0 ? sc->group : kv->m->be->ops->sync ? 0 : 1;
}

/* sc grown to hold `rows` rows of kv's width (else freed, and the status) */
static cb_status scratch_fit(const cb_kvcache *kv, cb_kv_scratch *sc, int64_t rows)
{
    cb_backend *be = kv->m->be;
    if (rows <= sc->cap)
        return CB_OK;
    cb_kv_scratch_free(kv, sc);
    sc->at = malloc(sizeof(int32_t) * (size_t)rows);
    sc->delta = malloc(sizeof(int32_t) * (size_t)rows);
    sc->tmp = be_tmp(be, sizeof(float) * (size_t)rows * (size_t)kv->width);
    if (!sc->at || !sc->delta || !sc->tmp) {
        cb_status st = sc->tmp ? CB_ERR_NOMEM : cb_backend_nomem(be);
        cb_kv_scratch_free(kv, sc);
        return st;
    }
    sc->cap = rows;
    return CB_OK;
}

/* whether a segment's keys are read back: scaled or moved */
static int seg_keys_change(const cb_kv_seg *s)
{
    return s->n > 0 && (s->pos != s->from_pos0 || s->key_scale != 1.0f);
}

/* The listed keys (seg_keys_change, in order) in tmp multiplied by their
 * segments' scales, a run of segments of one scale at a time */
static void keys_scale(const cb_kvcache *kv, const cb_kv_seg *segs, int32_t n_segs, float *tmp)
{
    cb_backend *be = kv->m->be;
    int64_t r = 0, run0 = 0;
    float scale = 1.0f; /* the run's, rows run0..r-1 */
    for (int32_t i = 0; i <= n_segs; i++) {
        const cb_kv_seg *s = i < n_segs ? &segs[i] : NULL;
        if (s && (s->type != kv->type || !seg_keys_change(s)))
            continue;
        if (!s || s->key_scale != scale) {
            if (scale != 1.0f && r > run0)
                be->ops->scale(be, tmp + run0 * kv->width, scale, (r - run0) * kv->width);
            if (!s)
                break;
            run0 = r, scale = s->key_scale;
        }
        r += s->n;
    }
}

/* ... and moved by the layer's RoPE, a run of moved segments at a time
 * (the keys that stay where they are keep their bits: no rotation by 0) */
static void keys_move(const cb_kvcache *kv, int32_t layer, const cb_kv_seg *segs, int32_t n_segs,
                      const cb_kv_scratch *sc)
{
    const cb_model *m = kv->m;
    cb_backend *be = m->be;
    int64_t r = 0, run0 = 0;
    int moving = 0; /* whether rows run0..r-1 move */
    for (int32_t i = 0; i <= n_segs; i++) {
        const cb_kv_seg *s = i < n_segs ? &segs[i] : NULL;
        if (s && (s->type != kv->type || !seg_keys_change(s)))
            continue;
        int mv = s && s->pos != s->from_pos0;
        if (!s || mv != moving) {
            if (moving && r > run0)
                be->ops->rope(be, sc->tmp + run0 * kv->width, sc->delta + run0, r - run0,
                              m->hp.n_head_kv, m->hp.head_dim, m->hp.n_rot,
                              m->layers[layer].rope_base, m->layers[layer].rope_ff,
                              m->hp.rope_neox);
            if (!s)
                break;
            run0 = r, moving = mv;
        }
        r += s->n;
    }
}

/* cb_kvcache_load_segs's rows of the cache's type: K and V as they are,
 * into their rows; then every scaled or moved key read back as f32 in one
 * operation, scaled and moved by runs of segments, written back in one */
static cb_status place_group(cb_kvcache *kv, int32_t layer, const cb_kv_seg *segs, int32_t n_segs,
                             cb_kv_scratch *sc)
{
    cb_backend *be = kv->m->be;
    size_t row = cb_type_row_bytes(kv->type, kv->width);
    int64_t n_keys = 0, r = 0; /* the rows whose keys are read back */
    void (*up)(cb_backend *, void *, const void *, size_t) =
        sc->async && be->ops->upload_async ? be->ops->upload_async : be->ops->upload;
    cb_status st;

    for (int32_t i = 0; i < n_segs; i++) {
        const cb_kv_seg *s = &segs[i];
        size_t bytes = row * (size_t)s->n;
        if (s->n == 0 || s->type != kv->type)
            continue;
        up(be, (char *)kv->v[layer] + (size_t)s->pos * row, s->v, bytes);
        up(be, (char *)kv->k[layer] + (size_t)s->pos * row, s->k, bytes);
        n_keys += seg_keys_change(s) ? s->n : 0;
    }
    if (n_keys == 0)
        return CB_OK;
    if ((st = scratch_fit(kv, sc, n_keys)) != CB_OK)
        return st;
    for (int32_t i = 0; i < n_segs; i++) {
        const cb_kv_seg *s = &segs[i];
        if (s->type != kv->type || !seg_keys_change(s))
            continue;
        for (int32_t j = 0; j < s->n; j++, r++) {
            sc->at[r] = s->pos + j;
            sc->delta[r] = s->pos - s->from_pos0;
        }
    }
    be->ops->kv_read(be, kv->k[layer], kv->type, kv->width, sc->at, n_keys, sc->tmp);
    keys_scale(kv, segs, n_segs, sc->tmp);
    keys_move(kv, layer, segs, n_segs, sc);
    be->ops->kv_write(be, kv->k[layer], kv->type, kv->width, sc->tmp, sc->at, n_keys);
    return CB_OK;
}

cb_status cb_kvcache_load_segs(cb_kvcache *kv, int32_t layer, const cb_kv_seg *segs, int32_t n_segs,
                               cb_kv_scratch *sc)
{
    cb_backend *be = kv->m->be;
    cb_status st;

    for (int32_t i = 0; i < n_segs; i++)
        if (!load_args_ok(kv, layer, segs[i].pos, segs[i].n, segs[i].from_pos0))
            return CB_ERR_RANGE;
    /* rows of another type: through f32 on the host, one at a time */
    for (int32_t i = 0; i < n_segs; i++) {
        const cb_kv_seg *s = &segs[i];
        if (s->n > 0 && s->type != kv->type &&
            (st = load_rows_f32(kv, layer, s->pos, s->n, s->type, s->k, s->v, s->from_pos0,
                                s->key_scale)) != CB_OK)
            return st;
    }
    /* the others by groups of segments */
    int32_t group = cb_kv_scratch_group(kv, sc);
    group = group > 0 ? group : n_segs;
    for (int32_t g0 = 0, g1; g0 < n_segs; g0 = g1) {
        g1 = n_segs - g0 < group ? n_segs : g0 + group;
        if ((st = place_group(kv, layer, segs + g0, g1 - g0, sc)) != CB_OK)
            return st;
    }
    if (kv->loaded[layer]) /* other threads' work on this layer waits for this mark */
        be->ops->event_record(be, kv->loaded[layer]);
    return cb_backend_status(be);
}

cb_status cb_kvcache_load_rows(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, cb_type t,
                               const void *k, const void *v, int32_t from_pos0, float key_scale)
{
    cb_kv_seg s = {pos, n, from_pos0, t, k, v, key_scale};
    cb_kv_scratch sc = {0};
    if (n == 0 && load_args_ok(kv, layer, pos, n, from_pos0))
        return CB_OK;
    cb_status st = cb_kvcache_load_segs(kv, layer, &s, 1, &sc);
    cb_kv_scratch_free(kv, &sc);
    return st;
}
