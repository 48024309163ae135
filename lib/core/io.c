/* io.c - read-only file mappings and atomic whole-file writes. */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

cb_status cb_mmap_open(cb_mmap *m, const char *path, cb_error *err)
{
    struct stat sb;
    void *p = NULL;
    int fd;

    m->data = NULL;
    m->size = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return cb_error_set(
            err, e == ENOENT || e == EACCES || e == ENOTDIR ? CB_ERR_NOT_FOUND : CB_ERR_IO,
            "%s: %s", path, strerror(e));
    }
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cb_error_set(err, CB_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not a regular file", path);
    }
    if (sb.st_size > 0) {
        p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cb_error_set(err, e == ENOMEM ? CB_ERR_NOMEM : CB_ERR_IO, "%s: mmap: %s", path,
                                strerror(e));
        }
    }
    close(fd);
    m->data = p;
    m->size = (size_t)sb.st_size;
    return CB_OK;
}

void cb_mmap_close(cb_mmap *m)
{
    if (m && m->data)
        munmap((void *)m->data, m->size);
    if (m) {
        m->data = NULL;
        m->size = 0;
    }
}

/* fsync the directory holding `path`, so that a rename is durable. */
static int fsync_parent(const char *path)
{
    char *dup = strdup(path);
    int fd, rc = -1;

    if (!dup)
        return -1;
    fd = open(dirname(dup), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        rc = fsync(fd);
        close(fd);
    }
    free(dup);
    return rc;
}

cb_status cb_fd_write_all(int fd, const void *data, size_t size, const char *what, cb_error *err)
{
    const uint8_t *p = data;
    while (size > 0) {
        ssize_t w = write(fd, p, size);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return cb_error_set(err, CB_ERR_IO, "%s: write: %s", what, strerror(errno));
        }
        p += w;
        size -= (size_t)w;
    }
    return CB_OK;
}

typedef struct buf_emit {
    const void *data;
    size_t size;
    const char *what;
} buf_emit;

static cb_status emit_buffer(void *ctx, int fd, cb_error *err)
{
    buf_emit *b = ctx;
    return cb_fd_write_all(fd, b->data, b->size, b->what, err);
}

cb_status cb_file_write_atomic(const char *path, const void *data, size_t size, cb_error *err)
{
    buf_emit b = {data, size, path};
    return cb_file_write_atomic_fn(path, emit_buffer, &b, err);
}

/* A path that names something other than a regular file (/dev/null,
 * /dev/stdout, a FIFO) is written where it is: a rename would put a
 * regular file in the device's place.  CB_OK, or the error. */
static cb_status write_special(const char *path, cb_emit_fn emit, void *ctx, cb_error *err)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return cb_error_set(err, CB_ERR_CREATE, "%s: %s", path, strerror(errno));
    cb_status st = emit(ctx, fd, err);
    if (close(fd) != 0 && st == CB_OK)
        st = cb_error_set(err, CB_ERR_IO, "%s: close: %s", path, strerror(errno));
    return st;
}

cb_status cb_file_write_atomic_fn(const char *path, cb_emit_fn emit, void *ctx, cb_error *err)
{
    size_t n = strlen(path);
    char *tmp;
    cb_status st = CB_OK;
    int fd;
    struct stat sb;

    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode))
        return write_special(path, emit, ctx, err);
    if (!(tmp = malloc(n + 32)))
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    /* Temporary names start with the target's name and end in .tmp.XXXXXX so
     * that a store's gc can recognise and remove leftovers after a crash. */
    snprintf(tmp, n + 32, "%s.tmp.XXXXXX", path);
    fd = mkstemp(tmp);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return cb_error_set(err, CB_ERR_CREATE, "%s: cannot create temporary file: %s", path,
                            strerror(e));
    }
    if ((st = emit(ctx, fd, err)) != CB_OK)
        goto fail;
    if (fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = cb_error_set(err, CB_ERR_IO, "%s: close: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = cb_error_set(err, CB_ERR_CREATE, "%s: rename: %s", path, strerror(errno));
        goto fail;
    }
    fsync_parent(path);
    free(tmp);
    return CB_OK;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    free(tmp);
    return st;
}
