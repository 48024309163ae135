/* cb-run - run a model over a prompt and stream its answer.
 *
 *   cb-run [-m MODEL] [-p TEXT | -f FILE | stdin] [--system TEXT] [--raw]
 *          [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [-s SEED]
 *          [-c CTX] [--stop STR]... [--mode full] [--stats FILE|-] [-t N]
 *   cb-run --tokenize | --detokenize ...
 *
 * This build has --mode full (ordinary prefill); the cache modes come with
 * the store and the fusor. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cb-run [options] [-p TEXT | -f FILE]      answer a prompt (stdin by default)\n"
            "       cb-run --tokenize   [-m MODEL] [--special] [-p TEXT | -f FILE]\n"
            "       cb-run --detokenize [-m MODEL] [--special] [-p IDS | -f FILE]\n"
            "\n"
            "Generation:\n"
            "  -p, --prompt TEXT  the prompt (or the question)\n"
            "  -f, --file FILE    read the prompt from FILE ('-' for stdin; stdin is the default)\n"
            "      --system TEXT  system message for the chat template\n"
            "      --raw          send the prompt as is, without the chat template (control\n"
            "                     tokens written in it, such as <|im_start|>, are matched)\n"
            "  -n, --n-predict N  generate at most N tokens (default 256)\n"
            "      --temp T       temperature; 0 is greedy (default 0)\n"
            "      --top-k K      keep the K most likely tokens (default 40; 0 = off)\n"
            "      --top-p P      nucleus sampling (default 0.95; 1 = off)\n"
            "      --min-p P      drop tokens below P x the top probability (default 0.05)\n"
            "  -s, --seed N       sampling seed (default 0)\n"
            "      --stop STR     stop when STR is generated (not printed); repeatable\n"
            "  -c, --ctx N        context size in tokens (default: prompt + N, at most the\n"
            "                     model's training context)\n"
            "      --mode MODE    full: ordinary prefill of the whole prompt (the only mode\n"
            "                     in this build)\n"
            "      --kv-type T    KV cache elements: f16 (default) or f32\n"
            "      --stats FILE   write timing and token counts as one JSON object to FILE\n"
            "                     ('-' = stderr)\n"
            "\n"
            "Tokenizer:\n"
            "  --tokenize         print the token ids of exactly the input bytes (no BOS or\n"
            "                     EOS) as one line of space-separated integers\n"
            "  --detokenize       read space-separated token ids and print their text\n"
            "  --special          tokenize: match control tokens in the text; detokenize:\n"
            "                     print control tokens as their text\n"
            "\n"
            "Common:\n"
            "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model in\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/models/)\n"
            "  -t, --threads N    compute threads (default: every core)\n"
            "  -v, --verbose      print model facts and timings on stderr\n"
            "  -q, --quiet        print nothing but errors\n"
            "  -h, --help         this help\n"
            "      --version      print the version\n"
            "\n"
            "Exit status: 0 success, 64 usage error, 65 bad input data (malformed GGUF,\n"
            "unsupported model, unknown token id, prompt longer than the context),\n"
            "66 input missing, 70 internal error, 73 cannot create output, 74 I/O error.\n");
}

enum {
    OPT_TOKENIZE = 256,
    OPT_DETOKENIZE,
    OPT_SPECIAL,
    OPT_VERSION,
    OPT_SYSTEM,
    OPT_RAW,
    OPT_TEMP,
    OPT_TOPK,
    OPT_TOPP,
    OPT_MINP,
    OPT_STOP,
    OPT_MODE,
    OPT_STATS,
    OPT_KVTYPE
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Parse "12 7 99\n" into ids; a bad number is reported with its position. */
static int parse_ids(const char *text, size_t len, const char *name, int32_t n_vocab, cb_tokens *ids)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
            i++;
        if (i >= len)
            break;
        char *end;
        errno = 0;
        long long v = strtoll(text + i, &end, 10);
        size_t used = (size_t)(end - (text + i));
        if (used == 0 || errno != 0 ||
            (i + used < len && !(text[i + used] == ' ' || text[i + used] == '\t' || text[i + used] == '\n' ||
                                 text[i + used] == '\r'))) {
            cli_err("%s: byte %zu: not a token id: '%.20s'", name, i, text + i);
            return CLI_EX_DATAERR;
        }
        if (v < 0 || v >= n_vocab) {
            cli_err("%s: token id %lld is out of range (the vocabulary has %d tokens)", name, v, (int)n_vocab);
            return CLI_EX_DATAERR;
        }
        if (cb_tokens_push(ids, (int32_t)v) != CB_OK) {
            cli_err("out of memory");
            return CLI_EX_SOFTWARE;
        }
        i += used;
    }
    return 0;
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || v < lo || v > hi) {
        cli_err("%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------- tokenizer */

static int run_tokenizer(int mode, const char *model, const char *in_name, const char *input, size_t len,
                         int special)
{
    cb_gguf *g = NULL;
    cb_vocab *v = NULL;
    cb_tokens ids = {0};
    cb_error err;
    char *text = NULL;
    size_t tlen = 0;
    int code = 0;

    if (cb_gguf_open(&g, model, &err) != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(err.status);
    }
    if (cb_vocab_load(&v, g, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    cli_info("%s: %s tokenizer, pre-tokenizer %s, %d tokens", model,
             cb_vocab_kind_of(v) == CB_VOCAB_BPE ? "byte-level BPE" : "SentencePiece BPE", cb_vocab_pre(v),
             (int)cb_vocab_n_tokens(v));
    if (mode == OPT_TOKENIZE) {
        cb_status st = cb_tok_encode(v, input, len, special ? CB_TOK_PARSE_SPECIAL : 0, &ids);
        if (st != CB_OK) {
            cli_err("%s: tokenizing failed: %s", in_name, cb_strerror(st));
            code = cli_exit_code(st);
            goto done;
        }
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", (int)ids.ids[i]);
        putchar('\n');
    } else {
        if ((code = parse_ids(input, len, in_name, cb_vocab_n_tokens(v), &ids)) != 0)
            goto done;
        cb_status st = cb_tok_decode(v, ids.ids, ids.n, special ? CB_DETOK_UNPARSE_SPECIAL : 0, &text, &tlen);
        if (st != CB_OK) {
            cli_err("%s: detokenizing failed: %s", in_name, cb_strerror(st));
            code = cli_exit_code(st);
            goto done;
        }
        fwrite(text, 1, tlen, stdout);
    }
done:
    free(text);
    cb_tokens_free(&ids);
    cb_vocab_free(v);
    cb_gguf_free(g);
    return code;
}

/* ---------------------------------------------------------- generation */

typedef struct gen_opts {
    const char *model, *system, *stats_path, *in_name;
    int raw, n_predict, n_ctx, n_threads;
    cb_type kv_type;
    cb_sampler_params sp;
    const char **stops;
    int n_stops;
} gen_opts;

/* Streams text to stdout while holding back any tail that could still turn
 * into a stop string.  Returns 1 when a stop string completed. */
typedef struct streamer {
    char *buf;
    size_t len, cap;
    const char **stops;
    int n_stops;
} streamer;

static int stream_push(streamer *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t nc = (s->len + n + 1) * 2;
        char *nb = realloc(s->buf, nc);
        if (!nb)
            return -1;
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = 0;
    /* a completed stop string: print what precedes it and stop */
    size_t cut = s->len;
    int hit = 0;
    for (int i = 0; i < s->n_stops; i++) {
        const char *f = memmem(s->buf, s->len, s->stops[i], strlen(s->stops[i]));
        if (f && (size_t)(f - s->buf) < cut) {
            cut = (size_t)(f - s->buf);
            hit = 1;
        }
    }
    if (hit) {
        fwrite(s->buf, 1, cut, stdout);
        s->len = 0;
        return 1;
    }
    /* hold back the longest suffix that is a prefix of some stop string */
    size_t keep = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t k = sl - 1; k > keep; k--)
            if (k <= s->len && memcmp(s->buf + s->len - k, s->stops[i], k) == 0) {
                keep = k;
                break;
            }
    }
    fwrite(s->buf, 1, s->len - keep, stdout);
    fflush(stdout);
    memmove(s->buf, s->buf + s->len - keep, keep);
    s->len = keep;
    return 0;
}

static int write_stats(const gen_opts *o, const cb_model *m, json_t *obj)
{
    int code = 0;
    (void)m;
    if (strcmp(o->stats_path, "-") == 0) {
        if (json_dumpf(obj, stderr, JSON_COMPACT) != 0 || fputc('\n', stderr) == EOF)
            code = CLI_EX_IOERR;
    } else {
        char *s = json_dumps(obj, JSON_COMPACT);
        size_t n = s ? strlen(s) : 0;
        cb_error err;
        if (!s)
            return CLI_EX_SOFTWARE;
        s = realloc(s, n + 2);
        s[n] = '\n';
        if (cb_file_write_atomic(o->stats_path, s, n + 1, &err) != CB_OK) {
            cli_err("%s", err.msg);
            code = cli_exit_code(err.status);
        }
        free(s);
    }
    return code;
}

/* Prompt tokens: BOS when the model adds one, then either the raw text
 * (control tokens matched) or the chat template's prefix (control tokens
 * matched), the user's text (never matched: user text cannot inject
 * control tokens) and the template's suffix. */
static cb_status build_prompt(const cb_model *m, const gen_opts *o, const char *text, size_t len, cb_tokens *ids,
                              cb_chat_kind *kind)
{
    const cb_vocab *v = cb_model_vocab(m);
    cb_status st;
    cb_chat_parts parts = {0};

    *kind = o->raw ? CB_CHAT_NONE : cb_chat_detect(cb_gguf_str(cb_model_gguf(m), "tokenizer.chat_template"));
    if (cb_vocab_add_bos(v) && cb_vocab_bos(v) >= 0 && (st = cb_tokens_push(ids, cb_vocab_bos(v))) != CB_OK)
        return st;
    if (*kind == CB_CHAT_NONE)
        return cb_tok_encode(v, text, len, CB_TOK_PARSE_SPECIAL, ids);
    if ((st = cb_chat_render(*kind, o->system, &parts)) != CB_OK)
        return st;
    if ((st = cb_tok_encode(v, parts.prefix, strlen(parts.prefix), CB_TOK_PARSE_SPECIAL, ids)) == CB_OK &&
        (st = cb_tok_encode(v, text, len, 0, ids)) == CB_OK)
        st = cb_tok_encode(v, parts.suffix, strlen(parts.suffix), CB_TOK_PARSE_SPECIAL, ids);
    cb_chat_parts_free(&parts);
    return st;
}

static int run_generate(const gen_opts *o, const char *text, size_t len)
{
    cb_model *m = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_sampler *smp = NULL;
    cb_tokens ids = {0};
    cb_error err;
    cb_model_params mp = {o->n_threads};
    streamer sm = {NULL, 0, 0, o->stops, o->n_stops};
    float *logits = NULL;
    char *piece = NULL;
    size_t piece_len = 0, piece_cap = 0;
    int code = 0;
    cb_status st;
    cb_chat_kind kind;
    double t_load0 = now_ms(), t_load, t0, t_first = 0, t_prefill, t_gen0, t_end;
    int n_gen = 0;
    const char *stop_reason = "length";

    if ((st = cb_model_load(&m, o->model, &mp, &err)) != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(st);
    }
    t_load = now_ms() - t_load0;
    const cb_hparams *hp = cb_model_hparams(m);
    const cb_vocab *v = cb_model_vocab(m);
    if ((st = build_prompt(m, o, text, len, &ids, &kind)) != CB_OK) {
        cli_err("%s: cannot build the prompt: %s", o->in_name, cb_strerror(st));
        code = cli_exit_code(st);
        goto done;
    }
    if (ids.n == 0) {
        cli_err("%s: the prompt is empty", o->in_name);
        code = CLI_EX_DATAERR;
        goto done;
    }
    int64_t n_ctx = o->n_ctx > 0 ? o->n_ctx : (int64_t)ids.n + o->n_predict;
    if (o->n_ctx <= 0 && n_ctx > hp->n_ctx_train)
        n_ctx = hp->n_ctx_train > (int64_t)ids.n ? hp->n_ctx_train : (int64_t)ids.n + 1;
    if ((int64_t)ids.n >= n_ctx) {
        cli_err("%s: the prompt has %zu tokens; the context holds %lld (-c)", o->in_name, ids.n, (long long)n_ctx);
        code = CLI_EX_DATAERR;
        goto done;
    }
    cli_info("%s: %s, %d layers, %d tokens of vocabulary, backend %s, %d threads, loaded in %.0f ms", o->model,
             hp->arch, hp->n_layer, hp->n_vocab, cb_model_backend(m), o->n_threads, t_load);
    cli_info("chat template: %s; prompt: %zu tokens; context: %lld", cb_chat_name(kind), ids.n, (long long)n_ctx);
    logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    smp = cb_sampler_new(&o->sp);
    if (!logits || !smp || cb_kvcache_new(&kv, m, (int32_t)n_ctx, o->kv_type) != CB_OK ||
        cb_fwd_new(&f, m, ids.n < 512 ? (int32_t)ids.n : 512) != CB_OK) {
        cli_err("out of memory (context %lld)", (long long)n_ctx);
        code = CLI_EX_SOFTWARE;
        goto done;
    }

    t0 = now_ms();
    if ((st = cb_model_eval(f, kv, ids.ids, (int32_t)ids.n, 0, logits)) != CB_OK) {
        cli_err("prefill failed: %s", cb_strerror(st));
        code = cli_exit_code(st);
        goto done;
    }
    t_prefill = now_ms() - t0;
    t_gen0 = now_ms();
    int32_t pos = (int32_t)ids.n;
    for (;;) {
        int32_t tok = cb_sampler_sample(smp, logits, hp->n_vocab);
        if (n_gen == 0)
            t_first = now_ms() - t0;
        if (cb_vocab_is_eog(v, tok)) {
            stop_reason = "eog";
            break;
        }
        n_gen++;
        piece_len = 0;
        if (cb_tok_piece(v, tok, 0, &piece, &piece_len, &piece_cap) != CB_OK) {
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        int r = stream_push(&sm, piece, piece_len);
        if (r < 0) {
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        if (r > 0) {
            stop_reason = "stop";
            break;
        }
        if (n_gen >= o->n_predict)
            break;
        if (pos >= n_ctx) {
            stop_reason = "context";
            break;
        }
        if ((st = cb_model_eval(f, kv, &tok, 1, pos++, logits)) != CB_OK) {
            cli_err("decoding failed: %s", cb_strerror(st));
            code = cli_exit_code(st);
            goto done;
        }
    }
    fwrite(sm.buf, 1, sm.len, stdout); /* a held-back tail that never became a stop string */
    if (isatty(1))
        putchar('\n');
    t_end = now_ms();
    double gen_ms = t_end - t_gen0;
    cli_info("prefill %zu tokens in %.1f ms (%.1f tokens/s); %d tokens generated in %.1f ms (%.1f tokens/s); stop: %s",
             ids.n, t_prefill, ids.n / (t_prefill / 1e3), n_gen, gen_ms, n_gen ? n_gen / (gen_ms / 1e3) : 0.0,
             stop_reason);
    if (o->stats_path) {
        json_t *s = json_pack("{s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:f, s:s, s:s, s:i, s:f, s:s}",
                              "mode", "full", "n_prompt_tokens", (json_int_t)ids.n, "n_cached_tokens", (json_int_t)0,
                              "n_recomputed_tokens", (json_int_t)0, "ratio", 1.0, "ttft_ms", t_first,
                              "prefill_ms", t_prefill, "load_ms", 0.0, "n_gen_tokens", (json_int_t)n_gen, "gen_ms",
                              gen_ms, "prefill_tok_s", ids.n / (t_prefill / 1e3), "gen_tok_s",
                              n_gen ? n_gen / (gen_ms / 1e3) : 0.0, "stop", stop_reason, "backend",
                              cb_model_backend(m), "threads", o->n_threads, "model_load_ms", t_load, "chat_template",
                              cb_chat_name(kind));
        if (!s)
            code = CLI_EX_SOFTWARE;
        else
            code = write_stats(o, m, s);
        json_decref(s);
    }
done:
    free(piece);
    free(sm.buf);
    free(logits);
    cb_sampler_free(smp);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_tokens_free(&ids);
    cb_model_free(m);
    return code;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokenize", no_argument, 0, OPT_TOKENIZE},
        {"detokenize", no_argument, 0, OPT_DETOKENIZE},
        {"special", no_argument, 0, OPT_SPECIAL},
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"model", required_argument, 0, 'm'},
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
        {"threads", required_argument, 0, 't'},
        {"verbose", no_argument, 0, 'v'},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, OPT_VERSION},
        {0, 0, 0, 0},
    };
    const char *model_opt = NULL, *prompt = NULL, *file = NULL;
    int mode = 0, special = 0, c, code = 0;
    gen_opts o = {0};
    double d;
    char *input = NULL;
    size_t len = 0;

    cli_prog = "cb-run";
    o.n_predict = 256;
    o.kv_type = CB_TYPE_F16;
    o.sp = cb_sampler_defaults();
    o.sp.temp = 0.0f;
    o.stops = calloc((size_t)argc, sizeof *o.stops);
    if (!o.stops)
        return CLI_EX_SOFTWARE;
    while ((c = getopt_long(argc, argv, "p:f:m:n:s:c:t:vqh", opts, NULL)) != -1) {
        switch (c) {
        case OPT_TOKENIZE:
        case OPT_DETOKENIZE:
            if (mode && mode != c) {
                cli_err("--tokenize and --detokenize exclude each other");
                return CLI_EX_USAGE;
            }
            mode = c;
            break;
        case OPT_SPECIAL: special = 1; break;
        case 'p': prompt = optarg; break;
        case 'f': file = optarg; break;
        case 'm': model_opt = optarg; break;
        case OPT_SYSTEM: o.system = optarg; break;
        case OPT_RAW: o.raw = 1; break;
        case 'n':
            if (parse_num("-n", optarg, 0, 1e9, &d))
                return CLI_EX_USAGE;
            o.n_predict = (int)d;
            break;
        case OPT_TEMP:
            if (parse_num("--temp", optarg, 0, 100, &d))
                return CLI_EX_USAGE;
            o.sp.temp = (float)d;
            break;
        case OPT_TOPK:
            if (parse_num("--top-k", optarg, 0, 1e9, &d))
                return CLI_EX_USAGE;
            o.sp.top_k = (int32_t)d;
            break;
        case OPT_TOPP:
            if (parse_num("--top-p", optarg, 0, 1, &d))
                return CLI_EX_USAGE;
            o.sp.top_p = (float)d;
            break;
        case OPT_MINP:
            if (parse_num("--min-p", optarg, 0, 1, &d))
                return CLI_EX_USAGE;
            o.sp.min_p = (float)d;
            break;
        case 's':
            if (parse_num("--seed", optarg, 0, 1.8e19, &d))
                return CLI_EX_USAGE;
            o.sp.seed = (uint64_t)d;
            break;
        case OPT_STOP:
            if (!*optarg) {
                cli_err("--stop: empty string");
                return CLI_EX_USAGE;
            }
            o.stops[o.n_stops++] = optarg;
            break;
        case 'c':
            if (parse_num("-c", optarg, 1, 1 << 24, &d))
                return CLI_EX_USAGE;
            o.n_ctx = (int)d;
            break;
        case OPT_MODE:
            if (strcmp(optarg, "full") != 0) {
                cli_err("--mode %s: this build has only 'full'", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case OPT_KVTYPE:
            if (strcmp(optarg, "f16") == 0)
                o.kv_type = CB_TYPE_F16;
            else if (strcmp(optarg, "f32") == 0)
                o.kv_type = CB_TYPE_F32;
            else {
                cli_err("--kv-type %s: use f16 or f32", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case OPT_STATS: o.stats_path = optarg; break;
        case 't':
            if (parse_num("-t", optarg, 1, 1024, &d))
                return CLI_EX_USAGE;
            o.n_threads = (int)d;
            break;
        case 'v': cli_verbosity = 2; break;
        case 'q': cli_verbosity = 0; break;
        case 'h': usage(stdout); return cli_finish(0);
        case OPT_VERSION: cli_version(); return cli_finish(0);
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("unexpected argument '%s' (the prompt goes after -p)", argv[optind]);
        return CLI_EX_USAGE;
    }
    if (prompt && file) {
        cli_err("-p and -f exclude each other");
        return CLI_EX_USAGE;
    }
    o.model = cli_model_path(model_opt);
    if (prompt) {
        input = strdup(prompt);
        len = strlen(prompt);
        if (!input) {
            cli_err("out of memory");
            return CLI_EX_SOFTWARE;
        }
    } else if (!(input = cli_read_input(file, &len, &code))) {
        return code;
    }
    o.in_name = prompt ? "-p" : file && strcmp(file, "-") != 0 ? file : "(stdin)";
    if (access(o.model, R_OK) != 0 && !model_opt && !getenv("CB_MODEL"))
        cli_err("note: the default model is fetched with 'make model'; or give -m PATH");
    if (mode)
        code = run_tokenizer(mode, o.model, o.in_name, input, len, special);
    else {
        if (o.n_threads <= 0) {
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            o.n_threads = n > 0 ? (int)n : 1;
        }
        code = run_generate(&o, input, len);
    }
    free(input);
    free(o.stops);
    return cli_finish(code);
}
