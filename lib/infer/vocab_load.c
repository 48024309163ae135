/* vocab_load.c - cb_vocab_load: the tokenizer model and pre-tokenizer,
 * the tokens with their scores and types, the BPE merges, the lookup
 * tables over both; then the byte tables and special tokens (the files of
 * each), and the accessors. */
#include "vocab_impl.h"

#include <stdio.h>

/* Slots of an open-addressing table for n keys: a power of two, at most half full. */
static size_t table_size(size_t n)
{
    size_t sz = 16;
    while (sz < 2 * n)
        sz <<= 1;
    return sz;
}

/* ------------------------------------------------------------------ loading */

void cb_vocab_free(cb_vocab *v)
{
    if (!v)
        return;
    for (int i = 0; i < v->n_re; i++)
        pcre2_code_free(v->re[i]);
    free(v->pre_name);
    free(v->tok);
    free(v->text);
    free(v->tmap);
    free(v->mtext);
    free(v->moff);
    free(v->mlen);
    free(v->mmap);
    free(v->eog);
    free(v->special);
    free(v);
}

static cb_status load_tokens(cb_vocab *v, const cb_gguf *g, cb_error *err)
{
    int64_t ki = cb_gguf_find_key(g, "tokenizer.ggml.tokens");
    int64_t si = cb_gguf_find_key(g, "tokenizer.ggml.scores");
    int64_t ti = cb_gguf_find_key(g, "tokenizer.ggml.token_type");
    const unsigned char *scores = NULL, *types = NULL;
    int scores_int = 0;
    uint64_t n;
    size_t total = 0, o = 0;

    if (ki < 0)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.tokens missing");
    if (cb_gguf_kv_type(g, ki) != CB_GGUF_ARRAY || cb_gguf_arr_type(g, ki) != CB_GGUF_STRING)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.tokens is not a string array");
    n = cb_gguf_arr_len(g, ki);
    if (n == 0 || n > INT32_MAX / 2)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.tokens: bad count %llu",
                            (unsigned long long)n);
    if (si >= 0) {
        cb_gguf_type at = cb_gguf_arr_type(g, si);
        if (cb_gguf_kv_type(g, si) != CB_GGUF_ARRAY ||
            (at != CB_GGUF_FLOAT32 && at != CB_GGUF_INT32))
            return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.scores: bad type");
        if (cb_gguf_arr_len(g, si) < n)
            return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.scores: %llu < %llu entries",
                                (unsigned long long)cb_gguf_arr_len(g, si), (unsigned long long)n);
        scores = cb_gguf_arr_data(g, si);
        scores_int = at == CB_GGUF_INT32;
    }
    if (ti >= 0) {
        if (cb_gguf_kv_type(g, ti) != CB_GGUF_ARRAY || cb_gguf_arr_type(g, ti) != CB_GGUF_INT32)
            return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.token_type: bad type");
        if (cb_gguf_arr_len(g, ti) < n)
            return cb_error_set(err, CB_ERR_FORMAT,
                                "tokenizer.ggml.token_type: %llu < %llu entries",
                                (unsigned long long)cb_gguf_arr_len(g, ti), (unsigned long long)n);
        types = cb_gguf_arr_data(g, ti);
    }

    v->n_tokens = (int32_t)n;
    for (uint64_t i = 0; i < n; i++) {
        cb_strview s;
        if (cb_gguf_arr_get_str(g, ki, i, &s) != CB_OK)
            return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.tokens[%llu] unreadable",
                                (unsigned long long)i);
        total += (s.len ? s.len : 32) + 1;
    }
    if (total > UINT32_MAX)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.tokens too large");
    v->tok = calloc(n, sizeof *v->tok);
    v->text = malloc(total);
    v->tmap_mask = table_size(n) - 1;
    v->tmap = calloc(v->tmap_mask + 1, sizeof *v->tmap);
    if (!v->tok || !v->text || !v->tmap)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory loading the vocabulary");

    for (uint64_t i = 0; i < n; i++) {
        tok_entry *t = &v->tok[i];
        cb_strview s;
        size_t h;
        cb_gguf_arr_get_str(g, ki, i, &s);
        t->off = (uint32_t)o;
        if (s.len == 0) /* llama.cpp renames empty tokens */
            t->len = (uint32_t)snprintf(v->text + o, 32, "[EMPTY_%llu]", (unsigned long long)i);
        else {
            memcpy(v->text + o, s.data, s.len);
            t->len = (uint32_t)s.len;
        }
        o += t->len;
        v->text[o++] = 0;

        if (scores_int) {
            int32_t x;
            memcpy(&x, scores + 4 * i, 4);
            t->score = (float)x;
        } else if (scores) {
            memcpy(&t->score, scores + 4 * i, 4);
        }
        t->attr = CB_TOKEN_NORMAL;
        if (types) {
            int32_t ty;
            memcpy(&ty, types + 4 * i, 4);
            switch (ty) {
            case 1: t->attr = CB_TOKEN_NORMAL; break;
            case 2: t->attr = CB_TOKEN_UNKNOWN; break;
            case 3: t->attr = CB_TOKEN_CONTROL; break;
            case 4: t->attr = CB_TOKEN_USER_DEFINED; break;
            case 5: t->attr = CB_TOKEN_UNUSED; break;
            case 6: t->attr = CB_TOKEN_BYTE; break;
            default: t->attr = 0; break; /* undefined */
            }
        }

        h = (size_t)fnv_add(FNV_INIT, v->text + t->off, t->len) & v->tmap_mask;
        for (;; h = (h + 1) & v->tmap_mask) {
            uint32_t slot = v->tmap[h];
            if (!slot) {
                v->tmap[h] = (uint32_t)i + 1;
                break;
            }
            if (v->tok[slot - 1].len == t->len &&
                memcmp(v->text + v->tok[slot - 1].off, v->text + t->off, t->len) == 0)
                return cb_error_set(err, CB_ERR_FORMAT,
                                    "duplicate token in vocabulary: '%.*s' has ids %u and %llu",
                                    (int)t->len, v->text + t->off, slot - 1, (unsigned long long)i);
        }
    }
    return CB_OK;
}

static cb_status load_merges(cb_vocab *v, const cb_gguf *g, cb_error *err)
{
    int64_t mi = cb_gguf_find_key(g, "tokenizer.ggml.merges");
    uint64_t n;
    size_t total = 0, o = 0;

    if (mi < 0)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.merges missing");
    if (cb_gguf_kv_type(g, mi) != CB_GGUF_ARRAY || cb_gguf_arr_type(g, mi) != CB_GGUF_STRING)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.merges is not a string array");
    n = cb_gguf_arr_len(g, mi);
    if (n > INT32_MAX / 2)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.merges: too many");
    for (uint64_t i = 0; i < n; i++) {
        cb_strview s;
        if (cb_gguf_arr_get_str(g, mi, i, &s) != CB_OK)
            return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.merges[%llu] unreadable",
                                (unsigned long long)i);
        total += s.len + 1;
    }
    if (total > UINT32_MAX)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.merges too large");
    v->n_merges = (uint32_t)n;
    v->mtext = malloc(total ? total : 1);
    v->moff = calloc(n ? n : 1, sizeof *v->moff);
    v->mlen = calloc(n ? n : 1, sizeof *v->mlen);
    v->mmap_mask = table_size(n) - 1;
    v->mmap = calloc(v->mmap_mask + 1, sizeof *v->mmap);
    if (!v->mtext || !v->moff || !v->mlen || !v->mmap)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory loading the merges");

    for (uint64_t i = 0; i < n; i++) {
        cb_strview s;
        size_t h;
        cb_gguf_arr_get_str(g, mi, i, &s);
        memcpy(v->mtext + o, s.data, s.len);
        v->moff[i] = (uint32_t)o;
        v->mlen[i] = (uint32_t)s.len;
        o += s.len;
        v->mtext[o++] = 0;
        /* llama.cpp splits at the first space after position 0; a merge
         * without one becomes the pair ("", "") that no lookup asks for. */
        if (s.len < 3 || !memchr(s.data + 1, ' ', s.len - 1))
            continue;
        h = (size_t)fnv_add(FNV_INIT, s.data, s.len) & v->mmap_mask;
        for (;; h = (h + 1) & v->mmap_mask) {
            uint32_t slot = v->mmap[h];
            if (!slot) {
                v->mmap[h] = (uint32_t)i + 1;
                break;
            }
            if (v->mlen[slot - 1] == s.len &&
                memcmp(v->mtext + v->moff[slot - 1], s.data, s.len) == 0)
                break; /* a repeated pair keeps its first rank */
        }
    }
    return CB_OK;
}

cb_status cb_vocab_load(cb_vocab **out, const cb_gguf *g, cb_error *err)
{
    cb_vocab *v;
    cb_strview model = cb_gguf_str(g, "tokenizer.ggml.model");
    cb_strview pre = cb_gguf_str(g, "tokenizer.ggml.pre");
    cb_status st;

    if (!model.data)
        return cb_error_set(err, CB_ERR_FORMAT, "tokenizer.ggml.model missing");
    v = calloc(1, sizeof *v);
    if (!v)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    v->eot = v->eom = v->pad = NO_TOKEN;

    if (cb_strview_eq(model, "llama")) {
        v->kind = CB_VOCAB_SPM;
        v->bos = 1;
        v->eos = 2;
        v->unk = 0;
        v->add_bos = 1;
        v->add_space_prefix = 1;
    } else if (cb_strview_eq(model, "gpt2")) {
        v->kind = CB_VOCAB_BPE;
        v->bos = 11;
        v->eos = 11;
        v->unk = NO_TOKEN;
        v->pre = vc_pre_find(pre);
        if (!v->pre) {
            st = cb_error_set(err, CB_ERR_UNSUPPORTED, "unsupported pre-tokenizer '%.*s'",
                              (int)(pre.len > 64 ? 64 : pre.len), pre.data);
            goto fail;
        }
        v->clean_spaces = v->pre->clean_spaces;
        v->add_bos = v->pre->add_bos;
    } else {
        st = cb_error_set(err, CB_ERR_UNSUPPORTED, "unsupported tokenizer model '%.*s'",
                          (int)(model.len > 64 ? 64 : model.len), model.data);
        goto fail;
    }
    v->pre_name = pre.data && pre.len ? strndup(pre.data, pre.len) : strdup("default");
    if (!v->pre_name) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    v->add_space_prefix =
        cb_gguf_bool_or(g, "tokenizer.ggml.add_space_prefix", v->add_space_prefix);

    if ((st = load_tokens(v, g, err)) != CB_OK)
        goto fail;
    if (v->kind == CB_VOCAB_BPE) {
        if ((st = load_merges(v, g, err)) != CB_OK)
            goto fail;
        vc_bpe_init(v);
        if ((st = vc_pre_compile(v, err)) != CB_OK)
            goto fail;
    } else {
        vc_spm_init(v);
    }
    if ((st = vc_load_specials(v, g, err)) != CB_OK)
        goto fail;
    if (vc_build_special_cache(v, g) != CB_OK) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto fail;
    }
    v->max_bytes = 1; /* cb_vocab_max_token_bytes */
    for (int32_t id = 0; id < v->n_tokens; id++) {
        if (v->tok[id].attr & (TOK_LSTRIP | TOK_RSTRIP)) {
            v->max_bytes = 0;
            break;
        }
        if (v->tok[id].len > v->max_bytes)
            v->max_bytes = v->tok[id].len;
    }
    *out = v;
    return CB_OK;
fail:
    cb_vocab_free(v);
    return st;
}

/* -------------------------------------------------------------- accessors */

cb_vocab_kind cb_vocab_kind_of(const cb_vocab *v) { return v->kind; }
int32_t cb_vocab_n_tokens(const cb_vocab *v) { return v->n_tokens; }
const char *cb_vocab_pre(const cb_vocab *v) { return v->pre_name; }
int32_t cb_vocab_bos(const cb_vocab *v) { return v->bos; }
int32_t cb_vocab_eos(const cb_vocab *v) { return v->eos; }
int32_t cb_vocab_eot(const cb_vocab *v) { return v->eot; }
int cb_vocab_add_bos(const cb_vocab *v) { return v->add_bos; }
int cb_vocab_add_eos(const cb_vocab *v) { return v->add_eos; }
size_t cb_vocab_max_token_bytes(const cb_vocab *v) { return v->max_bytes; }

cb_strview cb_vocab_token_text(const cb_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_tokens)
        return (cb_strview){NULL, 0};
    return (cb_strview){v->text + v->tok[id].off, v->tok[id].len};
}

uint32_t cb_vocab_token_attr(const cb_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_tokens)
        return 0;
    return v->tok[id].attr & TOK_PUBLIC_ATTRS;
}
