/* vocab_pretok.c - the byte-level BPE pre-tokenizers: the regex lists
 * llama.cpp picks by tokenizer.ggml.pre, compiled for PCRE2, run in sequence
 * over the text, and the UTF-8 normalisation the text gets first. */
#include "vocab_impl.h"

/* ------------------------------------------------------------ pre-tokenizers */

/* Regex lists as llama.cpp spells them (llm_tokenizer_bpe constructor).  Each
 * regex splits the pieces the previous one produced; text a regex does not
 * match stays a piece of its own. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                              \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                               \
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

/* The pre-tokenizers by name (struct pre_def in vocab_impl.h). */
static const struct pre_def pre_defs[] = {
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

/* The pre-tokenizer of that name; an absent or empty name is "default". */
const struct pre_def *vc_pre_find(cb_strview name)
{
    if (!name.data || name.len == 0)
        return &pre_defs[0];
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++)
        if (cb_strview_eq(name, pre_defs[i].name))
            return &pre_defs[i];
    return NULL;
}

/* Compile one of llama.cpp's regexes for PCRE2.  One rewrite: llama.cpp's
 * whitespace is the Unicode White_Space property (from its own tables),
 * while PCRE2's \s also takes U+180E (it keeps the pre-Unicode-6.3 list of
 * horizontal spaces), so \s and \S become explicit White_Space classes. */
#define WHITE_SPACE                                                                          \
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

/* v->pre's regex list, compiled into v->re. */
cb_status vc_pre_compile(cb_vocab *v, cb_error *err)
{
    const char *const *list = pre_regex_lists[v->pre->regexes];
    cb_status st;
    for (int i = 0; list[i]; i++)
        if ((st = compile_regex(v, list[i], err)) != CB_OK)
            return st;
    return CB_OK;
}

static cb_status spans_push(spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        span *p = cb_vec_reserve(s->v, &s->cap, s->n + 1, sizeof *p, 64);
        if (!p)
            return CB_ERR_NOMEM;
        s->v = p;
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
cb_status vc_pretokenize(const cb_vocab *v, const char *s, size_t n, pcre2_match_data *md,
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
                int rc =
                    pcre2_match(v->re[r], (PCRE2_SPTR)p, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
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
cb_status vc_normalize_utf8(const char *text, size_t len, char **norm, char **match,
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
