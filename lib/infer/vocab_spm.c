/* vocab_spm.c - SentencePiece-style ("llama"): spaces become U+2581, a
 * space is prefixed, symbols are merged by score, and what is left outside
 * the vocabulary falls back to <0xXX> byte tokens. */
#include "vocab_impl.h"

#include <stdio.h>

/* The byte fallback: <0xXX>, or a token that is the byte itself.  (llama.cpp's
 * rev_merge re-segmentation never fires here: a merged symbol is always a
 * token.)  A vocabulary with neither makes llama.cpp throw; vc_merge_emit
 * then uses the unknown token. */
void vc_spm_init(cb_vocab *v)
{
    for (int b = 0; b < 256; b++) {
        char hex[8];
        char one = (char)b;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        v->byte_tok[b] = token_find_str(v, hex);
        if (v->byte_tok[b] == NO_TOKEN)
            v->byte_tok[b] = token_find(v, &one, 1);
    }
}

/* One fragment of raw text (between special tokens), with a space marker
 * in front when prefix_space. */
cb_status vc_spm_fragment(const cb_vocab *v, work *w, const char *text, size_t len,
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
    return vc_merge_emit(v, w, out);
}
