/* cli.c - front-end helpers shared by the cb-* programs. */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *cli_prog = "cb";
int cli_verbosity = 1;
int cli_exact = -1;

int cli_exit_code(cb_status st)
{
    switch (st) {
    case CB_OK: return CLI_EX_OK;
    case CB_ERR_INVALID: return CLI_EX_USAGE;
    case CB_ERR_FORMAT:
    case CB_ERR_CHECKSUM:
    case CB_ERR_MISMATCH:
    case CB_ERR_UNSUPPORTED:
    case CB_ERR_RANGE: return CLI_EX_DATAERR;
    case CB_ERR_NOT_FOUND: return CLI_EX_NOINPUT;
    case CB_ERR_CREATE: return CLI_EX_CANTCREAT;
    case CB_ERR_IO: return CLI_EX_IOERR;
    case CB_ERR_DEVICE: return CLI_EX_UNAVAILABLE;
    case CB_ERR_NOMEM:
    case CB_ERR_INTERNAL: return CLI_EX_SOFTWARE;
    }
    return CLI_EX_SOFTWARE;
}

void cli_err(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", cli_prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void cli_info(const char *fmt, ...)
{
    va_list ap;
    if (cli_verbosity < 2)
        return;
    fprintf(stderr, "%s: ", cli_prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

const char *cli_device(const char *opt)
{
    const char *env = getenv("CB_DEVICE");
    if (opt && *opt)
        return opt;
    return env && *env ? env : "auto";
}

const char *cli_fp_cache(void)
{
    static char buf[4096];
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (cache && *cache)
        snprintf(buf, sizeof buf, "%s/cacheblend/fingerprints", cache);
    else if (home && *home)
        snprintf(buf, sizeof buf, "%s/.cache/cacheblend/fingerprints", home);
    else
        return NULL;
    return buf;
}

cb_model_params cli_model_params(int n_threads, const char *device)
{
    const char *env = getenv("CB_EXACT"), *dev = getenv("CB_DEVICE");
    cb_model_params mp = {n_threads, cli_device(device),
                          cli_exact >= 0 ? cli_exact : env && strcmp(env, "1") == 0,
                          cli_fp_cache()};
    if (mp.exact && !(device && *device) && !(dev && *dev))
        mp.device = "cpu";
    return mp;
}

const char *cli_model_path(const char *opt)
{
    static char buf[4096];
    const char *env = getenv("CB_MODEL");
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");

    if (opt && *opt)
        return opt;
    if (env && *env)
        return env;
    if (cache && *cache)
        snprintf(buf, sizeof buf, "%s/cacheblend/models/" CLI_DEFAULT_MODEL, cache);
    else
        snprintf(buf, sizeof buf, "%s/.cache/cacheblend/models/" CLI_DEFAULT_MODEL,
                 home && *home ? home : ".");
    return buf;
}

char *cli_read_input(const char *path, size_t *len, int *exit_code)
{
    int use_stdin = !path || strcmp(path, "-") == 0;
    FILE *f = use_stdin ? stdin : fopen(path, "rb");
    const char *name = use_stdin ? "(stdin)" : path;
    size_t n = 0, cap = 1 << 16;
    char *buf;

    if (!f) {
        cli_err("%s: %s", path, strerror(errno));
        *exit_code = CLI_EX_NOINPUT;
        return NULL;
    }
    buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf) {
        cli_err("%s: out of memory", name);
        *exit_code = CLI_EX_SOFTWARE;
    } else if (ferror(f)) {
        cli_err("%s: read error: %s", name, strerror(errno));
        free(buf);
        buf = NULL;
        *exit_code = CLI_EX_IOERR;
    } else {
        buf[n] = 0;
        *len = n;
    }
    if (!use_stdin)
        fclose(f);
    return buf;
}

int cli_finish(int code)
{
    if (fflush(stdout) != 0 || ferror(stdout) || fclose(stdout) != 0) {
        cli_err("error writing to standard output: %s", strerror(errno));
        return CLI_EX_IOERR;
    }
    return code;
}

uint64_t cli_mem_available(void)
{
    char line[256];
    unsigned long long kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    if (kb > 0)
        return (uint64_t)kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : (uint64_t)1 << 30;
}

static char sigbus_msg[192];
static size_t sigbus_len;

static void on_sigbus(int sig)
{
    (void)sig;
    if (write(2, sigbus_msg, sigbus_len) < 0) { /* nothing more to say */
    }
    _exit(CLI_EX_IOERR);
}

void cli_trap_sigbus(void)
{
    struct sigaction sa;
    int n = snprintf(sigbus_msg, sizeof sigbus_msg,
                     "%s: a mapped file (the model or a KV file) was truncated or could not be "
                     "read while in use\n",
                     cli_prog);
    sigbus_len = n < 0 ? 0 : (size_t)n < sizeof sigbus_msg ? (size_t)n : sizeof sigbus_msg - 1;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

void cli_version(void) { printf("%s (cacheblend) %s\n", cli_prog, CB_VERSION_STRING); }

char *cli_utf8_clean(const char *s, size_t n, size_t *out_len)
{
    const unsigned char *p = (const unsigned char *)s;
    char *out = malloc(3 * n + 1), *o = out;
    size_t i = 0;
    if (!out)
        return NULL;
    while (i < n) {
        unsigned c = p[i];
        size_t len = c < 0x80             ? 1
                     : (c & 0xE0) == 0xC0 ? 2
                     : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4
                                          : 0;
        int valid = len > 0 && i + len <= n;
        for (size_t k = 1; valid && k < len; k++)
            valid = (p[i + k] & 0xC0) == 0x80;
        if (valid && len > 1) { /* overlong forms, surrogates, past U+10FFFF */
            unsigned cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
            for (size_t k = 1; k < len; k++)
                cp = cp << 6 | (p[i + k] & 0x3F);
            valid = !(len == 2 && cp < 0x80) &&
                    !(len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) &&
                    !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF));
        }
        if (valid) {
            memcpy(o, p + i, len);
            o += len;
            i += len;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *o = 0;
    if (out_len)
        *out_len = (size_t)(o - out);
    return out;
}

const char *cli_plural(uint64_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

const char *cli_bytes(uint64_t n, char *buf, size_t size)
{
    if (n < 1000)
        snprintf(buf, size, "%llu %s", (unsigned long long)n, cli_plural(n, "byte", "bytes"));
    else if (n < 1000000)
        snprintf(buf, size, "%.1f kB", (double)n / 1e3);
    else if (n < 1000000000)
        snprintf(buf, size, "%.2f MB", (double)n / 1e6);
    else
        snprintf(buf, size, "%.2f GB", (double)n / 1e9);
    return buf;
}

/* The long option that `text` ("--name" or "--name=value") names, by its
 * whole name or an abbreviation; NULL for none, and *n_match the number of
 * options it abbreviates. */
static const struct option *long_named(const char *text, const struct option *lo, int *n_match)
{
    const char *name = text + 2;
    size_t n = strcspn(name, "=");
    const struct option *hit = NULL;
    *n_match = 0;
    for (; lo && lo->name; lo++) {
        if (strncmp(lo->name, name, n) != 0)
            continue;
        if (lo->name[n] == 0) { /* the whole name wins over abbreviations */
            *n_match = 1;
            return lo;
        }
        hit = lo, ++*n_match;
    }
    return *n_match == 1 ? hit : NULL;
}

int cli_getopt(int argc, char *const argv[], const char *shortopts, const struct option *longopts)
{
    opterr = 0;
    int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c != '?')
        return c;
    const char *text = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    if (strncmp(text, "--", 2) == 0 && text[2]) {
        int n_match;
        const struct option *lo = long_named(text, longopts, &n_match);
        int len = (int)strcspn(text, "=");
        if (n_match > 1)
            cli_err("option '%.*s' is ambiguous (see --help)", len, text);
        else if (!lo)
            cli_err("unknown option '%.*s' (see --help)", len, text);
        else if (lo->has_arg == no_argument)
            cli_err("option '--%s' takes no argument (see --help)", lo->name);
        else
            cli_err("option '--%s' needs an argument (see --help)", lo->name);
    } else if (optopt && optopt != ':' && strchr(shortopts, optopt)) {
        cli_err("option '-%c' needs an argument (see --help)", optopt);
    } else if (optopt > ' ' && optopt < 127) {
        cli_err("unknown option '-%c' (see --help)", optopt);
    } else {
        cli_err("unknown option '%s' (see --help)", text);
    }
    return '?';
}

int cli_common_opt(cli_common *co, int c, const char *arg, void (*usage)(FILE *))
{
    char *end;
    long n;
    switch (c) {
    case 'm': co->model = arg; return CLI_CONTINUE;
    case CLI_OPT_STORE: co->store = arg; return CLI_CONTINUE;
    case CLI_OPT_DEVICE: co->device = arg; return CLI_CONTINUE;
    case CLI_OPT_ACT8: cli_exact = 0; return CLI_CONTINUE;
    case CLI_OPT_EXACT: cli_exact = 1; return CLI_CONTINUE;
    case 't':
        n = strtol(arg, &end, 10);
        if (end == arg || *end || n < 1 || n > 1024) {
            cli_err("-t %s: not a thread count (1 to 1024)", arg);
            return CLI_EX_USAGE;
        }
        co->n_threads = (int)n;
        return CLI_CONTINUE;
    case 'v': cli_verbosity = 2; return CLI_CONTINUE;
    case 'q': cli_verbosity = 0; return CLI_CONTINUE;
    case 'h': usage(stdout); return cli_finish(0);
    case CLI_OPT_VERSION: cli_version(); return cli_finish(0);
    case '?': return CLI_EX_USAGE; /* cli_getopt said why */
    }
    return CLI_NOT_COMMON;
}

int cli_threads(const cli_common *co)
{
    long n;
    if (co->n_threads > 0)
        return co->n_threads;
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

const char *cli_store_dir(const cli_common *co, char *buf, size_t n)
{
    return co->store ? co->store : cb_store_default_dir(buf, n);
}

cb_status cli_store_open(cb_store **s, const char *dir, int create, cb_error *err)
{
    char conf[4096];
    struct stat st;
    int made;
    cb_status rc;

    snprintf(conf, sizeof conf, "%s/store.json", dir);
    made = create && stat(conf, &st) != 0;
    rc = cb_store_open(s, dir, create, err);
    if (rc == CB_OK && made && cli_verbosity >= 1)
        fprintf(stderr,
                "%s: made a store at %s (one tier without a limit; cb-store init makes others)\n",
                cli_prog, dir);
    return rc;
}

int cli_parse_ids(const char *text, size_t len, const char *name, int32_t n_vocab, cb_tokens *ids)
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
            (i + used < len && !(text[i + used] == ' ' || text[i + used] == '\t' ||
                                 text[i + used] == '\n' || text[i + used] == '\r'))) {
            cli_err("%s: byte %zu: not a token id: '%.20s'", name, i, text + i);
            return CLI_EX_DATAERR;
        }
        if (v < 0 || v >= n_vocab) {
            cli_err("%s: token id %lld is out of range (the vocabulary has %d tokens)", name, v,
                    (int)n_vocab);
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

int cli_write_json(const char *path, const void *json_obj)
{
    const json_t *obj = json_obj;
    cb_error err;
    int code = 0;
    if (strcmp(path, "-") == 0) {
        if (json_dumpf(obj, stderr, JSON_COMPACT) != 0 || fputc('\n', stderr) == EOF)
            code = CLI_EX_IOERR;
        return code;
    }
    char *s = json_dumps(obj, JSON_COMPACT);
    size_t n = s ? strlen(s) : 0;
    char *s2 = s ? realloc(s, n + 2) : NULL;
    if (!s2) {
        free(s);
        return CLI_EX_SOFTWARE;
    }
    s2[n] = '\n';
    if (cb_file_write_atomic(path, s2, n + 1, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
    }
    free(s2);
    return code;
}

int cli_read_records(const char *path, const char *field, void **out)
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
    const char *nul = memchr(all, 0, len); /* the loop below would stop there */
    if (nul) {
        for (const char *c = all; c <= nul; c++)
            lineno += c == all || c[-1] == '\n';
        cli_err("%s:%ld: a NUL byte: not JSON text", name, lineno);
        json_decref(arr);
        free(all);
        return CLI_EX_DATAERR;
    }
    for (char *line = all, *nl; line && *line; line = nl) {
        nl = strchr(line, '\n');
        if (nl)
            *nl++ = 0;
        lineno++;
        if (strspn(line, " \t\r") == strlen(line))
            continue;
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        if (!o || !json_is_object(o) || !json_is_string(json_object_get(o, field))) {
            if (!o)
                cli_err("%s:%ld: %s", name, lineno, jerr.text);
            else
                cli_err("%s:%ld: not a chunk record (no \"%s\" string)", name, lineno, field);
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

/* "2G", "512M", "1.5T", "4096": bytes (powers of 1024). */
int cli_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (end == s || errno || v < 0)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (mul > 1 && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mul > 9.0e18 || v * mul < 1)
        return -1;
    *out = (uint64_t)(v * mul + 0.5);
    return 0;
}

int cli_parse_num(const char *opt, const char *s, double lo, double hi, double *out)
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

int cli_tokenize(int decode, const char *model, const char *in_name, const char *input, size_t len,
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
             cb_vocab_kind_of(v) == CB_VOCAB_BPE ? "byte-level BPE" : "SentencePiece BPE",
             cb_vocab_pre(v), (int)cb_vocab_n_tokens(v));
    if (!decode) {
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
        if ((code = cli_parse_ids(input, len, in_name, cb_vocab_n_tokens(v), &ids)) != 0)
            goto done;
        cb_status st =
            cb_tok_decode(v, ids.ids, ids.n, special ? CB_DETOK_UNPARSE_SPECIAL : 0, &text, &tlen);
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

int cli_parse_enum(const char *opt, const char *arg, const char *const *names, int n, int *out)
{
    char list[256] = "";
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(arg, names[i])) {
            *out = i;
            return 0;
        }
        len += (size_t)snprintf(list + len, len < sizeof list ? sizeof list - len : 0, "%s%s",
                                i == 0       ? ""
                                : i == n - 1 ? " or "
                                             : ", ",
                                names[i]);
    }
    cli_err("%s %s: use %s", opt, arg, list);
    return -1;
}

cb_status cli_sink_write(void *ctx, const char *p, size_t n)
{
    cli_sink *s = ctx;
    if (s->out) {
        fwrite(p, 1, n, s->out);
        fflush(s->out);
    }
    if (!s->collect)
        return CB_OK;
    if (s->all_len + n + 1 > s->all_cap) {
        size_t nc = (s->all_len + n + 1) * 2;
        char *nb = realloc(s->all, nc);
        if (!nb)
            return CB_ERR_NOMEM;
        s->all = nb;
        s->all_cap = nc;
    }
    memcpy(s->all + s->all_len, p, n);
    s->all_len += n;
    s->all[s->all_len] = 0;
    return CB_OK;
}

/* ------------------------------------------------------ --batch questions */

const char *const cli_mode_names[4] = {"full", "prefix", "reuse", "blend"};
const char *const cli_strategy_names[] = {"hkvd", "sink", "query", "probe",
                                          "runs", "auto", "random"};
const int cli_n_strategies = (int)(sizeof cli_strategy_names / sizeof cli_strategy_names[0]);

/* The fields a question line may have; the others pass through to its answer. */
static const char *const q_fields[] = {"id",       "question",  "prompt", "chunks",
                                       "system",   "mode",      "ratio",  "speedup",
                                       "strategy", "n_predict", "score",  "stop"};

int cli_question_reads(const char *field)
{
    for (size_t i = 0; i < sizeof q_fields / sizeof q_fields[0]; i++)
        if (!strcmp(field, q_fields[i]))
            return 1;
    return 0;
}

void cli_question_free(cli_question *q)
{
    json_decref(q->obj);
    free(q->srcs);
    free(q->stops);
    memset(q, 0, sizeof *q);
}

/* The chunks of a question: its "chunks" (records with "text", records
 * with only "kv", or keys), else the defaults'.  0, or -1 with msg. */
static int q_chunks(cli_question *q, json_t *defaults, cb_request *rq, char *msg, size_t n)
{
    json_t *c = json_object_get(q->obj, "chunks");
    if (!c)
        c = defaults;
    if (!c || json_is_null(c))
        return 0;
    if (!json_is_array(c))
        return snprintf(msg, n, "\"chunks\" is not an array"), -1;
    size_t k = json_array_size(c);
    if (!(q->srcs = calloc(k ? k : 1, sizeof *q->srcs)))
        return snprintf(msg, n, "out of memory"), -1;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(c, i),
               *t = json_is_object(e) ? json_object_get(e, "text") : NULL;
        json_t *key = json_is_string(e) ? e : json_is_object(e) ? json_object_get(e, "kv") : NULL;
        if (json_is_string(t)) { /* a "kv" beside it names the cache to try first */
            q->srcs[i].text = (cb_strview){json_string_value(t), json_string_length(t)};
            q->srcs[i].key = json_is_string(key) ? json_string_value(key) : NULL;
        } else if (json_is_string(key))
            q->srcs[i].key = json_string_value(key);
        else
            return snprintf(msg, n,
                            "chunk %zu is neither a record with \"text\" or \"kv\" nor a key",
                            i + 1),
                   -1;
    }
    rq->chunks = q->srcs;
    rq->n_chunks = k;
    return 0;
}

/* "stop": a string or an array of strings (replacing the defaults'). */
static int q_stops(cli_question *q, json_t *v, cb_request *rq, char *msg, size_t n)
{
    size_t k = json_is_array(v) ? json_array_size(v) : 1;
    if (!(q->stops = calloc(k ? k : 1, sizeof *q->stops)))
        return snprintf(msg, n, "out of memory"), -1;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(e) || json_string_length(e) == 0 ||
            strlen(json_string_value(e)) != json_string_length(e))
            return snprintf(msg, n, "\"stop\" is not a non-empty string or an array of them"), -1;
        q->stops[i] = json_string_value(e);
    }
    rq->gp.stops = q->stops;
    rq->gp.n_stops = (int)k;
    return 0;
}

static int q_enum(json_t *v, const char *field, const char *const *names, int k, int *out,
                  char *msg, size_t n)
{
    size_t len = (size_t)snprintf(msg, n, "\"%s\" is not ", field);
    for (int i = 0; json_is_string(v) && i < k; i++)
        if (!strcmp(json_string_value(v), names[i]))
            return *out = i, 0;
    for (int i = 0; i < k && len < n; i++)
        len += (size_t)snprintf(msg + len, n - len, "%s%s",
                                i == 0       ? ""
                                : i == k - 1 ? " or "
                                             : ", ",
                                names[i]);
    return -1;
}

/* The blending and generation fields over the defaults. */
static int q_params(json_t *obj, int mode_given, cb_request *rq, char *msg, size_t n)
{
    json_t *v;
    int e;
    if ((v = json_object_get(obj, "mode"))) {
        if (q_enum(v, "mode", cli_mode_names, 4, &e, msg, n))
            return -1;
        rq->bp.mode = (cb_blend_mode)e, mode_given = 1;
    }
    if (!mode_given)
        rq->bp.mode = rq->n_chunks > 0 ? CB_MODE_BLEND
                                       : CB_MODE_FULL; /* nothing to reuse: full, as a lone run */
    if ((v = json_object_get(obj, "strategy"))) {
        if (q_enum(v, "strategy", cli_strategy_names, cli_n_strategies, &e, msg, n))
            return -1;
        rq->bp.strategy = (cb_blend_strategy)e;
    }
    if ((v = json_object_get(obj, "ratio"))) {
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
            rq->ratio_auto = 1;
        } else if (json_is_number(v) && json_number_value(v) >= 0 && json_number_value(v) <= 1) {
            rq->ratio_auto = 0;
            rq->bp.n_ratios = 1;
            rq->bp.ratios[0] = (float)json_number_value(v);
        } else {
            return snprintf(msg, n, "\"ratio\" is not a number in [0, 1] or \"auto\""), -1;
        }
        rq->bp.speedup = 0; /* a ratio as given, or the controller's */
    }
    if ((v = json_object_get(obj, "speedup"))) {
        if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1000))
            return snprintf(msg, n, "\"speedup\" is not a number in [0, 1000]"), -1;
        if (json_object_get(obj, "ratio") && json_number_value(v) > 0)
            return snprintf(msg, n, "\"ratio\" and \"speedup\" exclude each other"), -1;
        rq->bp.speedup = (float)json_number_value(v);
        if (rq->bp.speedup > 0) { /* instead of the options' --ratio, at least min-ratio */
            rq->ratio_auto = 0;
            rq->bp.n_ratios = 1;
            rq->bp.ratios[0] = (float)rq->min_ratio;
        }
    }
    if ((v = json_object_get(obj, "n_predict"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000000)
            return snprintf(msg, n, "\"n_predict\" is not a count"), -1;
        rq->gp.n_predict = (int32_t)json_integer_value(v);
    }
    if (rq->bp.adapt_mass > 0 &&
        ((rq->bp.strategy != CB_STRATEGY_PROBE && rq->bp.strategy != CB_STRATEGY_AUTO) ||
         rq->ratio_auto))
        return snprintf(msg, n, "--tune mass needs the probe strategy and a given ratio"), -1;
    return 0;
}

int cli_question_parse(const char *line, size_t len, const cb_request *defaults, int mode_given,
                       json_t *default_chunks, cli_question *q, cb_request *rq, char *msg, size_t n)
{
    json_error_t jerr;
    json_t *v, *qt, *pt;
    memset(q, 0, sizeof *q);
    *rq = *defaults;
    if (!(q->obj = json_loadb(line, len, 0, &jerr)) || !json_is_object(q->obj)) {
        snprintf(msg, n, "%s", q->obj ? "not a JSON object" : jerr.text);
        json_decref(q->obj), q->obj = NULL;
        return -1;
    }
    qt = json_object_get(q->obj, "question"), pt = json_object_get(q->obj, "prompt");
    if ((qt && pt) || !(qt ? qt : pt) || !json_is_string(qt ? qt : pt))
        return snprintf(msg, n, "give the question as one string, \"question\" or \"prompt\""), -1;
    rq->question = (cb_strview){json_string_value(qt ? qt : pt), json_string_length(qt ? qt : pt)};
    if ((v = json_object_get(q->obj, "system"))) {
        if (!json_is_string(v) && !json_is_null(v))
            return snprintf(msg, n, "\"system\" is not a string"), -1;
        rq->system = json_string_value(v); /* NULL for null: none */
    }
    if ((v = json_object_get(q->obj, "score"))) {
        if (!json_is_string(v))
            return snprintf(msg, n, "\"score\" is not a string"), -1;
        rq->score = (cb_strview){json_string_value(v), json_string_length(v)};
    }
    if ((v = json_object_get(q->obj, "stop")) && q_stops(q, v, rq, msg, n))
        return -1;
    if (q_chunks(q, default_chunks, rq, msg, n))
        return -1;
    return q_params(q->obj, mode_given, rq, msg, n);
}
