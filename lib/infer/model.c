/* model.c - load a GGUF model (hyperparameters, tokenizer, weights) onto a
 * compute backend.  Architectures: the llama family and qwen2. */
#include "model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cb_status hp_int(const cb_gguf *g, const char *path, const char *arch, const char *key, int32_t *out,
                        int required, cb_error *err)
{
    char k[128];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (cb_gguf_get_int(g, cb_gguf_find_key(g, k), &v) != CB_OK) {
        if (!required)
            return CB_OK;
        return cb_error_set(err, CB_ERR_FORMAT, "%s: missing or non-integer metadata '%s'", path, k);
    }
    if (v <= 0 || v > (1 << 30))
        return cb_error_set(err, CB_ERR_FORMAT, "%s: metadata '%s' = %lld is out of range", path, k, (long long)v);
    *out = (int32_t)v;
    return CB_OK;
}

/* Look up a tensor, check its shape {ne0, ne1} and upload it as a weight
 * matrix (or, when ne1 == 0, a 1-D f32 vector into *vec). */
static cb_status load_tensor(cb_model *m, const char *path, const char *name, int64_t ne0, int64_t ne1,
                             int optional, cb_bweight **w, float **vec, cb_error *err)
{
    int64_t i = cb_gguf_find_tensor(m->gguf, name);
    cb_tensor_info ti;
    if (i < 0) {
        if (optional)
            return CB_OK;
        return cb_error_set(err, CB_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    }
    cb_gguf_tensor(m->gguf, i, &ti);
    int64_t want1 = ne1 ? ne1 : 1;
    if (ti.ne[0] != ne0 || ti.ne[1] != want1 || ti.ne[2] != 1 || ti.ne[3] != 1)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", path,
                            name, (long long)ti.ne[0], (long long)ti.ne[1], (long long)ne0, (long long)want1);
    if (!cb_type_is_supported(ti.type))
        return cb_error_set(err, CB_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which is not supported", path,
                            name, cb_type_name(ti.type) ? cb_type_name(ti.type) : "?");
    if (w) {
        *w = m->be->ops->weight_new(m->be, ti.type, ne0, want1, ti.data, NULL);
        if (!*w)
            return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory loading '%s'", path, name);
        return CB_OK;
    }
    /* vectors (norm weights, biases): f32 on the host first */
    float *host = malloc(sizeof(float) * (size_t)(ne0 * want1));
    if (!host)
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    cb_dequant_row(ti.type, ti.data, host, ne0 * want1);
    *vec = host;
    return CB_OK;
}

/* Upload a host vector into backend memory (and free the host copy). */
static float *to_backend(cb_model *m, float *host, int64_t n)
{
    float *d;
    if (!host)
        return NULL;
    d = m->be->ops->alloc(m->be, sizeof(float) * (size_t)n);
    if (d)
        m->be->ops->upload(m->be, d, host, sizeof(float) * (size_t)n);
    free(host);
    return d;
}

/* Load a projection with an optional bias (biases are folded into the
 * backend weight so that matmul adds them). */
static cb_status load_proj(cb_model *m, const char *path, int l, const char *what, int64_t n_in, int64_t n_out,
                           cb_bweight **w, cb_error *err)
{
    char name[96], bname[96];
    int64_t i, bi;
    cb_tensor_info ti, bt;
    float *bias = NULL;
    cb_status st;

    snprintf(name, sizeof name, "blk.%d.%s.weight", l, what);
    snprintf(bname, sizeof bname, "blk.%d.%s.bias", l, what);
    bi = cb_gguf_find_tensor(m->gguf, bname);
    if (bi < 0)
        return load_tensor(m, path, name, n_in, n_out, 0, w, NULL, err);
    if ((st = load_tensor(m, path, bname, n_out, 0, 0, NULL, &bias, err)) != CB_OK)
        return st;
    i = cb_gguf_find_tensor(m->gguf, name);
    if (i < 0) {
        free(bias);
        return cb_error_set(err, CB_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
    }
    cb_gguf_tensor(m->gguf, i, &ti);
    cb_gguf_tensor(m->gguf, bi, &bt);
    if (ti.ne[0] != n_in || ti.ne[1] != n_out || !cb_type_is_supported(ti.type)) {
        free(bias);
        return cb_error_set(err, CB_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] type %s, expected [%lld, %lld]",
                            path, name, (long long)ti.ne[0], (long long)ti.ne[1],
                            cb_type_name(ti.type) ? cb_type_name(ti.type) : "?", (long long)n_in, (long long)n_out);
    }
    *w = m->be->ops->weight_new(m->be, ti.type, n_in, n_out, ti.data, bias);
    free(bias);
    return *w ? CB_OK : cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory loading '%s'", path, name);
}

cb_status cb_model_load(cb_model **out, const char *path, const cb_model_params *p, cb_error *err)
{
    cb_model *m = calloc(1, sizeof *m);
    cb_hparams *hp;
    cb_status st;
    char name[96];

    if (!m)
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    hp = &m->hp;
    if ((st = cb_gguf_open(&m->gguf, path, err)) != CB_OK)
        goto fail;
    cb_strview arch = cb_gguf_str(m->gguf, "general.architecture");
    if (!arch.data) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: no general.architecture: not a model file", path);
        goto fail;
    }
    if (!cb_strview_eq(arch, "llama") && !cb_strview_eq(arch, "qwen2")) {
        st = cb_error_set(err, CB_ERR_UNSUPPORTED,
                          "%s: architecture '%.*s' is not supported (supported: llama, qwen2)", path,
                          (int)(arch.len > 40 ? 40 : arch.len), arch.data);
        goto fail;
    }
    snprintf(hp->arch, sizeof hp->arch, "%.*s", (int)arch.len, arch.data);
    if ((st = hp_int(m->gguf, path, hp->arch, "block_count", &hp->n_layer, 1, err)) ||
        (st = hp_int(m->gguf, path, hp->arch, "embedding_length", &hp->n_embd, 1, err)) ||
        (st = hp_int(m->gguf, path, hp->arch, "feed_forward_length", &hp->n_ff, 1, err)) ||
        (st = hp_int(m->gguf, path, hp->arch, "attention.head_count", &hp->n_head, 1, err)))
        goto fail;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    if ((st = hp_int(m->gguf, path, hp->arch, "attention.head_count_kv", &hp->n_head_kv, 0, err)) ||
        (st = hp_int(m->gguf, path, hp->arch, "context_length", &hp->n_ctx_train, 0, err)))
        goto fail;
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((st = hp_int(m->gguf, path, hp->arch, "attention.key_length", &hp->head_dim, 0, err)))
        goto fail;
    hp->n_rot = hp->head_dim;
    if ((st = hp_int(m->gguf, path, hp->arch, "rope.dimension_count", &hp->n_rot, 0, err)))
        goto fail;
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 ||
        hp->n_rot > 1024) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: inconsistent attention shape (%d heads, %d KV heads, head %d, rot %d)",
                          path, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot);
        goto fail;
    }
    {
        char k[128];
        snprintf(k, sizeof k, "%s.rope.freq_base", hp->arch);
        hp->rope_base = (float)cb_gguf_float_or(m->gguf, k, 10000.0);
        snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", hp->arch);
        hp->norm_eps = (float)cb_gguf_float_or(m->gguf, k, 1e-5);
    }
    hp->rope_neox = strcmp(hp->arch, "qwen2") == 0;

    if ((st = cb_vocab_load(&m->vocab, m->gguf, err)) != CB_OK)
        goto fail;
    hp->n_vocab = cb_vocab_n_tokens(m->vocab);
    if ((st = cb_gguf_fingerprint(m->gguf, &m->fingerprint)) != CB_OK) {
        st = cb_error_set(err, st, "%s: out of memory", path);
        goto fail;
    }

    if ((st = cb_backend_open(&m->be, p ? p->device : NULL, p ? p->n_threads : 0, err)) != CB_OK)
        goto fail;
    if (m->be->ops->max_head_dim && hp->head_dim > m->be->ops->max_head_dim) {
        st = cb_error_set(err, CB_ERR_UNSUPPORTED, "%s: head dimension %d is more than the %s backend handles (%d)",
                          path, hp->head_dim, m->be->ops->name, m->be->ops->max_head_dim);
        goto fail;
    }
    int64_t d = hp->n_embd, dq = (int64_t)hp->n_head * hp->head_dim, dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    float *host = NULL;
    if ((st = load_tensor(m, path, "token_embd.weight", d, hp->n_vocab, 0, &m->tok_embd, NULL, err)))
        goto fail;
    if ((st = load_tensor(m, path, "output_norm.weight", d, 0, 0, NULL, &host, err)))
        goto fail;
    if (!(m->output_norm = to_backend(m, host, d)))
        goto oom;
    if ((st = load_tensor(m, path, "output.weight", d, hp->n_vocab, 1, &m->output, NULL, err)))
        goto fail;
    hp->tied_output = m->output == NULL;
    /* every layer has tensors: a count the file cannot hold is malformed
     * (it would size the layer table: 10^9 layers in a 20 KB file) */
    if (hp->n_layer > cb_gguf_n_tensors(m->gguf)) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: block_count %d, but the file holds %lld tensors", path,
                          hp->n_layer, (long long)cb_gguf_n_tensors(m->gguf));
        goto fail;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        st = cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        cb_layer *L = &m->layers[l];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = load_tensor(m, path, name, d, 0, 0, NULL, &host, err)))
            goto fail;
        if (!(L->attn_norm = to_backend(m, host, d)))
            goto oom;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = load_tensor(m, path, name, d, 0, 0, NULL, &host, err)))
            goto fail;
        if (!(L->ffn_norm = to_backend(m, host, d)))
            goto oom;
        if ((st = load_proj(m, path, l, "attn_q", d, dq, &L->wq, err)) ||
            (st = load_proj(m, path, l, "attn_k", d, dkv, &L->wk, err)) ||
            (st = load_proj(m, path, l, "attn_v", d, dkv, &L->wv, err)) ||
            (st = load_proj(m, path, l, "attn_output", dq, d, &L->wo, err)) ||
            (st = load_proj(m, path, l, "ffn_gate", d, hp->n_ff, &L->wg, err)) ||
            (st = load_proj(m, path, l, "ffn_up", d, hp->n_ff, &L->wu, err)) ||
            (st = load_proj(m, path, l, "ffn_down", hp->n_ff, d, &L->wd, err)))
            goto fail;
    }
    *out = m;
    return CB_OK;
oom:
    st = cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
fail:
    cb_model_free(m);
    return st;
}

void cb_model_free(cb_model *m)
{
    if (!m)
        return;
    if (m->be) {
        const cb_backend_ops *o = m->be->ops;
        if (m->layers) {
            for (int l = 0; l < m->hp.n_layer; l++) {
                cb_layer *L = &m->layers[l];
                o->dealloc(m->be, L->attn_norm);
                o->dealloc(m->be, L->ffn_norm);
                o->weight_free(m->be, L->wq);
                o->weight_free(m->be, L->wk);
                o->weight_free(m->be, L->wv);
                o->weight_free(m->be, L->wo);
                o->weight_free(m->be, L->wg);
                o->weight_free(m->be, L->wu);
                o->weight_free(m->be, L->wd);
            }
        }
        o->weight_free(m->be, m->tok_embd);
        o->weight_free(m->be, m->output);
        o->dealloc(m->be, m->output_norm);
        o->free(m->be);
    }
    free(m->layers);
    cb_vocab_free(m->vocab);
    cb_gguf_free(m->gguf);
    free(m);
}

const cb_hparams *cb_model_hparams(const cb_model *m) { return &m->hp; }
const cb_vocab *cb_model_vocab(const cb_model *m) { return m->vocab; }
const cb_gguf *cb_model_gguf(const cb_model *m) { return m->gguf; }
const char *cb_model_backend(const cb_model *m) { return m->be->ops->name; }
const char *cb_model_device(const cb_model *m) { return m->be->desc[0] ? m->be->desc : m->be->ops->name; }
cb_hash128 cb_model_fingerprint(const cb_model *m) { return m->fingerprint; }

void cb_model_sync(const cb_model *m)
{
    if (m->be->ops->sync)
        m->be->ops->sync(m->be);
}
