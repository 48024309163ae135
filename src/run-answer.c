/* run-answer.c - cb-run's single answer: model, store, prompt, the blend
 * or full prefill, generation, --verify, --score and --stats (the work is
 * libcbcore's: cb_prompt_*, cb_blend_prefill, cb_generate, cb_answer_to_json). */
#include "run.h"

#include <stdlib.h>
#include <string.h>

void gen_warn(void *ctx, const char *msg) { cli_err("warning: %s", msg); }

/* Everything one answer holds, from the model to the stats. */
typedef struct run {
    const gen_opts *o;
    cb_model *m;
    cb_store *store;
    cb_prompt *pr;
    cb_kvcache *kv;
    cb_fwd *f;
    json_t *chunks;
    const cb_segment *segs;
    int32_t n_segs;
    int64_t total, n_ctx;
    cb_blend_params bp;
    cb_blend_stats bs;
    cb_gen_params gp;
    cb_gen_result gr;
    cli_sink sm;
    float *logits, *first_logits;
    double t_load, t0, gen_ms;
    const char *ratio_source; /* --ratio auto: controller */
    cb_ratio_choice rc;
    json_t *verify;
    int n_stored;
    cb_tokens cont;     /* --score: the continuation's tokens */
    cb_score_result sr; /* --score: its score */
} run;

/* --chunks' records (into *chunks) and the model (its load time into
 * *t_load); -c within the context the model was trained for. */
int gen_open_model(const gen_opts *o, json_t **chunks, cb_model **m, double *t_load)
{
    cb_model_params mp = cli_model_params(o->n_threads, o->device);
    cb_error err;
    cb_status st;
    int code;
    double t = cb_now_ms();

    if (o->chunks_path && (code = cli_read_records(o->chunks_path, "text", (void **)chunks)) != 0)
        return code;
    if ((st = cb_model_load(m, o->model, &mp, &err)) != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(st);
    }
    *t_load = cb_now_ms() - t;
    if (*cb_model_features(*m)) /* the CUDA features, and why one is off */
        cli_info("%s: features %s", cb_model_device(*m), cb_model_features(*m));
    if (o->n_ctx > cb_model_hparams(*m)->n_ctx_train) {
        cli_err("-c %d: more than the model's context (%d tokens, as trained)", o->n_ctx,
                cb_model_hparams(*m)->n_ctx_train);
        return CLI_EX_USAGE;
    }
    return 0;
}

/* The store (created when it will be written): a missing one is a
 * warning, every chunk then computed. */
int gen_open_store(const gen_opts *o, cb_store **s)
{
    cb_error err;
    cb_status st = cli_store_open(s, o->store_dir, o->store_write, &err);
    if (st != CB_OK) {
        if (st != CB_ERR_NOT_FOUND) {
            cli_err("%s", err.msg);
            return cli_exit_code(st);
        }
        cli_err("warning: %s; every chunk is computed", err.msg);
        return 0;
    }
    cb_store_set_warn(*s, gen_warn, NULL);
    if (cb_store_readonly(*s) && o->store_write)
        cli_err(
            "note: the store %s is read-only: chunks missing from it are computed and not stored",
            o->store_dir);
    return 0;
}

/* The cost model's figures (--speedup) of the store's profile for this
 * model and backend (cb-profile(1)) into bp; where it has none, bp keeps
 * its zeros: the built-in figures. */
void gen_profile_costs(const cb_store *s, const cb_model *m, cb_blend_params *bp)
{
    cb_profile *prof = s ? calloc(1, sizeof *prof) : NULL;
    cb_error err;
    if (!prof)
        return;
    cb_status st =
        cb_store_profile_load(s, cb_model_fingerprint(m), cb_model_backend(m), prof, &err);
    if (st == CB_OK)
        bp->costs = prof->costs;
    else if (st != CB_ERR_NOT_FOUND)
        cli_err("warning: %s; --speedup prices with the built-in figures", err.msg);
    free(prof);
}

/* The chunk records, the model and (when chunks can be reused or stored)
 * the store. */
static int run_open(run *r)
{
    const gen_opts *o = r->o;
    int code;

    if ((code = gen_open_model(o, &r->chunks, &r->m, &r->t_load)) != 0)
        return code;
    /* chunks, or a store named: the prompt's head may be cached there too */
    if (((r->chunks && json_array_size(r->chunks) > 0) || o->store_dir) &&
        (r->bp.mode != CB_MODE_FULL || (o->store_write && o->store_dir)) &&
        (code = gen_open_store(o, &r->store)) != 0)
        return code;
    gen_profile_costs(r->store, r->m, &r->bp);
    return 0;
}

/* --score, --score-file: the continuation's tokens (control tokens
 * matched with --raw, as in the prompt). */
static int run_continuation(run *r)
{
    const gen_opts *o = r->o;
    const char *name = o->score ? "--score" : o->score_file;
    char *buf = NULL;
    size_t len = 0;
    int code = 0;
    cb_status st;

    if (o->score_file && !(buf = cli_read_input(o->score_file, &len, &code)))
        return code;
    st = cb_tok_encode(cb_model_vocab(r->m), o->score ? o->score : buf,
                       o->score ? strlen(o->score) : len, o->raw ? CB_TOK_PARSE_SPECIAL : 0,
                       &r->cont);
    free(buf);
    if (st != CB_OK) {
        cli_err("%s: tokenizing the continuation failed: %s", name, cb_strerror(st));
        return cli_exit_code(st);
    }
    if (r->cont.n == 0) {
        cli_err("%s: the continuation has no tokens", name);
        return CLI_EX_DATAERR;
    }
    return 0;
}

/* What the run's cache and activations take, before they are taken: on
 * the CPU, more than the memory available now is refused (a device's
 * allocations fail by themselves). */
static int run_memory(const run *r)
{
    int64_t rows = r->total > (int64_t)r->cont.n ? r->total : (int64_t)r->cont.n;
    uint64_t kv = cb_kvcache_bytes(r->m, (int32_t)r->n_ctx, r->o->kv_type);
    uint64_t act = cb_fwd_bytes(r->m, (int32_t)rows), avail;
    uint64_t need = (kv + act) * (r->o->verify ? 2 : 1); /* --verify: a second pair */

    if (strcmp(cb_model_backend(r->m), "cpu") != 0 || need <= (avail = cli_mem_available()))
        return 0;
    cli_err("a context of %lld tokens needs %.0f MiB (KV cache %.0f MiB, activations %.0f MiB%s); "
            "%.0f MiB of memory are available",
            (long long)r->n_ctx, need / 1048576.0, kv / 1048576.0, act / 1048576.0,
            r->o->verify ? ", twice for --verify" : "", avail / 1048576.0);
    return cli_exit_code(CB_ERR_NOMEM);
}

/* Assemble the prompt (refused past the model's context), find its
 * caches, and size the context and its memory. */
static int run_prompt(run *r, const char *text, size_t len)
{
    const gen_opts *o = r->o;
    const cb_hparams *hp = cb_model_hparams(r->m);
    size_t nc = r->chunks ? json_array_size(r->chunks) : 0;
    cb_chunk_src *srcs = calloc(nc ? nc : 1, sizeof *srcs);
    cb_error err;
    cb_status st;
    int code;

    if (!srcs)
        return CLI_EX_SOFTWARE;
    for (size_t i = 0; i < nc; i++) { /* a record's "kv" names the cache tried first */
        json_t *rec = json_array_get(r->chunks, i), *t = json_object_get(rec, "text"),
               *k = json_object_get(rec, "kv");
        srcs[i].text = (cb_strview){json_string_value(t), json_string_length(t)};
        srcs[i].key = json_is_string(k) ? json_string_value(k) : NULL;
    }
    st = cb_prompt_build_from(&r->pr, r->m, r->store, o->system, o->raw, srcs, nc, text, len, &err);
    free(srcs);
    if (st != CB_OK) {
        cli_err("%s: %s", o->in_name, err.msg);
        return cli_exit_code(st);
    }
    cb_prompt_use_context(r->pr, !o->no_context);
    if (r->bp.mode != CB_MODE_FULL)
        cb_prompt_attach(r->pr, r->store, gen_warn, NULL);
    r->segs = cb_prompt_segments(r->pr, &r->n_segs);
    r->total = cb_prompt_n_tokens(r->pr);
    if (r->total == 0) {
        cli_err("%s: the prompt is empty", o->in_name);
        return CLI_EX_DATAERR;
    }
    if ((o->score || o->score_file) && (code = run_continuation(r)) != 0)
        return code;
    /* the prompt is shorter than the trained context (cb_prompt_build), and -c no longer */
    r->n_ctx = o->n_ctx > 0 ? o->n_ctx : r->total + (r->cont.n ? (int64_t)r->cont.n : o->n_predict);
    if (o->n_ctx <= 0 && r->n_ctx > hp->n_ctx_train)
        r->n_ctx = hp->n_ctx_train;
    if (r->total >= r->n_ctx) {
        cli_err("%s: the prompt has %lld tokens; the context holds %lld (-c)", o->in_name,
                (long long)r->total, (long long)r->n_ctx);
        return CLI_EX_DATAERR;
    }
    if (r->total + (int64_t)r->cont.n - 1 > r->n_ctx) { /* cb_score's positions */
        cli_err("%s: the prompt and the continuation need %lld positions; the context holds %lld",
                o->in_name, (long long)(r->total + (int64_t)r->cont.n - 1), (long long)r->n_ctx);
        return CLI_EX_DATAERR;
    }
    if ((code = run_memory(r)) != 0)
        return code;
    cli_info("%s: %s, %d layers, device %s, loaded in %.0f ms", o->model, hp->arch, hp->n_layer,
             cb_model_device(r->m), r->t_load);
    cli_info(
        "chat template %s; prompt %lld tokens in %d segments, %d chunks (%d without cache); mode %s",
        cb_chat_name(cb_prompt_chat(r->pr)), (long long)r->total, r->n_segs,
        cb_prompt_n_chunks(r->pr), cb_prompt_n_missing(r->pr), cli_mode_names[r->bp.mode]);
    return 0;
}

/* A cache and activations for the prompt; the status says why not (and a
 * message has said it). */
static cb_status run_alloc(const run *r, cb_kvcache **kv, cb_fwd **f)
{
    cb_status st;
    if ((st = cb_kvcache_new(kv, r->m, (int32_t)r->n_ctx, r->o->kv_type)) != CB_OK) {
        cli_err("a KV cache of %lld positions: %s", (long long)r->n_ctx,
                cb_model_strerror(r->m, st));
        return st;
    }
    if ((st = cb_fwd_new(
             f, r->m, (int32_t)(r->total > (int64_t)r->cont.n ? r->total : (int64_t)r->cont.n))) !=
        CB_OK) {
        cli_err("activations for %lld tokens: %s", (long long)r->total,
                cb_model_strerror(r->m, st));
        return st;
    }
    return CB_OK;
}

/* --ratio auto: the loading controller's ratio, loading priced for the
 * slowest tier holding a chunk where the profile measured it. */
static void run_auto_ratio(run *r)
{
    const gen_opts *o = r->o;
    cb_error err;
    r->ratio_source = "controller";
    if (cb_prompt_auto_ratio(r->pr, r->store, r->m, o->min_ratio, &r->bp, &r->rc, &err) != CB_OK)
        cli_err("note: --ratio auto: %s; loading priced at the %s figure (run cb-profile)", err.msg,
                r->bp.costs.load > 0 ? "profile's first tier's" : "built-in");
}

/* --verify: full prefill of the same tokens (the first token's KL and
 * top-1 agreement), and the greedy answers of both. */
static int run_verify(run *r)
{
    const gen_opts *o = r->o;
    int32_t n_vocab = cb_model_hparams(r->m)->n_vocab;
    cb_blend_params fp = r->bp;
    cb_gen_params gp = r->gp;
    cli_sink full_sm = {NULL, 1, NULL, 0, 0}, greedy_sm = {NULL, 1, NULL, 0, 0};
    float *vlogits = malloc(sizeof(float) * (size_t)n_vocab);
    double full_ms = 0, kl = 0;
    int top1 = 0;
    cb_score_result fsr = {0};
    cb_status st = vlogits ? CB_OK : CB_ERR_NOMEM;
    cb_error err;

    cb_error_set(&err, st, "%s", cb_strerror(st));
    gp.sp.temp = 0;
    fp.mode = CB_MODE_FULL;
    for (int pass = 0; st == CB_OK && pass < 2; pass++) {
        /* pass 0: full prefill; pass 1: this mode again, greedily, when the run sampled */
        if (pass == 1 && (o->sp.temp <= 0 || r->cont.n))
            break;
        cb_kvcache *kv2 = NULL;
        cb_fwd *f2 = NULL;
        cb_blend_stats bs2;
        cb_gen_result g2;
        double tv = cb_now_ms();
        if ((st = run_alloc(r, &kv2, &f2)) != CB_OK)
            cb_error_set(&err, st, "the second prefill: %s", cb_model_strerror(r->m, st));
        else
            st = cb_blend_prefill(f2, kv2, r->segs, r->n_segs, pass ? &r->bp : &fp, vlogits, &bs2,
                                  &err);
        if (st == CB_OK && pass == 0) {
            full_ms = cb_now_ms() - tv;
            kl = cb_logits_kl(vlogits, r->first_logits, n_vocab, &top1);
        }
        if (st == CB_OK && r->cont.n) {
            if ((st = cb_score(f2, kv2, vlogits, (int32_t)r->total, r->cont.ids, (int32_t)r->cont.n,
                               &fsr)) != CB_OK)
                cb_error_set(&err, st, "scoring: %s", cb_model_strerror(r->m, st));
        } else if (st == CB_OK &&
                   (st = cb_generate(f2, kv2, vlogits, (int32_t)r->total, &gp, cli_sink_write,
                                     pass ? &greedy_sm : &full_sm, tv, &g2)) != CB_OK)
            cb_error_set(&err, st, "generation: %s", cb_model_strerror(r->m, st));
        cb_fwd_free(f2);
        cb_kvcache_free(kv2);
    }
    if (st == CB_OK && r->cont.n) {
        r->verify =
            json_pack("{s:f, s:b, s:f, s:f, s:f}", "kl", kl, "top1_agree", top1, "full_prefill_ms",
                      full_ms, "score_nll", fsr.nll, "score_top1", fsr.top1);
    } else if (st == CB_OK) {
        const char *mine = o->sp.temp > 0 ? greedy_sm.all : r->sm.all, *full = full_sm.all;
        int same = strcmp(mine ? mine : "", full ? full : "") == 0;
        char *clean = cli_utf8_clean(full ? full : "", full ? full_sm.all_len : 0, NULL);
        r->verify =
            json_pack("{s:f, s:b, s:b, s:f, s:s}", "kl", kl, "top1_agree", top1, "same_answer",
                      same, "full_prefill_ms", full_ms, "full_answer", clean ? clean : "");
        free(clean);
    } else {
        cli_err("--verify: the full-prefill comparison failed: %s", err.msg);
    }
    free(full_sm.all), free(greedy_sm.all);
    free(vlogits);
    return cli_exit_code(st);
}


json_t *gen_stats_json(const cb_answer *a, const cb_model *m, cb_store *st)
{
    char *text = NULL;
    json_t *s = NULL;
    if (cb_answer_to_json(a, m, st, &text) == CB_OK)
        s = json_loads(text, 0, NULL);
    free(text);
    return s;
}

/* --stats: the library's object for this answer, with --verify's block. */
static int run_stats(run *r)
{
    cb_answer a = {.scored = r->cont.n > 0,
                   .score = r->sr,
                   .gen = r->gr,
                   .gen_ms = r->gen_ms,
                   .bp = r->bp,
                   .ratio_source = r->ratio_source,
                   .rc = r->rc,
                   .bs = r->bs,
                   .n_prompt_tokens = r->total,
                   .n_chunks = cb_prompt_n_chunks(r->pr),
                   .n_missing = cb_prompt_n_missing(r->pr),
                   .n_stored = r->n_stored,
                   .n_after = cb_prompt_n_after(r->pr),
                   .n_own = cb_prompt_n_own(r->pr),
                   .n_named = cb_prompt_n_named(r->pr),
                   .n_middle = cb_prompt_n_middle(r->pr),
                   .chat = cb_prompt_chat(r->pr),
                   .kv_type = r->o->kv_type};
    json_t *s = gen_stats_json(&a, r->m, r->store);
    int code;
    if (s && r->verify)
        json_object_set_new(s, "verify", r->verify), r->verify = NULL;
    code = s ? cli_write_json(r->o->stats_path, s) : CLI_EX_SOFTWARE;
    json_decref(s);
    return code;
}

/* Prefill (in the chosen mode) and generate; TTFT counts from r->t0. */
static int run_answer(run *r)
{
    const gen_opts *o = r->o;
    int32_t n_vocab = cb_model_hparams(r->m)->n_vocab;
    cb_error err;
    cb_status st;

    if (!(r->logits = malloc(sizeof(float) * (size_t)n_vocab))) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    if ((st = run_alloc(r, &r->kv, &r->f)) != CB_OK)
        return cli_exit_code(st);
    if (o->ratio_auto && r->bp.mode == CB_MODE_BLEND)
        run_auto_ratio(r);
    if ((st = cb_prompt_prefill(r->pr, r->store, r->f, r->kv, &r->bp, r->logits, &r->bs, gen_warn,
                                NULL, &err))) {
        cli_err("%s", err.msg);
        return cli_exit_code(st);
    }
    if (r->bp.ratio_auto)
        cli_info("--ratio auto: %.3f of %d cached tokens%s%s (predicted, in full prefill's time: "
                 "load %.3f, recompute %.3f)",
                 (double)r->bs.plan_ratio, r->bs.n_cached_tokens, r->rc.tier[0] ? " in tier " : "",
                 r->rc.tier, (double)r->bs.pred_load, (double)r->bs.pred_recompute);
    if (o->logits_out && cb_file_write_atomic(o->logits_out, r->logits,
                                              sizeof(float) * (size_t)n_vocab, &err) != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(err.status);
    }
    if (o->verify && (r->first_logits = malloc(sizeof(float) * (size_t)n_vocab)))
        memcpy(r->first_logits, r->logits, sizeof(float) * (size_t)n_vocab);
    if (r->cont.n) { /* no generation: the first token's distribution is ready now */
        r->gr.first_ms = cb_now_ms() - r->t0;
        r->gr.stop = "score";
        if ((st = cb_score(r->f, r->kv, r->logits, (int32_t)r->total, r->cont.ids,
                           (int32_t)r->cont.n, &r->sr)) != CB_OK) {
            cli_err("%s: scoring the continuation failed: %s", o->score ? "--score" : o->score_file,
                    cb_model_strerror(r->m, st));
            return cli_exit_code(st);
        }
        r->gen_ms = cb_now_ms() - r->t0 - r->gr.first_ms;
        printf("%.6f\n", r->sr.nll);
        fflush(stdout);
        return 0;
    }
    if ((st = cb_generate(r->f, r->kv, r->logits, (int32_t)r->total, &r->gp, cli_sink_write, &r->sm,
                          r->t0, &r->gr)) != CB_OK) {
        cli_err("generation failed: %s", cb_model_strerror(r->m, st));
        return cli_exit_code(st);
    }
    r->gen_ms = cb_now_ms() - r->t0 - r->gr.first_ms;
    putchar('\n'); /* the answer is a line: one newline after it, always */
    fflush(stdout);
    return 0;
}

int run_generate(const gen_opts *o, const char *text, size_t len)
{
    run r = {.o = o, .bp = o->bp, .gr = {0, 0, "length"}, .ratio_source = "given"};
    int code;

    r.sm = (cli_sink){stdout, o->verify, NULL, 0, 0};
    r.gp = (cb_gen_params){o->sp, o->n_predict, o->stops, o->n_stops};
    if ((code = run_open(&r)) != 0)
        goto done;
    r.t0 =
        cb_now_ms(); /* TTFT counts from here: prompt assembly, cache lookup, prefill, first token */
    if ((code = run_prompt(&r, text, len)) != 0 || (code = run_answer(&r)) != 0)
        goto done;
    if (o->verify && r.first_logits)
        code = run_verify(&r);
    cli_info(
        "prefill %lld tokens (%d cached, %d recomputed) in %.1f ms (load %.1f ms); TTFT %.1f ms; %d tokens in "
        "%.1f ms; stop: %s",
        (long long)r.total, r.bs.n_cached_tokens, r.bs.n_recomputed_tokens, r.bs.prefill_ms,
        r.bs.load_ms, r.gr.first_ms, r.gr.n_gen, r.gen_ms, r.gr.stop);
    /* For the next run, after the answer (no latency): keep streamed chunks, store missing ones. */
    cb_prompt_keep(r.pr, r.store, gen_warn, NULL);
    if (o->store_write && r.store && !cb_store_readonly(r.store))
        cb_prompt_store_missing(r.pr, r.store, CB_TYPE_F16, &r.n_stored, gen_warn, NULL);
    if (o->stats_path)
        code = run_stats(&r);
done:
    json_decref(r.verify);
    cb_tokens_free(&r.cont);
    free(r.sm.all);
    free(r.logits);
    free(r.first_logits);
    cb_prompt_free(r.pr);
    cb_fwd_free(r.f);
    cb_kvcache_free(r.kv);
    cb_store_close(r.store);
    cb_model_free(r.m);
    json_decref(r.chunks);
    return code;
}
