/* generate.c - the generation loop after a prefill: sample, stream the
 * text (holding back what could still become a stop string), evaluate the
 * token, until end of generation, a stop string, the length or the
 * context runs out. */
#include "prompt.h"
#include "../core/vec.h"

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
        char *nb = cb_vec_reserve(h->buf, &h->cap, h->len + n + 1, 1, 64);
        if (!nb)
            return CB_ERR_NOMEM;
        h->buf = nb;
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

/* ------------------------------------------------ generations, batched
 *
 * Every generation runs here: cb_generate is a batch of one.  A step
 * samples each active sequence's next token from its logits, hands its
 * text on, ends the sequences that are done, and evaluates the others'
 * tokens in one cb_fwd_decode: the same arithmetic for a sequence alone or
 * among many (row-stable products), so a batched answer is a lone one. */

typedef struct gseq {
    int used, active; /* slot taken; still generating */
    cb_kvcache *kv;   /* borrowed */
    int32_t pos;      /* where its next token goes */
    cb_gen_params p;  /* stops borrowed */
    cb_sampler *smp;
    holdback h;
    double t0;
    cb_gen_result res;
    cb_status st;
} gseq;

struct cb_gen_batch {
    const cb_model *m;
    cb_fwd *f; /* the decode step's rows */
    int32_t cap, n_vocab;
    gseq *s;            /* [cap] */
    float *logits;      /* [cap, n_vocab]: each slot's next-token logits */
    float *step_logits; /* [cap, n_vocab]: a step's, in step order */
    cb_kvcache **kv;    /* [cap]: a step's caches, tokens, positions, slots */
    int32_t *tok, *pos, *idx;
    char *piece;
    size_t piece_len, piece_cap;
};

cb_status cb_gen_batch_new(cb_gen_batch **out, const cb_model *m, int32_t cap)
{
    cb_gen_batch *b;
    int32_t nv = cb_model_hparams(m)->n_vocab;
    cb_status st = CB_ERR_NOMEM;
    if (cap < 1)
        return CB_ERR_INVALID;
    if (!(b = calloc(1, sizeof *b)))
        return CB_ERR_NOMEM;
    b->m = m;
    b->cap = cap;
    b->n_vocab = nv;
    b->s = calloc((size_t)cap, sizeof *b->s);
    b->logits = malloc(sizeof(float) * (size_t)cap * (size_t)nv);
    b->step_logits = malloc(sizeof(float) * (size_t)cap * (size_t)nv);
    b->kv = calloc((size_t)cap, sizeof *b->kv);
    b->tok = calloc((size_t)cap, sizeof *b->tok);
    b->pos = calloc((size_t)cap, sizeof *b->pos);
    b->idx = calloc((size_t)cap, sizeof *b->idx);
    if (!b->s || !b->logits || !b->step_logits || !b->kv || !b->tok || !b->pos || !b->idx ||
        (st = cb_fwd_new(&b->f, m, cb_fwd_decode_rows(m, cap))) != CB_OK) {
        cb_gen_batch_free(b);
        return st; /* no memory, or a device fault */
    }
    *out = b;
    return CB_OK;
}

static void slot_clear(gseq *q)
{
    cb_sampler_free(q->smp);
    free(q->h.buf);
    memset(q, 0, sizeof *q);
}

void cb_gen_batch_free(cb_gen_batch *b)
{
    if (!b)
        return;
    for (int32_t i = 0; b->s && i < b->cap; i++)
        slot_clear(&b->s[i]);
    cb_fwd_free(b->f);
    free(b->s), free(b->logits), free(b->step_logits), free(b->kv), free(b->tok), free(b->pos),
        free(b->idx);
    free(b->piece);
    free(b);
}

cb_status cb_gen_batch_add(cb_gen_batch *b, cb_kvcache *kv, const float *logits, int32_t pos,
                           const cb_gen_params *p,
                           cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx,
                           double t0, int32_t *slot)
{
    int32_t i = 0;
    while (i < b->cap && b->s[i].used)
        i++;
    if (i == b->cap)
        return CB_ERR_RANGE;
    if (pos < 0 || pos > cb_kvcache_n_ctx(kv))
        return CB_ERR_RANGE;
    for (int32_t j = 0; j < b->cap; j++)
        if (b->s[j].active && b->s[j].kv == kv)
            return CB_ERR_INVALID;
    gseq *q = &b->s[i];
    memset(q, 0, sizeof *q);
    if (!(q->smp = cb_sampler_new(&p->sp)))
        return CB_ERR_NOMEM;
    q->used = q->active = 1;
    q->kv = kv;
    q->pos = pos;
    q->p = *p;
    q->h = (holdback){NULL, 0, 0, &q->p, emit, ctx};
    q->t0 = t0;
    q->res = (cb_gen_result){0, 0, "length"};
    memcpy(b->logits + (size_t)i * (size_t)b->n_vocab, logits, sizeof(float) * (size_t)b->n_vocab);
    *slot = i;
    return CB_OK;
}

int32_t cb_gen_batch_active(const cb_gen_batch *b)
{
    int32_t n = 0;
    for (int32_t i = 0; i < b->cap; i++)
        n += b->s[i].active;
    return n;
}

/* Sample slot i's next token and hand its text on: 1 when the sequence
 * goes on (its token in *tok), 0 when it ended (q->res.stop, q->st). */
static int slot_sample(cb_gen_batch *b, gseq *q, const float *logits, int32_t *tok)
{
    const cb_vocab *v = cb_model_vocab(b->m);
    int32_t t = cb_sampler_sample(q->smp, logits, b->n_vocab);
    if (q->res.n_gen == 0)
        q->res.first_ms = cb_now_ms() - q->t0;
    if (t < 0) {
        q->st = CB_ERR_NOMEM;
        return 0;
    }
    if (cb_vocab_is_eog(v, t)) {
        q->res.stop = "eog";
        return 0;
    }
    q->res.n_gen++;
    b->piece_len = 0;
    if ((q->st = cb_tok_piece(v, t, 0, &b->piece, &b->piece_len, &b->piece_cap)) != CB_OK)
        return 0;
    int r = hold_push(&q->h, b->piece, b->piece_len);
    if (r != 0) {
        if (r < 0)
            q->st = (cb_status)r;
        else
            q->res.stop = "stop";
        return 0;
    }
    if (q->res.n_gen >= q->p.n_predict)
        return 0;
    if (q->pos >= cb_kvcache_n_ctx(q->kv)) {
        q->res.stop = "context";
        return 0;
    }
    *tok = t;
    return 1;
}

/* A sequence ends: what is held back goes out (unless it failed). */
static void slot_end(gseq *q)
{
    if (q->st == CB_OK)
        q->st = q->h.emit(q->h.ctx, q->h.buf, q->h.len);
    q->active = 0;
}

cb_status cb_gen_batch_step(cb_gen_batch *b, int32_t *done, int32_t *n_done)
{
    int32_t n = 0;
    cb_status st = CB_OK;
    *n_done = 0;
    for (int32_t i = 0; i < b->cap; i++) {
        gseq *q = &b->s[i];
        if (!q->active)
            continue;
        if (slot_sample(b, q, b->logits + (size_t)i * (size_t)b->n_vocab, &b->tok[n])) {
            b->kv[n] = q->kv;
            b->pos[n] = q->pos++;
            b->idx[n++] = i;
        } else {
            slot_end(q);
            done[(*n_done)++] = i;
        }
    }
    if (n > 0)
        st = cb_fwd_decode(b->f, b->kv, b->tok, b->pos, n, b->step_logits);
    for (int32_t k = 0; k < n; k++) {
        gseq *q = &b->s[b->idx[k]];
        if (st == CB_OK) {
            memcpy(b->logits + (size_t)b->idx[k] * (size_t)b->n_vocab,
                   b->step_logits + (size_t)k * (size_t)b->n_vocab,
                   sizeof(float) * (size_t)b->n_vocab);
            continue;
        }
        q->st = st; /* the step failed: every sequence in it ends with its status */
        q->active = 0;
        done[(*n_done)++] = b->idx[k];
    }
    return st;
}

cb_status cb_gen_batch_take(cb_gen_batch *b, int32_t slot, cb_gen_result *res, float *logits)
{
    if (slot < 0 || slot >= b->cap || !b->s[slot].used || b->s[slot].active)
        return CB_ERR_RANGE;
    gseq *q = &b->s[slot];
    cb_status st = q->st;
    *res = q->res;
    if (logits)
        memcpy(logits, b->logits + (size_t)slot * (size_t)b->n_vocab,
               sizeof(float) * (size_t)b->n_vocab);
    slot_clear(q);
    return st;
}

cb_status cb_generate(cb_fwd *f, cb_kvcache *kv, float *logits, int32_t pos, const cb_gen_params *p,
                      cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx,
                      double t0, cb_gen_result *res)
{
    cb_gen_batch *b = NULL;
    int32_t slot, done[1], n_done;
    cb_status st;

    res->n_gen = 0;
    res->first_ms = 0;
    res->stop = "length";
    if ((st = cb_gen_batch_new(&b, cb_fwd_model(f), 1)) != CB_OK)
        return st;
    if ((st = cb_gen_batch_add(b, kv, logits, pos, p, emit, ctx, t0, &slot)) == CB_OK) {
        while (cb_gen_batch_active(b) > 0)
            cb_gen_batch_step(b, done, &n_done);
        st = cb_gen_batch_take(b, slot, res, logits);
    }
    cb_gen_batch_free(b);
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

/* log softmax(l)[tok] in double, and whether tok is the argmax (the first
 * one, as the greedy sampler takes it). */
static double log_prob(const float *l, int32_t n, int32_t tok, int *is_top)
{
    double mx = -INFINITY, z = 0;
    int32_t arg = 0;
    for (int32_t i = 0; i < n; i++)
        if (l[i] > mx)
            mx = l[i], arg = i;
    for (int32_t i = 0; i < n; i++)
        z += exp((double)l[i] - mx);
    *is_top = arg == tok;
    return (double)l[tok] - mx - log(z);
}

cb_status cb_score(cb_fwd *f, cb_kvcache *kv, const float *logits, int32_t pos, const int32_t *cont,
                   int32_t n, cb_score_result *res)
{
    int32_t n_vocab = cb_model_hparams(cb_fwd_model(f))->n_vocab, nb = n - 1;
    int32_t *rows = NULL, *at = NULL;
    float *lg = NULL;
    double sum = 0;
    int top = 0, n_top = 0;
    cb_status st = CB_OK;

    memset(res, 0, sizeof *res);
    if (n < 1)
        return CB_ERR_INVALID;
    for (int32_t i = 0; i < n; i++)
        if (cont[i] < 0 || cont[i] >= n_vocab)
            return CB_ERR_RANGE;
    if (nb > 0 && pos > cb_kvcache_n_ctx(kv) - nb)
        return CB_ERR_RANGE;
    sum -= log_prob(logits, n_vocab, cont[0], &top);
    n_top += top;
    if (nb > 0) {
        rows = malloc(sizeof(int32_t) * (size_t)nb);
        at = malloc(sizeof(int32_t) * (size_t)nb);
        lg = malloc(sizeof(float) * (size_t)nb * (size_t)n_vocab);
        if (!rows || !at || !lg) {
            st = CB_ERR_NOMEM;
            goto done;
        }
        for (int32_t i = 0; i < nb; i++)
            rows[i] = i, at[i] = pos + i;
        if ((st = cb_fwd_embed(f, cont, at, nb)) != CB_OK)
            goto done;
        for (int32_t l = 0; l < cb_model_hparams(cb_fwd_model(f))->n_layer; l++)
            if ((st = cb_fwd_layer(f, kv, l, NULL, 0)) != CB_OK)
                goto done;
        if ((st = cb_fwd_logits(f, rows, nb, lg)) != CB_OK)
            goto done;
        for (int32_t i = 0; i < nb; i++) {
            sum -= log_prob(lg + (size_t)i * (size_t)n_vocab, n_vocab, cont[i + 1], &top);
            n_top += top;
        }
    }
    res->n_tokens = n;
    res->nll = sum / n;
    res->top1 = (double)n_top / n;
done:
    free(rows), free(at), free(lg);
    return st;
}
