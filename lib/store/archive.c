/* archive.c - moving entries between stores as archives (libarchive):
 * export writes a tar (pax) with one "<key>.kv" per entry, zstd-compressed
 * by default; import reads any tar (or zip, cpio), refuses every entry that
 * is not a plain, safely named, valid KV file, and adopts the rest. */
#include "store_impl.h"
#include "../core/vec.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>


static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static cb_store_compress compress_for(const char *path)
{
    if (!path)
        return CB_STORE_COMPRESS_ZSTD;
    if (ends_with(path, ".tar"))
        return CB_STORE_COMPRESS_NONE;
    if (ends_with(path, ".tar.gz") || ends_with(path, ".tgz"))
        return CB_STORE_COMPRESS_GZIP;
    if (ends_with(path, ".tar.xz") || ends_with(path, ".txz"))
        return CB_STORE_COMPRESS_XZ;
    return CB_STORE_COMPRESS_ZSTD;
}

typedef struct keyl {
    char (*v)[CB_STORE_KEY_LEN + 1];
    size_t n, cap;
} keyl;

static int collect_key(void *ctx, const cb_store_entry *e)
{
    keyl *l = ctx;
    if (l->n == l->cap) {
        void *nv = cb_vec_reserve(l->v, &l->cap, l->n + 1, sizeof *l->v, 256);
        if (!nv)
            return 1;
        l->v = nv;
    }
    snprintf(l->v[l->n++], CB_STORE_KEY_LEN + 1, "%s", e->key);
    return 0;
}

cb_status cb_store_export(cb_store *s, const char *path, int fd, const char *const *keys,
                          size_t n_keys, cb_store_compress compress, uint64_t *n_out, cb_error *err)
{
    struct archive *a = NULL;
    struct archive_entry *ae = NULL;
    keyl all = {0};
    char *tmp = NULL, *buf = NULL;
    int out = -1;
    uint64_t count = 0;
    cb_status st = CB_OK;

    if (n_out)
        *n_out = 0;
    if (!s || (!path && fd < 0))
        return cb_error_set(err, CB_ERR_INVALID, "export: no archive");
    for (size_t i = 0; i < n_keys; i++) {
        int found;
        if (!st_key_valid(keys[i]))
            return cb_error_set(err, CB_ERR_INVALID, "'%s' is not a store key", keys[i]);
        if ((st = cb_store_lookup(s, keys[i], &found)) != CB_OK)
            return cb_error_set(err, st, "%s: lookup failed", keys[i]);
        if (!found)
            return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: not in the store", keys[i]);
    }
    if (n_keys == 0) {
        if ((st = cb_store_list(s, NULL, NULL, collect_key, &all, err)) != CB_OK)
            goto done;
    }
    if (compress == CB_STORE_COMPRESS_AUTO)
        compress = compress_for(path);
    if (!(buf = malloc(1 << 20)) || !(a = archive_write_new()) || !(ae = archive_entry_new())) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    int rc = archive_write_set_format_pax_restricted(a);
    if (rc == ARCHIVE_OK) {
        switch (compress) {
        case CB_STORE_COMPRESS_NONE: rc = archive_write_add_filter_none(a); break;
        case CB_STORE_COMPRESS_GZIP: rc = archive_write_add_filter_gzip(a); break;
        case CB_STORE_COMPRESS_XZ: rc = archive_write_add_filter_xz(a); break;
        default: rc = archive_write_add_filter_zstd(a); break;
        }
    }
    if (rc != ARCHIVE_OK) {
        st = cb_error_set(err, CB_ERR_UNSUPPORTED, "export: %s", archive_error_string(a));
        goto done;
    }
    if (path) {
        size_t n = strlen(path) + 16;
        if (!(tmp = malloc(n))) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        snprintf(tmp, n, "%s.tmp.XXXXXX", path);
        if ((out = mkstemp(tmp)) < 0) {
            st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", path, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto done;
        }
        fchmod(out, 0644);
        fd = out;
    }
    /* No padding of the last block (libarchive pads for pipes and stdout),
     * which would put zeros after a compressed stream that readers refuse. */
    archive_write_set_bytes_in_last_block(a, 1);
    if (archive_write_open_fd(a, fd) != ARCHIVE_OK) {
        st =
            cb_error_set(err, CB_ERR_IO, "%s: %s", path ? path : "export", archive_error_string(a));
        goto done;
    }
    size_t total = n_keys ? n_keys : all.n;
    for (size_t i = 0; i < total; i++) {
        const char *key = n_keys ? keys[i] : all.v[i];
        cb_store_ref *ref = NULL;
        char name[CB_STORE_KEY_LEN + 8];
        struct stat sb;
        /* Read under the reader's guarantee, without counting an access.
         * With every entry asked for, one evicted since the listing is
         * simply not there; a key asked for by name must be. */
        if ((st = st_acquire(s, key, 0, &ref, err)) != CB_OK) {
            if (st == CB_ERR_NOT_FOUND && n_keys == 0) {
                st = CB_OK;
                continue;
            }
            goto done;
        }
        fstat(ref->fd, &sb);
        snprintf(name, sizeof name, "%s.kv", key);
        archive_entry_clear(ae);
        archive_entry_set_pathname(ae, name);
        archive_entry_set_filetype(ae, AE_IFREG);
        archive_entry_set_perm(ae, 0644);
        archive_entry_set_size(ae, sb.st_size);
        archive_entry_set_mtime(ae, sb.st_mtim.tv_sec, 0);
        if (archive_write_header(a, ae) != ARCHIVE_OK) {
            st = cb_error_set(err, CB_ERR_IO, "%s: %s", name, archive_error_string(a));
            cb_store_release(ref);
            goto done;
        }
        off_t off = 0;
        while (off < sb.st_size) {
            ssize_t r = pread(ref->fd, buf, 1 << 20, off);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0 || archive_write_data(a, buf, (size_t)r) != r) {
                st = cb_error_set(err, CB_ERR_IO, "%s: %s", name,
                                  r <= 0 ? strerror(errno) : archive_error_string(a));
                cb_store_release(ref);
                goto done;
            }
            off += r;
        }
        cb_store_release(ref);
        count++;
    }
    if (archive_write_close(a) != ARCHIVE_OK) {
        st =
            cb_error_set(err, CB_ERR_IO, "%s: %s", path ? path : "export", archive_error_string(a));
        goto done;
    }
    if (out >= 0) {
        if (fsync(out) != 0 || close(out) != 0) {
            out = -1;
            st = cb_error_set(err, CB_ERR_IO, "%s: %s", path, strerror(errno));
            goto done;
        }
        out = -1;
        if (rename(tmp, path) != 0) {
            st = cb_error_set(err, CB_ERR_CREATE, "%s: %s", path, strerror(errno));
            goto done;
        }
    }
    if (n_out)
        *n_out = count;
done:
    if (a)
        archive_write_free(a);
    archive_entry_free(ae);
    if (out >= 0)
        close(out);
    if (tmp && st != CB_OK)
        unlink(tmp);
    free(tmp);
    free(buf);
    free(all.v);
    return st;
}

/* Why an archive member name is refused, or NULL. */
static const char *bad_name(const char *name)
{
    if (!name || !*name)
        return "no name";
    if (name[0] == '/' || name[0] == '\\')
        return "an absolute path";
    if (strchr(name, '\\') || (strlen(name) > 1 && name[1] == ':'))
        return "a DOS path";
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return "a path with '..'";
        if (!e)
            break;
        p = e + 1;
    }
    return NULL;
}

static const char *base_name(const char *p)
{
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* The most an import may stage: the largest tier's capacity when every
 * tier has one (a larger entry fits nowhere), and the space free where the
 * staging file lives; *what says which bound it is.  UINT64_MAX: none. */
static uint64_t import_room(const cb_store *s, const char *stage_dir, const char **what)
{
    uint64_t room = UINT64_MAX, largest = 0;
    struct statvfs vfs;
    int bounded = s->n_tiers > 0;
    *what = NULL;
    for (int t = 0; t < s->n_tiers; t++) {
        bounded &= s->tiers[t].cap > 0;
        if (s->tiers[t].cap > largest)
            largest = s->tiers[t].cap;
    }
    if (bounded) {
        room = largest;
        *what = "the largest tier's capacity";
    }
    if (statvfs(stage_dir, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < room) {
        room = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        *what = "the space free for staging";
    }
    return room;
}

/* Read up to n bytes of the current member: the count, or -1. */
static la_ssize_t read_upto(struct archive *a, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        la_ssize_t r = archive_read_data(a, buf + got, n - got);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (la_ssize_t)got;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return errno ? errno : EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* How staging one member went. */
enum { STAGED, REJECTED, FAILED };

/* Stage the current member (`name` in archive `an`, which the archive says
 * holds `declared` bytes) into `stage`, reading no more than a KV file with
 * the member's own header can be: the fixed header first (a member that is
 * not a KV file, or whose size is not its header's, is REJECTED with *why
 * in msg, and skipped), and never more than `room` (a member claiming more
 * FAILED at once, before anything is written, so that a decompression bomb
 * neither fills the disk nor is read to its end).  FAILED sets *fst and err
 * and leaves no staging file. */
static int stage_member(struct archive *a, const char *an, const char *name, uint64_t declared,
                        uint64_t room, const char *room_what, const char *stage, char *buf,
                        size_t bufsize, cb_error *msg, cb_status *fst, cb_error *err)
{
    uint64_t expect, done = 0;
    if (declared > room) {
        *fst = cb_error_set(
            err, strstr(room_what, "free") ? CB_ERR_IO : CB_ERR_FORMAT,
            "%s: %s: %llu bytes, more than %s (%llu bytes): nothing imported from it", an, name,
            (unsigned long long)declared, room_what, (unsigned long long)room);
        return FAILED;
    }
    la_ssize_t r = read_upto(a, buf, 128);
    if (r < 0) {
        *fst = cb_error_set(err, CB_ERR_FORMAT, "%s: %s: %s", an, name, archive_error_string(a));
        return FAILED;
    }
    if (cb_kv_header_size(buf, (size_t)r, name, &expect, msg) != CB_OK) {
        archive_read_data_skip(a);
        return REJECTED;
    }
    if (declared != expect) {
        cb_error_set(msg, CB_ERR_FORMAT,
                     "%s: holds %llu bytes, but a KV file with its header is %llu bytes", name,
                     (unsigned long long)declared, (unsigned long long)expect);
        archive_read_data_skip(a);
        return REJECTED;
    }
    int out = open(stage, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), werr = 0;
    if (out < 0) {
        *fst = cb_error_set(err, CB_ERR_CREATE, "%s: %s", stage, strerror(errno));
        return FAILED;
    }
    while (r > 0) {
        /* a stream may yield more than its member declared (zip): stop there */
        if ((uint64_t)r > expect - done) {
            close(out);
            unlink(stage);
            *fst = cb_error_set(
                err, CB_ERR_FORMAT,
                "%s: %s: holds more than the %llu bytes its archive entry and KV header give: nothing "
                "imported from it",
                an, name, (unsigned long long)expect);
            return FAILED;
        }
        if ((werr = write_all(out, buf, (size_t)r)) != 0)
            break;
        done += (uint64_t)r;
        r = archive_read_data(a, buf, bufsize);
    }
    close(out);
    if (werr) {
        unlink(stage);
        *fst = cb_error_set(err, CB_ERR_IO, "%s: %s", stage, strerror(werr));
        return FAILED;
    }
    if (r < 0) {
        unlink(stage);
        *fst = cb_error_set(err, CB_ERR_FORMAT, "%s: %s: %s", an, name, archive_error_string(a));
        return FAILED;
    }
    return STAGED;
}

cb_status cb_store_import(cb_store *s, const char *path, int fd,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          cb_store_import_report *rep, cb_error *err)
{
    cb_store_import_report dummy;
    struct archive *a = NULL;
    struct archive_entry *ae;
    char *stage = NULL, *buf = NULL;
    cb_status st = CB_OK;
    int rc;

    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (!s || (!path && fd < 0))
        return cb_error_set(err, CB_ERR_INVALID, "import: no archive");
    if ((st = st_owner(s, err)) != CB_OK)
        return st;
    if (path && access(path, R_OK) != 0)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "%s: %s", path, strerror(errno));
    char tdir[4096];
    const char *an = path ? path : "(stdin)";
    snprintf(tdir, sizeof tdir, "%s/tmp", s->dir);
    {
        size_t n = strlen(s->dir) + 64;
        mkdir(tdir, 0755);
        if (!(stage = malloc(n)) || !(buf = malloc(1 << 20))) {
            st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
            goto done;
        }
        /* Named as a temporary file of this handle: gc removes it after a crash. */
        snprintf(stage, n, "%s/tmp/import.kv.tmp.%s", s->dir, s->owner);
    }
    if (!(a = archive_read_new())) {
        st = cb_error_set(err, CB_ERR_NOMEM, "out of memory");
        goto done;
    }
    archive_read_support_filter_all(a);
    archive_read_support_format_tar(a);
    archive_read_support_format_cpio(a);
    archive_read_support_format_zip(a);
    rc = path ? archive_read_open_filename(a, path, 1 << 20) : archive_read_open_fd(a, fd, 1 << 20);
    if (rc != ARCHIVE_OK) {
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: %s", path ? path : "(stdin)",
                          archive_error_string(a));
        goto done;
    }
    for (;;) {
        rc = archive_read_next_header(a, &ae);
        if (rc == ARCHIVE_EOF)
            break;
        if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
            st = cb_error_set(err, CB_ERR_FORMAT, "%s: %s", path ? path : "(stdin)",
                              archive_error_string(a));
            goto done;
        }
        const char *name = archive_entry_pathname(ae);
        const char *why = bad_name(name);
        mode_t type = archive_entry_filetype(ae);
        if (!why && type == AE_IFDIR) {
            rep->skipped++;
            continue;
        }
        if (!why && (archive_entry_symlink(ae) || type == AE_IFLNK))
            why = "a symbolic link";
        else if (!why && archive_entry_hardlink(ae))
            why = "a hard link";
        else if (!why && type != AE_IFREG)
            why = "not a regular file";
        else if (!why && (!archive_entry_size_is_set(ae) || archive_entry_size(ae) < 0))
            why = "no size";
        if (why) {
            rep->rejected++;
            if (problem)
                problem(ctx, name ? name : "(unnamed)", why);
            archive_read_data_skip(a);
            continue;
        }
        /* Stage the member, bounded by its own KV header, then adopt it
         * like `put FILE`: verified in full. */
        cb_error e;
        const char *room_what;
        uint64_t room = import_room(s, tdir, &room_what);
        int how = stage_member(a, an, name, (uint64_t)archive_entry_size(ae), room,
                               room_what ? room_what : "", stage, buf, 1 << 20, &e, &st, err);
        if (how == FAILED)
            goto done;
        if (how == REJECTED) {
            rep->rejected++;
            size_t nl = strlen(name);
            if (problem) /* the member's name is the problem's subject already */
                problem(ctx, name,
                        strncmp(e.msg, name, nl) == 0 && e.msg[nl] == ':' ? e.msg + nl + 2 : e.msg);
            continue;
        }
        char key[66], expect[CB_STORE_KEY_LEN + 1];
        int existed = 0;
        const char *b = base_name(name);
        int named = strlen(b) == CB_STORE_KEY_LEN + 3 && strcmp(b + CB_STORE_KEY_LEN, ".kv") == 0;
        if (named) {
            memcpy(expect, b, CB_STORE_KEY_LEN);
            expect[CB_STORE_KEY_LEN] = 0;
        }
        /* A member named like a key must hold that key. */
        cb_status pst = st_put_file(s, stage, 1, named ? expect : NULL, key, &existed, &e);
        if (pst == CB_OK) {
            if (existed)
                rep->existed++;
            else
                rep->imported++;
        } else if (pst == CB_ERR_FORMAT || pst == CB_ERR_CHECKSUM || pst == CB_ERR_UNSUPPORTED ||
                   pst == CB_ERR_NOT_FOUND || pst == CB_ERR_INVALID) {
            rep->rejected++;
            if (problem) {
                /* The staging path in a message means nothing to the user. */
                const char *m = e.msg;
                size_t sl = strlen(stage);
                if (strncmp(m, stage, sl) == 0 && m[sl] == ':' && m[sl + 1] == ' ')
                    m += sl + 2;
                problem(ctx, name, m);
            }
        } else {
            unlink(stage);
            st = cb_error_set(err, pst, "%s", e.msg);
            goto done;
        }
        unlink(stage);
    }
    if (rep->rejected)
        st = cb_error_set(err, CB_ERR_FORMAT, "%s: %llu entries rejected", path ? path : "(stdin)",
                          (unsigned long long)rep->rejected);
done:
    if (a)
        archive_read_free(a);
    if (stage)
        unlink(stage);
    free(stage);
    free(buf);
    return st;
}
