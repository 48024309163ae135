/* gguf.c - a bounds-checked, memory-mapped GGUF reader (versions 2 and 3).
 *
 * Layout (little endian):
 *   "GGUF" u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x { str key, u32 type, value }          str = u64 len + bytes
 *       value: scalar | str | array = { u32 elem_type, u64 n, n x elem }
 *   n_tensors x { str name, u32 n_dims, n_dims x u64 ne, u32 type, u64 offset }
 *   padding to general.alignment (default 32), then the data section; each
 *   tensor's offset is relative to the data section and aligned.
 *
 * Everything is validated once in open: afterwards accessors index into
 * tables built here and never parse untrusted bytes again. */
#include "infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME 64 /* ggml's limit on tensor names, NUL included */

typedef struct gguf_kv {
    cb_strview key;
    cb_gguf_type type;
    const uint8_t *val;    /* scalar or string: the value's bytes */
    cb_gguf_type arr_type; /* arrays only */
    uint64_t arr_n;
    const uint8_t *arr_data;
    uint64_t *str_off; /* string arrays: offset of each element's length field */
} gguf_kv;

struct cb_gguf {
    cb_mmap map; /* owned when map.data != NULL */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    size_t alignment;
    int64_t n_kv, n_tensors;
    gguf_kv *kv;
    cb_tensor_info *tensors;
    const uint8_t *data;
    size_t data_size;
};

/* A cursor over untrusted bytes: every read checks the remaining length. */
typedef struct rd {
    const uint8_t *p, *end;
    const char *name;
    cb_error *err;
} rd;

static const size_t scalar_size[CB_GGUF_TYPE_COUNT_] = {
    [CB_GGUF_UINT8] = 1,  [CB_GGUF_INT8] = 1,  [CB_GGUF_UINT16] = 2,  [CB_GGUF_INT16] = 2,
    [CB_GGUF_UINT32] = 4, [CB_GGUF_INT32] = 4, [CB_GGUF_FLOAT32] = 4, [CB_GGUF_BOOL] = 1,
    [CB_GGUF_UINT64] = 8, [CB_GGUF_INT64] = 8, [CB_GGUF_FLOAT64] = 8,
};

static const char *const type_names[CB_GGUF_TYPE_COUNT_] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64",
};

static cb_status need(rd *r, uint64_t n, const char *what)
{
    if ((uint64_t)(r->end - r->p) < n)
        return cb_error_set(r->err, CB_ERR_FORMAT,
                            "%s: truncated GGUF: %s needs %llu bytes, %zu left", r->name, what,
                            (unsigned long long)n, (size_t)(r->end - r->p));
    return CB_OK;
}

static cb_status rd_u32(rd *r, uint32_t *v, const char *what)
{
    cb_status st = need(r, 4, what);
    if (st == CB_OK) {
        memcpy(v, r->p, 4);
        r->p += 4;
    }
    return st;
}

static cb_status rd_u64(rd *r, uint64_t *v, const char *what)
{
    cb_status st = need(r, 8, what);
    if (st == CB_OK) {
        memcpy(v, r->p, 8);
        r->p += 8;
    }
    return st;
}

static cb_status rd_str(rd *r, cb_strview *s, const char *what)
{
    uint64_t n;
    cb_status st = rd_u64(r, &n, what);
    if (st != CB_OK)
        return st;
    if ((st = need(r, n, what)) != CB_OK)
        return st;
    s->data = (const char *)r->p;
    s->len = (size_t)n;
    r->p += n;
    return CB_OK;
}

static size_t pos(const cb_gguf *g, const rd *r) { return (size_t)(r->p - g->base); }

static cb_status parse_kv(cb_gguf *g, rd *r, gguf_kv *kv)
{
    cb_status st;
    uint32_t t;
    char what[96];

    if ((st = rd_str(r, &kv->key, "metadata key")) != CB_OK)
        return st;
    snprintf(what, sizeof what, "value of '%.*s'", (int)(kv->key.len > 60 ? 60 : kv->key.len),
             kv->key.data);
    if ((st = rd_u32(r, &t, what)) != CB_OK)
        return st;
    if (t >= CB_GGUF_TYPE_COUNT_)
        return cb_error_set(r->err, CB_ERR_FORMAT,
                            "%s: malformed GGUF: %s has unknown type %u at byte %zu", r->name, what,
                            t, pos(g, r) - 4);
    kv->type = (cb_gguf_type)t;
    kv->arr_type = CB_GGUF_TYPE_COUNT_;
    kv->val = r->p;
    if (t == CB_GGUF_STRING) {
        cb_strview s;
        return rd_str(r, &s, what);
    }
    if (t != CB_GGUF_ARRAY) {
        if ((st = need(r, scalar_size[t], what)) != CB_OK)
            return st;
        r->p += scalar_size[t];
        return CB_OK;
    }
    /* array */
    uint32_t et;
    uint64_t n;
    if ((st = rd_u32(r, &et, what)) != CB_OK || (st = rd_u64(r, &n, what)) != CB_OK)
        return st;
    if (et >= CB_GGUF_TYPE_COUNT_ || et == CB_GGUF_ARRAY)
        return cb_error_set(
            r->err, CB_ERR_FORMAT, "%s: malformed GGUF: %s is an array of %s type %u at byte %zu",
            r->name, what, et == CB_GGUF_ARRAY ? "nested array" : "unknown", et, pos(g, r) - 12);
    kv->arr_type = (cb_gguf_type)et;
    kv->arr_n = n;
    kv->arr_data = r->p;
    if (et != CB_GGUF_STRING) {
        if (n > (uint64_t)(r->end - r->p) / scalar_size[et])
            return need(r, UINT64_MAX, what);
        r->p += n * scalar_size[et];
        return CB_OK;
    }
    /* Each string takes at least its 8-byte length: bound n before allocating. */
    if (n > (uint64_t)(r->end - r->p) / 8)
        return cb_error_set(r->err, CB_ERR_FORMAT,
                            "%s: truncated GGUF: %s claims %llu strings, file too short", r->name,
                            what, (unsigned long long)n);
    kv->str_off = malloc((n ? n : 1) * sizeof *kv->str_off);
    if (!kv->str_off)
        return cb_error_set(r->err, CB_ERR_NOMEM, "%s: out of memory", r->name);
    for (uint64_t j = 0; j < n; j++) {
        cb_strview s;
        kv->str_off[j] = (uint64_t)(r->p - kv->arr_data);
        if ((st = rd_str(r, &s, what)) != CB_OK)
            return st;
    }
    return CB_OK;
}

static cb_status parse_tensor(cb_gguf *g, rd *r, cb_tensor_info *ti)
{
    cb_status st;
    uint32_t nd, t;
    char what[112];

    if ((st = rd_str(r, &ti->name, "tensor name")) != CB_OK)
        return st;
    snprintf(what, sizeof what, "tensor '%.*s'", (int)(ti->name.len > 64 ? 64 : ti->name.len),
             ti->name.data);
    if (ti->name.len >= GGUF_MAX_NAME)
        return cb_error_set(r->err, CB_ERR_FORMAT,
                            "%s: malformed GGUF: %s: name longer than %d bytes", r->name, what,
                            GGUF_MAX_NAME - 1);
    if ((st = rd_u32(r, &nd, what)) != CB_OK)
        return st;
    if (nd == 0 || nd > CB_GGUF_MAX_DIMS)
        return cb_error_set(r->err, CB_ERR_FORMAT,
                            "%s: malformed GGUF: %s has %u dimensions (1..%d)", r->name, what, nd,
                            CB_GGUF_MAX_DIMS);
    ti->n_dims = nd;
    for (int d = 0; d < CB_GGUF_MAX_DIMS; d++)
        ti->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t v;
        if ((st = rd_u64(r, &v, what)) != CB_OK)
            return st;
        if (v > (uint64_t)INT64_MAX)
            return cb_error_set(r->err, CB_ERR_FORMAT,
                                "%s: malformed GGUF: %s dimension %u is negative", r->name, what,
                                d);
        ti->ne[d] = (int64_t)v;
    }
    if ((st = rd_u32(r, &t, what)) != CB_OK || (st = rd_u64(r, &ti->offset, what)) != CB_OK)
        return st;
    if (t >= CB_TYPE_COUNT_ || cb_type_block_bytes((cb_type)t) == 0)
        return cb_error_set(r->err, CB_ERR_FORMAT,
                            "%s: malformed GGUF: %s has unknown tensor type %u", r->name, what, t);
    ti->type = (cb_type)t;
    if (ti->ne[0] % cb_type_block_elems(ti->type) != 0)
        return cb_error_set(
            r->err, CB_ERR_FORMAT,
            "%s: malformed GGUF: %s row of %lld is not a multiple of the %s block (%lld)", r->name,
            what, (long long)ti->ne[0], cb_type_name(ti->type),
            (long long)cb_type_block_elems(ti->type));
    /* nbytes = row bytes * rows, with overflow checks against the file size. */
    uint64_t nb = cb_type_row_bytes(ti->type, ti->ne[0]);
    if (nb == 0 && ti->ne[0] != 0) /* the row's bytes do not fit in size_t */
        return cb_error_set(r->err, CB_ERR_FORMAT, "%s: malformed GGUF: %s is larger than the file",
                            r->name, what);
    for (int d = 1; d < CB_GGUF_MAX_DIMS; d++) {
        if (ti->ne[d] != 0 && nb > g->size / (uint64_t)ti->ne[d])
            return cb_error_set(r->err, CB_ERR_FORMAT,
                                "%s: malformed GGUF: %s is larger than the file", r->name, what);
        nb *= (uint64_t)ti->ne[d];
    }
    if (ti->ne[0] == 0)
        nb = 0;
    ti->nbytes = (size_t)nb;
    return CB_OK;
}

static cb_status gguf_parse(cb_gguf *g, const char *name, cb_error *err)
{
    cb_status st;
    uint64_t n_tensors, n_kv;
    uint32_t version;

    /* before any pointer arithmetic: an empty file maps to NULL */
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0)
        return cb_error_set(err, CB_ERR_FORMAT, "%s: not a GGUF file (bad magic)", name);
    rd r = {g->base, g->base + g->size, name, err};
    r.p += 4;
    if ((st = rd_u32(&r, &version, "version")) != CB_OK)
        return st;
    if (version == 0x02000000 || version == 0x03000000)
        return cb_error_set(err, CB_ERR_UNSUPPORTED, "%s: big-endian GGUF is not supported", name);
    if (version != 2 && version != 3)
        return cb_error_set(err, CB_ERR_UNSUPPORTED,
                            "%s: GGUF version %u is not supported (2 or 3)", name, version);
    g->version = version;
    if ((st = rd_u64(&r, &n_tensors, "tensor count")) != CB_OK ||
        (st = rd_u64(&r, &n_kv, "metadata count")) != CB_OK)
        return st;
    /* Each entry takes at least 12 bytes (tensor: 8+4+8+4+8): reject counts
     * the file cannot hold before allocating for them. */
    if (n_kv > g->size / 12 || n_tensors > g->size / 32)
        return cb_error_set(
            err, CB_ERR_FORMAT,
            "%s: malformed GGUF: %llu metadata entries and %llu tensors cannot fit in %zu bytes",
            name, (unsigned long long)n_kv, (unsigned long long)n_tensors, g->size);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", name);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        g->n_kv = (int64_t)i + 1; /* so that free releases what was allocated */
        if ((st = parse_kv(g, &r, kv)) != CB_OK)
            return st;
        for (uint64_t j = 0; j < i; j++)
            if (g->kv[j].key.len == kv->key.len &&
                memcmp(g->kv[j].key.data, kv->key.data, kv->key.len) == 0)
                return cb_error_set(err, CB_ERR_FORMAT,
                                    "%s: malformed GGUF: duplicate metadata key '%.*s'", name,
                                    (int)(kv->key.len > 80 ? 80 : kv->key.len), kv->key.data);
        if (cb_strview_eq(kv->key, "general.alignment")) {
            uint32_t a;
            if (kv->type != CB_GGUF_UINT32)
                return cb_error_set(err, CB_ERR_FORMAT,
                                    "%s: malformed GGUF: general.alignment is %s, not uint32", name,
                                    type_names[kv->type]);
            memcpy(&a, kv->val, 4);
            if (a == 0 || (a & (a - 1)) != 0)
                return cb_error_set(
                    err, CB_ERR_FORMAT,
                    "%s: malformed GGUF: general.alignment %u is not a power of two", name, a);
            g->alignment = a;
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors = (int64_t)i + 1;
        if ((st = parse_tensor(g, &r, &g->tensors[i])) != CB_OK)
            return st;
        for (uint64_t j = 0; j < i; j++)
            if (g->tensors[j].name.len == g->tensors[i].name.len &&
                memcmp(g->tensors[j].name.data, g->tensors[i].name.data, g->tensors[i].name.len) ==
                    0)
                return cb_error_set(err, CB_ERR_FORMAT,
                                    "%s: malformed GGUF: duplicate tensor '%.*s'", name,
                                    (int)g->tensors[i].name.len, g->tensors[i].name.data);
    }
    g->n_tensors = (int64_t)n_tensors;

    /* The data section starts at the next multiple of the alignment. */
    size_t off = pos(g, &r);
    size_t data_off = (off + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors == 0 && data_off > g->size)
        data_off = g->size; /* vocabulary-only files may omit the final padding */
    if (data_off > g->size)
        return cb_error_set(err, CB_ERR_FORMAT,
                            "%s: truncated GGUF: data section starts past the end", name);
    g->data = g->base + data_off;
    g->data_size = g->size - data_off;
    for (uint64_t i = 0; i < n_tensors; i++) {
        cb_tensor_info *ti = &g->tensors[i];
        if (ti->offset % g->alignment != 0)
            return cb_error_set(
                err, CB_ERR_FORMAT,
                "%s: malformed GGUF: tensor '%.*s' offset %llu is not aligned to %zu", name,
                (int)ti->name.len, ti->name.data, (unsigned long long)ti->offset, g->alignment);
        if (ti->offset > g->data_size || ti->nbytes > g->data_size - ti->offset)
            return cb_error_set(
                err, CB_ERR_FORMAT,
                "%s: truncated GGUF: tensor '%.*s' (%zu bytes at data offset %llu) extends past the end of the file",
                name, (int)ti->name.len, ti->name.data, ti->nbytes, (unsigned long long)ti->offset);
        ti->data = g->data + ti->offset;
    }
    return CB_OK;
}

static cb_status gguf_open_common(cb_gguf **out, cb_gguf *g, const char *name, cb_error *err)
{
    cb_status st = gguf_parse(g, name, err);
    if (st != CB_OK) {
        cb_gguf_free(g);
        return st;
    }
    *out = g;
    return CB_OK;
}

cb_status cb_gguf_open_memory(cb_gguf **out, const void *data, size_t size, const char *name,
                              cb_error *err)
{
    cb_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", name);
    g->base = data;
    g->size = size;
    return gguf_open_common(out, g, name ? name : "(memory)", err);
}

cb_status cb_gguf_open(cb_gguf **out, const char *path, cb_error *err)
{
    cb_gguf *g = calloc(1, sizeof *g);
    cb_status st;
    if (!g)
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    if ((st = cb_mmap_open(&g->map, path, err)) != CB_OK) {
        free(g);
        return st;
    }
    g->base = g->map.data;
    g->size = g->map.size;
    return gguf_open_common(out, g, path, err);
}

void cb_gguf_free(cb_gguf *g)
{
    if (!g)
        return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++)
            free(g->kv[i].str_off);
    free(g->kv);
    free(g->tensors);
    cb_mmap_close(&g->map);
    free(g);
}

uint32_t cb_gguf_version(const cb_gguf *g) { return g->version; }
size_t cb_gguf_alignment(const cb_gguf *g) { return g->alignment; }
size_t cb_gguf_file_size(const cb_gguf *g) { return g->size; }
int64_t cb_gguf_n_kv(const cb_gguf *g) { return g->n_kv; }
int64_t cb_gguf_n_tensors(const cb_gguf *g) { return g->n_tensors; }

const uint8_t *cb_gguf_data(const cb_gguf *g, size_t *size)
{
    if (size)
        *size = g->data_size;
    return g->data;
}

int64_t cb_gguf_find_key(const cb_gguf *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kv; i++)
        if (cb_strview_eq(g->kv[i].key, key))
            return i;
    return -1;
}

static const gguf_kv *kv_at(const cb_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

cb_strview cb_gguf_key(const cb_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->key : (cb_strview){NULL, 0};
}

cb_gguf_type cb_gguf_kv_type(const cb_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->type : CB_GGUF_TYPE_COUNT_;
}

cb_gguf_type cb_gguf_arr_type(const cb_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == CB_GGUF_ARRAY ? kv->arr_type : CB_GGUF_TYPE_COUNT_;
}

uint64_t cb_gguf_arr_len(const cb_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == CB_GGUF_ARRAY ? kv->arr_n : 0;
}

const void *cb_gguf_arr_data(const cb_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == CB_GGUF_ARRAY && kv->arr_type != CB_GGUF_STRING ? kv->arr_data : NULL;
}

/* Decode one scalar of type t at p.  is_int tells whether it is an integer
 * (bool counts as one), with its value in *iv (signed) or *uv (unsigned). */
typedef struct scalar {
    int kind; /* 0 signed int, 1 unsigned int, 2 float, -1 other */
    int64_t i;
    uint64_t u;
    double f;
} scalar;

static scalar decode_scalar(cb_gguf_type t, const uint8_t *p)
{
    scalar s = {-1, 0, 0, 0};
    switch (t) {
    case CB_GGUF_UINT8:
        s.kind = 1;
        s.u = p[0];
        break;
    case CB_GGUF_BOOL:
        s.kind = 1;
        s.u = p[0] != 0;
        break;
    case CB_GGUF_INT8: {
        int8_t v;
        memcpy(&v, p, 1);
        s.kind = 0;
        s.i = v;
        break;
    }
    case CB_GGUF_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        s.kind = 1;
        s.u = v;
        break;
    }
    case CB_GGUF_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        s.kind = 0;
        s.i = v;
        break;
    }
    case CB_GGUF_UINT32: {
        uint32_t v;
        memcpy(&v, p, 4);
        s.kind = 1;
        s.u = v;
        break;
    }
    case CB_GGUF_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        s.kind = 0;
        s.i = v;
        break;
    }
    case CB_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        s.kind = 1;
        s.u = v;
        break;
    }
    case CB_GGUF_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        s.kind = 0;
        s.i = v;
        break;
    }
    case CB_GGUF_FLOAT32: {
        float v;
        memcpy(&v, p, 4);
        s.kind = 2;
        s.f = v;
        break;
    }
    case CB_GGUF_FLOAT64: {
        double v;
        memcpy(&v, p, 8);
        s.kind = 2;
        s.f = v;
        break;
    }
    default: break;
    }
    return s;
}

static cb_status scalar_int(scalar s, int64_t *v)
{
    if (s.kind == 0) {
        *v = s.i;
        return CB_OK;
    }
    if (s.kind == 1 && s.u <= (uint64_t)INT64_MAX) {
        *v = (int64_t)s.u;
        return CB_OK;
    }
    return CB_ERR_INVALID;
}

static cb_status scalar_float(scalar s, double *v)
{
    if (s.kind == 2)
        *v = s.f;
    else if (s.kind == 1)
        *v = (double)s.u;
    else if (s.kind == 0)
        *v = (double)s.i;
    else
        return CB_ERR_INVALID;
    return CB_OK;
}

cb_status cb_gguf_get_int(const cb_gguf *g, int64_t i, int64_t *v)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type == CB_GGUF_BOOL)
        return CB_ERR_INVALID;
    return scalar_int(decode_scalar(kv->type, kv->val), v);
}

cb_status cb_gguf_get_uint(const cb_gguf *g, int64_t i, uint64_t *v)
{
    const gguf_kv *kv = kv_at(g, i);
    scalar s;
    if (!kv || kv->type == CB_GGUF_BOOL)
        return CB_ERR_INVALID;
    s = decode_scalar(kv->type, kv->val);
    if (s.kind == 1)
        *v = s.u;
    else if (s.kind == 0 && s.i >= 0)
        *v = (uint64_t)s.i;
    else
        return CB_ERR_INVALID;
    return CB_OK;
}

cb_status cb_gguf_get_float(const cb_gguf *g, int64_t i, double *v)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type == CB_GGUF_BOOL)
        return CB_ERR_INVALID;
    return scalar_float(decode_scalar(kv->type, kv->val), v);
}

cb_status cb_gguf_get_bool(const cb_gguf *g, int64_t i, int *v)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != CB_GGUF_BOOL)
        return CB_ERR_INVALID;
    *v = kv->val[0] != 0;
    return CB_OK;
}

static cb_strview str_at(const uint8_t *p)
{
    uint64_t n;
    memcpy(&n, p, 8);
    return (cb_strview){(const char *)p + 8, (size_t)n};
}

cb_status cb_gguf_get_str(const cb_gguf *g, int64_t i, cb_strview *v)
{
    const gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != CB_GGUF_STRING)
        return CB_ERR_INVALID;
    *v = str_at(kv->val);
    return CB_OK;
}

static const uint8_t *arr_elem(const gguf_kv *kv, uint64_t j)
{
    if (!kv || kv->type != CB_GGUF_ARRAY || j >= kv->arr_n)
        return NULL;
    if (kv->arr_type == CB_GGUF_STRING)
        return kv->arr_data + kv->str_off[j];
    return kv->arr_data + j * scalar_size[kv->arr_type];
}

cb_status cb_gguf_arr_get_int(const cb_gguf *g, int64_t i, uint64_t j, int64_t *v)
{
    const gguf_kv *kv = kv_at(g, i);
    const uint8_t *p = arr_elem(kv, j);
    if (!p)
        return CB_ERR_RANGE;
    if (kv->arr_type == CB_GGUF_BOOL) {
        *v = p[0] != 0;
        return CB_OK;
    }
    return scalar_int(decode_scalar(kv->arr_type, p), v);
}

cb_status cb_gguf_arr_get_float(const cb_gguf *g, int64_t i, uint64_t j, double *v)
{
    const gguf_kv *kv = kv_at(g, i);
    const uint8_t *p = arr_elem(kv, j);
    if (!p)
        return CB_ERR_RANGE;
    return scalar_float(decode_scalar(kv->arr_type, p), v);
}

cb_status cb_gguf_arr_get_str(const cb_gguf *g, int64_t i, uint64_t j, cb_strview *v)
{
    const gguf_kv *kv = kv_at(g, i);
    const uint8_t *p = arr_elem(kv, j);
    if (!p)
        return CB_ERR_RANGE;
    if (kv->arr_type != CB_GGUF_STRING)
        return CB_ERR_INVALID;
    *v = str_at(p);
    return CB_OK;
}

int64_t cb_gguf_int_or(const cb_gguf *g, const char *key, int64_t def)
{
    int64_t v;
    return cb_gguf_get_int(g, cb_gguf_find_key(g, key), &v) == CB_OK ? v : def;
}

double cb_gguf_float_or(const cb_gguf *g, const char *key, double def)
{
    double v;
    return cb_gguf_get_float(g, cb_gguf_find_key(g, key), &v) == CB_OK ? v : def;
}

int cb_gguf_bool_or(const cb_gguf *g, const char *key, int def)
{
    int v;
    return cb_gguf_get_bool(g, cb_gguf_find_key(g, key), &v) == CB_OK ? v : def;
}

cb_strview cb_gguf_str(const cb_gguf *g, const char *key)
{
    cb_strview v = {NULL, 0};
    cb_gguf_get_str(g, cb_gguf_find_key(g, key), &v);
    return v;
}

int64_t cb_gguf_find_tensor(const cb_gguf *g, const char *name)
{
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (cb_strview_eq(g->tensors[i].name, name))
            return i;
    return -1;
}

cb_status cb_gguf_tensor(const cb_gguf *g, int64_t i, cb_tensor_info *out)
{
    if (i < 0 || i >= g->n_tensors)
        return CB_ERR_RANGE;
    *out = g->tensors[i];
    return CB_OK;
}

const char *cb_gguf_type_name(cb_gguf_type t)
{
    return (unsigned)t < CB_GGUF_TYPE_COUNT_ ? type_names[t] : "unknown";
}
