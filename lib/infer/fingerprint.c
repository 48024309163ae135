/* fingerprint.c - the model fingerprint that ties KV files to one model.
 *
 * XXH3-128 over, in order: a format tag; every metadata entry whose key
 * starts with "<arch>." or "tokenizer.ggml." (key, type, value; arrays
 * element by element in their file encoding); then every tensor's name,
 * type, shape and data.  general.* (names, licences, quantization notes)
 * is left out on purpose: it does not change what the model computes. */
#include "infer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

static void upd(XXH3_state_t *st, const void *p, size_t n) { XXH3_128bits_update(st, p, n); }

static void upd_str(XXH3_state_t *st, cb_strview s)
{
    uint64_t n = s.len;
    upd(st, &n, 8);
    upd(st, s.data, s.len);
}

static int has_prefix(cb_strview k, const char *p, size_t n)
{
    return k.len > n && memcmp(k.data, p, n) == 0;
}

cb_status cb_gguf_fingerprint(const cb_gguf *g, cb_hash128 *out)
{
    static const size_t esz[CB_GGUF_TYPE_COUNT_] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    XXH3_state_t *st = XXH3_createState();
    cb_strview arch = cb_gguf_str(g, "general.architecture");
    char prefix[80];
    size_t plen;

    if (!st)
        return CB_ERR_NOMEM;
    snprintf(prefix, sizeof prefix, "%.*s.", (int)(arch.len < 70 ? arch.len : 70),
             arch.data ? arch.data : "");
    plen = strlen(prefix);
    XXH3_128bits_reset(st);
    upd(st, "cacheblend-fingerprint-1", 24);
    upd_str(st, arch);
    for (int64_t i = 0; i < cb_gguf_n_kv(g); i++) {
        cb_strview k = cb_gguf_key(g, i);
        if (!has_prefix(k, prefix, plen) && !has_prefix(k, "tokenizer.ggml.", 15))
            continue;
        uint32_t t = cb_gguf_kv_type(g, i);
        upd_str(st, k);
        upd(st, &t, 4);
        if (t == CB_GGUF_STRING) {
            cb_strview v;
            cb_gguf_get_str(g, i, &v);
            upd_str(st, v);
        } else if (t == CB_GGUF_ARRAY) {
            uint32_t et = cb_gguf_arr_type(g, i);
            uint64_t n = cb_gguf_arr_len(g, i);
            upd(st, &et, 4);
            upd(st, &n, 8);
            if (et == CB_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    cb_strview v;
                    cb_gguf_arr_get_str(g, i, j, &v);
                    upd_str(st, v);
                }
            } else if (et < CB_GGUF_TYPE_COUNT_ && esz[et]) {
                upd(st, cb_gguf_arr_data(g, i), (size_t)n * esz[et]);
            }
        } else {
            /* scalars: their value widened, so the encoding width does not matter */
            int64_t iv;
            double fv;
            int bv;
            if (cb_gguf_get_int(g, i, &iv) == CB_OK)
                upd(st, &iv, 8);
            else if (cb_gguf_get_float(g, i, &fv) == CB_OK)
                upd(st, &fv, 8);
            else if (cb_gguf_get_bool(g, i, &bv) == CB_OK)
                upd(st, &bv, sizeof bv);
        }
    }
    for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++) {
        cb_tensor_info ti;
        uint32_t t;
        cb_gguf_tensor(g, i, &ti);
        t = ti.type;
        upd_str(st, ti.name);
        upd(st, &t, 4);
        upd(st, ti.ne, sizeof ti.ne);
        upd(st, ti.data, ti.nbytes);
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    out->lo = h.low64;
    out->hi = h.high64;
    return CB_OK;
}

/* The record of path's fingerprint in dir: "fp-" and the XXH3-64 of the
 * path, holding one line: a tag, the file's identity and the fingerprint. */
static void record_name(const char *dir, const char *path, char *buf, size_t n)
{
    char *real = realpath(path, NULL);
    const char *p = real ? real : path;
    snprintf(buf, n, "%s/fp-%016llx", dir, (unsigned long long)XXH3_64bits(p, strlen(p)));
    free(real);
}

static void identity(const struct stat *sb, char *buf, size_t n)
{
    snprintf(buf, n, "cacheblend-fp-1 %llu %llu %lld %lld.%09ld %lld.%09ld",
             (unsigned long long)sb->st_dev, (unsigned long long)sb->st_ino, (long long)sb->st_size,
             (long long)sb->st_mtim.tv_sec, (long)sb->st_mtim.tv_nsec,
             (long long)sb->st_ctim.tv_sec, (long)sb->st_ctim.tv_nsec);
}

cb_status cb_gguf_fingerprint_cached(const cb_gguf *g, const char *path, const char *dir,
                                     cb_hash128 *out)
{
    char rec[4096], id[256], line[512];
    struct stat sb;
    cb_status st;
    if (!dir || !*dir || stat(path, &sb) != 0 || (size_t)sb.st_size != cb_gguf_file_size(g))
        return cb_gguf_fingerprint(g, out);
    record_name(dir, path, rec, sizeof rec);
    identity(&sb, id, sizeof id);
    FILE *f = fopen(rec, "r");
    if (f) {
        size_t il = strlen(id);
        int hit = fgets(line, sizeof line, f) && strncmp(line, id, il) == 0 && line[il] == ' ';
        fclose(f);
        if (hit) {
            line[strcspn(line, "\n")] = 0;
            if (cb_hash128_parse(line + il + 1, out) == CB_OK)
                return CB_OK;
        }
    }
    if ((st = cb_gguf_fingerprint(g, out)) != CB_OK)
        return st;
    char hex[33];
    cb_error err;
    cb_hash128_hex(*out, hex);
    int n = snprintf(line, sizeof line, "%s %s\n", id, hex);
    if ((mkdir(dir, 0700) == 0 || errno == EEXIST) && n > 0 && (size_t)n < sizeof line)
        (void)cb_file_write_atomic(rec, line, (size_t)n,
                                   &err); /* a cache: not recording is not an error */
    return CB_OK;
}
