/* precompute.c - a chunk's KV computed alone, after a fixed lead-in. */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

cb_status cb_kv_lead_in(const cb_model *m, cb_tokens *out)
{
    const cb_vocab *v = cb_model_vocab(m);
    cb_chat_kind kind;
    cb_chat_parts parts = {0};
    cb_status st;

    if (cb_vocab_add_bos(v) && cb_vocab_bos(v) >= 0)
        return cb_tokens_push(out, cb_vocab_bos(v));
    kind = cb_chat_detect(cb_gguf_str(cb_model_gguf(m), "tokenizer.chat_template"));
    if (kind != CB_CHAT_NONE) {
        /* The head of a prompt with no system message given: the template's
         * default system turn (Qwen2.5's) and the user turn's opener. */
        char *sys =
            cb_chat_default_system(cb_gguf_str(cb_model_gguf(m), "tokenizer.chat_template"));
        st = cb_chat_render(kind, sys, &parts);
        free(sys);
        if (st != CB_OK)
            return st;
        st = cb_tok_encode(v, parts.prefix, strlen(parts.prefix), CB_TOK_PARSE_SPECIAL, out);
        cb_chat_parts_free(&parts);
        return st;
    }
    if (cb_vocab_bos(v) >= 0)
        return cb_tokens_push(out, cb_vocab_bos(v));
    return CB_OK;
}

/* What a prompt puts between two chunks (and between the last one and the
 * question): a blank line. */
cb_status cb_kv_separator(const cb_model *m, cb_tokens *out)
{
    return cb_tok_encode(cb_model_vocab(m), "\n\n", 2, 0, out);
}

cb_status cb_kv_precompute(cb_fwd *f, cb_kvcache *kv, const int32_t *lead, int32_t n_lead,
                           const int32_t *ids, int32_t n, cb_type type, void **buf, size_t *size)
{
    cb_status st;
    int32_t *all;

    if (n < 1 || n_lead < 0)
        return CB_ERR_INVALID;
    if ((int64_t)n_lead + n > cb_kvcache_n_ctx(kv))
        return CB_ERR_RANGE;
    all = malloc(sizeof(int32_t) * (size_t)(n_lead + n));
    if (!all)
        return CB_ERR_NOMEM;
    if (n_lead > 0)
        memcpy(all, lead, sizeof(int32_t) * (size_t)n_lead);
    memcpy(all + n_lead, ids, sizeof(int32_t) * (size_t)n);
    st = cb_model_eval(f, kv, all, n_lead + n, 0, NULL);
    free(all);
    if (st != CB_OK)
        return st;
    return cb_kv_serialize(cb_fwd_model(f), kv, lead, n_lead, ids, n, n_lead, type, buf, size);
}
