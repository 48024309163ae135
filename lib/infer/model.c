/* model.c - load a GGUF model (hyperparameters, tokenizer, weights) onto a
 * compute backend.  Architectures: the llama family, qwen2, qwen3, gemma3.
 * What each one computes follows llama.cpp's graph for it (src/models/):
 *
 *   llama   RMSNorm, normal RoPE pairs, SwiGLU; rope_freqs.weight (Llama 3.x
 *           RoPE scaling) divides the frequencies of every layer
 *   qwen2   llama with Q/K/V biases and NEOX pairs
 *   qwen3   NEOX pairs, per-head RMSNorm of Q and K before RoPE, no biases
 *   gemma3  embeddings x sqrt(n_embd); Q/K norms as qwen3; RMSNorm of the
 *           attention output and of the MLP output before each residual add;
 *           GELU (tanh) gated MLP; every 6th layer (5, 11, 17, ...) global,
 *           the others sliding-window (attention.sliding_window) with their
 *           own RoPE base (10000 unless rope.freq_base_swa); scores scaled by
 *           1/sqrt(key_length) (the 62-layer 27B: 1/sqrt(n_embd/n_head)); no
 *           final softcapping.  GGUF norm weights already hold gemma's
 *           (1 + w): llama.cpp's converter adds the 1.
 *
 * RoPE scaling: rope.scaling.factor (or the older rope.scale_linear) divides
 * the frequencies of the global layers, as llama.cpp does whatever the type
 * says, for types none and linear; yarn, longrope and anything else are
 * refused by name. */
#include "model_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cb_status hp_int(const cb_gguf *g, const char *path, const char *arch, const char *key,
                        int32_t *out, int required, cb_error *err)
{
    char k[128];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (cb_gguf_get_int(g, cb_gguf_find_key(g, k), &v) != CB_OK) {
        if (!required)
            return CB_OK;
        return cb_error_set(err, CB_ERR_FORMAT, "%s: missing or non-integer metadata '%s'", path,
                            k);
    }
    if (v <= 0 || v > (1 << 30))
        return cb_error_set(err, CB_ERR_FORMAT, "%s: metadata '%s' = %lld is out of range", path, k,
                            (long long)v);
    *out = (int32_t)v;
    return CB_OK;
}

/* An allocating backend operation returned NULL while loading `name`
 * (NULL: a vector): the backend's fault, or out of memory. */
static cb_status load_failed(const cb_model *m, const char *path, const char *name, cb_error *err)
{
    cb_status st = cb_backend_nomem(m->be);
    if (st != CB_ERR_NOMEM)
        return cb_error_set(err, st, "%s: %s", path, m->be->fault_msg);
    if (name)
        return cb_error_set(err, st, "%s: out of memory loading '%s'", path, name);
    return cb_error_set(err, st, "%s: out of memory", path);
}

/* Look up a tensor, check its shape {ne0, ne1} and upload it as a weight
 * matrix (or, when ne1 == 0, a 1-D f32 vector into *vec). */
static cb_status load_tensor(cb_model *m, const char *path, const char *name, int64_t ne0,
                             int64_t ne1, int optional, cb_bweight **w, float **vec, cb_error *err)
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
        return cb_error_set(
            err, CB_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
            path, name, (long long)ti.ne[0], (long long)ti.ne[1], (long long)ne0, (long long)want1);
    if (!cb_type_is_supported(ti.type))
        return cb_error_set(err, CB_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has type %s, which is not supported", path, name,
                            cb_type_name(ti.type) ? cb_type_name(ti.type) : "?");
    if (w) {
        *w = m->be->ops->weight_new(m->be, ti.type, ne0, want1, ti.data, NULL);
        return *w ? CB_OK : load_failed(m, path, name, err);
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
static cb_status load_proj(cb_model *m, const char *path, int l, const char *what, int64_t n_in,
                           int64_t n_out, cb_bweight **w, cb_error *err)
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
        return cb_error_set(err, CB_ERR_FORMAT,
                            "%s: tensor '%s' has shape [%lld, %lld] type %s, expected [%lld, %lld]",
                            path, name, (long long)ti.ne[0], (long long)ti.ne[1],
                            cb_type_name(ti.type) ? cb_type_name(ti.type) : "?", (long long)n_in,
                            (long long)n_out);
    }
    *w = m->be->ops->weight_new(m->be, ti.type, n_in, n_out, ti.data, bias);
    free(bias);
    return *w ? CB_OK : load_failed(m, path, name, err);
}

static const struct arch_desc {
    const char *name;
    int rope_neox;  /* NEOX RoPE pairs */
    int qk_norm;    /* per-head RMSNorm of Q and K (attn_q_norm, attn_k_norm) */
    int post_norms; /* post_attention_norm, post_ffw_norm */
    int gelu;       /* GELU gated MLP, else SwiGLU */
    int embd_scale; /* embeddings x sqrt(n_embd) */
    int swa_period; /* every swa_period-th layer global, the others sliding-window; 0: none */
    int rope_freqs; /* reads rope_freqs.weight */
    /* The blend's defaults for the architecture, measured on MuSiQue
     * (EVAL.md; 1 where nothing measured held out of sample): the cached
     * keys' temperature (gemma3: Gemma-3-270M's first-token KL lower on 45
     * of 50 questions), and the stale scale of probe's blends (qwen2:
     * Qwen2.5-Coder-0.5B and 1.5B, KL lower, F1 kept or better). */
    float key_temp, stale_scale;
} arches[] = {
    {"llama", 0, 0, 0, 0, 0, 0, 1, 1.0f, 1.0f},
    {"qwen2", 1, 0, 0, 0, 0, 0, 0, 1.0f, 0.35f},
    {"qwen3", 1, 1, 0, 0, 0, 0, 0, 1.0f, 1.0f},
    {"gemma3", 1, 1, 1, 1, 1, 6, 0, 1.05f, 1.0f},
};

/* The RoPE scaling metadata: the linear factor (1 when none), or an error
 * naming a type we do not compute. */
static cb_status rope_scaling(const cb_gguf *g, const char *path, const char *arch, float *factor,
                              cb_error *err)
{
    char k[128];
    cb_strview type;
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    type = cb_gguf_str(g, k);
    if (type.data && !cb_strview_eq(type, "none") && !cb_strview_eq(type, "linear"))
        return cb_error_set(
            err, CB_ERR_UNSUPPORTED,
            "%s: RoPE scaling type '%.*s' is not supported (supported: none, linear, and "
            "Llama 3's rope_freqs)",
            path, (int)(type.len > 40 ? 40 : type.len), type.data);
    if (!type.data && cb_gguf_find_key(g, k) >= 0)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: metadata '%s' is not a string", path, k);
    snprintf(k, sizeof k, "%s.rope.scaling.factor", arch);
    double f = cb_gguf_float_or(g, k, 0.0);
    if (f == 0.0) {
        snprintf(k, sizeof k, "%s.rope.scale_linear", arch);
        f = cb_gguf_float_or(g, k, 0.0);
    }
    if (f != 0.0 && !(f > 0.0 && f < 1e6))
        return cb_error_set(err, CB_ERR_FORMAT, "%s: RoPE scaling factor %g is out of range", path,
                            f);
    *factor = f == 0.0 ? 1.0f : (float)f;
    return CB_OK;
}

/* Which layers are sliding-window: attention.sliding_window_pattern, a
 * period (every period-th layer global) or a per-layer array of booleans
 * (true: sliding window), else the architecture's period. */
static cb_status swa_layers(const cb_gguf *g, const char *path, const char *arch, int period,
                            int32_t n_layer, int32_t n_swa, cb_layer *layers, cb_error *err)
{
    char k[128];
    int64_t i, v;
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", arch);
    i = cb_gguf_find_key(g, k);
    if (i >= 0 && cb_gguf_kv_type(g, i) == CB_GGUF_ARRAY) {
        if (cb_gguf_arr_len(g, i) != (uint64_t)n_layer)
            return cb_error_set(err, CB_ERR_FORMAT, "%s: '%s' has %llu entries for %d layers", path,
                                k, (unsigned long long)cb_gguf_arr_len(g, i), n_layer);
        for (int32_t l = 0; l < n_layer; l++) {
            if (cb_gguf_arr_get_int(g, i, (uint64_t)l, &v) != CB_OK)
                return cb_error_set(err, CB_ERR_FORMAT, "%s: '%s' is not an array of booleans",
                                    path, k);
            layers[l].window = v ? n_swa : 0;
        }
        return CB_OK;
    }
    if (i >= 0) {
        if (cb_gguf_get_int(g, i, &v) != CB_OK || v < 0 || v > n_layer + 1)
            return cb_error_set(err, CB_ERR_FORMAT, "%s: metadata '%s' is out of range", path, k);
        period = (int)v;
    }
    for (int32_t l = 0; l < n_layer;
         l++) /* llama.cpp's set_swa_pattern: period 0 = every layer local */
        layers[l].window = period == 0 || l % period < period - 1 ? n_swa : 0;
    return CB_OK;
}

int32_t cb_model_attn_rows(const cb_model *m)
{
    int pairs = m->be->ops->attn_pairs, g = m->hp.n_head / m->hp.n_head_kv;
    if (pairs <= 0)
        return 0;
    return g > 0 && pairs / g > 1 ? pairs / g : 1;
}

/* The built-in figure (a store's profile replaces it: cb-profile(1)):
 * measured on Qwen2.5-Coder's blends on an AVX2 CPU, 185-203 on the 8-bit
 * path and 103 on the exact one (EVAL.md, "--speedup prices loading,
 * masked keys and scoring").  The CPU's loader shares the cores the blend
 * computes on; a device's copies run beside its kernels: 0. */
float cb_model_load_cost(const cb_model *m)
{
    if (strcmp(m->be->ops->name, "cpu") != 0)
        return 0.0f;
    return m->exact ? 100.0f : 190.0f;
}

/* The built-in figure: the CPU's attn_mass measured 1.3-1.56 times the
 * attention's time a (row, key) on Qwen2.5-Coder (EVAL.md, as above);
 * other backends: not measured, as the attention. */
float cb_model_score_cost(const cb_model *m)
{
    return strcmp(m->be->ops->name, "cpu") == 0 ? 1.4f : 1.0f;
}

/* Load a 1-D f32 vector tensor into backend memory (NULL *out when it is
 * optional and absent). */
static cb_status load_vec(cb_model *m, const char *path, const char *name, int64_t n, int optional,
                          float **out, cb_error *err);

/* The model's backend (p->device, p->n_threads), checked against the head
 * dimension, on its exact path when p->exact (before any weight). */
static cb_status open_backend(cb_model *m, const char *path, const cb_model_params *p,
                              cb_error *err)
{
    cb_status st = cb_backend_open(&m->be, p ? p->device : NULL, p ? p->n_threads : 0, err);
    if (st != CB_OK)
        return st;
    if (m->be->ops->max_head_dim && m->hp.head_dim > m->be->ops->max_head_dim)
        return cb_error_set(err, CB_ERR_UNSUPPORTED,
                            "%s: head dimension %d is more than the %s backend handles (%d)", path,
                            m->hp.head_dim, m->be->ops->name, m->be->ops->max_head_dim);
    if (p && p->exact) {
        if (!m->be->ops->set_act8)
            return cb_error_set(
                err, CB_ERR_UNSUPPORTED,
                "exact f32 products: the %s backend has no such path (its products are its own)",
                m->be->ops->name);
        m->be->ops->set_act8(m->be, 0);
        m->exact = 1;
    }
    return CB_OK;
}

/* The architecture table's row of the file's general.architecture. */
static cb_status model_arch(const cb_gguf *g, const char *path, const struct arch_desc **ad,
                            cb_error *err)
{
    cb_strview arch = cb_gguf_str(g, "general.architecture");
    if (!arch.data)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: no general.architecture: not a model file",
                            path);
    for (size_t i = 0; i < sizeof arches / sizeof arches[0]; i++)
        if (cb_strview_eq(arch, arches[i].name)) {
            *ad = &arches[i];
            return CB_OK;
        }
    return cb_error_set(
        err, CB_ERR_UNSUPPORTED,
        "%s: architecture '%.*s' is not supported (supported: llama, qwen2, qwen3, gemma3)", path,
        (int)(arch.len > 40 ? 40 : arch.len), arch.data);
}

cb_status cb_model_load(cb_model **out, const char *path, const cb_model_params *p, cb_error *err)
{
    const struct arch_desc *ad = NULL;
    cb_model *m = calloc(1, sizeof *m);
    cb_hparams *hp;
    cb_status st;
    char name[96];
    double t0 = cb_now_ms();

    if (!m || !(m->path = strdup(path))) {
        free(m);
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    }
    m->threads = p ? p->n_threads : 0;
    hp = &m->hp;
    if ((st = cb_gguf_open(&m->gguf, path, err)) != CB_OK ||
        (st = model_arch(m->gguf, path, &ad, err)) != CB_OK)
        goto fail;
    snprintf(hp->arch, sizeof hp->arch, "%s", ad->name);
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
    if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0 || hp->n_rot > hp->head_dim ||
        hp->n_rot % 2 || hp->n_rot > 1024) {
        st = cb_error_set(
            err, CB_ERR_FORMAT,
            "%s: inconsistent attention shape (%d heads, %d KV heads, head %d, rot %d)", path,
            hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot);
        goto fail;
    }
    {
        char k[128];
        snprintf(k, sizeof k, "%s.rope.freq_base", hp->arch);
        hp->rope_base = (float)cb_gguf_float_or(m->gguf, k, 10000.0);
        snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", hp->arch);
        hp->norm_eps = (float)cb_gguf_float_or(m->gguf, k, 1e-5);
    }
    hp->rope_neox = ad->rope_neox;
    if ((st = rope_scaling(m->gguf, path, hp->arch, &hp->rope_scale, err)) != CB_OK)
        goto fail;
    if (ad->swa_period) {
        char k[128];
        if ((st = hp_int(m->gguf, path, hp->arch, "attention.sliding_window", &hp->n_swa, 1, err)))
            goto fail;
        snprintf(k, sizeof k, "%s.rope.freq_base_swa", hp->arch);
        hp->rope_base_swa = (float)cb_gguf_float_or(m->gguf, k, 10000.0);
    }
    if (!(hp->rope_base > 0) || (hp->n_swa && !(hp->rope_base_swa > 0))) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: RoPE base out of range", path);
        goto fail;
    }
    m->embd_scale = ad->embd_scale ? sqrtf((float)hp->n_embd) : 1.0f;
    /* gemma3 27B (62 layers) scales by the model width per head, as llama.cpp */
    m->attn_scale =
        1.0f / sqrtf(ad->embd_scale && hp->n_layer == 62 ? (float)(hp->n_embd / hp->n_head)
                                                         : (float)hp->head_dim);
    m->ffn_gelu = ad->gelu;
    m->key_temp = ad->key_temp;
    m->stale_scale = ad->stale_scale;

    if ((st = cb_vocab_load(&m->vocab, m->gguf, err)) != CB_OK)
        goto fail;
    hp->n_vocab = cb_vocab_n_tokens(m->vocab);
    if ((st = cb_gguf_fingerprint_cached(m->gguf, path, p ? p->fp_cache : NULL, &m->fingerprint)) !=
        CB_OK) {
        st = cb_error_set(err, st, "%s: out of memory", path);
        goto fail;
    }

    if ((st = open_backend(m, path, p, err)) != CB_OK)
        goto fail;
    int64_t d = hp->n_embd, dq = (int64_t)hp->n_head * hp->head_dim,
            dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    float *host = NULL;
    if ((st =
             load_tensor(m, path, "token_embd.weight", d, hp->n_vocab, 0, &m->tok_embd, NULL, err)))
        goto fail;
    if ((st = load_tensor(m, path, "output_norm.weight", d, 0, 0, NULL, &host, err)))
        goto fail;
    if (!(m->output_norm = to_backend(m, host, d)))
        goto nomem;
    if ((st = load_tensor(m, path, "output.weight", d, hp->n_vocab, 1, &m->output, NULL, err)))
        goto fail;
    hp->tied_output = m->output == NULL;
    /* every layer has tensors: a count the file cannot hold is malformed
     * (it would size the layer table: 10^9 layers in a 20 KB file) */
    if (hp->n_layer > cb_gguf_n_tensors(m->gguf)) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: block_count %d, but the file holds %lld tensors",
                          path, hp->n_layer, (long long)cb_gguf_n_tensors(m->gguf));
        goto fail;
    }
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        st = cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    /* RoPE frequency divisors of the global layers: Llama 3's rope_freqs
     * times the linear factor */
    {
        int64_t half = hp->n_rot / 2;
        float *ff = NULL;
        if (ad->rope_freqs &&
            (st = load_tensor(m, path, "rope_freqs.weight", half, 0, 1, NULL, &ff, err)))
            goto fail;
        hp->rope_freqs = ff != NULL;
        if (ff)
            for (int64_t i = 0; i < half; i++)
                if (!(ff[i] > 0 && ff[i] < 1e6)) {
                    free(ff);
                    st = cb_error_set(err, CB_ERR_FORMAT,
                                      "%s: rope_freqs.weight[%lld] is out of range", path,
                                      (long long)i);
                    goto fail;
                }
        if (!ff && hp->rope_scale != 1.0f && !(ff = malloc(sizeof(float) * (size_t)half)))
            goto nomem;
        for (int64_t i = 0; ff && i < half; i++)
            ff[i] = (hp->rope_freqs ? ff[i] : 1.0f) * hp->rope_scale;
        if (ff && !(m->rope_ff = to_backend(m, ff, half)))
            goto nomem;
    }
    if (hp->n_swa && (st = swa_layers(m->gguf, path, hp->arch, ad->swa_period, hp->n_layer,
                                      hp->n_swa, m->layers, err)))
        goto fail;
    for (int l = 0; l < hp->n_layer; l++) {
        cb_layer *L = &m->layers[l];
        /* a sliding-window layer: its own base, no scaling (llama.cpp's
         * rope_freq_scale_train_swa = 1) */
        L->rope_base = L->window ? hp->rope_base_swa : hp->rope_base;
        L->rope_ff = L->window ? NULL : m->rope_ff;
        hp->n_swa_layers += L->window > 0;
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = load_tensor(m, path, name, d, 0, 0, NULL, &host, err)))
            goto fail;
        if (!(L->attn_norm = to_backend(m, host, d)))
            goto nomem;
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = load_tensor(m, path, name, d, 0, 0, NULL, &host, err)))
            goto fail;
        if (!(L->ffn_norm = to_backend(m, host, d)))
            goto nomem;
        if (ad->qk_norm) {
            snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", l);
            if ((st = load_vec(m, path, name, hp->head_dim, 0, &L->q_norm, err)))
                goto fail;
            snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", l);
            if ((st = load_vec(m, path, name, hp->head_dim, 0, &L->k_norm, err)))
                goto fail;
        }
        if (ad->post_norms) {
            snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", l);
            if ((st = load_vec(m, path, name, d, 0, &L->post_attn_norm, err)))
                goto fail;
            snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", l);
            if ((st = load_vec(m, path, name, d, 0, &L->post_ffn_norm, err)))
                goto fail;
        }
        if ((st = load_proj(m, path, l, "attn_q", d, dq, &L->wq, err)) ||
            (st = load_proj(m, path, l, "attn_k", d, dkv, &L->wk, err)) ||
            (st = load_proj(m, path, l, "attn_v", d, dkv, &L->wv, err)) ||
            (st = load_proj(m, path, l, "attn_output", dq, d, &L->wo, err)) ||
            (st = load_proj(m, path, l, "ffn_gate", d, hp->n_ff, &L->wg, err)) ||
            (st = load_proj(m, path, l, "ffn_up", d, hp->n_ff, &L->wu, err)) ||
            (st = load_proj(m, path, l, "ffn_down", hp->n_ff, d, &L->wd, err)))
            goto fail;
    }
    if ((st = cb_backend_status(m->be)) != CB_OK) { /* an upload's fault */
        cb_error_set(err, st, "%s: %s", path, m->be->fault_msg);
        goto fail;
    }
    m->load_ms = cb_now_ms() - t0;
    *out = m;
    return CB_OK;
nomem:
    st = load_failed(m, path, NULL, err);
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
                o->dealloc(m->be, L->q_norm);
                o->dealloc(m->be, L->k_norm);
                o->dealloc(m->be, L->post_attn_norm);
                o->dealloc(m->be, L->post_ffn_norm);
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
        o->dealloc(m->be, m->rope_ff);
        o->free(m->be);
    }
    free(m->layers);
    cb_vocab_free(m->vocab);
    cb_gguf_free(m->gguf);
    free(m->path);
    free(m);
}

const cb_hparams *cb_model_hparams(const cb_model *m) { return &m->hp; }
const char *cb_model_path(const cb_model *m) { return m->path; }
double cb_model_load_ms(const cb_model *m) { return m->load_ms; }
int cb_model_threads(const cb_model *m) { return m->threads; }
int32_t cb_model_layer_window(const cb_model *m, int32_t l) { return m->layers[l].window; }
float cb_model_layer_rope_base(const cb_model *m, int32_t l) { return m->layers[l].rope_base; }
float cb_model_attn_scale(const cb_model *m) { return m->attn_scale; }
float cb_model_key_temp(const cb_model *m) { return m->key_temp; }
float cb_model_stale_scale(const cb_model *m) { return m->stale_scale; }

/* The built-in figure (a store's profile replaces it: cb-profile(1)):
 * measured on Qwen2.5-Coder's full prefills, 1.98-2.33 on the CPU's 8-bit
 * path, 1.13 on its exact one (EVAL.md, "--speedup counts attention").
 * Other backends: not measured, the multiply-adds alone. */
float cb_model_attn_cost(const cb_model *m)
{
    if (strcmp(m->be->ops->name, "cpu") != 0)
        return 1.0f;
    return m->exact ? 1.1f : 2.1f;
}

static cb_status load_vec(cb_model *m, const char *path, const char *name, int64_t n, int optional,
                          float **out, cb_error *err)
{
    float *host = NULL;
    cb_status st = load_tensor(m, path, name, n, 0, optional, NULL, &host, err);
    *out = NULL;
    if (st != CB_OK || !host)
        return st;
    if (!(*out = to_backend(m, host, n)))
        return load_failed(m, path, name, err);
    return CB_OK;
}
const cb_vocab *cb_model_vocab(const cb_model *m) { return m->vocab; }
const cb_gguf *cb_model_gguf(const cb_model *m) { return m->gguf; }
const char *cb_model_backend(const cb_model *m) { return m->be->ops->name; }
const char *cb_model_device(const cb_model *m)
{
    return m->be->desc[0] ? m->be->desc : m->be->ops->name;
}
const char *cb_model_features(const cb_model *m) { return m->be->features; }
cb_hash128 cb_model_fingerprint(const cb_model *m) { return m->fingerprint; }

cb_status cb_model_sync(const cb_model *m)
{
    if (m->be->ops->sync)
        m->be->ops->sync(m->be);
    return cb_backend_status(m->be);
}

void *cb_model_host_alloc(const cb_model *m, size_t n, int *async)
{
    cb_backend *be = m->be;
    *async = be->ops->host_alloc != NULL;
    return be->ops->host_alloc ? be->ops->host_alloc(be, n) : malloc(n ? n : 1);
}

void cb_model_host_free(const cb_model *m, void *p, int async)
{
    if (p && async)
        m->be->ops->host_free(m->be, p);
    else
        free(p);
}

const char *cb_model_strerror(const cb_model *m, cb_status st)
{
    if (st != CB_OK && m && m->be && cb_backend_status(m->be) == st)
        return m->be->fault_msg;
    return cb_strerror(st);
}
