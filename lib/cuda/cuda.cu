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
 * Errors.  Allocation failures are returned (NULL); any other CUDA or cuBLAS
 * failure after the backend started is a device fault or a bug, and the
 * process stops with the call, file and line.
 *
 * Verified: compiled and linked for sm_80, sm_86, sm_89, sm_90 and PTX
 * (compute_90) with nvcc 13.0; not yet run on a GPU (no GPU has been
 * available to this project): tests/unit/test_backend_ops.c and
 * tests/cli/device.sh are the checks to run first on one. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "../backend/backend.h"
}
#include "../backend/opmath.h"
#include "../core/dequant.h"

/* ----------------------------------------------------------- errors */

static void die(const char *what, const char *file, int line, const char *why)
{
    fprintf(stderr, "cacheblend: CUDA backend: %s failed at %s:%d: %s\n", what, file, line, why);
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

/* 64 index slots: the host may queue that many indexed operations ahead of
 * the device before it waits for the oldest slot to be free again */
enum { N_IDX = 64, STAGE_BYTES = 8 << 20 };

typedef struct slot {
    void *host;      /* page-locked */
    void *dev;       /* device mirror (index slots only) */
    size_t cap;
    cudaEvent_t ev;  /* the last copy out of host */
} slot;

typedef struct cuda_ctx cuda_ctx;

typedef struct tctx {
    cuda_ctx *owner;
    cudaStream_t s;
    cublasHandle_t blas;  /* created on the thread's first matmul */
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

/* The calling thread's context, made current on the backend's device. */
static tctx *T(cb_backend *b)
{
    cuda_ctx *c = CTX(b);
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

/* Copy n index values from the host to the device through the next index
 * slot; the device copy is valid for work queued after it on t->s. */
static const int32_t *stage_idx(tctx *t, const int32_t *h, int64_t n)
{
    slot *sl = &t->idx[t->next_idx];
    size_t bytes = sizeof(int32_t) * (size_t)(n > 0 ? n : 1);
    t->next_idx = (t->next_idx + 1) % N_IDX;
    CK(cudaEventSynchronize(sl->ev)); /* its last copy has left the host buffer */
    if (bytes > sl->cap) {
        size_t cap = bytes < 65536 ? 65536 : bytes * 2;
        CK(cudaFreeHost(sl->host));
        if (sl->dev)
            CK(cudaFreeAsync(sl->dev, t->s));
        CK(cudaHostAlloc(&sl->host, cap, cudaHostAllocDefault));
        CK(cudaMallocAsync(&sl->dev, cap, t->s));
        sl->cap = cap;
    }
    memcpy(sl->host, h, sizeof(int32_t) * (size_t)n);
    CK(cudaMemcpyAsync(sl->dev, sl->host, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, t->s));
    CK(cudaEventRecord(sl->ev, t->s));
    return (const int32_t *)sl->dev;
}

/* ------------------------------------------------------------ memory */

static void *cu_alloc(cb_backend *b, size_t nbytes)
{
    tctx *t = T(b);
    void *p = NULL;
    if (cudaMallocAsync(&p, nbytes ? nbytes : 1, t->s) != cudaSuccess) {
        cudaGetLastError(); /* clear it: out of memory is reported, not fatal */
        return NULL;
    }
    CK(cudaMemsetAsync(p, 0, nbytes, t->s));
    CK(cudaStreamSynchronize(t->s)); /* usable by every thread's stream */
    return p;
}

static void cu_dealloc(cb_backend *b, void *p)
{
    if (p)
        CK(cudaFreeAsync(p, T(b)->s));
}

static void cu_upload(cb_backend *b, void *dst, const void *src, size_t nbytes)
{
    tctx *t = T(b);
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

static void cu_download(cb_backend *b, void *dst, const void *src, size_t nbytes)
{
    tctx *t = T(b);
    CK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, t->s));
    CK(cudaStreamSynchronize(t->s));
}

static void cu_sync(cb_backend *b)
{
    CK(cudaStreamSynchronize(T(b)->s));
}

static void *cu_event_new(cb_backend *b)
{
    cudaEvent_t ev;
    T(b); /* on the backend's device */
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return (void *)ev;
}

static void cu_event_free(cb_backend *b, void *ev)
{
    T(b);
    CK(cudaEventDestroy((cudaEvent_t)ev));
}

static void cu_event_record(cb_backend *b, void *ev)
{
    CK(cudaEventRecord((cudaEvent_t)ev, T(b)->s));
}

static void cu_event_wait(cb_backend *b, void *ev)
{
    CK(cudaStreamWaitEvent(T(b)->s, (cudaEvent_t)ev, 0));
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

struct cb_bweight {
    int64_t n_in, n_out;
    void *w;           /* [n_out, n_in] of dt */
    cudaDataType_t dt; /* CUDA_R_16F or CUDA_R_16BF */
    float *bias;       /* [n_out] or NULL */
};

static cb_bweight *cu_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out, const void *data,
                                 const float *bias)
{
    tctx *th = T(b);
    size_t rb = row_bytes(t, n_in), raw_bytes = rb * (size_t)n_out;
    cb_bweight *w = (cb_bweight *)calloc(1, sizeof *w);
    void *raw = NULL;
    if (!w || rb == 0)
        goto fail;
    w->n_in = n_in;
    w->n_out = n_out;
    w->dt = t == CB_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    if (!(w->w = cu_alloc(b, 2 * (size_t)(n_in * n_out))) || !(raw = cu_alloc(b, raw_bytes)))
        goto fail;
    if (bias) {
        if (!(w->bias = (float *)cu_alloc(b, sizeof(float) * (size_t)n_out)))
            goto fail;
        cu_upload(b, w->bias, bias, sizeof(float) * (size_t)n_out);
    }
    cu_upload(b, raw, data, raw_bytes);
    if (w->dt == CUDA_R_16BF)
        dequant<__nv_bfloat16>(t, (const uint8_t *)raw, (__nv_bfloat16 *)w->w, n_in * n_out, th->s);
    else
        dequant<__half>(t, (const uint8_t *)raw, (__half *)w->w, n_in * n_out, th->s);
    cu_dealloc(b, raw);
    return w;
fail:
    if (w) {
        cu_dealloc(b, w->w);
        cu_dealloc(b, w->bias);
    }
    cu_dealloc(b, raw);
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

template <typename T> __global__ void k_to16(const float *x, T *y, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<T>(x[i]);
}

__global__ void k_add_bias(float *y, const float *bias, int64_t n, int64_t n_out)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * n_out)
        y[i] += bias[i % n_out];
}

static void cu_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    tctx *t = T(b);
    int64_t ne = n * w->n_in;
    size_t need = 2 * (size_t)ne;
    const float one = 1.0f, zero = 0.0f;
    if (n == 0)
        return;
    if (!t->blas) {
        CKB(cublasCreate(&t->blas));
        CKB(cublasSetStream(t->blas, t->s));
    }
    if (need > t->act_cap) {
        if (t->act)
            CK(cudaFreeAsync(t->act, t->s));
        CK(cudaMallocAsync(&t->act, need, t->s));
        t->act_cap = need;
    }
    if (w->dt == CUDA_R_16BF)
        LAUNCH_1D(t, ne, k_to16, x, (__nv_bfloat16 *)t->act, ne);
    else
        LAUNCH_1D(t, ne, k_to16, x, (__half *)t->act, ne);
    /* row-major y [n, n_out] = x [n, n_in] W^T is column-major
     * y^T [n_out, n] = (W as column-major [n_in, n_out])^T x^T */
    CKB(cublasGemmEx(t->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_out, (int)n, (int)w->n_in, &one, w->w, w->dt,
                     (int)w->n_in, t->act, w->dt, (int)w->n_in, &zero, y, CUDA_R_32F, (int)w->n_out,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (w->bias)
        LAUNCH_1D(t, n * w->n_out, k_add_bias, y, w->bias, n, w->n_out);
}

template <typename T> __global__ void k_get_rows(const T *w, const int32_t *ids, int64_t n, int64_t d, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d)
        dst[i] = ld<T>(w[(int64_t)ids[i / d] * d + i % d]);
}

static void cu_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst)
{
    tctx *t = T(b);
    if (n == 0)
        return;
    const int32_t *dids = stage_idx(t, ids, n);
    if (w->dt == CUDA_R_16BF)
        LAUNCH_1D(t, n * w->n_in, k_get_rows, (const __nv_bfloat16 *)w->w, dids, n, w->n_in, dst);
    else
        LAUNCH_1D(t, n * w->n_in, k_get_rows, (const __half *)w->w, dids, n, w->n_in, dst);
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
    tctx *t = T(b);
    if (n == 0)
        return;
    k_rmsnorm<<<(unsigned)n, 256, 0, t->s>>>(x, g, y, d, eps);
    CKL();
}

/* thread per (row, head, pair) */
__global__ void k_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot, float base,
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
    float freq = ff ? cb_op_rope_freq(p, n_rot, base) / ff[p] : cb_op_rope_freq(p, n_rot, base);
    sincosf((float)pos[th / n_head] * freq, &s, &co);
    cb_op_rope_pair(p, n_rot, neox, &a, &c);
    float *v = x + th * hd;
    cb_op_rope_rotate(&v[a], &v[c], co, s);
}

static void cu_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot,
                    float base, const float *ff, int neox)
{
    tctx *t = T(b);
    int64_t nt = n * n_head * (n_rot / 2);
    if (nt == 0)
        return;
    LAUNCH_1D(t, nt, k_rope, x, stage_idx(t, pos, n), n, n_head, hd, n_rot, base, ff, neox);
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
    LAUNCH_1D(T(b), n, k_add, x, y, n);
}

static void cu_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    LAUNCH_1D(T(b), n, k_swiglu, g, u, out, n);
}

static void cu_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    LAUNCH_1D(T(b), n, k_geglu, g, u, out, n);
}

static void cu_scale(cb_backend *b, float *x, float s, int64_t n)
{
    LAUNCH_1D(T(b), n, k_scale, x, s, n);
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
    tctx *t = T(b);
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
    tctx *t = T(b);
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
                int hd, float scale, int window, float *out)
{
    extern __shared__ float sm[];
    __shared__ int s_maxp;
    const int ldk = hd + 1; /* padded: lanes read different key rows */
    float *Ks = sm, *Vs = Ks + ATT_KT * ldk, *Qs = Vs + ATT_KT * hd;
    const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row0 = (int64_t)blockIdx.x * (ATT_WARPS * ATT_ROWS);
    const int64_t ldq = (int64_t)n_head * hd, ldkv = (int64_t)n_head_kv * hd;

    if (threadIdx.x == 0)
        s_maxp = -1;
    for (int e = threadIdx.x; e < ATT_WARPS * ATT_ROWS * hd; e += blockDim.x) {
        int64_t row = row0 + e / hd;
        Qs[e] = row < n ? q[row * ldq + (int64_t)h * hd + e % hd] * scale : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < ATT_WARPS * ATT_ROWS && row0 + threadIdx.x < n)
        atomicMax(&s_maxp, pos[row0 + threadIdx.x]);

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

    for (int k0 = 0; k0 <= maxp; k0 += ATT_KT) {
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
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int c = 0; c < ATT_DPL; c++) {
            int d = lane + 32 * c;
            if (d < hd)
                out[row * ldq + (int64_t)h * hd + d] = acc[r][c] * inv;
        }
    }
}

static void cu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                         cb_type ty, int n_head, int n_head_kv, int hd, float scale, int window, float *out)
{
    tctx *t = T(b);
    if (n == 0)
        return;
    if (hd > ATT_HD_MAX) /* cb_model_load refuses such models (max_head_dim) */
        die("attention", __FILE__, __LINE__, "head dimension above 256");
    const int32_t *dpos = stage_idx(t, pos, n);
    dim3 grid(nblocks(n, ATT_WARPS * ATT_ROWS), (unsigned)n_head);
    size_t smem = att_smem(hd);
    if (ty == CB_TYPE_F32)
        k_attention<float><<<grid, ATT_WARPS * 32, smem, t->s>>>(q, dpos, n, (const float *)k, (const float *)v,
                                                                n_head, n_head_kv, hd, scale, window, out);
    else
        k_attention<__half><<<grid, ATT_WARPS * 32, smem, t->s>>>(q, dpos, n, (const __half *)k, (const __half *)v,
                                                                 n_head, n_head_kv, hd, scale, window, out);
    CKL();
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
    tctx *t = T(b);
    if (n > 0)
        LAUNCH_1D(t, n * d, k_gather, src, stage_idx(t, idx, n), n, d, dst);
}

static void cu_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    tctx *t = T(b);
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
    tctx *t = T(b);
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
 * it (larger, or equal with a lower index); ranks below k land in out at
 * their rank.  O(n^2) comparisons, through shared-memory tiles: for the few
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
            rank += xj > xi || (xj == xi && j0 + j < i);
        }
    }
    if (i < n && rank < k)
        out[rank] = (int32_t)i;
}

static void cu_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    tctx *t = T(b);
    int32_t *dout = NULL;
    if (k <= 0 || n <= 0)
        return;
    CK(cudaMallocAsync((void **)&dout, sizeof(int32_t) * (size_t)k, t->s));
    k_topk_rank<<<nblocks(n, 256), 256, 0, t->s>>>(x, n, k, dout);
    CKL();
    CK(cudaMemcpyAsync(idx, dout, sizeof(int32_t) * (size_t)k, cudaMemcpyDeviceToHost, t->s));
    CK(cudaFreeAsync(dout, t->s));
    CK(cudaStreamSynchronize(t->s));
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

static void init_ops(void)
{
    cb_backend_ops *o = &cuda_ops;
    o->name = "cuda";
    o->max_head_dim = ATT_HD_MAX;
    o->free = cu_free;
    o->alloc = cu_alloc;
    o->dealloc = cu_dealloc;
    o->upload = cu_upload;
    o->download = cu_download;
    o->sync = cu_sync;
    o->event_new = cu_event_new;
    o->event_free = cu_event_free;
    o->event_record = cu_event_record;
    o->event_wait = cu_event_wait;
    o->weight_new = cu_weight_new;
    o->weight_free = cu_weight_free;
    o->matmul = cu_matmul;
    o->get_rows = cu_get_rows;
    o->rmsnorm = cu_rmsnorm;
    o->rope = cu_rope;
    o->add = cu_add;
    o->swiglu = cu_swiglu;
    o->geglu = cu_geglu;
    o->scale = cu_scale;
    o->kv_write = cu_kv_write;
    o->kv_read = cu_kv_read;
    o->attention = cu_attention;
    o->gather = cu_gather;
    o->scatter = cu_scatter;
    o->deviation = cu_deviation;
    o->topk = cu_topk;
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
    /* attention's shared memory for head dimensions up to ATT_HD_MAX */
    CK(cudaFuncSetAttribute(k_attention<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)att_smem(ATT_HD_MAX)));
    CK(cudaFuncSetAttribute(k_attention<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)att_smem(ATT_HD_MAX)));
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
