/* cb-chunk - split documents into chunks and write one JSON record per chunk.
 *
 *   cb-chunk [-m MODEL] [--tokens N | --chars N] [--overlap N]
 *            [--separator REGEX] [--repair-utf8] [--hidden] PATH...
 *
 * PATH is a file, a directory (walked recursively in byte order of the
 * names), an archive of any format libarchive reads (each member is a
 * document named ARCHIVE!MEMBER; archives inside archives are opened too),
 * or - for stdin.  Records: {id, doc, seq, start, end, n_tokens?, text}.
 * The splitting itself is libcbcore's chunker (lib/kv/chunk.c). */
#include "cli.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Archives nested deeper than this are taken as plain documents. */
#define MAX_DEPTH 8
/* An archive member (or a compressed file's content) is read whole into
 * memory: larger than this is refused, so that a small bomb cannot take
 * the machine's memory (--max-member). */
#define MAX_MEMBER_DEFAULT ((uint64_t)256 << 20)

static void usage(FILE *f)
{
    fprintf(f, "usage: cb-chunk [options] [PATH...]\n"
               "\n"
               "Split documents into chunks and write one JSON record per chunk on stdout:\n"
               "  {\"id\", \"doc\", \"seq\", \"start\", \"end\", \"n_tokens\", \"text\"}\n"
               "id is the XXH3-128 of the text (32 hex digits), doc the source, seq the\n"
               "chunk's number in its document, start/end its byte span, n_tokens its\n"
               "token count (token mode only).\n"
               "\n"
               "PATH is a file, a directory (recursive, sorted by name, hidden entries\n"
               "skipped), an archive (tar, tar.gz/bz2/xz/zst, zip, 7z, cpio, ar, iso, ...,\n"
               "recognised by content; members are documents named ARCHIVE!MEMBER), or -\n"
               "for stdin (the default).  Text must be UTF-8.\n"
               "\n"
               "Splitting:\n"
               "      --tokens N     at most N tokens of the model's tokenizer per chunk\n"
               "                     (default 512).  Token mode is the default whenever a\n"
               "                     model is found: -m, else $CB_MODEL, else the default\n"
               "                     model file if it has been fetched\n"
               "      --chars N      at most N characters (code points) per chunk; forces\n"
               "                     character mode (the default, with N = 2048, when no\n"
               "                     model is found)\n"
               "                     N = 0 means no limit in either mode\n"
               "      --overlap N    start each chunk with the last N tokens (characters) of\n"
               "                     the previous one, from a word start (default 0)\n"
               "      --separator RE also cut at every match of the PCRE2 regex RE (UTF,\n"
               "                     multi-line: ^ and $ match at line ends); the match\n"
               "                     belongs to no chunk; pieces over the limit are split\n"
               "                     further\n"
               "Chunks end at a paragraph break, else a sentence end, else a line break,\n"
               "else a word boundary, else any character boundary; whitespace at cuts\n"
               "belongs to no chunk.\n"
               "\n"
               "Input:\n"
               "      --repair-utf8  replace invalid UTF-8 with U+FFFD (offsets then count\n"
               "                     the repaired text) instead of failing with status 65\n"
               "      --hidden       also walk files and directories whose names start with .\n"
               "      --max-member SIZE\n"
               "                     refuse an archive member (or a compressed file's\n"
               "                     content) that unpacks to more than SIZE bytes (K, M,\n"
               "                     G suffixes; default 256M): it is read whole into\n"
               "                     memory\n"
               "\n"
               "Common:\n"
               "  -m, --model PATH   GGUF model whose tokenizer counts tokens (default:\n"
               "                     $CB_MODEL, else the default model in\n"
               "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/models/)\n"
               "      --store DIR    accepted for uniformity; cb-chunk uses no store\n"
               "  -t, --threads N    accepted for uniformity; cb-chunk runs on one thread\n"
               "  -v, --verbose      report the mode, skipped entries and a summary on stderr\n"
               "  -q, --quiet        print nothing but errors\n"
               "  -h, --help         this help\n"
               "      --version      print the version\n"
               "\n"
               "A bad input is reported and skipped; the others are still chunked.\n"
               "Exit status: 0 success, 64 usage error, 65 bad input data (invalid UTF-8,\n"
               "corrupt archive, malformed model), 66 input missing or unreadable,\n"
               "70 internal error, 74 I/O error.\n");
}

enum {
    OPT_TOKENS = 256,
    OPT_CHARS,
    OPT_OVERLAP,
    OPT_SEPARATOR,
    OPT_REPAIR,
    OPT_HIDDEN,
    OPT_MAX_MEMBER
};

typedef struct ctx {
    cb_chunker *ck;
    int tokens; /* token mode: records carry n_tokens */
    int repair, hidden;
    uint64_t max_member; /* bytes; 0: MAX_MEMBER_DEFAULT */
    int status;          /* exit status of the first failure, 0 when none */
    int fatal;           /* stdout failed: stop */
    size_t n_docs, n_chunks;
    uint64_t n_bytes;
    int progress;
    double t0, t_shown;
    cb_chunks chunks;
} ctx;

/* Directories being walked, innermost first: a symlink back to one of them
 * would be a loop. */
typedef struct dirstack {
    dev_t dev;
    ino_t ino;
    const struct dirstack *up;
} dirstack;

static double now_s(void) { return cb_now_ms() / 1e3; }

static void fail(ctx *x, int code)
{
    if (!x->status)
        x->status = code;
}

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    if (cli_verbosity < 1)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cli_err("%s", buf);
}

static void show_progress(ctx *x, int last)
{
    double t = now_s();
    if (!x->progress || (!last && t - x->t_shown < 0.25))
        return;
    x->t_shown = t;
    if (last)
        fprintf(stderr, "\r\033[K");
    else
        fprintf(stderr, "\r%s: %zu documents, %zu chunks, %.1f MB\033[K", cli_prog, x->n_docs,
                x->n_chunks, (double)x->n_bytes / 1e6);
    fflush(stderr);
}

/* A JSON string of bytes that may not be UTF-8 (a file name): invalid bytes
 * become U+FFFD. */
static json_t *json_name(const char *s)
{
    size_t n = strlen(s), m;
    char *fixed;
    json_t *j;
    if (cb_utf8_check(s, n) == n)
        return json_stringn(s, n);
    if (cb_utf8_repair(s, n, &fixed, &m, NULL) != CB_OK)
        return NULL;
    j = json_stringn(fixed, m);
    free(fixed);
    return j;
}

static int write_record(ctx *x, json_t *doc, const char *text, const cb_chunk *c, size_t seq)
{
    json_t *o = json_object();
    int rc;
    if (!o)
        return -1;
    /* insertion order is output order: the contract's */
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set(o, "doc", doc);
    json_object_set_new(o, "seq", json_integer((json_int_t)seq));
    json_object_set_new(o, "start", json_integer((json_int_t)c->start));
    json_object_set_new(o, "end", json_integer((json_int_t)c->end));
    if (x->tokens)
        json_object_set_new(o, "n_tokens", json_integer(c->n_tokens));
    json_object_set_new(o, "text", json_stringn_nocheck(text + c->start, c->end - c->start));
    rc = json_object_size(o) == (size_t)(x->tokens ? 7 : 6) ? json_dumpf(o, stdout, JSON_COMPACT)
                                                            : -1;
    json_decref(o);
    if (rc == 0 && putchar('\n') == EOF)
        rc = -1;
    return rc;
}

/* Chunk one document and print its records. */
static void chunk_doc(ctx *x, const char *name, const char *data, size_t len)
{
    char *fixed = NULL;
    json_t *jdoc;
    size_t bad;
    cb_status st;

    x->n_docs++;
    x->n_bytes += len;
    if ((bad = cb_utf8_check(data, len)) != len) {
        size_t n_bad = 0;
        if (!x->repair) {
            cli_err("%s: invalid UTF-8 at byte %zu (--repair-utf8 replaces bad bytes with U+FFFD)",
                    name, bad);
            fail(x, CLI_EX_DATAERR);
            return;
        }
        if (cb_utf8_repair(data, len, &fixed, &len, &n_bad) != CB_OK) {
            cli_err("%s: out of memory", name);
            fail(x, CLI_EX_SOFTWARE);
            return;
        }
        cli_info("%s: replaced %zu invalid UTF-8 sequences with U+FFFD (first at byte %zu)", name,
                 n_bad, bad);
        data = fixed;
    }
    x->chunks.n = 0;
    st = cb_chunker_split(x->ck, data, len, &x->chunks);
    if (st != CB_OK) {
        cli_err("%s: chunking failed: %s", name, cb_strerror(st));
        fail(x, cli_exit_code(st) == CLI_EX_USAGE ? CLI_EX_DATAERR : cli_exit_code(st));
        free(fixed);
        return;
    }
    jdoc = json_name(name);
    for (size_t i = 0; i < x->chunks.n && jdoc; i++) {
        if (write_record(x, jdoc, data, &x->chunks.v[i], i) != 0) {
            if (!ferror(stdout)) { /* jansson could not build the record */
                cli_err("%s: out of memory", name);
                fail(x, CLI_EX_SOFTWARE);
            }
            x->fatal = 1;
            break;
        }
    }
    if (!jdoc) {
        cli_err("%s: out of memory", name);
        fail(x, CLI_EX_SOFTWARE);
    }
    json_decref(jdoc);
    x->n_chunks += x->chunks.n;
    if (ferror(stdout))
        x->fatal = 1;
    free(fixed);
    show_progress(x, 0);
}

static struct archive *archive_open(const void *data, size_t size)
{
    struct archive *a = archive_read_new();
    if (!a)
        return NULL;
    archive_read_support_filter_all(a);
    /* Every format of archive_read_support_format_all but mtree, whose
     * bidder takes short text files ("hello\n") for manifests; then raw,
     * which bids last: a plain document, or a single compressed file. */
    archive_read_support_format_7zip(a);
    archive_read_support_format_ar(a);
    archive_read_support_format_cab(a);
    archive_read_support_format_cpio(a);
    archive_read_support_format_iso9660(a);
    archive_read_support_format_lha(a);
    archive_read_support_format_rar(a);
    archive_read_support_format_rar5(a);
    archive_read_support_format_tar(a);
    archive_read_support_format_warc(a);
    archive_read_support_format_xar(a);
    archive_read_support_format_zip(a);
    archive_read_support_format_empty(a);
    archive_read_support_format_raw(a);
    return a;
}

/* Read the current entry's data, at most limit bytes of it, into a
 * malloc'd buffer.  The size an archive claims sizes the first allocation
 * only up to 16 MiB: a small, broken archive may claim any size.  NULL with
 * errno EFBIG when it holds more than limit (nothing past limit + 1 is
 * read), ENOMEM, or 0 for libarchive's error. */
static char *read_entry(struct archive *a, struct archive_entry *e, uint64_t limit, size_t *len)
{
    size_t n = 0, cap = archive_entry_size_is_set(e) && archive_entry_size(e) > 0 &&
                                archive_entry_size(e) < (1 << 24) &&
                                (uint64_t)archive_entry_size(e) <= limit
                            ? (size_t)archive_entry_size(e) + 1
                            : 1 << 16;
    char *buf = malloc(cap);
    errno = ENOMEM;
    while (buf) {
        la_ssize_t r;
        if (n + 1 >= cap) {
            /* grow to at most limit + 2: one byte past the limit tells */
            size_t want = cap * 2 > limit + 2 ? (size_t)limit + 2 : cap * 2;
            char *nb = want > cap ? realloc(buf, want) : NULL;
            if (want <= cap)
                errno = EFBIG;
            if (!nb)
                break;
            buf = nb;
            cap = want;
        }
        r = archive_read_data(a, buf + n, cap - n - 1);
        if (r < 0) {
            free(buf);
            errno = 0;
            return NULL;
        }
        if (r == 0) {
            *len = n;
            return buf;
        }
        n += (size_t)r;
        if (n > limit) {
            free(buf);
            errno = EFBIG;
            return NULL;
        }
    }
    free(buf);
    return NULL;
}

/* The most bytes a member may unpack to (--max-member, else the default). */
static uint64_t member_limit(const ctx *x)
{
    return x->max_member ? x->max_member : MAX_MEMBER_DEFAULT;
}

/* Why read_entry failed, for "NAME: WHY" */
static const char *entry_error(struct archive *a, const ctx *x, char *buf, size_t n)
{
    if (errno == EFBIG) {
        snprintf(buf, n, "unpacks to more than %llu bytes (--max-member): skipped",
                 (unsigned long long)member_limit(x));
        return buf;
    }
    if (errno == ENOMEM)
        return strerror(ENOMEM);
    return archive_error_string(a) ? archive_error_string(a) : "unreadable member";
}

/* A member's name for the doc field: leading "./" and "/" dropped. */
static const char *member_name(struct archive_entry *e)
{
    const char *p = archive_entry_pathname_utf8(e);
    if (!p)
        p = archive_entry_pathname(e);
    if (!p)
        return "";
    for (;;) {
        if (p[0] == '.' && p[1] == '/')
            p += 2;
        else if (p[0] == '/')
            p++;
        else
            return p;
    }
}

/* A document or an archive held in memory. */
static void do_buffer(ctx *x, const char *name, const void *data, size_t size, int depth)
{
    struct archive *a;
    struct archive_entry *e;
    int r;

    if (size == 0 || depth >= MAX_DEPTH) {
        chunk_doc(x, name, data, size);
        return;
    }
    a = archive_open(data, size);
    if (!a) {
        cli_err("%s: cannot read: out of memory", name);
        fail(x, CLI_EX_SOFTWARE);
        return;
    }
    r = archive_read_open_memory(a, data, size);
    if (r == ARCHIVE_OK)
        r = archive_read_next_header(a, &e);
    if (r == ARCHIVE_EOF) {
        /* an archive without members: what nothing but zeros reads as (a
         * tar's end), compressed or not; no documents is no success */
        cli_err("%s: an archive without members (or nothing but zeros): no documents in it", name);
        fail(x, CLI_EX_DATAERR);
        goto done;
    }
    if (r < ARCHIVE_WARN) {
        cli_err("%s: %s", name,
                archive_error_string(a) ? archive_error_string(a) : "unreadable archive");
        fail(x, CLI_EX_DATAERR);
        goto done;
    }
    if ((archive_format(a) & ARCHIVE_FORMAT_BASE_MASK) == ARCHIVE_FORMAT_RAW) {
        size_t n;
        char *buf;
        if (archive_filter_code(a, 0) == ARCHIVE_FILTER_NONE) {
            archive_read_free(a);
            chunk_doc(x, name, data, size);
            return;
        }
        /* one compressed file (notes.txt.gz): the document is what it holds */
        if (!(buf = read_entry(a, e, member_limit(x), &n))) {
            char why[96];
            cli_err("%s: %s", name, entry_error(a, x, why, sizeof why));
            fail(x, CLI_EX_DATAERR);
            goto done;
        }
        do_buffer(x, name, buf, n, depth + 1);
        free(buf);
        goto done;
    }
    for (; r == ARCHIVE_OK || r == ARCHIVE_WARN; r = archive_read_next_header(a, &e)) {
        const char *m = member_name(e);
        char *full, *buf;
        size_t n;
        if (archive_entry_filetype(e) != AE_IFREG || !*m)
            continue;
        if (!(buf = read_entry(a, e, member_limit(x), &n))) {
            char why[96];
            int big = errno == EFBIG;
            cli_err("%s!%s: %s", name, m, entry_error(a, x, why, sizeof why));
            fail(x, CLI_EX_DATAERR);
            if (big)
                continue; /* the next member's header can still be read */
            goto done;
        }
        if (asprintf(&full, "%s!%s", name, m) < 0) {
            free(buf);
            fail(x, CLI_EX_SOFTWARE);
            goto done;
        }
        do_buffer(x, full, buf, n, depth + 1);
        free(full);
        free(buf);
        if (x->fatal)
            goto done;
    }
    if (r != ARCHIVE_EOF) {
        cli_err("%s: %s", name,
                archive_error_string(a) ? archive_error_string(a) : "corrupt archive");
        fail(x, CLI_EX_DATAERR);
    }
done:
    archive_read_free(a);
}

/* Read a stream (stdin, a pipe) entirely. */
static void do_stream(ctx *x, const char *path)
{
    size_t len = 0;
    int code = 0;
    char *buf = cli_read_input(path, &len, &code);
    if (!buf) {
        fail(x, code);
        return;
    }
    do_buffer(x, path, buf, len, 0);
    free(buf);
}

static int cmp_names(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static void do_path(ctx *x, const char *path, int explicit, const dirstack *up);

static void do_dir(ctx *x, const char *path, const dirstack *me)
{
    struct dirent **list = NULL;
    size_t plen = strlen(path);
    int n = scandir(path, &list, NULL, cmp_names);

    if (n < 0) {
        int e = errno;
        cli_err("%s: %s", path, strerror(e));
        fail(x, e == EACCES || e == ENOENT ? CLI_EX_NOINPUT : CLI_EX_IOERR);
        return;
    }
    for (int i = 0; i < n; i++) {
        const char *d = list[i]->d_name;
        char *child;
        if (x->fatal || strcmp(d, ".") == 0 || strcmp(d, "..") == 0)
            goto next;
        if (d[0] == '.' && !x->hidden) {
            cli_info("%s%s%s: hidden, skipped (--hidden walks it)", path,
                     plen && path[plen - 1] == '/' ? "" : "/", d);
            goto next;
        }
        if (asprintf(&child, "%s%s%s", path, plen && path[plen - 1] == '/' ? "" : "/", d) < 0) {
            fail(x, CLI_EX_SOFTWARE);
            goto next;
        }
        do_path(x, child, 0, me);
        free(child);
    next:
        free(list[i]);
    }
    free(list);
}

static void do_path(ctx *x, const char *path, int explicit, const dirstack *up)
{
    struct stat sb;

    if (explicit && strcmp(path, "-") == 0) {
        do_stream(x, "-");
        return;
    }
    if (stat(path, &sb) != 0) {
        int e = errno;
        struct stat lb;
        if (!explicit && lstat(path, &lb) == 0 && S_ISLNK(lb.st_mode)) {
            warn("%s: dangling symbolic link, skipped", path);
            return;
        }
        cli_err("%s: %s", path, strerror(e));
        fail(x, e == ENOENT || e == EACCES || e == ENOTDIR || e == ELOOP ? CLI_EX_NOINPUT
                                                                         : CLI_EX_IOERR);
        return;
    }
    if (S_ISDIR(sb.st_mode)) {
        dirstack me = {sb.st_dev, sb.st_ino, up};
        for (const dirstack *d = up; d; d = d->up) {
            if (d->dev == sb.st_dev && d->ino == sb.st_ino) {
                warn("%s: symbolic link loop, skipped", path);
                return;
            }
        }
        do_dir(x, path, &me);
    } else if (S_ISREG(sb.st_mode)) {
        cb_mmap m;
        cb_error err;
        if (cb_mmap_open(&m, path, &err) != CB_OK) {
            cli_err("%s", err.msg);
            fail(x, cli_exit_code(err.status));
            return;
        }
        do_buffer(x, path, m.data, m.size, 0);
        cb_mmap_close(&m);
    } else if (explicit) {
        do_stream(x, path); /* a pipe, /dev/stdin, a process substitution */
    } else {
        cli_info("%s: not a regular file, skipped", path);
    }
}

static int parse_count(const char *opt, const char *s, int32_t *out)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > 100000000) {
        cli_err("%s: '%s' is not a count in [0, 100000000]", opt, s);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* The tokenizer of the model found by the usual rule, or NULL for
 * character mode.  A model named by -m or $CB_MODEL must load; the default
 * model file is used only when it exists. */
static int load_vocab(const char *opt_model, int need, cb_vocab **out, const char **used)
{
    const char *env = getenv("CB_MODEL");
    const char *path = opt_model && *opt_model ? opt_model : env && *env ? env : NULL;
    cb_gguf *g = NULL;
    cb_error err;
    cb_status st;

    *out = NULL;
    if (!path) {
        const char *def = cli_model_path(NULL);
        if (access(def, F_OK) != 0) {
            if (need) {
                cli_err(
                    "--tokens needs a model: give -m or $CB_MODEL, or fetch the default one with "
                    "'make model' (%s is missing)",
                    def);
                return CLI_EX_NOINPUT;
            }
            cli_info("no model (%s is missing): chunking by characters", def);
            return 0;
        }
        path = def;
    }
    if ((st = cb_gguf_open(&g, path, &err)) == CB_OK)
        st = cb_vocab_load(out, g, &err);
    cb_gguf_free(g);
    if (st != CB_OK) {
        cli_err("%s", err.msg);
        return cli_exit_code(st);
    }
    *used = path;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokens", required_argument, 0, OPT_TOKENS},
        {"chars", required_argument, 0, OPT_CHARS},
        {"overlap", required_argument, 0, OPT_OVERLAP},
        {"separator", required_argument, 0, OPT_SEPARATOR},
        {"repair-utf8", no_argument, 0, OPT_REPAIR},
        {"hidden", no_argument, 0, OPT_HIDDEN},
        {"max-member", required_argument, 0, OPT_MAX_MEMBER},
        CLI_COMMON_OPTS,
        CLI_STORE_OPT, /* taken for symmetry with the other programs; unused */
        {0, 0, 0, 0},
    };
    const char *separator = NULL, *model_used = NULL;
    int32_t n_tokens = -1, n_chars = -1, overlap = 0;
    cli_common co = {0};
    cb_vocab *vocab = NULL;
    cb_chunker_params cp = {0};
    cb_error err;
    ctx x = {0};
    int c, code;

    cli_prog = "cb-chunk";
    cli_trap_sigbus();
    while ((c = cli_getopt(argc, argv, CLI_COMMON_SHORT, opts)) != -1) {
        if ((code = cli_common_opt(&co, c, optarg, usage)) != CLI_NOT_COMMON) {
            if (code != CLI_CONTINUE)
                return code;
            continue;
        }
        switch (c) {
        case OPT_TOKENS:
            if (parse_count("--tokens", optarg, &n_tokens))
                return CLI_EX_USAGE;
            break;
        case OPT_CHARS:
            if (parse_count("--chars", optarg, &n_chars))
                return CLI_EX_USAGE;
            break;
        case OPT_OVERLAP:
            if (parse_count("--overlap", optarg, &overlap))
                return CLI_EX_USAGE;
            break;
        case OPT_SEPARATOR: separator = optarg; break;
        case OPT_REPAIR: x.repair = 1; break;
        case OPT_HIDDEN: x.hidden = 1; break;
        case OPT_MAX_MEMBER:
            if (cli_parse_size(optarg, &x.max_member) != 0) {
                cli_err("--max-member: '%s' is not a size (e.g. 64M, 2G)", optarg);
                return CLI_EX_USAGE;
            }
            break;
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    if (n_tokens >= 0 && n_chars >= 0) {
        cli_err("--tokens and --chars exclude each other");
        return CLI_EX_USAGE;
    }
    if (n_chars < 0 && (code = load_vocab(co.model, n_tokens >= 0, &vocab, &model_used)) != 0)
        return code;
    cp.vocab = vocab;
    cp.max = vocab ? (n_tokens >= 0 ? n_tokens : CB_CHUNK_DEFAULT_TOKENS)
                   : (n_chars >= 0 ? n_chars : CB_CHUNK_DEFAULT_CHARS);
    cp.overlap = overlap;
    cp.separator = separator;
    if (cb_chunker_new(&x.ck, &cp, &err) != CB_OK) {
        cli_err("%s", err.msg);
        cb_vocab_free(vocab);
        return err.status == CB_ERR_INVALID ? CLI_EX_USAGE : cli_exit_code(err.status);
    }
    x.tokens = vocab != NULL;
    if (cp.max == 0) /* --tokens 0 or --chars 0 */
        cli_info("chunking by %s%s, no size limit: each document (or separator piece) is one chunk",
                 vocab ? "tokens of " : "characters", vocab ? model_used : "");
    else if (vocab)
        cli_info("chunking by tokens of %s, at most %d per chunk", model_used, (int)cp.max);
    else
        cli_info("chunking by characters, at most %d per chunk", (int)cp.max);
    x.progress = cli_verbosity >= 1 && isatty(2);
    x.t0 = x.t_shown = now_s();

    if (optind >= argc)
        do_path(&x, "-", 1, NULL);
    for (int i = optind; i < argc && !x.fatal; i++)
        do_path(&x, argv[i], 1, NULL);
    show_progress(&x, 1);
    if (!x.fatal) {
        double dt = now_s() - x.t0;
        char size[32], rate[48] = "";
        if (dt >= 0.1) /* a rate over less is noise */
            snprintf(rate, sizeof rate, " (%.2f MB/s)", (double)x.n_bytes / 1e6 / dt);
        cli_info("%zu %s, %zu %s, %s in %.*f %s%s", x.n_docs,
                 cli_plural(x.n_docs, "document", "documents"), x.n_chunks,
                 cli_plural(x.n_chunks, "chunk", "chunks"),
                 cli_bytes((uint64_t)x.n_bytes, size, sizeof size), dt < 1 ? 0 : 2,
                 dt < 1 ? dt * 1e3 : dt, dt < 1 ? "ms" : "s", rate);
    }
    cb_chunks_free(&x.chunks);
    cb_chunker_free(x.ck);
    cb_vocab_free(vocab);
    code = cli_finish(x.status);
    if (x.fatal && code == 0)
        code = CLI_EX_IOERR;
    return code;
}
