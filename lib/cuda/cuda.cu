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
 * Errors.  Only an allocation failure is returned (NULL, which the caller
 * reports as out of memory).  Any other CUDA or cuBLAS failure after the
 * backend started is a device fault or a bug: the process stops, naming the
 * backend operation, the call, file and line, and the error itself.
 * Kernels fail asynchronously, so without a check after each one a fault
 * surfaces at a later call; CB_CUDA_SYNC=1 makes every operation wait for
 * its work and check it, so the report names the operation that caused it,
 * and makes every matrix product check its outputs for inf and NaN.
 *
 * Verified: compiled and linked for sm_80, sm_86, sm_89, sm_90 and PTX
 * (compute_90) with nvcc 13.0, and run on an H100 (80 GB HBM3, driver
 * 580.159, November 2026): tests/unit/test_backend_ops.c (every CUDA case
 * against the CPU backend, split-key attention included) and
 * tests/cli/device.sh (CPU vs CUDA end to end on SmolLM2: first-token KL
 * 1e-5, the same greedy answers; blend from KV files precomputed on the
 * GPU).  No GPU was lent after that; what changes here needs those two
 * again on one. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

extern "C" {
#include "../backend/backend.h"
}
#include "../backend/opmath.h"
#include "../core/dequant.h"

/* ----------------------------------------------------------- errors */

/* the backend operation the calling thread is in (set by T()) */
static thread_local const char *cur_op = "open";
/* CB_CUDA_SYNC=1: every operation waits for its work and checks it */
static int sync_each;

static void die(const char *what, const char *file, int line, const char *why)
{
    fprintf(stderr, "cacheblend: CUDA backend: %s: %s failed at %s:%d: %s%s\n", cur_op, what, file, line, why,
            sync_each ? "" : " (the error may come from earlier work: CB_CUDA_SYNC=1 checks after every operation)");
    abort();
}

#define CK(x)                                                                                                         \
    do {                                                                                                              \
        cudaError_t e_ = (x);                                                                                         \
        if (e_ != cudaSuccess)                                                                                        \
            die(#x, __FILE__, __LINE__, cudaGetErrorString(e_));                                                      \
    } while (0)

#define CKB(x)                                                                                                        \
    do {                                                                                                              \
        cublasStatus_t s_ = (x);                                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                              \
            die(#x, __FILE__, __LINE__, cublasGetStatusString(s_));                                                   \
    } while (0)

/* after a kernel launch */
#define CKL() CK(cudaGetLastError())

static unsigned nblocks(int64_t n, int per)
{
    return (unsigned)((n + per - 1) / per);
}

/* launch kernel over n elements, 256 threads a block, on thread context t's stream */
#define LAUNCH_1D(t, n, kernel, ...)                                                                                  \
    do {                                                                                                              \
        if ((n) > 0) {                                                                                                \
            kernel<<<nblocks((n), 256), 256, 0, (t)->s>>>(__VA_ARGS__);                                               \
            CKL();                                                                                                    \
        }                                                                                                             \
    } while (0)

/* ------------------------------------------------------ thread context */

/* 64 staging slots for index arrays and small tables: the host may queue
 * that many such operations ahead of the device before it waits for the
 * oldest slot to be free again */
enum { N_IDX = 64, STAGE_BYTES = 8 << 20 };

typedef struct slot {
    void *host;      /* page-locked */
    void *dev;       /* device mirror (index slots only) */
    size_t cap;
    cudaEvent_t ev;  /* the last copy out of host */
} slot;

/* A thread's device scalars for its matrix products (stream-ordered: each
 * product rewrites them after the previous one has read them). */
typedef struct mm_scalars {
    unsigned amax;     /* the input's largest magnitude, as f32 bits (NaN above inf) */
    float alpha, zero; /* cuBLAS reads both from here (device pointer mode) */
    unsigned n_bad;    /* CB_CUDA_SYNC: non-finite outputs of the last product */
} mm_scalars;

typedef struct cuda_ctx cuda_ctx;

typedef struct tctx {
    cuda_ctx *owner;
    cudaStream_t s;
    cublasHandle_t blas;  /* created on the thread's first matmul */
    mm_scalars *scal;     /* device, with the handle */
    slot idx[N_IDX];      /* index arrays, round robin */
    int next_idx;
    slot stage[2];        /* upload staging, alternating */
    int next_stage;
    void *act;            /* 16-bit copy of a matmul's input rows */
    size_t act_cap;
    struct tctx *next;    /* free list */
} tctx;

#define MAX_TCTX 64

struct cuda_ctx {
    int dev;
    cudaDeviceProp prop;
    pthread_key_t key;
    pthread_mutex_t mu;
    tctx *all[MAX_TCTX];
    int n_all;
    tctx *free_list;
};

static cuda_ctx *CTX(cb_backend *b)
{
    return (cuda_ctx *)b->ctx;
}

/* A thread ends: its context goes back to the pool.  Work it queued may
 * still be running: the stream keeps its order, and other threads that need
 * that work wait on an event or were handed it after a sync. */
static void tctx_release(void *p)
{
    tctx *t = (tctx *)p;
    pthread_mutex_lock(&t->owner->mu);
    t->next = t->owner->free_list;
    t->owner->free_list = t;
    pthread_mutex_unlock(&t->owner->mu);
}

static void tctx_destroy(tctx *t)
{
    cudaStreamSynchronize(t->s);
    for (int i = 0; i < N_IDX; i++) {
        cudaFreeHost(t->idx[i].host);
        cudaFree(t->idx[i].dev);
        cudaEventDestroy(t->idx[i].ev);
    }
    for (int i = 0; i < 2; i++) {
        cudaFreeHost(t->stage[i].host);
        cudaEventDestroy(t->stage[i].ev);
    }
    cudaFree(t->act);
    cudaFree(t->scal);
    if (t->blas)
        cublasDestroy(t->blas);
    cudaStreamDestroy(t->s);
    free(t);
}

static tctx *tctx_new(cuda_ctx *c)
{
    tctx *t = (tctx *)calloc(1, sizeof *t);
    if (!t)
        die("calloc", __FILE__, __LINE__, "out of memory");
    t->owner = c;
    CK(cudaStreamCreateWithFlags(&t->s, cudaStreamNonBlocking));
    for (int i = 0; i < N_IDX; i++)
        CK(cudaEventCreateWithFlags(&t->idx[i].ev, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++)
        CK(cudaEventCreateWithFlags(&t->stage[i].ev, cudaEventDisableTiming));
    return t;
}

/* The calling thread's context, made current on the backend's device; op
 * names the backend operation for error reports. */
static tctx *T(cb_backend *b, const char *op)
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
        t = tctx_new(c);
        c->all[c->n_all++] = t;
    }
    pthread_mutex_unlock(&c->mu);
    if (!t)
        die("T", __FILE__, __LINE__, "more than 64 threads use one CUDA backend at once");
    pthread_setspecific(c->key, t);
    return t;
}

/* Copy `bytes` of host data (index arrays, small tables) to the device
 * through the next staging slot; the device copy is valid for work queued
 * after it on t->s, until N_IDX more stagings. */
static const void *stage(tctx *t, const void *h, size_t bytes)
{
    slot *sl = &t->idx[t->next_idx];
    t->next_idx = (t->next_idx + 1) % N_IDX;
    CK(cudaEventSynchronize(sl->ev)); /* its last copy has left the host buffer */
    if (bytes > sl->cap) {
        size_t cap = bytes < 65536 ? 65536 : bytes * 2;
        CK(cudaFreeHost(sl->host));
        if (sl->dev)
            CK(cudaFreeAsync(sl->dev, t->s)); /* after the work that read it */
        sl->host = sl->dev = NULL;
        sl->cap = 0;
        CK(cudaHostAlloc(&sl->host, cap, cudaHostAllocDefault));
        CK(cudaMallocAsync(&sl->dev, cap, t->s));
        sl->cap = cap;
    }
    if (bytes == 0)
        return sl->dev;
    memcpy(sl->host, h, bytes);
    CK(cudaMemcpyAsync(sl->dev, sl->host, bytes, cudaMemcpyHostToDevice, t->s));
    CK(cudaEventRecord(sl->ev, t->s));
    return sl->dev;
}

static const int32_t *stage_idx(tctx *t, const int32_t *h, int64_t n)
{
    return (const int32_t *)stage(t, h, sizeof(int32_t) * (size_t)(n > 0 ? n : 0));
}

/* CB_CUDA_SYNC=1: after an operation, wait for the thread's work and stop
 * on any error, naming the operation */
static void check_op(cb_backend *b)
{
    tctx *t = (tctx *)pthread_getspecific(CTX(b)->key);
    if (!t)
        return;
    CK(cudaStreamSynchronize(t->s));
    CK(cudaGetLastError());
}

/* The operation table's entries under CB_CUDA_SYNC=1: the operation, then
 * check_op. */
template <auto F> struct checked;
template <typename R, typename... A, R (*F)(cb_backend *, A...)> struct checked<F> {
    static R call(cb_backend *b, A... a)
    {
        if constexpr (std::is_void_v<R>) {
            F(b, a...);
            check_op(b);
        } else {
            R r = F(b, a...);
            check_op(b);
            return r;
        }
    }
};

/* ------------------------------------------------------------ memory */

/* cudaMallocAsync on the thread's stream: NULL only when the device is out
 * of memory (the error is cleared); any other error stops the process. */
static void *alloc_on(tctx *t, size_t nbytes)
{
    void *p = NULL;
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

static void free_on(tctx *t, void *p)
{
    if (p)
        CK(cudaFreeAsync(p, t->s));
}

static void cu_dealloc(cb_backend *b, void *p)
{
    if (p)
        free_on(T(b, "dealloc"), p);
}

static float bits_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void upload_on(tctx *t, void *dst, const void *src, size_t nbytes)
{
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
    CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, t->s));
    CK(cudaStreamSynchronize(t->s));
}

static void cu_sync(cb_backend *b)
{
    CK(cudaStreamSynchronize(T(b, "sync")->s));
}

static void *cu_event_new(cb_backend *b)
{
    cudaEvent_t ev;
    T(b, "event_new"); /* on the backend's device */
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return NULL;
    }
    CK(e);
    return (void *)ev;
}

static void cu_event_free(cb_backend *b, void *ev)
{
    T(b, "event_free");
    CK(cudaEventDestroy((cudaEvent_t)ev));
}

static void cu_event_record(cb_backend *b, void *ev)
{
    CK(cudaEventRecord((cudaEvent_t)ev, T(b, "event_record")->s));
}

static void cu_event_wait(cb_backend *b, void *ev)
{
    CK(cudaStreamWaitEvent(T(b, "event_wait")->s, (cudaEvent_t)ev, 0));
}

/* ------------------------------------------------- element conversions */

template <typename T> __device__ __forceinline__ float ld(T x);
template <> __device__ __forceinline__ float ld<float>(float x) { return x; }
template <> __device__ __forceinline__ float ld<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ __half st<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* --------------------------------------------------- dequantization */

/* One kernel per GGUF type; each thread decodes the unit dequant.h's
 * functions take (a pair, a q8_0 element, four q6_K elements). */

template <typename T> __global__ void k_dq_f32(const uint8_t *src, T *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<T>(cb_dq_bits_f32(cb_dq_rd32(src + 4 * i)));
}

template <typename T> __global__ void k_dq_f16(const uint8_t *src, T *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<T>(cb_dq_f16(cb_dq_rd16(src + 2 * i)));
}

template <typename T> __global__ void k_dq_bf16(const uint8_t *src, T *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<T>(cb_dq_bf16(cb_dq_rd16(src + 2 * i)));
}

/* q4_0, q4_1, q5_0, q5_1: thread (block i, pair j < 16); `decode` sets
 * y0, y1 (elements j, j+16) from the block's bytes b */
#define DQ_PAIR_KERNEL(type, bytes, decode)                                                                           \
    template <typename T> __global__ void k_dq_##type(const uint8_t *src, T *y, int64_t nb)                           \
    {                                                                                                                 \
        int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = t / 16;                                       \
        int j = (int)(t % 16);                                                                                        \
        if (i >= nb)                                                                                                  \
            return;                                                                                                   \
        const uint8_t *b = src + i * (bytes);                                                                         \
        float y0, y1;                                                                                                 \
        decode;                                                                                                       \
        y[i * 32 + j] = st<T>(y0);                                                                                    \
        y[i * 32 + j + 16] = st<T>(y1);                                                                               \
    }
DQ_PAIR_KERNEL(q4_0, CB_Q4_0_BYTES, cb_dq_q4_0(b[2 + j], cb_dq_d(b, 0), &y0, &y1))
DQ_PAIR_KERNEL(q4_1, CB_Q4_1_BYTES, cb_dq_q4_1(b[4 + j], cb_dq_d(b, 0), cb_dq_d(b, 2), &y0, &y1))
DQ_PAIR_KERNEL(q5_0, CB_Q5_0_BYTES, cb_dq_q5_0(b[6 + j], cb_dq_rd32(b + 2), j, cb_dq_d(b, 0), &y0, &y1))
DQ_PAIR_KERNEL(q5_1, CB_Q5_1_BYTES,
               cb_dq_q5_1(b[8 + j], cb_dq_rd32(b + 4), j, cb_dq_d(b, 0), cb_dq_d(b, 2), &y0, &y1))

/* q8_0: thread (block i, element j < 32) */
template <typename T> __global__ void k_dq_q8_0(const uint8_t *src, T *y, int64_t nb)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = t / 32;
    int j = (int)(t % 32);
    if (i >= nb)
        return;
    const uint8_t *b = src + i * CB_Q8_0_BYTES;
    y[t] = st<T>(cb_dq_q8_0((int8_t)b[2 + j], cb_dq_d(b, 0)));
}

/* q4_K, q5_K: thread (block i, group g < 4, l < 32); `decode` sets y0, y1
 * (elements 64g+l, 64g+32+l) from the block's bytes b and its group's
 * factors f */
#define DQ_KPAIR_KERNEL(type, bytes, decode)                                                                          \
    template <typename T> __global__ void k_dq_##type(const uint8_t *src, T *y, int64_t nb)                           \
    {                                                                                                                 \
        int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = t / 128;                                      \
        int g = (int)(t / 32 % 4), l = (int)(t % 32);                                                                 \
        if (i >= nb)                                                                                                  \
            return;                                                                                                   \
        const uint8_t *b = src + i * (bytes);                                                                         \
        float f[4], y0, y1;                                                                                           \
        cb_dq_k_group(b, g, f);                                                                                       \
        decode;                                                                                                       \
        y[i * 256 + 64 * g + l] = st<T>(y0);                                                                          \
        y[i * 256 + 64 * g + l + 32] = st<T>(y1);                                                                     \
    }
DQ_KPAIR_KERNEL(q4_k, CB_Q4_K_BYTES, cb_dq_q4_k(b[16 + 32 * g + l], f, &y0, &y1))
DQ_KPAIR_KERNEL(q5_k, CB_Q5_K_BYTES, cb_dq_q5_k(b[48 + 32 * g + l], b[16 + l], g, f, &y0, &y1))

/* q6_K: thread (block i, half n < 2, l < 32) */
template <typename T> __global__ void k_dq_q6_k(const uint8_t *src, T *y, int64_t nb)
{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i = t / 64;
    int n = (int)(t / 32 % 2), l = (int)(t % 32);
    if (i >= nb)
        return;
    const uint8_t *b = src + i * CB_Q6_K_BYTES;
    float ds[8], q[4];
    cb_dq_q6_k_scales(b, n, ds);
    cb_dq_q6_k(b[64 * n + l], b[64 * n + l + 32], b[128 + 32 * n + l], l, ds, q);
    for (int k = 0; k < 4; k++)
        y[i * 256 + 128 * n + l + 32 * k] = st<T>(q[k]);
}

/* Bytes per row of n elements and the launch for type t; 0 when t is not
 * one the loader reads (or n is not a whole number of blocks). */
static size_t row_bytes(cb_type t, int64_t n)
{
    switch (t) {
    case CB_TYPE_F32: return 4 * (size_t)n;
    case CB_TYPE_F16:
    case CB_TYPE_BF16: return 2 * (size_t)n;
    default: break;
    }
    int64_t blck = t == CB_TYPE_Q4_K || t == CB_TYPE_Q5_K || t == CB_TYPE_Q6_K ? CB_QK_K : CB_QK;
    size_t bytes = 0;
    switch (t) {
    case CB_TYPE_Q4_0: bytes = CB_Q4_0_BYTES; break;
    case CB_TYPE_Q4_1: bytes = CB_Q4_1_BYTES; break;
    case CB_TYPE_Q5_0: bytes = CB_Q5_0_BYTES; break;
    case CB_TYPE_Q5_1: bytes = CB_Q5_1_BYTES; break;
    case CB_TYPE_Q8_0: bytes = CB_Q8_0_BYTES; break;
    case CB_TYPE_Q4_K: bytes = CB_Q4_K_BYTES; break;
    case CB_TYPE_Q5_K: bytes = CB_Q5_K_BYTES; break;
    case CB_TYPE_Q6_K: bytes = CB_Q6_K_BYTES; break;
    default: return 0;
    }
    return n % blck ? 0 : (size_t)(n / blck) * bytes;
}

template <typename T> static void dequant(cb_type t, const uint8_t *src, T *y, int64_t n, cudaStream_t s)
{
    const int B = 256;
    if (n <= 0)
        return;
    switch (t) {
    case CB_TYPE_F32: k_dq_f32<T><<<nblocks(n, B), B, 0, s>>>(src, y, n); break;
    case CB_TYPE_F16: k_dq_f16<T><<<nblocks(n, B), B, 0, s>>>(src, y, n); break;
    case CB_TYPE_BF16: k_dq_bf16<T><<<nblocks(n, B), B, 0, s>>>(src, y, n); break;
    case CB_TYPE_Q4_0: k_dq_q4_0<T><<<nblocks(n / 2, B), B, 0, s>>>(src, y, n / 32); break;
    case CB_TYPE_Q4_1: k_dq_q4_1<T><<<nblocks(n / 2, B), B, 0, s>>>(src, y, n / 32); break;
    case CB_TYPE_Q5_0: k_dq_q5_0<T><<<nblocks(n / 2, B), B, 0, s>>>(src, y, n / 32); break;
    case CB_TYPE_Q5_1: k_dq_q5_1<T><<<nblocks(n / 2, B), B, 0, s>>>(src, y, n / 32); break;
    case CB_TYPE_Q8_0: k_dq_q8_0<T><<<nblocks(n, B), B, 0, s>>>(src, y, n / 32); break;
    case CB_TYPE_Q4_K: k_dq_q4_k<T><<<nblocks(n / 2, B), B, 0, s>>>(src, y, n / 256); break;
    case CB_TYPE_Q5_K: k_dq_q5_k<T><<<nblocks(n / 2, B), B, 0, s>>>(src, y, n / 256); break;
    case CB_TYPE_Q6_K: k_dq_q6_k<T><<<nblocks(n / 4, B), B, 0, s>>>(src, y, n / 256); break;
    default: die("dequant", __FILE__, __LINE__, "unsupported tensor type");
    }
    CKL();
}

/* ------------------------------------------------------------ weights */

/* the largest magnitude of x [n] into *amax as f32 bits, which order like
 * the magnitudes (NaN above inf); *amax starts at 0.  A grid-stride loop,
 * a warp reduction, one atomic per warp. */
__global__ void k_absmax(const float *x, int64_t n, unsigned *amax)
{
    unsigned m = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        m = max(m, __float_as_uint(fabsf(x[i])));
    for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0 && m)
        atomicMax(amax, m);
}

static void absmax(tctx *t, const float *x, int64_t n, unsigned *amax)
{
    unsigned g = nblocks(n, 256);
    CK(cudaMemsetAsync(amax, 0, sizeof *amax, t->s));
    if (n > 0) {
        k_absmax<<<g < 1024 ? g : 1024, 256, 0, t->s>>>(x, n, amax);
        CKL();
    }
}

/* y [n] = x [n] 2^e in 16 bits; scaled: e = cb_op_f16_scale_exp(*amax)
 * (else 0).  With alpha: *alpha = 2^-(e + e_w), the product's undoing of
 * both scales (written by one thread; the product runs after the kernel). */
template <typename T>
__global__ void k_to16(const float *x, T *y, int64_t n, const unsigned *amax, int e_w, float *alpha)
{
    const int e = amax ? cb_op_f16_scale_exp(__uint_as_float(*amax)) : 0;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<T>(ldexpf(x[i], e));
    if (alpha && i == 0)
        *alpha = ldexpf(1.0f, -(e + e_w));
}

struct cb_bweight {
    int64_t n_in, n_out;
    void *w;           /* [n_out, n_in] of dt: the weight times 2^e */
    cudaDataType_t dt; /* CUDA_R_16F or CUDA_R_16BF */
    int e;             /* f16: cb_op_f16_scale_exp of the weight's largest magnitude; bf16: 0 */
    float *bias;       /* [n_out] or NULL */
};

/* Rows per dequantization pass through the f32 scratch (about 4M values) */
static int64_t dq_rows(int64_t n_in)
{
    int64_t r = ((int64_t)4 << 20) / (n_in > 0 ? n_in : 1);
    return r > 0 ? r : 1;
}

/* The weight's GGUF bytes are dequantized to f32 rows by the type's kernel
 * (dequant.h's formulas), in passes through a scratch buffer: f16 weights
 * take two, one for the largest magnitude and one converting to f16 at the
 * power-of-two scale that keeps every value finite (an f32 weight above
 * 65504, a q8_0 block scale times 127); bf16 weights one. */
static cb_bweight *cu_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out, const void *data,
                                 const float *bias)
{
    tctx *th = T(b, "weight_new");
    size_t rb = row_bytes(t, n_in), raw_bytes = rb * (size_t)n_out;
    int64_t chunk = dq_rows(n_in);
    cb_bweight *w = (cb_bweight *)calloc(1, sizeof *w);
    uint8_t *raw = NULL;
    float *f32 = NULL;
    unsigned *amax = NULL, h_amax = 0;
    if (!w || rb == 0 || n_out <= 0)
        goto fail;
    w->n_in = n_in;
    w->n_out = n_out;
    w->dt = t == CB_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    if (!(w->w = alloc_on(th, 2 * (size_t)(n_in * n_out))) || !(raw = (uint8_t *)alloc_on(th, raw_bytes)) ||
        !(f32 = (float *)alloc_on(th, sizeof(float) * (size_t)(chunk * n_in))) ||
        !(amax = (unsigned *)alloc_on(th, sizeof *amax)))
        goto fail;
    if (bias) {
        if (!(w->bias = (float *)alloc_on(th, sizeof(float) * (size_t)n_out)))
            goto fail;
        upload_on(th, w->bias, bias, sizeof(float) * (size_t)n_out);
    }
    upload_on(th, raw, data, raw_bytes);
    CK(cudaMemsetAsync(amax, 0, sizeof *amax, th->s));
    for (int pass = w->dt == CUDA_R_16F ? 0 : 1; pass < 2; pass++)
        for (int64_t r0 = 0; r0 < n_out; r0 += chunk) {
            int64_t nr = n_out - r0 < chunk ? n_out - r0 : chunk, ne = nr * n_in;
            dequant<float>(t, raw + (size_t)r0 * rb, f32, ne, th->s);
            if (pass == 0) {
                unsigned g = nblocks(ne, 256);
                k_absmax<<<g < 1024 ? g : 1024, 256, 0, th->s>>>(f32, ne, amax);
                CKL();
            } else if (w->dt == CUDA_R_16BF) {
                LAUNCH_1D(th, ne, k_to16, f32, (__nv_bfloat16 *)w->w + r0 * n_in, ne, (const unsigned *)NULL, 0,
                          (float *)NULL);
            } else {
                LAUNCH_1D(th, ne, k_to16, f32, (__half *)w->w + r0 * n_in, ne, (const unsigned *)amax, 0,
                          (float *)NULL);
            }
        }
    CK(cudaMemcpyAsync(&h_amax, amax, sizeof h_amax, cudaMemcpyDeviceToHost, th->s));
    /* usable by every thread on return (and the scratch freed after use) */
    CK(cudaStreamSynchronize(th->s));
    w->e = w->dt == CUDA_R_16F ? cb_op_f16_scale_exp(bits_float(h_amax)) : 0;
    free_on(th, raw);
    free_on(th, f32);
    free_on(th, amax);
    return w;
fail:
    if (w) {
        free_on(th, w->w);
        free_on(th, w->bias);
    }
    free_on(th, raw);
    free_on(th, f32);
    free_on(th, amax);
    free(w);
    return NULL;
}

static void cu_weight_free(cb_backend *b, cb_bweight *w)
{
    if (!w)
        return;
    cu_dealloc(b, w->w);
    cu_dealloc(b, w->bias);
    free(w);
}

/* ------------------------------------------------ small elementwise ops */

__global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t n_out)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * n_out)
        y[i] += bias[i % n_out];
}

/* CB_CUDA_SYNC: count the non-finite values of y [n] into *bad */
__global__ void k_count_bad(const float *y, int64_t n, unsigned *bad)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !isfinite(y[i]))
        atomicAdd(bad, 1u);
}

static void cu_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    tctx *t = T(b, "matmul");
    int64_t ne = n * w->n_in;
    size_t need = 2 * (size_t)ne;
    if (n == 0)
        return;
    if (!t->blas) {
        CKB(cublasCreate(&t->blas));
        CKB(cublasSetStream(t->blas, t->s));
        /* alpha and beta from device memory: the input's scale is known
         * only on the device, and the host never waits for it */
        CKB(cublasSetPointerMode(t->blas, CUBLAS_POINTER_MODE_DEVICE));
        CK(cudaMallocAsync((void **)&t->scal, sizeof *t->scal, t->s));
        CK(cudaMemsetAsync(t->scal, 0, sizeof *t->scal, t->s)); /* zero: beta */
    }
    if (need > t->act_cap) {
        if (t->act)
            CK(cudaFreeAsync(t->act, t->s));
        t->act = NULL, t->act_cap = 0;
        CK(cudaMallocAsync(&t->act, need, t->s));
        t->act_cap = need;
    }
    if (w->dt == CUDA_R_16BF) { /* bf16 holds any f32 magnitude: no scaling */
        LAUNCH_1D(t, ne, k_to16, x, (__nv_bfloat16 *)t->act, ne, (const unsigned *)NULL, w->e, &t->scal->alpha);
    } else {
        absmax(t, x, ne, &t->scal->amax);
        LAUNCH_1D(t, ne, k_to16, x, (__half *)t->act, ne, (const unsigned *)&t->scal->amax, w->e, &t->scal->alpha);
    }
    /* row-major y [n, n_out] = x [n, n_in] W^T is column-major
     * y^T [n_out, n] = (W as column-major [n_in, n_out])^T x^T */
    CKB(cublasGemmEx(t->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_out, (int)n, (int)w->n_in, &t->scal->alpha, w->w,
                     w->dt, (int)w->n_in, t->act, w->dt, (int)w->n_in, &t->scal->zero, y, CUDA_R_32F,
                     (int)w->n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (w->bias)
        LAUNCH_1D(t, n * w->n_out, k_add_bias, y, w->bias, n, w->n_out);
    if (sync_each) { /* the debug check: no inf or NaN out of a product */
        mm_scalars h;
        CK(cudaMemsetAsync(&t->scal->n_bad, 0, sizeof(unsigned), t->s));
        LAUNCH_1D(t, n * w->n_out, k_count_bad, y, n * w->n_out, &t->scal->n_bad);
        if (w->dt == CUDA_R_16BF)
            absmax(t, x, ne, &t->scal->amax);
        CK(cudaMemcpyAsync(&h, t->scal, sizeof h, cudaMemcpyDeviceToHost, t->s));
        CK(cudaStreamSynchronize(t->s));
        if (h.n_bad) {
            char why[160];
            float xa = bits_float(h.amax);
            snprintf(why, sizeof why, "%u of %lld outputs are inf or NaN; the input's largest magnitude is %g", h.n_bad,
                     (long long)(n * w->n_out), (double)xa);
            die("matmul [n x n_in] . [n_out x n_in]^T (CB_CUDA_SYNC check)", __FILE__, __LINE__, why);
        }
    }
}

template <typename T>
__global__ void k_get_rows(const T *w, const int32_t *ids, int64_t n, int64_t d, float unscale, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d)
        dst[i] = ld<T>(w[(int64_t)ids[i / d] * d + i % d]) * unscale;
}

static void cu_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst)
{
    tctx *t = T(b, "get_rows");
    const float unscale = ldexpf(1.0f, -w->e); /* exact */
    if (n == 0)
        return;
    const int32_t *dids = stage_idx(t, ids, n);
    if (w->dt == CUDA_R_16BF)
        LAUNCH_1D(t, n * w->n_in, k_get_rows, (const __nv_bfloat16 *)w->w, dids, n, w->n_in, unscale, dst);
    else
        LAUNCH_1D(t, n * w->n_in, k_get_rows, (const __half *)w->w, dids, n, w->n_in, unscale, dst);
}

/* sum of v over the block's threads (blockDim.x a multiple of 32, <= 1024) */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? part[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* one block per row */
__global__ void k_rmsnorm(const float *x, const float *g, float *y, int64_t d, float eps)
{
    const float *xi = x + (int64_t)blockIdx.x * d;
    float *yi = y + (int64_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        ss += xi[j] * xi[j];
    float scale = cb_op_rms_scale((double)block_sum(ss), d, eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        yi[j] = xi[j] * scale * g[j];
}

static void cu_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d, float eps)
{
    tctx *t = T(b, "rmsnorm");
    if (n == 0)
        return;
    k_rmsnorm<<<(unsigned)n, 256, 0, t->s>>>(x, g, y, d, eps);
    CKL();
}

/* thread per (row, head, pair); inv [n_rot/2]: the pairs' inverse
 * frequencies, computed on the host exactly as the CPU backend does (a
 * device powf differs from the host's in the last bit, which the angle
 * multiplies by the position: 1e-3 rad at 32K); ff [n_rot/2] (device) or
 * NULL: RoPE scaling's divisors, applied by one correctly rounded division
 * as on the CPU */
__global__ void k_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot, const float *inv,
                       const float *ff, int neox)
{
    int half = n_rot / 2;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * n_head * half)
        return;
    int p = (int)(i % half);
    int64_t th = i / half; /* row * n_head + head */
    int a, c;
    float s, co;
    float freq = ff ? __fdiv_rn(inv[p], ff[p]) : inv[p];
    sincosf((float)pos[th / n_head] * freq, &s, &co); /* the CPU's angle, bit for bit */
    cb_op_rope_pair(p, n_rot, neox, &a, &c);
    float *v = x + th * hd;
    cb_op_rope_rotate(&v[a], &v[c], co, s);
}

static void cu_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot,
                    float base, const float *ff, int neox)
{
    tctx *t = T(b, "rope");
    int64_t nt = n * n_head * (n_rot / 2);
    enum { HALF_MAX = 128 };
    float inv[HALF_MAX];
    if (nt == 0)
        return;
    if (n_rot / 2 > HALF_MAX) /* n_rot <= head_dim <= max_head_dim (256) */
        die("rope", __FILE__, __LINE__, "rotated dimensions above 256");
    for (int i = 0; i < n_rot / 2; i++)
        inv[i] = cb_op_rope_freq(i, n_rot, base);
    const float *dinv = (const float *)stage(t, inv, sizeof(float) * (size_t)(n_rot / 2));
    LAUNCH_1D(t, nt, k_rope, x, stage_idx(t, pos, n), n, n_head, hd, n_rot, dinv, ff, neox);
}

__global__ void k_add(float *x, const float *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

__global__ void k_swiglu(const float *g, const float *u, float *out, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = cb_op_swiglu(g[i], u[i]);
}

__global__ void k_geglu(const float *g, const float *u, float *out, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = cb_op_geglu(g[i], u[i]);
}

__global__ void k_scale(float *x, float s, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] *= s;
}

static void cu_add(cb_backend *b, float *x, const float *y, int64_t n)
{
    LAUNCH_1D(T(b, "add"), n, k_add, x, y, n);
}

static void cu_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    LAUNCH_1D(T(b, "swiglu"), n, k_swiglu, g, u, out, n);
}

static void cu_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    LAUNCH_1D(T(b, "geglu"), n, k_geglu, g, u, out, n);
}

static void cu_scale(cb_backend *b, float *x, float s, int64_t n)
{
    LAUNCH_1D(T(b, "scale"), n, k_scale, x, s, n);
}

/* ------------------------------------------------------ KV cache rows */

template <typename T> __global__ void k_kv_write(T *cache, int64_t width, const float *src, const int32_t *at, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * width)
        cache[(int64_t)at[i / width] * width + i % width] = st<T>(src[i]);
}

template <typename T> __global__ void k_kv_read(const T *cache, int64_t width, const int32_t *at, int64_t n, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * width)
        dst[i] = ld<T>(cache[(int64_t)at[i / width] * width + i % width]);
}

static void cu_kv_write(cb_backend *b, void *cache, cb_type ty, int64_t width, const float *src, const int32_t *at,
                        int64_t n)
{
    tctx *t = T(b, "kv_write");
    if (n == 0)
        return;
    const int32_t *dat = stage_idx(t, at, n);
    if (ty == CB_TYPE_F32)
        LAUNCH_1D(t, n * width, k_kv_write, (float *)cache, width, src, dat, n);
    else
        LAUNCH_1D(t, n * width, k_kv_write, (__half *)cache, width, src, dat, n);
}

static void cu_kv_read(cb_backend *b, const void *cache, cb_type ty, int64_t width, const int32_t *at, int64_t n,
                       float *dst)
{
    tctx *t = T(b, "kv_read");
    if (n == 0)
        return;
    const int32_t *dat = stage_idx(t, at, n);
    if (ty == CB_TYPE_F32)
        LAUNCH_1D(t, n * width, k_kv_read, (const float *)cache, width, dat, n, dst);
    else
        LAUNCH_1D(t, n * width, k_kv_read, (const __half *)cache, width, dat, n, dst);
}

/* --------------------------------------------------------- attention */

/* A block takes ATT_WARPS x ATT_ROWS query rows of one head; each warp owns
 * ATT_ROWS of them.  Keys and values stream through shared memory in tiles
 * of ATT_KT rows (up to the largest position among the block's rows); per
 * tile, lane j scores key j against each row (dot product over the head),
 * and the rows' running max m, sum l and output accumulator (lane owns
 * dimensions lane, lane+32, ...) are updated the online-softmax way:
 *   m' = max(m, max_j s_j);  acc = acc e^(m-m') + sum_j e^(s_j-m') v_j
 *   l  = l e^(m-m') + sum_j e^(s_j-m')
 * Keys past a row's own position get no weight: the exact causal mask; in a
 * sliding-window layer neither do keys at or before pos - window.
 * Everything is f32; K/V are read as stored (f16 or f32). */
enum { ATT_WARPS = 4, ATT_ROWS = 4, ATT_KT = 32, ATT_HD_MAX = 256, ATT_DPL = ATT_HD_MAX / 32 };

static size_t att_smem(int hd)
{
    return sizeof(float) * (size_t)(ATT_KT * (hd + 1) + ATT_KT * hd + ATT_WARPS * ATT_ROWS * hd);
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(const float *q, const int32_t *pos, int64_t n, const T *k, const T *v, int n_head, int n_head_kv,
                int hd, float scale, int window, float *out, float *part)
{
    extern __shared__ float sm[];
    __shared__ int s_maxp, s_minlo;
    const int ldk = hd + 1; /* padded: lanes read different key rows */
    float *Ks = sm, *Vs = Ks + ATT_KT * ldk, *Qs = Vs + ATT_KT * hd;
    const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row0 = (int64_t)blockIdx.x * (ATT_WARPS * ATT_ROWS);
    const int64_t ldq = (int64_t)n_head * hd, ldkv = (int64_t)n_head_kv * hd;

    if (threadIdx.x == 0)
        s_maxp = -1, s_minlo = INT32_MAX;
    for (int e = threadIdx.x; e < ATT_WARPS * ATT_ROWS * hd; e += blockDim.x) {
        int64_t row = row0 + e / hd;
        Qs[e] = row < n ? q[row * ldq + (int64_t)h * hd + e % hd] * scale : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < ATT_WARPS * ATT_ROWS && row0 + threadIdx.x < n) {
        const int p = pos[row0 + threadIdx.x];
        atomicMax(&s_maxp, p);
        atomicMin(&s_minlo, window > 0 && p >= window ? p - window + 1 : 0);
    }

    int myp[ATT_ROWS];
    float m[ATT_ROWS], l[ATT_ROWS], acc[ATT_ROWS][ATT_DPL];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int64_t row = row0 + warp * ATT_ROWS + r;
        myp[r] = row < n ? pos[row] : -1;
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_DPL; c++)
            acc[r][c] = 0.0f;
    }
    __syncthreads();
    const int maxp = s_maxp;

    /* from the tile of the lowest key any row sees (a sliding window skips
     * the keys before it) to the tile of the highest; split over
     * gridDim.z blocks, this one taking its share of the tiles */
    const int t_lo = s_minlo / ATT_KT, n_tiles = maxp < 0 ? 0 : maxp / ATT_KT - t_lo + 1;
    const int per = (n_tiles + (int)gridDim.z - 1) / (int)gridDim.z;
    const int k_first = (t_lo + (int)blockIdx.z * per) * ATT_KT;
    const int k_end = min(maxp + 1, (t_lo + ((int)blockIdx.z + 1) * per) * ATT_KT);
    for (int k0 = k_first; k0 < k_end; k0 += ATT_KT) {
        for (int e = threadIdx.x; e < ATT_KT * hd; e += blockDim.x) {
            int j = e / hd, d = e % hd;
            int64_t key = (int64_t)k0 + j;
            float kk = 0.0f, vv = 0.0f;
            if (key <= maxp) {
                kk = ld<T>(k[key * ldkv + (int64_t)kvh * hd + d]);
                vv = ld<T>(v[key * ldkv + (int64_t)kvh * hd + d]);
            }
            Ks[j * ldk + d] = kk;
            Vs[j * hd + d] = vv;
        }
        __syncthreads();
        const int key = k0 + lane;
#pragma unroll
        for (int r = 0; r < ATT_ROWS; r++) {
            /* lowest visible key of this row (the window's first, else 0) */
            const int lo = window > 0 && myp[r] >= window ? myp[r] - window + 1 : 0;
            if (myp[r] < k0 || k0 + ATT_KT <= lo) /* no key of the tile is visible (same in every lane) */
                continue;
            const bool vis = key <= myp[r] && key >= lo;
            const float *qr = Qs + (warp * ATT_ROWS + r) * hd;
            float s = -INFINITY;
            if (vis) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot += qr[d] * Ks[lane * ldk + d];
                s = dot;
            }
            const float mnew = fmaxf(m[r], warp_max(s)); /* finite: a key of the tile is visible */
            const float corr = expf(m[r] - mnew);        /* 0 on the first tile */
            const float p = vis ? expf(s - mnew) : 0.0f;
            l[r] = l[r] * corr + warp_sum(p);
#pragma unroll
            for (int c = 0; c < ATT_DPL; c++)
                acc[r][c] *= corr;
            for (int j = 0; j < ATT_KT; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int c = 0; c < ATT_DPL; c++) {
                    int d = lane + 32 * c;
                    if (d < hd)
                        acc[r][c] += pj * Vs[j * hd + d];
                }
            }
            m[r] = mnew;
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
        int64_t row = row0 + warp * ATT_ROWS + r;
        if (row >= n)
            continue;
        if (gridDim.z > 1) { /* this split's share: unnormalized, with its max and sum (none: -inf, 0) */
            float *pp = part + (((int64_t)blockIdx.z * n + row) * n_head + h) * (hd + 2);
#pragma unroll
            for (int c = 0; c < ATT_DPL; c++) {
                int d = lane + 32 * c;
                if (d < hd)
                    pp[d] = acc[r][c];
            }
            if (lane == 0)
                pp[hd] = m[r], pp[hd + 1] = l[r];
            continue;
        }
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int c = 0; c < ATT_DPL; c++) {
            int d = lane + 32 * c;
            if (d < hd)
                out[row * ldq + (int64_t)h * hd + d] = acc[r][c] * inv;
        }
    }
}

/* The splits' shares of one (row, head) merged, one thread a dimension:
 *   M = max_z m_z,  out = sum_z acc_z e^(m_z-M) / sum_z l_z e^(m_z-M)
 * (a split that saw no key of the row has m = -inf and weighs nothing;
 * every row sees its own position, so M is finite). */
__global__ void k_att_merge(const float *part, int n_split, int64_t n, int n_head, int hd, float *out)
{
    const int64_t row = blockIdx.x;
    const int h = blockIdx.y, d = threadIdx.x;
    const int64_t stride = n * n_head * (hd + 2);
    const float *p0 = part + (row * n_head + h) * (hd + 2);
    float mx = -INFINITY;
    for (int z = 0; z < n_split; z++)
        mx = fmaxf(mx, p0[z * stride + hd]);
    float num = 0.0f, den = 0.0f;
    for (int z = 0; z < n_split; z++) {
        const float mz = p0[z * stride + hd];
        const float wz = mz == -INFINITY ? 0.0f : expf(mz - mx);
        num += wz * p0[z * stride + d];
        den += wz * p0[z * stride + hd + 1];
    }
    out[row * (int64_t)n_head * hd + (int64_t)h * hd + d] = num / den;
}

/* How many blocks share one (row block, head)'s keys: enough blocks for
 * ATT_FILL a multiprocessor when there are few query rows (decode, small
 * batches: one block a head would run a 4K-token cache's keys one tile
 * after another on 9 of 132 multiprocessors), each split at least
 * ATT_MIN_TILES tiles, at most ATT_MAX_SPLIT. */
enum { ATT_FILL = 4, ATT_MIN_TILES = 2, ATT_MAX_SPLIT = 64 };

static int att_splits(const cudaDeviceProp *prop, int64_t n, const int32_t *pos, int n_head, int window)
{
    int64_t base = (int64_t)nblocks(n, ATT_WARPS * ATT_ROWS) * n_head;
    int64_t want = (int64_t)ATT_FILL * prop->multiProcessorCount;
    if (base >= want)
        return 1;
    int32_t maxp = -1, minlo = INT32_MAX;
    for (int64_t i = 0; i < n; i++) {
        int32_t p = pos[i], lo = window > 0 && p >= window ? p - window + 1 : 0;
        maxp = p > maxp ? p : maxp;
        minlo = lo < minlo ? lo : minlo;
    }
    int64_t tiles = maxp < 0 ? 0 : maxp / ATT_KT - minlo / ATT_KT + 1;
    int64_t z = (want + base - 1) / base, most = tiles / ATT_MIN_TILES;
    z = z < most ? z : most;
    z = z < (int64_t)ATT_MAX_SPLIT ? z : (int64_t)ATT_MAX_SPLIT;
    return z > 1 ? (int)z : 1;
}

static void cu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                         cb_type ty, int n_head, int n_head_kv, int hd, float scale, int window, float *out)
{
    tctx *t = T(b, "attention");
    if (n == 0)
        return;
    if (hd > ATT_HD_MAX) /* cb_model_load refuses such models (max_head_dim) */
        die("attention", __FILE__, __LINE__, "head dimension above 256");
    const int32_t *dpos = stage_idx(t, pos, n);
    int z = att_splits(&t->owner->prop, n, pos, n_head, window);
    float *part = NULL;
    if (z > 1 && !(part = (float *)alloc_on(t, sizeof(float) * (size_t)z * (size_t)(n * n_head) * (size_t)(hd + 2))))
        z = 1; /* no memory for the shares: unsplit, slower, the same result */
    dim3 grid(nblocks(n, ATT_WARPS * ATT_ROWS), (unsigned)n_head, (unsigned)z);
    size_t smem = att_smem(hd);
    if (ty == CB_TYPE_F32)
        k_attention<float><<<grid, ATT_WARPS * 32, smem, t->s>>>(q, dpos, n, (const float *)k, (const float *)v,
                                                                n_head, n_head_kv, hd, scale, window, out, part);
    else
        k_attention<__half><<<grid, ATT_WARPS * 32, smem, t->s>>>(q, dpos, n, (const __half *)k, (const __half *)v,
                                                                 n_head, n_head_kv, hd, scale, window, out, part);
    CKL();
    if (z > 1) {
        k_att_merge<<<dim3((unsigned)n, (unsigned)n_head), (unsigned)hd, 0, t->s>>>(part, z, n, n_head, hd, out);
        CKL();
        free_on(t, part);
    }
}

/* --------------------------------------------------- gather / scatter */

__global__ void k_gather(const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d)
        dst[i] = src[(int64_t)idx[i / d] * d + i % d];
}

__global__ void k_scatter(const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d)
        dst[(int64_t)idx[i / d] * d + i % d] = src[i];
}

static void cu_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    tctx *t = T(b, "gather");
    if (n > 0)
        LAUNCH_1D(t, n * d, k_gather, src, stage_idx(t, idx, n), n, d, dst);
}

static void cu_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    tctx *t = T(b, "scatter");
    if (n > 0)
        LAUNCH_1D(t, n * d, k_scatter, src, stage_idx(t, idx, n), n, d, dst);
}

/* ------------------------------------------------ blending: selection */

/* one block per row: sum over the row of (src - cache[at])^2 */
template <typename T>
__global__ void k_deviation(const float *src, const T *cache, int64_t width, const int32_t *at, float *dev)
{
    const float *x = src + (int64_t)blockIdx.x * width;
    const T *c = cache + (int64_t)at[blockIdx.x] * width;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
        float d = x[j] - ld<T>(c[j]);
        s += d * d;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        dev[blockIdx.x] = s;
}

static void cu_deviation(cb_backend *b, const float *src, const void *cache, cb_type ty, int64_t width,
                         const int32_t *at, int64_t n, float *dev)
{
    tctx *t = T(b, "deviation");
    if (n == 0)
        return;
    const int32_t *dat = stage_idx(t, at, n);
    if (ty == CB_TYPE_F32)
        k_deviation<<<(unsigned)n, 128, 0, t->s>>>(src, (const float *)cache, width, dat, dev);
    else
        k_deviation<<<(unsigned)n, 128, 0, t->s>>>(src, (const __half *)cache, width, dat, dev);
    CKL();
}

/* Top k by rank: element i's rank is the number of elements ordered before
 * it (cb_op_topk_before: larger, or equal with a lower index, NaN lowest: a
 * total order, so the ranks are a permutation and every slot below k is
 * written once); ranks below k land in out at their rank.  O(n^2) comparisons, through shared-memory tiles: for the few
 * thousand rows of a prompt that is microseconds, and the order is exactly
 * the CPU's sort. */
__global__ void k_topk_rank(const float *x, int64_t n, int64_t k, int32_t *out)
{
    __shared__ float tile[256];
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float xi = i < n ? x[i] : 0.0f;
    int64_t rank = 0;
    for (int64_t j0 = 0; j0 < n; j0 += 256) {
        __syncthreads();
        if (j0 + threadIdx.x < n)
            tile[threadIdx.x] = x[j0 + threadIdx.x];
        __syncthreads();
        int64_t m = n - j0 < 256 ? n - j0 : 256;
        for (int64_t j = 0; j < m; j++) {
            float xj = tile[j];
            rank += cb_op_topk_before(xj, j0 + j, xi, i);
        }
    }
    if (i < n && rank < k)
        out[rank] = (int32_t)i;
}

static void cu_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    tctx *t = T(b, "topk");
    int32_t *dout = NULL;
    if (k <= 0 || n <= 0)
        return;
    CK(cudaMallocAsync((void **)&dout, sizeof(int32_t) * (size_t)k, t->s));
    CK(cudaMemsetAsync(dout, 0xff, sizeof(int32_t) * (size_t)k, t->s)); /* -1: a slot never written */
    k_topk_rank<<<nblocks(n, 256), 256, 0, t->s>>>(x, n, k, dout);
    CKL();
    CK(cudaMemcpyAsync(idx, dout, sizeof(int32_t) * (size_t)k, cudaMemcpyDeviceToHost, t->s));
    CK(cudaFreeAsync(dout, t->s));
    CK(cudaStreamSynchronize(t->s));
    for (int64_t r = 0; r < k; r++) /* the caller indexes with these: never hand it garbage */
        if (idx[r] < 0 || idx[r] >= n)
            die("topk", __FILE__, __LINE__, "a rank slot was left unwritten");
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

/* The table; under CB_CUDA_SYNC=1 every entry checks after its operation */
static void init_ops(void)
{
#define OP(field, fn) o->field = sync_each ? checked<fn>::call : fn
    cb_backend_ops *o = &cuda_ops;
    o->name = "cuda";
    o->max_head_dim = ATT_HD_MAX;
    o->free = cu_free;
    OP(alloc, cu_alloc);
    OP(alloc_tmp, cu_alloc_tmp);
    OP(dealloc, cu_dealloc);
    OP(upload, cu_upload);
    OP(download, cu_download);
    OP(sync, cu_sync);
    OP(event_new, cu_event_new);
    OP(event_free, cu_event_free);
    OP(event_record, cu_event_record);
    OP(event_wait, cu_event_wait);
    OP(weight_new, cu_weight_new);
    OP(weight_free, cu_weight_free);
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
#undef OP
    /* cuBLAS picks its algorithm by shape and a product's input rows share
     * one f16 scale: a row's bits can depend on its company (backend.h) */
    o->rows_unstable = 1;
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
        snprintf(msg, msg_len, "no usable CUDA device: %s", cudaGetErrorString(e));
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
    /* attention's shared memory for head dimensions up to ATT_HD_MAX (80 KB
     * at 256: above the 48 KB a launch gets without asking) */
    if ((e = cudaFuncSetAttribute(k_attention<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)att_smem(ATT_HD_MAX))) != cudaSuccess ||
        (e = cudaFuncSetAttribute(k_attention<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)att_smem(ATT_HD_MAX))) != cudaSuccess) {
        snprintf(msg, msg_len, "%.64s: cannot give attention %zu bytes of shared memory: %s", c->prop.name,
                 att_smem(ATT_HD_MAX), cudaGetErrorString(e));
        cudaGetLastError();
        free(c);
        free(b);
        return CB_ERR_DEVICE;
    }
    {
        const char *env = getenv("CB_CUDA_SYNC");
        sync_each = env && *env && strcmp(env, "0") != 0;
    }
    pthread_mutex_init(&c->mu, NULL);
    if (pthread_key_create(&c->key, tctx_release) != 0) {
        snprintf(msg, msg_len, "out of thread keys");
        pthread_mutex_destroy(&c->mu);
        free(c);
        free(b);
        return CB_ERR_NOMEM;
    }
    init_ops();
    b->ops = &cuda_ops;
    b->ctx = c;
    b->n_threads = 1;
    snprintf(b->desc, sizeof b->desc, "cuda:%d (%.48s, sm_%d%d, %.0f GiB)", device, c->prop.name, c->prop.major,
             c->prop.minor, (double)c->prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    *out = b;
    return CB_OK;
}
