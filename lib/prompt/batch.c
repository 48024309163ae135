/* batch.c - many questions on one model and one store: each is prefilled
 * (in its own mode: blend, reuse, prefix or full) when it starts, one after
 * the other, and the started ones decode together, one token of each per
 * step (cb_gen_batch: the weights read once a step for all of them).  At
 * most `cap` questions are in flight, and their KV caches stay within a
 * byte budget: a question that would pass it waits (parked) until others
 * end, unless nothing else is in flight.  Every answer is what a lone
 * cb_prompt_prefill + cb_generate (or cb_score) gives the same question
 * with the same parameters: the same calls, and decoding whose rows do not
 * depend on their company (cb_fwd_decode). */
#include "prompt.h"
#include "../core/vec.h"
#include "prompt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A question from submission to answer. */
typedef struct job {
    cb_answer *a;
    cb_prompt *pr;
    cb_kvcache *kv;
    cb_tokens cont; /* the continuation to score, or none */
    int ratio_auto;
    double min_ratio;
    cb_gen_params gp; /* stops: `stops`, owned */
    char **stops;
    cb_type kv_type;
    int store_write;
    int64_t n_ctx;
    size_t cap; /* of a->text */
    double t0;
    int32_t slot; /* in the cb_gen_batch, while decoding */
} job;

struct cb_batch {
    cb_model *m;
    cb_store *s; /* may be NULL */
    void (*warn)(void *ctx, const char *msg);
    void *wctx;
    int32_t cap;
    uint64_t budget;
    cb_gen_batch *gb;
    cb_fwd *f; /* prefill activations, grown to the longest prompt */
    int32_t f_rows;
    float *logits; /* [n_vocab] */
    job **dec;     /* [cap]: the decoding jobs by their cb_gen_batch slot */
    int32_t *done; /* [cap] */
    job *parked;
    cb_answer **out; /* answers not yet taken, oldest first */
    size_t n_out, out_cap;
    cb_batch_info info;
    int noted_fallback;
};

int32_t cb_batch_default_size(const cb_model *m, cb_type kv_type, uint64_t kv_budget)
{
    uint64_t one = cb_kvcache_bytes(m, cb_model_hparams(m)->n_ctx_train, kv_type);
    uint64_t n = one ? kv_budget / one : CB_BATCH_MAX;
    return n < 1 ? 1 : n > CB_BATCH_MAX ? CB_BATCH_MAX : (int32_t)n;
}

cb_status cb_batch_new(cb_batch **out, cb_model *m, cb_store *s, int32_t cap, uint64_t kv_budget,
                       void (*warn)(void *ctx, const char *msg), void *ctx)
{
    cb_batch *b;
    if (cap < 1)
        return CB_ERR_INVALID;
    if (!(b = calloc(1, sizeof *b)))
        return CB_ERR_NOMEM;
    b->m = m, b->s = s, b->warn = warn, b->wctx = ctx, b->cap = cap, b->budget = kv_budget;
    b->info.cap = cap;
    b->info.kv_budget = kv_budget;
    b->logits = malloc(sizeof(float) * (size_t)cb_model_hparams(m)->n_vocab);
    b->dec = calloc((size_t)cap, sizeof *b->dec);
    b->done = calloc((size_t)cap, sizeof *b->done);
    cb_status st = CB_ERR_NOMEM;
    if (!b->logits || !b->dec || !b->done || (st = cb_gen_batch_new(&b->gb, m, cap)) != CB_OK) {
        cb_batch_free(b);
        return st; /* no memory, or a device fault */
    }
    *out = b;
    return CB_OK;
}

void cb_answer_free(cb_answer *a)
{
    if (!a)
        return;
    free(a->text);
    free(a);
}

static void job_free(job *j)
{
    if (!j)
        return;
    cb_answer_free(j->a);
    cb_prompt_free(j->pr);
    cb_kvcache_free(j->kv);
    cb_tokens_free(&j->cont);
    for (int i = 0; j->stops && i < j->gp.n_stops; i++)
        free(j->stops[i]);
    free(j->stops);
    free(j);
}

void cb_batch_free(cb_batch *b)
{
    if (!b)
        return;
    for (int32_t i = 0; b->dec && i < b->cap; i++)
        job_free(b->dec[i]);
    job_free(b->parked);
    for (size_t i = 0; i < b->n_out; i++)
        cb_answer_free(b->out[i]);
    free(b->out);
    cb_gen_batch_free(b->gb);
    cb_fwd_free(b->f);
    free(b->logits), free(b->dec), free(b->done);
    free(b);
}

int cb_batch_full(const cb_batch *b) { return b->parked || b->info.in_flight >= b->cap; }

int cb_batch_busy(const cb_batch *b) { return b->parked || b->info.in_flight > 0 || b->n_out > 0; }

const cb_batch_info *cb_batch_get_info(const cb_batch *b) { return &b->info; }
const cb_model *cb_batch_model(const cb_batch *b) { return b->m; }
cb_store *cb_batch_store(const cb_batch *b) { return b->s; }

cb_answer *cb_batch_next(cb_batch *b)
{
    if (b->n_out == 0)
        return NULL;
    cb_answer *a = b->out[0];
    memmove(b->out, b->out + 1, sizeof *b->out * --b->n_out);
    return a;
}

/* The job's answer joins the ones to take; the job is freed.  st != CB_OK:
 * it failed, err (or st's name) says why. */
static void finish(cb_batch *b, job *j, cb_status st, const cb_error *err)
{
    cb_answer *a = j->a;
    a->status = st;
    if (st != CB_OK)
        snprintf(a->msg, sizeof a->msg, "%s", err && err->msg[0] ? err->msg : cb_strerror(st));
    if (j->kv) {
        b->info.in_flight--;
        b->info.kv_in_flight -= a->kv_bytes;
    }
    b->info.n_tokens += a->gen.n_gen;
    if (st == CB_OK) {
        b->info.n_answered++;
        cb_prompt_keep(j->pr, b->s, b->warn, b->wctx); /* after the answer: no latency */
        if (j->store_write && b->s && !cb_store_readonly(b->s))
            cb_prompt_store_missing(j->pr, b->s, CB_TYPE_F16, &a->n_stored, b->warn, b->wctx);
    } else {
        b->info.n_failed++;
    }
    if (b->n_out == b->out_cap) {
        cb_answer **no = cb_vec_reserve(b->out, &b->out_cap, b->n_out + 1, sizeof *no, 16);
        if (!no) { /* the answer cannot be kept: it is lost, and said so */
            pr_warnf(b->warn, b->wctx, "out of memory: an answer was dropped");
            job_free(j);
            return;
        }
        b->out = no;
    }
    b->out[b->n_out++] = a;
    j->a = NULL;
    job_free(j);
}

static cb_status collect(void *ctx, const char *p, size_t n)
{
    job *j = ctx;
    cb_answer *a = j->a;
    if (a->len + n + 1 > j->cap) {
        char *nb = cb_vec_reserve(a->text, &j->cap, a->len + n + 1, 1, 64);
        if (!nb)
            return CB_ERR_NOMEM;
        a->text = nb;
    }
    memcpy(a->text + a->len, p, n);
    a->len += n;
    a->text[a->len] = 0;
    return CB_OK;
}

/* Copy what the job keeps of the request. */
static cb_status job_copy(job *j, const cb_request *rq)
{
    j->a->bp = rq->bp;
    j->ratio_auto = rq->ratio_auto;
    j->min_ratio = rq->min_ratio;
    j->gp = rq->gp;
    j->kv_type = rq->kv_type;
    j->store_write = rq->store_write;
    j->gp.stops = NULL;
    j->gp.n_stops = 0;
    if (rq->gp.n_stops > 0 && !(j->stops = calloc((size_t)rq->gp.n_stops, sizeof *j->stops)))
        return CB_ERR_NOMEM;
    for (int i = 0; i < rq->gp.n_stops; i++, j->gp.n_stops++)
        if (!(j->stops[i] = strdup(rq->gp.stops[i])))
            return CB_ERR_NOMEM;
    j->gp.stops = (const char *const *)j->stops;
    return CB_OK;
}

/* The prompt, its caches and its context size. */
static cb_status job_prepare(cb_batch *b, job *j, const cb_request *rq, cb_error *err)
{
    const cb_hparams *hp = cb_model_hparams(b->m);
    cb_answer *a = j->a;
    cb_status st;

    if ((st = job_copy(j, rq)) != CB_OK)
        return cb_error_set(err, st, "out of memory");
    if ((st = cb_prompt_build_from(&j->pr, b->m, b->s, rq->system, rq->raw, rq->chunks,
                                   rq->n_chunks, rq->question.data ? rq->question.data : "",
                                   rq->question.len, err)) != CB_OK)
        return st;
    cb_prompt_use_context(j->pr, !rq->no_context);
    if (a->bp.mode != CB_MODE_FULL)
        cb_prompt_attach(j->pr, b->s, b->warn, b->wctx);
    a->n_prompt_tokens = cb_prompt_n_tokens(j->pr);
    a->n_chunks = cb_prompt_n_chunks(j->pr);
    a->n_missing = cb_prompt_n_missing(j->pr);
    a->n_after = cb_prompt_n_after(j->pr);
    a->n_own = cb_prompt_n_own(j->pr);
    a->n_named = cb_prompt_n_named(j->pr);
    a->n_middle = cb_prompt_n_middle(j->pr);
    a->chat = cb_prompt_chat(j->pr);
    a->kv_type = j->kv_type;
    if (a->n_prompt_tokens == 0)
        return cb_error_set(err, CB_ERR_FORMAT, "the prompt is empty");
    if (rq->score.data) {
        st = cb_tok_encode(cb_model_vocab(b->m), rq->score.data, rq->score.len,
                           rq->raw ? CB_TOK_PARSE_SPECIAL : 0, &j->cont);
        if (st != CB_OK)
            return cb_error_set(err, st, "tokenizing the continuation failed: %s", cb_strerror(st));
        if (j->cont.n == 0)
            return cb_error_set(err, CB_ERR_FORMAT, "the continuation to score has no tokens");
        a->scored = 1;
    }
    /* the prompt is within the trained context (cb_prompt_build), the context too */
    if (rq->n_ctx > hp->n_ctx_train)
        return cb_error_set(err, CB_ERR_RANGE,
                            "a context of %d tokens is more than the model's (%d, as trained)",
                            rq->n_ctx, hp->n_ctx_train);
    j->n_ctx = rq->n_ctx > 0
                   ? rq->n_ctx
                   : a->n_prompt_tokens + (j->cont.n ? (int64_t)j->cont.n : rq->gp.n_predict);
    if (rq->n_ctx <= 0 && j->n_ctx > hp->n_ctx_train)
        j->n_ctx = hp->n_ctx_train;
    if (a->n_prompt_tokens >= j->n_ctx)
        return cb_error_set(err, CB_ERR_RANGE, "the prompt has %lld tokens; the context holds %lld",
                            (long long)a->n_prompt_tokens, (long long)j->n_ctx);
    if (a->n_prompt_tokens + (int64_t)j->cont.n - 1 > j->n_ctx) /* cb_score's positions */
        return cb_error_set(err, CB_ERR_RANGE,
                            "the prompt and the continuation need %lld positions; the context "
                            "holds %lld",
                            (long long)(a->n_prompt_tokens + (int64_t)j->cont.n - 1),
                            (long long)j->n_ctx);
    a->kv_bytes = cb_kvcache_bytes(b->m, (int32_t)j->n_ctx, j->kv_type);
    return CB_OK;
}

/* --ratio auto: the loading controller's ratio, loading priced for the
 * slowest tier holding a chunk where the profile measured it. */
static void job_auto_ratio(cb_batch *b, job *j)
{
    cb_answer *a = j->a;
    cb_error err;
    a->ratio_source = "controller";
    if (cb_prompt_auto_ratio(j->pr, b->s, b->m, j->min_ratio, &a->bp, &a->rc, &err) != CB_OK &&
        !b->noted_fallback++)
        pr_warnf(b->warn, b->wctx, "--ratio auto: %s; loading priced at the %s figure", err.msg,
                 a->bp.costs.load > 0 ? "profile's first tier's" : "built-in");
}

/* Activations for n rows (kept for the next questions). */
static cb_status grow_fwd(cb_batch *b, int64_t n)
{
    if (b->f && b->f_rows >= n)
        return CB_OK;
    cb_fwd_free(b->f);
    b->f = NULL;
    b->f_rows = 0;
    cb_status st = cb_fwd_new(&b->f, b->m, (int32_t)n);
    if (st == CB_OK)
        b->f_rows = (int32_t)n;
    return st;
}

/* Prefill, then score, or join the decoding. */
static void job_start(cb_batch *b, job *j)
{
    cb_answer *a = j->a;
    int64_t total = a->n_prompt_tokens;
    cb_error err = {0};
    cb_status st;

    if ((st = cb_kvcache_new(&j->kv, b->m, (int32_t)j->n_ctx, j->kv_type)) != CB_OK) {
        cb_error_set(&err, st, "a KV cache of %lld positions: %s", (long long)j->n_ctx,
                     cb_model_strerror(b->m, st));
        finish(b, j, st, &err);
        return;
    }
    b->info.in_flight++;
    b->info.kv_in_flight += a->kv_bytes;
    if (b->info.kv_in_flight > b->info.kv_peak)
        b->info.kv_peak = b->info.kv_in_flight;
    if (b->info.in_flight > b->info.in_flight_peak)
        b->info.in_flight_peak = b->info.in_flight;
    if ((st = grow_fwd(b, total > (int64_t)j->cont.n ? total : (int64_t)j->cont.n)) != CB_OK) {
        cb_error_set(&err, st, "activations for %lld tokens: %s", (long long)total,
                     cb_model_strerror(b->m, st));
        finish(b, j, st, &err);
        return;
    }
    if (j->ratio_auto && a->bp.mode == CB_MODE_BLEND)
        job_auto_ratio(b, j);
    if ((st = cb_prompt_prefill(j->pr, b->s, b->f, j->kv, &a->bp, b->logits, &a->bs, b->warn,
                                b->wctx, &err)) != CB_OK) {
        finish(b, j, st, &err);
        return;
    }
    if (j->cont.n) { /* no generation: the first token's distribution is ready now */
        a->gen.first_ms = cb_now_ms() - j->t0;
        a->gen.stop = "score";
        st = cb_score(b->f, j->kv, b->logits, (int32_t)total, j->cont.ids, (int32_t)j->cont.n,
                      &a->score);
        if (st != CB_OK)
            cb_error_set(&err, st, "scoring the continuation failed: %s",
                         cb_model_strerror(b->m, st));
        a->gen_ms = cb_now_ms() - j->t0 - a->gen.first_ms;
        finish(b, j, st, &err);
        return;
    }
    if ((st = cb_gen_batch_add(b->gb, j->kv, b->logits, (int32_t)total, &j->gp, collect, j, j->t0,
                               &j->slot)) != CB_OK) {
        cb_error_set(&err, st, "generation: %s", cb_model_strerror(b->m, st));
        finish(b, j, st, &err);
        return;
    }
    b->dec[j->slot] = j;
}

/* Whether a prepared job's cache fits beside the ones in flight. */
static int fits(const cb_batch *b, const job *j)
{
    return b->info.in_flight == 0 ||
           (b->info.in_flight < b->cap && b->info.kv_in_flight + j->a->kv_bytes <= b->budget);
}

cb_status cb_batch_submit(cb_batch *b, const cb_request *rq, void *tag)
{
    cb_error err = {0};
    cb_status st;
    job *j;

    if (cb_batch_full(b))
        return CB_ERR_RANGE;
    if (!(j = calloc(1, sizeof *j)) || !(j->a = calloc(1, sizeof *j->a))) {
        free(j);
        return CB_ERR_NOMEM;
    }
    j->t0 = cb_now_ms();
    j->a->tag = tag;
    j->a->gen = (cb_gen_result){0, 0, "length"};
    j->a->ratio_source = "given";
    b->info.n_submitted++;
    if ((st = job_prepare(b, j, rq, &err)) != CB_OK) {
        finish(b, j, st, &err);
        return CB_OK;
    }
    if (!fits(b, j)) {
        b->parked = j;
        return CB_OK;
    }
    job_start(b, j);
    return CB_OK;
}

cb_status cb_batch_step(cb_batch *b)
{
    int32_t n_done = 0;
    cb_status st = CB_OK;
    if (b->parked && fits(b, b->parked)) {
        job *j = b->parked;
        b->parked = NULL;
        job_start(b, j);
    }
    if (cb_gen_batch_active(b->gb) == 0)
        return CB_OK;
    st = cb_gen_batch_step(b->gb, b->done, &n_done);
    b->info.n_steps++;
    for (int32_t k = 0; k < n_done; k++) {
        job *j = b->dec[b->done[k]];
        cb_error err = {0};
        b->dec[b->done[k]] = NULL;
        cb_status js = cb_gen_batch_take(b->gb, j->slot, &j->a->gen, NULL);
        j->a->gen_ms = cb_now_ms() - j->t0 - j->a->gen.first_ms;
        if (js != CB_OK)
            cb_error_set(&err, js, "generation failed: %s", cb_model_strerror(b->m, js));
        finish(b, j, js, &err);
    }
    return st;
}
