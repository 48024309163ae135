/* util.c - the store's file-system helpers: paths, keys, ids, fsync,
 * exclusive file locks, full writes and copies. */
#include "store_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

char *st_asprintf(const char *fmt, ...)
{
    va_list ap;
    char *p = NULL;
    va_start(ap, fmt);
    if (vasprintf(&p, fmt, ap) < 0)
        p = NULL;
    va_end(ap);
    return p;
}

int64_t st_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int st_is_hex(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return 0;
    return 1;
}

int st_key_valid(const char *key)
{
    return key && strlen(key) == CB_STORE_KEY_LEN && key[32] == '-' && st_is_hex(key, 32) &&
           st_is_hex(key + 33, 32);
}

void st_random_hex(char *out, size_t n_hex)
{
    uint8_t b[32];
    size_t nb = (n_hex + 1) / 2;
    static const char hx[] = "0123456789abcdef";
    if (getrandom(b, nb, 0) != (ssize_t)nb) {
        uint64_t x = (uint64_t)st_now_us() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)out;
        for (size_t i = 0; i < nb; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[i] = (uint8_t)x;
        }
    }
    for (size_t i = 0; i < n_hex; i++)
        out[i] = hx[(b[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n_hex] = 0;
}

int st_mkdir_p(const char *path, mode_t mode)
{
    char *p = strdup(path);
    if (!p)
        return -1;
    for (char *q = p + 1; *q; q++) {
        if (*q != '/')
            continue;
        *q = 0;
        if (mkdir(p, mode) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *q = '/';
    }
    int rc = mkdir(p, mode);
    free(p);
    if (rc != 0 && errno != EEXIST)
        return -1;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

void st_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int st_lock_file_ex(const char *path)
{
    struct stat a, b;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        errno = e == EINTR ? EWOULDBLOCK : e;
        return -1;
    }
    /* The path may have been renamed over or unlinked since we opened it. */
    if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
        close(fd);
        errno = ENOENT;
        return -1;
    }
    return fd;
}

int st_unlink_locked(const char *path)
{
    int fd = st_lock_file_ex(path);
    if (fd < 0)
        return errno == EWOULDBLOCK ? 0 : errno == ENOENT ? 1 : -1;
    int rc = unlink(path) == 0 || errno == ENOENT ? 1 : -1;
    close(fd);
    return rc;
}


int st_write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int st_copy_fd(int in, int out, uint64_t n)
{
    static const size_t chunk = 1 << 20;
    char *buf = NULL;
    loff_t off_in = 0, off_out = 0;
    while (n > 0) {
        ssize_t r = copy_file_range(in, &off_in, out, &off_out, n > (1u << 30) ? (1u << 30) : n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n -= (uint64_t)r;
    }
    if (n == 0)
        return 0;
    /* Filesystems without copy_file_range: plain reads and writes. */
    if (!(buf = malloc(chunk)))
        return -1;
    while (n > 0) {
        ssize_t r = pread(in, buf, n < chunk ? n : chunk, off_in);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || pwrite(out, buf, (size_t)r, off_out) != r) {
            free(buf);
            return -1;
        }
        off_in += r;
        off_out += r;
        n -= (uint64_t)r;
    }
    free(buf);
    return 0;
}

int st_tier_index(const cb_store *s, const char *name)
{
    for (int i = 0; i < s->n_tiers; i++)
        if (name && strcmp(s->tiers[i].name, name) == 0)
            return i;
    return -1;
}
