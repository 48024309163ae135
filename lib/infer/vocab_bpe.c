/* vocab_bpe.c - byte-level BPE ("gpt2"): each byte of a pre-tokenized
 * word becomes a printable code point (GPT-2's byte-to-unicode table), then
 * the word's symbols are merged by rank. */
#include "vocab_impl.h"

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves,
 * the other 68 bytes to U+0100.. in byte order.  The byte fallback of a
 * merged symbol outside the vocabulary: llama.cpp looks up each byte of the
 * (byte-encoded) text as a one-byte token and drops the misses. */
void vc_bpe_init(cb_vocab *v)
{
    int n = 0;
    for (int i = 0; i < 0x144; i++)
        v->bdec[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        char one = (char)b;
        v->benc_len[b] = (unsigned char)utf8_encode(cp, v->benc[b]);
        v->bdec[cp] = (int16_t)b;
        v->byte_tok[b] = token_find(v, &one, 1);
    }
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
    return vc_merge_emit(v, w, out);
}

/* One fragment of raw text (between special tokens): normalised,
 * pre-tokenized into words, each word merged. */
cb_status vc_bpe_fragment(const cb_vocab *v, bpe_ctx *c, const char *text, size_t len,
                          cb_tokens *out)
{
    char *norm, *match;
    size_t n;
    cb_status st = vc_normalize_utf8(text, len, &norm, &match, &n);
    const char *s = norm ? norm : text;
    if (st != CB_OK)
        return st;
    st = vc_pretokenize(v, match ? match : text, n, c->md, &c->pieces, &c->tmp);
    for (size_t k = 0; st == CB_OK && k < c->pieces.n; k++)
        st = bpe_word(v, &c->w, s + c->pieces.v[k].off, c->pieces.v[k].len, out);
    free(norm);
    free(match);
    return st;
}
