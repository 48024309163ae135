/* chunk.c - splitting documents into chunks by tokens or characters, and
 * UTF-8 validation and repair (the rules are in cbcore.h, "chunker").
 *
 * Token chunking in linear time: each piece of a document (the whole
 * document, or the text between two separator matches) is tokenized once;
 * the end offset of every token gives, from any start position, the byte
 * where the limit falls.  The cut is chosen in that window by class
 * (paragraph > sentence > line > word > character), and the chosen text is
 * then tokenized alone, because the limit is defined on the chunk's own
 * tokens and they can differ from the document's at both edges (a leading
 * space merged into a token, a different split of a word).  When the count
 * is over the limit the window shrinks by the excess and the cut is chosen
 * again; one retry is the usual worst case.  So a document costs about two
 * tokenizations, whatever its size. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "infer.h"
#include "../core/vec.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

struct cb_chunker {
    const cb_vocab *vocab; /* borrowed; NULL: characters */
    int32_t max, overlap;
    pcre2_code *re; /* separator, or NULL */
    pcre2_match_data *md;
    uint32_t *piece_len; /* [n_vocab] bytes each token stands for */
    cb_tokens glob;      /* the tokens of the piece being chunked */
    cb_tokens loc;       /* scratch: the tokens of one candidate chunk */
    size_t *tend;        /* [glob.n] end offset of token i in the document */
    size_t tend_cap;
};

/* Classes of cut points, weakest first. */
enum { CUT_CHAR, CUT_WORD, CUT_LINE, CUT_SENT, CUT_PARA };

/* ------------------------------------------------------------------ UTF-8 */

/* Length of the valid UTF-8 sequence at s[0..n) (n >= 1), or 0 with *bad set
 * to the length of its maximal invalid subpart (at least 1). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xbf;
    size_t need, k;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f; /* nothing above U+10FFFF */
    } else {
        *bad = 1;
        return 0;
    }
    for (k = 1; k <= need; k++) {
        unsigned b;
        if (k >= n) {
            *bad = k;
            return 0;
        }
        b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) {
            *bad = k;
            return 0;
        }
    }
    return need + 1;
}

size_t cb_utf8_check(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, bad;

    while (i < n) {
        /* ASCII runs eight bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i, &bad);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

cb_status cb_utf8_repair(const char *text, size_t n, char **out, size_t *out_len, size_t *n_bad)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, o = 0, nb = 0, cap = n + n / 8 + 16;
    char *buf = malloc(cap);

    if (!buf)
        return CB_ERR_NOMEM;
    while (i < n) {
        size_t bad = 0, k = utf8_seq(s + i, n - i, &bad);
        size_t add = k ? k : 3;
        if (o + add + 1 > cap) {
            size_t nc = cap * 2 + add + 1;
            char *nbuf = realloc(buf, nc);
            if (!nbuf) {
                free(buf);
                return CB_ERR_NOMEM;
            }
            buf = nbuf;
            cap = nc;
        }
        if (k) {
            memcpy(buf + o, s + i, k);
            i += k;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            i += bad;
            nb++;
        }
        o += add;
    }
    buf[o] = 0;
    *out = buf;
    *out_len = o;
    if (n_bad)
        *n_bad = nb;
    return CB_OK;
}

/* Text below is valid UTF-8: a byte 10xxxxxx continues a sequence. */
static int is_cont(unsigned char c) { return (c & 0xc0) == 0x80; }

static size_t next_char(const char *t, size_t i, size_t end)
{
    if (i >= end)
        return end;
    i++;
    while (i < end && is_cont((unsigned char)t[i]))
        i++;
    return i;
}

static size_t prev_char(const char *t, size_t i, size_t lo)
{
    if (i <= lo)
        return lo;
    i--;
    while (i > lo && is_cont((unsigned char)t[i]))
        i--;
    return i;
}

/* Move pos down to the start of the character holding it (not below lo). */
static size_t snap_down(const char *t, size_t lo, size_t pos)
{
    while (pos > lo && is_cont((unsigned char)t[pos]))
        pos--;
    return pos;
}

/* Bytes of the whitespace character at t[i] (i < end), else 0: ASCII
 * whitespace, NEL, NBSP, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F,
 * U+205F, U+3000 and U+FEFF (the byte order mark, a no-break space). */
static size_t ws_len(const char *t, size_t i, size_t end)
{
    const unsigned char *s = (const unsigned char *)t + i;
    size_t n = end - i;

    if (i >= end)
        return 0;
    switch (s[0]) {
    case ' ':
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r': return 1;
    case 0xc2: return n >= 2 && (s[1] == 0x85 || s[1] == 0xa0) ? 2 : 0;
    case 0xe1: return n >= 3 && s[1] == 0x9a && s[2] == 0x80 ? 3 : 0;
    case 0xe2:
        if (n < 3)
            return 0;
        if (s[1] == 0x80 && (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
            return 3;
        return s[1] == 0x81 && s[2] == 0x9f ? 3 : 0;
    case 0xe3: return n >= 3 && s[1] == 0x80 && s[2] == 0x80 ? 3 : 0;
    case 0xef: return n >= 3 && s[1] == 0xbb && s[2] == 0xbf ? 3 : 0;
    }
    return 0;
}

/* 1 when the character ending at t[i] (after lo) is whitespace. */
static int ws_before(const char *t, size_t lo, size_t i)
{
    size_t j;
    if (i <= lo)
        return 0;
    if ((unsigned char)t[i - 1] < 0x80)
        return ws_len(t, i - 1, i) != 0;
    j = prev_char(t, i, lo);
    return ws_len(t, j, i) == i - j;
}

static size_t skip_ws(const char *t, size_t i, size_t end)
{
    size_t w;
    while (i < end && (w = ws_len(t, i, end)) != 0)
        i += w;
    return i;
}

static size_t trim_end(const char *t, size_t lo, size_t end)
{
    while (end > lo && ws_before(t, lo, end))
        end = prev_char(t, end, lo);
    return end;
}

/* Class of the whitespace run starting at t[p]: a paragraph break holds two
 * line ends (or U+2029), a line break one. */
static int run_class(const char *t, size_t p, size_t end)
{
    int lines = 0;
    size_t w;
    while (p < end && (w = ws_len(t, p, end)) != 0) {
        unsigned char c = (unsigned char)t[p];
        if (c == '\n' || (c == '\r' && !(p + 1 < end && t[p + 1] == '\n')) || c == '\v' ||
            c == '\f')
            lines++;
        else if (w == 2 && (unsigned char)t[p + 1] == 0x85) /* NEL */
            lines++;
        else if (w == 3 && c == 0xe2 && (unsigned char)t[p + 2] == 0xa8) /* U+2028 */
            lines++;
        else if (w == 3 && c == 0xe2 && (unsigned char)t[p + 2] == 0xa9) /* U+2029 */
            lines += 2;
        if (lines >= 2)
            return CUT_PARA;
        p += w;
    }
    return lines ? CUT_LINE : CUT_WORD;
}

/* Closing quotes and brackets that may follow a sentence's last mark. */
static int is_closer(const char *s, size_t n)
{
    static const char *const cl[] = {"\xe2\x80\x9d", "\xe2\x80\x99", "\xc2\xbb", "\xe3\x80\x8d",
                                     "\xe3\x80\x8f", "\xef\xbc\x89", NULL};
    if (n == 1)
        return s[0] == '"' || s[0] == '\'' || s[0] == ')' || s[0] == ']' || s[0] == '}';
    for (int k = 0; cl[k]; k++)
        if (strlen(cl[k]) == n && memcmp(s, cl[k], n) == 0)
            return 1;
    return 0;
}

/* 1 when a sentence ends right before t[p]: . ! ? or an ellipsis followed
 * by whitespace (ws_after), or a CJK full stop, exclamation or question
 * mark, either followed by up to three closers. */
static int sentence_end_before(const char *t, size_t lo, size_t p, int ws_after)
{
    size_t i = p, j;
    for (int k = 0; k < 3 && i > lo; k++) {
        j = prev_char(t, i, lo);
        if (!is_closer(t + j, i - j))
            break;
        i = j;
    }
    if (i <= lo)
        return 0;
    j = prev_char(t, i, lo);
    if (i - j == 1)
        return ws_after && (t[j] == '.' || t[j] == '!' || t[j] == '?');
    if (i - j == 3) {
        if (memcmp(t + j, "\xe2\x80\xa6", 3) == 0) /* ellipsis */
            return ws_after;
        return memcmp(t + j, "\xe3\x80\x82", 3) == 0 || memcmp(t + j, "\xef\xbc\x81", 3) == 0 ||
               memcmp(t + j, "\xef\xbc\x9f", 3) == 0;
    }
    return 0;
}

/* The cut for a chunk that starts at s and may end at emax at the latest
 * (s < emax < end of the piece, emax on a character boundary): returns the
 * end of the chunk's text, > s. */
static size_t choose_cut(const char *t, size_t s, size_t emax, size_t end)
{
    size_t half = s + (emax - s) / 2, best = emax, p = emax;
    int best_class = -1;

    if (emax <= s)
        return next_char(t, s, end);
    while (p > s) {
        int cls = -1;
        unsigned char prev = (unsigned char)t[p - 1];
        if (ws_len(t, p, end)) {
            if (!ws_before(t, s, p)) { /* the start of a whitespace run */
                cls = run_class(t, p, end);
                if (cls < CUT_SENT && sentence_end_before(t, s, p, 1))
                    cls = CUT_SENT;
                if (p < half && cls > CUT_WORD)
                    cls = CUT_WORD;
            }
        } else if (p >= half && (prev >= 0x80 || prev == '"' || prev == '\'' || prev == ')') &&
                   sentence_end_before(t, s, p, 0)) {
            cls = CUT_SENT; /* CJK marks need no space after them */
        }
        if (cls > best_class) {
            best_class = cls;
            best = p;
            if (cls == CUT_PARA)
                break;
        }
        if (p < half && best_class >= CUT_WORD)
            break;
        p = prev_char(t, p, s);
    }
    return best_class < 0 ? emax : best;
}

/* --------------------------------------------------------------- chunker */

void cb_chunks_free(cb_chunks *c)
{
    if (!c)
        return;
    free(c->v);
    memset(c, 0, sizeof *c);
}

void cb_chunker_free(cb_chunker *c)
{
    if (!c)
        return;
    pcre2_match_data_free(c->md);
    pcre2_code_free(c->re);
    free(c->piece_len);
    cb_tokens_free(&c->glob);
    cb_tokens_free(&c->loc);
    free(c->tend);
    free(c);
}

cb_status cb_chunker_new(cb_chunker **out, const cb_chunker_params *p, cb_error *err)
{
    cb_chunker *c;
    cb_status st = CB_OK;

    if (!out || !p)
        return cb_error_set(err, CB_ERR_INVALID, "chunker: no parameters");
    if (p->max < 0)
        return cb_error_set(err, CB_ERR_INVALID, "chunk size %d is negative", (int)p->max);
    if (p->overlap < 0 || (p->overlap > 0 && p->overlap >= p->max))
        return cb_error_set(err, CB_ERR_INVALID,
                            "overlap %d must be at least 0 and less than the chunk size %d",
                            (int)p->overlap, (int)p->max);
    c = calloc(1, sizeof *c);
    if (!c)
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    c->vocab = p->vocab;
    c->max = p->max;
    c->overlap = p->overlap;
    if (p->separator && *p->separator) {
        int ec;
        PCRE2_SIZE eo;
        c->re = pcre2_compile((PCRE2_SPTR)p->separator, PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &ec, &eo, NULL);
        if (!c->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            st = cb_error_set(err, CB_ERR_INVALID, "separator '%s': %s at offset %zu", p->separator,
                              (const char *)msg, (size_t)eo);
            goto fail;
        }
        (void)pcre2_jit_compile(c->re, PCRE2_JIT_COMPLETE);
        c->md = pcre2_match_data_create_from_pattern(c->re, NULL);
        if (!c->md)
            goto nomem;
    }
    if (c->vocab) {
        int32_t nv = cb_vocab_n_tokens(c->vocab);
        char *buf = NULL;
        size_t cap = 0;
        c->piece_len = calloc((size_t)(nv > 0 ? nv : 1), sizeof *c->piece_len);
        if (!c->piece_len)
            goto nomem;
        for (int32_t id = 0; id < nv; id++) {
            size_t len = 0;
            if (cb_tok_piece(c->vocab, id, 0, &buf, &len, &cap) == CB_OK)
                c->piece_len[id] = (uint32_t)len;
        }
        free(buf);
    }
    *out = c;
    return CB_OK;
nomem:
    st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
fail:
    cb_chunker_free(c);
    return st;
}

static cb_status emit(cb_chunks *out, const char *t, size_t s, size_t e, int32_t n_tokens)
{
    cb_chunk *ch;
    if (out->n == out->cap) {
        cb_chunk *v = cb_vec_reserve(out->v, &out->cap, out->n + 1, sizeof *v, 64);
        if (!v)
            return CB_ERR_NOMEM;
        out->v = v;
    }
    ch = &out->v[out->n++];
    memset(ch, 0, sizeof *ch);
    ch->start = s;
    ch->end = e;
    ch->n_tokens = n_tokens;
    cb_hash128_hex(cb_hash128_bytes(t + s, e - s), ch->id);
    return CB_OK;
}

/* Tokens of t[s..e) alone. */
static cb_status count_tokens(cb_chunker *c, const char *t, size_t s, size_t e, int32_t *n)
{
    cb_status st;
    c->loc.n = 0;
    if ((st = cb_tok_encode(c->vocab, t + s, e - s, 0, &c->loc)) != CB_OK)
        return st;
    *n = c->loc.n > INT32_MAX ? INT32_MAX : (int32_t)c->loc.n;
    return CB_OK;
}

/* Tokenize the piece t[a..b) into c->glob and the end offset of each token
 * into c->tend.  The pieces of the tokens spell the text exactly for
 * byte-level BPE; SentencePiece vocabs may add one leading space; anything
 * else (a vocab whose pieces do not spell the text) gets proportional
 * offsets, which only cost extra retries, since every chunk is counted alone. */
static cb_status tokenize_piece(cb_chunker *c, const char *t, size_t a, size_t b)
{
    size_t plen = b - a, total = 0;
    cb_status st;

    c->glob.n = 0;
    if ((st = cb_tok_encode(c->vocab, t + a, plen, 0, &c->glob)) != CB_OK)
        return st;
    if (c->glob.n > c->tend_cap) {
        size_t nc = c->glob.n + c->glob.n / 2 + 16;
        size_t *v = realloc(c->tend, nc * sizeof *v);
        if (!v)
            return CB_ERR_NOMEM;
        c->tend = v;
        c->tend_cap = nc;
    }
    for (size_t i = 0; i < c->glob.n; i++) {
        int32_t id = c->glob.ids[i];
        total += id >= 0 && id < cb_vocab_n_tokens(c->vocab) ? c->piece_len[id] : 0;
        c->tend[i] = total;
    }
    for (size_t i = 0; i < c->glob.n; i++) {
        size_t o = c->tend[i];
        if (total == plen)
            ;
        else if (total == plen + 1)
            o = o ? o - 1 : 0;
        else
            o = total ? (size_t)((double)o * (double)plen / (double)total) : plen;
        c->tend[i] = a + (o > plen ? plen : o);
    }
    return CB_OK;
}

/* Number of piece tokens that end at or before pos. */
static size_t tok_index(const cb_chunker *c, size_t pos)
{
    size_t lo = 0, hi = c->glob.n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->tend[mid] <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Where a chunk starting at s reaches the limit (a character boundary), or
 * b when the rest of the piece is within it. */
static size_t window_end(const cb_chunker *c, const char *t, size_t s, size_t b)
{
    if (c->vocab) {
        size_t i0 = tok_index(c, s), pos;
        if (i0 + (size_t)c->max >= c->glob.n)
            return b;
        pos = c->tend[i0 + (size_t)c->max - 1];
        return pos >= b ? b : snap_down(t, s, pos);
    }
    size_t i = s;
    for (int32_t k = 0; k < c->max && i < b; k++)
        i = next_char(t, i, b);
    return i;
}

/* The first word start at or after q and before lim (a non-space character
 * after a space), or lim. */
static size_t word_start(const char *t, size_t lo, size_t q, size_t lim)
{
    while (q < lim && (ws_len(t, q, lim) || !ws_before(t, lo, q)))
        q = next_char(t, q, lim);
    return q;
}

/* Start of the next chunk when it repeats the end of the chunk [s, et). */
static size_t overlap_start(const cb_chunker *c, const char *t, size_t a, size_t s, size_t et)
{
    size_t q;
    if (c->vocab) {
        size_t k = tok_index(c, et);
        if (k <= (size_t)c->overlap)
            return s;
        q = c->tend[k - (size_t)c->overlap - 1];
        while (q < et && is_cont((unsigned char)t[q])) /* up: never more than N tokens */
            q++;
    } else {
        q = et;
        for (int32_t k = 0; k < c->overlap && q > s; k++)
            q = prev_char(t, q, s);
    }
    if (q <= s)
        return s;
    return word_start(t, a, q, et);
}

/* Chunk the piece t[a..b). */
static cb_status split_piece(cb_chunker *c, const char *t, size_t a, size_t b, cb_chunks *out)
{
    cb_status st;
    size_t s;

    a = skip_ws(t, a, b);
    b = trim_end(t, a, b);
    if (a >= b)
        return CB_OK;
    if (c->vocab) {
        if ((st = tokenize_piece(c, t, a, b)) != CB_OK)
            return st;
        if (c->max == 0 || c->glob.n <= (size_t)c->max)
            return emit(out, t, a, b, (int32_t)c->glob.n);
    } else if (c->max == 0) {
        return emit(out, t, a, b, -1);
    }
    s = a;
    size_t prev_et = a, prev_e = a;
    int overlapped = 0;
    while (s < b) {
        size_t emax = window_end(c, t, s, b);
        size_t e = emax >= b ? b : choose_cut(t, s, emax, b);
        size_t et, next;
        int32_t n = -1;
        for (;;) {
            et = trim_end(t, s, e);
            if (!c->vocab)
                break;
            if ((st = count_tokens(c, t, s, et, &n)) != CB_OK)
                return st;
            if (n <= c->max || next_char(t, s, b) >= et)
                break; /* fits, or a single character: nothing smaller to offer */
            size_t k = tok_index(c, et), excess = (size_t)(n - c->max);
            size_t lim = k > excess ? c->tend[k - excess - 1] : s;
            lim = snap_down(t, s, lim < et ? lim : et);
            if (lim >= et)
                lim = prev_char(t, et, s);
            e = lim <= s ? next_char(t, s, b) : choose_cut(t, s, lim, b);
        }
        if (overlapped && et <= prev_et) {
            /* The overlap gave a chunk inside the previous one (it ends at
             * the same cut): nothing new, so go on from that cut without. */
            overlapped = 0;
            s = skip_ws(t, prev_e, b);
            continue;
        }
        if ((st = emit(out, t, s, et, n)) != CB_OK)
            return st;
        if (e >= b)
            break;
        next = e;
        overlapped = 0;
        if (c->overlap > 0) {
            size_t q = overlap_start(c, t, a, s, et);
            if (q > s && q < et)
                next = q, overlapped = 1;
        }
        prev_et = et;
        prev_e = e;
        s = skip_ws(t, next, b);
    }
    return CB_OK;
}

cb_status cb_chunker_split(cb_chunker *c, const char *text, size_t len, cb_chunks *out)
{
    size_t n0 = out->n, a = 0, pos, ps;
    cb_status st = CB_OK;

    if (!c || (!text && len))
        return CB_ERR_INVALID;
    if (cb_utf8_check(text, len) != len)
        return CB_ERR_INVALID;
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        a = 3;
    if (!c->re) {
        st = split_piece(c, text, a, len, out);
        goto done;
    }
    pos = ps = a;
    while (pos <= len) {
        int rc = pcre2_match(c->re, (PCRE2_SPTR)text, len, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        PCRE2_SIZE *ov;
        size_t ms, me;
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            st = rc == PCRE2_ERROR_NOMEMORY ? CB_ERR_NOMEM : CB_ERR_INVALID;
            goto done;
        }
        ov = pcre2_get_ovector_pointer(c->md);
        ms = ov[0];
        me = ov[1] < ov[0] ? ov[0] : ov[1]; /* \K can end a match before its start */
        if (me == ms) { /* an empty match (a lookahead) cuts without dropping text */
            if (ms > ps) {
                if ((st = split_piece(c, text, ps, ms, out)) != CB_OK)
                    goto done;
                ps = ms;
            }
            if (ms >= len)
                break;
            pos = next_char(text, ms, len);
            continue;
        }
        if ((st = split_piece(c, text, ps, ms, out)) != CB_OK)
            goto done;
        ps = pos = me;
    }
    st = split_piece(c, text, ps, len, out);
done:
    if (st != CB_OK)
        out->n = n0;
    return st;
}
