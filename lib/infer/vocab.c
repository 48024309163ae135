/* vocab.c - the tokenizer: vocabularies read from GGUF metadata, encoding
 * and decoding that give the same ids and bytes as llama.cpp
 * (src/llama-vocab.cpp, src/unicode.cpp).
 *
 * Two tokenizer models are supported:
 *   "gpt2"   byte-level BPE: a pre-tokenizer (a list of regexes chosen by
 *            tokenizer.ggml.pre, run with PCRE2) cuts the text into words,
 *            each word's bytes are mapped to printable code points (the GPT-2
 *            byte-to-unicode table) and merged by rank.
 *   "llama"  SentencePiece-style: spaces become U+2581, a space is prefixed,
 *            neighbouring symbols are merged by highest score, and anything
 *            left outside the vocabulary falls back to <0xXX> byte tokens.
 * Before either runs, special tokens (control, user-defined, unknown) are cut
 * out of the text longest first, as llama.cpp's tokenizer_st_partition does.
 *
 * Where llama.cpp behaves oddly we follow it, and say so in a comment: the
 * point of this file is identical ids, not a nicer tokenizer. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "cbcore.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Private attribute bits beside the public CB_TOKEN_* ones (llama.cpp's
 * LLAMA_TOKEN_ATTR_LSTRIP / _RSTRIP): strip whitespace left / right of a
 * special token when it is cut out of the text.  Masked out of
 * cb_vocab_token_attr. */
#define TOK_LSTRIP (1u << 7)
#define TOK_RSTRIP (1u << 8)
#define TOK_PUBLIC_ATTRS 0x3fu

#define TOK_SPECIAL_ATTRS (CB_TOKEN_CONTROL | CB_TOKEN_USER_DEFINED | CB_TOKEN_UNKNOWN)

#define NO_TOKEN (-1)
#define MAX_REGEXES 4

/* ------------------------------------------------------------ pre-tokenizers */

/* Regex lists as llama.cpp spells them (llm_tokenizer_bpe constructor).  Each
 * regex splits the pieces the previous one produced; text a regex does not
 * match stays a piece of its own. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                          \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                           \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

enum pre_regexes { PRE_DEFAULT, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_STARCODER };

static const char *const pre_regex_lists[][MAX_REGEXES + 1] = {
    [PRE_DEFAULT] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL},
    [PRE_GPT2] = {RE_GPT2, NULL},
    [PRE_LLAMA3] = {RE_LLAMA3, NULL},
    [PRE_QWEN2] = {RE_QWEN2, NULL},
    [PRE_STARCODER] = {"\\p{N}", RE_GPT2, NULL},
};

/* tokenizer.ggml.pre names and what llama.cpp sets for each (llama_vocab::
 * impl::load): the regex list, clean_spaces (the detokenizer's clean-up),
 * ignore_merges (a word that is a token is not merged) and the add_bos
 * default. */
static const struct pre_def {
    const char *name;
    unsigned char regexes, clean_spaces, ignore_merges, add_bos;
} pre_defs[] = {
    {"default", PRE_DEFAULT, 1, 0, 0},
    {"gpt-2", PRE_GPT2, 1, 0, 0},
    {"phi-2", PRE_GPT2, 1, 0, 0},
    {"mpt", PRE_GPT2, 1, 0, 0},
    {"olmo", PRE_GPT2, 1, 0, 0},
    {"llama3", PRE_LLAMA3, 1, 1, 1},
    {"llama-v3", PRE_LLAMA3, 1, 1, 1},
    {"llama-bpe", PRE_LLAMA3, 1, 1, 1},
    {"falcon3", PRE_LLAMA3, 1, 1, 1},
    {"qwen2", PRE_QWEN2, 0, 0, 0},
    {"deepseek-r1-qwen", PRE_QWEN2, 0, 0, 0},
    {"stablelm2", PRE_QWEN2, 1, 0, 0},
    {"megrez", PRE_QWEN2, 1, 0, 0},
    {"starcoder", PRE_STARCODER, 1, 0, 0},
    {"refact", PRE_STARCODER, 1, 0, 0},
    {"smollm", PRE_STARCODER, 0, 0, 0},
    {"codeshell", PRE_STARCODER, 1, 0, 0},
    {"command-r", PRE_STARCODER, 0, 0, 0},
};

/* ------------------------------------------------------------------ vocab */

typedef struct tok_entry {
    uint32_t off, len; /* text in cb_vocab.text */
    float score;
    uint32_t attr;     /* CB_TOKEN_* | TOK_LSTRIP | TOK_RSTRIP */
} tok_entry;

struct cb_vocab {
    cb_vocab_kind kind;
    char *pre_name;
    const struct pre_def *pre; /* NULL for SPM */

    int32_t n_tokens;
    tok_entry *tok;
    char *text;        /* all token texts, NUL-separated */
    uint32_t *tmap;    /* open addressing: token text -> id + 1 (0 empty) */
    size_t tmap_mask;

    uint32_t n_merges; /* BPE: "left right" strings by rank */
    char *mtext;
    uint32_t *moff, *mlen;
    uint32_t *mmap;    /* open addressing: merge string -> rank + 1 */
    size_t mmap_mask;

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix, clean_spaces;

    int32_t *eog;      /* sorted end-of-generation ids */
    size_t n_eog;

    int32_t *special;  /* ids of control/user-defined/unknown tokens, longest text first */
    size_t n_special;

    int32_t byte_tok[256]; /* SPM byte fallback: <0xXX> (or the byte itself) */

    /* BPE byte-level mapping: byte -> UTF-8 of its code point, and back. */
    char benc[256][2];
    unsigned char benc_len[256];
    int16_t bdec[0x144]; /* code point -> byte, -1 where none */

    pcre2_code *re[MAX_REGEXES];
    int n_re;
};

/* FNV-1a: a well-spread 64-bit hash in a few lines. */
static uint64_t fnv_add(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

static size_t table_size(size_t n)
{
    size_t sz = 16;
    while (sz < 2 * n)
        sz <<= 1;
    return sz;
}

static int32_t token_find(const cb_vocab *v, const char *s, size_t n)
{
    size_t i = (size_t)fnv_add(FNV_INIT, s, n) & v->tmap_mask;
    for (;; i = (i + 1) & v->tmap_mask) {
        uint32_t slot = v->tmap[i];
        const tok_entry *t;
        if (!slot)
            return NO_TOKEN;
        t = &v->tok[slot - 1];
        if (t->len == n && memcmp(v->text + t->off, s, n) == 0)
            return (int32_t)(slot - 1);
    }
}

/* Rank of merging symbols a and b, or -1: the merge table is keyed by the
 * "a b" strings of tokenizer.ggml.merges. */
static int32_t merge_rank(const cb_vocab *v, const char *a, size_t na, const char *b, size_t nb)
{
    uint64_t h = fnv_add(fnv_add(fnv_add(FNV_INIT, a, na), " ", 1), b, nb);
    size_t i = (size_t)h & v->mmap_mask;
    for (;; i = (i + 1) & v->mmap_mask) {
        uint32_t slot = v->mmap[i];
        const char *k;
        if (!slot)
            return -1;
        k = v->mtext + v->moff[slot - 1];
        if (v->mlen[slot - 1] == na + 1 + nb && memcmp(k, a, na) == 0 && k[na] == ' ' &&
            memcmp(k + na + 1, b, nb) == 0)
            return (int32_t)(slot - 1);
    }
}

static int32_t token_find_str(const cb_vocab *v, const char *s)
{
    return token_find(v, s, strlen(s));
}

/* ------------------------------------------------------------------ UTF-8 */

/* Length of a UTF-8 sequence from its first byte, as llama.cpp's
 * unicode_len_utf8: no validation (a stray continuation byte counts 1). */
static size_t utf8_len(unsigned char c)
{
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Decode one code point at s[*i] the way llama.cpp's unicode_cpt_from_utf8
 * does: it checks lead and continuation bits but not overlong forms or
 * surrogates.  Returns the code point, or -1 (the caller then takes one byte
 * as U+FFFD, as unicode_cpts_from_utf8 does).  Code points past U+10FFFF are
 * refused too: llama.cpp throws on them later, we treat them as invalid. */
static int32_t utf8_decode(const unsigned char *s, size_t n, size_t *i)
{
    size_t p = *i;
    uint32_t c = s[p];
    if (!(c & 0x80)) {
        *i = p + 1;
        return (int32_t)c;
    }
    if (!(c & 0x40))
        return -1;
    if (!(c & 0x20)) {
        if (p + 1 >= n || (s[p + 1] & 0xc0) != 0x80)
            return -1;
        *i = p + 2;
        return (int32_t)(((c & 0x1f) << 6) | (s[p + 1] & 0x3f));
    }
    if (!(c & 0x10)) {
        if (p + 2 >= n || (s[p + 1] & 0xc0) != 0x80 || (s[p + 2] & 0xc0) != 0x80)
            return -1;
        *i = p + 3;
        return (int32_t)(((c & 0x0f) << 12) | ((s[p + 1] & 0x3fu) << 6) | (s[p + 2] & 0x3f));
    }
    if (!(c & 0x08)) {
        uint32_t cp;
        if (p + 3 >= n || (s[p + 1] & 0xc0) != 0x80 || (s[p + 2] & 0xc0) != 0x80 ||
            (s[p + 3] & 0xc0) != 0x80)
            return -1;
        cp = ((c & 0x07) << 18) | ((s[p + 1] & 0x3fu) << 12) | ((s[p + 2] & 0x3fu) << 6) |
             (s[p + 3] & 0x3f);
        if (cp > 0x10ffff)
            return -1;
        *i = p + 4;
        return (int32_t)cp;
    }
    return -1;
}

static size_t utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves,
 * the other 68 bytes to U+0100.. in byte order. */
static void byte_map_init(cb_vocab *v)
{
    int n = 0;
    for (int i = 0; i < 0x144; i++)
        v->bdec[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        v->benc_len[b] = (unsigned char)utf8_encode(cp, v->benc[b]);
        v->bdec[cp] = (int16_t)b;
    }
}

/* ------------------------------------------------------------ growable bits */

cb_status cb_tokens_push(cb_tokens *t, int32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        int32_t *p = realloc(t->ids, cap * sizeof *p);
        if (!p)
            return CB_ERR_NOMEM;
        t->ids = p;
        t->cap = cap;
    }
    t->ids[t->n++] = id;
    return CB_OK;
}

void cb_tokens_free(cb_tokens *t)
{
    if (!t)
        return;
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

typedef struct strbuf {
    char *p;
    size_t n, cap;
} strbuf;

static cb_status sb_reserve(char **p, size_t *cap, size_t need)
{
    if (need > *cap) {
        size_t c = *cap ? *cap : 64;
        char *q;
        while (c < need)
            c *= 2;
        q = realloc(*p, c);
        if (!q)
            return CB_ERR_NOMEM;
        *p = q;
        *cap = c;
    }
    return CB_OK;
}

static cb_status sb_add(strbuf *b, const void *s, size_t n)
{
    if (sb_reserve(&b->p, &b->cap, b->n + n + 1) != CB_OK)
        return CB_ERR_NOMEM;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return CB_OK;
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

/* Compile one of llama.cpp's regexes for PCRE2.  One rewrite: llama.cpp's
 * whitespace is the Unicode White_Space property (from its own tables),
 * while PCRE2's \s also takes U+180E (it keeps the pre-Unicode-6.3 list of
 * horizontal spaces), so \s and \S become explicit White_Space classes. */
#define WHITE_SPACE                                                                        \
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}" \
    "\\x{3000}"
static cb_status compile_regex(cb_vocab *v, const char *pat, cb_error *err)
{
    char buf[1024];
    size_t o = 0;
    int in_class = 0;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re;

    for (size_t i = 0; pat[i]; i++) {
        const char *add = NULL;
        char one[3] = {pat[i], 0, 0};
        if (pat[i] == '\\' && pat[i + 1]) {
            one[1] = pat[i + 1];
            if (pat[i + 1] == 's')
                add = in_class ? WHITE_SPACE : "[" WHITE_SPACE "]";
            else if (pat[i + 1] == 'S' && !in_class)
                add = "[^" WHITE_SPACE "]";
            i++;
        } else if (pat[i] == '[') {
            in_class = 1;
        } else if (pat[i] == ']') {
            in_class = 0;
        }
        if (!add)
            add = one;
        if (o + strlen(add) >= sizeof buf)
            return cb_error_set(err, CB_ERR_INTERNAL, "pre-tokenizer regex too long");
        memcpy(buf + o, add, strlen(add));
        o += strlen(add);
    }
    buf[o] = 0;
    re = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo,
                       NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return cb_error_set(err, CB_ERR_INTERNAL, "pre-tokenizer regex: %s at %zu", (char *)msg,
                            (size_t)eo);
    }
    /* JIT is an optimisation: without it pcre2_match interprets. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    v->re[v->n_re++] = re;
    return CB_OK;
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
                                    (int)t->len, v->text + t->off, slot - 1,
                                    (unsigned long long)i);
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
        size_t c = *cap ? 2 * *cap : 16;
        int32_t *p = realloc(v->eog, c * sizeof *p);
        if (!p)
            return CB_ERR_NOMEM;
        v->eog = p;
        *cap = c;
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

/* Special ids, end-of-generation set and the attribute fix-ups llama.cpp
 * derives from token texts (the "auto-detect special tokens by text" part
 * of llama_vocab::impl::load). */
static cb_status load_specials(cb_vocab *v, const cb_gguf *g, cb_error *err)
{
    /* DeepSeek's names use U+FF5C (fullwidth bar) and U+2581 (SPM space). */
#define FWB "\xef\xbd\x9c"
#define SPS "\xe2\x96\x81"
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
#undef FWB
#undef SPS

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
        {&v->eot, eot_names},     {&v->eom, eom_names},     {&fim_pre, fim_pre_names},
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
        goto nomem;
    for (size_t k = 0; eog_names[k]; k++) {
        id = token_find_str(v, eog_names[k]);
        if (id == NO_TOKEN)
            continue;
        if (eog_add(v, id, &eog_cap))
            goto nomem;
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
        goto nomem;
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
nomem:
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

static cb_status build_special_cache(cb_vocab *v, const cb_gguf *g)
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
        if (!pre.data || pre.len == 0) {
            v->pre = &pre_defs[0];
        } else {
            for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++)
                if (cb_strview_eq(pre, pre_defs[i].name))
                    v->pre = &pre_defs[i];
            if (!v->pre) {
                st = cb_error_set(err, CB_ERR_UNSUPPORTED, "unsupported pre-tokenizer '%.*s'",
                                  (int)(pre.len > 64 ? 64 : pre.len), pre.data);
                goto fail;
            }
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
        byte_map_init(v);
        for (int i = 0; pre_regex_lists[v->pre->regexes][i]; i++)
            if ((st = compile_regex(v, pre_regex_lists[v->pre->regexes][i], err)) != CB_OK)
                goto fail;
    } else {
        for (int b = 0; b < 256; b++) {
            char hex[8];
            char one = (char)b;
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            v->byte_tok[b] = token_find_str(v, hex);
            if (v->byte_tok[b] == NO_TOKEN)
                v->byte_tok[b] = token_find(v, &one, 1);
        }
    }
    if ((st = load_specials(v, g, err)) != CB_OK)
        goto fail;
    if (build_special_cache(v, g) != CB_OK) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto fail;
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

int cb_vocab_is_eog(const cb_vocab *v, int32_t id)
{
    return id >= 0 && v->n_eog &&
           bsearch(&id, v->eog, v->n_eog, sizeof *v->eog, cmp_i32) != NULL;
}

/* --------------------------------------------------------- merge machinery */

/* A symbol: a span of the text being merged, linked to its neighbours. */
typedef struct sym {
    int32_t prev, next;
    uint32_t off, n;
} sym;

/* A candidate merge of symbols left and right.  BPE orders by rank (lowest
 * first), SPM by score (highest first); ties go to the leftmost pair. */
typedef struct bigram {
    int32_t left, right;
    uint32_t size;
    int32_t rank;
    float score;
} bigram;

typedef struct work {
    sym *syms;
    size_t n_syms, cap_syms;
    bigram *heap;
    size_t n_heap, cap_heap;
    int spm;
    strbuf buf;   /* the word or text being merged */
} work;

static int bigram_before(const work *w, const bigram *a, const bigram *b)
{
    if (w->spm) {
        if (a->score != b->score)
            return a->score > b->score;
    } else if (a->rank != b->rank) {
        return a->rank < b->rank;
    }
    return a->left < b->left;
}

static cb_status heap_push(work *w, bigram b)
{
    size_t i;
    if (w->n_heap == w->cap_heap) {
        size_t c = w->cap_heap ? 2 * w->cap_heap : 64;
        bigram *p = realloc(w->heap, c * sizeof *p);
        if (!p)
            return CB_ERR_NOMEM;
        w->heap = p;
        w->cap_heap = c;
    }
    i = w->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(w, &b, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = b;
    return CB_OK;
}

static bigram heap_pop(work *w)
{
    bigram top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bigram_before(w, &w->heap[c + 1], &w->heap[c]))
            c++;
        if (!bigram_before(w, &w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

/* Split w->buf into one symbol per UTF-8 sequence (by its first byte only,
 * clipped at the end, as llama.cpp does). */
static cb_status split_symbols(work *w)
{
    size_t off = 0, n = w->buf.n;
    w->n_syms = 0;
    while (off < n) {
        size_t len = utf8_len((unsigned char)w->buf.p[off]);
        sym *s;
        if (len > n - off)
            len = n - off;
        if (w->n_syms == w->cap_syms) {
            size_t c = w->cap_syms ? 2 * w->cap_syms : 256;
            sym *p = realloc(w->syms, c * sizeof *p);
            if (!p)
                return CB_ERR_NOMEM;
            w->syms = p;
            w->cap_syms = c;
        }
        s = &w->syms[w->n_syms];
        s->off = (uint32_t)off;
        s->n = (uint32_t)len;
        s->prev = (int32_t)w->n_syms - 1;
        off += len;
        s->next = off == n ? -1 : (int32_t)w->n_syms + 1;
        w->n_syms++;
    }
    return CB_OK;
}

static cb_status try_bigram(const cb_vocab *v, work *w, int32_t left, int32_t right)
{
    bigram b;
    const sym *l, *r;
    if (left < 0 || right < 0)
        return CB_OK;
    l = &w->syms[left];
    r = &w->syms[right];
    b.left = left;
    b.right = right;
    b.size = l->n + r->n;
    b.rank = 0;
    b.score = 0;
    if (w->spm) {
        int32_t id = token_find(v, w->buf.p + l->off, b.size);
        if (id == NO_TOKEN)
            return CB_OK;
        b.score = v->tok[id].score;
    } else {
        b.rank = merge_rank(v, w->buf.p + l->off, l->n, w->buf.p + r->off, r->n);
        if (b.rank < 0)
            return CB_OK;
    }
    return heap_push(w, b);
}

/* Merge the symbols of w->buf until no candidate pair is left. */
static cb_status merge_all(const cb_vocab *v, work *w)
{
    w->n_heap = 0;
    for (size_t i = 1; i < w->n_syms; i++)
        if (try_bigram(v, w, (int32_t)i - 1, (int32_t)i) != CB_OK)
            return CB_ERR_NOMEM;
    while (w->n_heap) {
        bigram b = heap_pop(w);
        sym *l = &w->syms[b.left], *r = &w->syms[b.right];
        /* Stale: one side was merged since the pair was queued (symbols
         * only grow, so an unchanged total size means both are as queued). */
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->syms[r->next].prev = b.left;
        if (try_bigram(v, w, l->prev, b.left) != CB_OK ||
            try_bigram(v, w, b.left, l->next) != CB_OK)
            return CB_ERR_NOMEM;
    }
    return CB_OK;
}

static void work_free(work *w)
{
    free(w->syms);
    free(w->heap);
    free(w->buf.p);
}

/* ----------------------------------------------------------------- BPE */

typedef struct span {
    size_t off, len;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static cb_status spans_push(spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? 2 * s->cap : 64;
        span *p = realloc(s->v, c * sizeof *p);
        if (!p)
            return CB_ERR_NOMEM;
        s->v = p;
        s->cap = c;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return CB_OK;
}

/* Run the pre-tokenizer's regexes in sequence over s[0..n): each splits every
 * piece of the previous pass into its matches and the unmatched spans
 * between them (llama.cpp's unicode_regex_split).  A regex sees only its
 * piece, so a lookahead stops at the piece's end. */
static cb_status pretokenize(const cb_vocab *v, const char *s, size_t n, pcre2_match_data *md,
                             spans *out, spans *tmp)
{
    out->n = 0;
    if (n && spans_push(out, 0, n) != CB_OK)
        return CB_ERR_NOMEM;
    for (int r = 0; r < v->n_re; r++) {
        tmp->n = 0;
        for (size_t k = 0; k < out->n; k++) {
            const char *p = s + out->v[k].off;
            size_t len = out->v[k].len, pos = 0, last = 0;
            while (pos < len) {
                int rc = pcre2_match(v->re[r], (PCRE2_SPTR)p, len, pos, PCRE2_NO_UTF_CHECK, md,
                                     NULL);
                PCRE2_SIZE *ov;
                if (rc == PCRE2_ERROR_NOMATCH)
                    break;
                if (rc < 0)
                    return rc == PCRE2_ERROR_NOMEMORY ? CB_ERR_NOMEM : CB_ERR_INTERNAL;
                ov = pcre2_get_ovector_pointer(md);
                if (ov[1] == ov[0]) { /* empty match: step over one character */
                    pos = ov[1] + utf8_len((unsigned char)p[ov[1]]);
                    continue;
                }
                if (ov[0] > last && spans_push(tmp, out->v[k].off + last, ov[0] - last))
                    return CB_ERR_NOMEM;
                if (spans_push(tmp, out->v[k].off + ov[0], ov[1] - ov[0]))
                    return CB_ERR_NOMEM;
                last = pos = ov[1];
            }
            if (last < len && spans_push(tmp, out->v[k].off + last, len - last))
                return CB_ERR_NOMEM;
        }
        {
            spans t = *out;
            *out = *tmp;
            *tmp = t;
        }
    }
    return CB_OK;
}

/* Text as llama.cpp's pre-tokenizer sees it: decoded into code points
 * (each byte of an invalid sequence becoming U+FFFD) and encoded again, so
 * overlong forms come out shortest.  *norm gets those bytes; *match the same
 * with surrogates (valid to llama.cpp, not to PCRE2) replaced by U+E000, a
 * code point of the same length and the same classes (not a letter, number,
 * space or punctuation).  When the text is plain valid UTF-8 both are NULL
 * and the text is used as is. */
static cb_status normalize_utf8(const char *text, size_t len, char **norm, char **match,
                                size_t *out_len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, o = 0;
    char *a, *b;

    *norm = *match = NULL;
    *out_len = len;
    for (;;) {
        size_t j = i;
        int32_t cp;
        if (i == len)
            return CB_OK; /* all valid */
        cp = utf8_decode(s, len, &j);
        if (cp < 0 || (cp >= 0xd800 && cp <= 0xdfff))
            break;
        /* overlong? */
        if ((j - i == 2 && cp < 0x80) || (j - i == 3 && cp < 0x800) || (j - i == 4 && cp < 0x10000))
            break;
        i = j;
    }
    /* Slow path.  U+FFFD (3 bytes) replaces single bytes: 3x is enough. */
    a = malloc(3 * len + 1);
    b = malloc(3 * len + 1);
    if (!a || !b) {
        free(a);
        free(b);
        return CB_ERR_NOMEM;
    }
    i = 0;
    while (i < len) {
        int32_t cp = utf8_decode(s, len, &i);
        size_t k;
        if (cp < 0) {
            cp = 0xfffd;
            i++;
        }
        k = utf8_encode((uint32_t)cp, a + o);
        if (cp >= 0xd800 && cp <= 0xdfff)
            utf8_encode(0xe000, b + o);
        else
            memcpy(b + o, a + o, k);
        o += k;
    }
    *norm = a;
    *match = b;
    *out_len = o;
    return CB_OK;
}

static cb_status bpe_word(const cb_vocab *v, work *w, const char *s, size_t n, cb_tokens *out)
{
    w->buf.n = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (sb_add(&w->buf, v->benc[c], v->benc_len[c]) != CB_OK)
            return CB_ERR_NOMEM;
    }
    if (v->pre->ignore_merges) {
        int32_t id = token_find(v, w->buf.p, w->buf.n);
        if (id != NO_TOKEN)
            return cb_tokens_push(out, id);
    }
    if (split_symbols(w) != CB_OK || merge_all(v, w) != CB_OK)
        return CB_ERR_NOMEM;
    for (int32_t i = 0; w->n_syms && i != -1; i = w->syms[i].next) {
        const sym *sy = &w->syms[i];
        int32_t id = token_find(v, w->buf.p + sy->off, sy->n);
        if (id != NO_TOKEN) {
            if (cb_tokens_push(out, id) != CB_OK)
                return CB_ERR_NOMEM;
            continue;
        }
        /* Not in the vocabulary: llama.cpp looks up each byte of the
         * (byte-encoded) text as a one-byte token and drops the misses. */
        for (uint32_t j = 0; j < sy->n; j++) {
            id = token_find(v, w->buf.p + sy->off + j, 1);
            if (id != NO_TOKEN && cb_tokens_push(out, id) != CB_OK)
                return CB_ERR_NOMEM;
        }
    }
    return CB_OK;
}

typedef struct bpe_ctx {
    work w;
    spans pieces, tmp;
    pcre2_match_data *md;
} bpe_ctx;

static cb_status bpe_fragment(const cb_vocab *v, bpe_ctx *c, const char *text, size_t len,
                              cb_tokens *out)
{
    char *norm, *match;
    size_t n;
    cb_status st = normalize_utf8(text, len, &norm, &match, &n);
    const char *s = norm ? norm : text;
    if (st != CB_OK)
        return st;
    st = pretokenize(v, match ? match : text, n, c->md, &c->pieces, &c->tmp);
    for (size_t k = 0; st == CB_OK && k < c->pieces.n; k++)
        st = bpe_word(v, &c->w, s + c->pieces.v[k].off, c->pieces.v[k].len, out);
    free(norm);
    free(match);
    return st;
}

/* ----------------------------------------------------------------- SPM */

static cb_status spm_fragment(const cb_vocab *v, work *w, const char *text, size_t len,
                              int prefix_space, cb_tokens *out)
{
    static const char esc[3] = {'\xe2', '\x96', '\x81'}; /* U+2581 */
    w->buf.n = 0;
    if (prefix_space && sb_add(&w->buf, esc, 3) != CB_OK)
        return CB_ERR_NOMEM;
    for (size_t i = 0; i < len; i++) {
        cb_status st = text[i] == ' ' ? sb_add(&w->buf, esc, 3) : sb_add(&w->buf, text + i, 1);
        if (st != CB_OK)
            return st;
    }
    if (split_symbols(w) != CB_OK || merge_all(v, w) != CB_OK)
        return CB_ERR_NOMEM;
    for (int32_t i = 0; w->n_syms && i != -1; i = w->syms[i].next) {
        const sym *sy = &w->syms[i];
        int32_t id = token_find(v, w->buf.p + sy->off, sy->n);
        if (id != NO_TOKEN) {
            if (cb_tokens_push(out, id) != CB_OK)
                return CB_ERR_NOMEM;
            continue;
        }
        /* Byte fallback.  (llama.cpp's rev_merge re-segmentation never fires
         * here: a merged symbol is always a token.)  A vocabulary without the
         * byte token makes llama.cpp throw; we use the unknown token. */
        for (uint32_t j = 0; j < sy->n; j++) {
            int32_t b = v->byte_tok[(unsigned char)w->buf.p[sy->off + j]];
            if (b == NO_TOKEN)
                b = v->unk;
            if (b != NO_TOKEN && cb_tokens_push(out, b) != CB_OK)
                return CB_ERR_NOMEM;
        }
    }
    return CB_OK;
}

/* ------------------------------------------------------- special tokens */

/* A fragment: raw text s[off..off+len) or a token (len == 0, id >= 0). */
typedef struct frag {
    size_t off, len;
    int32_t id;
} frag;

typedef struct frags {
    frag *v;
    size_t n, cap;
} frags;

static cb_status frags_push(frags *f, size_t off, size_t len, int32_t id)
{
    if (f->n == f->cap) {
        size_t c = f->cap ? 2 * f->cap : 16;
        frag *p = realloc(f->v, c * sizeof *p);
        if (!p)
            return CB_ERR_NOMEM;
        f->v = p;
        f->cap = c;
    }
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->v[f->n].id = id;
    f->n++;
    return CB_OK;
}

static int is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Cut special tokens out of the text, longest first, each one everywhere it
 * occurs in the raw fragments left by the longer ones (llama.cpp's
 * tokenizer_st_partition). */
static cb_status partition(const cb_vocab *v, const char *text, size_t len, int parse_special,
                           frags *f, frags *tmp)
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
            if (fr.id >= 0 || rem < t->len ||
                !(m = memmem(text + off, rem, ts, t->len))) {
                if (frags_push(tmp, fr.off, fr.len, fr.id) != CB_OK)
                    goto nomem;
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
                    goto nomem;
                if (frags_push(tmp, 0, 0, id) != CB_OK)
                    goto nomem;
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
                goto nomem;
        }
        if (any) {
            frags x = *f;
            *f = *tmp;
            *tmp = x;
        }
    }
    free(pairs);
    return CB_OK;
nomem:
    free(pairs);
    return CB_ERR_NOMEM;
}

cb_status cb_tok_encode(const cb_vocab *v, const char *text, size_t len, unsigned flags,
                        cb_tokens *out)
{
    int add_special = (flags & CB_TOK_ADD_SPECIAL) != 0;
    size_t n0 = out->n;
    frags f = {0}, tmp = {0};
    bpe_ctx c = {0};
    cb_status st;

    c.w.spm = v->kind == CB_VOCAB_SPM;
    if ((st = partition(v, text, len, (flags & CB_TOK_PARSE_SPECIAL) != 0, &f, &tmp)) != CB_OK)
        goto done;
    if (add_special && v->add_bos && (st = cb_tokens_push(out, v->bos)) != CB_OK)
        goto done;
    if (v->kind == CB_VOCAB_BPE) {
        c.md = pcre2_match_data_create(1, NULL);
        if (!c.md) {
            st = CB_ERR_NOMEM;
            goto done;
        }
        for (size_t k = 0; k < f.n && st == CB_OK; k++)
            st = f.v[k].id >= 0 ? cb_tokens_push(out, f.v[k].id)
                                : bpe_fragment(v, &c, text + f.v[k].off, f.v[k].len, out);
    } else {
        /* A space goes before the first text and before text that follows a
         * special token. */
        int prev_special = 1;
        for (size_t k = 0; k < f.n && st == CB_OK; k++) {
            if (f.v[k].id >= 0) {
                st = cb_tokens_push(out, f.v[k].id);
                prev_special = 1;
            } else {
                st = spm_fragment(v, &c.w, text + f.v[k].off, f.v[k].len,
                                  v->add_space_prefix && prev_special, out);
                prev_special = 0;
            }
        }
    }
    if (st == CB_OK && add_special && v->add_eos)
        st = cb_tokens_push(out, v->eos);
done:
    if (st != CB_OK)
        out->n = n0;
    free(f.v);
    free(tmp.v);
    free(c.pieces.v);
    free(c.tmp.v);
    pcre2_match_data_free(c.md);
    work_free(&c.w);
    return st;
}

/* -------------------------------------------------------------- decoding */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The byte of a <0xXX> token, read as strtol(text.substr(3, 2), 16) does. */
static unsigned char byte_of(const char *s, size_t n)
{
    int v = 0;
    for (size_t i = 3; i < 5 && i < n; i++) {
        int h = hexval(s[i]);
        if (h < 0)
            break;
        v = v * 16 + h;
    }
    return (unsigned char)v;
}

/* Append the piece of token id to b, skipping up to lstrip leading spaces
 * (llama.cpp's token_to_piece). */
static cb_status piece(const cb_vocab *v, int32_t id, int special, int lstrip, strbuf *b)
{
    const tok_entry *t = &v->tok[id];
    const char *s = v->text + t->off;
    size_t n = t->len, start = b->n;
    cb_status st = CB_OK;

    if (!special && (t->attr & (CB_TOKEN_UNKNOWN | CB_TOKEN_CONTROL)))
        return CB_OK;
    if (t->attr & TOK_SPECIAL_ATTRS) {
        st = sb_add(b, s, n);
    } else if (t->attr & CB_TOKEN_NORMAL) {
        if (v->kind == CB_VOCAB_SPM) {
            for (size_t i = 0; i < n && st == CB_OK; i++) {
                if (i + 2 < n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    st = sb_add(b, " ", 1);
                    i += 2;
                } else {
                    st = sb_add(b, s + i, 1);
                }
            }
        } else {
            /* Byte-level: each code point back to its byte.  One outside the
             * table renders as llama.cpp's "[UNK_BYTE_0x..<token>]". */
            size_t i = 0;
            while (i < n && st == CB_OK) {
                size_t j = i;
                int32_t cp = utf8_decode((const unsigned char *)s, n, &j);
                if (cp < 0) {
                    cp = 0xfffd;
                    j = i + 1;
                }
                if (cp < 0x144 && v->bdec[cp] >= 0) {
                    char c = (char)v->bdec[cp];
                    st = sb_add(b, &c, 1);
                } else {
                    char u[4], hex[32];
                    size_t k = utf8_encode((uint32_t)cp, u), o = 0;
                    o += (size_t)snprintf(hex, sizeof hex, "[UNK_BYTE_0x");
                    for (size_t q = 0; q < k; q++)
                        o += (size_t)snprintf(hex + o, sizeof hex - o, "%02x", (unsigned char)u[q]);
                    st = sb_add(b, hex, o);
                    if (st == CB_OK)
                        st = sb_add(b, s, n);
                    if (st == CB_OK)
                        st = sb_add(b, "]", 1);
                }
                i = j;
            }
        }
    } else if (t->attr & CB_TOKEN_BYTE) {
        char c = (char)byte_of(s, n);
        st = sb_add(b, &c, 1);
    }
    if (st == CB_OK && lstrip && b->n > start && b->p[start] == ' ') {
        memmove(b->p + start, b->p + start + 1, b->n - start - 1);
        b->n--;
    }
    return st;
}

cb_status cb_tok_piece(const cb_vocab *v, int32_t id, unsigned flags, char **buf, size_t *len,
                       size_t *cap)
{
    strbuf b = {*buf, *len, *cap};
    cb_status st;
    if (id < 0 || id >= v->n_tokens)
        return CB_ERR_RANGE;
    st = piece(v, id, (flags & CB_DETOK_UNPARSE_SPECIAL) != 0, 0, &b);
    *buf = b.p;
    *cap = b.cap;
    if (st == CB_OK)
        *len = b.n;
    return st;
}

/* llama.cpp's clean_spaces passes: " ?" " !" " ." " ," lose the space,
 * " ' " loses both, and " 's" " 'm" " 're" " 've" lose theirs. */
static size_t clean_spaces(char *t, size_t total)
{
    size_t n = total ? 1 : 0;
    for (size_t i = 1; i < total; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            n--;
        t[n++] = x;
    }
    total = n;
    n = total ? 1 : 0;
    for (size_t i = 1; i < total; i++) {
        char x = t[i];
        if (x == '\'' && i + 1 < total && t[i - 1] == ' ' && t[i + 1] == ' ') {
            n--;
            t[++i] = 0;
        }
        t[n++] = x;
    }
    total = n;
    n = total ? 1 : 0;
    for (size_t i = 1; i < total; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < total) {
            char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm')
                n--;
            else if (x1 != 't' && x1 != 'd' && i + 2 < total) {
                char x2 = t[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e'))
                    n--;
            }
        }
        t[n++] = x;
    }
    return n;
}

cb_status cb_tok_decode(const cb_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                        char **text, size_t *len)
{
    strbuf b = {0};
    int remove_space = v->add_space_prefix;
    int special = (flags & CB_DETOK_UNPARSE_SPECIAL) != 0;
    cb_status st = CB_OK;

    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= v->n_tokens)
            return CB_ERR_RANGE;
    if ((flags & CB_DETOK_REMOVE_SPECIAL) && v->add_bos && n > 0 && ids[0] == v->bos) {
        /* llama.cpp keeps the leading space when it drops the BOS. */
        remove_space = 0;
        ids++;
        n--;
    }
    if ((flags & CB_DETOK_REMOVE_SPECIAL) && v->add_eos && n > 0 && ids[n - 1] == v->eos)
        n--;
    if (sb_reserve(&b.p, &b.cap, 1) != CB_OK)
        return CB_ERR_NOMEM;
    for (size_t i = 0; i < n && st == CB_OK; i++) {
        st = piece(v, ids[i], special, remove_space, &b);
        remove_space = 0;
    }
    if (st != CB_OK) {
        free(b.p);
        return st;
    }
    if (v->clean_spaces)
        b.n = clean_spaces(b.p, b.n);
    b.p[b.n] = 0;
    *text = b.p;
    *len = b.n;
    return CB_OK;
}
