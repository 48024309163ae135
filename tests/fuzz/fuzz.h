/* fuzz.h - helpers shared by the libFuzzer harnesses in tests/fuzz/.
 *
 * Each harness is one fuzz_*.c with LLVMFuzzerTestOneInput; the Makefile
 * fragment tests/fuzz/fuzz.mk builds them with clang, libFuzzer, ASan and
 * UBSan, and tests/fuzz/run.sh runs them (make fuzz).  A harness that
 * touches the file system does so only inside its own temporary directory
 * (fuzz_tmpdir: $CB_FUZZ_TMP or $TMPDIR or /tmp, then cbfuzz.XXXXXX), which
 * is removed at exit.  Fixtures a harness needs (a vocabulary, a model) are
 * made at build time into the data directory: $CB_FUZZ_DATA, else data/
 * beside the harness binary.
 *
 * FUZZ_CHECK(cond) is the oracle: a property every accepted input must
 * have.  It aborts, so libFuzzer records the input as a crash. */
#ifndef CB_FUZZ_H
#define CB_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FUZZ_CHECK(c)                                                                \
    do {                                                                             \
        if (!(c)) {                                                                  \
            fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                                 \
        }                                                                            \
    } while (0)

static char fuzz_tmp_[PATH_MAX];

static int fuzz_rm_cb_(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p) != 0 && errno != ENOENT ? -1 : 0;
}

/* Remove a directory tree (or a file); quiet when it is missing. */
static inline void fuzz_rmtree(const char *path)
{
    nftw(path, fuzz_rm_cb_, 16, FTW_DEPTH | FTW_PHYS);
}

static void fuzz_tmp_cleanup_(void)
{
    if (fuzz_tmp_[0])
        fuzz_rmtree(fuzz_tmp_);
}

/* This process's temporary directory (made on the first call, removed at
 * exit). */
static inline const char *fuzz_tmpdir(void)
{
    if (!fuzz_tmp_[0]) {
        const char *base = getenv("CB_FUZZ_TMP");
        if (!base || !*base)
            base = getenv("TMPDIR");
        if (!base || !*base)
            base = "/tmp";
        mkdir(base, 0755);
        snprintf(fuzz_tmp_, sizeof fuzz_tmp_, "%s/cbfuzz.XXXXXX", base);
        if (!mkdtemp(fuzz_tmp_)) {
            perror(fuzz_tmp_);
            abort();
        }
        atexit(fuzz_tmp_cleanup_);
    }
    return fuzz_tmp_;
}

/* Write size bytes to path (truncating); aborts on failure, which is the
 * harness's problem, not a finding. */
static inline void fuzz_write_file(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const uint8_t *p = data;
    if (fd < 0) {
        perror(path);
        abort();
    }
    while (size > 0) {
        ssize_t w = write(fd, p, size);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            perror(path);
            abort();
        }
        p += w;
        size -= (size_t)w;
    }
    close(fd);
}

/* A fixture in the data directory, as a path (static buffer per call site
 * is not needed: the result is malloc'd and lives for the process). */
static inline char *fuzz_data_path(const char *name)
{
    const char *dir = getenv("CB_FUZZ_DATA");
    char exe[PATH_MAX], *out;
    if (!dir || !*dir) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0)
            abort();
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        if (asprintf(&out, "%s/data/%s", exe, name) < 0)
            abort();
    } else if (asprintf(&out, "%s/%s", dir, name) < 0) {
        abort();
    }
    if (access(out, R_OK) != 0) {
        fprintf(stderr,
                "fuzz: fixture %s is missing (make fuzz-build makes it; or set CB_FUZZ_DATA)\n",
                out);
        exit(1);
    }
    return out;
}

#endif
