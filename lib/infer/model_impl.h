/* model_impl.h - the layouts of cb_model, cb_kvcache and cb_fwd (private). */
#ifndef CB_MODEL_IMPL_H
#define CB_MODEL_IMPL_H

#include "../backend/backend.h"
#include "cbcore.h"

typedef struct cb_layer {
    float *attn_norm, *ffn_norm;            /* backend [n_embd] */
    cb_bweight *wq, *wk, *wv, *wo;          /* [n_head*hd | n_head_kv*hd | n_embd, ...] */
    cb_bweight *wg, *wu, *wd;               /* SwiGLU MLP */
} cb_layer;

struct cb_model {
    cb_hparams hp;
    cb_gguf *gguf;     /* owns the mapping the weights were read from */
    cb_vocab *vocab;
    cb_backend *be;
    cb_bweight *tok_embd;  /* [n_vocab, n_embd] */
    cb_bweight *output;    /* [n_vocab, n_embd], NULL when tied to tok_embd */
    float *output_norm;    /* backend [n_embd] */
    cb_layer *layers;
    cb_hash128 fingerprint;
};

struct cb_kvcache {
    const cb_model *m;
    cb_type type;
    int32_t n_ctx;
    int64_t width;     /* n_head_kv * head_dim */
    void **k, **v;     /* per layer, backend [n_ctx, width] of type */
    void **loaded;     /* per layer: an event marking the last cb_kvcache_load
                        * into it (NULL when the backend has no events) */
};

#endif
