/* vocab_encode.c - the symbol merging BPE and SPM share (a heap of
 * candidate pairs over a linked list of symbols), the emission of merged
 * symbols as tokens, and cb_tok_encode. */
#include "vocab_impl.h"

cb_status cb_tokens_push(cb_tokens *t, int32_t id)
{
    if (t->n == t->cap) {
        int32_t *p = cb_vec_reserve(t->ids, &t->cap, t->n + 1, sizeof *p, 64);
        if (!p)
            return CB_ERR_NOMEM;
        t->ids = p;
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

/* --------------------------------------------------------------- merging */

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
        bigram *p = cb_vec_reserve(w->heap, &w->cap_heap, w->n_heap + 1, sizeof *p, 64);
        if (!p)
            return CB_ERR_NOMEM;
        w->heap = p;
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
            sym *p = cb_vec_reserve(w->syms, &w->cap_syms, w->n_syms + 1, sizeof *p, 256);
            if (!p)
                return CB_ERR_NOMEM;
            w->syms = p;
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

/* Merge the symbols of w->buf and append their tokens to out: a symbol in
 * the vocabulary is its token; any other falls back byte by byte to
 * v->byte_tok (vc_bpe_init, vc_spm_init), then, for SPM, to the unknown
 * token; a byte with neither is dropped. */
cb_status vc_merge_emit(const cb_vocab *v, work *w, cb_tokens *out)
{
    int32_t unk = w->spm ? v->unk : NO_TOKEN;
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
        for (uint32_t j = 0; j < sy->n; j++) {
            id = v->byte_tok[(unsigned char)w->buf.p[sy->off + j]];
            if (id == NO_TOKEN)
                id = unk;
            if (id != NO_TOKEN && cb_tokens_push(out, id) != CB_OK)
                return CB_ERR_NOMEM;
        }
    }
    return CB_OK;
}

static void work_free(work *w)
{
    free(w->syms);
    free(w->heap);
    free(w->buf.p);
}

/* ---------------------------------------------------------------- encode */

cb_status cb_tok_encode(const cb_vocab *v, const char *text, size_t len, unsigned flags,
                        cb_tokens *out)
{
    int add_special = (flags & CB_TOK_ADD_SPECIAL) != 0;
    size_t n0 = out->n;
    frags f = {0}, tmp = {0};
    bpe_ctx c = {0};
    cb_status st;

    c.w.spm = v->kind == CB_VOCAB_SPM;
    st = vc_partition(v, text, len, (flags & CB_TOK_PARSE_SPECIAL) != 0, &f, &tmp);
    if (st != CB_OK)
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
                                : vc_bpe_fragment(v, &c, text + f.v[k].off, f.v[k].len, out);
    } else {
        /* A space goes before the first text and before text that follows a
         * special token. */
        int prev_special = 1;
        for (size_t k = 0; k < f.n && st == CB_OK; k++) {
            if (f.v[k].id >= 0) {
                st = cb_tokens_push(out, f.v[k].id);
                prev_special = 1;
            } else {
                st = vc_spm_fragment(v, &c.w, text + f.v[k].off, f.v[k].len,
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
