/* vocab_impl.h - the tokenizer (private): vocabularies read from GGUF
 * metadata, encoding and decoding that give the same ids and bytes as
 * llama.cpp (src/llama-vocab.cpp, src/unicode.cpp).
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
 * point of these files is identical ids, not a nicer tokenizer.
 *
 * The tokenizer's files, one concern each:
 *   vocab_load.c     cb_vocab_load: tokens, scores, types, merges, lookup tables
 *   vocab_special.c  special ids, the end-of-generation set, cutting special
 *                    tokens out of the text (partition)
 *   vocab_pretok.c   the pre-tokenizers (regex lists per tokenizer.ggml.pre)
 *                    and the UTF-8 normalisation before them
 *   vocab_bpe.c      byte-level BPE: the byte map, one word's merges
 *   vocab_spm.c      SentencePiece: the space marker, byte-fallback tokens
 *   vocab_encode.c   the symbol merging both models share, the emission of
 *                    merged symbols as tokens, cb_tok_encode
 *   vocab_decode.c   token pieces and cb_tok_decode
 * The lookups and UTF-8 helpers on the hot paths are inline here. */
#ifndef CB_VOCAB_IMPL_H
#define CB_VOCAB_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "infer.h"
#include "../core/vec.h"

#include <pcre2.h>
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

/* A pre-tokenizer (vocab_pretok.c): tokenizer.ggml.pre names and what
 * llama.cpp sets for each (llama_vocab::impl::load): the regex list,
 * clean_spaces (the detokenizer's clean-up), ignore_merges (a word that is a
 * token is not merged) and the add_bos default. */
struct pre_def {
    const char *name;
    unsigned char regexes, clean_spaces, ignore_merges, add_bos;
};

/* ------------------------------------------------------------------ vocab */

typedef struct tok_entry {
    uint32_t off, len; /* text in cb_vocab.text */
    float score;
    uint32_t attr; /* CB_TOKEN_* | TOK_LSTRIP | TOK_RSTRIP */
} tok_entry;

struct cb_vocab {
    cb_vocab_kind kind;
    char *pre_name;
    const struct pre_def *pre; /* NULL for SPM */

    int32_t n_tokens;
    tok_entry *tok;
    char *text;     /* all token texts, NUL-separated */
    uint32_t *tmap; /* open addressing: token text -> id + 1 (0 empty) */
    size_t tmap_mask;

    uint32_t n_merges; /* BPE: "left right" strings by rank */
    char *mtext;
    uint32_t *moff, *mlen;
    uint32_t *mmap; /* open addressing: merge string -> rank + 1 */
    size_t mmap_mask;

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix, clean_spaces;

    int32_t *eog; /* sorted end-of-generation ids */
    size_t n_eog;

    int32_t *special; /* ids of control/user-defined/unknown tokens, longest text first */
    size_t n_special;

    size_t max_bytes; /* cb_vocab_max_token_bytes */

    /* Byte fallback for a merged symbol outside the vocabulary: SPM's
     * <0xXX> (or the byte itself), BPE's one-byte token; NO_TOKEN if none. */
    int32_t byte_tok[256];

    /* BPE byte-level mapping: byte -> UTF-8 of its code point, and back. */
    char benc[256][2];
    unsigned char benc_len[256];
    int16_t bdec[0x144]; /* code point -> byte, -1 where none */

    pcre2_code *re[MAX_REGEXES];
    int n_re;
};

/* ---------------------------------------------------------------- lookups */

/* FNV-1a: a well-spread 64-bit hash in a few lines. */
static inline uint64_t fnv_add(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

static inline int32_t token_find(const cb_vocab *v, const char *s, size_t n)
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
static inline int32_t merge_rank(const cb_vocab *v, const char *a, size_t na, const char *b,
                                 size_t nb)
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

static inline int32_t token_find_str(const cb_vocab *v, const char *s)
{
    return token_find(v, s, strlen(s));
}

/* ------------------------------------------------------------------ UTF-8 */

/* Length of a UTF-8 sequence from its first byte, as llama.cpp's
 * unicode_len_utf8: no validation (a stray continuation byte counts 1). */
static inline size_t utf8_len(unsigned char c)
{
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

/* Decode one code point at s[*i] the way llama.cpp's unicode_cpt_from_utf8
 * does: it checks lead and continuation bits but not overlong forms or
 * surrogates.  Returns the code point, or -1 (the caller then takes one byte
 * as U+FFFD, as unicode_cpts_from_utf8 does).  Code points past U+10FFFF are
 * refused too: llama.cpp throws on them later, we treat them as invalid. */
static inline int32_t utf8_decode(const unsigned char *s, size_t n, size_t *i)
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

static inline size_t utf8_encode(uint32_t cp, char *out)
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

typedef struct strbuf {
    char *p;
    size_t n, cap;
} strbuf;

static inline cb_status sb_reserve(char **p, size_t *cap, size_t need)
{
    if (need > *cap) {
        char *q = cb_vec_reserve(*p, cap, need, 1, 64);
        if (!q)
            return CB_ERR_NOMEM;
        *p = q;
    }
    return CB_OK;
}

static inline cb_status sb_add(strbuf *b, const void *s, size_t n)
{
    if (sb_reserve(&b->p, &b->cap, b->n + n + 1) != CB_OK)
        return CB_ERR_NOMEM;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return CB_OK;
}

/* ------------------------------------------------------------- merging */

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
    strbuf buf; /* the word or text being merged */
} work;

/* ------------------------------------------------------------- fragments */

typedef struct span {
    size_t off, len;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

typedef struct bpe_ctx {
    work w;
    spans pieces, tmp;
    pcre2_match_data *md;
} bpe_ctx;

/* A fragment: raw text s[off..off+len) or a token (len == 0, id >= 0). */
typedef struct frag {
    size_t off, len;
    int32_t id;
} frag;

typedef struct frags {
    frag *v;
    size_t n, cap;
} frags;

/* ------------------------------------------------- across the files */

/* vocab_pretok.c: the pre-tokenizer named by tokenizer.ggml.pre (the
 * default for an empty name), or NULL when there is none of that name. */
const struct pre_def *vc_pre_find(cb_strview name);
/* Compile v->pre's regexes into v->re. */
cb_status vc_pre_compile(cb_vocab *v, cb_error *err);
cb_status vc_normalize_utf8(const char *text, size_t len, char **norm, char **match,
                            size_t *out_len);
cb_status vc_pretokenize(const cb_vocab *v, const char *s, size_t n, pcre2_match_data *md,
                         spans *out, spans *tmp);

/* vocab_special.c */
cb_status vc_load_specials(cb_vocab *v, const cb_gguf *g, cb_error *err);
cb_status vc_build_special_cache(cb_vocab *v, const cb_gguf *g);
cb_status vc_partition(const cb_vocab *v, const char *text, size_t len, int parse_special, frags *f,
                       frags *tmp);

/* vocab_bpe.c, vocab_spm.c: the byte tables after the tokens are loaded,
 * and the encoding of one fragment of raw text. */
void vc_bpe_init(cb_vocab *v);
cb_status vc_bpe_fragment(const cb_vocab *v, bpe_ctx *c, const char *text, size_t len,
                          cb_tokens *out);
void vc_spm_init(cb_vocab *v);
cb_status vc_spm_fragment(const cb_vocab *v, work *w, const char *text, size_t len,
                          int prefix_space, cb_tokens *out);

/* vocab_encode.c: merge the symbols of w->buf (BPE by rank, SPM by score)
 * and append the tokens of the merged symbols to out. */
cb_status vc_merge_emit(const cb_vocab *v, work *w, cb_tokens *out);

#endif
