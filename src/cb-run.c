/* cb-run - answer a prompt: full prefill, or blend the chunks' cached KV
 * with selective recompute (prompt, caches and generation are libcbcore's:
 * cb_prompt_*, cb_blend_prefill, cb_generate); here: options, output, stats.
 *
 *   cb-run [-m MODEL] [-p TEXT | -f FILE | stdin] [--chunks FILE] [--mode M] ...
 *   cb-run --tokenize | --detokenize ...  (tokenizer modes: cli_tokenize) */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fputs(
        "usage: cb-run [options] [-p TEXT | -f FILE]  answer a prompt (default: stdin)\n"
        "       cb-run [options] --batch [FILE|-]     answer each JSON Lines question\n"
        "       cb-run --tokenize|--detokenize [-m MODEL] [--special] [-p TEXT|-f FILE]\n"
        "\n"
        "Prompt and sampling:\n"
        "  -p, --prompt TEXT  the prompt (or the question)\n"
        "  -f, --file FILE    read the prompt from FILE ('-' or none: stdin)\n"
        "      --system TEXT  system message (default: the chat template's own; '' none)\n"
        "      --raw          the prompt as is, no chat template (control tokens matched)\n"
        "  -n, --n-predict N  generate at most N tokens (default 256)\n"
        "      --temp T       temperature; 0 is greedy (default 0)\n"
        "      --top-k K      keep the K most likely tokens (default 40; 0 = off)\n"
        "      --top-p P      nucleus sampling (default 0.95; 1 = off)\n"
        "      --min-p P      drop tokens below P x the top probability (default 0.05)\n"
        "  -s, --seed N       sampling seed (default 0)\n"
        "      --stop STR     stop when STR is generated (not printed); repeatable\n"
        "  -c, --ctx N        context size (default: prompt + N, at most the model's)\n"
        "\n"
        "Reusing cached chunks (see cb-precompute(1)):\n"
        "      --chunks FILE  chunk records (\"text\") put before the question ('-': stdin)\n"
        "      --store DIR    the store of their KV files (default: $CB_STORE, else\n"
        "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/store)\n"
        "      --mode MODE    blend (default with --chunks): reuse every chunk's cache,\n"
        "                     recompute some tokens; reuse: recompute none; prefix: reuse\n"
        "                     the leading chunk only; full: ordinary prefill\n"
        "      --speedup S    recompute as many cached tokens as keep the predicted\n"
        "                     compute S times under full prefill's (default 4)\n"
        "      --ratio R|auto recompute the share R of the cached tokens instead; auto:\n"
        "                     as much as loading hides (the store's cb-profile(1))\n",
        f);
    fprintf(f, "      --strategy S   %s (default)", cli_strategy_names[CB_STRATEGY_AUTO]);
    for (int i = 0; i < cli_n_strategies; i++)
        if (i != CB_STRATEGY_AUTO)
            fprintf(f, ", %s", cli_strategy_names[i]);
    fputs(
        "\n"
        "      --tune KEY=VALUE  a research knob (repeatable); --tune help lists them\n"
        "      --verify       also run full prefill: its KL, top-1 and answer in --stats\n"
        "      --stats FILE   timings and counts as one JSON object ('-' = stderr)\n"
        "      --no-store-write  do not store the KV of chunks that had none\n"
        "      --kv-type T    KV cache elements: f16 (default) or f32\n"
        "      --score TEXT   print TEXT's mean NLL per token after the prompt instead\n"
        "      --score-file FILE  the same, the text read from FILE ('-' = stdin)\n"
        "      --logits-out FILE  the first token's logits (float32 LE) into FILE\n"
        "\n"
        "Many questions:\n"
        "      --batch        JSON Lines, an object a line: \"question\"; optional \"id\",\n"
        "                     \"chunks\", \"system\", \"mode\", \"ratio\", \"speedup\", \"strategy\",\n"
        "                     \"n_predict\", \"score\", \"stop\"; an answer line each, in order\n"
        "      --batch-size N at most N questions in flight (default: as many as fit)\n"
        "      --kv-budget SIZE  their KV caches within SIZE (default: half free memory)\n"
        "\n"
        "Tokenizer and common options:\n"
        "      --tokenize     print the input's token ids (no BOS or EOS) on one line\n"
        "      --detokenize   read token ids and print their text\n"
        "      --special      match control tokens in the text / print them as text\n"
        "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model in\n"
        "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/models/)\n"
        "  -t, --threads N    compute threads (default: every core)\n" CLI_DEVICE_HELP
        "  -v, --verbose      print model facts and timings on stderr\n"
        "  -q, --quiet        print nothing but errors\n"
        "  -h, --help         this help\n"
        "      --version      print the version\n"
        "\n"
        "Exit status: 0 ok, 64 usage, 65 bad input data, 66 input missing, 69 device\n"
        "unavailable or failed, 70 internal error, 73 cannot create output, 74 I/O error.\n"
        "Research knobs (--tune KEY=VALUE): cb-run --tune help; man cb-run, TUNING.\n",
        f);
}

enum {
    OPT_TOKENIZE = 256,
    OPT_DETOKENIZE,
    OPT_SPECIAL,
    OPT_SYSTEM,
    OPT_RAW,
    OPT_TEMP,
    OPT_TOPK,
    OPT_TOPP,
    OPT_MINP,
    OPT_STOP,
    OPT_MODE,
    OPT_STATS,
    OPT_KVTYPE,
    OPT_CHUNKS,
    OPT_RATIO,
    OPT_STRATEGY,
    OPT_VERIFY,
    OPT_NOSTORE,
    OPT_LOGITS,
    OPT_SCORE,
    OPT_SCOREFILE,
    OPT_BATCH,
    OPT_BATCHSIZE,
    OPT_KVBUDGET,
    OPT_SPEEDUP,
    OPT_TUNE
};

/* ---------------------------------------------------------- generation */

typedef struct gen_opts {
    const char *model, *system, *stats_path, *in_name, *store_dir, *chunks_path, *logits_out,
        *device;
    const char *score, *score_file; /* --score TEXT, --score-file FILE */
    int raw, n_predict, n_ctx, n_threads, verify, store_write, ratio_auto, min_ratio_given;
    int no_context;                 /* --tune no-context */
    int ratio_given, speedup_given; /* --ratio or --tune ratios; --speedup */
    double min_ratio;
    cb_type kv_type;
    cb_sampler_params sp;
    cb_blend_params bp;
    int mode_given;
    const char **stops;
    int n_stops;
} gen_opts;


static void warn(void *ctx, const char *msg) { cli_err("warning: %s", msg); }

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
    const char *ratio_source; /* --ratio auto: controller or fallback */
    cb_ratio_choice rc;
    json_t *verify;
    int n_stored;
    cb_tokens cont;     /* --score: the continuation's tokens */
    cb_score_result sr; /* --score: its score */
} run;

/* --chunks' records (into *chunks) and the model (its load time into
 * *t_load); -c within the context the model was trained for. */
static int open_model(const gen_opts *o, json_t **chunks, cb_model **m, double *t_load)
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
    if (o->n_ctx > cb_model_hparams(*m)->n_ctx_train) {
        cli_err("-c %d: more than the model's context (%d tokens, as trained)", o->n_ctx,
                cb_model_hparams(*m)->n_ctx_train);
        return CLI_EX_USAGE;
    }
    return 0;
}

/* The store (created when it will be written): a missing one is a
 * warning, every chunk then computed. */
static int open_store(const gen_opts *o, cb_store **s)
{
    cb_error err;
    cb_status st = cb_store_open(s, o->store_dir, o->store_write, &err);
    if (st != CB_OK) {
        if (st != CB_ERR_NOT_FOUND) {
            cli_err("%s", err.msg);
            return cli_exit_code(st);
        }
        cli_err("warning: %s; every chunk is computed", err.msg);
        return 0;
    }
    cb_store_set_warn(*s, warn, NULL);
    if (cb_store_readonly(*s) && o->store_write)
        cli_err(
            "note: the store %s is read-only: chunks missing from it are computed and not stored",
            o->store_dir);
    return 0;
}

/* The cost model's figures (--speedup) of the store's profile for this
 * model and backend (cb-profile(1)) into bp; where it has none, bp keeps
 * its zeros: the built-in figures. */
static void profile_costs(const cb_store *s, const cb_model *m, cb_blend_params *bp)
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

    if ((code = open_model(o, &r->chunks, &r->m, &r->t_load)) != 0)
        return code;
    /* chunks, or a store named: the prompt's head may be cached there too */
    if (((r->chunks && json_array_size(r->chunks) > 0) || o->store_dir) &&
        (r->bp.mode != CB_MODE_FULL || (o->store_write && o->store_dir)) &&
        (code = open_store(o, &r->store)) != 0)
        return code;
    profile_costs(r->store, r->m, &r->bp);
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
    cb_strview *texts = calloc(nc ? nc : 1, sizeof *texts);
    cb_error err;
    cb_status st;
    int code;

    if (!texts)
        return CLI_EX_SOFTWARE;
    for (size_t i = 0; i < nc; i++) {
        json_t *t = json_object_get(json_array_get(r->chunks, i), "text");
        texts[i] = (cb_strview){json_string_value(t), json_string_length(t)};
    }
    st = cb_prompt_build(&r->pr, r->m, o->system, o->raw, texts, nc, text, len, &err);
    free(texts);
    if (st != CB_OK) {
        cli_err("%s: %s", o->in_name, err.msg);
        return cli_exit_code(st);
    }
    cb_prompt_use_context(r->pr, !o->no_context);
    if (r->bp.mode != CB_MODE_FULL)
        cb_prompt_attach(r->pr, r->store, warn, NULL);
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

/* --ratio auto: the controller's ratio for the slowest tier holding a chunk. */
static void run_auto_ratio(run *r)
{
    const gen_opts *o = r->o;
    cb_error err;
    if (cb_prompt_auto_ratio(r->pr, r->store, r->m, o->kv_type, o->min_ratio, &r->rc, &err) ==
        CB_OK) {
        r->bp.ratios[0] = (float)r->rc.ratio;
        r->ratio_source = "controller";
        cli_info(
            "--ratio auto: %.3f for %lld cached tokens in tier %s (predicted load %.1f ms, recompute %.1f ms)",
            r->bp.ratios[0], (long long)r->rc.n_cached, r->rc.tier, r->rc.pred_load_ms,
            r->rc.pred_recompute_ms);
        return;
    }
    r->bp.ratios[0] = (float)o->min_ratio;
    r->ratio_source = "fallback";
    cli_err(
        "note: --ratio auto: no profile for this model and backend in %s (run cb-profile); using "
        "--min-ratio %.2f",
        o->store_dir, o->min_ratio);
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

/* What --stats reports of one answer (a lone run's, or each --batch
 * answer's "stats"). */
typedef struct stats_src {
    const cb_blend_params *bp;
    const cb_blend_stats *bs;
    int64_t total;
    const cb_gen_result *gr;
    double gen_ms, t_load;
    int n_chunks, n_missing, n_stored, n_after, n_own;
    cb_chat_kind chat;
    const char *ratio_source; /* with ratio_auto */
    const cb_ratio_choice *rc;
    int ratio_auto;
    const cb_score_result *score; /* or NULL */
} stats_src;

/* The plan the blend resolved before any layer ran (cb_blend_prefill):
 * its ratio, where it came from and what bounded it, the strategy, the
 * keys' temperature, the stale scale, and the cost model's figures, each
 * with its source: the store's profile (cb-profile(1)) or the built-in. */
static json_t *plan_json(const cb_blend_params *bp, const cb_blend_stats *bs, const stats_src *ss)
{
    const char *src = ss->ratio_auto              ? ss->ratio_source
                      : bp->mode != CB_MODE_BLEND ? "mode"
                      : bp->adapt_mass > 0        ? "adaptive"
                      : bp->speedup > 0           ? "speedup"
                                                  : "given";
    const float fig[3] = {bs->costs.load, bs->costs.attn, bs->costs.score};
    const char *const names[3] = {"load", "attn", "score"};
    json_t *costs = json_object();
    for (int i = 0; i < 3; i++)
        json_object_set_new(costs, names[i],
                            json_pack("{s:f, s:s}", "value", (double)fig[i], "source",
                                      bs->costs_given >> i & 1 ? "profile" : "built-in"));
    json_t *p = json_pack(
        "{s:f, s:s, s:s, s:o, s:f, s:f, s:o}", "ratio", (double)bs->plan_ratio, "ratio_source", src,
        "bound", bs->plan_bound ? bs->plan_bound : "given", "strategy",
        bp->mode == CB_MODE_BLEND ? json_string(cli_strategy_names[bs->strategy]) : json_null(),
        "key_temp", (double)bs->key_temp, "stale_scale", (double)bs->stale_scale, "costs", costs);
    if (p && strcmp(src, "speedup") == 0)
        json_object_set_new(p, "speedup", json_real((double)bp->speedup));
    return p;
}

static json_t *stats_json(const gen_opts *o, const cb_model *m, const stats_src *ss)
{
    const cb_blend_params *bp = ss->bp;
    const cb_blend_stats *bs = ss->bs;
    json_t *sel = json_array();

    for (int i = 0; bp->mode == CB_MODE_BLEND && i < bp->n_ratios; i++)
        json_array_append_new(sel, json_integer(bs->n_selected[i]));
    double ratio = bs->ratio;
    json_t *s = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:o, s:f, s:f, s:s, s:i, s:i, s:i, s:i, s:s, "
        "s:s, s:i, s:s, s:s, s:s, s:s, s:f, s:s, s:f, s:f, s:I, s:i, s:f, s:i, s:f}",
        "mode", cli_mode_names[bp->mode], "n_prompt_tokens", (json_int_t)ss->total,
        "n_cached_tokens", (json_int_t)bs->n_cached_tokens, "n_exact_tokens",
        (json_int_t)bs->n_exact_tokens, "n_recomputed_tokens", (json_int_t)bs->n_recomputed_tokens,
        "ratio", ratio, "ttft_ms", ss->gr->first_ms, "prefill_ms", bs->prefill_ms, "load_ms",
        bs->load_ms, "n_gen_tokens", (json_int_t)ss->gr->n_gen, "gen_ms", ss->gen_ms,
        "recompute_ms", bs->recompute_ms, "n_selected", sel, "prefill_tok_s",
        ss->total / (bs->prefill_ms / 1e3), "gen_tok_s",
        ss->gr->n_gen ? ss->gr->n_gen / (ss->gen_ms / 1e3) : 0.0, "stop", ss->gr->stop, "n_chunks",
        ss->n_chunks, "n_chunks_missing", ss->n_missing, "n_chunks_stored", ss->n_stored,
        "check_layer", bp->check_layer, "strategy", cli_strategy_names[bp->strategy], "deviation",
        bp->deviation_v ? "v" : "k", "threads", o->n_threads, "backend", cb_model_backend(m),
        "device", cb_model_device(m), "chat_template", cb_chat_name(ss->chat), "kv_type",
        cb_type_name(o->kv_type), "model_load_ms", ss->t_load, "model", o->model, "overlapped_ms",
        bs->overlapped_ms, "stall_ms", bs->stall_ms, "load_bytes", (json_int_t)bs->load_bytes,
        "probe_rows", bp->probe_rows, "probe_depth", (double)bp->probe_depth, "probe_layers",
        bs->probe_layers, "key_temp", (double)bs->key_temp);
    if (s)
        json_object_set_new(s, "stale_scale", json_real((double)bs->stale_scale));
    if (s)
        json_object_set_new(s, "probe_weight", json_string(bp->probe_values ? "value" : "none"));
    if (s)
        json_object_set_new(s, "probe_passages", json_integer(bp->probe_passages));
    if (s) {
        json_object_set_new(s, "stall_clock",
                            json_string(bs->stall_clock ? bs->stall_clock : "host"));
        json_object_set_new(s, "load_threads", json_integer(bs->load_threads));
    }
    if (s) {
        json_object_set_new(s, "n_chunks_after", json_integer(ss->n_after));
        json_object_set_new(s, "n_chunks_system", json_integer(ss->n_own));
        json_object_set_new(s, "strategy_used",
                            bp->mode == CB_MODE_BLEND
                                ? json_string(cli_strategy_names[bs->strategy])
                                : json_null());
    }
    if (s && ss->ratio_auto) {
        json_object_set_new(s, "ratio_source", json_string(ss->ratio_source));
        json_object_set_new(s, "predicted_load_ms", json_real(ss->rc->pred_load_ms));
        json_object_set_new(s, "predicted_recompute_ms", json_real(ss->rc->pred_recompute_ms));
        if (ss->rc->tier[0])
            json_object_set_new(s, "tier", json_string(ss->rc->tier));
    }
    if (s && bp->mode == CB_MODE_BLEND && bp->n_ratios == 1)
        json_object_set_new(s, "predicted_speedup", json_real(bs->pred_speedup));
    if (s && bp->speedup > 0 && bp->adapt_mass == 0 && bp->mode == CB_MODE_BLEND) {
        json_object_set_new(s, "ratio_source", json_string("speedup"));
        json_object_set_new(s, "speedup",
                            json_pack("{s:f, s:f, s:s}", "target", (double)bp->speedup, "min_ratio",
                                      (double)bp->ratios[0], "bound", bs->ratio_bound));
    }
    if (s && bp->adapt_mass > 0 && bp->mode == CB_MODE_BLEND) {
        json_object_set_new(s, "ratio_source", json_string("adaptive"));
        json_object_set_new(s, "adaptive",
                            json_pack("{s:f, s:f, s:f, s:f, s:s}", "mass", bp->adapt_mass,
                                      "selected_mass", bs->selected_mass, "min_ratio",
                                      bp->adapt_min, "max_ratio", bp->adapt_max, "bound",
                                      bs->ratio_bound));
    }
    if (s && bp->mode != CB_MODE_FULL)
        json_object_set_new(s, "plan", plan_json(bp, bs, ss));
    if (s && ss->score)
        json_object_set_new(s, "score",
                            json_pack("{s:f, s:I, s:f}", "nll", ss->score->nll, "n_tokens",
                                      (json_int_t)ss->score->n_tokens, "top1", ss->score->top1));
    return s;
}

/* --stats' "shared" and "store" blocks (a lone run's, or a batch's): how
 * the shared tier is secured and what it refused; the entries the store
 * dropped as bad when read (to be computed and put again) and the puts
 * that a tier's full file system sent to a later tier. */
static void store_stats(json_t *s, cb_store *st)
{
    cb_store_shared_auth sa;
    cb_store_tier_stat ts[CB_STORE_MAX_TIERS + 1];
    cb_error e2;
    uint64_t healed = 0, full = 0;
    int n = cb_store_n_tiers(st);
    if (cb_store_shared_name(st) && cb_store_shared_auth_info(st, &sa, &e2) == CB_OK)
        json_object_set_new(s, "shared",
                            json_pack("{s:s, s:b, s:b, s:I, s:I}", "tier", cb_store_shared_name(st),
                                      "authenticated", sa.authenticated, "login_refused",
                                      sa.login_refused, "n_refused", (json_int_t)sa.n_refused,
                                      "n_resealed", (json_int_t)sa.n_resealed));
    if (cb_store_stat(st, ts, NULL, &e2) == CB_OK)
        for (int i = 0; i < n; i++)
            healed += ts[i].healed, full += ts[i].full;
    if (cb_store_shared_name(st)) {
        cb_store_shared_stat(st, &ts[n], &e2); /* its count even when it is down */
        healed += ts[n].healed;
    }
    json_object_set_new(
        s, "store",
        json_pack("{s:I, s:I}", "n_healed", (json_int_t)healed, "n_full", (json_int_t)full));
}

static int run_stats(run *r)
{
    stats_src ss = {&r->bp,
                    &r->bs,
                    r->total,
                    &r->gr,
                    r->gen_ms,
                    r->t_load,
                    cb_prompt_n_chunks(r->pr),
                    cb_prompt_n_missing(r->pr),
                    r->n_stored,
                    cb_prompt_n_after(r->pr),
                    cb_prompt_n_own(r->pr),
                    cb_prompt_chat(r->pr),
                    r->ratio_source,
                    &r->rc,
                    r->o->ratio_auto,
                    r->cont.n ? &r->sr : NULL};
    json_t *s = stats_json(r->o, r->m, &ss);
    int code;
    if (s && r->verify)
        json_object_set_new(s, "verify", r->verify), r->verify = NULL;
    if (s && r->store)
        store_stats(s, r->store);
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
    if ((st = cb_prompt_prefill(r->pr, r->store, r->f, r->kv, &r->bp, r->logits, &r->bs, warn, NULL,
                                &err))) {
        cli_err("%s", err.msg);
        return cli_exit_code(st);
    }
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

static int run_generate(const gen_opts *o, const char *text, size_t len)
{
    run r = {.o = o, .bp = o->bp, .gr = {0, 0, "length"}, .ratio_source = "given"};
    int code;

    r.sm = (cli_sink){stdout, o->verify, NULL, 0, 0};
    r.gp = (cb_gen_params){o->sp, o->n_predict, o->stops, o->n_stops};
    r.rc.pred_load_ms = r.rc.pred_recompute_ms = -1;
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
    cb_prompt_keep(r.pr, r.store, warn, NULL);
    if (o->store_write && r.store && !cb_store_readonly(r.store))
        cb_prompt_store_missing(r.pr, r.store, CB_TYPE_F16, &r.n_stored, warn, NULL);
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

/* ---------------------------------------------------------- --batch
 *
 * JSON Lines in, one question a line; JSON Lines out, an answer a line in
 * input order.  The questions run through cb_batch (lib/prompt/batch.c):
 * here only the lines are read, turned into requests, and the answers
 * written.  A bad line gets a line with "error" and its line number, and the
 * rest go on. */

/* One line, from reading to writing. */
typedef struct qline {
    long lineno;
    size_t seq;       /* its place in the output */
    double submit_ms; /* when it was submitted, from the batch's start */
    cli_question q;   /* the parsed object and what its request points into */
} qline;

static void qline_free(qline *q)
{
    if (!q)
        return;
    cli_question_free(&q->q);
    free(q);
}

/* The answer line of q: its id, the answer (or score, or error) and the
 * fields the batch does not read; NULL when out of memory. */
static char *answer_line(const gen_opts *o, const cb_model *m, double t_load, const qline *q,
                         const cb_answer *a, const char *error)
{
    json_t *obj = q->q.obj, *out = json_object(), *id = obj ? json_object_get(obj, "id") : NULL;
    const char *k;
    json_t *v;
    if (id)
        json_object_set(out, "id", id);
    if (error) {
        json_object_set_new(out, "line", json_integer(q->lineno));
        json_object_set_new(out, "error", json_string(error));
    } else if (a->scored) {
        json_object_set_new(out, "score",
                            json_pack("{s:f, s:I, s:f}", "nll", a->score.nll, "n_tokens",
                                      (json_int_t)a->score.n_tokens, "top1", a->score.top1));
    } else {
        size_t n = 0;
        char *clean = cli_utf8_clean(a->text ? a->text : "", a->len, &n);
        json_object_set_new(out, "answer", json_stringn(clean ? clean : "", n));
        free(clean);
    }
    json_object_foreach(obj, k, v)
        if (!cli_question_reads(k) && !json_object_get(out, k))
            json_object_set(out, k, v);
    if (!error) {
        stats_src ss = {&a->bp,
                        &a->bs,
                        a->n_prompt_tokens,
                        &a->gen,
                        a->gen_ms,
                        t_load,
                        a->n_chunks,
                        a->n_missing,
                        a->n_stored,
                        a->n_after,
                        a->n_own,
                        a->chat,
                        a->ratio_source,
                        &a->rc,
                        strcmp(a->ratio_source, "given") != 0,
                        a->scored ? &a->score : NULL};
        json_t *st = stats_json(o, m, &ss);
        json_object_set_new(st, "kv_bytes", json_integer((json_int_t)a->kv_bytes));
        /* A question's first token waits for the questions before it and
         * beside it, so a lone run's ttft_ms has no counterpart here: the
         * times count from the batch's start instead. */
        json_object_del(st, "ttft_ms");
        json_object_set_new(st, "submit_ms", json_real(q->submit_ms));
        json_object_set_new(st, "first_token_ms", json_real(q->submit_ms + a->gen.first_ms));
        json_object_set_new(out, "stats", st);
    }
    char *line = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    return line;
}

/* Answers written in input order: lines that are ready wait for the ones
 * before them. */
typedef struct outq {
    char **ready; /* [cap]: line seq = next + i, or NULL */
    size_t next, cap;
    int io_err;
} outq;

static int outq_put(outq *w, size_t seq, char *line)
{
    size_t i = seq - w->next;
    if (!line)
        return -1;
    if (i >= w->cap) {
        size_t nc = (i + 1) * 2;
        char **nr = realloc(w->ready, sizeof *nr * nc);
        if (!nr)
            return free(line), -1;
        memset(nr + w->cap, 0, sizeof *nr * (nc - w->cap));
        w->ready = nr, w->cap = nc;
    }
    w->ready[i] = line;
    while (w->cap > 0 && w->ready[0]) {
        if (puts(w->ready[0]) == EOF)
            w->io_err = 1;
        free(w->ready[0]);
        memmove(w->ready, w->ready + 1, sizeof *w->ready * (w->cap - 1));
        w->ready[w->cap - 1] = NULL;
        w->next++;
    }
    fflush(stdout);
    return 0;
}

/* The progress line on a terminal: questions, their rate, tokens/s, ETA. */
static void progress(const cb_batch_info *in, long total, double t0, int last)
{
    static double shown;
    double now = cb_now_ms(), s = (now - t0) / 1e3;
    int64_t done = in->n_answered + in->n_failed;
    if (!last && now - shown < 250)
        return;
    shown = now;
    fprintf(stderr, "\r%s: %lld", cli_prog, (long long)done);
    if (total > 0)
        fprintf(stderr, "/%ld", total);
    fprintf(stderr, " questions, %.2f/s, %.1f tok/s, %d in flight", s > 0 ? done / s : 0.0,
            s > 0 ? in->n_tokens / s : 0.0, in->in_flight);
    if (total > 0 && done > 0 && !last)
        fprintf(stderr, ", ETA %.0f s", (double)(total - done) * s / (double)done);
    fputs(last ? "\n" : "   ", stderr);
}

/* Non-blank lines of a regular file (for the ETA); 0 when not one. */
static long count_questions(const char *path)
{
    long n = 0;
    int c, blank = 1;
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    while ((c = getc(f)) != EOF) {
        if (c == '\n')
            n += !blank, blank = 1;
        else if (c != ' ' && c != '\t' && c != '\r')
            blank = 0;
    }
    fclose(f);
    return n + !blank;
}

/* The batch's model, store, default chunks, limits and output. */
typedef struct brun {
    const gen_opts *o;
    cb_model *m;
    cb_store *store;
    json_t *chunks;      /* --chunks' records, as a "chunks" array */
    cb_request defaults; /* the options' */
    cb_batch *b;
    outq w;
    double t_load, t0;   /* the model's loading; the batch's start (cb_now_ms) */
    const char *in_name; /* the input's name in messages */
    int worst;           /* the exit status so far */
} brun;

/* A line's failure: "FILE:LINE: message" on stderr, an error line, and the
 * exit status it makes (65 for bad data, else the failure's). */
static void line_failed(brun *r, qline *q, const char *msg, cb_status st)
{
    int code = cli_exit_code(st);
    if (code == CLI_EX_USAGE || code == CLI_EX_NOINPUT || code == CLI_EX_OK)
        code = CLI_EX_DATAERR; /* a bad parameter, a key the store lacks: the line's data */
    cli_err("%s:%ld: %s", r->in_name, q->lineno, msg);
    if (code != CLI_EX_DATAERR || r->worst == 0)
        r->worst = code;
    if (outq_put(&r->w, q->seq, answer_line(r->o, r->m, r->t_load, q, NULL, msg)) != 0)
        r->worst = CLI_EX_SOFTWARE;
}

/* Write the answers that ended. */
static void drain(brun *r)
{
    cb_answer *a;
    while ((a = cb_batch_next(r->b))) {
        qline *q = a->tag;
        if (a->status != CB_OK)
            line_failed(r, q, a->msg, a->status);
        else if (outq_put(&r->w, q->seq, answer_line(r->o, r->m, r->t_load, q, a, NULL)) != 0)
            r->worst = CLI_EX_SOFTWARE;
        qline_free(q);
        cb_answer_free(a);
    }
}

/* Read, parse and submit one line; 1 at the end of the input. */
static int feed(brun *r, FILE *in, long *lineno, size_t *seq)
{
    char *line = NULL, msg[256];
    size_t cap = 0;
    ssize_t len;
    cb_request rq;
    for (;;) {
        if ((len = getline(&line, &cap, in)) < 0) {
            free(line);
            return 1;
        }
        ++*lineno;
        if (strspn(line, " \t\r\n") != (size_t)len)
            break;
    }
    qline *q = calloc(1, sizeof *q);
    if (!q) {
        free(line);
        r->worst = CLI_EX_SOFTWARE;
        return 1;
    }
    q->lineno = *lineno, q->seq = (*seq)++;
    int bad = cli_question_parse(line, (size_t)len, &r->defaults, r->o->mode_given, r->chunks,
                                 &q->q, &rq, msg, sizeof msg);
    free(line);
    q->submit_ms = cb_now_ms() - r->t0;
    if (bad) {
        line_failed(r, q, msg, CB_ERR_FORMAT);
        qline_free(q);
    } else if (cb_batch_submit(r->b, &rq, q) != CB_OK) {
        line_failed(r, q, "out of memory", CB_ERR_NOMEM);
        qline_free(q);
    }
    return 0;
}

/* The model, the store, --chunks, and the batch with its limits; with -c,
 * one question's cache is to fit the memory available (on the CPU). */
static int batch_open(brun *r, int32_t size, uint64_t budget)
{
    const gen_opts *o = r->o;
    cb_status st;
    int code;

    if ((code = open_model(o, &r->chunks, &r->m, &r->t_load)) != 0 ||
        (code = open_store(o, &r->store)) != 0)
        return code;
    profile_costs(r->store, r->m, &r->defaults.bp);
    if (o->n_ctx > 0 && strcmp(cb_model_backend(r->m), "cpu") == 0) {
        uint64_t kv = cb_kvcache_bytes(r->m, o->n_ctx, o->kv_type), avail = cli_mem_available();
        if (kv > avail) {
            cli_err("-c %d: a question's KV cache takes %.0f MiB; %.0f MiB of memory are available",
                    o->n_ctx, kv / 1048576.0, avail / 1048576.0);
            return cli_exit_code(CB_ERR_NOMEM);
        }
    }
    if (!budget)
        budget = cli_mem_available() / 2;
    int32_t dflt = cb_batch_default_size(r->m, o->kv_type, budget);
    cli_info(
        "batch: %d questions in flight (default %d: KV caches of %lld positions, the model's context, "
        "within %.0f MiB, at most %d), KV budget %.0f MiB",
        size ? size : dflt, dflt, (long long)cb_model_hparams(r->m)->n_ctx_train,
        (double)budget / 1048576.0, CB_BATCH_MAX, (double)budget / 1048576.0);
    if ((st = cb_batch_new(&r->b, r->m, r->store, size ? size : dflt, budget, warn, NULL)) !=
        CB_OK) {
        cli_err("%s", cb_model_strerror(r->m, st));
        return cli_exit_code(st);
    }
    return 0;
}

/* --stats with --batch: the whole batch's figures. */
static int batch_stats(const brun *r, double ms)
{
    const cb_batch_info *in = cb_batch_get_info(r->b);
    json_t *s = json_pack(
        "{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:i, s:i, s:I, s:I, s:I, s:f, s:s, s:s}",
        "n_questions", (json_int_t)in->n_submitted, "n_answered", (json_int_t)in->n_answered,
        "n_failed", (json_int_t)in->n_failed, "n_gen_tokens", (json_int_t)in->n_tokens, "wall_ms",
        ms, "questions_s", in->n_submitted / (ms / 1e3), "gen_tok_s", in->n_tokens / (ms / 1e3),
        "batch_size", in->cap, "in_flight_peak", in->in_flight_peak, "kv_budget",
        (json_int_t)in->kv_budget, "kv_peak", (json_int_t)in->kv_peak, "n_steps",
        (json_int_t)in->n_steps, "model_load_ms", r->t_load, "model", r->o->model, "device",
        cb_model_device(r->m));
    if (s && r->store)
        store_stats(s, r->store);
    int code = s ? cli_write_json(r->o->stats_path, s) : CLI_EX_SOFTWARE;
    json_decref(s);
    return code;
}

static int run_batch(const gen_opts *o, const char *path, int32_t size, uint64_t budget)
{
    brun r = {.o = o, .in_name = strcmp(path, "-") ? path : "stdin"};
    FILE *in = strcmp(path, "-") ? fopen(path, "r") : stdin;
    long lineno = 0, total = 0;
    size_t seq = 0;
    int eof = 0, code, tty;

    if (!in) {
        cli_err("%s: %s", path, strerror(errno));
        return CLI_EX_NOINPUT;
    }
    tty = isatty(2) && cli_verbosity > 0;
    r.defaults = (cb_request){o->system,      o->raw,
                              NULL,           0,
                              {NULL, 0},      {NULL, 0},
                              o->bp,          o->ratio_auto,
                              o->min_ratio,   {o->sp, o->n_predict, o->stops, o->n_stops},
                              o->n_ctx,       o->kv_type,
                              o->store_write, o->no_context};
    if (o->score)
        r.defaults.score = (cb_strview){o->score, strlen(o->score)};
    if ((code = batch_open(&r, size, budget)) != 0)
        goto done;
    r.t0 = cb_now_ms();
    if (tty)
        total = count_questions(path);
    while (!eof || cb_batch_busy(r.b)) {
        while (!eof && !cb_batch_full(r.b))
            eof = feed(&r, in, &lineno, &seq);
        drain(&r);
        if (cb_batch_busy(r.b))
            cb_batch_step(r.b);
        if (tty)
            progress(cb_batch_get_info(r.b), total, r.t0, 0);
    }
    if (tty)
        progress(cb_batch_get_info(r.b), total, r.t0, 1);
    if (ferror(in)) {
        cli_err("%s: read error", path);
        r.worst = CLI_EX_IOERR;
    }
    code = r.w.io_err ? CLI_EX_IOERR : r.worst;
    if (o->stats_path) {
        int sc = batch_stats(&r, cb_now_ms() - r.t0);
        code = code ? code : sc;
    }
done:
    if (in != stdin)
        fclose(in);
    for (size_t i = 0; i < r.w.cap; i++)
        free(r.w.ready[i]);
    free(r.w.ready);
    cb_batch_free(r.b);
    cb_store_close(r.store);
    cb_model_free(r.m);
    json_decref(r.chunks);
    return code;
}

/* ---------------------------------------------------------- options */

/* What main needs besides gen_opts. */
typedef struct cli_run {
    cli_common co;
    const char *prompt, *file;
    int mode, special;
    int batch;            /* --batch */
    const char *batch_in; /* its FILE (default stdin) */
    int32_t batch_size;   /* --batch-size, 0: the default */
    uint64_t kv_budget;   /* --kv-budget, 0: half the available memory */
} cli_run;

static int parse_ratios(const char *name, const char *arg, cb_blend_params *bp)
{
    char *dup = strdup(arg), *save = NULL;
    double d;
    bp->n_ratios = 0;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (bp->n_ratios == CB_BLEND_MAX_STEPS || cli_parse_num(name, t, 0, 1, &d)) {
            if (bp->n_ratios == CB_BLEND_MAX_STEPS)
                cli_err("%s: at most %d", name, CB_BLEND_MAX_STEPS);
            free(dup);
            return -1;
        }
        bp->ratios[bp->n_ratios++] = (float)d;
    }
    free(dup);
    if (bp->n_ratios == 0) {
        cli_err("%s: give r1,r2,...", name);
        return -1;
    }
    return 0;
}

/* The research knobs, given as --tune KEY=VALUE: each key's value, what it
 * tunes and its default, one line each for --tune help (cb-run(1), TUNING,
 * says more).  Indexed by enum tune. */
enum tune {
    TUNE_RATIOS,
    TUNE_MINRATIO,
    TUNE_MAXRATIO,
    TUNE_MASS,
    TUNE_CHECK,
    TUNE_DEVIATION,
    TUNE_SINK,
    TUNE_PROBEROWS,
    TUNE_PROBEWEIGHT,
    TUNE_PROBEDEPTH,
    TUNE_PASSAGES,
    TUNE_KEYTEMP,
    TUNE_STALESCALE,
    TUNE_LOADTHREADS,
    TUNE_NOCONTEXT,
    TUNE_N
};
static const struct tune_key {
    const char *key, *value, *help;
} tune_keys[TUNE_N] = {
    {"ratios", "R1,R2,..", "[0, 1] each: a ratio per check layer (hkvd, sink, query, runs)"},
    {"min-ratio", "R", "[0, 1] the least ratio --speedup, auto and mass pick (0.15; mass 0.05)"},
    {"max-ratio", "R", "[0, 1] the most ratio mass picks (0.5)"},
    {"mass", "M", "[0, 1] probe: per prompt, the ratio holding M of the attention (0: off)"},
    {"check-layer", "N", "[1, 4096] the (first) layer where deviation is measured (1)"},
    {"deviation", "k|v", "measure deviation on keys or values (v)"},
    {"sink-tokens", "N", "[0, 1024] sink: the first N tokens of every chunk recomputed (4)"},
    {"probe-rows", "N", "[0, 2^20] probe scores by the question's last N tokens (0: all)"},
    {"probe-weight", "value|none", "probe: attention times the value's norm, or alone (value)"},
    {"probe-depth", "F", "[0, 1] the share of layers probe's first pass runs (0: by cost)"},
    {"passages", "N", "[0, 64] probe: the N chunks it scores highest recomputed whole first (0)"},
    {"key-temp", "T", "[0.01, 100] cached keys divided by T (the model's: gemma3 1.05, else 1)"},
    {"stale-scale", "S",
     "[0.01, 100] blend: stale tokens' attention x S (the model's: qwen2 0.35)"},
    {"load-threads", "N", "[0, 64] threads reading the KV files (0: GPU half the cores; CPU 1)"},
    {"no-context", "0|1", "1 (or no value): each chunk's own cache, not one after the one before"},
};

static void tune_help(FILE *f)
{
    for (int i = 0; i < TUNE_N; i++) {
        char kv[40];
        snprintf(kv, sizeof kv, "%s=%s", tune_keys[i].key, tune_keys[i].value);
        fprintf(f, "  %-24s %s\n", kv, tune_keys[i].help);
    }
}

/* Set knob k from arg; name ("--tune KEY") names it in messages.  0, or -1
 * on a usage error. */
static int tune_set(gen_opts *o, enum tune k, const char *name, const char *arg)
{
    static const char *const devs[] = {"k", "v"}, *const weights[] = {"value", "none"},
                             *const bools[] = {"0", "1"};
    double d;
    int e;
    switch (k) {
    case TUNE_RATIOS: return o->ratio_given = 1, parse_ratios(name, arg, &o->bp);
    case TUNE_MINRATIO:
        return cli_parse_num(name, arg, 0, 1, &o->min_ratio) ? -1 : (o->min_ratio_given = 1, 0);
    case TUNE_MAXRATIO:
        return cli_parse_num(name, arg, 0, 1, &d) ? -1 : (o->bp.adapt_max = (float)d, 0);
    case TUNE_MASS:
        return cli_parse_num(name, arg, 0, 1, &d) ? -1 : (o->bp.adapt_mass = (float)d, 0);
    case TUNE_CHECK:
        return cli_parse_num(name, arg, 1, 4096, &d) ? -1 : (o->bp.check_layer = (int32_t)d, 0);
    case TUNE_DEVIATION:
        return cli_parse_enum(name, arg, devs, 2, &e) ? -1 : (o->bp.deviation_v = e, 0);
    case TUNE_SINK:
        return cli_parse_num(name, arg, 0, 1024, &d) ? -1 : (o->bp.sink_tokens = (int32_t)d, 0);
    case TUNE_PROBEROWS:
        return cli_parse_num(name, arg, 0, 1 << 20, &d) ? -1 : (o->bp.probe_rows = (int32_t)d, 0);
    case TUNE_PROBEWEIGHT:
        return cli_parse_enum(name, arg, weights, 2, &e) ? -1 : (o->bp.probe_values = e == 0, 0);
    case TUNE_PROBEDEPTH:
        return cli_parse_num(name, arg, 0, 1, &d) ? -1 : (o->bp.probe_depth = (float)d, 0);
    case TUNE_PASSAGES:
        return cli_parse_num(name, arg, 0, 64, &d) ? -1 : (o->bp.probe_passages = (int32_t)d, 0);
    case TUNE_KEYTEMP:
        return cli_parse_num(name, arg, 0.01, 100, &d) ? -1 : (o->bp.key_temp = (float)d, 0);
    case TUNE_STALESCALE:
        return cli_parse_num(name, arg, 0.01, 100, &d) ? -1 : (o->bp.stale_scale = (float)d, 0);
    case TUNE_LOADTHREADS:
        return cli_parse_num(name, arg, 0, 64, &d) ? -1 : (o->bp.load_threads = (int)d, 0);
    case TUNE_NOCONTEXT:
        return cli_parse_enum(name, arg, bools, 2, &e) ? -1 : (o->no_context = e, 0);
    case TUNE_N: break;
    }
    return -1;
}

/* --tune KEY=VALUE (KEY alone: no-context's 1).  0, or -1 on a usage error
 * (an unknown key, a bad value). */
static int tune_opt(gen_opts *o, const char *arg)
{
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    char name[64];
    for (int i = 0; i < TUNE_N; i++) {
        if (strlen(tune_keys[i].key) != n || strncmp(arg, tune_keys[i].key, n) != 0)
            continue;
        snprintf(name, sizeof name, "--tune %s", tune_keys[i].key);
        if (!eq && i != TUNE_NOCONTEXT) {
            cli_err("%s: give %s=%s", name, tune_keys[i].key, tune_keys[i].value);
            return -1;
        }
        return tune_set(o, (enum tune)i, name, eq ? eq + 1 : "1");
    }
    cli_err("--tune %.*s: no such key (cb-run --tune help lists them)", (int)(n < 64 ? n : 64),
            arg);
    return -1;
}

/* Blending and cache options; 1 when c is not one of them, -1 on a usage error. */
static int blend_opt(gen_opts *o, int c, const char *arg)
{
    static const char *const kv_types[] = {"f16", "f32"};
    double d;
    int e;
    switch (c) {
    case OPT_MODE:
        if (cli_parse_enum("--mode", arg, cli_mode_names, 4, &e))
            return -1;
        o->bp.mode = (cb_blend_mode)e;
        o->mode_given = 1;
        return 0;
    case OPT_CHUNKS: o->chunks_path = arg; return 0;
    case OPT_RATIO:
        o->bp.n_ratios = 1;
        o->ratio_given = 1;
        if (!strcmp(arg, "auto"))
            return o->ratio_auto = 1, 0;
        if (cli_parse_num("--ratio", arg, 0, 1, &d))
            return -1;
        o->bp.ratios[0] = (float)d;
        o->ratio_auto = 0;
        return 0;
    case OPT_SPEEDUP:
        if (cli_parse_num("--speedup", arg, 0, 1000, &d))
            return -1;
        o->bp.speedup = (float)d;
        o->speedup_given = 1;
        return 0;
    case OPT_STRATEGY:
        if (cli_parse_enum("--strategy", arg, cli_strategy_names, cli_n_strategies, &e))
            return -1;
        o->bp.strategy = (cb_blend_strategy)e;
        return 0;
    case OPT_TUNE: return tune_opt(o, arg);
    case OPT_VERIFY: o->verify = 1; return 0;
    case OPT_LOGITS: o->logits_out = arg; return 0;
    case OPT_SCORE: o->score = arg; return 0;
    case OPT_SCOREFILE: o->score_file = arg; return 0;
    case OPT_NOSTORE: o->store_write = 0; return 0;
    case OPT_STATS: o->stats_path = arg; return 0;
    case OPT_KVTYPE:
        if (cli_parse_enum("--kv-type", arg, kv_types, 2, &e))
            return -1;
        o->kv_type = e ? CB_TYPE_F32 : CB_TYPE_F16;
        return 0;
    }
    return 1;
}

/* Prompt and sampling options; 1 when c is not one of them, -1 on a usage error. */
static int gen_opt(gen_opts *o, cli_run *cr, int c, const char *arg)
{
    double d;
    switch (c) {
    case OPT_TOKENIZE:
    case OPT_DETOKENIZE:
        if (cr->mode && cr->mode != c) {
            cli_err("--tokenize and --detokenize exclude each other");
            return -1;
        }
        cr->mode = c;
        return 0;
    case OPT_SPECIAL: cr->special = 1; return 0;
    case OPT_BATCH: cr->batch = 1; return 0;
    case OPT_BATCHSIZE:
        return cli_parse_num("--batch-size", arg, 1, 4096, &d) ? -1
                                                               : (cr->batch_size = (int32_t)d, 0);
    case OPT_KVBUDGET:
        if (cli_parse_size(arg, &cr->kv_budget) != 0) {
            cli_err("--kv-budget %s: not a size (4096, 512M, 2G)", arg);
            return -1;
        }
        return 0;
    case 'p': cr->prompt = arg; return 0;
    case 'f': cr->file = arg; return 0;
    case OPT_SYSTEM: o->system = arg; return 0;
    case OPT_RAW: o->raw = 1; return 0;
    case 'n': return cli_parse_num("-n", arg, 0, 1e9, &d) ? -1 : (o->n_predict = (int)d, 0);
    case OPT_TEMP:
        return cli_parse_num("--temp", arg, 0, 100, &d) ? -1 : (o->sp.temp = (float)d, 0);
    case OPT_TOPK:
        return cli_parse_num("--top-k", arg, 0, 1e9, &d) ? -1 : (o->sp.top_k = (int32_t)d, 0);
    case OPT_TOPP:
        return cli_parse_num("--top-p", arg, 0, 1, &d) ? -1 : (o->sp.top_p = (float)d, 0);
    case OPT_MINP:
        return cli_parse_num("--min-p", arg, 0, 1, &d) ? -1 : (o->sp.min_p = (float)d, 0);
    case 's':
        return cli_parse_num("--seed", arg, 0, 1.8e19, &d) ? -1 : (o->sp.seed = (uint64_t)d, 0);
    case 'c': return cli_parse_num("-c", arg, 1, 1 << 24, &d) ? -1 : (o->n_ctx = (int)d, 0);
    case OPT_STOP:
        if (!*arg) {
            cli_err("--stop: empty string");
            return -1;
        }
        o->stops[o->n_stops++] = arg;
        return 0;
    }
    return blend_opt(o, c, arg);
}

/* Parse the command line into o and cr; -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, gen_opts *o, cli_run *cr)
{
    static const struct option opts[] = {
        {"tokenize", no_argument, 0, OPT_TOKENIZE},
        {"detokenize", no_argument, 0, OPT_DETOKENIZE},
        {"special", no_argument, 0, OPT_SPECIAL},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"system", required_argument, 0, OPT_SYSTEM},
        {"raw", no_argument, 0, OPT_RAW},
        {"n-predict", required_argument, 0, 'n'},
        {"temp", required_argument, 0, OPT_TEMP},
        {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"seed", required_argument, 0, 's'},
        {"stop", required_argument, 0, OPT_STOP},
        {"ctx", required_argument, 0, 'c'},
        {"mode", required_argument, 0, OPT_MODE},
        {"kv-type", required_argument, 0, OPT_KVTYPE},
        {"stats", required_argument, 0, OPT_STATS},
        {"chunks", required_argument, 0, OPT_CHUNKS},
        {"ratio", required_argument, 0, OPT_RATIO},
        {"logits-out", required_argument, 0, OPT_LOGITS},
        {"strategy", required_argument, 0, OPT_STRATEGY},
        {"verify", no_argument, 0, OPT_VERIFY},
        {"no-store-write", no_argument, 0, OPT_NOSTORE},
        {"score", required_argument, 0, OPT_SCORE},
        {"score-file", required_argument, 0, OPT_SCOREFILE},
        {"batch", no_argument, 0, OPT_BATCH},
        {"batch-size", required_argument, 0, OPT_BATCHSIZE},
        {"kv-budget", required_argument, 0, OPT_KVBUDGET},
        {"speedup", required_argument, 0, OPT_SPEEDUP},
        {"tune", required_argument, 0, OPT_TUNE},
        CLI_COMMON_OPTS,
        CLI_STORE_OPT,
        CLI_DEVICE_OPT,
        CLI_ACT8_OPT,
        {0, 0, 0, 0},
    };
    int c, r;
    while ((c = cli_getopt(argc, argv, "p:f:n:s:c:" CLI_COMMON_SHORT, opts)) != -1) {
        if (c == OPT_TUNE && !strcmp(optarg, "help")) {
            tune_help(stdout);
            return cli_finish(0);
        }
        if ((r = cli_common_opt(&cr->co, c, optarg, usage)) != CLI_NOT_COMMON) {
            if (r != CLI_CONTINUE)
                return r;
        } else if ((r = gen_opt(o, cr, c, optarg)) != 0) {
            if (r > 0)
                usage(stderr);
            return CLI_EX_USAGE;
        }
    }
    if (cr->batch && optind < argc)
        cr->batch_in = argv[optind++];
    if (optind < argc) {
        cli_err("unexpected argument '%s' (%s)", argv[optind],
                cr->batch ? "--batch reads one FILE" : "the prompt goes after -p");
        return CLI_EX_USAGE;
    }
    if (cr->batch) {
        const char *no = cr->prompt      ? "-p"
                         : cr->file      ? "-f"
                         : cr->mode      ? "--tokenize/--detokenize"
                         : o->verify     ? "--verify"
                         : o->logits_out ? "--logits-out"
                         : o->score_file ? "--score-file"
                                         : NULL;
        if (no) {
            cli_err("%s does not go with --batch (the questions are its input's lines)", no);
            return CLI_EX_USAGE;
        }
        if (o->chunks_path && !strcmp(o->chunks_path, "-") &&
            (!cr->batch_in || !strcmp(cr->batch_in, "-"))) {
            cli_err("--chunks - and --batch both read stdin: give the questions as a FILE");
            return CLI_EX_USAGE;
        }
    } else if (cr->batch_size || cr->kv_budget) {
        cli_err("--batch-size and --kv-budget go with --batch");
        return CLI_EX_USAGE;
    }
    if (cr->prompt && cr->file) {
        cli_err("-p and -f exclude each other");
        return CLI_EX_USAGE;
    }
    if (o->bp.adapt_mass > 0 &&
        ((o->bp.strategy != CB_STRATEGY_PROBE && o->bp.strategy != CB_STRATEGY_AUTO) ||
         o->ratio_auto)) {
        cli_err("--tune mass needs --strategy probe or auto (and no --ratio auto)");
        return CLI_EX_USAGE;
    }
    if (o->ratio_given && o->speedup_given && o->bp.speedup > 0) {
        cli_err("--ratio and --speedup exclude each other (--tune min-ratio sets --speedup's "
                "least ratio)");
        return CLI_EX_USAGE;
    }
    if (o->ratio_given) /* a ratio as given, or the controller's */
        o->bp.speedup = 0;
    else if (o->bp.speedup > 0 && o->min_ratio_given)
        o->bp.ratios[0] = (float)o->min_ratio;
    if (o->bp.adapt_mass > 0 && o->min_ratio_given)
        o->bp.adapt_min = (float)o->min_ratio;
    if (o->bp.adapt_mass > 0 && o->bp.adapt_min > o->bp.adapt_max) {
        cli_err("--tune min-ratio=%g is above max-ratio=%g", o->bp.adapt_min, o->bp.adapt_max);
        return CLI_EX_USAGE;
    }
    if (o->score && o->score_file) {
        cli_err("--score and --score-file exclude each other");
        return CLI_EX_USAGE;
    }
    if (o->score_file && strcmp(o->score_file, "-") == 0 &&
        (!cr->prompt && (!cr->file || strcmp(cr->file, "-") == 0))) {
        cli_err("--score-file - reads stdin: give the prompt with -p or -f FILE");
        return CLI_EX_USAGE;
    }
    if (o->score_file && o->chunks_path && !strcmp(o->score_file, "-") &&
        !strcmp(o->chunks_path, "-")) {
        cli_err("--score-file - and --chunks - both read stdin");
        return CLI_EX_USAGE;
    }
    if (o->chunks_path && strcmp(o->chunks_path, "-") == 0 && !cr->prompt &&
        (!cr->file || strcmp(cr->file, "-") == 0)) {
        cli_err("--chunks - reads stdin: give the question with -p or -f FILE");
        return CLI_EX_USAGE;
    }
    return -1;
}

int main(int argc, char **argv)
{
    cli_run cr = {0};
    gen_opts o = {0};
    char *input = NULL, store_buf[4096];
    size_t len = 0;
    int code = 0;

    cli_prog = "cb-run";
    cli_trap_sigbus();
    o.n_predict = 256;
    o.kv_type = CB_TYPE_F16;
    o.sp = cb_sampler_defaults();
    o.sp.temp = 0.0f;
    o.bp = cb_blend_defaults();
    o.store_write = 1;
    o.min_ratio = 0.15;
    o.stops = calloc((size_t)argc, sizeof *o.stops);
    if (!o.stops)
        return CLI_EX_SOFTWARE;
    if ((code = parse_args(argc, argv, &o, &cr)) >= 0) {
        free(o.stops);
        return code;
    }
    code = 0;
    o.model = cli_model_path(cr.co.model);
    o.device = cr.co.device;
    o.store_dir = cli_store_dir(&cr.co, store_buf, sizeof store_buf);
    if (access(o.model, R_OK) != 0 && !cr.co.model && !getenv("CB_MODEL"))
        cli_err("note: the default model is fetched with 'make model'; or give -m PATH");
    if (cr.batch) {
        o.n_threads = cli_threads(&cr.co);
        code = run_batch(&o, cr.batch_in ? cr.batch_in : "-", cr.batch_size, cr.kv_budget);
        free(o.stops);
        return cli_finish(code);
    }
    if (cr.prompt) {
        input = strdup(cr.prompt);
        len = strlen(cr.prompt);
        if (!input) {
            cli_err("out of memory");
            free(o.stops);
            return CLI_EX_SOFTWARE;
        }
    } else if (!(input = cli_read_input(cr.file, &len, &code))) {
        free(o.stops);
        return code;
    }
    o.in_name = cr.prompt ? "-p" : cr.file && strcmp(cr.file, "-") != 0 ? cr.file : "(stdin)";
    if (!o.chunks_path && !o.mode_given)
        o.bp.mode = CB_MODE_FULL; /* nothing to reuse */
    if (cr.mode) {
        code = cli_tokenize(cr.mode == OPT_DETOKENIZE, o.model, o.in_name, input, len, cr.special);
    } else {
        o.n_threads = cli_threads(&cr.co);
        code = run_generate(&o, input, len);
    }
    free(input);
    free(o.stops);
    return cli_finish(code);
}
