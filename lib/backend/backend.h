/* backend.h - the compute backend interface (private to libcbcore).
 *
 * A backend is a small table of operations on backend-owned memory plus a
 * context pointer, in the manner of ggml's backend interface.  Model code
 * (lib/infer/forward.c) calls only these operations and never dereferences a
 * backend pointer, so a CUDA backend can implement the same table with device
 * memory.  Activations are f32.  Index arrays (positions, rows) are small and
 * passed as host memory; a device backend copies them as it needs.
 *
 * Threads: a backend may be used from several threads at once (cb-run's KV
 * loader places layer l+1 while the caller computes layer l), on disjoint
 * memory.  A device backend queues each thread's work in order on that
 * thread's own stream; every operation that hands data back to the host
 * (download, topk, deviation's result) waits for the thread's queue first.
 * Work queued by one thread is seen by another after a host-side hand-off
 * (a mutex) and either `sync` in the first thread or an event the first
 * records and the second waits on (the KV cache's per-layer events).
 *
 * Shapes are written [rows, cols], row-major, a row per token. */
#ifndef CB_BACKEND_H
#define CB_BACKEND_H

#include "../core/core.h"

#include <stdarg.h>
#include <stdio.h>

typedef struct cb_backend cb_backend;

/* A weight matrix W [n_out, n_in] (GGUF ne = {n_in, n_out}) in whatever form
 * the backend chose (the CPU backend: f32), with an optional bias [n_out]. */
typedef struct cb_bweight cb_bweight;

typedef struct cb_backend_ops {
    const char *name;
    /* The largest attention head dimension the backend handles; 0: any.
     * cb_model_load refuses a model past it. */
    int max_head_dim;
    void (*free)(cb_backend *b);

    /* Memory: nbytes of backend memory, zeroed and usable by every thread
     * on return; NULL on failure.  dealloc frees after the work this thread
     * queued; work other threads queued on it must be complete. */
    void *(*alloc)(cb_backend *b, size_t nbytes);
    void (*dealloc)(cb_backend *b, void *p);
    /* Scratch, optional (NULL: use alloc): nbytes of backend memory that
     * only the calling thread's work touches, contents undefined, freed with
     * dealloc.  It returns without waiting for the device, so the hot paths
     * (a KV load, the deviation, the logits) never drain their queue. */
    void *(*alloc_tmp)(cb_backend *b, size_t nbytes);
    /* upload returns once src may be reused (the copy itself may still be
     * queued); download returns once dst holds the data. */
    void (*upload)(cb_backend *b, void *dst, const void *src, size_t nbytes);
    void (*download)(cb_backend *b, void *dst, const void *src, size_t nbytes);
    /* Wait until the work this thread queued is done.  NULL: every
     * operation is done when it returns (the CPU backend). */
    void (*sync)(cb_backend *b);
    /* Optional (NULL: malloc, free and upload): host memory the backend
     * copies from directly (CUDA: page-locked), and an upload from it
     * that may still be queued when it returns: src must stay unchanged
     * until the calling thread's next sync.  cb-run's loader reads the KV
     * files' layers into it, so that no byte goes through staging. */
    void *(*host_alloc)(cb_backend *b, size_t nbytes);
    void (*host_free)(cb_backend *b, void *p);
    void (*upload_async)(cb_backend *b, void *dst, const void *src, size_t nbytes);
    /* Events, optional (NULL: operations are done when they return, as on
     * the CPU).  event_record marks the work this thread has queued so far;
     * event_wait makes the work this thread queues later wait for a mark
     * (on the device: the host does not block).  Recording again moves the
     * mark; waiting on a never-recorded event waits for nothing. */
    void *(*event_new)(cb_backend *b);
    void (*event_free)(cb_backend *b, void *ev);
    void (*event_record)(cb_backend *b, void *ev);
    void (*event_wait)(cb_backend *b, void *ev);
    /* Timing marks, optional with the events (NULL: cb_model_mark_* read
     * the host's clock, right where operations are done when they return).
     * mark_new makes an event that keeps its time (recorded with
     * event_record, freed with event_free); mark_ms waits for z and returns
     * the milliseconds from when the work queued before a was done to when
     * the work queued before z was, negative when either was never
     * recorded.  On a device the host's clock sees when work was queued,
     * not when it ran: blending times its waits for the KV loader so. */
    void *(*mark_new)(cb_backend *b);
    double (*mark_ms)(cb_backend *b, void *a, void *z);

    /* Weights: take n_out rows of n_in elements of type t from host memory
     * (a GGUF mapping), and an optional f32 bias (copied).  Usable by every
     * thread on return.  NULL on failure.  The data must stay valid and
     * unchanged until weight_free: the CPU backend computes on it where it
     * lies (no copy); a device backend copies it. */
    cb_bweight *(*weight_new)(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out,
                              const void *data, const float *bias);
    void (*weight_free)(cb_backend *b, cb_bweight *w);

    /* y [n, n_out] = x [n, n_in] . W^T (+ bias).  Row i of y is computed
     * from row i of x alone (see "Row-stable products" below). */
    void (*matmul)(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n);
    /* Optional (NULL: matmul for each): y[k] = x . w[k]^T (+ bias) for k <
     * nw, weights of the same n_in (Q, K and V; gate and up): the CPU runs
     * a decode step's products on one input as one job. */
    void (*matmul_multi)(cb_backend *b, const cb_bweight *const *w, int nw, const float *x,
                         float *const *y, int64_t n);
    /* dst [n, n_in] = rows ids[0..n) of W (an embedding lookup) */
    void (*get_rows)(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst);
    /* y [n, d] = x / rms(x) * g (g: backend vector [d]); y may be x */
    void (*rmsnorm)(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d,
                    float eps);
    /* Optional (NULL: add, then rmsnorm): x [n, d] += y, then out =
     * rmsnorm(x) * g, in one operation, with the bits of the two (a
     * layer's residual and the next norm); out may be y */
    void (*add_rmsnorm)(cb_backend *b, float *x, const float *y, const float *g, float *out,
                        int64_t n, int64_t d, float eps);
    /* Rotate x [n, n_head, head_dim] in place at positions pos[n] (host):
     * the first n_rot dims of each head, pairs (2i, 2i+1) ("normal") or
     * (i, i + n_rot/2) (neox), angle pos * base^(-2i/n_rot) / ff[i].  ff:
     * backend [n_rot/2], the frequency divisors of RoPE scaling (Llama 3's
     * rope_freqs, a linear factor), or NULL for none. */
    void (*rope)(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int head_dim,
                 int n_rot, float base, const float *ff, int neox);
    /* Optional (NULL: rope on each): rope on q [n, n_head, head_dim] and k
     * [n, n_head_kv, head_dim] at the same positions, in one operation,
     * with the bits of the two */
    void (*rope_qk)(cb_backend *b, float *q, float *k, const int32_t *pos, int64_t n, int n_head,
                    int n_head_kv, int head_dim, int n_rot, float base, const float *ff, int neox);
    /* x += y, n elements */
    void (*add)(cb_backend *b, float *x, const float *y, int64_t n);
    /* out = silu(g) * u, n elements; out may alias g */
    void (*swiglu)(cb_backend *b, const float *g, const float *u, float *out, int64_t n);
    /* out = gelu(g) * u (GELU in ggml's tanh form: gemma's MLP), n
     * elements; out may alias g */
    void (*geglu)(cb_backend *b, const float *g, const float *u, float *out, int64_t n);
    /* x *= s, n elements (gemma's embedding scale) */
    void (*scale)(cb_backend *b, float *x, float s, int64_t n);
    /* Write n rows of `width` f32 values into a cache of type t (F16 or F32)
     * at row indices at[n]. */
    void (*kv_write)(cb_backend *b, void *cache, cb_type t, int64_t width, const float *src,
                     const int32_t *at, int64_t n);
    /* Optional (NULL: kv_write on each): a layer's K rows ks into kc and V
     * rows vs into vc (both of type t and width), at the same rows at[n],
     * in one operation */
    void (*kv_write_kv)(cb_backend *b, void *kc, void *vc, cb_type t, int64_t width,
                        const float *ks, const float *vs, const int32_t *at, int64_t n);
    /* Read n cache rows at[n] of type t into f32 dst [n, width]. */
    void (*kv_read)(cb_backend *b, const void *cache, cb_type t, int64_t width, const int32_t *at,
                    int64_t n, float *dst);
    /* Attention with an exact causal mask: query row i (q [n, n_head*hd],
     * position pos[i]) attends to cache rows 0..pos[i] of k and v (cache of
     * type t, rows of n_head_kv*hd); out [n, n_head*hd].  Head h uses KV
     * head h / (n_head / n_head_kv).  Scores are scaled by `scale`.
     * window > 0: a sliding-window layer, where row i sees only the keys
     * pos[i]-window+1 .. pos[i] (gemma3's local layers); 0: all of 0..pos[i]. */
    void (*attention)(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                      const void *v, cb_type t, int n_head, int n_head_kv, int hd, float scale,
                      int window, float *out);
    /* dst [n, d] = src rows idx[0..n) (src [*, d]); dst must not alias src */
    void (*gather)(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                   float *dst);
    /* dst rows idx[0..n) = src [n, d] */
    void (*scatter)(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                    float *dst);
    /* Blending's deviation: dev [n] (backend) = the squared L2 distance
     * between row i of src [n, width] and cache row at[i] (type t). */
    void (*deviation)(cb_backend *b, const float *src, const void *cache, cb_type t, int64_t width,
                      const int32_t *at, int64_t n, float *dev);
    /* idx (host) [k] = the indices of the k largest of x [n] (backend),
     * largest first, equal values by lower index first, NaN below every
     * number (cb_op_topk_before); k <= n. */
    void (*topk)(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx);
    /* Optional (NULL: cb_backend_attn_mass computes it on the host, from
     * copies): blending's attention mass (probe's score).  Query row i (q
     * [n, n_head*hd], position pos[i] < n_keys) attends as in attention,
     * with the same mask, scale and GQA grouping, to the cache rows
     * 0..pos[i] of k (type t, rows of n_head_kv*hd; window > 0: only
     * pos[i]-window+1..pos[i]); each head's softmax probabilities are added
     * to mass [n_keys] (backend), head by head, each head's rows in order.
     * With v (the value cache, as k) each head's probability of key j is
     * first multiplied by the L2 norm of v's row j in the head's KV head
     * (the norm in f32, in order over the head dimension); NULL: as is.
     * Errors: CB_ERR_NOMEM (scratch), a device's CB_ERR_DEVICE. */
    cb_status (*attn_mass)(cb_backend *b, const float *q, const int32_t *pos, int64_t n,
                           const void *k, const void *v, cb_type t, int64_t n_keys, int n_head,
                           int n_head_kv, int hd, float scale, int window, float *mass);
    /* Optional (NULL: the backend has no such mode): on != 0 (the CPU's
     * default) makes every product with block-quantized weights quantize
     * its activations to 8 bits (llama.cpp's way: faster, not exact; the
     * CPU keeps the exact kernels for rows one value dominates); 0
     * keeps f32 activations (the exact path).  The weights made afterwards
     * use it: call it before any weight_new. */
    void (*set_act8)(cb_backend *b, int on);
    /* Optional (NULL: not available): until set again, attention adds
     * bias to the scores of the keys flagged in stale[0..n) (host memory,
     * copied; the keys past n are not flagged) for the query rows at
     * positions below until (blending's stale scale, as its log); n = 0
     * clears it.  Set it from the thread that runs the attention: a
     * device backend keeps it with the thread's queue (CUDA: per thread).
     * Errors: CB_ERR_NOMEM (then nothing is flagged). */
    cb_status (*set_key_bias)(cb_backend *b, const uint8_t *stale, int64_t n, float bias,
                              int32_t until);
    /* Optional (NULL: nothing to size): matmul will be given batches of up
     * to n rows; the backend sizes its scratch now, so that those products
     * allocate nothing (a larger batch still works).  Called after the
     * weights are made (cb_fwd_new). */
    void (*reserve)(cb_backend *b, int64_t n);
    /* Optional (NULL: nothing to size): attention will be given caches of
     * up to n_keys keys of n_head_kv heads of hd; the backend sizes its
     * scratch now, so that attention allocates nothing (more keys still
     * work).  Called when a KV cache is made (cb_kvcache_new). */
    void (*reserve_keys)(cb_backend *b, int64_t n_keys, int n_head_kv, int hd);
    /* Optional (NULL: the backend has none, as the CPU): graphs, a device's
     * way to queue a recurring sequence of operations at the cost of one.
     * graph_begin returns 1 when the operations the calling thread queues
     * from then until graph_end are recorded instead of run (0: they run as
     * usual, and graph_end is not called).  While it records, the thread
     * may queue only the operations that compute on backend memory (matmul,
     * matmul_multi, get_rows, rmsnorm, add_rmsnorm, rope, rope_qk, add,
     * swiglu, geglu, scale, kv_write, kv_write_kv, kv_read, attention,
     * gather, scatter), set_key_bias and upload (host arrays are copied
     * when recorded, as always): nothing that hands data back, waits,
     * allocates or frees, and no event.  graph_end(b, run) ends the
     * recording.  With run it queues the recorded work (replaying, updated,
     * the graph it last made under the same key) and returns 1.  It returns
     * 0 when none of the recorded work ran or will: run was 0, or the
     * recording failed (an operation the device could not record, or
     * scratch that had to grow); the caller then queues the operations
     * again, unrecorded.  A device fault is reported as usual
     * (cb_backend_status).  key tells apart sequences of different shapes
     * (cb_fwd_decode: its row count), each kept as a graph of its own. */
    int (*graph_begin)(cb_backend *b, int key);
    int (*graph_end)(cb_backend *b, int run);
    /* Optional declaration (0: the backend keeps the row-stability
     * contract below): 1 when its products' rows may depend on the call's
     * other rows or on their number beyond what the contract allows (CUDA:
     * cuBLAS picks its algorithm by shape, and a call's input rows share
     * one f16 scale).  cb_fwd_decode then gives every sequence's row
     * products of its own. */
    int rows_unstable;
    /* Optional declaration (0: not declared): the (query row, head) pairs
     * one attention task computes together, each of them against every key
     * up to the task's last row (an earlier row's later keys masked).  The
     * blend's cost model (blend.c) prices those keys: rows that lie apart,
     * as a blend's recomputed ones do, compute many keys they do not see. */
    int attn_pairs;
} cb_backend_ops;

/* Row-stable products (what cb_fwd_decode, which decodes independent
 * sequences together, relies on for a sequence's tokens to be the same
 * bits whatever it is batched with).  In products of up to rows_max rows,
 * matmul and matmul_multi compute row i of y from row i of x alone: the
 * values of the other rows never change it (past rows_max a device may
 * share one scale among the rows: CUDA's cuBLAS path, whose f16 inputs
 * take the scale of the largest value in the product).  Which kernel
 * computes a row may depend on the number of rows n, so a
 * row's bits may change with n; but every backend that does not declare
 * rows_unstable gives a row the same bits in all products whose n is a
 * multiple of its rows_step and at most its rows_max (struct cb_backend).
 * The CPU's exact path: CB_ROWS_STEP (2) and CB_ROWS_MAX (12) (one row
 * goes through a one-row kernel with more partial sums than the multi-row
 * ones, rows four at a time up to 12 with a lone last row through it
 * again, panels and sgemm past 12); its 8-bit path (qgemm.h: every kernel
 * computes the same sequence): 1 and any count.  test_backend_ops checks
 * it for every weight type on the CPU's kernels. */
#define CB_ROWS_STEP 2
#define CB_ROWS_MAX 12

struct cb_backend {
    const cb_backend_ops *ops;
    void *ctx;
    int n_threads;
    int rows_step, rows_max; /* the row-stable product sizes (above); kept by the backend */
    char desc[96];           /* "cpu (2 threads, avx2 kernels)", "cuda:0 (NVIDIA H100 80GB HBM3)" */
    /* Its optional features, resolved when it opened: names separated by
     * spaces, "-" before one that is off, and after an off one why, in
     * parentheses without spaces ("mass -gemv -graph(needs:memo)"); ""
     * where it has none (the CPU).  CUDA's are lib/cuda/features.h's. */
    char features[192];
    /* The first fault (below): fault is 0 or its cb_status, published after
     * fault_msg is written; fault_claimed picks the one writer. */
    int fault, fault_claimed;
    char fault_msg[CB_ERROR_MSG_MAX - 64];
};

/* Faults.  Operations return nothing; one that fails (a CUDA or cuBLAS
 * error, a kernel's fault found at a later synchronization, a fault
 * injected with cb_backend_fail_at) records the backend's first failure
 * with cb_backend_fail and returns: alloc, alloc_tmp, event_new and
 * weight_new with NULL.  A fault is sticky: every later operation does
 * nothing (its outputs are undefined) except those that release (free,
 * dealloc, weight_free, event_free), so the caller can unwind and free what
 * it holds.  A fault is usually CB_ERR_DEVICE (CB_ERR_INTERNAL for a
 * failed invariant, CB_ERR_NOMEM for host memory a device backend could
 * not get), fault_msg says what failed.
 *
 * Callers check cb_backend_status before they return success and before
 * they use what download or topk handed back (an index from a faulted topk
 * indexes nothing).  Kernels fail asynchronously: a device backend finds
 * the fault at its next synchronizing operation (download, topk, sync,
 * alloc, weight_new), so a check after those sees every fault that could
 * have touched the data.  A NULL from an allocating operation is a fault
 * when cb_backend_status says so, else out of memory.  The check is a load
 * and a branch; the CPU backend's operations never fail by themselves. */
static inline cb_status cb_backend_status(const cb_backend *b)
{
    return (cb_status)__atomic_load_n(&b->fault, __ATOMIC_ACQUIRE);
}

/* The status a NULL from alloc, alloc_tmp, event_new or weight_new stands
 * for: the backend's fault, else CB_ERR_NOMEM. */
static inline cb_status cb_backend_nomem(const cb_backend *b)
{
    cb_status st = cb_backend_status(b);
    return st != CB_OK ? st : CB_ERR_NOMEM;
}

/* Record a fault (st < 0) unless one is recorded already (the first one is
 * what went wrong; the rest follow from it).  Any thread; on return
 * cb_backend_status reports a fault (a second thread waits out the first
 * one's message). */
static inline void cb_backend_fail(cb_backend *b, cb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void cb_backend_fail(cb_backend *b, cb_status st, const char *fmt, ...)
{
    int zero = 0;
    va_list ap;
    if (!__atomic_compare_exchange_n(&b->fault_claimed, &zero, 1, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        while (!__atomic_load_n(&b->fault, __ATOMIC_ACQUIRE))
            ; /* a snprintf away */
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->fault_msg, sizeof b->fault_msg, fmt, ap);
    va_end(ap);
    __atomic_store_n(&b->fault, (int)st, __ATOMIC_RELEASE);
}

/* Fault injection, for the tests of every caller's error path (there is
 * no faulty GPU at hand): from the n-th operation on (n >= 1; counted over
 * every operation but the releasing ones and set_act8, reserve), each
 * operation fails as after a device fault, the first one recording
 * CB_ERR_DEVICE.  It wraps the backend's table, so that the backend runs
 * as before, uncounted, when it is not asked for.  cb_backend_open calls it
 * when $CB_BACKEND_FAIL_AT is n.  Errors: CB_ERR_NOMEM, CB_ERR_INVALID. */
cb_status cb_backend_fail_at(cb_backend *b, long n);

/* The operation profile, for finding where a run's time goes: the same
 * wrapping table times every operation (host time in the call, all
 * threads: on the CPU the work itself, on a device the issuing and any
 * wait) and, when the backend is freed, prints each operation's calls and
 * time on stderr.  cb_backend_open calls it when $CB_BACKEND_PROFILE is 1.
 * Errors: CB_ERR_NOMEM. */
cb_status cb_backend_profile(cb_backend *b);

/* The CPU backend: weights computed on in their GGUF types (AVX2 kernels
 * chosen at run time, else portable C), OpenBLAS sgemm on dequantized panels
 * for large batches, one persistent thread pool.  n_threads <= 0: the
 * number of cores.  cb_backend_cpu_new_ex(n, 0) uses only the portable
 * kernels (the tests compare both). */
cb_backend *cb_backend_cpu_new(int n_threads);
cb_backend *cb_backend_cpu_new_ex(int n_threads, int simd);

/* The backend registry (registry.c): "cpu" (also NULL or ""), "cuda" or
 * "cuda:N", or "auto" for CUDA device 0 when one is present, else the CPU.  The
 * CUDA backend lives in a module, libcbcore-cuda.so, loaded on demand so
 * that programs start without the CUDA libraries on machines without a
 * GPU.  $CB_BACKEND_FAIL_AT=N injects faults (cb_backend_fail_at),
 * $CB_BACKEND_PROFILE=1 profiles the operations (cb_backend_profile).
 * Errors: CB_ERR_INVALID (a malformed name, or $CB_BACKEND_FAIL_AT not a
 * count), CB_ERR_DEVICE (no CUDA module, or no usable device),
 * CB_ERR_NOMEM. */
cb_status cb_backend_open(cb_backend **out, const char *device, int n_threads, cb_error *err);

/* attn_mass on any backend: its operation, or where it has none the
 * CPU's on host copies of q, the caches' first n_keys rows and mass
 * (downloaded, computed, mass uploaded back).  Errors: the operation's;
 * CB_ERR_UNSUPPORTED when neither can run (no operation, no OpenBLAS). */
cb_status cb_backend_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n,
                               const void *k, const void *v, cb_type t, int64_t n_keys, int n_head,
                               int n_head_kv, int hd, float scale, int window, float *mass);

/* The module's one entry point (lib/cuda/cuda.cu).  Returns a cb_status;
 * on failure msg holds the reason.  The interface's version counts changes
 * to this table and to struct cb_backend (5: attn_mass added, and the
 * fault fields; 6: rope_qk and kv_write_kv; 7: add_rmsnorm; 8: attn_mass's
 * value cache; 9: host_alloc, host_free and upload_async; 10: mark_new
 * and mark_ms; 11: graph_begin and graph_end; 12: features). */
#define CB_CUDA_ENTRY "cb_backend_cuda_open"
#define CB_CUDA_ABI 12
typedef int (*cb_cuda_open_fn)(cb_backend **out, int abi, int device, char *msg, size_t msg_len);

#endif
