/* vocab_special.c - special tokens: the ids from metadata and by text, the
 * end-of-generation set, the longest-first list, and cutting them out of
 * the text before BPE or SPM runs (llama.cpp's tokenizer_st_partition). */
#include "vocab_impl.h"

static int text_is(const cb_vocab *v, int32_t id, const char *s)
{
    const tok_entry *t = &v->tok[id];
    size_t n = strlen(s);
    return t->len == n && memcmp(v->text + t->off, s, n) == 0;
}

/* The id of the lowest-numbered token whose text is one of names[], or -1.
 * llama.cpp takes the first match in the iteration order of its
 * unordered_map, which is unspecified; lowest id reproduces what it picks on
 * the models we test (SmolLM2: <|endoftext|> over <|im_end|>). */
static int32_t find_any(const cb_vocab *v, const char *const *names)
{
    int32_t best = NO_TOKEN;
    for (size_t k = 0; names[k]; k++) {
        int32_t id = token_find_str(v, names[k]);
        if (id != NO_TOKEN && (best == NO_TOKEN || id < best))
            best = id;
    }
    return best;
}

static cb_status eog_add(cb_vocab *v, int32_t id, size_t *cap)
{
    if (id == NO_TOKEN)
        return CB_OK;
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return CB_OK;
    if (v->n_eog == *cap) {
        int32_t *p = cb_vec_reserve(v->eog, cap, v->n_eog + 1, sizeof *p, 16);
        if (!p)
            return CB_ERR_NOMEM;
        v->eog = p;
    }
    v->eog[v->n_eog++] = id;
    return CB_OK;
}

static void eog_remove(cb_vocab *v, int32_t id)
{
    for (size_t i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) {
            v->eog[i] = v->eog[--v->n_eog];
            return;
        }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Token texts llama.cpp recognises special tokens by (llama_vocab::impl::
 * load).  DeepSeek's names use U+FF5C (fullwidth bar) and U+2581 (SPM
 * space). */
#define FWB "\xef\xbd\x9c"
#define SPS "\xe2\x96\x81"
/* clang-format off */
static const char *const eot_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
    "<" FWB "end" SPS "of" SPS "sentence" FWB ">", "<end_of_utterance>", NULL};
static const char *const eom_names[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_names[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<" FWB "fim" SPS "begin" FWB ">",
    "<PRE>", SPS "<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const fim_suf_names[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<" FWB "fim" SPS "hole" FWB ">",
    "<SUF>", SPS "<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const fim_mid_names[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<" FWB "fim" SPS "end" FWB ">",
    "<MID>", SPS "<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const fim_pad_names[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                            "[PAD]", NULL};
static const char *const fim_rep_names[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_names[] = {"<|file_sep|>", NULL};
static const char *const eog_names[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    "<|tool_response>", "<" FWB "end" SPS "of" SPS "sentence" FWB ">", "[e~[", NULL};
/* clang-format on */
#undef FWB
#undef SPS

/* Special ids, end-of-generation set and the attribute fix-ups llama.cpp
 * derives from token texts (the "auto-detect special tokens by text" part
 * of llama_vocab::impl::load). */
cb_status vc_load_specials(cb_vocab *v, const cb_gguf *g, cb_error *err)
{
    int32_t sep = NO_TOKEN, mask = NO_TOKEN;
    int32_t fim_pre = NO_TOKEN, fim_suf = NO_TOKEN, fim_mid = NO_TOKEN;
    int32_t fim_pad = NO_TOKEN, fim_rep = NO_TOKEN, fim_sep = NO_TOKEN;
    struct {
        const char *key;
        int32_t *id;
    } keys[] = {
        {"tokenizer.ggml.bos_token_id", &v->bos},
        {"tokenizer.ggml.eos_token_id", &v->eos},
        {"tokenizer.ggml.eot_token_id", &v->eot},
        {"tokenizer.ggml.eom_token_id", &v->eom},
        {"tokenizer.ggml.unknown_token_id", &v->unk},
        {"tokenizer.ggml.seperator_token_id", &sep},
        {"tokenizer.ggml.padding_token_id", &v->pad},
        {"tokenizer.ggml.mask_token_id", &mask},
        {"tokenizer.ggml.fim_pre_token_id", &fim_pre},
        {"tokenizer.ggml.fim_suf_token_id", &fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &fim_mid},
        {"tokenizer.ggml.fim_pad_token_id", &fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &fim_rep},
        {"tokenizer.ggml.fim_sep_token_id", &fim_sep},
        {"tokenizer.ggml.prefix_token_id", &fim_pre},
        {"tokenizer.ggml.suffix_token_id", &fim_suf},
        {"tokenizer.ggml.middle_token_id", &fim_mid},
    };
    struct {
        int32_t *id;
        const char *const *names;
    } by_text[] = {
        {&v->eot, eot_names},      {&v->eom, eom_names},      {&fim_pre, fim_pre_names},
        {&fim_suf, fim_suf_names}, {&fim_mid, fim_mid_names}, {&fim_pad, fim_pad_names},
        {&fim_rep, fim_rep_names}, {&fim_sep, fim_sep_names},
    };
    size_t eog_cap = 0;
    int32_t id;

    /* Ids from metadata; a default out of range is disabled, a bad value in
     * the file keeps the default (both with a warning in llama.cpp). */
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        uint64_t u;
        if (*keys[k].id >= v->n_tokens)
            *keys[k].id = NO_TOKEN;
        if (cb_gguf_get_uint(g, cb_gguf_find_key(g, keys[k].key), &u) == CB_OK &&
            u < (uint64_t)v->n_tokens)
            *keys[k].id = (int32_t)u;
    }

    v->add_bos = cb_gguf_bool_or(g, "tokenizer.ggml.add_bos_token", v->add_bos);
    v->add_eos = cb_gguf_bool_or(g, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (v->add_bos && v->bos == NO_TOKEN)
        return cb_error_set(err, CB_ERR_FORMAT,
                            "tokenizer.ggml.add_bos_token is true, but there is no BOS token");
    if (v->add_eos && v->eos == NO_TOKEN)
        return cb_error_set(err, CB_ERR_FORMAT,
                            "tokenizer.ggml.add_eos_token is true, but there is no EOS token");

    /* Tokens found by their text become control tokens. */
    for (size_t k = 0; k < sizeof by_text / sizeof by_text[0]; k++) {
        if (*by_text[k].id != NO_TOKEN)
            continue;
        *by_text[k].id = find_any(v, by_text[k].names);
        if (*by_text[k].id != NO_TOKEN)
            v->tok[*by_text[k].id].attr |= CB_TOKEN_CONTROL;
    }

    /* Control tokens named "...unused..." are unused. */
    for (id = 0; id < v->n_tokens; id++) {
        tok_entry *t = &v->tok[id];
        if ((t->attr & CB_TOKEN_CONTROL) && strstr(v->text + t->off, "unused"))
            t->attr |= CB_TOKEN_UNUSED;
    }

    /* End of generation: FIM pad/repo/sep, tokens known by their text, EOS,
     * EOT, EOM. */
    if (eog_add(v, fim_pad, &eog_cap) || eog_add(v, fim_rep, &eog_cap) ||
        eog_add(v, fim_sep, &eog_cap))
        goto fail;
    for (size_t k = 0; eog_names[k]; k++) {
        id = token_find_str(v, eog_names[k]);
        if (id == NO_TOKEN)
            continue;
        if (eog_add(v, id, &eog_cap))
            goto fail;
        v->tok[id].attr |= CB_TOKEN_CONTROL;
    }
    /* gpt-oss: these always render. */
    {
        static const char *const always[] = {"<|channel|>", "<|message|>", "<|start|>",
                                             "<|constrain|>", NULL};
        for (size_t k = 0; always[k]; k++)
            if ((id = token_find_str(v, always[k])) != NO_TOKEN)
                v->tok[id].attr = CB_TOKEN_USER_DEFINED;
    }
    if (eog_add(v, v->eos, &eog_cap) || eog_add(v, v->eot, &eog_cap) ||
        eog_add(v, v->eom, &eog_cap))
        goto fail;
    /* o200k_harmony and solar-open: <|end|> is not an end of generation when
     * <|return|> and <|call|> (or <|calls|> and <|flush|>) are. */
    {
        int has_return = 0, has_call = 0, has_flush = 0;
        int32_t end_id = NO_TOKEN;
        for (size_t i = 0; i < v->n_eog; i++) {
            int32_t e = v->eog[i];
            if (text_is(v, e, "<|return|>"))
                has_return = 1;
            else if (text_is(v, e, "<|call|>") || text_is(v, e, "<|calls|>"))
                has_call = 1;
            else if (text_is(v, e, "<|flush|>"))
                has_flush = 1;
            else if (text_is(v, e, "<|end|>"))
                end_id = e;
        }
        if (end_id != NO_TOKEN && ((has_return && has_call) || (has_call && has_flush))) {
            eog_remove(v, end_id);
            v->tok[end_id].attr = CB_TOKEN_USER_DEFINED;
        }
    }
    /* Gemma 4: </s> is not an end of generation beside <|tool_response>. */
    {
        int has_tool = 0;
        int32_t s_id = NO_TOKEN;
        for (size_t i = 0; i < v->n_eog; i++) {
            if (text_is(v, v->eog[i], "<|tool_response>"))
                has_tool = 1;
            else if (text_is(v, v->eog[i], "</s>"))
                s_id = v->eog[i];
        }
        if (has_tool && s_id != NO_TOKEN) {
            eog_remove(v, s_id);
            v->tok[s_id].attr = CB_TOKEN_NORMAL;
        }
    }
    if (v->n_eog)
        qsort(v->eog, v->n_eog, sizeof *v->eog, cmp_i32);
    return CB_OK;
fail:
    return cb_error_set(err, CB_ERR_NOMEM, "out of memory loading the vocabulary");
}

/* Longest text first; equal lengths by id (llama.cpp's std::sort leaves
 * their order unspecified). */
typedef struct len_id {
    uint32_t len;
    int32_t id;
} len_id;

static int cmp_len_id(const void *a, const void *b)
{
    const len_id *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int contains_ci(cb_strview s, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; s.data && i + n <= s.len; i++) {
        size_t j = 0;
        while (j < n) {
            char c = s.data[i + j];
            if (c >= 'A' && c <= 'Z')
                c = (char)(c - 'A' + 'a');
            if (c != needle[j])
                break;
            j++;
        }
        if (j == n)
            return 1;
    }
    return 0;
}

/* v->special: the special tokens longest first, and the strip attributes
 * some models give them. */
cb_status vc_build_special_cache(cb_vocab *v, const cb_gguf *g)
{
    size_t n = 0;
    len_id *tmp;
    for (int32_t id = 0; id < v->n_tokens; id++)
        if (v->tok[id].attr & TOK_SPECIAL_ATTRS)
            n++;
    v->special = malloc((n ? n : 1) * sizeof *v->special);
    tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!v->special || !tmp) {
        free(tmp);
        return CB_ERR_NOMEM;
    }
    for (int32_t id = 0; id < v->n_tokens; id++)
        if (v->tok[id].attr & TOK_SPECIAL_ATTRS)
            tmp[v->n_special++] = (len_id){v->tok[id].len, id};
    qsort(tmp, v->n_special, sizeof *tmp, cmp_len_id);
    for (size_t i = 0; i < v->n_special; i++)
        v->special[i] = tmp[i].id;
    free(tmp);

    /* Per-token strip attributes llama.cpp sets by model name: Phi-3's
     * special tokens eat the whitespace after them. */
    {
        cb_strview name = cb_gguf_str(g, "general.name");
        if (contains_ci(name, "phi-3") || contains_ci(name, "phi3")) {
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
            int32_t id;
            for (size_t i = 0; i < v->n_special; i++)
                v->tok[v->special[i]].attr |= TOK_RSTRIP;
            if ((id = token_find_str(v, "</s>")) != NO_TOKEN)
                v->tok[id].attr |= TOK_RSTRIP;
            for (size_t k = 0; keep[k]; k++)
                if ((id = token_find_str(v, keep[k])) != NO_TOKEN)
                    v->tok[id].attr &= ~TOK_RSTRIP;
        }
    }
    return CB_OK;
}

int cb_vocab_is_eog(const cb_vocab *v, int32_t id)
{
    return id >= 0 && v->n_eog && bsearch(&id, v->eog, v->n_eog, sizeof *v->eog, cmp_i32) != NULL;
}

/* ------------------------------------------------------------- partition */

static cb_status frags_push(frags *f, size_t off, size_t len, int32_t id)
{
    if (f->n == f->cap) {
        frag *p = cb_vec_reserve(f->v, &f->cap, f->n + 1, sizeof *p, 16);
        if (!p)
            return CB_ERR_NOMEM;
        f->v = p;
    }
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->v[f->n].id = id;
    f->n++;
    return CB_OK;
}

static int is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Cut special tokens out of the text, longest first, each one everywhere it
 * occurs in the raw fragments left by the longer ones (llama.cpp's
 * tokenizer_st_partition). */
cb_status vc_partition(const cb_vocab *v, const char *text, size_t len, int parse_special, frags *f,
                       frags *tmp)
{
    /* Which byte pairs occur: tokens whose first two bytes never do are
     * skipped without a search.  Vocabularies with thousands of special
     * tokens (<unused123>) make this worth it. */
    uint64_t *pairs = NULL;

    f->n = 0;
    if (len == 0)
        return CB_OK;
    if (frags_push(f, 0, len, -1) != CB_OK)
        return CB_ERR_NOMEM;
    if (v->n_special > 32) {
        pairs = calloc(65536 / 64, sizeof *pairs);
        if (!pairs)
            return CB_ERR_NOMEM;
        for (size_t i = 0; i + 1 < len; i++) {
            unsigned k = (unsigned char)text[i] << 8 | (unsigned char)text[i + 1];
            pairs[k >> 6] |= 1ULL << (k & 63);
        }
    }
    for (size_t si = 0; si < v->n_special; si++) {
        int32_t id = v->special[si];
        const tok_entry *t = &v->tok[id];
        const char *ts = v->text + t->off;
        int any = 0;

        if (!parse_special && (t->attr & (CB_TOKEN_CONTROL | CB_TOKEN_UNKNOWN)))
            continue;
        if (t->len > len)
            continue;
        if (pairs && t->len >= 2) {
            unsigned k = (unsigned char)ts[0] << 8 | (unsigned char)ts[1];
            if (!(pairs[k >> 6] >> (k & 63) & 1))
                continue;
        }
        tmp->n = 0;
        for (size_t k = 0; k < f->n; k++) {
            frag fr = f->v[k];
            size_t off = fr.off, rem = fr.len;
            const char *m;
            if (fr.id >= 0 || rem < t->len || !(m = memmem(text + off, rem, ts, t->len))) {
                if (frags_push(tmp, fr.off, fr.len, fr.id) != CB_OK)
                    goto fail;
                continue;
            }
            any = 1;
            while (m) {
                size_t mo = (size_t)(m - text);
                size_t left = mo - off;
                if (t->attr & TOK_LSTRIP)
                    while (left > 0 && is_space(text[off + left - 1]))
                        left--;
                if (left > 0 && frags_push(tmp, off, left, -1) != CB_OK)
                    goto fail;
                if (frags_push(tmp, 0, 0, id) != CB_OK)
                    goto fail;
                rem -= mo + t->len - off;
                off = mo + t->len;
                if (t->attr & TOK_RSTRIP)
                    while (rem > 0 && is_space(text[off])) {
                        off++;
                        rem--;
                    }
                m = rem >= t->len ? memmem(text + off, rem, ts, t->len) : NULL;
            }
            if (rem > 0 && frags_push(tmp, off, rem, -1) != CB_OK)
                goto fail;
        }
        if (any) {
            frags x = *f;
            *f = *tmp;
            *tmp = x;
        }
    }
    free(pairs);
    return CB_OK;
fail:
    free(pairs);
    return CB_ERR_NOMEM;
}
