/* generate.c - the generation loop after a prefill: sample, stream the
 * text (holding back what could still become a stop string), evaluate the
 * token, until end of generation, a stop string, the length or the
 * context runs out. */
#include "cbcore.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Text not yet handed on: it may be the start of a stop string. */
typedef struct holdback {
    char *buf;
    size_t len, cap;
    const cb_gen_params *p;
    cb_status (*emit)(void *ctx, const char *text, size_t n);
    void *ctx;
} holdback;

/* Append n bytes; hand on what can no longer start a stop string.
 * Returns 1 when a stop string completed (the text before it is handed
 * on, it and the rest dropped), 0 to go on, or a negative status. */
static int hold_push(holdback *h, const char *p, size_t n)
{
    cb_status st;
    if (h->len + n + 1 > h->cap) {
        size_t nc = (h->len + n + 1) * 2;
        char *nb = realloc(h->buf, nc);
        if (!nb)
            return CB_ERR_NOMEM;
        h->buf = nb;
        h->cap = nc;
    }
    memcpy(h->buf + h->len, p, n);
    h->len += n;
    h->buf[h->len] = 0;
    size_t cut = h->len;
    int hit = 0;
    for (int i = 0; i < h->p->n_stops; i++) {
        const char *f = memmem(h->buf, h->len, h->p->stops[i], strlen(h->p->stops[i]));
        if (f && (size_t)(f - h->buf) < cut) {
            cut = (size_t)(f - h->buf);
            hit = 1;
        }
    }
    if (hit) {
        h->len = 0;
        return (st = h->emit(h->ctx, h->buf, cut)) != CB_OK ? st : 1;
    }
    size_t keep = 0; /* the longest tail that is a proper prefix of a stop string */
    for (int i = 0; i < h->p->n_stops; i++) {
        size_t sl = strlen(h->p->stops[i]);
        for (size_t k = sl - 1; k > keep; k--)
            if (k <= h->len && memcmp(h->buf + h->len - k, h->p->stops[i], k) == 0) {
                keep = k;
                break;
            }
    }
    if ((st = h->emit(h->ctx, h->buf, h->len - keep)) != CB_OK)
        return st;
    memmove(h->buf, h->buf + h->len - keep, keep);
    h->len = keep;
    return 0;
}

cb_status cb_generate(cb_fwd *f, cb_kvcache *kv, float *logits, int32_t pos, const cb_gen_params *p,
                      cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx, double t0,
                      cb_gen_result *res)
{
    const cb_model *m = cb_fwd_model(f);
    const cb_vocab *v = cb_model_vocab(m);
    int32_t n_vocab = cb_model_hparams(m)->n_vocab;
    cb_sampler *smp = cb_sampler_new(&p->sp);
    holdback h = {NULL, 0, 0, p, emit, ctx};
    char *piece = NULL;
    size_t piece_len = 0, piece_cap = 0;
    cb_status st = CB_OK;

    res->n_gen = 0;
    res->first_ms = 0;
    res->stop = "length";
    if (!smp)
        return CB_ERR_NOMEM;
    for (;;) {
        int32_t tok = cb_sampler_sample(smp, logits, n_vocab);
        if (res->n_gen == 0)
            res->first_ms = cb_now_ms() - t0;
        if (tok < 0) {
            st = CB_ERR_NOMEM;
            break;
        }
        if (cb_vocab_is_eog(v, tok)) {
            res->stop = "eog";
            break;
        }
        res->n_gen++;
        piece_len = 0;
        if ((st = cb_tok_piece(v, tok, 0, &piece, &piece_len, &piece_cap)) != CB_OK)
            break;
        int r = hold_push(&h, piece, piece_len);
        if (r < 0) {
            st = (cb_status)r;
            break;
        }
        if (r > 0) {
            res->stop = "stop";
            break;
        }
        if (res->n_gen >= p->n_predict)
            break;
        if (pos >= cb_kvcache_n_ctx(kv)) {
            res->stop = "context";
            break;
        }
        if ((st = cb_model_eval(f, kv, &tok, 1, pos++, logits)) != CB_OK)
            break;
    }
    if (st == CB_OK)
        st = emit(ctx, h.buf, h.len);
    free(h.buf);
    free(piece);
    cb_sampler_free(smp);
    return st;
}

double cb_logits_kl(const float *lp, const float *lq, int32_t n, int *top1)
{
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, kl = 0;
    int32_t ap = 0, aq = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lp[i] > mp)
            mp = lp[i], ap = i;
        if (lq[i] > mq)
            mq = lq[i], aq = i;
    }
    for (int32_t i = 0; i < n; i++) {
        zp += exp(lp[i] - mp);
        zq += exp(lq[i] - mq);
    }
    for (int32_t i = 0; i < n; i++) {
        double a = lp[i] - mp - log(zp), b = lq[i] - mq - log(zq);
        kl += exp(a) * (a - b);
    }
    *top1 = ap == aq;
    return kl < 0 ? 0 : kl;
}
