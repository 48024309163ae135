/* cli.h - front-end helpers shared by the cb-* programs (not part of
 * libcbcore): exit codes, model and store paths, input, and stdout checks. */
#ifndef CB_CLI_H
#define CB_CLI_H

#include "cbcore.h"

#include <stddef.h>
#include <getopt.h>
#include <stdio.h>

/* Exit statuses of every program (sysexits.h values). */
enum cli_exit {
    CLI_EX_OK = 0,
    CLI_EX_USAGE = 64,       /* bad command line */
    CLI_EX_DATAERR = 65,     /* bad input data: malformed GGUF, JSON, KV file */
    CLI_EX_NOINPUT = 66,     /* input file missing or unreadable */
    CLI_EX_UNAVAILABLE = 69, /* the compute device asked for is not available */
    CLI_EX_SOFTWARE = 70,    /* internal error */
    CLI_EX_CANTCREAT = 73,   /* cannot create output */
    CLI_EX_IOERR = 74        /* I/O error */
};

/* The running program's name for messages ("cb-run"). */
extern const char *cli_prog;
/* -v / -q levels: 0 quiet, 1 normal, 2 verbose. */
extern int cli_verbosity;
/* --exact (1) or --act8 (0) was given, the last of them; -1: neither
 * (cli_model_params then reads $CB_EXACT). */
extern int cli_exact;

/* Map a library status to an exit status. */
int cli_exit_code(cb_status st);

/* "prog: message" on stderr. */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same, only when -v was given. */
void cli_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The default model's file name in the model cache (make model): the
 * smallest model that answers the demo's questions in full prefill and in
 * blend (README, "The default model"). */
#define CLI_DEFAULT_MODEL "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"

/* The model path: `opt` (-m), else $CB_MODEL, else the default model in the
 * model cache.  Returns a pointer to static storage. */
const char *cli_model_path(const char *opt);
/* The compute device: opt (--device), else $CB_DEVICE, else "auto" (CUDA
 * device 0 when present, else the CPU). */
const char *cli_device(const char *opt);
/* The model parameters of a computing program: n_threads, the device
 * (cli_device; with --exact and no device named by --device or
 * $CB_DEVICE, the CPU, the one device that has that path) and exact
 * (--exact, or $CB_EXACT set to 1; --act8 asks for the default). */
cb_model_params cli_model_params(int n_threads, const char *device);
/* Where the programs remember model fingerprints (cb_model_params.fp_cache):
 * ${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/fingerprints; NULL without a
 * home.  Static storage. */
const char *cli_fp_cache(void);

/* Read all of `path` ("-" or NULL: stdin) into a malloc'd buffer with a NUL
 * after the last byte.  On failure prints a message and returns NULL with
 * *exit_code set (66 for a missing file, 74 for a read error). */
char *cli_read_input(const char *path, size_t *len, int *exit_code);

/* Flush and close stdout; a failure (a full disk, a closed pipe) is an I/O
 * error: prints a message and returns 74, else returns `code`. */
int cli_finish(int code);

/* A malloc'd NUL-terminated copy of n bytes with every invalid UTF-8
 * sequence replaced by U+FFFD (JSON strings must be valid UTF-8); its
 * length (NUL bytes in it included) into *out_len when not NULL. */
char *cli_utf8_clean(const char *s, size_t n, size_t *out_len);

/* Parse whitespace-separated token ids ("12 7 99\n") into *ids; a bad
 * number or an id outside [0, n_vocab) is reported naming `name` and the
 * byte offset.  Returns 0, 65 (bad data) or 70 (out of memory). */
int cli_parse_ids(const char *text, size_t len, const char *name, int32_t n_vocab, cb_tokens *ids);

/* Read JSON Lines records (path "-": stdin) into a jansson array (*out, a
 * json_t *), each an object with a string `field`; blank lines are
 * skipped.  Prints a message naming the line on failure; returns 0, 65
 * (a bad record) or the exit status of cli_read_input. */
int cli_read_records(const char *path, const char *field, void **out);

/* Write one JSON object and a newline to path ("-": stderr) atomically.
 * Prints a message on failure; returns 0 or an exit status. */
int cli_write_json(const char *path, const void *json_obj);

/* The memory this machine can give a process now: MemAvailable from
 * /proc/meminfo, else the free pages (sysconf), else 1 GiB. */
uint64_t cli_mem_available(void);
/* A file the library maps (the model, a KV file) truncated under the
 * program makes its next read fault (SIGBUS): it then ends with a
 * message naming the cause and exit 74, not a crash.  Call once cli_prog
 * is set. */
void cli_trap_sigbus(void);

/* Print the --version line. */
void cli_version(void);

/* `one` when n is 1, else `many` ("1 problem", "2 problems"). */
const char *cli_plural(uint64_t n, const char *one, const char *many);
/* n bytes for a message, at a precision that suits its size ("512 bytes",
 * "4.2 kB", "3.18 MB", "1.20 GB"; powers of 1000) into buf; returns buf. */
const char *cli_bytes(uint64_t n, char *buf, size_t size);

/* ------------------------------------------------------ common options
 * Every program takes -m/--model, -t/--threads, -v/--verbose, -q/--quiet,
 * -h/--help and --version; those that open a store take --store, those
 * that compute take --device.  A program lists CLI_COMMON_OPTS (and
 * CLI_STORE_OPT, CLI_DEVICE_OPT where it takes them) in its getopt_long
 * table and CLI_COMMON_SHORT in its short options, and hands each option
 * to cli_common_opt before its own switch. */
typedef struct cli_common {
    const char *model;  /* -m as given, NULL when not (cli_model_path resolves it) */
    const char *store;  /* --store as given, NULL when not */
    const char *device; /* --device as given, NULL when not (cli_device resolves it) */
    int n_threads;      /* -t, 0 when not given */
} cli_common;

enum { CLI_OPT_VERSION = 0x1000, CLI_OPT_STORE, CLI_OPT_DEVICE, CLI_OPT_ACT8, CLI_OPT_EXACT };

#define CLI_COMMON_SHORT "m:t:vqh"
/* (clang-format 14 breaks the initializers inside these macros apart) */
/* clang-format off */
#define CLI_COMMON_OPTS                                                                                      \
    {"model", required_argument, 0, 'm'}, {"threads", required_argument, 0, 't'},                           \
        {"verbose", no_argument, 0, 'v'}, {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'},     \
        {"version", no_argument, 0, CLI_OPT_VERSION}
#define CLI_STORE_OPT {"store", required_argument, 0, CLI_OPT_STORE}
#define CLI_DEVICE_OPT {"device", required_argument, 0, CLI_OPT_DEVICE}
/* clang-format on */
/* --exact and --act8: the programs that compute (cb-run, cb-precompute,
 * cb-profile) */
/* clang-format off */
#define CLI_ACT8_OPT {"act8", no_argument, 0, CLI_OPT_ACT8}, {"exact", no_argument, 0, CLI_OPT_EXACT}
/* clang-format on */
/* their help lines for --device, --exact and --act8 */
#define CLI_DEVICE_HELP                                                                \
    "      --device DEV   compute device: cpu, cuda or cuda:N (default: $CB_DEVICE,\n" \
    "                     else CUDA device 0 when a GPU is present, else cpu)\n"       \
    "      --exact        f32 activations in every product: the reference path\n"      \
    "                     (also $CB_EXACT=1); CPU only, the default device then.\n"    \
    "                     The default quantizes activations to 8 bits, as llama.cpp\n" \
    "                     (faster; its error is far below what blending changes)\n"    \
    "      --act8         the default (8-bit activations); undoes an earlier --exact\n"

/* cli_common_opt's answer when the option is the program's own. */
#define CLI_NOT_COMMON (-1)
/* ... and when it handled it and parsing goes on. */
#define CLI_CONTINUE (-2)

/* getopt_long without its messages: an option it rejects ('?') is said in
 * one line, "prog: unknown option '--x' (see --help)" (or one that needs an
 * argument, takes none, or is ambiguous), instead of the whole help. */
int cli_getopt(int argc, char *const argv[], const char *shortopts, const struct option *longopts);

/* Handle option c (cli_getopt's return, arg its optarg).  Returns
 * CLI_CONTINUE when it took a common option, CLI_NOT_COMMON when c is the
 * program's own, or the status to exit with now: 0 after printing -h
 * (usage(stdout)) or --version, 64 after a bad -t (1 to 1024 threads) or
 * an option cli_getopt rejected ('?', said there). */
int cli_common_opt(cli_common *co, int c, const char *arg, void (*usage)(FILE *));

/* Compute threads: -t, else every online core. */
int cli_threads(const cli_common *co);
/* The store directory: --store, else cb_store_default_dir (into buf). */
const char *cli_store_dir(const cli_common *co, char *buf, size_t n);
/* cb_store_open, saying on stderr (unless -q) when create made the store:
 * only cb-store init makes one otherwise, so none appears unannounced. */
cb_status cli_store_open(cb_store **s, const char *dir, int create, cb_error *err);

/* A number in [lo, hi] from s into *out; 0, or -1 after saying which
 * option (opt) got what. */
int cli_parse_num(const char *opt, const char *s, double lo, double hi, double *out);
/* "2G", "512M", "1.5T", "4096" (powers of 1024; K/M/G/T, an optional i
 * and B): bytes >= 1 into *out; -1 when it is not such a size. */
int cli_parse_size(const char *s, uint64_t *out);

/* The index of arg among names[0..n) into *out; 0, or -1 after listing the
 * choices. */
int cli_parse_enum(const char *opt, const char *arg, const char *const *names, int n, int *out);

/* The tokenizer modes (cb-run --tokenize / --detokenize): encode input (no
 * BOS/EOS; special tokens parsed only with `special`) and print the ids on
 * one line, or (decode) read such a line and print the text.  Needs only
 * the model's vocabulary.  Returns an exit code. */
int cli_tokenize(int decode, const char *model, const char *in_name, const char *input, size_t len,
                 int special);

/* Where generated text goes: `out` (or nowhere) and, when `collect`, a
 * NUL-terminated copy of all of it in `all` (the caller frees it). */
typedef struct cli_sink {
    FILE *out;   /* or NULL */
    int collect; /* also keep everything in `all` */
    char *all;
    size_t all_len, all_cap;
} cli_sink;

/* A text callback (cb_gen_params' shape): write p[0..n) to the sink; CB_ERR_NOMEM
 * when the copy cannot grow. */
cb_status cli_sink_write(void *ctx, const char *p, size_t n);

/* ------------------------------------------------------ --batch questions */

/* The names of cb_blend_mode's and cb_blend_strategy's values (in the
 * enums' order; cli_n_strategies of the latter). */
extern const char *const cli_mode_names[4];
extern const char *const cli_strategy_names[];
extern const int cli_n_strategies;

struct json_t; /* jansson's */

/* A question line of cb-run --batch, parsed: the line's JSON object and
 * what the request made from it points into. */
typedef struct cli_question {
    struct json_t *obj; /* the line's object (NULL when the line was none) */
    cb_chunk_src *srcs; /* the request's chunks */
    const char **stops; /* the request's stop strings */
} cli_question;

/* Parse a --batch line (len bytes: a JSON object) into *rq: *defaults with
 * the line's fields over it ("question" or "prompt", "system", "chunks":
 * records with "text", records with only "kv", or store keys; "mode",
 * "ratio" (or "auto"), "strategy", "n_predict", "score", "stop": a string
 * or an array of them).  default_chunks (a json_t array of records, or
 * NULL) serves a line without "chunks"; without mode_given or a "mode",
 * the mode is blend with chunks and full without.  rq points into q and
 * into the line's object until cli_question_free(q).  Returns 0, or -1
 * with the reason in msg (q->obj kept when the line was an object, for its
 * "id"). */
int cli_question_parse(const char *line, size_t len, const cb_request *defaults, int mode_given,
                       struct json_t *default_chunks, cli_question *q, cb_request *rq, char *msg,
                       size_t n);
void cli_question_free(cli_question *q);
/* 1 for a field cli_question_parse reads (the others pass through to the
 * answer). */
int cli_question_reads(const char *field);

#endif
