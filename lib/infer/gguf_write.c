/* gguf_write.c - build a GGUF (version 3) file in memory and save it
 * atomically, the tensors streamed (those added with a fill callback are
 * produced a chunk of rows at a time, so files larger than memory can be
 * written: the 7B-shaped bench fixtures).  Used by the fixture generator and tests; layout as described
 * at the top of gguf.c. */
#include "infer.h"
#include "../core/vec.h"

#include <stdlib.h>
#include <string.h>

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* serialized value (after the type field) */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    cb_type type;
    uint32_t n_dims;
    int64_t ne[CB_GGUF_MAX_DIMS];
    uint8_t *data; /* NULL: produced by fill at save */
    size_t nbytes;
    cb_gguf_fill_fn fill;
    void *fill_ctx;
} wtensor;

struct cb_gguf_writer {
    size_t alignment;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
};

static const size_t elem_size[CB_GGUF_TYPE_COUNT_] = {
    [CB_GGUF_UINT8] = 1,  [CB_GGUF_INT8] = 1,  [CB_GGUF_UINT16] = 2,  [CB_GGUF_INT16] = 2,
    [CB_GGUF_UINT32] = 4, [CB_GGUF_INT32] = 4, [CB_GGUF_FLOAT32] = 4, [CB_GGUF_BOOL] = 1,
    [CB_GGUF_UINT64] = 8, [CB_GGUF_INT64] = 8, [CB_GGUF_FLOAT64] = 8,
};

cb_gguf_writer *cb_gguf_writer_new(size_t alignment)
{
    cb_gguf_writer *w = calloc(1, sizeof *w);
    if (w)
        w->alignment = alignment ? alignment : 32;
    return w;
}

void cb_gguf_writer_free(cb_gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->kv);
    free(w->t);
    free(w);
}

/* Take ownership of val: replace the value of an existing key or append. */
static cb_status put_kv(cb_gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t len)
{
    if (!val)
        return CB_ERR_NOMEM;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, key) == 0) {
            free(w->kv[i].val);
            w->kv[i].type = type;
            w->kv[i].val = val;
            w->kv[i].val_len = len;
            return CB_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        wkv *nk = cb_vec_reserve(w->kv, &w->cap_kv, w->n_kv + 1, sizeof *nk, 16);
        if (!nk) {
            free(val);
            return CB_ERR_NOMEM;
        }
        w->kv = nk;
    }
    char *k = strdup(key);
    if (!k) {
        free(val);
        return CB_ERR_NOMEM;
    }
    w->kv[w->n_kv++] = (wkv){k, type, val, len};
    return CB_OK;
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    if (b && n)
        memcpy(b, p, n);
    return b;
}

cb_status cb_gguf_writer_set_u32(cb_gguf_writer *w, const char *key, uint32_t v)
{
    return put_kv(w, key, CB_GGUF_UINT32, dup_bytes(&v, 4), 4);
}

cb_status cb_gguf_writer_set_i32(cb_gguf_writer *w, const char *key, int32_t v)
{
    return put_kv(w, key, CB_GGUF_INT32, dup_bytes(&v, 4), 4);
}

cb_status cb_gguf_writer_set_u64(cb_gguf_writer *w, const char *key, uint64_t v)
{
    return put_kv(w, key, CB_GGUF_UINT64, dup_bytes(&v, 8), 8);
}

cb_status cb_gguf_writer_set_f32(cb_gguf_writer *w, const char *key, float v)
{
    return put_kv(w, key, CB_GGUF_FLOAT32, dup_bytes(&v, 4), 4);
}

cb_status cb_gguf_writer_set_bool(cb_gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return put_kv(w, key, CB_GGUF_BOOL, dup_bytes(&b, 1), 1);
}

cb_status cb_gguf_writer_set_str(cb_gguf_writer *w, const char *key, const char *v)
{
    uint64_t n = strlen(v);
    uint8_t *b = malloc(8 + n);
    if (b) {
        memcpy(b, &n, 8);
        memcpy(b + 8, v, n);
    }
    return put_kv(w, key, CB_GGUF_STRING, b, 8 + n);
}

cb_status cb_gguf_writer_set_arr(cb_gguf_writer *w, const char *key, cb_gguf_type t,
                                 const void *data, uint64_t n)
{
    if ((unsigned)t >= CB_GGUF_TYPE_COUNT_ || elem_size[t] == 0)
        return CB_ERR_INVALID;
    size_t body = (size_t)n * elem_size[t];
    uint8_t *b = malloc(12 + body);
    uint32_t et = t;
    if (b) {
        memcpy(b, &et, 4);
        memcpy(b + 4, &n, 8);
        if (body)
            memcpy(b + 12, data, body);
    }
    return put_kv(w, key, CB_GGUF_ARRAY, b, 12 + body);
}

cb_status cb_gguf_writer_set_arr_str(cb_gguf_writer *w, const char *key, const char *const *strs,
                                     uint64_t n)
{
    size_t len = 12;
    for (uint64_t i = 0; i < n; i++)
        len += 8 + strlen(strs[i]);
    uint8_t *b = malloc(len), *p;
    uint32_t et = CB_GGUF_STRING;
    if (b) {
        memcpy(b, &et, 4);
        memcpy(b + 4, &n, 8);
        p = b + 12;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t sl = strlen(strs[i]);
            memcpy(p, &sl, 8);
            memcpy(p + 8, strs[i], sl);
            p += 8 + sl;
        }
    }
    return put_kv(w, key, CB_GGUF_ARRAY, b, len);
}

static cb_status add_tensor(cb_gguf_writer *w, const char *name, cb_type t, uint32_t n_dims,
                            const int64_t *ne, const void *data, cb_gguf_fill_fn fill, void *ctx)
{
    wtensor wt = {0};
    size_t rows = 1;

    if (n_dims == 0 || n_dims > CB_GGUF_MAX_DIMS || strlen(name) >= 64 ||
        cb_type_block_bytes(t) == 0)
        return CB_ERR_INVALID;
    for (uint32_t d = 0; d < CB_GGUF_MAX_DIMS; d++)
        wt.ne[d] = d < n_dims ? ne[d] : 1;
    for (uint32_t d = 1; d < n_dims; d++)
        rows *= (size_t)ne[d];
    if (ne[0] <= 0 || ne[0] % cb_type_block_elems(t) != 0)
        return CB_ERR_INVALID;
    wt.nbytes = cb_type_row_bytes(t, ne[0]) * rows;
    wt.type = t;
    wt.n_dims = n_dims;
    wt.fill = fill;
    wt.fill_ctx = ctx;
    if (w->n_t == w->cap_t) {
        wtensor *nt = cb_vec_reserve(w->t, &w->cap_t, w->n_t + 1, sizeof *nt, 16);
        if (!nt)
            return CB_ERR_NOMEM;
        w->t = nt;
    }
    wt.name = strdup(name);
    if (data)
        wt.data = dup_bytes(data, wt.nbytes);
    if (!wt.name || (data && !wt.data)) {
        free(wt.name);
        free(wt.data);
        return CB_ERR_NOMEM;
    }
    w->t[w->n_t++] = wt;
    return CB_OK;
}

cb_status cb_gguf_writer_add_tensor(cb_gguf_writer *w, const char *name, cb_type t, uint32_t n_dims,
                                    const int64_t *ne, const void *data)
{
    return add_tensor(w, name, t, n_dims, ne, data, NULL, NULL);
}

cb_status cb_gguf_writer_add_tensor_fn(cb_gguf_writer *w, const char *name, cb_type t,
                                       uint32_t n_dims, const int64_t *ne, cb_gguf_fill_fn fill,
                                       void *ctx)
{
    if (!fill)
        return CB_ERR_INVALID;
    return add_tensor(w, name, t, n_dims, ne, NULL, fill, ctx);
}

static size_t pad_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* The header and tensor infos, padded to the data section: hdr_buf [data_off];
 * *total is the whole file's size. */
static cb_status build_header(const cb_gguf_writer *w, uint8_t **buf, size_t *data_off_out,
                              size_t *total_out)
{
    size_t hdr = 4 + 4 + 8 + 8, data = 0;
    int add_align = w->alignment != 32;
    uint8_t *b, *p;

    for (size_t i = 0; i < w->n_kv; i++) {
        hdr += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].val_len;
        if (strcmp(w->kv[i].key, "general.alignment") == 0)
            add_align = 0;
    }
    if (add_align)
        hdr += 8 + strlen("general.alignment") + 4 + 4;
    for (size_t i = 0; i < w->n_t; i++) {
        hdr += 8 + strlen(w->t[i].name) + 4 + 8 * (size_t)w->t[i].n_dims + 4 + 8;
        data = pad_to(data, w->alignment) + w->t[i].nbytes;
    }
    size_t data_off = pad_to(hdr, w->alignment);
    size_t total = data_off + pad_to(data, w->alignment);
    b = calloc(1, data_off ? data_off : 1);
    if (!b)
        return CB_ERR_NOMEM;
    p = b;
#define PUT(src, n) (memcpy(p, (src), (n)), p += (n))
    uint32_t version = 3, u32;
    uint64_t u64 = w->n_t;
    PUT("GGUF", 4);
    PUT(&version, 4);
    PUT(&u64, 8);
    u64 = w->n_kv + (size_t)add_align;
    PUT(&u64, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        u64 = strlen(w->kv[i].key);
        PUT(&u64, 8);
        PUT(w->kv[i].key, u64);
        PUT(&w->kv[i].type, 4);
        PUT(w->kv[i].val, w->kv[i].val_len);
    }
    if (add_align) {
        u64 = strlen("general.alignment");
        PUT(&u64, 8);
        PUT("general.alignment", u64);
        u32 = CB_GGUF_UINT32;
        PUT(&u32, 4);
        u32 = (uint32_t)w->alignment;
        PUT(&u32, 4);
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        off = pad_to(off, w->alignment);
        u64 = strlen(t->name);
        PUT(&u64, 8);
        PUT(t->name, u64);
        PUT(&t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            PUT(&t->ne[d], 8);
        u32 = t->type;
        PUT(&u32, 4);
        u64 = off;
        PUT(&u64, 8);
        off += t->nbytes;
    }
#undef PUT
    *buf = b;
    *data_off_out = data_off;
    *total_out = total;
    return CB_OK;
}

cb_status cb_gguf_writer_bytes(const cb_gguf_writer *w, void **buf, size_t *size)
{
    uint8_t *hdr, *b;
    size_t data_off, total, off = 0;
    for (size_t i = 0; i < w->n_t; i++)
        if (!w->t[i].data)
            return CB_ERR_INVALID;
    cb_status st = build_header(w, &hdr, &data_off, &total);
    if (st != CB_OK)
        return st;
    b = calloc(1, total ? total : 1);
    if (!b) {
        free(hdr);
        return CB_ERR_NOMEM;
    }
    memcpy(b, hdr, data_off);
    free(hdr);
    for (size_t i = 0; i < w->n_t; i++) {
        off = pad_to(off, w->alignment);
        memcpy(b + data_off + off, w->t[i].data, w->t[i].nbytes);
        off += w->t[i].nbytes;
    }
    *buf = b;
    *size = total;
    return CB_OK;
}

typedef struct save_ctx {
    const cb_gguf_writer *w;
    const char *path;
} save_ctx;

enum { FILL_CHUNK = 4 << 20 }; /* bytes of rows produced at a time */

static cb_status write_zeros(int fd, size_t n, const char *what, cb_error *err)
{
    static const uint8_t zeros[256];
    cb_status st = CB_OK;
    while (n > 0 && st == CB_OK) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        st = cb_fd_write_all(fd, zeros, k, what, err);
        n -= k;
    }
    return st;
}

/* the header, then each tensor's bytes (own or filled), padded */
static cb_status emit_file(void *ctx, int fd, cb_error *err)
{
    const save_ctx *sc = ctx;
    const cb_gguf_writer *w = sc->w;
    uint8_t *hdr, *chunk = NULL;
    size_t data_off, total, off = 0;
    cb_status st = build_header(w, &hdr, &data_off, &total);
    if (st != CB_OK)
        return cb_error_set(err, st, "%s: out of memory", sc->path);
    st = cb_fd_write_all(fd, hdr, data_off, sc->path, err);
    free(hdr);
    for (size_t i = 0; i < w->n_t && st == CB_OK; i++) {
        const wtensor *t = &w->t[i];
        size_t pad = pad_to(off, w->alignment) - off;
        if ((st = write_zeros(fd, pad, sc->path, err)) != CB_OK)
            break;
        off += pad;
        if (t->data) {
            st = cb_fd_write_all(fd, t->data, t->nbytes, sc->path, err);
        } else {
            size_t rb = cb_type_row_bytes(t->type, t->ne[0]);
            int64_t rows = (int64_t)(t->nbytes / rb), per = FILL_CHUNK / (int64_t)rb;
            per = per < 1 ? 1 : per;
            if (!chunk && !(chunk = malloc((size_t)(per > 1 ? FILL_CHUNK : rb) + rb))) {
                st = cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", sc->path);
                break;
            }
            for (int64_t r = 0; r < rows && st == CB_OK; r += per) {
                int64_t n = rows - r < per ? rows - r : per;
                if (t->fill(t->fill_ctx, r, n, chunk) != 0)
                    st = cb_error_set(err, CB_ERR_INVALID, "%s: producing tensor '%s' failed",
                                      sc->path, t->name);
                else
                    st = cb_fd_write_all(fd, chunk, (size_t)n * rb, sc->path, err);
            }
            /* the chunk fits the largest row seen so far only: drop it */
            free(chunk);
            chunk = NULL;
        }
        off += t->nbytes;
    }
    free(chunk);
    size_t pad = total - data_off - off;
    if (st == CB_OK)
        st = write_zeros(fd, pad, sc->path, err);
    return st;
}

cb_status cb_gguf_writer_save(const cb_gguf_writer *w, const char *path, cb_error *err)
{
    save_ctx sc = {w, path};
    return cb_file_write_atomic_fn(path, emit_file, &sc, err);
}
