/* vocab_decode.c - token pieces (llama.cpp's token_to_piece) and
 * cb_tok_decode with its clean-up of spaces. */
#include "vocab_impl.h"

#include <stdio.h>

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
