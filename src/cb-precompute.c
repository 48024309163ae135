/* cb-precompute - prefill each chunk alone and store its KV file.
 *
 *   cb-chunk docs/ | cb-precompute --store STORE > chunks.jsonl
 *
 * Reads chunk records (JSON Lines with a "text" field), writes each record
 * back with "kv" (the store key) and "cached" (true when the store already
 * had it) added; every other field is passed through byte for byte. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) { interrupted = sig; }

static void usage(FILE *f)
{
    fprintf(f, "usage: cb-precompute [options] [FILE|-]\n"
               "\n"
               "Prefill every chunk record's text alone (after the model's lead-in) and write\n"
               "its KV file into the store; chunks already stored are skipped. Each input\n"
               "record is written to stdout with \"kv\" (the store key) and \"cached\" added.\n"
               "The head of a cb-run prompt without --system (the template's system turn) is\n"
               "stored too, once, for cb-run to load instead of computing it.\n"
               "\n"
               "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model)\n"
               "      --store DIR    the store (default: $CB_STORE, else\n"
               "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/store); created if\n"
               "                     absent\n"
               "      --kv-type T    element type of the KV files: f16 (default), f32, bf16,\n"
               "                     q8_0 (8-bit, about half the size of f16), kivi4 (4-bit\n"
               "                     keys per channel and values per token, under a third), or\n"
               "                     coded (entropy coded levels, about a quarter)\n"
               "      --place WHERE  the tier new entries go to: a tier's name, or auto: the\n"
               "                     cheapest tier whose load time does not exceed the recompute\n"
               "                     time (cb-store place, from the store's profile); default:\n"
               "                     the fastest tier with room\n"
               "      --context      also store each chunk computed after the chunk before it in\n"
               "                     its document (the record before it with the same \"doc\" and\n"
               "                     \"seq\" one less, as cb-chunk writes them): cb-run uses that\n"
               "                     cache where the two chunks come in that order, and blends\n"
               "                     closer to full prefill; about twice the precompute work and\n"
               "                     the store space\n"
               "      --middle       also store each chunk computed after a fixed passage, as\n"
               "                     it stands in the middle of a prompt: cb-run takes that\n"
               "                     cache for every chunk but a prompt's first (which keeps\n"
               "                     its own, exact there), and blends closer to full prefill;\n"
               "                     about 2.6 times the precompute time for chunks of ~110\n"
               "                     tokens (less for longer ones), twice the store space\n"
               "      --neighbours K also store each chunk computed after its K most similar\n"
               "                     chunks of the input (by BM25 over their tokens, the most\n"
               "                     similar nearest), and write that cache's key as the\n"
               "                     record's \"kv\", which cb-run --chunks tries first: a cache\n"
               "                     computed inside a context blends closer to full prefill\n"
               "                     (reads the whole input first; about K+2 times the\n"
               "                     precompute work, twice the store space)\n"
               "      --system TEXT  also store the head of cb-run prompts with --system TEXT\n"
               "                     (repeat for several), for cb-run to load; without it a run\n"
               "                     computes that head, and stores it unless it may not write\n"
               "                     (--no-store-write, a read-only store). The chunks are the\n"
               "                     same either way, computed after the model's lead-in (unless\n"
               "                     --for-system)\n"
               "      --for-system TEXT\n"
               "                     compute the chunks after the head of cb-run prompts with\n"
               "                     --system TEXT instead (and store that head): such prompts\n"
               "                     take these caches first, their first chunk then exact as\n"
               "                     with the default head; other prompts do not find them (run\n"
               "                     cb-precompute without it too for both)\n"
               "      --strict       stop at the first bad record (default: report and skip it)\n"
               "  -t, --threads N    compute threads (default: every core)\n" CLI_DEVICE_HELP
               "  -v, --verbose      report every chunk on stderr\n"
               "  -q, --quiet        print nothing but errors\n"
               "  -h, --help         this help\n"
               "      --version      print the version\n"
               "\n"
               "A progress line (chunks/s, tokens/s, ETA) goes to stderr when it is a terminal.\n"
               "\n"
               "Exit status: 0 success, 64 usage error, 65 bad input data (with --strict, or a\n"
               "malformed model), 66 input missing, 69 compute device not available or\n"
               "failed (a device fault), 70 internal error, 73 cannot create output, 74 I/O\n"
               "error, 130 interrupted (the chunk in progress is not stored).\n");
}

enum {
    OPT_KVTYPE = 256,
    OPT_STRICT,
    OPT_PLACE,
    OPT_CONTEXT,
    OPT_SYSTEM,
    OPT_FOR_SYSTEM,
    OPT_NEIGHBOURS,
    OPT_MIDDLE
};
#define MAX_NEIGHBOURS 16

/* Write `line` (one JSON object, no newline) with kv and cached added.
 * Keeps the original bytes when the object has neither field yet. */
static int emit(const char *line, size_t len, json_t *obj, const char *key, int cached)
{
    if (!json_object_get(obj, "kv") && !json_object_get(obj, "cached")) {
        size_t end = len;
        while (end > 0 && (line[end - 1] == ' ' || line[end - 1] == '\t' || line[end - 1] == '\r'))
            end--;
        /* end-1 is the closing brace of an object jansson accepted */
        fwrite(line, 1, end - 1, stdout);
        printf("%s\"kv\":\"%s\",\"cached\":%s}\n", json_object_size(obj) ? "," : "", key,
               cached ? "true" : "false");
    } else {
        json_object_set_new(obj, "kv", json_string(key));
        json_object_set_new(obj, "cached", json_boolean(cached));
        if (json_dumpf(obj, stdout, JSON_COMPACT) != 0)
            return -1;
        putchar('\n');
    }
    return ferror(stdout) ? -1 : 0;
}

/* The run: options, what it opened, and counts. */
typedef struct pre {
    cli_common co;
    const char *place, *store_dir, *in_name;
    const char **systems; /* --system, in order */
    int n_systems;
    const char *for_system; /* --for-system: the chunks' lead-in is that prompt's head */
    int strict, from_stdin, progress, context, neighbours, middle;
    cb_type kv_type;
    FILE *in;
    cb_model *m;
    cb_store *store;
    cb_precomputer *pc;
    cb_tokens ids;
    cb_tokens prev;      /* --context: the last record's tokens, */
    json_t *prev_doc;    /* its "doc" (NULL: none) */
    json_int_t prev_seq; /* and "seq" */
    long lineno, n_total, n_done, n_new, n_cached, n_bad, n_after, n_fused, n_middle;
    double tok_done, t0, t_last;
} pre;

static int parse_args(int argc, char **argv, pre *x)
{
    static const struct option opts[] = {
        {"kv-type", required_argument, 0, OPT_KVTYPE},
        {"strict", no_argument, 0, OPT_STRICT},
        {"place", required_argument, 0, OPT_PLACE},
        {"context", no_argument, 0, OPT_CONTEXT},
        {"neighbours", required_argument, 0, OPT_NEIGHBOURS},
        {"middle", no_argument, 0, OPT_MIDDLE},
        {"system", required_argument, 0, OPT_SYSTEM},
        {"for-system", required_argument, 0, OPT_FOR_SYSTEM},
        CLI_COMMON_OPTS,
        CLI_STORE_OPT,
        CLI_DEVICE_OPT,
        CLI_ACT8_OPT,
        {0, 0, 0, 0},
    };
    int c, r;
    while ((c = cli_getopt(argc, argv, CLI_COMMON_SHORT, opts)) != -1) {
        if ((r = cli_common_opt(&x->co, c, optarg, usage)) != CLI_NOT_COMMON) {
            if (r != CLI_CONTINUE)
                return r;
        } else if (c == OPT_KVTYPE) {
            if (cb_kv_type_parse(optarg, &x->kv_type) != CB_OK) {
                cli_err("--kv-type %s: use f16, f32, bf16, q8_0, kivi4 or coded", optarg);
                return CLI_EX_USAGE;
            }
        } else if (c == OPT_STRICT) {
            x->strict = 1;
        } else if (c == OPT_PLACE) {
            x->place = optarg;
        } else if (c == OPT_CONTEXT) {
            x->context = 1;
        } else if (c == OPT_MIDDLE) {
            x->middle = 1;
        } else if (c == OPT_NEIGHBOURS) {
            char *end;
            long k = strtol(optarg, &end, 10);
            if (end == optarg || *end || k < 1 || k > MAX_NEIGHBOURS) {
                cli_err("--neighbours: '%s' is not a number of chunks from 1 to %d", optarg,
                        MAX_NEIGHBOURS);
                return CLI_EX_USAGE;
            }
            x->neighbours = (int)k;
        } else if (c == OPT_SYSTEM) {
            const char **ns = realloc(x->systems, sizeof *ns * (size_t)(x->n_systems + 1));
            if (!ns) {
                cli_err("out of memory");
                return CLI_EX_SOFTWARE;
            }
            x->systems = ns;
            x->systems[x->n_systems++] = optarg;
        } else if (c == OPT_FOR_SYSTEM) {
            if (x->for_system) {
                cli_err("--for-system: once only (a chunk is computed after one head)");
                return CLI_EX_USAGE;
            }
            x->for_system = optarg;
        } else {
            usage(stderr);
            return CLI_EX_USAGE;
        }
    }
    if (argc - optind > 1) {
        cli_err("one input at most (a file or -)");
        return CLI_EX_USAGE;
    }
    return -1;
}

/* --place: a tier's name, or auto: where the store's profile says. */
static void choose_tier(pre *x, char *tier, size_t n)
{
    cb_profile *prof;
    cb_error err;
    cb_store_tier ti;
    double load = -1, rec = -1;
    int t = -1;

    tier[0] = 0;
    if (!x->place)
        return;
    if (strcmp(x->place, "auto") != 0) {
        snprintf(tier, n, "%s", x->place);
        return;
    }
    prof = calloc(1, sizeof *prof);
    if (prof && cb_store_profile_load(x->store, cb_model_fingerprint(x->m), cb_model_backend(x->m),
                                      prof, &err) == CB_OK)
        t = cb_store_place(x->store, prof, 0.15, 3072, x->kv_type, &load, &rec);
    free(prof);
    if (t >= 0 && cb_store_tier_info(x->store, t, &ti) == CB_OK) {
        snprintf(tier, n, "%s", ti.name);
        cli_info(
            "--place auto: tier %s (load %.1f ms <= recompute %.1f ms for 3072 tokens at 0.15)",
            ti.name, load, rec);
    } else {
        cli_err(
            "note: --place auto: no usable profile in %s (run cb-profile); using the fastest tier",
            x->store_dir);
    }
}

static void store_warn(void *ctx, const char *msg)
{
    (void)ctx;
    cli_err("warning: %s", msg);
}

/* The model, the store and the precomputer. */
static int setup(pre *x, const char *model_path)
{
    cb_model_params mp = cli_model_params(x->co.n_threads, x->co.device);
    cb_error err;
    char tier[64];

    if (cb_model_load(&x->m, model_path, &mp, &err) != CB_OK ||
        cli_store_open(&x->store, x->store_dir, 1, &err) != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(err.status);
    }
    cb_store_set_warn(x->store, store_warn, NULL);
    choose_tier(x, tier, sizeof tier);
    if (cb_precomputer_new(&x->pc, x->m, x->store, x->kv_type, tier[0] ? tier : NULL, &err) !=
        CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(err.status);
    }
    if (x->for_system && cb_precomputer_system(x->pc, x->for_system, &err) != CB_OK) {
        cli_err("--for-system: %s", err.msg);
        return cli_exit_code(err.status);
    }
    cli_info("model %s, lead-in %zu tokens%s, store %s, KV type %s", model_path,
             cb_precomputer_lead(x->pc)->n, x->for_system ? " (the --for-system head)" : "",
             x->store_dir, cb_type_name(x->kv_type));
    for (int i = 0; i < x->n_systems; i++) {
        char what[64]; /* how the lines below name it: cut at 40 bytes */
        size_t n;
        snprintf(what, sizeof what, "--system \"%.40s%s\"", x->systems[i],
                 strlen(x->systems[i]) > 40 ? "..." : "");
        if (cb_precomputer_head(x->pc, x->systems[i], &n, &err) != CB_OK) {
            cli_err("%s: %s", what, err.msg);
            return cli_exit_code(err.status);
        }
        if (n == 0 && cli_verbosity > 0)
            cli_err("warning: %s: the prompt's head is too short to be worth an entry (no chat "
                    "template, or no system turn in it); not stored",
                    what);
        else if (n > 0)
            cli_info("the head of prompts with %s (%zu tokens) is in the store", what, n);
    }
    return 0;
}

/* A bad record: reported, and fatal with --strict. */
static int bad_record(pre *x, json_t *obj, const char *what)
{
    cli_err("%s:%ld: %s", x->in_name, x->lineno, what);
    json_decref(obj);
    x->n_bad++;
    return x->strict ? CLI_EX_DATAERR : 0;
}

static void show_progress(pre *x)
{
    double now = cb_now_ms() / 1e3;
    if (!x->progress || now - x->t_last <= 0.25)
        return;
    double el = now - x->t0, rate = x->n_done / (el > 0 ? el : 1);
    fprintf(stderr, "\rcb-precompute: %ld", x->n_done);
    if (x->n_total > 0)
        fprintf(stderr, "/%ld", x->n_total);
    fprintf(stderr, " chunks (%ld new, %ld cached), %.1f chunks/s, %.0f tokens/s", x->n_new,
            x->n_cached, rate, x->tok_done / (el > 0 ? el : 1));
    if (x->n_total > 0 && rate > 0)
        fprintf(stderr, ", ETA %.0f s", (double)(x->n_total - x->n_done) / rate);
    fprintf(stderr, "   ");
    x->t_last = now;
}

/* The chunk in x->ids under key: computed (after the precomputer's lead-in:
 * with cb_precomputer_after, n_prev tokens more) and stored unless the
 * store has it (*found).  0 to go on, -1 when interrupted, else an exit
 * status. */
static int ensure(pre *x, const char *key, int32_t n_prev, int *found)
{
    cb_error err;
    cb_status st;
    *found = 0;
    if (cb_store_lookup(x->store, key, found) != CB_OK) {
        cli_err("%s: index lookup failed", x->store_dir);
        return CLI_EX_IOERR;
    }
    if (*found)
        return 0;
    st = cb_precomputer_run(x->pc, x->ids.ids, (int32_t)x->ids.n, &err);
    if (interrupted)
        return -1;
    if (st == CB_OK) {
        st = cb_precomputer_store(x->pc, key, &err);
    } else { /* the message with its line (a copy: vsnprintf's source must not overlap) */
        char why[CB_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err.msg);
        cb_error_set(&err, st, "%s:%ld: %s", x->in_name, x->lineno, why);
    }
    if (st != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(st);
    }
    x->tok_done += (double)(n_prev + (int64_t)x->ids.n);
    return 0;
}

/* The chunk in x->ids after the lead-in as cb_precomputer_after (or
 * _middle) extended it by n_before tokens, unless that does not fit the
 * context with it (then the chunk's own cache only): counted in *n,
 * reported as `what`; the lead-in alone again after.  0 to go on, -1 when
 * interrupted, else an exit status. */
static int ensure_extended(pre *x, int32_t n_before, long *n, const char *what)
{
    int32_t n_ctx = cb_model_hparams(x->m)->n_ctx_train;
    int found = 0, r = 0;
    if ((int64_t)cb_precomputer_lead(x->pc)->n + (int64_t)x->ids.n <= n_ctx) {
        char key[66];
        cb_precomputer_key(x->pc, x->ids.ids, (int32_t)x->ids.n, key);
        if ((r = ensure(x, key, n_before, &found)) == 0) {
            (*n)++;
            cli_info("%s:%ld: %s, %s %s", x->in_name, x->lineno, what, found ? "cached" : "stored",
                     key);
        }
    }
    cb_precomputer_after(x->pc, NULL, 0); /* the lead-in alone again */
    return r;
}

/* --context: the record's chunk after the previous record's, when that is
 * the chunk before it in the same document; then this record becomes the
 * previous one.  0 to go on, -1 when interrupted, else an exit status. */
static int ensure_after(pre *x, json_t *obj)
{
    json_t *doc = json_object_get(obj, "doc"), *seq = json_object_get(obj, "seq");
    int r;
    if (doc && json_is_integer(seq) && x->prev_doc && json_equal(doc, x->prev_doc) &&
        json_integer_value(seq) == x->prev_seq + 1) {
        if (cb_precomputer_after(x->pc, &x->prev, 1) != CB_OK) {
            cli_err("out of memory");
            return CLI_EX_SOFTWARE;
        }
        if ((r = ensure_extended(x, (int32_t)x->prev.n, &x->n_after,
                                 "after the chunk before it")) != 0)
            return r;
    }
    json_decref(x->prev_doc);
    x->prev_doc = NULL;
    x->prev.n = 0;
    if (doc && json_is_integer(seq)) {
        for (size_t i = 0; i < x->ids.n; i++)
            if (cb_tokens_push(&x->prev, x->ids.ids[i]) != CB_OK) {
                cli_err("out of memory");
                return CLI_EX_SOFTWARE;
            }
        x->prev_doc = json_incref(doc);
        x->prev_seq = json_integer_value(seq);
    }
    return 0;
}

/* --middle: the record's chunk also after the fixed passage cb-run looks
 * for it after where it is not a prompt's first chunk.  0 to go on, -1
 * when interrupted, else an exit status. */
static int ensure_middle(pre *x)
{
    int64_t n_lead = (int64_t)cb_precomputer_lead(x->pc)->n; /* the lead-in alone */
    if (cb_precomputer_middle(x->pc) != CB_OK) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    return ensure_extended(x, (int32_t)((int64_t)cb_precomputer_lead(x->pc)->n - n_lead),
                           &x->n_middle, "after the middle passage");
}

/* --neighbours: the record's chunk (x->ids) also after its neighbours
 * nb[0..k) (best first, -1 past the last), the farthest left out while
 * they do not fit the context with it; *key becomes that cache's key and
 * *found whether the store had it.  0 to go on, -1 when interrupted, else
 * an exit status. */
static int ensure_fused(pre *x, const cb_tokens *toks, const long *linenos, const int32_t *nb,
                        int k, char key[66], int *found)
{
    int32_t n_ctx = cb_model_hparams(x->m)->n_ctx_train;
    int64_t n_lead = (int64_t)cb_precomputer_lead(x->pc)->n; /* the lead-in alone */
    cb_tokens prev[MAX_NEIGHBOURS];
    int n = 0, r = 0;
    while (n < k && nb[n] >= 0)
        n++;
    for (; n > 0; n--) { /* the most similar last: nearest the chunk */
        for (int i = 0; i < n; i++)
            prev[i] = toks[nb[n - 1 - i]];
        if (cb_precomputer_after(x->pc, prev, n) != CB_OK) {
            cli_err("out of memory");
            return CLI_EX_SOFTWARE;
        }
        if ((int64_t)cb_precomputer_lead(x->pc)->n + (int64_t)x->ids.n <= n_ctx)
            break;
    }
    if (n > 0) {
        cb_precomputer_key(x->pc, x->ids.ids, (int32_t)x->ids.n, key);
        if ((r = ensure(x, key, (int32_t)((int64_t)cb_precomputer_lead(x->pc)->n - n_lead),
                        found)) == 0) {
            char lines[16 * MAX_NEIGHBOURS] = "";
            size_t at = 0;
            for (int i = n - 1; i >= 0 && at < sizeof lines; i--)
                at += (size_t)snprintf(lines + at, sizeof lines - at, "%s%ld", at ? ", " : "",
                                       linenos[nb[i]]);
            x->n_fused++;
            cli_info("%s:%ld: after line%s %s (the nearest last), %s %s", x->in_name, x->lineno,
                     n > 1 ? "s" : "", lines, *found ? "cached" : "stored", key);
        }
    }
    cb_precomputer_after(x->pc, NULL, 0); /* the lead-in alone again */
    return r;
}

/* Parse one input line into *obj and its tokens into x->ids: 0, or
 * (reported) 1 for a bad record to skip, else an exit status. */
static int parse_record(pre *x, const char *line, size_t len, json_t **obj)
{
    const cb_tokens *lead = cb_precomputer_lead(x->pc);
    int32_t n_ctx = cb_model_hparams(x->m)->n_ctx_train;
    json_error_t jerr;
    json_t *text;
    int r;

    *obj = json_loadb(line, len, 0, &jerr);
    text = *obj ? json_object_get(*obj, "text") : NULL;
    if (!*obj || !json_is_object(*obj) || !json_is_string(text))
        r = bad_record(x, *obj,
                       !*obj                   ? jerr.text
                       : !json_is_object(*obj) ? "not a JSON object"
                                               : "no \"text\" string");
    else {
        x->ids.n = 0;
        cb_tok_encode(cb_model_vocab(x->m), json_string_value(text), json_string_length(text), 0,
                      &x->ids);
        if (x->ids.n > 0 && (int64_t)lead->n + (int64_t)x->ids.n <= n_ctx)
            return 0;
        r = bad_record(x, *obj,
                       x->ids.n == 0 ? "empty text" : "chunk longer than the model's context");
    }
    *obj = NULL;
    return r ? r : 1;
}

/* A parsed record (obj, its tokens in x->ids; obj's reference taken):
 * its caches, and the record written.  With --neighbours, toks are every
 * record's tokens and nb this one's neighbours among them.  0 to go on,
 * -1 when interrupted, else an exit status. */
static int do_parsed(pre *x, const char *line, size_t len, json_t *obj, const cb_tokens *toks,
                     const long *linenos, const int32_t *nb)
{
    char key[66], fkey[66];
    int found = 0, ffound = 0, r;

    cb_precomputer_key(x->pc, x->ids.ids, (int32_t)x->ids.n, key);
    fkey[0] = 0;
    if ((r = ensure(x, key, 0, &found)) != 0 || (x->context && (r = ensure_after(x, obj))) ||
        (x->middle && (r = ensure_middle(x))) ||
        (nb && (r = ensure_fused(x, toks, linenos, nb, x->neighbours, fkey, &ffound)))) {
        json_decref(obj);
        return r;
    }
    if (found)
        x->n_cached++;
    else
        x->n_new++;
    x->n_done++;
    cli_info("%s:%ld: %zu tokens, %s %s", x->in_name, x->lineno, x->ids.n,
             found ? "cached" : "stored", key);
    /* the record's cache: the one after its neighbours, where it has some */
    r = fkey[0] ? emit(line, len, obj, fkey, ffound) : emit(line, len, obj, key, found);
    json_decref(obj);
    if (r != 0) {
        cli_err("error writing to standard output: %s", strerror(errno));
        return CLI_EX_IOERR;
    }
    show_progress(x);
    return 0;
}

/* One input line: 0 to go on, -1 when interrupted, else an exit status. */
static int do_record(pre *x, char *line, size_t len)
{
    json_t *obj;
    int r = parse_record(x, line, len, &obj);
    return r == 1 ? 0 : r != 0 ? r : do_parsed(x, line, len, obj, NULL, NULL, NULL);
}

/* The records kept for --neighbours: every line, where it was and its
 * parsed object (rec), and its tokens (toks, apart: cb_neighbours reads
 * them as one array; linenos too, for ensure_fused). */
typedef struct kept_rec {
    char *line;
    size_t len;
    json_t *obj;
} kept_rec;
typedef struct kept {
    kept_rec *rec;
    cb_tokens *toks;
    long *linenos;
    size_t n, cap;
} kept;

static void kept_free(kept *k)
{
    for (size_t i = 0; i < k->n; i++) {
        free(k->rec[i].line);
        json_decref(k->rec[i].obj);
        cb_tokens_free(&k->toks[i]);
    }
    free(k->rec);
    free(k->toks);
    free(k->linenos);
}

static int kept_add(kept *k, const char *line, size_t len, long lineno, json_t *obj,
                    const cb_tokens *ids)
{
    if (k->n == k->cap) {
        size_t nc = k->cap ? 2 * k->cap : 256;
        kept_rec *r = realloc(k->rec, sizeof *r * nc);
        k->rec = r ? r : k->rec;
        cb_tokens *t = realloc(k->toks, sizeof *t * nc);
        k->toks = t ? t : k->toks;
        long *ln = realloc(k->linenos, sizeof *ln * nc);
        k->linenos = ln ? ln : k->linenos;
        if (!r || !t || !ln)
            return -1;
        k->cap = nc;
    }
    cb_tokens t = {0};
    char *copy = malloc(len + 1);
    for (size_t i = 0; copy && i < ids->n; i++)
        if (cb_tokens_push(&t, ids->ids[i]) != CB_OK) {
            free(copy);
            copy = NULL;
        }
    if (!copy) {
        cb_tokens_free(&t);
        return -1;
    }
    memcpy(copy, line, len + 1);
    k->rec[k->n] = (kept_rec){copy, len, obj};
    k->toks[k->n] = t, k->linenos[k->n] = lineno;
    k->n++;
    return 0;
}

/* --neighbours: every record read and tokenized, the neighbours found,
 * then each record as do_record does it, and after its neighbours. */
static int run_neighbours(pre *x, char **line, size_t *cap)
{
    kept k = {0};
    int32_t *nb = NULL;
    ssize_t len;
    int code = 0;

    while (!interrupted && code == 0 && (len = getline(line, cap, x->in)) >= 0) {
        json_t *obj;
        x->lineno++;
        while (len > 0 && ((*line)[len - 1] == '\n' || (*line)[len - 1] == '\r'))
            (*line)[--len] = 0;
        if (len == 0 || (code = parse_record(x, *line, (size_t)len, &obj)) == 1) {
            code = 0;
            continue;
        }
        if (code == 0 && kept_add(&k, *line, (size_t)len, x->lineno, obj, &x->ids) != 0) {
            json_decref(obj);
            cli_err("out of memory");
            code = CLI_EX_SOFTWARE;
        }
    }
    if (code == 0 && !interrupted && k.n > 0) {
        nb = malloc(sizeof *nb * k.n * (size_t)x->neighbours);
        if (!nb || cb_neighbours(k.toks, k.n, x->neighbours, nb) != CB_OK) {
            cli_err("out of memory");
            code = CLI_EX_SOFTWARE;
        }
        cli_info("%zu chunks read; each also computed after its %d most similar", k.n,
                 x->neighbours);
    }
    x->n_total = (long)k.n;
    for (size_t i = 0; code == 0 && !interrupted && i < k.n; i++) {
        x->lineno = k.linenos[i];
        x->ids.n = 0;
        for (size_t j = 0; j < k.toks[i].n; j++)
            if (cb_tokens_push(&x->ids, k.toks[i].ids[j]) != CB_OK) {
                cli_err("out of memory");
                return kept_free(&k), free(nb), CLI_EX_SOFTWARE;
            }
        json_t *obj = k.rec[i].obj;
        k.rec[i].obj = NULL; /* do_parsed takes it */
        code = do_parsed(x, k.rec[i].line, k.rec[i].len, obj, k.toks, k.linenos,
                         nb + i * (size_t)x->neighbours);
    }
    kept_free(&k);
    free(nb);
    return code;
}

static int run(pre *x)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int code = 0;

    if (x->progress && !x->from_stdin && !x->neighbours) { /* a file: count its records, ETA */
        int ch;
        x->n_total = 0;
        while ((ch = getc(x->in)) != EOF)
            x->n_total += ch == '\n';
        rewind(x->in);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    if (x->neighbours)
        code = run_neighbours(x, &line, &cap);
    while (!x->neighbours && !interrupted && code == 0 &&
           (len = getline(&line, &cap, x->in)) >= 0) {
        x->lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len > 0)
            code = do_record(x, line, (size_t)len);
    }
    free(line);
    if (code > 0)
        return code;
    if (x->progress)
        fputc('\n', stderr);
    if (interrupted) {
        cli_err("interrupted by signal %d after %ld chunks; nothing partial was stored",
                (int)interrupted, x->n_done);
        return 130;
    }
    if (ferror(x->in)) {
        cli_err("%s: read error: %s", x->in_name, strerror(errno));
        return CLI_EX_IOERR;
    }
    double el = cb_now_ms() / 1e3 - x->t0;
    if (cli_verbosity > 0 && (cli_verbosity > 1 || x->n_bad))
        fprintf(
            stderr,
            "cb-precompute: %ld %s: %ld stored, %ld already cached, %ld bad %s; %.0f tokens/s\n",
            x->n_done, cli_plural((uint64_t)x->n_done, "chunk", "chunks"), x->n_new, x->n_cached,
            x->n_bad, cli_plural((uint64_t)x->n_bad, "record", "records"),
            x->tok_done / (el > 0 ? el : 1));
    /* what the store mended on the way (cb-store(5), SELF-HEALING) */
    cb_store_tier_stat ts[CB_STORE_MAX_TIERS + 1];
    cb_error err;
    uint64_t healed = 0, full = 0;
    if (cb_store_stat(x->store, ts, NULL, &err) == CB_OK)
        for (int i = 0; i < cb_store_n_tiers(x->store); i++)
            healed += ts[i].healed, full += ts[i].full;
    if (cb_store_shared_name(x->store)) {
        cb_store_shared_stat(x->store, &ts[0], &err); /* its count even when it is down */
        healed += ts[0].healed;
    }
    if (cli_verbosity > 0 && (healed || full))
        fprintf(stderr,
                "cb-precompute: %llu bad %s dropped and put again, %llu %s past a full tier\n",
                (unsigned long long)healed, cli_plural(healed, "entry", "entries"),
                (unsigned long long)full, cli_plural(full, "put", "puts"));
    if (x->context && cli_verbosity > 0 && (cli_verbosity > 1 || x->n_bad))
        fprintf(stderr, "cb-precompute: %ld %s also after the chunk before them\n", x->n_after,
                cli_plural((uint64_t)x->n_after, "chunk", "chunks"));
    if (x->middle && cli_verbosity > 0 && (cli_verbosity > 1 || x->n_bad))
        fprintf(stderr, "cb-precompute: %ld %s also after the middle passage\n", x->n_middle,
                cli_plural((uint64_t)x->n_middle, "chunk", "chunks"));
    if (x->neighbours && cli_verbosity > 0 && (cli_verbosity > 1 || x->n_bad))
        fprintf(stderr, "cb-precompute: %ld %s also after their neighbours\n", x->n_fused,
                cli_plural((uint64_t)x->n_fused, "chunk", "chunks"));
    return 0;
}

int main(int argc, char **argv)
{
    pre x = {.kv_type = CB_TYPE_F16, .n_total = -1};
    char store_buf[4096];
    int code;

    cli_prog = "cb-precompute";
    cli_trap_sigbus();
    if ((code = parse_args(argc, argv, &x)) >= 0)
        return code;
    const char *in_path = optind < argc ? argv[optind] : "-";
    x.store_dir = cli_store_dir(&x.co, store_buf, sizeof store_buf);
    x.from_stdin = strcmp(in_path, "-") == 0;
    x.in_name = x.from_stdin ? "(stdin)" : in_path;
    x.in = x.from_stdin ? stdin : fopen(in_path, "rb");
    if (!x.in) {
        cli_err("%s: %s", in_path, strerror(errno));
        return CLI_EX_NOINPUT;
    }
    x.t0 = cb_now_ms() / 1e3;
    x.progress = isatty(2) && cli_verbosity > 0;
    if ((code = setup(&x, cli_model_path(x.co.model))) == 0)
        code = run(&x);
    if (!x.from_stdin)
        fclose(x.in);
    free(x.systems);
    cb_tokens_free(&x.ids);
    cb_tokens_free(&x.prev);
    json_decref(x.prev_doc);
    cb_precomputer_free(x.pc);
    cb_store_close(x.store);
    cb_model_free(x.m);
    return cli_finish(code);
}
