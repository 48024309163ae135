/* fault.c - fault injection (cb_backend_fail_at, backend.h): a table that
 * wraps a backend's own, counts its operations and, from the n-th on, fails
 * each as a device backend does after a fault.  It exists so that the tests
 * can walk every caller's error path on a machine without a GPU (and on
 * one, without a broken GPU); the wrapped backend itself is unchanged, and
 * nothing is wrapped or counted unless asked for. */
#include "backend.h"

#include <stdlib.h>

typedef struct fault_ops {
    cb_backend_ops ops; /* first: b->ops points here */
    const cb_backend_ops *inner;
    long at, count;
} fault_ops;

static fault_ops *FO(cb_backend *b) { return (fault_ops *)(void *)b->ops; }
#define INNER(b) (FO(b)->inner)

/* Count one operation; nonzero when it must fail (the backend has a fault,
 * recorded now when this is the n-th operation). */
static int hit(cb_backend *b, const char *op)
{
    fault_ops *fo = FO(b);
    if (cb_backend_status(b) != CB_OK)
        return 1;
    long n = __atomic_add_fetch(&fo->count, 1, __ATOMIC_RELAXED);
    if (n < fo->at)
        return 0;
    cb_backend_fail(b, CB_ERR_DEVICE,
                    "%s: %s: injected device fault at backend operation %ld (CB_BACKEND_FAIL_AT)",
                    fo->inner->name, op, n);
    return 1;
}

/* the releasing operations: never counted, never failed */
static void f_free(cb_backend *b)
{
    fault_ops *fo = FO(b);
    b->ops = fo->inner;
    b->ops->free(b);
    free(fo);
}
static void f_dealloc(cb_backend *b, void *p) { INNER(b)->dealloc(b, p); }
static void f_weight_free(cb_backend *b, cb_bweight *w) { INNER(b)->weight_free(b, w); }
static void f_event_free(cb_backend *b, void *ev) { INNER(b)->event_free(b, ev); }
static void f_set_act8(cb_backend *b, int on) { INNER(b)->set_act8(b, on); }
static void f_reserve(cb_backend *b, int64_t n) { INNER(b)->reserve(b, n); }

static void *f_alloc(cb_backend *b, size_t n)
{
    return hit(b, "alloc") ? NULL : INNER(b)->alloc(b, n);
}

static void *f_alloc_tmp(cb_backend *b, size_t n)
{
    return hit(b, "alloc_tmp") ? NULL : INNER(b)->alloc_tmp(b, n);
}

static void f_upload(cb_backend *b, void *dst, const void *src, size_t n)
{
    if (!hit(b, "upload"))
        INNER(b)->upload(b, dst, src, n);
}

static void f_download(cb_backend *b, void *dst, const void *src, size_t n)
{
    if (!hit(b, "download"))
        INNER(b)->download(b, dst, src, n);
}

static void f_sync(cb_backend *b)
{
    if (!hit(b, "sync"))
        INNER(b)->sync(b);
}

static void *f_event_new(cb_backend *b)
{
    return hit(b, "event_new") ? NULL : INNER(b)->event_new(b);
}

static void f_event_record(cb_backend *b, void *ev)
{
    if (!hit(b, "event_record"))
        INNER(b)->event_record(b, ev);
}

static void f_event_wait(cb_backend *b, void *ev)
{
    if (!hit(b, "event_wait"))
        INNER(b)->event_wait(b, ev);
}

static cb_bweight *f_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out,
                                const void *data, const float *bias)
{
    return hit(b, "weight_new") ? NULL : INNER(b)->weight_new(b, t, n_in, n_out, data, bias);
}

static void f_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    if (!hit(b, "matmul"))
        INNER(b)->matmul(b, w, x, y, n);
}

static void f_matmul_multi(cb_backend *b, const cb_bweight *const *w, int nw, const float *x,
                           float *const *y, int64_t n)
{
    if (!hit(b, "matmul_multi"))
        INNER(b)->matmul_multi(b, w, nw, x, y, n);
}

static void f_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n,
                       float *dst)
{
    if (!hit(b, "get_rows"))
        INNER(b)->get_rows(b, w, ids, n, dst);
}

static void f_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d,
                      float eps)
{
    if (!hit(b, "rmsnorm"))
        INNER(b)->rmsnorm(b, x, g, y, n, d, eps);
}

static void f_add_rmsnorm(cb_backend *b, float *x, const float *y, const float *g, float *out,
                          int64_t n, int64_t d, float eps)
{
    if (!hit(b, "add_rmsnorm"))
        INNER(b)->add_rmsnorm(b, x, y, g, out, n, d, eps);
}

static void f_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int head_dim,
                   int n_rot, float base, const float *ff, int neox)
{
    if (!hit(b, "rope"))
        INNER(b)->rope(b, x, pos, n, n_head, head_dim, n_rot, base, ff, neox);
}

static void f_rope_qk(cb_backend *b, float *q, float *k, const int32_t *pos, int64_t n, int n_head,
                      int n_head_kv, int head_dim, int n_rot, float base, const float *ff, int neox)
{
    if (!hit(b, "rope_qk"))
        INNER(b)->rope_qk(b, q, k, pos, n, n_head, n_head_kv, head_dim, n_rot, base, ff, neox);
}

static void f_add(cb_backend *b, float *x, const float *y, int64_t n)
{
    if (!hit(b, "add"))
        INNER(b)->add(b, x, y, n);
}

static void f_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    if (!hit(b, "swiglu"))
        INNER(b)->swiglu(b, g, u, out, n);
}

static void f_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    if (!hit(b, "geglu"))
        INNER(b)->geglu(b, g, u, out, n);
}

static void f_scale(cb_backend *b, float *x, float s, int64_t n)
{
    if (!hit(b, "scale"))
        INNER(b)->scale(b, x, s, n);
}

static void f_kv_write(cb_backend *b, void *cache, cb_type t, int64_t width, const float *src,
                       const int32_t *at, int64_t n)
{
    if (!hit(b, "kv_write"))
        INNER(b)->kv_write(b, cache, t, width, src, at, n);
}

static void f_kv_write_kv(cb_backend *b, void *kc, void *vc, cb_type t, int64_t width,
                          const float *ks, const float *vs, const int32_t *at, int64_t n)
{
    if (!hit(b, "kv_write_kv"))
        INNER(b)->kv_write_kv(b, kc, vc, t, width, ks, vs, at, n);
}

static void f_kv_read(cb_backend *b, const void *cache, cb_type t, int64_t width, const int32_t *at,
                      int64_t n, float *dst)
{
    if (!hit(b, "kv_read"))
        INNER(b)->kv_read(b, cache, t, width, at, n, dst);
}

static void f_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                        const void *v, cb_type t, int n_head, int n_head_kv, int hd, float scale,
                        int window, float *out)
{
    if (!hit(b, "attention"))
        INNER(b)->attention(b, q, pos, n, k, v, t, n_head, n_head_kv, hd, scale, window, out);
}

static void f_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                     float *dst)
{
    if (!hit(b, "gather"))
        INNER(b)->gather(b, src, idx, n, d, dst);
}

static void f_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                      float *dst)
{
    if (!hit(b, "scatter"))
        INNER(b)->scatter(b, src, idx, n, d, dst);
}

static void f_deviation(cb_backend *b, const float *src, const void *cache, cb_type t,
                        int64_t width, const int32_t *at, int64_t n, float *dev)
{
    if (!hit(b, "deviation"))
        INNER(b)->deviation(b, src, cache, t, width, at, n, dev);
}

static void f_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    if (!hit(b, "topk"))
        INNER(b)->topk(b, x, n, k, idx);
}

cb_status cb_backend_fail_at(cb_backend *b, long n)
{
    const cb_backend_ops *in = b->ops;
    if (n < 1)
        return CB_ERR_INVALID;
    fault_ops *fo = calloc(1, sizeof *fo);
    if (!fo)
        return CB_ERR_NOMEM;
    fo->inner = in;
    fo->at = n;
    cb_backend_ops *o = &fo->ops;
    *o = *in; /* name, max_head_dim, rows_unstable; the optional entries' NULLs */
    /* optional entries stay NULL where the backend has none */
#define W(field) o->field = in->field ? f_##field : NULL
    W(free);
    W(alloc);
    W(dealloc);
    W(alloc_tmp);
    W(upload);
    W(download);
    W(sync);
    W(event_new);
    W(event_free);
    W(event_record);
    W(event_wait);
    W(weight_new);
    W(weight_free);
    W(matmul);
    W(matmul_multi);
    W(get_rows);
    W(rmsnorm);
    W(add_rmsnorm);
    W(rope);
    W(rope_qk);
    W(add);
    W(swiglu);
    W(geglu);
    W(scale);
    W(kv_write);
    W(kv_write_kv);
    W(kv_read);
    W(attention);
    W(gather);
    W(scatter);
    W(deviation);
    W(topk);
    W(set_act8);
    W(reserve);
#undef W
    b->ops = o;
    return CB_OK;
}
