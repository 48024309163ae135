/* cb-store - the tiered store of KV files.
 *
 *   cb-store [--store DIR] COMMAND [ARGS]
 *     init [--tier NAME=PATH[:CAPACITY]]... [--promote N] [--timeout MS]
 *          [--auth-file FILE] [--key-file FILE]     keygen FILE
 *     ls [--json] [-m MODEL] [--tier NAME]     stat [--json] [--project N]
 *     get KEY [-o FILE]     put FILE...     rm KEY...     pin KEY...     unpin KEY...
 *     gc     verify [--repair]     recode --kv-type T [--tier NAME]
 *     export ARCHIVE [KEY...]     import ARCHIVE
 *
 * The work is done by libcbcore (cb_store_*); this file parses the command
 * line, prints, and runs the commands that read or set up a store;
 * store-maint.c has those that rewrite or move its entries. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: cb-store [--store DIR] COMMAND [ARGS]\n"
               "\n"
               "Commands:\n"
               "  init [--tier NAME=PATH[:CAPACITY]]... [--cost NAME=C]... [--promote N]\n"
               "       [--timeout MS]\n"
               "                     create a store (the other commands need one); tiers\n"
               "                     fastest first (default: one tier 'main' in\n"
               "                     DIR/tiers/main, unlimited); CAPACITY takes K, M, G, T\n"
               "                     suffixes (powers of 1024); --cost: a tier's relative\n"
               "                     cost per byte, for place (default: fastest dearest);\n"
               "                     --promote N moves an entry to a faster tier on its Nth and\n"
               "                     later gets (default 2, 0 = never)\n"
               "                     a last tier NAME=redis://HOST:PORT[/DB][:CAPACITY] or\n"
               "                     NAME=unix:///PATH.sock[:CAPACITY] is shared on Redis by\n"
               "                     every store made with it (local tiers cache it); --timeout:\n"
               "                     its connect and request time-out (default 1000 ms;\n"
               "                     $CB_STORE_TIMEOUT_MS overrides it)\n"
               "       [--auth-file FILE] [--key-file FILE]\n"
               "                     the shared tier's secrets, kept in files only their\n"
               "                     owner may read (mode 0600; store.json records their\n"
               "                     names): --auth-file, one line PASSWORD or USER PASSWORD\n"
               "                     to log in to Redis ($CB_REDIS_AUTH_FILE overrides it);\n"
               "                     --key-file, a tier key: entries are written encrypted\n"
               "                     (AES-256-GCM), read only when each part's tag verifies\n"
               "                     ($CB_TIER_KEY_FILE overrides it)\n"
               "  keygen FILE        make a tier key: 32 random bytes, mode 0600 (never over\n"
               "                     an existing file); copy it to every host of the tier\n"
               "  ls [--json] [-m MODEL] [--tier NAME]\n"
               "                     list entries: key, tier, bytes, hits, last use, pin;\n"
               "                     MODEL is a GGUF file or a 32-hex-digit fingerprint\n"
               "  stat [--json] [--project N]\n"
               "                     per tier: entries, bytes, capacity, hits and hit rate;\n"
               "                     the shared tier's login and whether it is authenticated;\n"
               "                     per model and KV element type: entries, tokens, bytes,\n"
               "                     bytes per token; --project N: the bytes N tokens would take\n"
               "                     at those bytes per token (N with k, M, G: powers of 1000)\n"
               "  get KEY [-o FILE]  print the entry's path, or copy it to FILE ('-' = stdout)\n"
               "  put FILE...        verify KV files and add them; prints each one's key\n"
               "  rm KEY...          remove entries\n"
               "  pin KEY...         keep entries where they are: never demoted or evicted\n"
               "  unpin KEY...       undo pin\n"
               "  gc                 enforce capacities; remove orphans and stale temporary\n"
               "                     files\n"
               "  verify [--repair]  check every file and the index; exit 0 only when\n"
               "                     consistent; --repair rebuilds the index from the files\n"
               "  recode --kv-type T [--tier NAME]\n"
               "                     rewrite the entries of the local tiers (or of tier NAME) in\n"
               "                     element type T (f16, f32, bf16, q8_0, kivi4, coded),\n"
               "                     atomically;\n"
               "                     entries of type T already are skipped: a rerun resumes\n"
               "  export ARCHIVE [KEY...] [--compress zstd|gzip|xz|none]\n"
               "                     write entries (default all) to a tar archive ('-':\n"
               "                     stdout); compression from the name (.tar, .tar.gz,\n"
               "                     .tar.xz), else zstd\n"
               "  import ARCHIVE     add the valid KV files of an archive ('-' = stdin)\n"
               "  place [-m MODEL] [--ratio R] [--tokens L] [--device DEV] [--json]\n"
               "                     the cheapest tier whose load time for L cached tokens\n"
               "                     (default 3072) does not exceed the recompute time at ratio\n"
               "                     R (default 0.15), from the store's profile (see cb-profile)\n"
               "                     for the device cb-run computes on: cpu, or cuda (default:\n"
               "                     the cuda profile when the store has one, else the cpu one)\n"
               "\n"
               "Common:\n"
               "      --store DIR    the store (default: $CB_STORE, else\n"
               "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/store)\n"
               "  -m, --model PATH   ls: only entries of this model\n"
               "  -t, --threads N    accepted for compatibility; unused\n"
               "  -v, --verbose      report what gc, verify, put and import did on stderr\n"
               "  -q, --quiet        print nothing but errors\n"
               "  -h, --help         this help\n"
               "      --version      print the version\n"
               "\n"
               "Exit status: 0 success, 64 usage error, 65 bad data (a file that is not a valid\n"
               "KV file, an inconsistent store, a secret file others may read), 66 missing\n"
               "input (no store, no such key or file), 70 internal error, 73 cannot create\n"
               "output (or no tier has room), 74 I/O error (the shared tier cannot be reached,\n"
               "or refuses the login).\n");
}

enum {
    OPT_JSON = 256,
    OPT_TIER,
    OPT_PROMOTE,
    OPT_REPAIR,
    OPT_COST,
    OPT_RATIO,
    OPT_TOKENS,
    OPT_DEVICE, /* given[] index of --device (CLI_OPT_DEVICE) */
    OPT_COMPRESS,
    OPT_TIMEOUT,
    OPT_AUTH_FILE,
    OPT_KEY_FILE,
    OPT_PROJECT,
    OPT_KV_TYPE
};


/* ------------------------------------------------------------ helpers */

static const char *human(uint64_t n, char buf[24])
{
    static const char suf[] = "BKMGTP";
    double v = (double)n;
    int i = 0;
    while (v >= 1024 && i < 5) {
        v /= 1024;
        i++;
    }
    if (i == 0)
        snprintf(buf, 24, "%lluB", (unsigned long long)n);
    else
        snprintf(buf, 24, "%.1f%c", v, suf[i]);
    return buf;
}

static const char *when(int64_t us, char buf[32])
{
    time_t t = (time_t)(us / 1000000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, 32, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

int cs_fail(cb_error *err)
{
    cli_err("%s", err->msg);
    return cli_exit_code(err->status);
}

/* Said once, when a store turns out read-only. */
void cs_readonly_note(const opts *o, const cb_store *s)
{
    if (cb_store_readonly(s))
        cli_err(
            "note: the store %s is read-only: nothing in it is changed, accesses are not recorded",
            o->store);
}

void cs_warn(void *ctx, const char *msg)
{
    (void)ctx;
    cli_err("warning: %s", msg);
}

/* Open the store; only init creates one (a missing store is 66). */
int cs_open_store(const opts *o, cb_store **s)
{
    cb_error err;
    if (cb_store_open(s, o->store, 0, &err) != CB_OK)
        return cs_fail(&err);
    cs_readonly_note(o, *s);
    cb_store_set_warn(*s, cs_warn, NULL);
    return 0;
}

int cs_need_args(const opts *o, const char *cmd, int lo, int hi)
{
    if (o->n_args < lo || (hi >= 0 && o->n_args > hi)) {
        cli_err("%s: %s", cmd,
                o->n_args < lo ? "missing argument (see cb-store --help)"
                               : "too many arguments (see cb-store --help)");
        return CLI_EX_USAGE;
    }
    return 0;
}

/* ---------------------------------------------------------------- init */

/* NAME=redis://HOST[:PORT][/DB][:CAPACITY] (the capacity after a port) or
 * NAME=unix:///PATH[:CAPACITY]: the shared tier. */
static int shared_spec(const char *spec, const char *eq, cb_store_tier *t, char **buf)
{
    size_t nl = (size_t)(eq - spec);
    const char *p = eq + 1, *colon = strrchr(p, ':');
    const char *after = p + (p[0] == 'r' ? 8 : 7);
    int colons = 0;
    for (const char *c = after; *c; c++)
        colons += *c == ':';
    uint64_t cap = 0;
    size_t ulen = strlen(p);
    if (colon && colon >= after && (p[0] == 'u' || colons == 2)) {
        if (cli_parse_size(colon + 1, &cap) != 0) {
            cli_err("--tier %s: '%s' is not a capacity (a number with K, M, G or T)", spec,
                    colon + 1);
            return CLI_EX_USAGE;
        }
        ulen = (size_t)(colon - p);
    }
    if (!(*buf = malloc(nl + ulen + 2))) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    snprintf(*buf, nl + 1, "%s", spec);
    snprintf(*buf + nl + 1, ulen + 1, "%s", p);
    t->name = *buf;
    t->path = NULL;
    t->url = *buf + nl + 1;
    t->capacity = cap;
    t->cost = 0;
    t->timeout_ms = 0;
    return 0;
}

/* A file name made absolute against the current directory (malloc'd). */
static char *abs_name(const char *p)
{
    char cwd[PATH_MAX];
    char *r = NULL;
    if (p[0] == '/')
        r = strdup(p);
    else if (getcwd(cwd, sizeof cwd) && asprintf(&r, "%s/%s", cwd, p) < 0)
        r = NULL;
    if (!r)
        cli_err("%s: cannot make the name absolute: %s", p, strerror(errno));
    return r;
}

static int cmd_init(const opts *o)
{
    cb_store_tier t[CB_STORE_MAX_TIERS];
    char *bufs[CB_STORE_MAX_TIERS] = {0};
    char *auth = NULL, *key = NULL;
    cb_error err;
    int code = 0;

    if ((code = cs_need_args(o, "init", 0, 0)) != 0)
        return code;
    if (o->n_tiers > CB_STORE_MAX_TIERS) {
        cli_err("init: at most %d tiers", CB_STORE_MAX_TIERS);
        return CLI_EX_USAGE;
    }
    for (int i = 0; i < o->n_tiers; i++) {
        const char *spec = o->tiers[i];
        const char *eq = strchr(spec, '=');
        if (!eq || eq == spec || !eq[1]) {
            cli_err("--tier %s: use NAME=PATH[:CAPACITY]", spec);
            code = CLI_EX_USAGE;
            goto done;
        }
        char cwd[PATH_MAX];
        const char *p = eq + 1;
        size_t plen = strlen(p);
        uint64_t cap = 0;
        if (!strncmp(p, "redis://", 8) || !strncmp(p, "unix://", 7)) {
            if ((code = shared_spec(spec, eq, &t[i], &bufs[i])) != 0)
                goto done;
            continue;
        }
        const char *colon = strrchr(p, ':');
        if (colon && cli_parse_size(colon + 1, &cap) == 0)
            plen = (size_t)(colon - p);
        else if (colon && colon[1] && strchr(colon + 1, '/') == NULL) {
            cli_err("--tier %s: '%s' is not a capacity (a number with K, M, G or T)", spec,
                    colon + 1);
            code = CLI_EX_USAGE;
            goto done;
        }
        if (plen == 0) {
            cli_err("--tier %s: no directory", spec);
            code = CLI_EX_USAGE;
            goto done;
        }
        /* Relative to the current directory, as the user means it; the
         * library would take it as relative to the store. */
        if (p[0] != '/' && !getcwd(cwd, sizeof cwd)) {
            cli_err("getcwd: %s", strerror(errno));
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        size_t n = (size_t)(eq - spec) + plen + PATH_MAX + 4;
        if (!(bufs[i] = malloc(n))) {
            cli_err("out of memory");
            code = CLI_EX_SOFTWARE;
            goto done;
        }
        int nl = (int)(eq - spec);
        snprintf(bufs[i], n, "%.*s", nl, spec);
        char *path = bufs[i] + nl + 1;
        if (p[0] == '/')
            snprintf(path, n - (size_t)nl - 1, "%.*s", (int)plen, p);
        else
            snprintf(path, n - (size_t)nl - 1, "%s/%.*s", cwd, (int)plen, p);
        t[i].name = bufs[i];
        t[i].path = path;
        t[i].capacity = cap;
        t[i].cost = 0;
        t[i].url = NULL;
        t[i].timeout_ms = 0;
    }
    for (int c = 0; c < o->n_costs; c++) {
        const char *spec = o->costs[c], *eq = strchr(spec, '=');
        char *end = NULL;
        double v = eq ? strtod(eq + 1, &end) : -1;
        int found = 0;
        if (!eq || !end || *end || end == eq + 1 || v <= 0) {
            cli_err("--cost %s: use NAME=COST with a cost > 0", spec);
            code = CLI_EX_USAGE;
            goto done;
        }
        for (int i = 0; i < o->n_tiers; i++)
            if (strlen(t[i].name) == (size_t)(eq - spec) &&
                !strncmp(t[i].name, spec, (size_t)(eq - spec)))
                t[i].cost = v, found = 1;
        if (!found) {
            cli_err("--cost %s: no tier of that name in --tier", spec);
            code = CLI_EX_USAGE;
            goto done;
        }
    }
    /* the secrets' file names, absolute (cb-run runs anywhere); never their contents */
    if ((o->auth_file && !(auth = abs_name(o->auth_file))) ||
        (o->key_file && !(key = abs_name(o->key_file)))) {
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    int have_shared = 0;
    for (int i = 0; i < o->n_tiers; i++)
        if (t[i].url) {
            t[i].timeout_ms = o->timeout_ms;
            t[i].auth_file = auth;
            t[i].key_file = key;
            have_shared = 1;
        } else {
            t[i].auth_file = t[i].key_file = NULL;
        }
    if ((auth || key) && !have_shared) {
        cli_err(
            "init: --auth-file and --key-file are for a shared tier (--tier NAME=redis://... or unix://...)");
        code = CLI_EX_USAGE;
        goto done;
    }
    if (cb_store_init(o->store, o->n_tiers ? t : NULL, o->n_tiers, o->promote, &err) != CB_OK) {
        code = cs_fail(&err);
        goto done;
    }
    cli_info("initialised %s", o->store);
done:
    for (int i = 0; i < CB_STORE_MAX_TIERS; i++)
        free(bufs[i]);
    free(auth);
    free(key);
    return code;
}

static int cmd_keygen(const opts *o)
{
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "keygen", 1, 1)) != 0)
        return code;
    if (cb_store_keygen(o->args[0], &err) != CB_OK)
        return cs_fail(&err);
    cli_info("keygen: a tier key in %s (mode 0600): give it to every host of the shared tier with "
             "cb-store init --key-file, or $CB_TIER_KEY_FILE",
             o->args[0]);
    return 0;
}

/* ------------------------------------------------------------- ls, stat */

static int ls_text(void *ctx, const cb_store_entry *e)
{
    char b[32];
    printf("%s  %-8s %12llu %6llu  %s%s\n", e->key, e->tier, (unsigned long long)e->bytes,
           (unsigned long long)e->hits, when(e->last_access_us, b), e->pinned ? "  pinned" : "");
    (void)ctx;
    return ferror(stdout) != 0;
}

static int ls_json(void *ctx, const cb_store_entry *e)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:I, s:f, s:f, s:I, s:s, s:b, s:s}", "key", e->key,
                          "model", e->model, "tier", e->tier, "bytes", (json_int_t)e->bytes,
                          "n_tokens", (json_int_t)e->n_tokens, "created", e->created_us / 1e6,
                          "last_access", e->last_access_us / 1e6, "hits", (json_int_t)e->hits,
                          "checksum", e->checksum, "pinned", e->pinned, "path", e->path);
    int *bad = ctx;
    if (!j || json_dumpf(j, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0) {
        *bad = 1;
        json_decref(j);
        return 1;
    }
    json_decref(j);
    putchar('\n');
    return ferror(stdout) != 0;
}

/* -m for ls: a fingerprint, or a GGUF file whose fingerprint is computed. */
static int model_filter(const char *m, char hex[33])
{
    cb_hash128 h;
    cb_gguf *g = NULL;
    cb_error err;
    if (strlen(m) == 32 && cb_hash128_parse(m, &h) == CB_OK) {
        cb_hash128_hex(h, hex);
        return 0;
    }
    if (cb_gguf_open(&g, m, &err) != CB_OK)
        return cs_fail(&err);
    cb_status st = cb_gguf_fingerprint(g, &h);
    cb_gguf_free(g);
    if (st != CB_OK) {
        cli_err("%s: fingerprint: %s", m, cb_strerror(st));
        return cli_exit_code(st);
    }
    cb_hash128_hex(h, hex);
    return 0;
}

static int cmd_ls(const opts *o)
{
    cb_store *s = NULL;
    cb_error err;
    char hex[33];
    int code, bad = 0;
    if ((code = cs_need_args(o, "ls", 0, 0)) != 0)
        return code;
    if (o->n_tiers > 1) {
        cli_err("ls: one --tier at most");
        return CLI_EX_USAGE;
    }
    if (o->model && (code = model_filter(o->model, hex)) != 0)
        return code;
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    if (cb_store_list(s, o->model ? hex : NULL, o->n_tiers ? o->tiers[0] : NULL,
                      o->json ? ls_json : ls_text, &bad, &err) != CB_OK)
        code =
            err.status == CB_ERR_INVALID ? (cli_err("%s", err.msg), CLI_EX_USAGE) : cs_fail(&err);
    else if (bad)
        code = CLI_EX_SOFTWARE;
    cb_store_close(s);
    return code;
}

/* A type's name in stat's output ("unreadable": entries whose header cannot be read). */
static const char *kv_type_name(int t)
{
    const char *n = t >= 0 ? cb_type_name((cb_type)t) : NULL;
    return n ? n : "unreadable";
}

/* stat's figures per model and element type: a JSON array, or a table. */
static json_t *kv_json(const opts *o, const cb_store_kv_stat *kv, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) {
        double bpt = kv[i].tokens ? (double)kv[i].bytes / (double)kv[i].tokens : 0.0;
        json_t *e = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f}", "model", kv[i].model, "type",
                              kv_type_name(kv[i].type), "entries", (json_int_t)kv[i].entries,
                              "tokens", (json_int_t)kv[i].tokens, "bytes", (json_int_t)kv[i].bytes,
                              "bytes_per_token", bpt);
        if (e && o->project > 0 && kv[i].tokens)
            json_object_set_new(e, "projected_bytes",
                                json_integer((json_int_t)llround(bpt * o->project)));
        json_array_append_new(a, e);
    }
    return a;
}

static void kv_table(const opts *o, const cb_store_kv_stat *kv, size_t n)
{
    char a[24], b[24], col[40];
    if (n == 0)
        return;
    putchar('\n');
    snprintf(col, sizeof col, "FOR %s TOKENS", o->project_arg ? o->project_arg : "");
    printf("%-32s %-10s %8s %10s %10s %12s%s%s\n", "MODEL", "TYPE", "ENTRIES", "TOKENS", "BYTES",
           "BYTES/TOKEN", o->project > 0 ? "  " : "", o->project > 0 ? col : "");
    for (size_t i = 0; i < n; i++) {
        double bpt = kv[i].tokens ? (double)kv[i].bytes / (double)kv[i].tokens : 0.0;
        printf("%-32s %-10s %8llu %10llu %10s %12.1f", kv[i].model, kv_type_name(kv[i].type),
               (unsigned long long)kv[i].entries, (unsigned long long)kv[i].tokens,
               human(kv[i].bytes, a), bpt);
        if (o->project > 0)
            printf("  %*s", (int)strlen(col),
                   kv[i].tokens ? human((uint64_t)llround(bpt * o->project), b) : "-");
        putchar('\n');
    }
}

static int cmd_stat(const opts *o)
{
    cb_store *s = NULL;
    cb_store_tier_stat st[CB_STORE_MAX_TIERS + 1];
    cb_store_kv_stat *kv = NULL;
    size_t n_kv = 0;
    uint64_t misses = 0, hits = 0;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "stat", 0, 0)) != 0)
        return code;
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    int n = cb_store_n_tiers(s);
    if (cb_store_stat(s, st, &misses, &err) != CB_OK ||
        cb_store_stat_kv(s, &kv, &n_kv, &err) != CB_OK) {
        code = cs_fail(&err);
        goto done;
    }
    for (int i = 0; i < n; i++)
        hits += st[i].hits;
    uint64_t gets = hits + misses;
    cb_store_shared_auth sa;
    cb_error serr;
    /* the shared tier first: how the login went is known after it */
    int have_shared = cb_store_shared_stat(s, &st[n], &serr) == CB_OK;
    int have_sa = cb_store_shared_name(s) && cb_store_shared_auth_info(s, &sa, &err) == CB_OK;
    if (cb_store_shared_name(s) && !have_sa)
        cli_err("warning: %s", err.msg);
    if (have_shared)
        n++; /* the shared tier; its hits are in each entry (ls) */
    else if (serr.status != CB_ERR_NOT_FOUND && have_sa)
        cli_err("warning: %s", serr.msg);
    if (o->json) {
        json_t *tiers = json_array(), *root;
        for (int i = 0; i < n; i++)
            json_array_append_new(
                tiers,
                json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "name", st[i].name,
                          "path", st[i].path, "entries", (json_int_t)st[i].entries, "bytes",
                          (json_int_t)st[i].bytes, "capacity", (json_int_t)st[i].capacity,
                          "reserved", (json_int_t)st[i].reserved, "pinned",
                          (json_int_t)st[i].pinned, "hits", (json_int_t)st[i].hits, "hit_rate",
                          gets ? (double)st[i].hits / (double)gets : 0.0));
        root = json_pack("{s:s, s:i, s:o, s:I, s:I, s:I, s:f, s:o}", "store", cb_store_dir(s),
                         "promote_hits", cb_store_promote_hits(s), "tiers", tiers, "gets",
                         (json_int_t)gets, "hits", (json_int_t)hits, "misses", (json_int_t)misses,
                         "hit_rate", gets ? (double)hits / (double)gets : 0.0, "kv",
                         kv_json(o, kv, n_kv));
        if (root && o->project > 0)
            json_object_set_new(root, "project_tokens",
                                json_integer((json_int_t)llround(o->project)));
        if (root && have_sa)
            json_object_set_new(
                root, "shared_auth",
                json_pack("{s:s, s:b, s:s?, s:s?, s:b, s:b, s:b}", "tier", cb_store_shared_name(s),
                          "authenticated", sa.authenticated, "key_id",
                          sa.authenticated ? sa.key_id : NULL, "user", sa.user[0] ? sa.user : NULL,
                          "password", sa.password, "read_only", sa.read_only, "login_refused",
                          sa.login_refused));
        if (!root || json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
            code = CLI_EX_SOFTWARE;
        putchar('\n');
        json_decref(root);
    } else {
        char a[24], b[24];
        printf("%-10s %8s %10s %10s %6s %8s %8s  %s\n", "TIER", "ENTRIES", "BYTES", "CAPACITY",
               "USED", "HITS", "HIT-RATE", "PATH");
        for (int i = 0; i < n; i++) {
            char used[16];
            if (st[i].capacity)
                snprintf(used, sizeof used, "%.1f%%",
                         100.0 * (double)(st[i].bytes + st[i].reserved) / (double)st[i].capacity);
            else
                snprintf(used, sizeof used, "-");
            printf("%-10s %8llu %10s %10s %6s %8llu %7.1f%%  %s\n", st[i].name,
                   (unsigned long long)st[i].entries, human(st[i].bytes, a),
                   st[i].capacity ? human(st[i].capacity, b) : "unlimited", used,
                   (unsigned long long)st[i].hits,
                   gets ? 100.0 * (double)st[i].hits / (double)gets : 0.0, st[i].path);
        }
        printf("gets %llu, hits %llu, misses %llu, hit rate %.1f%%\n", (unsigned long long)gets,
               (unsigned long long)hits, (unsigned long long)misses,
               gets ? 100.0 * (double)hits / (double)gets : 0.0);
        if (have_sa) {
            printf("shared tier %s: login %s%s%s%s\n", cb_store_shared_name(s),
                   sa.password ? "with a password" : "without a password",
                   sa.user[0] ? " as user " : "", sa.user,
                   sa.login_refused ? " (refused by the server: the tier is not used)"
                   : sa.read_only   ? " (read-only: the server refused this user a write)"
                                    : "");
            if (sa.login_refused)
                ; /* nothing is read or written: no entry is authenticated */
            else if (sa.authenticated)
                printf(
                    "shared tier %s: authenticated: entries are encrypted with AES-256-GCM, a tag per part (tier "
                    "key %s), and a part whose tag does not verify is never used\n",
                    cb_store_shared_name(s), sa.key_id);
            else
                printf(
                    "shared tier %s: unauthenticated: no tier key (cb-store keygen, init --key-file): whoever "
                    "can write to Redis can plant entries, and whoever can read it reads them\n",
                    cb_store_shared_name(s));
        }
        kv_table(o, kv, n_kv);
    }
    if (o->project > 0 && n_kv == 0)
        cli_err("stat: --project: the local tiers hold no entry to measure bytes per token by");
done:
    free(kv);
    cb_store_close(s);
    return code;
}

/* ----------------------------------------------------------------- get */

static int copy_out(const char *src, const char *dst)
{
    cb_mmap m;
    cb_error err;
    if (cb_mmap_open(&m, src, &err) != CB_OK)
        return cs_fail(&err);
    int code = 0;
    if (strcmp(dst, "-") == 0) {
        if (m.size && fwrite(m.data, 1, m.size, stdout) != m.size) {
            cli_err("writing to standard output: %s", strerror(errno));
            code = CLI_EX_IOERR;
        }
    } else if (cb_file_write_atomic(dst, m.data, m.size, &err) != CB_OK) {
        code = cs_fail(&err);
    }
    cb_mmap_close(&m);
    return code;
}

static int cmd_get(const opts *o)
{
    cb_store *s = NULL;
    cb_store_ref *ref = NULL;
    const char *path;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "get", 1, 1)) != 0)
        return code;
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    if (cb_store_acquire(s, o->args[0], &ref, &path, &err) != CB_OK)
        code = cs_fail(&err);
    else if (o->out)
        code = copy_out(path, o->out);
    else
        printf("%s\n", path);
    cb_store_release(ref);
    cb_store_close(s);
    return code;
}

/* ----------------------------------------------------------------- put */

static int cmd_put(const opts *o)
{
    cb_store *s = NULL;
    cb_error err;
    int code, worst = 0;
    if ((code = cs_need_args(o, "put", 1, -1)) != 0)
        return code;
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    for (int i = 0; i < o->n_args; i++) {
        const char *f = o->args[i];
        char key[66];
        int existed = 0;
        cb_status st;
        st = cb_store_put_file(s, f, key, &existed, &err);
        if (st != CB_OK) {
            code = cs_fail(&err);
            worst = worst ? worst : code;
            continue;
        }
        printf("%s\n", key);
        cli_info("%s: %s %s", f, existed ? "already stored as" : "stored as", key);
    }
    cb_store_close(s);
    return worst;
}

/* ------------------------------------------------------- rm, pin, unpin */

static int cmd_keys(const opts *o, const char *cmd)
{
    cb_store *s = NULL;
    cb_error err;
    int code, worst = 0;
    if ((code = cs_need_args(o, cmd, 1, -1)) != 0)
        return code;
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    for (int i = 0; i < o->n_args; i++) {
        cb_status st = strcmp(cmd, "rm") == 0    ? cb_store_remove(s, o->args[i], &err)
                       : strcmp(cmd, "pin") == 0 ? cb_store_pin(s, o->args[i], 1, &err)
                                                 : cb_store_pin(s, o->args[i], 0, &err);
        if (st != CB_OK) {
            code = cs_fail(&err);
            worst = worst ? worst : code;
        }
    }
    cb_store_close(s);
    return worst;
}

/* ---------------------------------------------------------------- main */

/* --project's token count: a number >= 1, with k, M, G or T (powers of
 * 1000); 0, or -1 after saying why. */
static int parse_tokens(const char *arg, double *out)
{
    static const char suf[] = "kMGT";
    char *end;
    double v = strtod(arg, &end);
    const char *p = *end ? strchr(suf, *end == 'K' ? 'k' : *end) : NULL;
    if (p && end[1] == 0)
        v *= pow(1000, (double)(p - suf + 1));
    if (end == arg || (*end && (!p || end[1])) || !(v >= 1) || v > 1e18) {
        cli_err("--project: '%s' is not a token count (a number, with k, M, G or T)", arg);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        CLI_COMMON_OPTS,
        CLI_STORE_OPT,
        CLI_DEVICE_OPT,
        {"json", no_argument, 0, OPT_JSON},
        {"tier", required_argument, 0, OPT_TIER},
        {"promote", required_argument, 0, OPT_PROMOTE},
        {"output", required_argument, 0, 'o'},
        {"repair", no_argument, 0, OPT_REPAIR},
        {"compress", required_argument, 0, OPT_COMPRESS},
        {"cost", required_argument, 0, OPT_COST},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"auth-file", required_argument, 0, OPT_AUTH_FILE},
        {"key-file", required_argument, 0, OPT_KEY_FILE},
        {"ratio", required_argument, 0, OPT_RATIO},
        {"tokens", required_argument, 0, OPT_TOKENS},
        {"project", required_argument, 0, OPT_PROJECT},
        {"kv-type", required_argument, 0, OPT_KV_TYPE},
        {0, 0, 0, 0},
    };
    static const struct {
        const char *name;
        int (*fn)(const opts *);
        const char *flags; /* command-specific options it takes */
    } cmds[] = {
        {"init", cmd_init, "tier promote cost timeout auth-file key-file"},
        {"keygen", cmd_keygen, ""},
        {"place", cmd_place, "json ratio tokens model device"},
        {"ls", cmd_ls, "json tier model"},
        {"stat", cmd_stat, "json project"},
        {"get", cmd_get, "output"},
        {"put", cmd_put, ""},
        {"rm", NULL, ""},
        {"pin", NULL, ""},
        {"unpin", NULL, ""},
        {"gc", cmd_gc, ""},
        {"verify", cmd_verify, "repair"},
        {"recode", cmd_recode, "kv-type tier"},
        {"export", cmd_export, "compress"},
        {"import", cmd_import, ""},
    };
    char store_buf[4096];
    opts o = {0};
    cli_common co = {0};
    int c, code, given[OPT_KV_TYPE + 1] = {0};

    cli_prog = "cb-store";
    cli_trap_sigbus();
    o.promote = -1;
    o.ratio = 0.15;
    o.tokens = 3072;
    o.tiers = calloc((size_t)argc + 1, sizeof *o.tiers);
    o.costs = calloc((size_t)argc + 1, sizeof *o.costs);
    if (!o.tiers || !o.costs)
        return CLI_EX_SOFTWARE;
    while ((c = cli_getopt(argc, argv, "o:" CLI_COMMON_SHORT, lopts)) != -1) {
        given[OPT_DEVICE] |= c == CLI_OPT_DEVICE;
        if ((code = cli_common_opt(&co, c, optarg, usage)) != CLI_NOT_COMMON) {
            if (code != CLI_CONTINUE)
                return code;
            continue;
        }
        switch (c) {
        case OPT_JSON:
            o.json = 1;
            given[OPT_JSON] = 1;
            break;
        case OPT_TIER:
            o.tiers[o.n_tiers++] = optarg;
            given[OPT_TIER] = 1;
            break;
        case OPT_PROMOTE: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*end || !*optarg || n < 0 || n > 1000000) {
                cli_err("--promote: '%s' is not a count >= 0", optarg);
                return CLI_EX_USAGE;
            }
            o.promote = (int)n;
            given[OPT_PROMOTE] = 1;
            break;
        }
        case OPT_TIMEOUT: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*end || !*optarg || n < 1 || n > 600000) {
                cli_err("--timeout: '%s' is not a number of milliseconds from 1 to 600000", optarg);
                return CLI_EX_USAGE;
            }
            o.timeout_ms = (int)n;
            given[OPT_TIMEOUT] = 1;
            break;
        }
        case 'o':
            o.out = optarg;
            given[0] = 1;
            break;
        case OPT_AUTH_FILE:
            o.auth_file = optarg;
            given[OPT_AUTH_FILE] = 1;
            break;
        case OPT_KEY_FILE:
            o.key_file = optarg;
            given[OPT_KEY_FILE] = 1;
            break;
        case OPT_REPAIR:
            o.repair = 1;
            given[OPT_REPAIR] = 1;
            break;
        case OPT_COMPRESS:
            o.compress = optarg;
            given[OPT_COMPRESS] = 1;
            break;
        case OPT_COST:
            o.costs[o.n_costs++] = optarg;
            given[OPT_COST] = 1;
            break;
        case OPT_RATIO: {
            char *end;
            o.ratio = strtod(optarg, &end);
            if (*end || end == optarg || o.ratio <= 0 || o.ratio > 1) {
                cli_err("--ratio: '%s' is not in (0, 1]", optarg);
                return CLI_EX_USAGE;
            }
            given[OPT_RATIO] = 1;
            break;
        }
        case OPT_PROJECT:
            if (parse_tokens(optarg, &o.project) != 0)
                return CLI_EX_USAGE;
            o.project_arg = optarg;
            given[OPT_PROJECT] = 1;
            break;
        case OPT_KV_TYPE:
            o.kv_type = optarg;
            given[OPT_KV_TYPE] = 1;
            break;
        case OPT_TOKENS: {
            char *end;
            o.tokens = strtol(optarg, &end, 10);
            if (*end || end == optarg || o.tokens < 1) {
                cli_err("--tokens: '%s' is not a token count", optarg);
                return CLI_EX_USAGE;
            }
            given[OPT_TOKENS] = 1;
            break;
        }
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    o.model = co.model;
    o.device = co.device;
    if (optind >= argc) {
        usage(stderr);
        return CLI_EX_USAGE;
    }
    const char *cmd = argv[optind];
    o.args = argv + optind + 1;
    o.n_args = argc - optind - 1;
    o.store = cli_store_dir(&co, store_buf, sizeof store_buf);
    size_t k;
    for (k = 0; k < sizeof cmds / sizeof cmds[0]; k++)
        if (strcmp(cmds[k].name, cmd) == 0)
            break;
    if (k == sizeof cmds / sizeof cmds[0]) {
        cli_err("'%s' is not a command (see cb-store --help)", cmd);
        return CLI_EX_USAGE;
    }
    /* Options that the command does not take are a usage error, not silence. */
    static const struct {
        int id;
        const char *word, *flag;
    } specific[] = {{OPT_JSON, "json", "--json"},
                    {OPT_TIER, "tier", "--tier"},
                    {OPT_PROMOTE, "promote", "--promote"},
                    {0, "output", "-o"},
                    {OPT_REPAIR, "repair", "--repair"},
                    {OPT_COMPRESS, "compress", "--compress"},
                    {OPT_COST, "cost", "--cost"},
                    {OPT_RATIO, "ratio", "--ratio"},
                    {OPT_TOKENS, "tokens", "--tokens"},
                    {OPT_DEVICE, "device", "--device"},
                    {OPT_TIMEOUT, "timeout", "--timeout"},
                    {OPT_AUTH_FILE, "auth-file", "--auth-file"},
                    {OPT_KEY_FILE, "key-file", "--key-file"},
                    {OPT_PROJECT, "project", "--project"},
                    {OPT_KV_TYPE, "kv-type", "--kv-type"}};
    for (size_t i = 0; i < sizeof specific / sizeof specific[0]; i++)
        if (given[specific[i].id] && !strstr(cmds[k].flags, specific[i].word)) {
            cli_err("%s: %s does not apply", cmd, specific[i].flag);
            return CLI_EX_USAGE;
        }
    code = cmds[k].fn ? cmds[k].fn(&o) : cmd_keys(&o, cmd);
    free(o.tiers);
    free(o.costs);
    return cli_finish(code);
}
