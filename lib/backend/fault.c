/* fault.c - a table that wraps a backend's own: fault injection
 * (cb_backend_fail_at, backend.h), which counts the operations and, from
 * the n-th on, fails each as a device backend does after a fault, so that
 * the tests can walk every caller's error path on a machine without a GPU
 * (and on one, without a broken GPU); and the operation profile
 * (cb_backend_profile): the calls of each operation and the host time
 * spent in them, printed when the backend is freed.  The wrapped backend
 * itself is unchanged, and nothing is wrapped, counted or timed unless
 * asked for. */
#include "backend.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the operations, in the table's order (and attn_mass and the graphs',
 * profiled only) */
enum {
    OP_alloc,
    OP_dealloc,
    OP_alloc_tmp,
    OP_upload,
    OP_download,
    OP_sync,
    OP_host_alloc,
    OP_host_free,
    OP_upload_async,
    OP_event_new,
    OP_event_free,
    OP_event_record,
    OP_event_wait,
    OP_mark_new,
    OP_mark_ms,
    OP_weight_new,
    OP_weight_free,
    OP_matmul,
    OP_matmul_multi,
    OP_get_rows,
    OP_rmsnorm,
    OP_add_rmsnorm,
    OP_rope,
    OP_rope_qk,
    OP_add,
    OP_swiglu,
    OP_geglu,
    OP_scale,
    OP_kv_write,
    OP_kv_write_kv,
    OP_kv_read,
    OP_attention,
    OP_gather,
    OP_scatter,
    OP_deviation,
    OP_topk,
    OP_attn_mass,
    OP_graph_begin,
    OP_graph_end,  /* graph_end that queued the recorded work */
    OP_graph_redo, /* graph_end that did not: the caller queues it again */
    N_OPS
};
#define NAME(op) [OP_##op] = #op
static const char *const op_name[N_OPS] = {
    NAME(alloc),      NAME(dealloc),      NAME(alloc_tmp),   NAME(upload),       NAME(download),
    NAME(sync),       NAME(host_alloc),   NAME(host_free),   NAME(upload_async), NAME(event_new),
    NAME(event_free), NAME(event_record), NAME(event_wait),  NAME(mark_new),     NAME(mark_ms),
    NAME(weight_new), NAME(weight_free),  NAME(matmul),      NAME(matmul_multi), NAME(get_rows),
    NAME(rmsnorm),    NAME(add_rmsnorm),  NAME(rope),        NAME(rope_qk),      NAME(add),
    NAME(swiglu),     NAME(geglu),        NAME(scale),       NAME(kv_write),     NAME(kv_write_kv),
    NAME(kv_read),    NAME(attention),    NAME(gather),      NAME(scatter),      NAME(deviation),
    NAME(topk),       NAME(attn_mass),    NAME(graph_begin), NAME(graph_end),    NAME(graph_redo)};
#undef NAME

typedef struct fault_ops {
    cb_backend_ops ops; /* first: b->ops points here */
    const cb_backend_ops *inner;
    long at, count; /* the first failing operation (LONG_MAX: none), the count so far */
    int profile;    /* the operations timed (cb_backend_profile) */
    double t_open;  /* cb_now_ms when wrapped */
    unsigned long calls[N_OPS];
    unsigned long long ns[N_OPS]; /* host time in the operation, all threads */
} fault_ops;

static fault_ops *FO(cb_backend *b) { return (fault_ops *)(void *)b->ops; }
#define INNER(b) (FO(b)->inner)

/* Count one operation; nonzero when it must fail (the backend has a fault,
 * recorded now when this is the n-th operation). */
static int hit(cb_backend *b, int op)
{
    fault_ops *fo = FO(b);
    if (cb_backend_status(b) != CB_OK)
        return 1;
    long n = __atomic_add_fetch(&fo->count, 1, __ATOMIC_RELAXED);
    if (n < fo->at)
        return 0;
    cb_backend_fail(b, CB_ERR_DEVICE,
                    "%s: %s: injected device fault at backend operation %ld (CB_BACKEND_FAIL_AT)",
                    fo->inner->name, op_name[op], n);
    return 1;
}

/* the profile's clock: 0 when not profiling */
static double t_begin(cb_backend *b) { return FO(b)->profile ? cb_now_ms() : 0; }

static void t_end(cb_backend *b, int op, double t0)
{
    fault_ops *fo = FO(b);
    if (!fo->profile)
        return;
    double dt = cb_now_ms() - t0; /* (the loader's thread and the computing one: atomics) */
    __atomic_add_fetch(&fo->calls[op], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&fo->ns[op], (unsigned long long)(dt > 0 ? dt * 1e6 : 0), __ATOMIC_RELAXED);
}

/* An operation's body: counted (and failed) unless it releases, timed */
#define RUN(op, call)            \
    do {                         \
        double t0_ = t_begin(b); \
        call;                    \
        t_end(b, OP_##op, t0_);  \
    } while (0)
#define VOID_OP(op, call)     \
    do {                      \
        if (!hit(b, OP_##op)) \
            RUN(op, call);    \
    } while (0)
#define PTR_OP(op, type, call)  \
    do {                        \
        type r_ = NULL;         \
        if (!hit(b, OP_##op))   \
            RUN(op, r_ = call); \
        return r_;              \
    } while (0)

/* The profile, on stderr: each operation called, by host time */
static void print_profile(const fault_ops *fo, const char *desc)
{
    int idx[N_OPS], n = 0;
    double total = 0, open_ms = cb_now_ms() - fo->t_open;
    unsigned long calls = 0;
    for (int i = 0; i < N_OPS; i++)
        if (fo->calls[i]) {
            int k = n++;
            for (; k > 0 && fo->ns[idx[k - 1]] < fo->ns[i]; k--) /* by time, most first */
                idx[k] = idx[k - 1];
            idx[k] = i;
            total += (double)fo->ns[i] * 1e-6, calls += fo->calls[i];
        }
    fprintf(stderr,
            "\n# backend profile (CB_BACKEND_PROFILE): %s, open %.1f ms; host time in each "
            "operation, every thread (on a device: issuing it and any wait in it)\n"
            "# %-14s %10s %12s %10s %7s\n",
            desc, open_ms, "operation", "calls", "ms", "us/call", "share");
    for (int k = 0; k < n; k++) {
        int i = idx[k];
        double ms = (double)fo->ns[i] * 1e-6;
        fprintf(stderr, "# %-14s %10lu %12.2f %10.2f %6.1f%%\n", op_name[i], fo->calls[i], ms,
                1e3 * ms / (double)fo->calls[i], total > 0 ? 100.0 * ms / total : 0.0);
    }
    fprintf(stderr, "# %-14s %10lu %12.2f\n", "all", calls, total);
}

/* the releasing operations: never counted, never failed */
static void f_free(cb_backend *b)
{
    fault_ops *fo = FO(b);
    if (fo->profile)
        print_profile(fo, b->desc);
    b->ops = fo->inner;
    b->ops->free(b);
    free(fo);
}
static void f_dealloc(cb_backend *b, void *p) { RUN(dealloc, INNER(b)->dealloc(b, p)); }
static void f_weight_free(cb_backend *b, cb_bweight *w)
{
    RUN(weight_free, INNER(b)->weight_free(b, w));
}
static void f_event_free(cb_backend *b, void *ev) { RUN(event_free, INNER(b)->event_free(b, ev)); }
static void f_set_act8(cb_backend *b, int on) { INNER(b)->set_act8(b, on); }
static void f_reserve(cb_backend *b, int64_t n) { INNER(b)->reserve(b, n); }
static void f_reserve_keys(cb_backend *b, int64_t n_keys, int n_head_kv, int hd)
{
    INNER(b)->reserve_keys(b, n_keys, n_head_kv, hd);
}
static cb_status f_set_key_bias(cb_backend *b, const uint8_t *stale, int64_t n, float bias,
                                int32_t until)
{
    return INNER(b)->set_key_bias(b, stale, n, bias, until);
}

static void *f_alloc(cb_backend *b, size_t n) { PTR_OP(alloc, void *, INNER(b)->alloc(b, n)); }

static void *f_alloc_tmp(cb_backend *b, size_t n)
{
    PTR_OP(alloc_tmp, void *, INNER(b)->alloc_tmp(b, n));
}

static void f_upload(cb_backend *b, void *dst, const void *src, size_t n)
{
    VOID_OP(upload, INNER(b)->upload(b, dst, src, n));
}

static void f_download(cb_backend *b, void *dst, const void *src, size_t n)
{
    VOID_OP(download, INNER(b)->download(b, dst, src, n));
}

static void f_sync(cb_backend *b) { VOID_OP(sync, INNER(b)->sync(b)); }

static void *f_host_alloc(cb_backend *b, size_t n)
{
    PTR_OP(host_alloc, void *, INNER(b)->host_alloc(b, n));
}

static void f_host_free(cb_backend *b, void *p) { RUN(host_free, INNER(b)->host_free(b, p)); }

static void f_upload_async(cb_backend *b, void *dst, const void *src, size_t n)
{
    VOID_OP(upload_async, INNER(b)->upload_async(b, dst, src, n));
}

static void *f_event_new(cb_backend *b) { PTR_OP(event_new, void *, INNER(b)->event_new(b)); }

static void f_event_record(cb_backend *b, void *ev)
{
    VOID_OP(event_record, INNER(b)->event_record(b, ev));
}

static void f_event_wait(cb_backend *b, void *ev)
{
    VOID_OP(event_wait, INNER(b)->event_wait(b, ev));
}

static void *f_mark_new(cb_backend *b) { PTR_OP(mark_new, void *, INNER(b)->mark_new(b)); }

static double f_mark_ms(cb_backend *b, void *a, void *z)
{
    double r = -1;
    if (!hit(b, OP_mark_ms))
        RUN(mark_ms, r = INNER(b)->mark_ms(b, a, z));
    return r;
}

static cb_bweight *f_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out,
                                const void *data, const float *bias)
{
    PTR_OP(weight_new, cb_bweight *, INNER(b)->weight_new(b, t, n_in, n_out, data, bias));
}

static void f_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    VOID_OP(matmul, INNER(b)->matmul(b, w, x, y, n));
}

static void f_matmul_multi(cb_backend *b, const cb_bweight *const *w, int nw, const float *x,
                           float *const *y, int64_t n)
{
    VOID_OP(matmul_multi, INNER(b)->matmul_multi(b, w, nw, x, y, n));
}

static void f_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n,
                       float *dst)
{
    VOID_OP(get_rows, INNER(b)->get_rows(b, w, ids, n, dst));
}

static void f_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d,
                      float eps)
{
    VOID_OP(rmsnorm, INNER(b)->rmsnorm(b, x, g, y, n, d, eps));
}

static void f_add_rmsnorm(cb_backend *b, float *x, const float *y, const float *g, float *out,
                          int64_t n, int64_t d, float eps)
{
    VOID_OP(add_rmsnorm, INNER(b)->add_rmsnorm(b, x, y, g, out, n, d, eps));
}

static void f_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int head_dim,
                   int n_rot, float base, const float *ff, int neox)
{
    VOID_OP(rope, INNER(b)->rope(b, x, pos, n, n_head, head_dim, n_rot, base, ff, neox));
}

static void f_rope_qk(cb_backend *b, float *q, float *k, const int32_t *pos, int64_t n, int n_head,
                      int n_head_kv, int head_dim, int n_rot, float base, const float *ff, int neox)
{
    VOID_OP(rope_qk,
            INNER(b)->rope_qk(b, q, k, pos, n, n_head, n_head_kv, head_dim, n_rot, base, ff, neox));
}

static void f_add(cb_backend *b, float *x, const float *y, int64_t n)
{
    VOID_OP(add, INNER(b)->add(b, x, y, n));
}

static void f_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    VOID_OP(swiglu, INNER(b)->swiglu(b, g, u, out, n));
}

static void f_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    VOID_OP(geglu, INNER(b)->geglu(b, g, u, out, n));
}

static void f_scale(cb_backend *b, float *x, float s, int64_t n)
{
    VOID_OP(scale, INNER(b)->scale(b, x, s, n));
}

static void f_kv_write(cb_backend *b, void *cache, cb_type t, int64_t width, const float *src,
                       const int32_t *at, int64_t n)
{
    VOID_OP(kv_write, INNER(b)->kv_write(b, cache, t, width, src, at, n));
}

static void f_kv_write_kv(cb_backend *b, void *kc, void *vc, cb_type t, int64_t width,
                          const float *ks, const float *vs, const int32_t *at, int64_t n)
{
    VOID_OP(kv_write_kv, INNER(b)->kv_write_kv(b, kc, vc, t, width, ks, vs, at, n));
}

static void f_kv_read(cb_backend *b, const void *cache, cb_type t, int64_t width, const int32_t *at,
                      int64_t n, float *dst)
{
    VOID_OP(kv_read, INNER(b)->kv_read(b, cache, t, width, at, n, dst));
}

static void f_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                        const void *v, cb_type t, int n_head, int n_head_kv, int hd, float scale,
                        int window, float *out)
{
    VOID_OP(attention,
            INNER(b)->attention(b, q, pos, n, k, v, t, n_head, n_head_kv, hd, scale, window, out));
}

static void f_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                     float *dst)
{
    VOID_OP(gather, INNER(b)->gather(b, src, idx, n, d, dst));
}

static void f_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                      float *dst)
{
    VOID_OP(scatter, INNER(b)->scatter(b, src, idx, n, d, dst));
}

static void f_deviation(cb_backend *b, const float *src, const void *cache, cb_type t,
                        int64_t width, const int32_t *at, int64_t n, float *dev)
{
    VOID_OP(deviation, INNER(b)->deviation(b, src, cache, t, width, at, n, dev));
}

static void f_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    VOID_OP(topk, INNER(b)->topk(b, x, n, k, idx));
}

/* timed, not counted for faults (it was not, and the fault tests' counts stand) */
static cb_status f_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n,
                             const void *k, const void *v, cb_type t, int64_t n_keys, int n_head,
                             int n_head_kv, int hd, float scale, int window, float *mass)
{
    cb_status st;
    RUN(attn_mass, st = INNER(b)->attn_mass(b, q, pos, n, k, v, t, n_keys, n_head, n_head_kv, hd,
                                            scale, window, mass));
    return st;
}

/* timed, not counted: a recording's operations are (each as it is
 * queued), and the fault tests' counts stand */
static int f_graph_begin(cb_backend *b, int key)
{
    int r;
    RUN(graph_begin, r = INNER(b)->graph_begin(b, key));
    return r;
}

static int f_graph_end(cb_backend *b, int run)
{
    double t0 = t_begin(b);
    int r = INNER(b)->graph_end(b, run);
    t_end(b, r ? OP_graph_end : OP_graph_redo, t0);
    return r;
}

/* The wrapping table on b (once: a second call adjusts the first's) */
static cb_status wrap(cb_backend *b, fault_ops **out)
{
    const cb_backend_ops *in = b->ops;
    if (in->free == f_free) {
        *out = FO(b);
        return CB_OK;
    }
    fault_ops *fo = calloc(1, sizeof *fo);
    if (!fo)
        return CB_ERR_NOMEM;
    fo->inner = in;
    fo->at = LONG_MAX;
    fo->t_open = cb_now_ms();
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
    W(host_alloc);
    W(host_free);
    W(upload_async);
    W(event_new);
    W(event_free);
    W(event_record);
    W(event_wait);
    W(mark_new);
    W(mark_ms);
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
    W(attn_mass);
    W(set_act8);
    W(reserve);
    W(reserve_keys);
    W(set_key_bias);
    W(graph_begin);
    W(graph_end);
#undef W
    b->ops = o;
    *out = fo;
    return CB_OK;
}

cb_status cb_backend_fail_at(cb_backend *b, long n)
{
    fault_ops *fo;
    cb_status st;
    if (n < 1)
        return CB_ERR_INVALID;
    if ((st = wrap(b, &fo)) == CB_OK)
        fo->at = n;
    return st;
}

cb_status cb_backend_profile(cb_backend *b)
{
    fault_ops *fo;
    cb_status st = wrap(b, &fo);
    if (st == CB_OK)
        fo->profile = 1;
    return st;
}
