/* cb-run - answer a prompt: full prefill, or blend the chunks' cached KV
 * with selective recompute (prompt, caches and generation are libcbcore's:
 * cb_prompt_*, cb_blend_prefill, cb_generate).  Here: the options, the
 * help and main; one answer is run-answer.c's, --batch run-batch.c's.
 *
 *   cb-run [-m MODEL] [-p TEXT | -f FILE | stdin] [--chunks FILE] [--mode M] ...
 *   cb-run --tokenize | --detokenize ...  (tokenizer modes: cli_tokenize) */
#include "run.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fputs("usage: cb-run [options] [-p TEXT | -f FILE]  answer a prompt (default: stdin)\n"
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
          "      --chunks FILE  chunk records (\"text\") put before the question ('-':\n"
          "                     stdin); a record's \"kv\" is the cache tried first\n"
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
