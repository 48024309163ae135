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
#include <math.h>
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
            "\n"
            "Reusing cached chunks (see cb-precompute(1)):\n"
            "      --chunks FILE  chunk records (JSON Lines with \"text\"), placed in order between\n"
            "                     the system text and the question ('-' = stdin)\n"
            "      --store DIR    the store holding their KV files (default: $CB_STORE, else\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/store)\n"
            "      --mode MODE    blend (default with --chunks): reuse every chunk's cache and\n"
            "                     recompute the most deviating tokens; reuse: reuse caches,\n"
            "                     recompute nothing; prefix: reuse the leading chunk only when\n"
            "                     it is a true prefix; full: ordinary prefill (default without)\n"
            "      --ratio R|auto fraction of cached tokens recomputed (default 0.15); auto: the\n"
            "                     loading controller's choice from the store's profile (see\n"
            "                     cb-profile(1)): recompute as much as loading the KV hides\n"
            "      --min-ratio R  the least ratio auto picks (default 0.15)\n"
            "      --ratios LIST  gradual filtering: r1,r2,... at successive check layers\n"
            "      --check-layer N  the (first) layer where deviation is measured (default 1)\n"
            "      --deviation k|v  measure deviation on keys or values (default v)\n"
            "      --strategy S   hkvd (default): most deviating tokens; sink: also the first\n"
            "                     --sink-tokens N (default 4) of every chunk; query: the cached\n"
            "                     tokens the question attends to most\n"
            "      --verify       also run full prefill: add first-token KL divergence, top-1\n"
            "                     agreement and whether the greedy answers match to --stats\n"
            "      --no-store-write  do not store the KV of chunks that had none\n"
            "      --logits-out FILE  write the first generated token's logits (n_vocab\n"
            "                     little-endian float32) to FILE, for offline comparison\n"
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
            "      --device DEV   compute device: cpu, cuda or cuda:N (default: $CB_DEVICE,\n"
            "                     else CUDA device 0 when a GPU is present, else cpu)\n"
            "  -v, --verbose      print model facts and timings on stderr\n"
            "  -q, --quiet        print nothing but errors\n"
            "  -h, --help         this help\n"
            "      --version      print the version\n"
            "\n"
            "Exit status: 0 success, 64 usage error, 65 bad input data (malformed GGUF,\n"
            "unsupported model, unknown token id, prompt longer than the context),\n"
            "66 input missing, 69 compute device not available, 70 internal error,\n"
            "73 cannot create output, 74 I/O error.\n");
}

enum {
    OPT_DEVICE = 200,
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
    OPT_KVTYPE,
    OPT_STORE,
    OPT_CHUNKS,
    OPT_RATIO,
    OPT_RATIOS,
    OPT_CHECK,
    OPT_DEVIATION,
    OPT_STRATEGY,
    OPT_SINK,
    OPT_VERIFY,
    OPT_NOSTORE,
    OPT_MINRATIO,
    OPT_LOGITS
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
    const char *model, *system, *stats_path, *in_name, *store_dir, *chunks_path, *logits_out, *device;
    int raw, n_predict, n_ctx, n_threads, verify, store_write, ratio_auto;
    double min_ratio;
    cb_type kv_type;
    cb_sampler_params sp;
    cb_blend_params bp;
    int mode_given;
    const char **stops;
    int n_stops;
} gen_opts;

/* Streams text to stdout (or into a buffer) while holding back any tail
 * that could still turn into a stop string. */
typedef struct streamer {
    char *buf;
    size_t len, cap;
    const char **stops;
    int n_stops;
    FILE *out;          /* where the text goes, or NULL */
    int collect;        /* also keep everything in `all` */
    char *all;
    size_t all_len, all_cap;
} streamer;

static int sink_write(streamer *s, const char *p, size_t n)
{
    if (s->out) {
        fwrite(p, 1, n, s->out);
        fflush(s->out);
    }
    if (!s->collect)
        return 0;
    if (s->all_len + n + 1 > s->all_cap) {
        size_t nc = (s->all_len + n + 1) * 2;
        char *nb = realloc(s->all, nc);
        if (!nb)
            return -1;
        s->all = nb;
        s->all_cap = nc;
    }
    memcpy(s->all + s->all_len, p, n);
    s->all_len += n;
    s->all[s->all_len] = 0;
    return 0;
}

/* Returns 1 when a stop string completed, -1 on OOM. */
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
        s->len = 0;
        return sink_write(s, s->buf, cut) < 0 ? -1 : 1;
    }
    size_t keep = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t k = sl - 1; k > keep; k--)
            if (k <= s->len && memcmp(s->buf + s->len - k, s->stops[i], k) == 0) {
                keep = k;
                break;
            }
    }
    if (sink_write(s, s->buf, s->len - keep) < 0)
        return -1;
    memmove(s->buf, s->buf + s->len - keep, keep);
    s->len = keep;
    return 0;
}

static int stream_flush(streamer *s)
{
    int r = sink_write(s, s->buf, s->len);
    s->len = 0;
    return r;
}

/* Generate from logits of the prompt's last position (pos = prompt length).
 * Returns the number of tokens generated, or -1 with *st set. */
typedef struct gen_result {
    int n_gen;
    double first_ms;   /* from t0 to the first sampled token */
    const char *stop;
} gen_result;

static cb_status generate(const cb_model *m, cb_fwd *f, cb_kvcache *kv, float *logits, int32_t pos,
                          const gen_opts *o, streamer *sm, double t0, gen_result *res)
{
    const cb_vocab *v = cb_model_vocab(m);
    const cb_hparams *hp = cb_model_hparams(m);
    cb_sampler *smp = cb_sampler_new(&o->sp);
    char *piece = NULL;
    size_t piece_len = 0, piece_cap = 0;
    cb_status st = CB_OK;

    res->n_gen = 0;
    res->stop = "length";
    if (!smp)
        return CB_ERR_NOMEM;
    for (;;) {
        int32_t tok = cb_sampler_sample(smp, logits, hp->n_vocab);
        if (res->n_gen == 0)
            res->first_ms = now_ms() - t0;
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
        int r = stream_push(sm, piece, piece_len);
        if (r < 0) {
            st = CB_ERR_NOMEM;
            break;
        }
        if (r > 0) {
            res->stop = "stop";
            break;
        }
        if (res->n_gen >= o->n_predict)
            break;
        if (pos >= cb_kvcache_n_ctx(kv)) {
            res->stop = "context";
            break;
        }
        if ((st = cb_model_eval(f, kv, &tok, 1, pos++, logits)) != CB_OK)
            break;
    }
    if (st == CB_OK && stream_flush(sm) < 0)
        st = CB_ERR_NOMEM;
    free(piece);
    cb_sampler_free(smp);
    return st;
}

/* One prompt segment: its tokens and, for a chunk, where its cache is. */
typedef struct seg {
    cb_tokens toks;
    int is_chunk;
    int missing;          /* a chunk without a usable cache */
    char key[66];
    cb_kvfile *kf;
    cb_store_ref *ref;
    char path[4096];      /* the cache file (resolved), while acquired */
} seg;

typedef struct prompt_s {
    seg *s;
    int n, cap;
    int n_chunks, n_missing;
    cb_chat_kind kind;
} prompt_t;

static seg *prompt_add(prompt_t *p)
{
    if (p->n == p->cap) {
        int nc = p->cap ? 2 * p->cap : 16;
        seg *ns = realloc(p->s, sizeof *ns * (size_t)nc);
        if (!ns)
            return NULL;
        p->s = ns;
        p->cap = nc;
    }
    memset(&p->s[p->n], 0, sizeof p->s[p->n]);
    return &p->s[p->n++];
}

static void prompt_free(prompt_t *p)
{
    for (int i = 0; i < p->n; i++) {
        cb_tokens_free(&p->s[i].toks);
        cb_kvfile_free(p->s[i].kf);
        cb_store_release(p->s[i].ref);
    }
    free(p->s);
    memset(p, 0, sizeof *p);
}

/* Read the chunk records: one JSON object per line with a "text" string
 * ("kv" and every other field are ignored; the key is recomputed from the
 * tokens, so a record from another model or lead-in cannot mislead). */
static int read_chunks(const char *path, json_t **out)
{
    int code = 0;
    size_t len;
    char *all = cli_read_input(path, &len, &code);
    const char *name = strcmp(path, "-") == 0 ? "(stdin)" : path;
    json_t *arr = json_array();
    if (!all) {
        json_decref(arr);
        return code;
    }
    long lineno = 0;
    for (char *line = all, *nl; line && *line; line = nl) {
        nl = strchr(line, '\n');
        if (nl)
            *nl++ = 0;
        lineno++;
        if (strspn(line, " \t\r") == strlen(line))
            continue;
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        if (!o || !json_is_object(o) || !json_is_string(json_object_get(o, "text"))) {
            cli_err("%s:%ld: %s", name, lineno, !o ? jerr.text : "not a chunk record (no \"text\" string)");
            json_decref(o);
            json_decref(arr);
            free(all);
            return CLI_EX_DATAERR;
        }
        json_array_append_new(arr, o);
    }
    free(all);
    *out = arr;
    return 0;
}

/* Build the prompt's segments: [BOS + template prefix] [chunk] [sep] ...
 * [chunk] [sep + question + template suffix].  Token ids are assembled per
 * segment, never by re-tokenizing joined text, so a chunk's tokens are
 * exactly the ones its cache was computed for. */
static cb_status build_prompt(const cb_model *m, const gen_opts *o, const char *text, size_t len, json_t *chunks,
                              const cb_tokens *lead, prompt_t *p)
{
    const cb_vocab *v = cb_model_vocab(m);
    cb_chat_parts parts = {0};
    cb_status st;
    seg *s;

    p->kind = o->raw ? CB_CHAT_NONE : cb_chat_detect(cb_gguf_str(cb_model_gguf(m), "tokenizer.chat_template"));
    if (p->kind != CB_CHAT_NONE && (st = cb_chat_render(p->kind, o->system, &parts)) != CB_OK)
        return st;
    if (!(s = prompt_add(p)))
        goto oom;
    if (cb_vocab_add_bos(v) && cb_vocab_bos(v) >= 0 && (st = cb_tokens_push(&s->toks, cb_vocab_bos(v))) != CB_OK)
        goto fail;
    if (p->kind != CB_CHAT_NONE &&
        (st = cb_tok_encode(v, parts.prefix, strlen(parts.prefix), CB_TOK_PARSE_SPECIAL, &s->toks)) != CB_OK)
        goto fail;
    size_t nc = chunks ? json_array_size(chunks) : 0;
    cb_tokens sep = {0};
    if ((st = cb_tok_encode(v, "\n\n", 2, 0, &sep)) != CB_OK)
        goto fail;
    for (size_t i = 0; i < nc; i++) {
        json_t *t = json_object_get(json_array_get(chunks, i), "text");
        if (i > 0) {
            if (!(s = prompt_add(p)))
                goto oom_sep;
            for (size_t j = 0; j < sep.n; j++)
                if ((st = cb_tokens_push(&s->toks, sep.ids[j])) != CB_OK)
                    goto fail_sep;
        }
        if (!(s = prompt_add(p)))
            goto oom_sep;
        s->is_chunk = 1;
        if ((st = cb_tok_encode(v, json_string_value(t), json_string_length(t), 0, &s->toks)) != CB_OK)
            goto fail_sep;
        if (s->toks.n == 0) { /* an empty chunk adds nothing */
            p->n--;
            continue;
        }
        cb_kv_key(cb_model_fingerprint(m), cb_kv_tokens_hash(lead->ids, (int32_t)lead->n, s->toks.ids, (int32_t)s->toks.n),
                  s->key);
        p->n_chunks++;
    }
    if (!(s = prompt_add(p)))
        goto oom_sep;
    if (nc > 0)
        for (size_t j = 0; j < sep.n; j++)
            if ((st = cb_tokens_push(&s->toks, sep.ids[j])) != CB_OK)
                goto fail_sep;
    cb_tokens_free(&sep);
    st = cb_tok_encode(v, text, len, p->kind == CB_CHAT_NONE ? CB_TOK_PARSE_SPECIAL : 0, &s->toks);
    if (st == CB_OK && p->kind != CB_CHAT_NONE)
        st = cb_tok_encode(v, parts.suffix, strlen(parts.suffix), CB_TOK_PARSE_SPECIAL, &s->toks);
    cb_chat_parts_free(&parts);
    return st;
oom_sep:
    st = CB_ERR_NOMEM;
fail_sep:
    cb_tokens_free(&sep);
    goto fail;
oom:
    st = CB_ERR_NOMEM;
fail:
    cb_chat_parts_free(&parts);
    return st;
}

/* Find each chunk's cache in the store; a chunk without a usable one is
 * computed in place (and stored afterwards). */
static void attach_caches(const cb_model *m, cb_store *store, prompt_t *p)
{
    for (int i = 0; i < p->n; i++) {
        seg *s = &p->s[i];
        const char *path;
        cb_error err;
        if (!s->is_chunk)
            continue;
        s->missing = 1;
        if (!store || cb_store_acquire(store, s->key, &s->ref, &path, &err) != CB_OK)
            continue;
        if (cb_kvfile_open(&s->kf, path, &err) != CB_OK || cb_kvfile_check_model(s->kf, m, &err) != CB_OK) {
            cli_err("warning: %s: %s; the chunk is recomputed", s->key, err.msg);
        } else {
            const cb_kv_meta *mt = cb_kvfile_meta(s->kf);
            if (mt->n_tokens == (int32_t)s->toks.n && !memcmp(mt->ids, s->toks.ids, sizeof(int32_t) * s->toks.n)) {
                s->missing = 0;
                if (!realpath(path, s->path))
                    snprintf(s->path, sizeof s->path, "%s", path);
                continue;
            }
            cli_err("warning: %s: its tokens differ from the chunk's; the chunk is recomputed", path);
        }
        cb_kvfile_free(s->kf);
        s->kf = NULL;
        cb_store_release(s->ref);
        s->ref = NULL;
    }
    for (int i = 0; i < p->n; i++)
        p->n_missing += p->s[i].is_chunk && p->s[i].missing;
}

static int write_stats(const gen_opts *o, json_t *obj)
{
    int code = 0;
    if (strcmp(o->stats_path, "-") == 0) {
        if (json_dumpf(obj, stderr, JSON_COMPACT) != 0 || fputc('\n', stderr) == EOF)
            code = CLI_EX_IOERR;
    } else {
        char *s = json_dumps(obj, JSON_COMPACT);
        size_t n = s ? strlen(s) : 0;
        cb_error err;
        char *s2 = s ? realloc(s, n + 2) : NULL;
        if (!s2) {
            free(s);
            return CLI_EX_SOFTWARE;
        }
        s2[n] = '\n';
        if (cb_file_write_atomic(o->stats_path, s2, n + 1, &err) != CB_OK) {
            cli_err("%s", err.msg);
            code = cli_exit_code(err.status);
        }
        free(s2);
    }
    return code;
}

static const char *mode_name(cb_blend_mode m)
{
    static const char *const names[] = {"full", "prefix", "reuse", "blend"};
    return names[m];
}

static const char *strategy_name(cb_blend_strategy s)
{
    static const char *const names[] = {"hkvd", "sink", "query"};
    return names[s];
}

/* KL(p || q) of two logit vectors' softmaxes, and whether their argmax agree. */
static double kl_logits(const float *lp, const float *lq, int n, int *top1)
{
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, kl = 0;
    int ap = 0, aq = 0;
    for (int i = 0; i < n; i++) {
        if (lp[i] > mp)
            mp = lp[i], ap = i;
        if (lq[i] > mq)
            mq = lq[i], aq = i;
    }
    for (int i = 0; i < n; i++) {
        zp += exp(lp[i] - mp);
        zq += exp(lq[i] - mq);
    }
    for (int i = 0; i < n; i++) {
        double a = lp[i] - mp - log(zp), b = lq[i] - mq - log(zq);
        kl += exp(a) * (a - b);
    }
    *top1 = ap == aq;
    return kl < 0 ? 0 : kl;
}

static int run_generate(const gen_opts *o, const char *text, size_t len)
{
    cb_model *m = NULL;
    cb_store *store = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_tokens lead = {0};
    prompt_t pr = {0};
    cb_segment *segs = NULL;
    json_t *chunks = NULL;
    cb_error err;
    cb_model_params mp = {o->n_threads, cli_device(o->device)};
    streamer sm = {NULL, 0, 0, o->stops, o->n_stops, stdout, o->verify, NULL, 0, 0};
    float *logits = NULL, *vlogits = NULL;
    int code = 0;
    cb_status st;
    double t_load0 = now_ms(), t_load;
    cb_blend_stats bs;
    gen_result gr = {0, 0, "length"};
    cb_blend_params bp = o->bp;

    if (o->chunks_path && (code = read_chunks(o->chunks_path, &chunks)) != 0)
        return code;
    if ((st = cb_model_load(&m, o->model, &mp, &err)) != CB_OK) {
        cli_err("%s", err.msg);
        json_decref(chunks);
        return cli_exit_code(st);
    }
    t_load = now_ms() - t_load0;
    const cb_hparams *hp = cb_model_hparams(m);
    if (chunks && json_array_size(chunks) > 0 && (bp.mode != CB_MODE_FULL || (o->store_write && o->store_dir))) {
        if ((st = cb_store_open(&store, o->store_dir, o->store_write, &err)) != CB_OK) {
            if (st != CB_ERR_NOT_FOUND) {
                cli_err("%s", err.msg);
                code = cli_exit_code(st);
                goto done;
            }
            cli_err("warning: %s; every chunk is computed", err.msg);
        }
    }
    double t0 = now_ms(); /* TTFT counts from here: prompt assembly, cache lookup, prefill, first token */
    if ((st = cb_kv_lead_in(m, &lead)) != CB_OK ||
        (st = build_prompt(m, o, text, len, chunks, &lead, &pr)) != CB_OK) {
        cli_err("%s: cannot build the prompt: %s", o->in_name, cb_strerror(st));
        code = cli_exit_code(st);
        goto done;
    }
    if (bp.mode != CB_MODE_FULL)
        attach_caches(m, store, &pr);
    else
        for (int i = 0; i < pr.n; i++)
            pr.n_missing += pr.s[i].is_chunk;
    int64_t total = 0;
    segs = calloc((size_t)pr.n, sizeof *segs);
    if (!segs) {
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    for (int i = 0; i < pr.n; i++) {
        segs[i] = (cb_segment){pr.s[i].toks.ids, (int32_t)pr.s[i].toks.n, pr.s[i].kf};
        total += (int64_t)pr.s[i].toks.n;
    }
    if (total == 0) {
        cli_err("%s: the prompt is empty", o->in_name);
        code = CLI_EX_DATAERR;
        goto done;
    }
    int64_t n_ctx = o->n_ctx > 0 ? o->n_ctx : total + o->n_predict;
    if (o->n_ctx <= 0 && n_ctx > hp->n_ctx_train)
        n_ctx = hp->n_ctx_train > total ? hp->n_ctx_train : total + 1;
    if (total >= n_ctx) {
        cli_err("%s: the prompt has %lld tokens; the context holds %lld (-c)", o->in_name, (long long)total,
                (long long)n_ctx);
        code = CLI_EX_DATAERR;
        goto done;
    }
    cli_info("%s: %s, %d layers, device %s, loaded in %.0f ms", o->model, hp->arch, hp->n_layer, cb_model_device(m),
             t_load);
    cli_info("chat template %s; prompt %lld tokens in %d segments, %d chunks (%d without cache); mode %s",
             cb_chat_name(pr.kind), (long long)total, pr.n, pr.n_chunks, pr.n_missing, mode_name(bp.mode));
    logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (!logits || cb_kvcache_new(&kv, m, (int32_t)n_ctx, o->kv_type) != CB_OK ||
        cb_fwd_new(&f, m, (int32_t)total) != CB_OK) {
        cli_err("out of memory (context %lld)", (long long)n_ctx);
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    /* --ratio auto: the controller's ratio for the slowest tier holding a chunk */
    double pred_load = -1, pred_recompute = -1;
    const char *ratio_source = "given";
    char slow_tier[64] = "";
    if (o->ratio_auto && bp.mode == CB_MODE_BLEND) {
        cb_profile *prof = calloc(1, sizeof *prof);
        int64_t n_cached = 0;
        double worst = -1;
        if (prof && cb_profile_load(prof, o->store_dir, cb_model_fingerprint(m), cb_model_backend(m), &err) == CB_OK) {
            for (int i = 0; i < pr.n; i++)
                if (pr.s[i].kf)
                    n_cached += (int64_t)pr.s[i].toks.n;
            /* the tier of each chunk: the tier directory its file lies in */
            for (int i = 0; store && i < pr.n; i++) {
                if (!pr.s[i].kf)
                    continue;
                for (int t = 0; t < cb_store_n_tiers(store); t++) {
                    cb_store_tier ti;
                    char real_t[4096];
                    if (cb_store_tier_info(store, t, &ti) != CB_OK || !realpath(ti.path, real_t))
                        continue;
                    if (!strncmp(pr.s[i].path, real_t, strlen(real_t))) {
                        double lm = cb_profile_load_ms(prof, ti.name, 1, o->kv_type, 1);
                        if (lm > worst) {
                            worst = lm;
                            snprintf(slow_tier, sizeof slow_tier, "%s", ti.name);
                        }
                    }
                }
            }
            if (slow_tier[0]) {
                cb_type ft = CB_TYPE_F16;
                for (int i = 0; i < pr.n; i++)
                    if (pr.s[i].kf)
                        ft = cb_kvfile_meta(pr.s[i].kf)->type;
                bp.ratios[0] = (float)cb_controller_ratio(prof, slow_tier, n_cached, ft, 1, o->min_ratio, &pred_load,
                                                         &pred_recompute);
                ratio_source = "controller";
            }
        }
        if (strcmp(ratio_source, "controller")) {
            bp.ratios[0] = (float)o->min_ratio;
            ratio_source = "fallback";
            cli_err("note: --ratio auto: no profile for this model and backend in %s (run cb-profile); using "
                    "--min-ratio %.2f",
                    o->store_dir, o->min_ratio);
        } else {
            cli_info("--ratio auto: %.3f for %lld cached tokens in tier %s (predicted load %.1f ms, recompute %.1f ms)",
                     bp.ratios[0], (long long)n_cached, slow_tier, pred_load, pred_recompute);
        }
        free(prof);
    }
    if ((st = cb_blend_prefill(f, kv, segs, pr.n, &bp, logits, &bs, &err)) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(st);
        goto done;
    }
    if (o->logits_out && cb_file_write_atomic(o->logits_out, logits, sizeof(float) * (size_t)hp->n_vocab, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    /* --verify: full prefill of the same tokens, for the first token's distribution */
    double v_kl = 0;
    int v_top1 = 0;
    float *first_logits = NULL;
    if (o->verify) {
        first_logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
        if (first_logits)
            memcpy(first_logits, logits, sizeof(float) * (size_t)hp->n_vocab);
    }
    if ((st = generate(m, f, kv, logits, (int32_t)total, o, &sm, t0, &gr)) != CB_OK) {
        cli_err("generation failed: %s", cb_strerror(st));
        code = cli_exit_code(st);
        free(first_logits);
        goto done;
    }
    double gen_ms = now_ms() - t0 - gr.first_ms;
    if (isatty(1))
        putchar('\n');
    fflush(stdout);
    json_t *verify = NULL;
    if (o->verify && first_logits) {
        /* full prefill of the same tokens; greedy answers of both */
        cb_blend_params fp = bp;
        gen_opts go = *o;
        streamer full_sm = {NULL, 0, 0, o->stops, o->n_stops, NULL, 1, NULL, 0, 0};
        streamer greedy_sm = {NULL, 0, 0, o->stops, o->n_stops, NULL, 1, NULL, 0, 0};
        double full_ms = 0;
        int ok = 1;
        go.sp.temp = 0;
        fp.mode = CB_MODE_FULL;
        vlogits = malloc(sizeof(float) * (size_t)hp->n_vocab);
        for (int pass = 0; ok && pass < 2; pass++) {
            /* pass 0: full prefill; pass 1: this mode again, greedily, when the run sampled */
            if (pass == 1 && o->sp.temp <= 0)
                break;
            cb_kvcache *kv2 = NULL;
            cb_fwd *f2 = NULL;
            cb_blend_stats bs2;
            gen_result g2;
            double tv = now_ms();
            ok = vlogits && cb_kvcache_new(&kv2, m, (int32_t)n_ctx, o->kv_type) == CB_OK &&
                 cb_fwd_new(&f2, m, (int32_t)total) == CB_OK &&
                 cb_blend_prefill(f2, kv2, segs, pr.n, pass ? &bp : &fp, vlogits, &bs2, &err) == CB_OK;
            if (ok && pass == 0) {
                full_ms = now_ms() - tv;
                v_kl = kl_logits(vlogits, first_logits, hp->n_vocab, &v_top1);
            }
            ok = ok && generate(m, f2, kv2, vlogits, (int32_t)total, &go, pass ? &greedy_sm : &full_sm, tv, &g2) ==
                           CB_OK;
            cb_fwd_free(f2);
            cb_kvcache_free(kv2);
        }
        if (!ok) {
            cli_err("--verify: the full-prefill comparison failed");
            code = CLI_EX_SOFTWARE;
        } else {
            const char *mine = o->sp.temp > 0 ? greedy_sm.all : sm.all, *full = full_sm.all;
            int same = strcmp(mine ? mine : "", full ? full : "") == 0;
            char *clean = cli_utf8_clean(full ? full : "", full ? full_sm.all_len : 0);
            verify = json_pack("{s:f, s:b, s:b, s:f, s:s}", "kl", v_kl, "top1_agree", v_top1, "same_answer", same,
                               "full_prefill_ms", full_ms, "full_answer", clean ? clean : "");
            free(clean);
        }
        free(full_sm.buf), free(full_sm.all), free(greedy_sm.buf), free(greedy_sm.all);
    }
    free(first_logits);
    cli_info("prefill %lld tokens (%d cached, %d recomputed) in %.1f ms (load %.1f ms); TTFT %.1f ms; %d tokens in "
             "%.1f ms; stop: %s",
             (long long)total, bs.n_cached_tokens, bs.n_recomputed_tokens, bs.prefill_ms, bs.load_ms, gr.first_ms,
             gr.n_gen, gen_ms, gr.stop);
    /* Store the chunks that had no cache, for the next run (after the answer:
     * it costs this run no latency). */
    int n_stored = 0;
    if (o->store_write && store && pr.n_missing > 0) {
        cb_kvcache *pkv = NULL;
        cb_fwd *pf = NULL;
        if (cb_fwd_new(&pf, m, 512) == CB_OK)
            for (int i = 0; i < pr.n; i++) {
                seg *s = &pr.s[i];
                void *buf = NULL;
                size_t size = 0;
                int found = 0;
                if (!s->is_chunk || !s->missing || (cb_store_lookup(store, s->key, &found) == CB_OK && found))
                    continue;
                cb_kvcache_free(pkv);
                pkv = NULL;
                if (cb_kvcache_new(&pkv, m, (int32_t)(lead.n + s->toks.n), CB_TYPE_F32) != CB_OK)
                    break;
                if (cb_kv_precompute(pf, pkv, lead.ids, (int32_t)lead.n, s->toks.ids, (int32_t)s->toks.n,
                                     CB_TYPE_F16, &buf, &size) == CB_OK &&
                    cb_store_put(store, s->key, buf, size, &err) == CB_OK)
                    n_stored++;
                else
                    cli_err("warning: could not store chunk %s", s->key);
                free(buf);
            }
        cb_kvcache_free(pkv);
        cb_fwd_free(pf);
    }
    if (o->stats_path) {
        json_t *sel = json_array();
        for (int i = 0; bp.mode == CB_MODE_BLEND && i < bp.n_ratios; i++)
            json_array_append_new(sel, json_integer(bs.n_selected[i]));
        double ratio = bp.mode == CB_MODE_BLEND ? bp.ratios[bp.n_ratios - 1] : bp.mode == CB_MODE_FULL ? 1.0 : 0.0;
        json_t *s = json_pack(
            "{s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:o, s:f, s:f, s:s, s:i, s:i, s:i, s:i, s:s, s:s, "
            "s:i, s:s, s:s, s:s, s:s, s:f, s:s, s:f, s:f, s:I}",
            "mode", mode_name(bp.mode), "n_prompt_tokens", (json_int_t)total, "n_cached_tokens",
            (json_int_t)bs.n_cached_tokens, "n_recomputed_tokens", (json_int_t)bs.n_recomputed_tokens, "ratio", ratio,
            "ttft_ms", gr.first_ms, "prefill_ms", bs.prefill_ms, "load_ms", bs.load_ms, "n_gen_tokens",
            (json_int_t)gr.n_gen, "gen_ms", gen_ms, "recompute_ms", bs.recompute_ms, "n_selected", sel,
            "prefill_tok_s", total / (bs.prefill_ms / 1e3), "gen_tok_s", gr.n_gen ? gr.n_gen / (gen_ms / 1e3) : 0.0,
            "stop", gr.stop, "n_chunks", pr.n_chunks, "n_chunks_missing", pr.n_missing, "n_chunks_stored", n_stored,
            "check_layer", bp.check_layer, "strategy", strategy_name(bp.strategy), "deviation",
            bp.deviation_v ? "v" : "k", "threads", o->n_threads, "backend", cb_model_backend(m), "device", cb_model_device(m), "chat_template",
            cb_chat_name(pr.kind), "kv_type", cb_type_name(o->kv_type), "model_load_ms", t_load, "model", o->model,
            "overlapped_ms", bs.overlapped_ms, "stall_ms", bs.stall_ms, "load_bytes", (json_int_t)bs.load_bytes);
        if (s && o->ratio_auto) {
            json_object_set_new(s, "ratio_source", json_string(ratio_source));
            json_object_set_new(s, "predicted_load_ms", json_real(pred_load));
            json_object_set_new(s, "predicted_recompute_ms", json_real(pred_recompute));
            if (slow_tier[0])
                json_object_set_new(s, "tier", json_string(slow_tier));
        }
        if (s && verify)
            json_object_set_new(s, "verify", verify), verify = NULL;
        code = s ? write_stats(o, s) : CLI_EX_SOFTWARE;
        json_decref(s);
    }
    json_decref(verify);
done:
    free(sm.buf);
    free(sm.all);
    free(logits);
    free(vlogits);
    free(segs);
    prompt_free(&pr);
    cb_tokens_free(&lead);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_store_close(store);
    cb_model_free(m);
    json_decref(chunks);
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
        {"store", required_argument, 0, OPT_STORE},
        {"chunks", required_argument, 0, OPT_CHUNKS},
        {"ratio", required_argument, 0, OPT_RATIO},
        {"min-ratio", required_argument, 0, OPT_MINRATIO},
        {"logits-out", required_argument, 0, OPT_LOGITS},
        {"ratios", required_argument, 0, OPT_RATIOS},
        {"check-layer", required_argument, 0, OPT_CHECK},
        {"deviation", required_argument, 0, OPT_DEVIATION},
        {"strategy", required_argument, 0, OPT_STRATEGY},
        {"sink-tokens", required_argument, 0, OPT_SINK},
        {"verify", no_argument, 0, OPT_VERIFY},
        {"no-store-write", no_argument, 0, OPT_NOSTORE},
        {"device", required_argument, 0, OPT_DEVICE},
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
    o.bp = cb_blend_defaults();
    o.store_write = 1;
    o.min_ratio = 0.15;
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
            if (!strcmp(optarg, "full"))
                o.bp.mode = CB_MODE_FULL;
            else if (!strcmp(optarg, "prefix"))
                o.bp.mode = CB_MODE_PREFIX;
            else if (!strcmp(optarg, "reuse"))
                o.bp.mode = CB_MODE_REUSE;
            else if (!strcmp(optarg, "blend"))
                o.bp.mode = CB_MODE_BLEND;
            else {
                cli_err("--mode %s: use full, prefix, reuse or blend", optarg);
                return CLI_EX_USAGE;
            }
            o.mode_given = 1;
            break;
        case OPT_STORE: o.store_dir = optarg; break;
        case OPT_CHUNKS: o.chunks_path = optarg; break;
        case OPT_RATIO:
            o.bp.n_ratios = 1;
            if (!strcmp(optarg, "auto")) {
                o.ratio_auto = 1;
                break;
            }
            if (parse_num("--ratio", optarg, 0, 1, &d))
                return CLI_EX_USAGE;
            o.bp.ratios[0] = (float)d;
            o.ratio_auto = 0;
            break;
        case OPT_MINRATIO:
            if (parse_num("--min-ratio", optarg, 0, 1, &d))
                return CLI_EX_USAGE;
            o.min_ratio = d;
            break;
        case OPT_RATIOS: {
            char *dup = strdup(optarg), *save = NULL;
            o.bp.n_ratios = 0;
            for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (o.bp.n_ratios == CB_BLEND_MAX_STEPS || parse_num("--ratios", t, 0, 1, &d)) {
                    if (o.bp.n_ratios == CB_BLEND_MAX_STEPS)
                        cli_err("--ratios: at most %d", CB_BLEND_MAX_STEPS);
                    free(dup);
                    return CLI_EX_USAGE;
                }
                o.bp.ratios[o.bp.n_ratios++] = (float)d;
            }
            free(dup);
            if (o.bp.n_ratios == 0) {
                cli_err("--ratios: give r1,r2,...");
                return CLI_EX_USAGE;
            }
            break;
        }
        case OPT_CHECK:
            if (parse_num("--check-layer", optarg, 1, 4096, &d))
                return CLI_EX_USAGE;
            o.bp.check_layer = (int32_t)d;
            break;
        case OPT_DEVIATION:
            if (strcmp(optarg, "k") && strcmp(optarg, "v")) {
                cli_err("--deviation %s: use k or v", optarg);
                return CLI_EX_USAGE;
            }
            o.bp.deviation_v = optarg[0] == 'v';
            break;
        case OPT_STRATEGY:
            if (!strcmp(optarg, "hkvd"))
                o.bp.strategy = CB_STRATEGY_HKVD;
            else if (!strcmp(optarg, "sink"))
                o.bp.strategy = CB_STRATEGY_SINK;
            else if (!strcmp(optarg, "query"))
                o.bp.strategy = CB_STRATEGY_QUERY;
            else {
                cli_err("--strategy %s: use hkvd, sink or query", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case OPT_SINK:
            if (parse_num("--sink-tokens", optarg, 0, 1024, &d))
                return CLI_EX_USAGE;
            o.bp.sink_tokens = (int32_t)d;
            break;
        case OPT_VERIFY: o.verify = 1; break;
        case OPT_LOGITS: o.logits_out = optarg; break;
        case OPT_NOSTORE: o.store_write = 0; break;
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
        case OPT_DEVICE: o.device = optarg; break;
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
    if (o.chunks_path && strcmp(o.chunks_path, "-") == 0 && !prompt && (!file || strcmp(file, "-") == 0)) {
        cli_err("--chunks - reads stdin: give the question with -p or -f FILE");
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
    if (!o.chunks_path && !o.mode_given)
        o.bp.mode = CB_MODE_FULL; /* nothing to reuse */
    char store_buf[4096];
    if (!o.store_dir)
        o.store_dir = cb_store_default_dir(store_buf, sizeof store_buf);
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
