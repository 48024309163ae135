/* cuda.cu - the CUDA backend: the operations of lib/backend/backend.h on an
 * NVIDIA GPU, with cuBLAS for the matrix products and one small kernel per
 * remaining operation.  Built into its own module, libcbcore-cuda.so, which
 * the backend registry (lib/backend/registry.c) loads on demand.
 *
 * Memory.  Backend memory is plain device memory from the stream-ordered
 * allocator (cudaMallocAsync; no managed memory).  Weights are uploaded once
 * in their GGUF encoding and dequantized on the device to f16 (bf16 for
 * bf16 tensors, which f16 cannot hold) by one kernel per type; the formulas
 * are lib/core/dequant.h's, the CPU dequantizer's own.  Activations stay
 * f32; a matrix product converts its input rows to the weight's 16-bit type
 * and multiplies with cublasGemmEx, f32 accumulation and f32 output.
 *
 * Threads and streams.  Every host thread that uses the backend gets its
 * own non-blocking stream, cuBLAS handle and page-locked staging buffers
 * (struct tctx, found through a pthread key).  cb-run's KV loader thread
 * therefore copies layer l+1 on its stream while the calling thread's
 * stream fuses layer l; each cache layer has an event that the loader
 * records after queuing its copies and the compute stream waits on
 * (cudaStreamWaitEvent) before touching the layer, after blend.c's mutex
 * has told the host that the layer is queued.  Host data
 * (weights, KV rows, index arrays) goes through the page-locked buffers:
 * memcpy into one, cudaMemcpyAsync out of it, an event recorded; the buffer
 * is refilled only after its event, so two of them keep the host copy and
 * the DMA overlapping.
 *
 * Matrix products in f16 never overflow: a weight is scaled by a power of
 * two at load and each call's input rows by another (cb_op_f16_scale_exp:
 * the largest magnitude lands in [2^14, 2^15)), and alpha undoes both.  The
 * input's scale is found on the device and alpha read from device memory,
 * so a product never waits for the host.
 *
 * Errors.  Running out of device memory is returned (NULL, which the
 * caller reports as out of memory).  Any other CUDA or cuBLAS failure
 * after the backend started is a device fault (or a bug): the failed check
 * (CK, CKB) throws a cu_fault naming the backend operation, the call, file
 * and line, and the error itself; the table's entry for the operation
 * catches it and records it as the backend's sticky fault (backend.h), and
 * every later operation but the releasing ones does nothing.  The library
 * checks the fault where data comes back and returns CB_ERR_DEVICE with
 * that message; the process goes on.  No exception leaves the module.
 * Kernels fail asynchronously, so without a check after each one a fault
 * surfaces at a later call (the next download, sync or allocation);
 * CB_CUDA_SYNC=1 makes every operation wait for its work and check it, so
 * the report names the operation that caused it, and makes every matrix
 * product check its outputs for inf and NaN.
 *
 * Files: this one (errors, thread contexts, memory, events, the table),
 * cuda_mm.cu (weights, products), cuda_attn.cu (attention), cuda_ops.cu
 * (the small kernels), cuda_graph.cu (decode steps as graphs); cuda_impl.cuh
 * what they share.
 *
 * Verified: compiled and linked for sm_80, sm_86, sm_89, sm_90 and PTX
 * (compute_90) with nvcc 13.0, and run on an H100 (80 GB HBM3, driver
 * 580.159): in November 2026, tests/unit/test_backend_ops.c (every CUDA
 * case against the CPU backend) and tests/cli/device.sh (CPU vs CUDA end
 * to end on SmolLM2: first-token KL 1e-5, the same greedy answers; blend
 * from KV files precomputed on the GPU); on 2026-11-26, after the fault
 * handling and the split in four, test_backend_ops again (fault reports
 * included) and under compute-sanitizer (memcheck, initcheck, synccheck:
 * 0 errors; racecheck: no hazard in the cases it reached), and device.sh
 * without SmolLM2.  What changes here needs those again on a GPU. */
#include "cuda_impl.cuh"
#include "features.h"

#include <cuda.h> /* the driver's types only: its entry points come through cudart */

#include <time.h>
#include <type_traits>

/* ----------------------------------------------------------- errors */

/* the backend operation the calling thread is in (set by T()) */
static thread_local const char *cur_op = "open";
int cu_sync_each;
int cu_gemv_rows;
int cu_memo;
int cu_fuse;

void cu_fail(cb_status st, int cuda, const char *what, const char *file, int line, const char *why)
{
    cu_fault f;
    f.st = st;
    /* the reason first: a call's text can be long (it is cut at 80) */
    snprintf(f.msg, sizeof f.msg, "%s: %s (%.80s%s at %s:%d)%s", cur_op, why, what, strlen(what) > 80 ? "..." : "",
             file, line,
             !cuda || cu_sync_each ? ""
                                   : "; the error may come from earlier work: CB_CUDA_SYNC=1 checks after every "
                                     "operation");
    throw f;
}

/* ------------------------------------------------------ thread context */

/* A thread ends: its context goes back to the pool.  Work it queued may
 * still be running: the stream keeps its order, and other threads that need
 * that work wait on an event or were handed it after a sync. */
static void tctx_release(void *p)
{
    tctx *t = (tctx *)p;
    rec_abandon(t); /* (a recording left open) */
    t->kb_n = 0;    /* a bias set and never cleared is not the next thread's */
    pthread_mutex_lock(&t->owner->mu);
    t->next = t->owner->free_list;
    t->owner->free_list = t;
    pthread_mutex_unlock(&t->owner->mu);
}

/* an event of a context, unless tctx_new failed before making it */
static void event_drop(cudaEvent_t ev)
{
    if (ev)
        cudaEventDestroy(ev);
}

static void tctx_destroy(tctx *t)
{
    if (t->s)
        cudaStreamSynchronize(t->s);
    for (int i = 0; i < N_IDX; i++) {
        cudaFreeHost(t->idx[i].host);
        cudaFree(t->idx[i].dev);
        event_drop(t->idx[i].ev);
    }
    for (int i = 0; i < 2; i++) {
        cudaFreeHost(t->stage[i].host);
        event_drop(t->stage[i].ev);
    }
    for (int i = 0; i < N_MEMO; i++) {
        cudaFreeHost(t->memo[i].sl.host);
        cudaFree(t->memo[i].sl.dev);
        event_drop(t->memo[i].sl.ev);
    }
    cudaFree(t->act.p);
    cudaFree(t->tile32.p);
    cudaFree(t->tile16.p);
    cudaFree(t->att_part.p);
    cudaFree(t->mass_buf.p);
    for (int i = 0; i < N_KB; i++) {
        cudaFree(t->kbr[i].dev.p);
        free(t->kbr[i].flags);
    }
    free(t->kb_host);
    rec_destroy(t);
    cudaFree(t->scal);
    cudaFree(t->blas_ws);
    if (t->blas)
        cublasDestroy(t->blas);
    if (t->s)
        cudaStreamDestroy(t->s);
    free(t);
}

static tctx *tctx_new(cuda_ctx *c)
{
    tctx *t = (tctx *)calloc(1, sizeof *t);
    if (!t)
        cu_fail(CB_ERR_NOMEM, 0, "calloc", __FILE__, __LINE__, "out of memory");
    t->owner = c;
    try {
        CK(cudaStreamCreateWithFlags(&t->s, cudaStreamNonBlocking));
        for (int i = 0; i < N_IDX; i++)
            CK(cudaEventCreateWithFlags(&t->idx[i].ev, cudaEventDisableTiming));
        for (int i = 0; i < 2; i++)
            CK(cudaEventCreateWithFlags(&t->stage[i].ev, cudaEventDisableTiming));
        for (int i = 0; i < N_MEMO; i++)
            CK(cudaEventCreateWithFlags(&t->memo[i].sl.ev, cudaEventDisableTiming));
    } catch (const cu_fault &) {
        tctx_destroy(t); /* what was made */
        throw;
    }
    return t;
}

tctx *T(cb_backend *b, const char *op)
{
    cuda_ctx *c = CTX(b);
    cur_op = op;
    CK(cudaSetDevice(c->dev)); /* per host thread; cheap when unchanged */
    tctx *t = (tctx *)pthread_getspecific(c->key);
    if (t)
        return t;
    pthread_mutex_lock(&c->mu);
    if (c->free_list) {
        t = c->free_list;
        c->free_list = t->next;
    } else if (c->n_all < MAX_TCTX) {
        try {
            t = tctx_new(c);
        } catch (const cu_fault &) {
            pthread_mutex_unlock(&c->mu); /* or every later thread would wait on it */
            throw;
        }
        c->all[c->n_all++] = t;
    }
    pthread_mutex_unlock(&c->mu);
    if (!t)
        BUG("T", "more than 64 threads use one CUDA backend at once");
    pthread_setspecific(c->key, t);
    return t;
}

/* Send `bytes` of h through staging slot sl: once the slot's last copy
 * has left its host buffer, grown to `cap` bytes if it holds fewer than
 * `bytes` (its device buffer freed after the work that read it), filled,
 * and its copy to the device queued on t->s; returns the device copy. */
static void slot_grow(tctx *t, slot *sl, size_t cap)
{
    CK(cudaFreeHost(sl->host));
    if (sl->dev)
        CK(cudaFreeAsync(sl->dev, t->s));
    sl->host = sl->dev = NULL;
    sl->cap = 0;
    CK(cudaHostAlloc(&sl->host, cap, cudaHostAllocDefault));
    CK(cudaMallocAsync(&sl->dev, cap, t->s));
    sl->cap = cap;
}

static const void *slot_send(tctx *t, slot *sl, const void *h, size_t bytes, size_t cap)
{
    CK(cudaEventSynchronize(sl->ev));
    if (bytes > sl->cap)
        slot_grow(t, sl, cap);
    if (bytes == 0)
        return sl->dev;
    memcpy(sl->host, h, bytes);
    CK(cudaMemcpyAsync(sl->dev, sl->host, bytes, cudaMemcpyHostToDevice, t->s));
    CK(cudaEventRecord(sl->ev, t->s));
    return sl->dev;
}

/* stage() under CB_CUDA_MEMO=1, for 1..MEMO_BYTES bytes: the device copy
 * of the same contents if one of the thread's N_MEMO holds it, else the
 * least recently used one refilled.  Its device buffer is rewritten by a
 * copy on t->s, after every kernel queued before that read it; its host
 * buffer once the copy that last read it is done.  An index array a
 * decode step's layers stage over and over (positions: RoPE of Q and K,
 * the cache rows of K and V, attention; the RoPE table) is sent once a
 * step: three API calls less each time. */
static const void *stage_memo(tctx *t, const void *h, size_t bytes)
{
    memo *lru = &t->memo[0];
    t->memo_clock++;
    for (int i = 0; i < N_MEMO; i++) {
        memo *m = &t->memo[i];
        if (m->len == bytes && memcmp(m->sl.host, h, bytes) == 0) {
            m->used = t->memo_clock;
            return m->sl.dev;
        }
        if (m->used < lru->used)
            lru = m;
    }
    lru->len = 0; /* until refilled: an error on the way leaves it empty */
    const void *d = slot_send(t, &lru->sl, h, bytes, (size_t)MEMO_BYTES);
    lru->len = bytes;
    lru->used = t->memo_clock;
    return d;
}

const void *stage(tctx *t, const void *h, size_t bytes)
{
    if (cu_rec)
        return rec_stage(t, h, bytes);
    if (cu_memo && bytes > 0 && bytes <= (size_t)MEMO_BYTES)
        return stage_memo(t, h, bytes);
    slot *sl = &t->idx[t->next_idx];
    t->next_idx = (t->next_idx + 1) % N_IDX;
    return slot_send(t, sl, h, bytes, bytes < (size_t)IDX_CAP ? (size_t)IDX_CAP : bytes * 2);
}

const int32_t *stage_idx(tctx *t, const int32_t *h, int64_t n)
{
    return (const int32_t *)stage(t, h, sizeof(int32_t) * (size_t)(n > 0 ? n : 0));
}

/* A context's staging made now, as its first uses would make it: both
 * upload buffers and every index slot (and memo slot), page-locked, so
 * that the operations a caller times first pin no host memory (tens of
 * calls, milliseconds, inside a blend's first layers on two threads) */
static void tctx_warm(tctx *t)
{
    for (int i = 0; i < 2; i++)
        if (!t->stage[i].host) {
            CK(cudaHostAlloc(&t->stage[i].host, STAGE_BYTES, cudaHostAllocDefault));
            t->stage[i].cap = STAGE_BYTES;
        }
    for (int i = 0; i < N_IDX; i++)
        if (!t->idx[i].host)
            slot_grow(t, &t->idx[i], IDX_CAP);
    for (int i = 0; i < N_MEMO && cu_memo; i++)
        if (!t->memo[i].sl.host)
            slot_grow(t, &t->memo[i].sl, (size_t)MEMO_BYTES);
}

/* CB_CUDA_SYNC=1: after an operation, wait for the thread's work and
 * throw on any error, naming the operation */
static void check_op(cb_backend *b)
{
    tctx *t = (tctx *)pthread_getspecific(CTX(b)->key);
    if (!t)
        return;
    CK(cudaStreamSynchronize(t->s));
    CK(cudaGetLastError());
}

/* After a fault, the device's work waited for (best effort: a broken
 * context returns at once) before memory is released: a fault can skip
 * the sync that would have waited for another thread's queued copies into
 * it (the blend's loader, whose caches the computing thread frees). */
static void drain_after_fault(cb_backend *b)
{
    cudaSetDevice(CTX(b)->dev);
    cudaDeviceSynchronize();
    cudaGetLastError();
}

/* What a guarded entry returns when it did not run or failed: NULL, 0, or
 * for an operation that returns a status, the backend's (never CB_OK) */
template <typename R> static R not_done(cb_backend *b)
{
    if constexpr (std::is_same_v<R, cb_status>)
        return cb_backend_status(b) != CB_OK ? cb_backend_status(b) : CB_ERR_DEVICE;
    else
        return R();
}

/* What an entry returns while a failed recording is dropped: CB_OK for
 * an operation that returns a status (the step is queued again, and the
 * status comes then), else NULL or 0 */
template <typename R> static R rec_skip()
{
    if constexpr (std::is_same_v<R, cb_status>)
        return CB_OK;
    else
        return R();
}

/* The operation table's entries: a failed recording's, nothing
 * (rec_skip); after a fault, nothing (Release: the
 * releasing operations, which always run, once the device's work is
 * done); a cu_fault thrown by the operation recorded as the backend's
 * fault, the result then not_done's; under CB_CUDA_SYNC=1, check_op after
 * the operation. */
template <bool Release, auto F> struct guarded;
template <bool Release, typename R, typename... A, R (*F)(cb_backend *, A...)> struct guarded<Release, F> {
    static R call(cb_backend *b, A... a)
    {
        if (cu_rec == REC_BROKEN) /* nothing more is recorded (cuda_graph.cu) */
            return rec_skip<R>();
        if (cb_backend_status(b) != CB_OK) {
            if (!Release)
                return not_done<R>(b);
            drain_after_fault(b);
        }
        try {
            if constexpr (std::is_void_v<R>) {
                F(b, a...);
                if (cu_sync_each)
                    check_op(b);
            } else {
                R r = F(b, a...);
                if (cu_sync_each)
                    check_op(b);
                return r;
            }
        } catch (const cu_fault &f) {
            if (cu_rec) { /* a failed recording, not a fault: the step is queued again */
                rec_broken(f.msg);
                return rec_skip<R>();
            }
            cb_backend_fail(b, f.st, "cuda:%d: %s", CTX(b)->dev, f.msg);
        }
        return not_done<R>(b);
    }
};

/* ------------------------------------------------------------ memory */

void *alloc_on(tctx *t, size_t nbytes)
{
    void *p = NULL;
    if (cu_rec)
        rec_refuse("alloc_on");
    cudaError_t e = cudaMallocAsync(&p, nbytes ? nbytes : 1, t->s);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky: clear it, the caller reports it */
        return NULL;
    }
    CK(e);
    return p;
}

static void *cu_alloc(cb_backend *b, size_t nbytes)
{
    tctx *t = T(b, "alloc");
    void *p = alloc_on(t, nbytes);
    if (!p)
        return NULL;
    CK(cudaMemsetAsync(p, 0, nbytes, t->s));
    CK(cudaStreamSynchronize(t->s)); /* usable by every thread's stream */
    return p;
}

static void *cu_alloc_tmp(cb_backend *b, size_t nbytes)
{
    return alloc_on(T(b, "alloc_tmp"), nbytes); /* stream-ordered: this thread's later work sees it */
}

void free_on(tctx *t, void *p)
{
    if (cu_rec)
        rec_refuse("free_on");
    if (p)
        CK(cudaFreeAsync(p, t->s));
}

void *keep_on(tctx *t, kept *k, size_t nbytes)
{
    if (nbytes > k->cap) {
        if (cu_rec)
            rec_refuse("keep_on (scratch to grow)");
        free_on(t, k->p);
        k->cap = 0;
        if ((k->p = alloc_on(t, nbytes)))
            k->cap = nbytes;
    }
    return k->p;
}

void cu_dealloc(cb_backend *b, void *p)
{
    if (p)
        free_on(T(b, "dealloc"), p);
}

void upload_on(tctx *t, void *dst, const void *src, size_t nbytes)
{
    if (cu_rec) {
        rec_upload(t, dst, src, nbytes);
        return;
    }
    for (size_t off = 0; off < nbytes;) {
        slot *sl = &t->stage[t->next_stage];
        size_t len = nbytes - off < (size_t)STAGE_BYTES ? nbytes - off : (size_t)STAGE_BYTES;
        t->next_stage ^= 1;
        CK(cudaEventSynchronize(sl->ev));
        if (!sl->host) {
            CK(cudaHostAlloc(&sl->host, STAGE_BYTES, cudaHostAllocDefault));
            sl->cap = STAGE_BYTES;
        }
        memcpy(sl->host, (const char *)src + off, len);
        CK(cudaMemcpyAsync((char *)dst + off, sl->host, len, cudaMemcpyHostToDevice, t->s));
        CK(cudaEventRecord(sl->ev, t->s));
        off += len;
    }
}

static void cu_upload(cb_backend *b, void *dst, const void *src, size_t nbytes)
{
    upload_on(T(b, "upload"), dst, src, nbytes);
}

static void cu_download(cb_backend *b, void *dst, const void *src, size_t nbytes)
{
    tctx *t = T(b, "download");
    if (cu_rec) /* (backend.h: what a recording may not hold, refused before it breaks the capture) */
        rec_refuse("download");
    CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, t->s));
    CK(cudaStreamSynchronize(t->s));
}

static void cu_sync(cb_backend *b)
{
    tctx *t = T(b, "sync");
    if (cu_rec)
        rec_refuse("sync");
    CK(cudaStreamSynchronize(t->s));
}

/* host_alloc: page-locked memory, which the copy engine reads directly:
 * upload_async sends it with no staging copy and no wait (the caller
 * syncs before it changes it; cb-run's loader, after each layer) */
static void *cu_host_alloc(cb_backend *b, size_t nbytes)
{
    void *p = NULL;
    T(b, "host_alloc"); /* on the backend's device */
    cudaError_t e = cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky: the caller reports it */
        return NULL;
    }
    CK(e);
    return p;
}

static void cu_host_free(cb_backend *b, void *p)
{
    if (p) {
        T(b, "host_free");
        CK(cudaFreeHost(p));
    }
}

static void cu_upload_async(cb_backend *b, void *dst, const void *src, size_t nbytes)
{
    tctx *t = T(b, "upload_async");
    if (cu_rec)
        rec_refuse("upload_async");
    if (nbytes)
        CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, t->s));
}

/* an event on the calling thread's device (its context); NULL when out of memory */
static void *event_make(cb_backend *b, const char *op, unsigned flags)
{
    cudaEvent_t ev;
    T(b, op);
    cudaError_t e = cudaEventCreateWithFlags(&ev, flags);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return NULL;
    }
    CK(e);
    return (void *)ev;
}

static void *cu_event_new(cb_backend *b)
{
    return event_make(b, "event_new", cudaEventDisableTiming);
}

/* backend.h's timing marks: events that keep their time */
static void *cu_mark_new(cb_backend *b)
{
    return event_make(b, "mark_new", cudaEventDefault);
}

static double cu_mark_ms(cb_backend *b, void *a, void *z)
{
    float ms = -1;
    T(b, "mark_ms");
    CK(cudaEventSynchronize((cudaEvent_t)a)); /* (at once for one never recorded) */
    CK(cudaEventSynchronize((cudaEvent_t)z));
    cudaError_t e = cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)z);
    if (e == cudaErrorInvalidResourceHandle || e == cudaErrorNotReady) { /* one never recorded: not sticky */
        cudaGetLastError();
        return -1;
    }
    CK(e);
    return ms;
}

static void cu_event_free(cb_backend *b, void *ev)
{
    T(b, "event_free");
    CK(cudaEventDestroy((cudaEvent_t)ev));
}

static void cu_event_record(cb_backend *b, void *ev)
{
    tctx *t = T(b, "event_record");
    if (cu_rec) /* (an event recorded in a capture cannot be waited for after it) */
        rec_refuse("event_record");
    CK(cudaEventRecord((cudaEvent_t)ev, t->s));
}

static void cu_event_wait(cb_backend *b, void *ev)
{
    tctx *t = T(b, "event_wait");
    if (cu_rec)
        rec_refuse("event_wait");
    CK(cudaStreamWaitEvent(t->s, (cudaEvent_t)ev, 0));
}

/* ------------------------------------------------------------ backend */

static void cu_free(cb_backend *b)
{
    if (!b)
        return;
    cuda_ctx *c = CTX(b);
    cudaSetDevice(c->dev);
    cudaDeviceSynchronize();
    for (int i = 0; i < c->n_all; i++)
        tctx_destroy(c->all[i]);
    pthread_setspecific(c->key, NULL);
    pthread_key_delete(c->key);
    pthread_mutex_destroy(&c->mu);
    free(c);
    free(b);
}

static cb_backend_ops cuda_ops;

/* whether environment variable name is set to v */
static bool env_is(const char *name, const char *v)
{
    const char *e = getenv(name);
    return e && strcmp(e, v) == 0;
}

static const char *env_get(const char *name) { return getenv(name); }

/* The table: every entry guarded (fault handling, CB_CUDA_SYNC).  One
 * table for the process, shaped by the features (features.h) resolved at
 * the first open: those not per backend hold for every backend of a
 * process, so that a later open under another environment does not change
 * them under the backends already open (a backend declares rows_max from
 * them); cb_backend_cuda_open resolves the per-backend ones (fa, qw)
 * again at each open. */
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;
static cu_feature_set cu_proc; /* the process's features, resolved by init_ops */

static void init_ops(void)
{
#define OP(field, fn) o->field = guarded<false, fn>::call
#define RELEASE(field, fn) o->field = guarded<true, fn>::call
    cb_backend_ops *o = &cuda_ops;
    const unsigned char *on = cu_proc.on;
    cu_features_resolve(&cu_proc, env_get, NULL);
    cu_sync_each = on[CU_F_SYNC];
    o->name = "cuda";
    o->max_head_dim = CU_ATT_HD_MAX;
    o->free = cu_free; /* checks nothing: it cannot fail */
    OP(alloc, cu_alloc);
    OP(alloc_tmp, cu_alloc_tmp);
    RELEASE(dealloc, cu_dealloc);
    OP(upload, cu_upload);
    OP(download, cu_download);
    OP(sync, cu_sync);
    /* the loader's layers read into page-locked memory and sent from there
     * (cu_host_alloc), behind CB_CUDA_PIN=1 until a GPU run has checked it;
     * without it, malloc's memory through the staging buffers */
    if (on[CU_F_PIN]) {
        OP(host_alloc, cu_host_alloc);
        RELEASE(host_free, cu_host_free);
        OP(upload_async, cu_upload_async);
    } else {
        o->host_alloc = NULL;
        o->host_free = NULL;
        o->upload_async = NULL;
    }
    OP(event_new, cu_event_new);
    RELEASE(event_free, cu_event_free);
    OP(event_record, cu_event_record);
    OP(event_wait, cu_event_wait);
    OP(mark_new, cu_mark_new);
    OP(mark_ms, cu_mark_ms);
    OP(weight_new, cu_weight_new);
    RELEASE(weight_free, cu_weight_free);
    OP(matmul, cu_matmul);
    OP(get_rows, cu_get_rows);
    OP(rmsnorm, cu_rmsnorm);
    OP(rope, cu_rope);
    OP(add, cu_add);
    OP(swiglu, cu_swiglu);
    OP(geglu, cu_geglu);
    OP(scale, cu_scale);
    OP(kv_write, cu_kv_write);
    OP(kv_read, cu_kv_read);
    OP(attention, cu_attention);
    OP(gather, cu_gather);
    OP(scatter, cu_scatter);
    OP(deviation, cu_deviation);
    OP(topk, cu_topk);
    /* probe's score on the device (passed the op tests and every
     * sanitizer on an H200, 2026-11-27); CB_CUDA_MASS=0 leaves it to the
     * host, which copies each probed layer's queries and keys back */
    if (on[CU_F_MASS])
        OP(attn_mass, cu_attn_mass);
    /* blending's stale scale (the key bias both attention kernels add),
     * behind CB_CUDA_KBIAS=1 until a GPU run has checked it:
     * without it a blend on the device keeps the scale 1, and says so */
    if (on[CU_F_KBIAS])
        OP(set_key_bias, cu_set_key_bias);
    else
        o->set_key_bias = NULL;
    /* cuBLAS picks its algorithm by shape and a product's input rows share
     * one f16 scale: a row's bits can depend on its company (backend.h).
     * The few-row kernel (cuda_mm.cu) keeps each row to itself; it stays
     * behind CB_CUDA_GEMV=1 until a GPU run has checked it, and
     * then decoding batches sequences in products of up to CU_GEMV_ROWS
     * rows (cb_backend_cuda_open sets rows_step and rows_max) */
    cu_gemv_rows = on[CU_F_GEMV] ? CU_GEMV_ROWS : 0;
    o->rows_unstable = cu_gemv_rows == 0;
    /* with it, a decode step's Q, K and V (gate and up) in one launch */
    if (cu_gemv_rows)
        OP(matmul_multi, cu_matmul_multi);
    else
        o->matmul_multi = NULL;
    /* index arrays sent once while they repeat (stage_memo), attention's
     * and attn_mass's scratch kept (keep_on), behind CB_CUDA_MEMO=1 until a
     * GPU run has checked them */
    cu_memo = on[CU_F_MEMO];
    /* Q's and K's RoPE in one launch, K's and V's cache rows in one, a
     * residual and the next norm in one, behind CB_CUDA_FUSE=1 until a GPU
     * run has checked them */
    cu_fuse = on[CU_F_FUSE]; /* (and products_16's input scale without a memset) */
    if (cu_fuse) {
        OP(rope_qk, cu_rope_qk);
        OP(kv_write_kv, cu_kv_write_kv);
        OP(add_rmsnorm, cu_add_rmsnorm);
    } else {
        o->rope_qk = NULL;
        o->kv_write_kv = NULL;
        o->add_rmsnorm = NULL;
    }
    /* a decode step recorded as a graph and replayed (cuda_graph.cu),
     * behind CB_CUDA_GRAPH=1 until a GPU run has checked it;
     * with the memo only (a recording stages through an arena of its own,
     * and attention's scratch must not be allocated inside it), and not
     * under CB_CUDA_SYNC=1, whose waits no recording may hold (the
     * table's needs and excludes).  Their entries guard themselves:
     * graph_end must end a recording even after a fault */
    if (on[CU_F_GRAPH]) {
        o->graph_begin = cu_graph_begin;
        o->graph_end = cu_graph_end;
    } else {
        o->graph_begin = NULL;
        o->graph_end = NULL;
    }
#undef OP
#undef RELEASE
}

/* Warm start, the kernels: under lazy loading (CUDA's default since 12.2)
 * a kernel is loaded at its first launch, inside the first operations a
 * caller times (a first blend launches some forty kernels for the first
 * time).  This loads them all when the backend opens: from one kernel of
 * each file the driver gives its module, lists the module's functions and
 * loads each.  The driver's calls come through cudart's entry-point query
 * (the module does not link libcuda); a driver without them (before 12.4)
 * leaves the kernels to load lazily, as before.  A device newer than the
 * newest SASS in the module (CU_SASS_NEWEST, from CUDA_ARCHS) runs kernels
 * compiled from PTX on the spot: those stay lazy too, not every kernel
 * compiled at every open.  Returns how many kernels it loaded, -1 when it
 * could not list them (or left them lazy). */
typedef CUresult (*fn_func_module)(CUmodule *, CUfunction);
typedef CUresult (*fn_module_count)(unsigned *, CUmodule);
typedef CUresult (*fn_module_list)(CUfunction *, unsigned, CUmodule);
typedef CUresult (*fn_func_load)(CUfunction);

static void *driver_fn(const char *name)
{
    void *fn = NULL;
#if CUDART_VERSION >= 12050 /* the query by version came with 12.5: before it, kernels stay lazy */
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12040, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return NULL;
#else
    (void)name;
#endif
    return fn;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#ifndef CU_SASS_NEWEST
#define CU_SASS_NEWEST 90
#endif

static int load_kernels(const cudaDeviceProp *prop)
{
    if (prop->major * 10 + prop->minor > CU_SASS_NEWEST)
        return -1;
    fn_func_module func_module = (fn_func_module)driver_fn("cuFuncGetModule");
    fn_module_count module_count = (fn_module_count)driver_fn("cuModuleGetFunctionCount");
    fn_module_list module_list = (fn_module_list)driver_fn("cuModuleEnumerateFunctions");
    fn_func_load func_load = (fn_func_load)driver_fn("cuFuncLoad");
    const void *anchor[] = {cu_mm_kernel(), cu_attn_kernel(), cu_ops_kernel()};
    int loaded = 0;
    if (!func_module || !module_count || !module_list || !func_load) {
        cudaGetLastError();
        return -1;
    }
    for (size_t i = 0; i < sizeof anchor / sizeof anchor[0]; i++) {
        cudaFunction_t f;
        CUmodule mod;
        unsigned n = 0;
        if (cudaGetFuncBySymbol(&f, anchor[i]) != cudaSuccess || func_module(&mod, (CUfunction)f) != CUDA_SUCCESS ||
            module_count(&n, mod) != CUDA_SUCCESS) {
            cudaGetLastError();
            return -1;
        }
        CUfunction *all = (CUfunction *)calloc(n ? n : 1, sizeof *all);
        if (!all || module_list(all, n, mod) != CUDA_SUCCESS) {
            free(all);
            return -1;
        }
        for (unsigned j = 0; j < n; j++)
            loaded += func_load(all[j]) == CUDA_SUCCESS;
        free(all);
    }
    return loaded;
}

/* Why cudaGetDeviceCount failed (e), in words a user can act on.  The runtime
 * reports a missing driver (libcuda.so.1 not loadable) as an insufficient
 * one; cudaDriverGetVersion tells the two apart: it gives 0 without a driver. */
static void cuda_no_device(cudaError_t e, char *msg, size_t msg_len)
{
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if ((e == cudaErrorInsufficientDriver && drv == 0) || e == cudaErrorNoDevice) {
        if (drv == 0)
            snprintf(msg, msg_len, "no NVIDIA driver found (libcuda.so.1 cannot be loaded)");
        else
            snprintf(msg, msg_len, "the NVIDIA driver (CUDA %d.%d) sees no GPU", drv / 1000, drv % 1000 / 10);
    } else if (e == cudaErrorInsufficientDriver) {
        snprintf(msg, msg_len, "the NVIDIA driver is too old: it runs CUDA %d.%d, this build needs %d.%d; update the driver",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    } else {
        snprintf(msg, msg_len, "no usable CUDA device: %s", cudaGetErrorString(e));
    }
}

extern "C" __attribute__((visibility("default"))) int cb_backend_cuda_open(cb_backend **out, int abi, int device,
                                                                           char *msg, size_t msg_len)
{
    int count = 0;
    cudaError_t e;
    *out = NULL;
    if (abi != CB_CUDA_ABI) {
        snprintf(msg, msg_len, "libcbcore-cuda.so was built for another libcbcore (interface %d, expected %d)",
                 CB_CUDA_ABI, abi);
        return CB_ERR_DEVICE;
    }
    if ((e = cudaGetDeviceCount(&count)) != cudaSuccess) {
        cuda_no_device(e, msg, msg_len);
        cudaGetLastError();
        return CB_ERR_DEVICE;
    }
    if (device >= count) {
        snprintf(msg, msg_len, "no such device: this machine has %d CUDA device%s", count, count == 1 ? "" : "s");
        return CB_ERR_DEVICE;
    }
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    cb_backend *b = (cb_backend *)calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        return CB_ERR_NOMEM;
    }
    c->dev = device;
    if ((e = cudaGetDeviceProperties(&c->prop, device)) != cudaSuccess || (e = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(msg, msg_len, "cannot use device %d: %s", device, cudaGetErrorString(e));
        free(c);
        free(b);
        return CB_ERR_DEVICE;
    }
    int pools = 0;
    cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
    if (!pools) {
        snprintf(msg, msg_len, "%.64s does not support stream-ordered allocation (cudaMallocAsync)", c->prop.name);
        free(c);
        free(b);
        return CB_ERR_DEVICE;
    }
    if (c->prop.major < 8) {
        snprintf(msg, msg_len, "%.64s has compute capability %d.%d; this build has code for 8.0 and newer",
                 c->prop.name, c->prop.major, c->prop.minor);
        free(c);
        free(b);
        return CB_ERR_DEVICE;
    }
    /* keep freed memory in the stream-ordered pool instead of returning it
     * to the driver at every synchronization */
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    /* attention's shared memory for head dimensions up to CU_ATT_HD_MAX (80
     * KB at 256: above the 48 KB a launch gets without asking) */
    size_t smem;
    if ((e = cu_attention_setup(&c->prop, &smem, &c->fa_smem)) != cudaSuccess) {
        snprintf(msg, msg_len, "%.64s: cannot give attention %zu bytes of shared memory: %s", c->prop.name, smem,
                 cudaGetErrorString(e));
        cudaGetLastError();
        free(c);
        free(b);
        return CB_ERR_DEVICE;
    }
    pthread_mutex_init(&c->mu, NULL);
    if (pthread_key_create(&c->key, tctx_release) != 0) {
        snprintf(msg, msg_len, "out of thread keys");
        pthread_mutex_destroy(&c->mu);
        free(c);
        free(b);
        return CB_ERR_NOMEM;
    }
    pthread_once(&ops_once, init_ops);
    /* the per-backend features: tensor-core attention (cuda_attn.cu's
     * k_flash), where the device has the shared memory for its tiles, and
     * weights kept in their GGUF blocks (cuda_mm.cu); the rest are the
     * process's */
    cu_feature_set fs;
    cu_features_resolve(&fs, env_get, &cu_proc);
    if (c->fa_smem == 0)
        cu_features_off(&fs, CU_F_FA, "no-shared-memory");
    c->fa = fs.on[CU_F_FA];
    c->qw = fs.on[CU_F_QW];
    cu_features_format(&fs, b->features, sizeof b->features);
    b->ops = &cuda_ops;
    b->ctx = c;
    b->n_threads = 1;
    b->rows_step = 1;
    b->rows_max = cu_gemv_rows; /* (0 and rows_unstable without the few-row kernel) */
    snprintf(b->desc, sizeof b->desc, "cuda:%d (%.48s, sm_%d%d, %.0f GiB)", device, c->prop.name, c->prop.major,
             c->prop.minor, (double)c->prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    /* warm start: the opening thread's context, its cuBLAS handle, its
     * workspace and its staging now, and a second context's staging, not
     * inside the first operations a caller times.  Best effort: what fails
     * here fails again, and is reported, where it is used. */
    try {
        tctx *t = T(b, "open");
        cu_blas(t);
        tctx_warm(t);
        /* and a second context, staging made, on the free list for the
         * first thread to come (cb-run's KV loader) */
        tctx *spare = tctx_new(c);
        try {
            tctx_warm(spare);
        } catch (cu_fault &) {
            tctx_destroy(spare);
            throw;
        }
        pthread_mutex_lock(&c->mu);
        if (c->n_all < MAX_TCTX) {
            c->all[c->n_all++] = spare;
            spare->next = c->free_list;
            c->free_list = spare;
            spare = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        if (spare)
            tctx_destroy(spare);
        double t0 = now_ms();
        int n_loaded = load_kernels(&c->prop);
        if (env_is("CB_BACKEND_PROFILE", "1"))
            fprintf(stderr, "# cuda: %d kernels loaded at open in %.1f ms (-1: left lazy, see load_kernels)\n",
                    n_loaded, now_ms() - t0);
        CK(cudaDeviceSynchronize());
    } catch (cu_fault &) {
        cudaGetLastError();
    }
    *out = b;
    return CB_OK;
}
