/* fuzz_import - `cb-store import`: cb_store_import reading an archive (tar
 * in any format and compression libarchive reads, zip, cpio) from a
 * descriptor into a store made once in this process's temporary directory;
 * seeded with archives cb-store export wrote of a store holding KV files
 * the tiny fixture model precomputed.
 *
 * Sandbox: files the import writes are capped at 64 MiB (RLIMIT_FSIZE: a
 * larger write fails with EFBIG, SIGXFSZ ignored), and every entry is
 * removed again after each input.
 *
 * Properties: the store verifies clean after any import (rejected members
 * leave nothing behind, no staging file remains); the report's imported
 * count is the number of new entries. */
#include "cbcore.h"
#include "fuzz.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>

static cb_store *S;
static char *arch_path, *stage_dir;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    cb_error err;
    char *dir;
    struct rlimit rl = {64u << 20, 64u << 20};
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &rl);
    if (asprintf(&dir, "%s/store", fuzz_tmpdir()) < 0 ||
        asprintf(&arch_path, "%s/in.archive", fuzz_tmpdir()) < 0 ||
        asprintf(&stage_dir, "%s/tmp", dir) < 0)
        abort();
    if (cb_store_open(&S, dir, 1, &err) != CB_OK) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        exit(1);
    }
    free(dir);
    return 0;
}

typedef struct keys {
    char (*k)[66];
    size_t n, cap;
} keys;

static int collect(void *ctx, const cb_store_entry *e)
{
    keys *ks = ctx;
    if (ks->n == ks->cap) {
        ks->cap = ks->cap ? 2 * ks->cap : 8;
        ks->k = realloc(ks->k, ks->cap * sizeof *ks->k);
        if (!ks->k)
            abort();
    }
    snprintf(ks->k[ks->n++], 66, "%s", e->key);
    return 0;
}

static void problem(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    FUZZ_CHECK(what && msg);
}

static int n_problems;
static void verify_problem(void *ctx, const char *what, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "verify: %s: %s\n", what, msg);
    n_problems++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cb_store_import_report rep;
    cb_error err = {0};
    keys ks = {0};

    fuzz_write_file(arch_path, data, size);
    int fd = open(arch_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        abort();
    cb_status st = cb_store_import(S, NULL, fd, problem, NULL, &rep, &err);
    close(fd);
    FUZZ_CHECK(st == CB_OK || st == CB_ERR_FORMAT || st == CB_ERR_IO);
    if (st != CB_OK)
        FUZZ_CHECK(err.msg[0]);

    FUZZ_CHECK(cb_store_list(S, NULL, NULL, collect, &ks, &err) == CB_OK);
    FUZZ_CHECK(ks.n == rep.imported);
    n_problems = 0;
    st = cb_store_verify(S, 0, verify_problem, NULL, NULL, &err);
    FUZZ_CHECK(st == CB_OK && n_problems == 0);
    /* nothing staged is left */
    DIR *d = opendir(stage_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            FUZZ_CHECK(!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."));
        closedir(d);
    }
    for (size_t i = 0; i < ks.n; i++)
        FUZZ_CHECK(cb_store_remove(S, ks.k[i], &err) == CB_OK);
    FUZZ_CHECK(cb_store_gc(S, NULL, &err) == CB_OK);
    free(ks.k);
    return 0;
}
