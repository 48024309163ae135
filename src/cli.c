/* cli.c - front-end helpers shared by the cb-* programs. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *cli_prog = "cb";
int cli_verbosity = 1;

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
        snprintf(buf, sizeof buf, "%s/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(buf, sizeof buf, "%s/.cache/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf",
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

void cli_version(void)
{
    printf("%s (cacheblend) %s\n", cli_prog, CB_VERSION_STRING);
}

char *cli_utf8_clean(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    char *out = malloc(3 * n + 1), *o = out;
    size_t i = 0;
    if (!out)
        return NULL;
    while (i < n) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        int valid = len > 0 && i + len <= n;
        for (size_t k = 1; valid && k < len; k++)
            valid = (p[i + k] & 0xC0) == 0x80;
        if (valid && len > 1) { /* overlong forms, surrogates, past U+10FFFF */
            unsigned cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
            for (size_t k = 1; k < len; k++)
                cp = cp << 6 | (p[i + k] & 0x3F);
            valid = !(len == 2 && cp < 0x80) && !(len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) &&
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
    return out;
}
