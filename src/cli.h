/* cli.h - front-end helpers shared by the cb-* programs (not part of
 * libcbcore): exit codes, model and store paths, input, and stdout checks. */
#ifndef CB_CLI_H
#define CB_CLI_H

#include "cbcore.h"

#include <stddef.h>
#include <stdio.h>

/* Exit statuses of every program (sysexits.h values). */
enum cli_exit {
    CLI_EX_OK = 0,
    CLI_EX_USAGE = 64,    /* bad command line */
    CLI_EX_DATAERR = 65,  /* bad input data: malformed GGUF, JSON, KV file */
    CLI_EX_NOINPUT = 66,  /* input file missing or unreadable */
    CLI_EX_UNAVAILABLE = 69, /* the compute device asked for is not available */
    CLI_EX_SOFTWARE = 70, /* internal error */
    CLI_EX_CANTCREAT = 73,/* cannot create output */
    CLI_EX_IOERR = 74     /* I/O error */
};

/* The running program's name for messages ("cb-run"). */
extern const char *cli_prog;
/* -v / -q levels: 0 quiet, 1 normal, 2 verbose. */
extern int cli_verbosity;

/* Map a library status to an exit status. */
int cli_exit_code(cb_status st);

/* "prog: message" on stderr. */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same, only when -v was given. */
void cli_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The model path: `opt` (-m), else $CB_MODEL, else the default model in the
 * model cache.  Returns a pointer to static storage. */
const char *cli_model_path(const char *opt);
/* The compute device: opt (--device), else $CB_DEVICE, else "auto" (CUDA
 * device 0 when present, else the CPU). */
const char *cli_device(const char *opt);

/* Read all of `path` ("-" or NULL: stdin) into a malloc'd buffer with a NUL
 * after the last byte.  On failure prints a message and returns NULL with
 * *exit_code set (66 for a missing file, 74 for a read error). */
char *cli_read_input(const char *path, size_t *len, int *exit_code);

/* Flush and close stdout; a failure (a full disk, a closed pipe) is an I/O
 * error: prints a message and returns 74, else returns `code`. */
int cli_finish(int code);

/* A malloc'd NUL-terminated copy of n bytes with every invalid UTF-8
 * sequence replaced by U+FFFD (JSON strings must be valid UTF-8). */
char *cli_utf8_clean(const char *s, size_t n);

/* Print the --version line. */
void cli_version(void);

#endif
