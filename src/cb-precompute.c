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
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = sig;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cb-precompute [options] [FILE|-]\n"
            "\n"
            "Prefill every chunk record's text alone (after the model's lead-in) and write\n"
            "its KV file into the store; chunks already stored are skipped. Each input\n"
            "record is written to stdout with \"kv\" (the store key) and \"cached\" added.\n"
            "\n"
            "  -m, --model PATH   GGUF model (default: $CB_MODEL, else the default model)\n"
            "      --store DIR    the store (default: $CB_STORE, else\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/cacheblend/store); created if absent\n"
            "      --kv-type T    element type of the KV files: f16 (default), f32, bf16, or\n"
            "                     q8_0 (8-bit, about half the size of f16)\n"
            "      --place WHERE  the tier new entries go to: a tier's name, or auto: the\n"
            "                     cheapest tier whose load time does not exceed the recompute\n"
            "                     time (cb-store place, from the store's profile); default: the\n"
            "                     fastest tier with room\n"
            "      --strict       stop at the first bad record (default: report and skip it)\n"
            "  -t, --threads N    compute threads (default: every core)\n"
            "      --device DEV   compute device: cpu, cuda or cuda:N (default: $CB_DEVICE,\n"
            "                     else CUDA device 0 when a GPU is present, else cpu)\n"
            "  -v, --verbose      report every chunk on stderr\n"
            "  -q, --quiet        print nothing but errors\n"
            "  -h, --help         this help\n"
            "      --version      print the version\n"
            "\n"
            "A progress line (chunks/s, tokens/s, ETA) goes to stderr when it is a terminal.\n"
            "\n"
            "Exit status: 0 success, 64 usage error, 65 bad input data (with --strict, or a\n"
            "malformed model), 66 input missing, 69 compute device not available,\n"
            "70 internal error, 73 cannot create output, 74 I/O error, 130 interrupted\n"
            "(the chunk in progress is not stored).\n");
}

enum { OPT_DEVICE = 200, OPT_VERSION = 256, OPT_STORE, OPT_KVTYPE, OPT_STRICT, OPT_PLACE };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"store", required_argument, 0, OPT_STORE},
        {"kv-type", required_argument, 0, OPT_KVTYPE}, {"strict", no_argument, 0, OPT_STRICT},
        {"place", required_argument, 0, OPT_PLACE},
        {"device", required_argument, 0, OPT_DEVICE},
        {"threads", required_argument, 0, 't'}, {"verbose", no_argument, 0, 'v'},
        {"quiet", no_argument, 0, 'q'},         {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, OPT_VERSION}, {0, 0, 0, 0},
    };
    const char *device = NULL;
    const char *model_opt = NULL, *store_opt = NULL, *in_path = NULL, *place = NULL;
    int strict = 0, c, code = 0, n_threads = 0;
    cb_type kv_type = CB_TYPE_F16;
    char store_buf[4096];

    cli_prog = "cb-precompute";
    while ((c = getopt_long(argc, argv, "m:t:vqh", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_opt = optarg; break;
        case OPT_STORE: store_opt = optarg; break;
        case OPT_DEVICE: device = optarg; break;
        case OPT_KVTYPE:
            if (!strcmp(optarg, "f16"))
                kv_type = CB_TYPE_F16;
            else if (!strcmp(optarg, "f32"))
                kv_type = CB_TYPE_F32;
            else if (!strcmp(optarg, "bf16"))
                kv_type = CB_TYPE_BF16;
            else if (!strcmp(optarg, "q8_0"))
                kv_type = CB_TYPE_Q8_0;
            else {
                cli_err("--kv-type %s: use f16, f32, bf16 or q8_0", optarg);
                return CLI_EX_USAGE;
            }
            break;
        case OPT_STRICT: strict = 1; break;
        case OPT_PLACE: place = optarg; break;
        case 't': n_threads = atoi(optarg); if (n_threads < 1) { cli_err("-t %s: not a thread count", optarg); return CLI_EX_USAGE; } break;
        case 'v': cli_verbosity = 2; break;
        case 'q': cli_verbosity = 0; break;
        case 'h': usage(stdout); return cli_finish(0);
        case OPT_VERSION: cli_version(); return cli_finish(0);
        default: usage(stderr); return CLI_EX_USAGE;
        }
    }
    if (argc - optind > 1) {
        cli_err("one input at most (a file or -)");
        return CLI_EX_USAGE;
    }
    in_path = optind < argc ? argv[optind] : "-";
    const char *store_dir = store_opt ? store_opt : cb_store_default_dir(store_buf, sizeof store_buf);
    const char *model_path = cli_model_path(model_opt);
    int from_stdin = strcmp(in_path, "-") == 0;
    const char *in_name = from_stdin ? "(stdin)" : in_path;
    FILE *in = from_stdin ? stdin : fopen(in_path, "rb");
    if (!in) {
        cli_err("%s: %s", in_path, strerror(errno));
        return CLI_EX_NOINPUT;
    }

    cb_model *m = NULL;
    cb_store *store = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_tokens lead = {0}, ids = {0};
    cb_error err;
    cb_model_params mp = {n_threads, cli_device(device)};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0, n_total = -1, n_done = 0, n_new = 0, n_cached = 0, n_bad = 0;
    double tok_done = 0, t0 = now_s(), t_last = 0;
    int progress = isatty(2) && cli_verbosity > 0;

    if (cb_model_load(&m, model_path, &mp, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    if (cb_store_open(&store, store_dir, 1, &err) != CB_OK) {
        cli_err("%s", err.msg);
        code = cli_exit_code(err.status);
        goto done;
    }
    if (cb_kv_lead_in(m, &lead) != CB_OK) {
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    cb_hash128 fp = cb_model_fingerprint(m);
    char tier_name[64] = "";
    if (place && strcmp(place, "auto") == 0) {
        cb_profile *prof = calloc(1, sizeof *prof);
        double load = -1, rec = -1;
        int t = -1;
        if (prof && cb_profile_load(prof, store_dir, fp, cb_model_backend(m), &err) == CB_OK)
            t = cb_controller_place(prof, store, 0.15, 3072, kv_type, &load, &rec);
        free(prof);
        cb_store_tier ti;
        if (t >= 0 && cb_store_tier_info(store, t, &ti) == CB_OK) {
            snprintf(tier_name, sizeof tier_name, "%s", ti.name);
            cli_info("--place auto: tier %s (load %.1f ms <= recompute %.1f ms for 3072 tokens at 0.15)", ti.name,
                     load, rec);
        } else {
            cli_err("note: --place auto: no usable profile in %s (run cb-profile); using the fastest tier", store_dir);
        }
    } else if (place) {
        snprintf(tier_name, sizeof tier_name, "%s", place);
    }
    int32_t n_ctx = hp->n_ctx_train, kv_cap = 0;
    if (cb_fwd_new(&f, m, 512) != CB_OK) {
        cli_err("out of memory");
        code = CLI_EX_SOFTWARE;
        goto done;
    }
    cli_info("model %s, lead-in %zu tokens, store %s, KV type %s", model_path, lead.n, store_dir,
             cb_type_name(kv_type));
    if (progress && !from_stdin) { /* a file: count its records for the ETA */
        int ch;
        n_total = 0;
        while ((ch = getc(in)) != EOF)
            n_total += ch == '\n';
        rewind(in);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    while (!interrupted && (len = getline(&line, &cap, in)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        json_error_t jerr;
        json_t *obj = json_loadb(line, (size_t)len, 0, &jerr);
        json_t *text = obj ? json_object_get(obj, "text") : NULL;
        if (!obj || !json_is_object(obj) || !json_is_string(text)) {
            cli_err("%s:%ld: %s", in_name, lineno,
                    !obj ? jerr.text : !json_is_object(obj) ? "not a JSON object" : "no \"text\" string");
            json_decref(obj);
            n_bad++;
            if (strict) {
                code = CLI_EX_DATAERR;
                goto done;
            }
            continue;
        }
        ids.n = 0;
        cb_tok_encode(cb_model_vocab(m), json_string_value(text), json_string_length(text), 0, &ids);
        if (ids.n == 0 || (int64_t)lead.n + (int64_t)ids.n > n_ctx) {
            cli_err("%s:%ld: %s", in_name, lineno,
                    ids.n == 0 ? "empty text" : "chunk longer than the model's context");
            json_decref(obj);
            n_bad++;
            if (strict) {
                code = CLI_EX_DATAERR;
                goto done;
            }
            continue;
        }
        char key[66];
        int found = 0;
        cb_kv_key(fp, cb_kv_tokens_hash(lead.ids, (int32_t)lead.n, ids.ids, (int32_t)ids.n), key);
        if (cb_store_lookup(store, key, &found) != CB_OK) {
            cli_err("%s: index lookup failed", store_dir);
            json_decref(obj);
            code = CLI_EX_IOERR;
            goto done;
        }
        if (!found && (int64_t)lead.n + (int64_t)ids.n > kv_cap) {
            /* the f32 cache grows with the longest chunk seen, in steps of 512 */
            int64_t want = ((int64_t)lead.n + (int64_t)ids.n + 511) / 512 * 512;
            cb_kvcache_free(kv);
            kv = NULL;
            kv_cap = (int32_t)(want < n_ctx ? want : n_ctx);
            if (cb_kvcache_new(&kv, m, kv_cap, CB_TYPE_F32) != CB_OK) {
                cli_err("out of memory (a cache of %d positions)", (int)kv_cap);
                json_decref(obj);
                code = CLI_EX_SOFTWARE;
                goto done;
            }
        }
        if (!found) {
            void *buf = NULL;
            size_t size = 0;
            cb_status st = cb_kv_precompute(f, kv, lead.ids, (int32_t)lead.n, ids.ids, (int32_t)ids.n, kv_type,
                                            &buf, &size);
            if (st == CB_OK && !interrupted)
                st = tier_name[0] ? cb_store_put_in(store, key, buf, size, tier_name, &err)
                                  : cb_store_put(store, key, buf, size, &err);
            else if (st != CB_OK)
                cb_error_set(&err, st, "%s:%ld: precompute failed: %s", in_name, lineno, cb_strerror(st));
            free(buf);
            if (interrupted) {
                json_decref(obj);
                break;
            }
            if (st != CB_OK) {
                cli_err("%s", err.msg);
                json_decref(obj);
                code = cli_exit_code(st);
                goto done;
            }
            n_new++;
            tok_done += (double)ids.n;
        } else {
            n_cached++;
        }
        n_done++;
        cli_info("%s:%ld: %zu tokens, %s %s", in_name, lineno, ids.n, found ? "cached" : "stored", key);
        if (emit(line, (size_t)len, obj, key, found) != 0) {
            json_decref(obj);
            cli_err("error writing to standard output: %s", strerror(errno));
            code = CLI_EX_IOERR;
            goto done;
        }
        json_decref(obj);
        double now = now_s();
        if (progress && now - t_last > 0.25) {
            double el = now - t0, rate = n_done / (el > 0 ? el : 1);
            fprintf(stderr, "\rcb-precompute: %ld", n_done);
            if (n_total > 0)
                fprintf(stderr, "/%ld", n_total);
            fprintf(stderr, " chunks (%ld new, %ld cached), %.1f chunks/s, %.0f tokens/s", n_new, n_cached, rate,
                    tok_done / (el > 0 ? el : 1));
            if (n_total > 0 && rate > 0)
                fprintf(stderr, ", ETA %.0f s", (double)(n_total - n_done) / rate);
            fprintf(stderr, "   ");
            t_last = now;
        }
    }
    if (progress)
        fputc('\n', stderr);
    if (interrupted) {
        cli_err("interrupted by signal %d after %ld chunks; nothing partial was stored", (int)interrupted, n_done);
        code = 130;
        goto done;
    }
    if (ferror(in)) {
        cli_err("%s: read error: %s", in_name, strerror(errno));
        code = CLI_EX_IOERR;
        goto done;
    }
    double el = now_s() - t0;
    if (cli_verbosity > 0 && (cli_verbosity > 1 || n_bad))
        fprintf(stderr, "cb-precompute: %ld chunks: %ld stored, %ld already cached, %ld bad records; %.0f tokens/s\n",
                n_done, n_new, n_cached, n_bad, tok_done / (el > 0 ? el : 1));
done:
    free(line);
    if (in && !from_stdin)
        fclose(in);
    cb_tokens_free(&lead);
    cb_tokens_free(&ids);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_store_close(store);
    cb_model_free(m);
    return cli_finish(code);
}
