/* test.h - a minimal TAP producer for the unit tests.
 *
 * Each test program calls TEST_BEGIN(), runs checks grouped by tcase(),
 * and ends with TEST_END().  Every tcase() prints one TAP line: "ok N - name"
 * or "not ok N - name" (with the failed checks as "# " diagnostics before it),
 * or "ok N - name # SKIP reason".  tests/run.sh counts those lines. */
#ifndef CB_TEST_H
#define CB_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_num, t_failed_cases, t_case_fail, t_in_case;
static char t_case_name[256];

static void t_case_end(void)
{
    if (!t_in_case)
        return;
    ++t_num;
    if (t_case_fail) {
        ++t_failed_cases;
        printf("not ok %d - %s\n", t_num, t_case_name);
    } else {
        printf("ok %d - %s\n", t_num, t_case_name);
    }
    fflush(stdout);
    t_in_case = 0;
}

/* Start a named test case (ends the previous one). */
static void tcase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void tcase(const char *fmt, ...)
{
    va_list ap;
    t_case_end();
    va_start(ap, fmt);
    vsnprintf(t_case_name, sizeof t_case_name, fmt, ap);
    va_end(ap);
    t_case_fail = 0;
    t_in_case = 1;
}

/* Report a skipped case. */
__attribute__((unused)) static void tskip(const char *name, const char *why)
{
    t_case_end();
    ++t_num;
    printf("ok %d - %s # SKIP %s\n", t_num, name, why);
    fflush(stdout);
}

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("#   %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            t_case_fail = 1;                                                    \
        }                                                                       \
    } while (0)

#define CHECKF(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("#   %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            t_case_fail = 1;                                                    \
        }                                                                       \
    } while (0)

#define CHECK_OK(expr)                                                               \
    do {                                                                             \
        int t_st_ = (int)(expr);                                                     \
        if (t_st_ != 0) {                                                            \
            printf("#   %s:%d: %s returned %d\n", __FILE__, __LINE__, #expr, t_st_); \
            t_case_fail = 1;                                                         \
        }                                                                            \
    } while (0)

#define TEST_BEGIN() setvbuf(stdout, NULL, _IOLBF, 0)
#define TEST_END()                     \
    do {                               \
        t_case_end();                  \
        printf("1..%d\n", t_num);      \
        return t_failed_cases ? 1 : 0; \
    } while (0)

/* Directory of ../shared/data relative to the repository root, or NULL. */
__attribute__((unused)) static const char *t_shared_data(void)
{
    const char *e = getenv("CB_SHARED_DATA");
    static const char *cands[] = {"../shared/data", "../../shared/data", NULL};
    FILE *f;
    if (e && *e)
        return e;
    for (int i = 0; cands[i]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/musique_s.json", cands[i]);
        if ((f = fopen(p, "rb")) != NULL) {
            fclose(f);
            return cands[i];
        }
        snprintf(p, sizeof p, "%s/tokenizer", cands[i]);
        if ((f = fopen(p, "rb")) != NULL) {
            fclose(f);
            return cands[i];
        }
    }
    return NULL;
}

/* The exact path (f32 activations in every product, the CPU, every core):
 * the reference every bound of these tests is stated against.  The default
 * (8-bit activations) has cases of its own, each saying its bound. */
__attribute__((unused)) static const cb_model_params T_EXACT = {0, NULL, 1, NULL};

/* A model in the model cache, when present: $env if set, else file;
 * NULL when absent. */
__attribute__((unused)) static const char *t_cached_model(const char *env, const char *file,
                                                          char *buf, size_t n)
{
    const char *e = getenv(env);
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    FILE *f;
    if (e && *e)
        snprintf(buf, n, "%s", e);
    else if (cache && *cache)
        snprintf(buf, n, "%s/cacheblend/models/%s", cache, file);
    else
        snprintf(buf, n, "%s/.cache/cacheblend/models/%s", home ? home : ".", file);
    if ((f = fopen(buf, "rb")) == NULL)
        return NULL;
    fclose(f);
    return buf;
}

/* The tests' small real model, SmolLM2-135M-Instruct Q4_1 (make model
 * MODEL=smollm2; $CB_SMOL_MODEL overrides), when present, else NULL. */
__attribute__((unused)) static const char *t_smol_model(void)
{
    static char buf[1024];
    return t_cached_model("CB_SMOL_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf", buf, sizeof buf);
}

/* The programs' default model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (make
 * model; $CB_MODEL overrides), when present, else NULL. */
__attribute__((unused)) static const char *t_default_model(void)
{
    static char buf[1024];
    return t_cached_model("CB_MODEL", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", buf, sizeof buf);
}

/* Path of the second real model, Gemma-3-270M Q4_K_M (make model
 * MODEL=gemma), when present ($CB_GEMMA_MODEL overrides), else NULL. */
__attribute__((unused)) static const char *t_gemma_model(void)
{
    static char buf[1024];
    return t_cached_model("CB_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf", buf, sizeof buf);
}

/* Read a whole file into a malloc'd NUL-terminated buffer. */
__attribute__((unused)) static char *t_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

#endif
