/* store-maint.c - cb-store's commands that check, rewrite or move entries:
 * gc, verify [--repair], recode, export, import, and place. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ gc, verify */

int cmd_gc(const opts *o)
{
    cb_store *s = NULL;
    cb_store_gc_report r;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "gc", 0, 0)) != 0)
        return code;
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    if (cb_store_gc(s, &r, &err) != CB_OK)
        code = cs_fail(&err);
    else
        cli_info(
            "gc: %llu demoted, %llu evicted, %llu orphan %s and %llu temporary %s removed, %llu "
            "stale index %s dropped, %llu %s in use or pinned",
            (unsigned long long)r.demoted, (unsigned long long)r.evicted,
            (unsigned long long)r.orphans, cli_plural(r.orphans, "file", "files"),
            (unsigned long long)r.temps, cli_plural(r.temps, "file", "files"),
            (unsigned long long)r.stale, cli_plural(r.stale, "entry", "entries"),
            (unsigned long long)r.busy, cli_plural(r.busy, "entry", "entries"));
    cb_store_close(s);
    return code;
}

static void print_problem(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    printf("%s: %s\n", what, msg);
}

int cmd_verify(const opts *o)
{
    cb_store *s = NULL;
    cb_store_verify_report r;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "verify", 0, 0)) != 0)
        return code;
    if (cb_store_open(&s, o->store, 0, &err) != CB_OK) {
        if (err.status != CB_ERR_FORMAT || !o->repair || strstr(err.msg, "index") == NULL)
            return cs_fail(&err);
        /* An index that cannot be read: start a new one and rebuild it. */
        printf("%s/index.db: %s (a new index is built from the files)\n", o->store, err.msg);
        if (cb_store_reset_index(o->store, &err) != CB_OK ||
            cb_store_open(&s, o->store, 0, &err) != CB_OK)
            return cs_fail(&err);
    }
    cs_readonly_note(o, s);
    cb_store_set_warn(s, cs_warn, NULL);
    cb_status st = cb_store_verify(s, o->repair, print_problem, NULL, &r, &err);
    if (st != CB_OK && st != CB_ERR_FORMAT) {
        code = cs_fail(&err);
    } else {
        code = st == CB_OK ? 0 : CLI_EX_DATAERR;
        char size[32];
        if (cli_verbosity >= 2 || (cli_verbosity >= 1 && r.problems))
            fprintf(stderr,
                    "cb-store: verify: %llu %s, %llu %s, %s checked; %llu %s, %llu repaired, %llu "
                    "left\n",
                    (unsigned long long)r.entries, cli_plural(r.entries, "entry", "entries"),
                    (unsigned long long)r.files, cli_plural(r.files, "file", "files"),
                    cli_bytes(r.bytes, size, sizeof size), (unsigned long long)r.problems,
                    cli_plural(r.problems, "problem", "problems"), (unsigned long long)r.repaired,
                    (unsigned long long)r.remaining);
    }
    cb_store_close(s);
    return code;
}

/* -------------------------------------------------------------- recode */

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

typedef struct recode_ui {
    const char *type;
    int progress; /* a progress line on stderr (a terminal) */
    double t0, t_shown;
} recode_ui;

static int recode_step(void *ctx, const cb_store_recode_report *r, const char *key, const char *msg)
{
    recode_ui *x = ctx;
    double now = cb_now_ms() / 1e3;
    if (msg && cli_verbosity >= 1) {
        if (x->progress)
            fprintf(stderr, "\r\033[K");
        cli_err("recode: %s: left as it is: %s", key, msg);
    }
    if (x->progress && (now - x->t_shown >= 0.25 || r->done == r->total)) {
        double el = now - x->t0, rate = (double)r->done / (el > 0 ? el : 1);
        fprintf(stderr, "\r%s: recode: %llu/%llu entries (%llu rewritten, %llu already %s), %.1f/s",
                cli_prog, (unsigned long long)r->done, (unsigned long long)r->total,
                (unsigned long long)r->recoded, (unsigned long long)r->already, x->type, rate);
        if (rate > 0)
            fprintf(stderr, ", ETA %.0f s", (double)(r->total - r->done) / rate);
        fprintf(stderr, "\033[K");
        x->t_shown = now;
    }
    return interrupted != 0;
}

int cmd_recode(const opts *o)
{
    cb_store *s = NULL;
    cb_store_recode_report r;
    cb_type type;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "recode", 0, 0)) != 0)
        return code;
    if (!o->kv_type) {
        cli_err("recode: --kv-type T is required (f16, f32, bf16, q8_0, kivi4 or coded)");
        return CLI_EX_USAGE;
    }
    if (cb_kv_type_parse(o->kv_type, &type) != CB_OK) {
        cli_err(
            "recode: --kv-type %s: not an element type of KV files (f16, f32, bf16, q8_0, kivi4, "
            "coded)",
            o->kv_type);
        return CLI_EX_USAGE;
    }
    if (o->n_tiers > 1) {
        cli_err("recode: one --tier at most");
        return CLI_EX_USAGE;
    }
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    const char *shared = cb_store_shared_name(s);
    if (shared && !o->n_tiers && cli_verbosity >= 1)
        cli_err("note: recode: the shared tier %s is left as it is (only local tiers are recoded)",
                shared);
    recode_ui x = {o->kv_type, isatty(2) && cli_verbosity >= 1, cb_now_ms() / 1e3, 0};
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    cb_status st =
        cb_store_recode(s, o->n_tiers ? o->tiers[0] : NULL, type, recode_step, &x, &r, &err);
    if (x.progress && r.done)
        fprintf(stderr, "\r\033[K");
    double el = cb_now_ms() / 1e3 - x.t0;
    if (st != CB_OK) {
        code = err.status == CB_ERR_INVALID || err.status == CB_ERR_UNSUPPORTED
                   ? (cli_err("recode: %s", err.msg), CLI_EX_USAGE)
                   : cs_fail(&err);
        if (!r.done)
            goto done;
    }
    if (cli_verbosity >= 1) {
        char a[32], b[32];
        cli_err("recode: %llu of %llu %s in %.1f s (%.1f/s): %llu rewritten as %s (%s -> %s), "
                "%llu already %s; left: %llu in use or moved, %llu without room, %llu unreadable",
                (unsigned long long)r.done, (unsigned long long)r.total,
                cli_plural(r.total, "entry", "entries"), el, el > 0 ? (double)r.done / el : 0.0,
                (unsigned long long)r.recoded, o->kv_type, cli_bytes(r.bytes_before, a, sizeof a),
                cli_bytes(r.bytes_after, b, sizeof b), (unsigned long long)r.already, o->kv_type,
                (unsigned long long)r.busy, (unsigned long long)r.no_room,
                (unsigned long long)r.bad);
    }
    if (code)
        goto done;
    if (interrupted) {
        cli_err(
            "interrupted by signal %d: each entry is whole, old or new; run recode again to go on",
            (int)interrupted);
        code = 130;
    } else if (r.bad) {
        code = CLI_EX_DATAERR;
    } else if (r.busy || r.no_room) {
        code = CLI_EX_CANTCREAT;
    }
done:
    cb_store_close(s);
    return code;
}

/* ------------------------------------------------------- export, import */

int cmd_export(const opts *o)
{
    cb_store *s = NULL;
    cb_store_compress c = CB_STORE_COMPRESS_AUTO;
    uint64_t n = 0;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "export", 1, -1)) != 0)
        return code;
    if (o->compress) {
        if (!strcmp(o->compress, "zstd"))
            c = CB_STORE_COMPRESS_ZSTD;
        else if (!strcmp(o->compress, "gzip"))
            c = CB_STORE_COMPRESS_GZIP;
        else if (!strcmp(o->compress, "xz"))
            c = CB_STORE_COMPRESS_XZ;
        else if (!strcmp(o->compress, "none"))
            c = CB_STORE_COMPRESS_NONE;
        else {
            cli_err("--compress %s: use zstd, gzip, xz or none", o->compress);
            return CLI_EX_USAGE;
        }
    }
    for (int i = 1; i < o->n_args; i++)
        if (strlen(o->args[i]) != CB_STORE_KEY_LEN) {
            cli_err("export: '%s' is not a store key", o->args[i]);
            return CLI_EX_USAGE;
        }
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    int to_stdout = strcmp(o->args[0], "-") == 0;
    if (to_stdout)
        fflush(stdout);
    if (cb_store_export(s, to_stdout ? NULL : o->args[0], to_stdout ? 1 : -1,
                        (const char *const *)o->args + 1, (size_t)(o->n_args - 1), c, &n,
                        &err) != CB_OK)
        code =
            err.status == CB_ERR_INVALID ? (cli_err("%s", err.msg), CLI_EX_USAGE) : cs_fail(&err);
    else
        cli_info("export: %llu %s written to %s", (unsigned long long)n,
                 cli_plural(n, "entry", "entries"), to_stdout ? "standard output" : o->args[0]);
    cb_store_close(s);
    return code;
}

static void import_problem(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    cli_err("import: %s: rejected: %s", what, msg);
}

int cmd_import(const opts *o)
{
    cb_store *s = NULL;
    cb_store_import_report r;
    cb_error err;
    int code;
    if ((code = cs_need_args(o, "import", 1, 1)) != 0)
        return code;
    int from_stdin = strcmp(o->args[0], "-") == 0;
    if (!from_stdin && access(o->args[0], R_OK) != 0) {
        cli_err("%s: %s", o->args[0], strerror(errno));
        return CLI_EX_NOINPUT;
    }
    if ((code = cs_open_store(o, &s)) != 0)
        return code;
    cb_status st = cb_store_import(s, from_stdin ? NULL : o->args[0], from_stdin ? 0 : -1,
                                   import_problem, NULL, &r, &err);
    if (st != CB_OK && !(st == CB_ERR_FORMAT && r.rejected))
        code = cs_fail(&err);
    else
        code = st == CB_OK ? 0 : CLI_EX_DATAERR;
    cli_info("import: %llu imported, %llu already stored, %llu rejected",
             (unsigned long long)r.imported, (unsigned long long)r.existed,
             (unsigned long long)r.rejected);
    cb_store_close(s);
    return code;
}

/* --------------------------------------------------------------- place */

int cmd_place(const opts *o)
{
    cb_store *s = NULL;
    cb_gguf *g = NULL;
    cb_error err;
    cb_hash128 fp;
    int code = 0;
    cb_profile *prof = calloc(1, sizeof *prof);

    if ((code = cs_need_args(o, "place", 0, 0)) != 0) {
        free(prof);
        return code;
    }
    if (!prof)
        return CLI_EX_SOFTWARE;
    /* the model: a GGUF file (fingerprinted here) or a 32-digit fingerprint */
    const char *model = o->model ? o->model : cli_model_path(NULL);
    if (strlen(model) == 32 && cb_hash128_parse(model, &fp) == CB_OK) {
        ;
    } else if (cb_gguf_open(&g, model, &err) != CB_OK || cb_gguf_fingerprint(g, &fp) != CB_OK) {
        code = cs_fail(&err);
        goto done;
    }
    /* profiles are kept per backend kind (cb-profile --device); without
     * --device, a cuda profile wins: cb-profile only makes one on a GPU */
    const char *kind = !o->device || strncmp(o->device, "cuda", 4) == 0 ? "cuda" : "cpu";
    if (o->device && strcmp(o->device, "cpu") != 0 && strncmp(o->device, "cuda", 4) != 0) {
        cli_err("--device %s: cpu or cuda", o->device);
        code = CLI_EX_USAGE;
        goto done;
    }
    if (cb_store_open(&s, o->store, 0, &err) != CB_OK) {
        code = cs_fail(&err);
        goto done;
    }
    cb_status pst = cb_store_profile_load(s, fp, kind, prof, &err);
    if (pst == CB_ERR_NOT_FOUND && !o->device)
        pst = cb_store_profile_load(s, fp, kind = "cpu", prof, &err);
    if (pst != CB_OK) {
        code = cs_fail(&err);
        goto done;
    }
    double load = -1, rec = -1;
    int t = cb_store_place(s, prof, o->ratio, o->tokens, CB_TYPE_F16, &load, &rec);
    if (t < 0) {
        cli_err("%s: the profile measured none of this store's tiers: run cb-profile again",
                o->store);
        code = CLI_EX_DATAERR;
        goto done;
    }
    cb_store_tier ti;
    cb_store_tier_info(s, t, &ti);
    /* A host that has not seen the chunk streams it from the shared tier. */
    const char *sh = cb_store_shared_name(s);
    double sh_load = sh ? cb_profile_load_ms(prof, sh, o->tokens, CB_TYPE_F16, 1) : -1;
    if (o->json) {
        json_t *tiers = json_array();
        for (int i = 0; i < cb_store_n_tiers(s); i++) {
            cb_store_tier x;
            cb_store_tier_info(s, i, &x);
            json_array_append_new(
                tiers, json_pack("{s:s, s:f, s:f}", "name", x.name, "cost", x.cost, "load_ms",
                                 cb_profile_load_ms(prof, x.name, o->tokens, CB_TYPE_F16, 1)));
        }
        json_t *r = json_pack("{s:s, s:f, s:I, s:f, s:f, s:o}", "tier", ti.name, "ratio", o->ratio,
                              "tokens", (json_int_t)o->tokens, "load_ms", load, "recompute_ms", rec,
                              "tiers", tiers);
        if (sh_load >= 0)
            json_object_set_new(r, "shared",
                                json_pack("{s:s, s:f, s:b}", "name", sh, "load_ms", sh_load,
                                          "hidden", sh_load <= rec));
        json_dumpf(r, stdout, JSON_COMPACT);
        putchar('\n');
        json_decref(r);
    } else {
        printf("%s\n", ti.name);
        cli_info(
            "%ld cached tokens at ratio %.2f: recompute %.1f ms, load from %s %.1f ms (cost %g)",
            o->tokens, o->ratio, rec, ti.name, load, ti.cost);
        if (sh_load >= 0)
            cli_info("streamed from the shared tier %s: load %.1f ms, %s", sh, sh_load,
                     sh_load <= rec ? "hidden behind the recompute" : "longer than the recompute");
    }
done:
    free(prof);
    cb_gguf_free(g);
    cb_store_close(s);
    return code;
}
