/* model_impl.h - the layouts of cb_model, cb_kvcache and cb_fwd (private). */
#ifndef CB_MODEL_IMPL_H
#define CB_MODEL_IMPL_H

#include "../backend/backend.h"
#include "infer.h"

typedef struct cb_layer {
    float *attn_norm, *ffn_norm;           /* backend [n_embd] */
    float *q_norm, *k_norm;                /* backend [head_dim], per-head RMSNorm of Q
                                             * and K before RoPE (qwen3, gemma3), or NULL */
    float *post_attn_norm, *post_ffn_norm; /* backend [n_embd], RMSNorm of the attention
                                             * and MLP outputs (gemma3), or NULL */
    cb_bweight *wq, *wk, *wv, *wo;         /* [n_head*hd | n_head_kv*hd | n_embd, ...] */
    cb_bweight *wg, *wu, *wd;              /* gated MLP (SwiGLU, or GELU for gemma3) */
    int32_t window;                        /* > 0: sliding-window layer (keys p-window+1..p) */
    float rope_base;                       /* this layer's RoPE base */
    const float *rope_ff;                  /* backend [n_rot/2] frequency divisors
                                             * (the model's rope_ff), or NULL */
} cb_layer;

struct cb_model {
    cb_hparams hp;
    cb_gguf *gguf; /* owns the mapping the weights were read from */
    cb_vocab *vocab;
    cb_backend *be;
    cb_bweight *tok_embd; /* [n_vocab, n_embd] */
    cb_bweight *output;   /* [n_vocab, n_embd], NULL when tied to tok_embd */
    float *output_norm;   /* backend [n_embd] */
    float *rope_ff;       /* backend [n_rot/2]: RoPE frequency divisors of the
                            * global layers (rope_freqs x linear factor), or NULL */
    float embd_scale;     /* the embeddings are multiplied by it (gemma3: sqrt(n_embd)), 1: none */
    float attn_scale;     /* attention scores' scale */
    int ffn_gelu;         /* MLP: gelu(g) * u, else silu(g) * u */
    float key_temp;       /* the architecture's blend defaults (model.c's table) */
    float stale_scale;    /* (cb_model_key_temp, cb_model_stale_scale) */
    int exact;            /* the backend's exact path (f32 activations: cb_model_params) */
    cb_layer *layers;
    cb_hash128 fingerprint;
    char *path;     /* as cb_model_load was given it */
    double load_ms; /* cb_model_load's time */
    int threads;    /* the threads asked for (cb_model_params) */
};

struct cb_kvcache {
    const cb_model *m;
    cb_type type;
    int32_t n_ctx;
    int64_t width;  /* n_head_kv * head_dim */
    void **k, **v;  /* per layer, backend [n_ctx, width] of type */
    void **loaded;  /* per layer: an event marking the last cb_kvcache_load
                        * into it (NULL when the backend has no events) */
    void *handed;   /* an event marking the work queued on the cache before
                     * cb_kvcache_hand_over (NULL likewise) */
    uint8_t *stale; /* cb_kvcache_set_stale's flags [n_stale] (host), their bias */
    int32_t n_stale;
    float stale_bias;
};

/* Scratch that only this thread's work touches: on a device, no wait for
 * the queue (the KV loads, the deviation and the logits are hot paths). */
static inline void *be_tmp(cb_backend *be, size_t bytes)
{
    return be->ops->alloc_tmp ? be->ops->alloc_tmp(be, bytes) : be->ops->alloc(be, bytes);
}

#endif
