/* forward.c - the layer-wise forward pass, and the KV cache's row I/O
 * (kvcache.c makes and frees caches, kvload.c loads stored rows into them).
 *
 * Embedding: x = tok_embd[token] (x sqrt(n_embd) for gemma3).
 * One layer on m selected rows (x [m, d], positions p[m]):
 *   xn  = rmsnorm(x) * attn_norm
 *   q   = xn Wq^T (+bq)   [m, H*hd]      k, v = xn Wk^T, xn Wv^T  [m, Hkv*hd]
 *   q,k = rmsnorm(q_h) * q_norm, rmsnorm(k_h) * k_norm, per head  (qwen3, gemma3)
 *   q,k = rope(q, p), rope(k, p)         (the layer's base and frequency divisors)
 *   cache.K[p], cache.V[p] = k, v
 *   a   = attention(q over cache rows 0..p, or p-W+1..p in a sliding-window layer)
 *   o   = a Wo^T;  o = rmsnorm(o) * post_attn_norm   (gemma3)
 *   x  += o
 *   xn  = rmsnorm(x) * ffn_norm
 *   o   = (act(xn Wg^T) * (xn Wu^T)) Wd^T   act: silu, or gelu (gemma3)
 *   o   = rmsnorm(o) * post_ffn_norm        (gemma3)
 *   x  += o
 * Every operation goes through the backend table.  Backend operations
 * return nothing; a failed one leaves a sticky fault on the backend
 * (backend.h), which each function here checks before it returns success
 * or uses what the device handed back. */
#include "diag.h"
#include "model_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- KV cache */

/* attention over kv, with its stale rows' bias (cb_kvcache_set_stale);
 * the bias's error (out of memory) returned, and no attention run without
 * the bias the stats say is applied */
static cb_status kv_attention(cb_backend *be, const cb_kvcache *kv, int32_t layer, const float *q,
                              const int32_t *pos, int64_t n, float *out)
{
    const cb_model *m = kv->m;
    const cb_hparams *hp = &m->hp;
    if (kv->n_stale > 0) {
        cb_status st = be->ops->set_key_bias(be, kv->stale, kv->n_stale, kv->stale_bias, INT32_MAX);
        if (st != CB_OK)
            return st;
    }
    be->ops->attention(be, q, pos, n, kv->k[layer], kv->v[layer], kv->type, hp->n_head,
                       hp->n_head_kv, hp->head_dim, m->attn_scale, m->layers[layer].window, out);
    if (kv->n_stale > 0)
        be->ops->set_key_bias(be, NULL, 0, 0.0f, 0);
    return CB_OK;
}

void cb_kvcache_after_loads(const cb_kvcache *kv, int32_t layer)
{
    cb_backend *be = kv->m->be;
    if (kv->loaded[layer])
        be->ops->event_wait(be, kv->loaded[layer]);
}

void cb_kvcache_hand_over(cb_kvcache *kv)
{
    cb_backend *be = kv->m->be;
    if (kv->handed)
        be->ops->event_record(be, kv->handed);
}

void cb_kvcache_before_loads(const cb_kvcache *kv)
{
    cb_backend *be = kv->m->be;
    if (kv->handed)
        be->ops->event_wait(be, kv->handed);
}

/* Copy rows pos0..pos0+n-1 of one layer's K (which 0) or V (1) from f32
 * host memory `src` into the cache, or (src NULL) from the cache to `dst`,
 * through a backend staging buffer. */
static cb_status kv_rows_io(const cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                            const float *src, float *dst)
{
    cb_backend *be = kv->m->be;
    size_t bytes = sizeof(float) * (size_t)n * (size_t)kv->width;
    if (layer < 0 || layer >= kv->m->hp.n_layer || (which != 0 && which != 1) || pos0 < 0 ||
        n < 0 || pos0 > kv->n_ctx - n)
        return CB_ERR_RANGE;
    int32_t *at = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    float *tmp = be_tmp(be, bytes);
    if (!at || !tmp) {
        free(at);
        be->ops->dealloc(be, tmp);
        return cb_backend_nomem(be);
    }
    for (int32_t i = 0; i < n; i++)
        at[i] = pos0 + i;
    void *cache = which ? kv->v[layer] : kv->k[layer];
    cb_kvcache_after_loads(kv, layer);
    if (src) {
        be->ops->upload(be, tmp, src, bytes);
        be->ops->kv_write(be, cache, kv->type, kv->width, tmp, at, n);
    } else {
        be->ops->kv_read(be, cache, kv->type, kv->width, at, n, tmp);
        be->ops->download(be, dst, tmp, bytes);
    }
    be->ops->dealloc(be, tmp);
    free(at);
    return cb_backend_status(be);
}

cb_status cb_kvcache_read(const cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                          float *dst)
{
    return kv_rows_io(kv, layer, which, pos0, n, NULL, dst);
}

cb_status cb_kvcache_write(cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                           const float *src)
{
    return kv_rows_io(kv, layer, which, pos0, n, src, NULL);
}

/* -------------------------------------------------------------- forward */

/* Rows of logits computed at a time (cb_fwd_logits loops over chunks): the
 * buffer is [FWD_LOGIT_ROWS, n_vocab], not [n_max, n_vocab]. */
#define FWD_LOGIT_ROWS 8

struct cb_fwd {
    const cb_model *m;
    int32_t n_max, n;  /* capacity, rows embedded */
    int32_t *pos;      /* host [n_max] */
    int32_t *sel_pos;  /* host [n_max]: positions of the selected rows */
    int32_t *q_pos;    /* host [n_max]: positions of the rows whose queries q holds */
    int32_t *eval_pos; /* host [n_max]: cb_model_eval's positions */
    int32_t *seq;      /* host [n_max]: 0, 1, ..., n_max-1 (rows 0..k-1 as a row list) */
    int32_t *eval_tok; /* host [n_max]: cb_fwd_decode's tokens, padding rows included */
    float *zero_row;   /* host [H*hd] zeros: a padding row's attention output */
    /* backend buffers */
    float *x;                  /* [n_max, d] hidden state of every embedded row */
    float *xs;                 /* [n_max, d] the selected rows, compacted */
    float *xn;                 /* [n_max, d] */
    float *q, *att;            /* [n_max, H*hd] */
    float *k, *v;              /* [n_max, Hkv*hd] */
    float *g, *u;              /* [n_max, n_ff] */
    float *logits;             /* [min(n_max, FWD_LOGIT_ROWS), n_vocab] */
    float *dev;                /* [n_max] deviations */
    int32_t n_q;               /* rows whose queries q holds (the last projection of Q) */
    float *mass;               /* cb_fwd_mass_begin's sum [mass_keys], or NULL */
    int32_t mass_keys, mass_v; /* its keys; weighted by the value norms */
};

/* The rows' logits are made FWD_LOGIT_ROWS at a time (f->logits' size) */
static int32_t logit_chunk(const cb_fwd *f)
{
    return f->n_max < FWD_LOGIT_ROWS ? f->n_max : FWD_LOGIT_ROWS;
}

cb_status cb_fwd_new(cb_fwd **out, const cb_model *m, int32_t n_max)
{
    const cb_hparams *hp = &m->hp;
    cb_backend *be = m->be;
    cb_fwd *f;
    int64_t d = hp->n_embd, dq = (int64_t)hp->n_head * hp->head_dim,
            dkv = (int64_t)hp->n_head_kv * hp->head_dim;

    if (n_max < 1)
        return CB_ERR_INVALID;
    f = calloc(1, sizeof *f);
    if (!f)
        return CB_ERR_NOMEM;
    f->m = m;
    f->n_max = n_max;
    f->pos = calloc((size_t)n_max, sizeof *f->pos);
    f->sel_pos = calloc((size_t)n_max, sizeof *f->sel_pos);
    f->q_pos = calloc((size_t)n_max, sizeof *f->q_pos);
    f->eval_pos = calloc((size_t)n_max, sizeof *f->eval_pos);
    f->seq = malloc(sizeof *f->seq * (size_t)n_max);
    f->eval_tok = calloc((size_t)n_max, sizeof *f->eval_tok);
    f->zero_row = calloc((size_t)dq, sizeof *f->zero_row);
    for (int32_t i = 0; f->seq && i < n_max; i++)
        f->seq[i] = i;
#define B(field, cols) f->field = be->ops->alloc(be, sizeof(float) * (size_t)n_max * (size_t)(cols))
    B(x, d);
    B(xs, d);
    B(xn, d);
    B(q, dq);
    B(att, dq);
    B(k, dkv);
    B(v, dkv);
    B(g, hp->n_ff);
    B(u, hp->n_ff);
    if (be->ops->reserve)
        be->ops->reserve(be, n_max);
    f->logits = be->ops->alloc(be, sizeof(float) *
                                       (size_t)(n_max < FWD_LOGIT_ROWS ? n_max : FWD_LOGIT_ROWS) *
                                       (size_t)hp->n_vocab);
    B(dev, 1);
#undef B
    if (!f->pos || !f->sel_pos || !f->q_pos || !f->eval_pos || !f->seq || !f->eval_tok ||
        !f->zero_row || !f->x || !f->xs || !f->xn || !f->q || !f->att || !f->k || !f->v || !f->g ||
        !f->u || !f->logits || !f->dev) {
        cb_fwd_free(f);
        return cb_backend_nomem(be);
    }
    *out = f;
    return CB_OK;
}

/* Counts what cb_fwd_new allocates, buffer by buffer; the backend's own
 * scratch for products of n_max rows (reserve) is not counted. */
uint64_t cb_fwd_bytes(const cb_model *m, int32_t n_max)
{
    const cb_hparams *hp = &m->hp;
    uint64_t n = n_max < 1 ? 0 : (uint64_t)n_max, d = (uint64_t)hp->n_embd,
             dq = (uint64_t)hp->n_head * (uint64_t)hp->head_dim,
             dkv = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    uint64_t host = 6 * sizeof(int32_t) * n + sizeof(float) * dq;
    uint64_t rows = 3 * d + 2 * dq + 2 * dkv + 2 * (uint64_t)hp->n_ff + 1;
    uint64_t logits = (n < FWD_LOGIT_ROWS ? n : FWD_LOGIT_ROWS) * (uint64_t)hp->n_vocab;
    return n ? host + sizeof(float) * (n * rows + logits) : 0;
}

void cb_fwd_free(cb_fwd *f)
{
    if (!f)
        return;
    cb_backend *be = f->m->be;
    float *bufs[] = {f->x, f->xs, f->xn, f->q,      f->att, f->k,
                     f->v, f->g,  f->u,  f->logits, f->dev, f->mass};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->ops->dealloc(be, bufs[i]);
    free(f->pos);
    free(f->sel_pos);
    free(f->q_pos);
    free(f->eval_pos);
    free(f->seq);
    free(f->eval_tok);
    free(f->zero_row);
    free(f);
}

cb_status cb_fwd_embed(cb_fwd *f, const int32_t *tokens, const int32_t *pos, int32_t n)
{
    const cb_model *m = f->m;
    if (n < 1 || n > f->n_max)
        return CB_ERR_INVALID;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->hp.n_vocab || pos[i] < 0)
            return CB_ERR_RANGE;
    m->be->ops->get_rows(m->be, m->tok_embd, tokens, n, f->x);
    if (m->embd_scale != 1.0f)
        m->be->ops->scale(m->be, f->x, m->embd_scale, (int64_t)n * m->hp.n_embd);
    memcpy(f->pos, pos, sizeof(int32_t) * (size_t)n);
    f->n = n;
    return cb_backend_status(m->be);
}

enum { QKV_Q = 1, QKV_K = 2, QKV_V = 4 };

/* y[k] = x . w[k]^T for the nw weights of one input: one backend call
 * where the backend has it (one pool job on the CPU) */
static void matmul_same_input(cb_backend *be, const cb_bweight *const *w, int nw, const float *x,
                              float *const *y, int64_t n)
{
    if (be->ops->matmul_multi && nw > 0) {
        be->ops->matmul_multi(be, w, nw, x, y, n);
        return;
    }
    for (int k = 0; k < nw; k++)
        be->ops->matmul(be, w[k], x, y[k], n);
}

/* RoPE of layer L on the queries q [n, n_head, hd] and keys k [n,
 * n_head_kv, hd] at positions pos[n], either NULL: both in one operation
 * where the backend has one */
static void rope_qk(const cb_model *m, const cb_layer *L, float *q, float *k, const int32_t *pos,
                    int32_t n)
{
    const cb_hparams *hp = &m->hp;
    const cb_backend_ops *o = m->be->ops;
    if (q && k && o->rope_qk) {
        o->rope_qk(m->be, q, k, pos, n, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot,
                   L->rope_base, L->rope_ff, hp->rope_neox);
        return;
    }
    if (q)
        o->rope(m->be, q, pos, n, hp->n_head, hp->head_dim, hp->n_rot, L->rope_base, L->rope_ff,
                hp->rope_neox);
    if (k)
        o->rope(m->be, k, pos, n, hp->n_head_kv, hp->head_dim, hp->n_rot, L->rope_base, L->rope_ff,
                hp->rope_neox);
}

/* x [n, d] += y, then out = rmsnorm(x) * g: in one operation where the
 * backend has one (out may be y) */
static void add_norm(cb_backend *be, float *x, const float *y, const float *g, float *out,
                     int64_t n, int64_t d, float eps)
{
    const cb_backend_ops *o = be->ops;
    if (o->add_rmsnorm) {
        o->add_rmsnorm(be, x, y, g, out, n, d, eps);
        return;
    }
    o->add(be, x, y, n * d);
    o->rmsnorm(be, x, g, out, n, d, eps);
}

/* a layer's K and V rows k, v [n, width] into its cache at rows at[n] */
static void kv_write_layer(cb_backend *be, const cb_kvcache *kv, int32_t layer, const float *k,
                           const float *v, const int32_t *at, int32_t n)
{
    const cb_backend_ops *o = be->ops;
    if (o->kv_write_kv) {
        o->kv_write_kv(be, kv->k[layer], kv->v[layer], kv->type, kv->width, k, v, at, n);
    } else {
        o->kv_write(be, kv->k[layer], kv->type, kv->width, k, at, n);
        o->kv_write(be, kv->v[layer], kv->type, kv->width, v, at, n);
    }
}

/* The first step of a layer for `rows` (NULL: all): check the rows, note
 * their positions, gather them, normalize, and project the requested ones
 * of Q, K (both with RoPE) and V into f->q, f->k, f->v.  *x is the rows'
 * hidden state (f->xs when gathered); *n their count.  n_ctx > 0 also
 * checks the positions against a cache. */
static cb_status layer_qkv(cb_fwd *f, int32_t layer, const int32_t *rows, int32_t n_rows,
                           int32_t n_ctx, unsigned which, float **x, int32_t *n)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    const cb_backend_ops *o = m->be->ops;
    cb_backend *be = m->be;
    const cb_layer *L;

    *n = rows ? n_rows : f->n;
    if (layer < 0 || layer >= hp->n_layer || *n < 0 || *n > f->n)
        return CB_ERR_RANGE;
    if (which & QKV_Q)
        f->n_q = 0; /* until they are computed */
    for (int32_t i = 0; i < *n; i++) {
        int32_t r = rows ? rows[i] : i;
        if (r < 0 || r >= f->n || (n_ctx > 0 && f->pos[r] >= n_ctx))
            return CB_ERR_RANGE;
        f->sel_pos[i] = f->pos[r];
    }
    if (*n == 0)
        return CB_OK;
    L = &m->layers[layer];
    if (rows) {
        o->gather(be, f->x, rows, *n, hp->n_embd, f->xs);
        *x = f->xs;
    } else {
        *x = f->x;
    }
    o->rmsnorm(be, *x, L->attn_norm, f->xn, *n, hp->n_embd, hp->norm_eps);
    const cb_bweight *w[3];
    float *y[3];
    int nw = 0;
    if (which & QKV_Q)
        w[nw] = L->wq, y[nw++] = f->q;
    if (which & QKV_K)
        w[nw] = L->wk, y[nw++] = f->k;
    if (which & QKV_V)
        w[nw] = L->wv, y[nw++] = f->v;
    matmul_same_input(be, w, nw, f->xn, y, *n);
    if ((which & QKV_Q) && L->q_norm)
        o->rmsnorm(be, f->q, L->q_norm, f->q, (int64_t)*n * hp->n_head, hp->head_dim, hp->norm_eps);
    if ((which & QKV_K) && L->k_norm)
        o->rmsnorm(be, f->k, L->k_norm, f->k, (int64_t)*n * hp->n_head_kv, hp->head_dim,
                   hp->norm_eps);
    rope_qk(m, L, which & QKV_Q ? f->q : NULL, which & QKV_K ? f->k : NULL, f->sel_pos, *n);
    if (which & QKV_Q) {
        f->n_q = *n;
        memcpy(f->q_pos, f->sel_pos, sizeof(int32_t) * (size_t)*n);
    }
    return CB_OK;
}

cb_status cb_fwd_layer(cb_fwd *f, cb_kvcache *kv, int32_t layer, const int32_t *rows,
                       int32_t n_rows)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    const cb_backend_ops *o = m->be->ops;
    cb_backend *be = m->be;
    int64_t d = hp->n_embd;
    int32_t n;
    float *x = NULL;
    cb_status st;

    if (kv->m != m)
        return CB_ERR_RANGE;
    if ((st = layer_qkv(f, layer, rows, n_rows, kv->n_ctx, QKV_Q | QKV_K | QKV_V, &x, &n)) !=
            CB_OK ||
        n == 0)
        return st;
    const cb_layer *L = &m->layers[layer];

    /* attention block: this layer's K/V of the rows, then attention over the cache */
    cb_kvcache_after_loads(kv, layer);
    kv_write_layer(be, kv, layer, f->k, f->v, f->sel_pos, n);
    if ((st = kv_attention(be, kv, layer, f->q, f->sel_pos, n, f->att)) != CB_OK)
        return st;
    o->matmul(be, L->wo, f->att, f->xn, n);
    if (L->post_attn_norm)
        o->rmsnorm(be, f->xn, L->post_attn_norm, f->xn, n, d, hp->norm_eps);

    /* MLP block */
    add_norm(be, x, f->xn, L->ffn_norm, f->xn, n, d, hp->norm_eps);
    const cb_bweight *gu[2] = {L->wg, L->wu};
    float *gu_out[2] = {f->g, f->u};
    matmul_same_input(be, gu, 2, f->xn, gu_out, n);
    if (m->ffn_gelu)
        o->geglu(be, f->g, f->u, f->g, n * (int64_t)hp->n_ff);
    else
        o->swiglu(be, f->g, f->u, f->g, n * (int64_t)hp->n_ff);
    o->matmul(be, L->wd, f->g, f->xn, n);
    if (L->post_ffn_norm)
        o->rmsnorm(be, f->xn, L->post_ffn_norm, f->xn, n, d, hp->norm_eps);
    o->add(be, x, f->xn, n * d);

    if (rows)
        o->scatter(be, f->xs, rows, n, d, f->x);
    return cb_backend_status(be);
}

cb_status cb_fwd_layer_kv(cb_fwd *f, cb_kvcache *kv, int32_t layer, const int32_t *rows,
                          int32_t n_rows)
{
    cb_backend *be = f->m->be;
    int32_t n;
    float *x = NULL;
    cb_status st;

    if (kv->m != f->m)
        return CB_ERR_RANGE;
    if ((st = layer_qkv(f, layer, rows, n_rows, kv->n_ctx, QKV_K | QKV_V, &x, &n)) != CB_OK ||
        n == 0)
        return st;
    cb_kvcache_after_loads(kv, layer);
    kv_write_layer(be, kv, layer, f->k, f->v, f->sel_pos, n);
    return cb_backend_status(be);
}

cb_status cb_fwd_last_layer(cb_fwd *f, cb_kvcache *kv, const int32_t *rows, int32_t n_rows,
                            int32_t out_row)
{
    int32_t last = f->m->hp.n_layer - 1, n = rows ? n_rows : f->n;
    const int32_t *r = rows ? rows : f->seq;
    cb_status st;

    if (n < 1 || r[n - 1] != out_row) /* not the last of the rows: the whole layer for all */
        return cb_fwd_layer(f, kv, last, rows, n_rows);
    if ((st = cb_fwd_layer_kv(f, kv, last, r, n - 1)) != CB_OK)
        return st;
    return cb_fwd_layer(f, kv, last, &r[n - 1], 1);
}

cb_status cb_fwd_logits(cb_fwd *f, const int32_t *rows, int32_t n_rows, float *logits)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    cb_backend *be = m->be;
    int32_t n = rows ? n_rows : f->n;
    int64_t d = hp->n_embd;

    if (n < 0 || n > f->n)
        return CB_ERR_RANGE;
    for (int32_t i = 0; rows && i < n; i++)
        if (rows[i] < 0 || rows[i] >= f->n)
            return CB_ERR_RANGE;
    if (n == 0)
        return CB_OK;
    if (rows)
        be->ops->gather(be, f->x, rows, n, d, f->xs);
    be->ops->rmsnorm(be, rows ? f->xs : f->x, m->output_norm, f->xn, n, d, hp->norm_eps);
    int32_t chunk = logit_chunk(f);
    for (int32_t i = 0; i < n; i += chunk) {
        int32_t c = n - i < chunk ? n - i : chunk;
        be->ops->matmul(be, m->output ? m->output : m->tok_embd, f->xn + (int64_t)i * d, f->logits,
                        c);
        be->ops->download(be, logits + (int64_t)i * hp->n_vocab, f->logits,
                          sizeof(float) * (size_t)c * (size_t)hp->n_vocab);
    }
    return cb_backend_status(be);
}

cb_status cb_fwd_hidden(const cb_fwd *f, int32_t row, float *dst)
{
    const cb_model *m = f->m;
    if (row < 0 || row >= f->n)
        return CB_ERR_RANGE;
    m->be->ops->download(m->be, dst, f->x + (int64_t)row * m->hp.n_embd,
                         sizeof(float) * (size_t)m->hp.n_embd);
    return cb_backend_status(m->be);
}

cb_status cb_fwd_set_hidden(cb_fwd *f, int32_t row, const float *src)
{
    const cb_model *m = f->m;
    if (row < 0 || row >= f->n)
        return CB_ERR_RANGE;
    m->be->ops->upload(m->be, f->x + (int64_t)row * m->hp.n_embd, src,
                       sizeof(float) * (size_t)m->hp.n_embd);
    return cb_backend_status(m->be);
}

cb_status cb_model_eval(cb_fwd *f, cb_kvcache *kv, const int32_t *tokens, int32_t n, int32_t pos0,
                        float *logits)
{
    const cb_hparams *hp = &f->m->hp;
    int32_t *pos = f->eval_pos;

    if (n < 1 || pos0 < 0 || pos0 > kv->n_ctx - n)
        return CB_ERR_RANGE;
    for (int32_t done = 0; done < n;) {
        int32_t b = n - done < f->n_max ? n - done : f->n_max;
        for (int32_t i = 0; i < b; i++)
            pos[i] = pos0 + done + i;
        cb_status st = cb_fwd_embed(f, tokens + done, pos, b);
        for (int32_t l = 0; l < hp->n_layer - 1 && st == CB_OK; l++)
            st = cb_fwd_layer(f, kv, l, NULL, 0);
        /* the last layer: every row's K/V (later tokens attend to them), the
         * rest of it only for the row whose logits are wanted */
        if (st == CB_OK)
            st = done + b == n && logits ? cb_fwd_last_layer(f, kv, NULL, 0, b - 1)
                                         : cb_fwd_layer_kv(f, kv, hp->n_layer - 1, NULL, 0);
        if (st != CB_OK)
            return st;
        done += b;
        if (done == n && logits) {
            int32_t last = b - 1;
            if ((st = cb_fwd_logits(f, &last, 1, logits)) != CB_OK)
                return st;
        }
    }
    return CB_OK;
}

/* ------------------------------------------------------------- decoding
 *
 * One step of n independent sequences: a row each (token i at position
 * pos[i] of cache kv[i]), the products over every row at once (decoding
 * reads each weight once per step, whatever n), the attention of each row
 * over its own cache.  Every product runs on row-stable counts (backend.h:
 * multiples of the backend's rows_step, at most rows_max rows a call), so a
 * row's bits never depend on the other rows or on how many there are; the
 * rows past the n sequences (at most rows_step - 1) pad the count and are
 * copies of row 0 whose attention output is zero and whose K/V goes
 * nowhere.  A backend that declares rows_unstable runs each sequence in a
 * step of its own (one row, no padding). */

_Static_assert(FWD_LOGIT_ROWS % CB_ROWS_STEP == 0 && FWD_LOGIT_ROWS <= CB_ROWS_MAX,
               "the logits' products must be row-stable counts");

int32_t cb_fwd_decode_rows(const cb_model *m, int32_t n)
{
    if (n < 1)
        return 0;
    if (m->be->ops->rows_unstable)
        return 1;
    int step = m->be->rows_step > 0 ? m->be->rows_step : CB_ROWS_STEP;
    return (n + step - 1) / step * step;
}

/* y[k] [rows, n_out[k]] = x [rows, n_in] . w[k]^T, in products of at most
 * the backend's rows_max rows (rows is a multiple of its rows_step, so every
 * piece is: rows_max is one) */
static void decode_products(cb_backend *be, const cb_bweight *const *w, int nw, const float *x,
                            int64_t n_in, float *const *y, const int64_t *n_out, int64_t rows)
{
    int64_t most = be->rows_max > 0 ? be->rows_max : CB_ROWS_MAX;
    for (int64_t r = 0; r < rows; r += most) {
        int64_t c = rows - r < most ? rows - r : most;
        float *yr[3];
        for (int k = 0; k < nw; k++)
            yr[k] = y[k] + r * n_out[k];
        matmul_same_input(be, w, nw, x + r * n_in, yr, c);
    }
}

/* Attention of rows 0..n-1, each over its own cache, their K/V written
 * first (after the cache's loads unless `waited`: a recorded step waits
 * for them before it begins); the padding rows' outputs are zero.  The
 * first error of a bias. */
static cb_status decode_attention(cb_fwd *f, cb_kvcache *const *kv, const int32_t *pos, int32_t n,
                                  int32_t rows, int32_t layer, int waited)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    const cb_backend_ops *o = m->be->ops;
    cb_backend *be = m->be;
    int64_t dq = (int64_t)hp->n_head * hp->head_dim, dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    for (int32_t i = 0; i < n; i++) {
        const cb_kvcache *c = kv[i];
        if (!waited)
            cb_kvcache_after_loads(c, layer);
        kv_write_layer(be, c, layer, f->k + i * dkv, f->v + i * dkv, &pos[i], 1);
        cb_status st = kv_attention(be, c, layer, f->q + i * dq, &pos[i], 1, f->att + i * dq);
        if (st != CB_OK)
            return st;
    }
    for (int32_t i = n; i < rows; i++)
        o->upload(be, f->att + i * dq, f->zero_row, sizeof(float) * (size_t)dq);
    return CB_OK;
}

/* One layer of a decode step on rows 0..rows-1 (f->pos their positions). */
static cb_status decode_layer(cb_fwd *f, cb_kvcache *const *kv, const int32_t *pos, int32_t n,
                              int32_t rows, int32_t l, int waited)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    const cb_backend_ops *o = m->be->ops;
    cb_backend *be = m->be;
    const cb_layer *L = &m->layers[l];
    int64_t d = hp->n_embd, dq = (int64_t)hp->n_head * hp->head_dim,
            dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t ff = hp->n_ff;

    if (l == 0) /* (a later layer's came with the last one's residual) */
        o->rmsnorm(be, f->x, L->attn_norm, f->xn, rows, d, hp->norm_eps);
    const cb_bweight *qkv[3] = {L->wq, L->wk, L->wv};
    float *qkv_out[3] = {f->q, f->k, f->v};
    decode_products(be, qkv, 3, f->xn, d, qkv_out, (const int64_t[]){dq, dkv, dkv}, rows);
    if (L->q_norm)
        o->rmsnorm(be, f->q, L->q_norm, f->q, (int64_t)rows * hp->n_head, hp->head_dim,
                   hp->norm_eps);
    if (L->k_norm)
        o->rmsnorm(be, f->k, L->k_norm, f->k, (int64_t)rows * hp->n_head_kv, hp->head_dim,
                   hp->norm_eps);
    rope_qk(m, L, f->q, f->k, f->pos, rows);
    cb_status st = decode_attention(f, kv, pos, n, rows, l, waited);
    if (st != CB_OK)
        return st;
    const cb_bweight *wo[1] = {L->wo}, *wd[1] = {L->wd};
    decode_products(be, wo, 1, f->att, dq, &f->xn, &d, rows);
    if (L->post_attn_norm)
        o->rmsnorm(be, f->xn, L->post_attn_norm, f->xn, rows, d, hp->norm_eps);
    add_norm(be, f->x, f->xn, L->ffn_norm, f->xn, rows, d, hp->norm_eps);

    const cb_bweight *gu[2] = {L->wg, L->wu};
    float *gu_out[2] = {f->g, f->u};
    decode_products(be, gu, 2, f->xn, d, gu_out, (const int64_t[]){ff, ff}, rows);
    if (m->ffn_gelu)
        o->geglu(be, f->g, f->u, f->g, rows * ff);
    else
        o->swiglu(be, f->g, f->u, f->g, rows * ff);
    decode_products(be, wd, 1, f->g, ff, &f->xn, &d, rows);
    if (L->post_ffn_norm)
        o->rmsnorm(be, f->xn, L->post_ffn_norm, f->xn, rows, d, hp->norm_eps);
    /* the residual, and the next layer's input norm (after the last, the
     * output norm): f->xn as the next layer and the output head take it */
    const float *g_next = l + 1 < hp->n_layer ? m->layers[l + 1].attn_norm : m->output_norm;
    add_norm(be, f->x, f->xn, g_next, f->xn, rows, d, hp->norm_eps);
    return CB_OK;
}

/* A decode step's work up to its first chunk of logits, queued: the
 * embedding (f->eval_tok, f->eval_pos), every layer, and the logits of the
 * first logit_chunk rows in f->logits.  What a recorded step records. */
static cb_status decode_queue(cb_fwd *f, cb_kvcache *const *kv, const int32_t *pos, int32_t n,
                              int32_t rows, int waited)
{
    const cb_model *m = f->m;
    cb_backend *be = m->be;
    int32_t c = rows < logit_chunk(f) ? rows : logit_chunk(f);
    cb_status st;

    if ((st = cb_fwd_embed(f, f->eval_tok, f->eval_pos, rows)) != CB_OK)
        return st;
    for (int32_t l = 0; l < m->hp.n_layer; l++)
        if ((st = decode_layer(f, kv, pos, n, rows, l, waited)) != CB_OK)
            return st;
    /* (f->xn: the last layer normalized its output) */
    be->ops->matmul(be, m->output ? m->output : m->tok_embd, f->xn, f->logits, c);
    return CB_OK;
}

/* A decode step of sequences 0..n-1 on `rows` rows (n real, the rest
 * padding); logits [n, n_vocab].  On a backend with graphs (backend.h) the
 * step is recorded and replayed: a step's hundreds of operations queued at
 * the cost of one, the graph updated with the step's own values.  The
 * caches' loads are waited for first (no event while recording), and when
 * the recording fails the step is queued again, as on any backend. */
static cb_status decode_step(cb_fwd *f, cb_kvcache *const *kv, const int32_t *tokens,
                             const int32_t *pos, int32_t n, int32_t rows, float *logits)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    cb_backend *be = m->be;
    const cb_backend_ops *o = be->ops;
    int64_t d = hp->n_embd;
    int32_t chunk = logit_chunk(f);
    cb_status st;

    for (int32_t i = 0; i < rows; i++) {
        f->eval_tok[i] = tokens[i < n ? i : 0];
        f->eval_pos[i] = pos[i < n ? i : 0];
    }
    f->n_q = 0; /* the queries of these rows are no layer's to inspect */
    int graph = 0;
    if (o->graph_begin) {
        for (int32_t i = 0; i < n; i++)
            for (int32_t l = 0; l < hp->n_layer; l++)
                cb_kvcache_after_loads(kv[i], l);
        graph = o->graph_begin(be, rows);
    }
    st = decode_queue(f, kv, pos, n, rows, o->graph_begin != NULL); /* (loads waited for) */
    if (graph && !o->graph_end(be, st == CB_OK) && st == CB_OK)
        st = decode_queue(f, kv, pos, n, rows, 1); /* not recorded: queued as it is */
    if (st != CB_OK)
        return st;
    if ((st = cb_backend_status(be)) != CB_OK) /* a fault: the rest would do nothing */
        return st;
    for (int32_t r = 0; r < rows && r < n; r += chunk) {
        int32_t c = rows - r < chunk ? rows - r : chunk, keep = n - r < c ? n - r : c;
        if (r > 0) /* (the first chunk's came with the layers) */
            o->matmul(be, m->output ? m->output : m->tok_embd, f->xn + (int64_t)r * d, f->logits,
                      c);
        o->download(be, logits + (int64_t)r * hp->n_vocab, f->logits,
                    sizeof(float) * (size_t)keep * (size_t)hp->n_vocab);
    }
    return cb_backend_status(be);
}

cb_status cb_fwd_decode(cb_fwd *f, cb_kvcache *const *kv, const int32_t *tokens, const int32_t *pos,
                        int32_t n, float *logits)
{
    const cb_model *m = f->m;
    int32_t rows = cb_fwd_decode_rows(m, n);
    cb_status st;

    if (n < 1 || rows > f->n_max)
        return CB_ERR_INVALID;
    for (int32_t i = 0; i < n; i++) {
        if (kv[i]->m != m || pos[i] < 0 || pos[i] >= kv[i]->n_ctx)
            return CB_ERR_RANGE;
        for (int32_t j = 0; j < i; j++)
            if (kv[j] == kv[i])
                return CB_ERR_INVALID;
    }
    if (!m->be->ops->rows_unstable)
        return decode_step(f, kv, tokens, pos, n, rows, logits);
    for (int32_t i = 0; i < n; i++) /* a step of its own for each */
        if ((st = decode_step(f, &kv[i], &tokens[i], &pos[i], 1, 1,
                              logits + (int64_t)i * m->hp.n_vocab)) != CB_OK)
            return st;
    return CB_OK;
}

const cb_model *cb_fwd_model(const cb_fwd *f) { return f->m; }

cb_status cb_fwd_layer_qkv(cb_fwd *f, int32_t layer, const int32_t *rows, int32_t n_rows, float *q,
                           float *k, float *v)
{
    const cb_hparams *hp = &f->m->hp;
    cb_backend *be = f->m->be;
    int64_t dq = (int64_t)hp->n_head * hp->head_dim, dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    unsigned which = (q ? QKV_Q : 0) | (k ? QKV_K : 0) | (v ? QKV_V : 0);
    int32_t n;
    float *x;
    cb_status st = layer_qkv(f, layer, rows, n_rows, 0, which, &x, &n);
    if (st != CB_OK || n == 0)
        return st;
    if (q)
        be->ops->download(be, q, f->q, sizeof(float) * (size_t)(n * dq));
    if (k)
        be->ops->download(be, k, f->k, sizeof(float) * (size_t)(n * dkv));
    if (v)
        be->ops->download(be, v, f->v, sizeof(float) * (size_t)(n * dkv));
    return cb_backend_status(be);
}

cb_status cb_fwd_layer_queries(const cb_fwd *f, int32_t from, int32_t n, float *q)
{
    const cb_hparams *hp = &f->m->hp;
    int64_t dq = (int64_t)hp->n_head * hp->head_dim;
    if (from < 0 || n < 0 || from > f->n_q - n)
        return CB_ERR_RANGE;
    f->m->be->ops->download(f->m->be, q, f->q + from * dq, sizeof(float) * (size_t)(n * dq));
    return cb_backend_status(f->m->be);
}

/* cb_fwd_attn_mass's work: the checks, then the layer's mass added into
 * dm (backend memory [n_keys]) */
static cb_status mass_into(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int32_t from, int32_t n,
                           int32_t n_keys, int by_value, float *dm)
{
    const cb_model *m = f->m;
    const cb_hparams *hp = &m->hp;
    int64_t dq = (int64_t)hp->n_head * hp->head_dim;

    if (kv->m != m || layer < 0 || layer >= hp->n_layer || from < 0 || n < 0 || from > f->n_q - n ||
        n_keys < 1 || n_keys > kv->n_ctx)
        return CB_ERR_RANGE;
    for (int32_t i = 0; i < n; i++)
        if (f->q_pos[from + i] >= n_keys)
            return CB_ERR_RANGE;
    if (n == 0)
        return CB_OK;
    cb_kvcache_after_loads(kv, layer);
    return cb_backend_attn_mass(m->be, f->q + from * dq, f->q_pos + from, n, kv->k[layer],
                                by_value ? kv->v[layer] : NULL, kv->type, n_keys, hp->n_head,
                                hp->n_head_kv, hp->head_dim, m->attn_scale, m->layers[layer].window,
                                dm);
}

cb_status cb_fwd_attn_mass(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int32_t from, int32_t n,
                           int32_t n_keys, int by_value, float *mass)
{
    cb_backend *be = f->m->be;
    if (n == 0 || n_keys < 1) /* (checked, nothing to add) */
        return mass_into(f, kv, layer, from, n, n_keys, by_value, NULL);
    size_t bytes = sizeof(float) * (size_t)n_keys;
    float *dm = be_tmp(be, bytes);
    if (!dm)
        return cb_backend_nomem(be);
    be->ops->upload(be, dm, mass, bytes);
    cb_status st = mass_into(f, kv, layer, from, n, n_keys, by_value, dm);
    if (st == CB_OK)
        be->ops->download(be, mass, dm, bytes);
    be->ops->dealloc(be, dm);
    return st != CB_OK ? st : cb_backend_status(be);
}

cb_status cb_fwd_mass_begin(cb_fwd *f, int32_t n_keys, int by_value)
{
    cb_backend *be = f->m->be;
    float *zero;
    if (f->mass || n_keys < 1)
        return f->mass ? CB_ERR_INVALID : CB_ERR_RANGE;
    if (!(zero = calloc((size_t)n_keys, sizeof *zero)))
        return CB_ERR_NOMEM;
    if ((f->mass = be_tmp(be, sizeof(float) * (size_t)n_keys)))
        be->ops->upload(be, f->mass, zero, sizeof(float) * (size_t)n_keys);
    free(zero);
    f->mass_keys = n_keys;
    f->mass_v = by_value != 0;
    return f->mass ? cb_backend_status(be) : cb_backend_nomem(be);
}

cb_status cb_fwd_mass_add(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int32_t from, int32_t n)
{
    if (!f->mass)
        return CB_ERR_INVALID;
    cb_status st = mass_into(f, kv, layer, from, n, f->mass_keys, f->mass_v, f->mass);
    return st != CB_OK ? st : cb_backend_status(f->m->be);
}

cb_status cb_fwd_mass_end(cb_fwd *f, float *mass)
{
    cb_backend *be = f->m->be;
    if (!f->mass)
        return mass ? CB_ERR_INVALID : CB_OK;
    if (mass)
        be->ops->download(be, mass, f->mass, sizeof(float) * (size_t)f->mass_keys);
    be->ops->dealloc(be, f->mass);
    f->mass = NULL;
    return cb_backend_status(be);
}

cb_status cb_fwd_deviation(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int which,
                           const int32_t *rows, int32_t n_rows, int32_t k, int32_t *top)
{
    const cb_model *m = f->m;
    cb_backend *be = m->be;
    int32_t n;
    float *x, *dev;
    cb_status st;

    if (kv->m != m || (which != 0 && which != 1) || !rows || k < 0 || k > n_rows)
        return CB_ERR_RANGE;
    st = layer_qkv(f, layer, rows, n_rows, kv->n_ctx, which ? QKV_V : QKV_K, &x, &n);
    if (st != CB_OK || n == 0 || k == 0)
        return st;
    dev = f->dev;
    cb_kvcache_after_loads(kv, layer);
    be->ops->deviation(be, which ? f->v : f->k, which ? kv->v[layer] : kv->k[layer], kv->type,
                       kv->width, f->sel_pos, n, dev);
    be->ops->topk(be, dev, n, k, top);
    if ((st = cb_backend_status(be)) != CB_OK) /* top holds no indices */
        return st;
    for (int32_t i = 0; i < k; i++) /* indices into rows -> rows */
        top[i] = rows[top[i]];
    return CB_OK;
}
