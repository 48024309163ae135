/* cuda_mm.cu - the CUDA backend's weights and matrix products: GGUF
 * tensors dequantized on the device to f16 (bf16 for bf16 tensors) at a
 * power-of-two scale, products by cublasGemmEx with the input rows
 * converted to the weight's type at a scale of their own (cuda.cu's head
 * comment), or, for a few rows under CB_CUDA_GEMV=1, by a kernel of ours
 * that reads them as they are (k_gemv); and the embedding lookup from the
 * same 16-bit copy.  Under CB_CUDA_QW=1 (per backend, at open) a
 * block-quantized weight stays in its GGUF blocks instead: few-row
 * products decode the blocks as they read them (k_qgemv), larger ones
 * dequantize a tile of rows at a time into the 16-bit form above for
 * cuBLAS, and the embedding lookup decodes the rows it copies. */
#include "cuda_impl.cuh"

#include <type_traits>

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
    default: BUG("dequant", "unsupported tensor type");
    }
    CKL();
}

/* Elements and bytes per block of the types CB_CUDA_QW keeps */
template <cb_type QT> struct qtraits;
template <> struct qtraits<CB_TYPE_Q4_0> { enum { elems = CB_QK, bytes = CB_Q4_0_BYTES }; };
template <> struct qtraits<CB_TYPE_Q4_1> { enum { elems = CB_QK, bytes = CB_Q4_1_BYTES }; };
template <> struct qtraits<CB_TYPE_Q5_0> { enum { elems = CB_QK, bytes = CB_Q5_0_BYTES }; };
template <> struct qtraits<CB_TYPE_Q5_1> { enum { elems = CB_QK, bytes = CB_Q5_1_BYTES }; };
template <> struct qtraits<CB_TYPE_Q8_0> { enum { elems = CB_QK, bytes = CB_Q8_0_BYTES }; };
template <> struct qtraits<CB_TYPE_Q4_K> { enum { elems = CB_QK_K, bytes = CB_Q4_K_BYTES }; };
template <> struct qtraits<CB_TYPE_Q5_K> { enum { elems = CB_QK_K, bytes = CB_Q5_K_BYTES }; };
template <> struct qtraits<CB_TYPE_Q6_K> { enum { elems = CB_QK_K, bytes = CB_Q6_K_BYTES }; };

/* cb_dq8 with the type a constant: the other types' branches fold away */
template <cb_type QT> __device__ __forceinline__ void dq8(const uint8_t *b, int e0, float *y)
{
    cb_dq8((int)QT, b, e0, y);
}

/* the block types CB_CUDA_QW keeps as they are: those the loader reads */
static bool qw_type(cb_type t)
{
    return t != CB_TYPE_F32 && t != CB_TYPE_F16 && t != CB_TYPE_BF16 && row_bytes(t, CB_QK_K) != 0;
}

/* a switch over the block types that calls the macro F(QT) with the
 * matching type as a constant (a template argument) */
#define QW_DISPATCH(t, F)                                                                                            \
    switch (t) {                                                                                                      \
    case CB_TYPE_Q4_0: F(CB_TYPE_Q4_0); break;                                                                        \
    case CB_TYPE_Q4_1: F(CB_TYPE_Q4_1); break;                                                                        \
    case CB_TYPE_Q5_0: F(CB_TYPE_Q5_0); break;                                                                        \
    case CB_TYPE_Q5_1: F(CB_TYPE_Q5_1); break;                                                                        \
    case CB_TYPE_Q8_0: F(CB_TYPE_Q8_0); break;                                                                        \
    case CB_TYPE_Q4_K: F(CB_TYPE_Q4_K); break;                                                                        \
    case CB_TYPE_Q5_K: F(CB_TYPE_Q5_K); break;                                                                        \
    case CB_TYPE_Q6_K: F(CB_TYPE_Q6_K); break;                                                                        \
    default: BUG("CB_CUDA_QW", "a weight of a type not kept in its blocks");                                         \
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

/* The products an input is converted for: alpha[k] = 2^-(e + e_w[k]),
 * weight k's undoing of both scales, k < n (passed by value) */
struct alpha_set {
    int e_w[MM_SET];
    int n;
    float *alpha;
};

/* y [n] = x [n] 2^e in 16 bits; scaled: e = cb_op_f16_scale_exp(*amax)
 * (else 0); and as's alphas (written by one thread; the products run
 * after the kernel); and *zero = 0 where given (the other amax slot: no
 * kernel of this product reads it, and the next product's k_absmax
 * starts from it). */
template <typename T>
__global__ void k_to16(const float *x, T *y, int64_t n, const unsigned *amax, alpha_set as, unsigned *zero)
{
    const int e = amax ? cb_op_f16_scale_exp(__uint_as_float(*amax)) : 0;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<T>(ldexpf(x[i], e));
    if (i == 0) {
        for (int k = 0; k < as.n; k++)
            as.alpha[k] = ldexpf(1.0f, -(e + as.e_w[k]));
        if (zero)
            *zero = 0;
    }
}

/* y [n] = x [n] 2^e in f16: weight_fill's conversion at a known scale */
__global__ void k_to16_at(const float *x, __half *y, int64_t n, int e)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = st<__half>(ldexpf(x[i], e));
}

struct cb_bweight {
    int64_t n_in, n_out;
    void *w;           /* [n_out, n_in] of dt: the weight times 2^e (NULL with q) */
    cudaDataType_t dt; /* CUDA_R_16F or CUDA_R_16BF */
    int e;             /* f16: cb_op_f16_scale_exp of the weight's largest magnitude; bf16: 0 */
    float *bias;       /* [n_out] or NULL */
    uint8_t *q;        /* CB_CUDA_QW=1, a block type: its GGUF rows as they are, else NULL */
    cb_type qt;        /* their type */
    size_t rb;         /* and bytes per row */
};

/* Rows per dequantization pass through the f32 scratch (about 4M values),
 * a multiple of 32 where there are that many, so that each pass's output
 * (y + r0 rows) starts as aligned as y for cuBLAS */
static int64_t dq_rows(int64_t n_in)
{
    int64_t r = ((int64_t)4 << 20) / (n_in > 0 ? n_in : 1);
    return r >= 32 ? r / 32 * 32 : r > 0 ? r : 1;
}

/* The weight's GGUF bytes are dequantized to f32 rows by the type's kernel
 * (dequant.h's formulas), in passes through a scratch buffer: f16 weights
 * take two, one for the largest magnitude and one converting to f16 at the
 * power-of-two scale that keeps every value finite (an f32 weight above
 * 65504, a q8_0 block scale times 127); bf16 weights one; a weight kept
 * in its blocks (w->q, which is raw) only the first, for its scale, which
 * its tiles take.  w's memory and the scratch (raw, f32, amax) are
 * allocated; returns once w is usable by every thread. */
static void weight_fill(tctx *th, cb_bweight *w, cb_type t, size_t rb, int64_t chunk, uint8_t *raw, float *f32,
                        unsigned *amax, const void *data, const float *bias)
{
    const int64_t n_in = w->n_in, n_out = w->n_out;
    unsigned h_amax = 0;
    if (bias)
        upload_on(th, w->bias, bias, sizeof(float) * (size_t)n_out);
    upload_on(th, raw, data, rb * (size_t)n_out);
    CK(cudaMemsetAsync(amax, 0, sizeof *amax, th->s));
    for (int pass = w->dt == CUDA_R_16F ? 0 : 1; pass < (w->q ? 1 : 2); pass++)
        for (int64_t r0 = 0; r0 < n_out; r0 += chunk) {
            int64_t nr = n_out - r0 < chunk ? n_out - r0 : chunk, ne = nr * n_in;
            dequant<float>(t, raw + (size_t)r0 * rb, f32, ne, th->s);
            if (pass == 0) {
                unsigned g = nblocks(ne, 256);
                k_absmax<<<g < 1024 ? g : 1024, 256, 0, th->s>>>(f32, ne, amax);
                CKL();
            } else if (w->dt == CUDA_R_16BF) {
                LAUNCH_1D(th, ne, k_to16, f32, (__nv_bfloat16 *)w->w + r0 * n_in, ne, (const unsigned *)NULL,
                          alpha_set{}, (unsigned *)NULL);
            } else {
                LAUNCH_1D(th, ne, k_to16, f32, (__half *)w->w + r0 * n_in, ne, (const unsigned *)amax,
                          alpha_set{}, (unsigned *)NULL);
            }
        }
    CK(cudaMemcpyAsync(&h_amax, amax, sizeof h_amax, cudaMemcpyDeviceToHost, th->s));
    /* usable by every thread on return (and the scratch freed after use) */
    CK(cudaStreamSynchronize(th->s));
    w->e = w->dt == CUDA_R_16F ? cb_op_f16_scale_exp(bits_float(h_amax)) : 0;
}

/* Free weight_new's scratch and, unless it is kept, the weight: unchecked,
 * so that it also cleans up after a fault. */
static void weight_drop(tctx *th, cb_bweight *w, void *raw, void *f32, void *amax, bool keep)
{
    void *p[] = {keep && w && w->q ? NULL : raw, f32, amax, keep || !w ? NULL : w->w, keep || !w ? NULL : w->bias};
    for (void *q : p)
        if (q)
            cudaFreeAsync(q, th->s);
    if (!keep)
        free(w);
}

cb_bweight *cu_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out, const void *data,
                          const float *bias)
{
    tctx *th = T(b, "weight_new");
    size_t rb = row_bytes(t, n_in);
    int64_t chunk = dq_rows(n_in);
    cb_bweight *w = (cb_bweight *)calloc(1, sizeof *w);
    uint8_t *raw = NULL;
    float *f32 = NULL;
    unsigned *amax = NULL;
    bool ok = false;
    try {
        if (w && rb != 0 && n_out > 0) {
            w->n_in = n_in;
            w->n_out = n_out;
            w->dt = t == CB_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
            const bool keep_q = CTX(b)->qw && qw_type(t);
            ok = (keep_q || (w->w = alloc_on(th, 2 * (size_t)(n_in * n_out)))) &&
                 (raw = (uint8_t *)alloc_on(th, rb * (size_t)n_out)) &&
                 (f32 = (float *)alloc_on(th, sizeof(float) * (size_t)(chunk * n_in))) &&
                 (amax = (unsigned *)alloc_on(th, sizeof *amax)) &&
                 (!bias || (w->bias = (float *)alloc_on(th, sizeof(float) * (size_t)n_out)));
            if (ok && keep_q)
                w->q = raw, w->qt = t, w->rb = rb;
        }
        if (ok)
            weight_fill(th, w, t, rb, chunk, raw, f32, amax, data, bias);
    } catch (const cu_fault &) {
        weight_drop(th, w, raw, f32, amax, false);
        throw;
    }
    weight_drop(th, w, raw, f32, amax, ok);
    return ok ? w : NULL;
}

void cu_weight_free(cb_backend *b, cb_bweight *w)
{
    if (!w)
        return;
    cu_dealloc(b, w->w);
    cu_dealloc(b, w->q);
    cu_dealloc(b, w->bias);
    free(w);
}

/* ------------------------------------------------------------ products */

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

/* The thread context's cuBLAS handle, made on first use (the opening
 * thread's when the backend opens): on the context's stream, alpha and
 * beta read from device memory (the input's scale is known only on the
 * device, and the host never waits for it), and a workspace of our own,
 * zeroed once: cuBLAS's split-K reduction reads partial sums it has not
 * written, which compute-sanitizer's initcheck reports as reads of
 * uninitialized memory (the results do not depend on them).  t->blas is
 * set last, so that a failed attempt leaves no half-made handle. */
#define CU_BLAS_WS ((size_t)32 << 20) /* what cuBLAS asks for on Hopper */
void cu_blas(tctx *t)
{
    cublasHandle_t h;
    if (t->blas)
        return;
    if (cu_rec)
        rec_refuse("cublasCreate");
    if (!t->scal) {
        CK(cudaMallocAsync((void **)&t->scal, sizeof *t->scal, t->s));
        CK(cudaMemsetAsync(t->scal, 0, sizeof *t->scal, t->s)); /* zero: beta */
    }
    if (!t->blas_ws) {
        CK(cudaMallocAsync(&t->blas_ws, CU_BLAS_WS, t->s));
        CK(cudaMemsetAsync(t->blas_ws, 0, CU_BLAS_WS, t->s));
    }
    CKB(cublasCreate(&h));
    cublasStatus_t e = cublasSetStream(h, t->s);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE);
    if (e == CUBLAS_STATUS_SUCCESS)
        e = cublasSetWorkspace(h, t->blas_ws, CU_BLAS_WS);
    if (e != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        cu_fail(CB_ERR_DEVICE, 1, "cublasSetStream, cublasSetPointerMode, cublasSetWorkspace", __FILE__,
                __LINE__, cublasGetStatusString(e));
    }
    t->blas = h;
}

/* ------------------------------------------------- few-row products
 *
 * y [n, n_out] = x [n, n_in] . W^T for n <= CU_GEMV_ROWS (decode, a batch
 * of decoding sequences, a few rows), under CB_CUDA_GEMV=1 until a GPU run
 * has checked it (cuda.cu): a warp a weight row, read once for all n input
 * rows, which stay f32 (no conversion, no shared scale); one kernel launch
 * where the cuBLAS path takes four.  Lane k takes elements 8k..8k+7 of
 * every 256 (16 bytes of the weight a step) when n_in is a multiple of 8,
 * else element k of every 32; each row's sum is f32 fused multiply-adds in
 * that fixed order, then the warp's fixed butterfly, then the weight's
 * power-of-two scale undone (exact) and the bias added.  Nothing in a
 * row's arithmetic depends on n or on the other rows (the loads of x do,
 * on alignment, and load the same values), so these products are
 * row-stable with rows_step 1 and rows_max CU_GEMV_ROWS (backend.h): what
 * batched decoding needs to share each weight's reading among sequences. */

/* a pair of 16-bit values (T's vector of two) as floats */
template <typename T> struct pair_of;
template <> struct pair_of<__half> {
    typedef __half2 type;
};
template <> struct pair_of<__nv_bfloat16> {
    typedef __nv_bfloat162 type;
};
__device__ __forceinline__ float2 pair_f32(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 pair_f32(__nv_bfloat162 h) { return __bfloat1622float2(h); }

/* 8 weights at p (16 bytes, aligned) as floats */
template <typename T> __device__ __forceinline__ void ld8w(const T *p, float *f)
{
    uint4 u = *(const uint4 *)p;
    const typename pair_of<T>::type *h = (const typename pair_of<T>::type *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = pair_f32(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

/* 8 floats of x at p: two 16-byte loads where p is aligned to them */
template <bool A16> __device__ __forceinline__ void ld8x(const float *p, float *f)
{
    if (A16) {
        float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            f[j] = p[j];
    }
}

/* The weights of one k_gemv launch: matmul's one, or matmul_multi's up
 * to CU_GEMV_SET of one n_in and one 16-bit type; weight k takes the
 * blocks first[k] .. first[k+1]-1, a weight row a warp.  Passed by value. */
enum { CU_GEMV_SET = 4 };
struct gemv_set {
    const void *w[CU_GEMV_SET];
    const float *bias[CU_GEMV_SET];
    float *y[CU_GEMV_SET];
    int64_t n_out[CU_GEMV_SET];
    float unscale[CU_GEMV_SET];
    unsigned first[CU_GEMV_SET + 1];
};

/* This warp's weight row of a gemv_set launch: the weight's fields
 * (chosen by a select over constant indices: no indexed read of the
 * parameters) and the row o; false past the weight's last row (a whole
 * warp: the shuffles of gemv_store never miss a lane). */
struct gemv_row {
    const void *w;
    const float *bias;
    float *y, unscale;
    int64_t n_out, o;
};
__device__ __forceinline__ bool gemv_pick(const gemv_set &s, gemv_row *r)
{
    int k = 0;
#pragma unroll
    for (int i = 1; i < CU_GEMV_SET; i++)
        k = blockIdx.x >= s.first[i] ? i : k;
    unsigned first = 0;
#pragma unroll
    for (int i = 0; i < CU_GEMV_SET; i++)
        if (i == k) {
            r->w = s.w[i], r->bias = s.bias[i], r->y = s.y[i], r->unscale = s.unscale[i];
            r->n_out = s.n_out[i], first = s.first[i];
        }
    r->o = (int64_t)(blockIdx.x - first) * (blockDim.x / 32) + threadIdx.x / 32;
    return r->o < r->n_out;
}

/* The R lane sums of row r into y: the warp's fixed butterfly, the
 * weight's power-of-two scale undone (exact), the bias added */
template <int R> __device__ __forceinline__ void gemv_store(const float *acc, int lane, const gemv_row &r)
{
#pragma unroll
    for (int i = 0; i < R; i++) {
        float v = acc[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) {
            v = __fmul_rn(v, r.unscale);
            r.y[i * r.n_out + r.o] = r.bias ? __fadd_rn(v, r.bias[r.o]) : v;
        }
    }
}

/* acc[r] += the eight weights wf . x's row r at elements j..j+7, in order */
template <int R, bool A16>
__device__ __forceinline__ void gemv_fma8(const float *wf, const float *__restrict__ x, int64_t n_in, int64_t j,
                                          float *acc)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        float xf[8];
        ld8x<A16>(x + r * n_in + j, xf);
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[r] = fmaf(wf[e], xf[e], acc[r]);
    }
}

template <typename T, int R, bool V8, bool A16>
__global__ void k_gemv(const gemv_set s, int64_t n_in, const float *__restrict__ x)
{
    const int lane = threadIdx.x % 32;
    gemv_row row;
    if (!gemv_pick(s, &row))
        return;
    const T *wr = (const T *)row.w + row.o * n_in;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    if (V8) {
        for (int64_t j = 8 * lane; j < n_in; j += 256) {
            float wf[8];
            ld8w<T>(wr + j, wf);
            gemv_fma8<R, A16>(wf, x, n_in, j, acc);
        }
    } else {
        for (int64_t j = lane; j < n_in; j += 32) {
            const float wj = ld<T>(wr[j]);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] = fmaf(wj, x[r * n_in + j], acc[r]);
        }
    }
    gemv_store<R>(acc, lane, row);
}

/* k_gemv on a weight kept in its blocks (CB_CUDA_QW=1): the same lanes,
 * steps, order of sums and butterfly, each lane's eight weights decoded
 * from their block (dq8) where k_gemv loads them; the weights' values are
 * dequant.h's, not rounded to 16 bits, and there is no scale to undo.
 * Block types have rows of a multiple of 32 elements (V8 always).  Row
 * stable for the same reasons as k_gemv. */
template <cb_type QT, int R, bool A16>
__global__ void k_qgemv(const gemv_set s, int64_t n_in, size_t rb, const float *__restrict__ x)
{
    enum { BE = qtraits<QT>::elems, BB = qtraits<QT>::bytes };
    const int lane = threadIdx.x % 32;
    gemv_row row;
    if (!gemv_pick(s, &row))
        return;
    const uint8_t *wr = (const uint8_t *)row.w + row.o * rb;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f;
    for (int64_t j = 8 * lane; j < n_in; j += 256) {
        float wf[8];
        dq8<QT>(wr + (j / BE) * BB, (int)(j % BE), wf);
        gemv_fma8<R, A16>(wf, x, n_in, j, acc);
    }
    gemv_store<R>(acc, lane, row); /* (unscale 1: the blocks are not scaled) */
}

/* launch(std::integral_constant<int, n>) for n in 1..CU_GEMV_ROWS: the
 * kernels take their row count as a template argument */
template <typename L> static void by_rows(tctx *t, int64_t n, L launch)
{
#define GV(R)                                                                                                         \
    case R: launch(std::integral_constant<int, R>()); break
    switch (n) {
        GV(1);
        GV(2);
        GV(3);
        GV(4);
        GV(5);
        GV(6);
        GV(7);
        GV(8);
    default: BUG("matmul", "a few-row product of more than CU_GEMV_ROWS rows");
    }
#undef GV
    CKL();
}

template <typename T, bool V8, bool A16>
static void gemv_launch(tctx *t, const gemv_set &s, int nw, int64_t n_in, const float *x, int64_t n)
{
    const unsigned g = s.first[nw]; /* 8 warps a block, a weight row each */
    if (g > 0) /* (else no weight rows) */
        by_rows(t, n, [&](auto r) { k_gemv<T, decltype(r)::value, V8, A16><<<g, 256, 0, t->s>>>(s, n_in, x); });
}

template <cb_type QT, bool A16>
static void qgemv_launch(tctx *t, const gemv_set &s, int nw, int64_t n_in, size_t rb, const float *x, int64_t n)
{
    const unsigned g = s.first[nw];
    if (g > 0)
        by_rows(t, n, [&](auto r) { k_qgemv<QT, decltype(r)::value, A16><<<g, 256, 0, t->s>>>(s, n_in, rb, x); });
}

/* y[k] = x . w[k]^T (+ bias) through one k_gemv launch, for nw <=
 * CU_GEMV_SET weights of one n_in and one type, n <= CU_GEMV_ROWS */
static void gemv(tctx *t, const cb_bweight *const *w, int nw, const float *x, float *const *y, int64_t n)
{
    gemv_set s;
    memset(&s, 0, sizeof s);
    for (int k = 0; k < nw; k++) {
        s.w[k] = w[k]->q ? (const void *)w[k]->q : w[k]->w; /* the blocks, or the 16-bit copy */
        s.bias[k] = w[k]->bias, s.y[k] = y[k], s.n_out[k] = w[k]->n_out;
        s.unscale[k] = w[k]->q ? 1.0f : ldexpf(1.0f, -w[k]->e); /* exact */
        s.first[k + 1] = s.first[k] + nblocks(w[k]->n_out, 8);
    }
    for (int k = nw; k < CU_GEMV_SET; k++) /* no blocks past the last weight */
        s.first[k + 1] = s.first[nw];
    const int64_t n_in = w[0]->n_in;
    const bool bf = w[0]->dt == CUDA_R_16BF, a16 = (uintptr_t)x % 16 == 0;
    if (w[0]->q) { /* every weight of the set: the same block type (callers check) */
        const size_t rb = w[0]->rb;
#define QG(QT) a16 ? qgemv_launch<QT, true>(t, s, nw, n_in, rb, x, n) : qgemv_launch<QT, false>(t, s, nw, n_in, rb, x, n)
        QW_DISPATCH(w[0]->qt, QG)
#undef QG
        return;
    }
    if (n_in % 8 != 0)
        bf ? gemv_launch<__nv_bfloat16, false, false>(t, s, nw, n_in, x, n)
           : gemv_launch<__half, false, false>(t, s, nw, n_in, x, n);
    else if (a16)
        bf ? gemv_launch<__nv_bfloat16, true, true>(t, s, nw, n_in, x, n)
           : gemv_launch<__half, true, true>(t, s, nw, n_in, x, n);
    else
        bf ? gemv_launch<__nv_bfloat16, true, false>(t, s, nw, n_in, x, n)
           : gemv_launch<__half, true, false>(t, s, nw, n_in, x, n);
}

/* y = x [n, n_in] . w^T for a weight kept in its blocks, more rows than
 * k_qgemv takes: its rows a tile at a time (dq_rows of them) dequantized
 * to f32, then to f16 at the weight's scale 2^e (the values and rounding
 * of the 16-bit copy a weight without CB_CUDA_QW keeps), and multiplied
 * by cuBLAS into the tile's columns of y; act is x in f16 at its own
 * scale, *alpha (device) undoes both. */
static void matmul_tiles(tctx *t, const cb_bweight *w, const void *act, const float *alpha, float *y, int64_t n)
{
    const int64_t n_in = w->n_in, n_out = w->n_out, rows = dq_rows(n_in), chunk = rows < n_out ? rows : n_out;
    float *f32 = (float *)keep_on(t, &t->tile32, sizeof(float) * (size_t)(chunk * n_in));
    __half *h = (__half *)keep_on(t, &t->tile16, sizeof(__half) * (size_t)(chunk * n_in));
    if (!f32 || !h)
        cu_fail(CB_ERR_DEVICE, 1, "keep_on(t, &t->tile32/tile16, ...)", __FILE__, __LINE__, "out of memory");
    for (int64_t r0 = 0; r0 < n_out; r0 += chunk) {
        const int64_t nr = n_out - r0 < chunk ? n_out - r0 : chunk, ne = nr * n_in;
        dequant<float>(w->qt, w->q + (size_t)r0 * w->rb, f32, ne, t->s);
        LAUNCH_1D(t, ne, k_to16_at, f32, h, ne, w->e);
        CKB(cublasGemmEx(t->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)n, (int)n_in, alpha, h,
                         CUDA_R_16F, (int)n_in, act, CUDA_R_16F, (int)n_in, &t->scal->zero, y + r0, CUDA_R_32F,
                         (int)n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

/* y[k] = x [n, n_in] . w[k]^T for nw (up to MM_SET) weights of one n_in,
 * one 16-bit type and either all kept in their blocks or none, past the
 * few-row kernel: x converted to 16 bits once (f16 at the power-of-two
 * scale its largest magnitude allows; bf16 as it is), each weight's alpha
 * undoing both scales, then each product by cuBLAS (or its tiles) and its
 * bias.  The bits of one call per weight.  Returns where x's largest
 * magnitude then lies (one of t->scal->amax: f16's scaling found it),
 * else NULL. */
static const unsigned *products_16(tctx *t, const cb_bweight *const *w, int nw, const float *x, float *const *y,
                                   int64_t n)
{
    const int64_t ne = n * w[0]->n_in;
    void *act = keep_on(t, &t->act, 2 * (size_t)ne);
    if (!act)
        cu_fail(CB_ERR_DEVICE, 1, "keep_on(t, &t->act, need)", __FILE__, __LINE__, "out of memory");
    alpha_set as{};
    as.n = nw, as.alpha = t->scal->alpha;
    for (int k = 0; k < nw; k++)
        as.e_w[k] = w[k]->e;
    const bool bf = w[0]->dt == CUDA_R_16BF; /* bf16 holds any f32 magnitude: no scaling */
    const unsigned *found = NULL;
    if (bf) {
        LAUNCH_1D(t, ne, k_to16, x, (__nv_bfloat16 *)act, ne, (const unsigned *)NULL, as, (unsigned *)NULL);
    } else if (!cu_fuse) {
        absmax(t, x, ne, &t->scal->amax[0]);
        LAUNCH_1D(t, ne, k_to16, x, (__half *)act, ne, (const unsigned *)&t->scal->amax[0], as, (unsigned *)NULL);
        found = &t->scal->amax[0];
    } else if (ne > 0) { /* (always: n > 0 and n_in > 0; a skipped conversion would leave both slots set) */
        /* CB_CUDA_FUSE=1: no memset.  The slot amax_at is zero (the last
         * product's conversion zeroed it, or cu_blas); this conversion
         * zeroes the other one for the next */
        unsigned *a = &t->scal->amax[t->amax_at], *other = &t->scal->amax[1 - t->amax_at];
        unsigned g = nblocks(ne, 256);
        k_absmax<<<g < 1024 ? g : 1024, 256, 0, t->s>>>(x, ne, a);
        CKL();
        LAUNCH_1D(t, ne, k_to16, x, (__half *)act, ne, (const unsigned *)a, as, other);
        t->amax_at = 1 - t->amax_at;
        found = a;
    }
    for (int k = 0; k < nw; k++) {
        /* row-major y [n, n_out] = x [n, n_in] W^T is column-major
         * y^T [n_out, n] = (W as column-major [n_in, n_out])^T x^T */
        if (w[k]->q)
            matmul_tiles(t, w[k], act, &t->scal->alpha[k], y[k], n);
        else
            CKB(cublasGemmEx(t->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w[k]->n_out, (int)n, (int)w[k]->n_in,
                             &t->scal->alpha[k], w[k]->w, w[k]->dt, (int)w[k]->n_in, act, w[k]->dt,
                             (int)w[k]->n_in, &t->scal->zero, y[k], CUDA_R_32F, (int)w[k]->n_out,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (w[k]->bias)
            LAUNCH_1D(t, n * w[k]->n_out, k_add_bias, y[k], w[k]->bias, n, w[k]->n_out);
    }
    return found;
}

void cu_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    tctx *t = T(b, "matmul");
    int64_t ne = n * w->n_in;
    const unsigned *found = NULL; /* where x's largest magnitude lies, if products_16 found it */
    if (n == 0)
        return;
    cu_blas(t);
    /* few rows: the few-row kernel (CB_CUDA_GEMV=1); on a weight kept in
     * its blocks, always (else every token would dequantize the whole
     * weight into tiles), row-stable or not as the backend declares */
    if (n <= cu_gemv_rows || (w->q && n <= CU_GEMV_ROWS))
        gemv(t, &w, 1, x, &y, n);
    else
        found = products_16(t, &w, 1, x, &y, n);
    if (cu_sync_each) { /* the debug check: no inf or NaN out of a product */
        mm_scalars h;
        CK(cudaMemsetAsync(&t->scal->n_bad, 0, sizeof(unsigned), t->s));
        LAUNCH_1D(t, n * w->n_out, k_count_bad, y, n * w->n_out, &t->scal->n_bad);
        if (!found) /* (in a slot of its own: amax's are the products') */
            absmax(t, x, ne, (unsigned *)(found = &t->scal->amax_dbg));
        CK(cudaMemcpyAsync(&h, t->scal, sizeof h, cudaMemcpyDeviceToHost, t->s));
        CK(cudaStreamSynchronize(t->s));
        if (h.n_bad) {
            char why[160];
            float xa = bits_float(found == &t->scal->amax_dbg ? h.amax_dbg : h.amax[found - t->scal->amax]);
            snprintf(why, sizeof why, "%u of %lld outputs are inf or NaN; the input's largest magnitude is %g", h.n_bad,
                     (long long)(n * w->n_out), (double)xa);
            BUG("matmul [n x n_in] . [n_out x n_in]^T (CB_CUDA_SYNC check)", why);
        }
    }
}

/* backend.h's matmul_multi, in the table with the few-row kernel
 * (CB_CUDA_GEMV=1): the products of one input (Q, K and V; gate and up),
 * the bits of cu_matmul's each.  Up to CU_GEMV_ROWS rows through one
 * k_gemv launch (the same per-row arithmetic); more, through cuBLAS with
 * the input converted once for all of them (products_16: the conversion,
 * scale and alphas of each call's).  Weights of mixed 16-bit types or
 * block types, and CB_CUDA_SYNC's output check, go through cu_matmul
 * weight by weight. */
void cu_matmul_multi(cb_backend *b, const cb_bweight *const *w, int nw, const float *x, float *const *y, int64_t n)
{
    tctx *t = T(b, "matmul_multi");
    bool one = !cu_sync_each;
    for (int k = 1; k < nw; k++) /* one n_in, and one 16-bit type or one block type */
        one = one && w[k]->dt == w[0]->dt && w[k]->n_in == w[0]->n_in && !w[k]->q == !w[0]->q &&
              (!w[0]->q || w[k]->qt == w[0]->qt);
    if (n == 0 || nw <= 0)
        return;
    if (!one) {
        for (int k = 0; k < nw; k++)
            cu_matmul(b, w[k], x, y[k], n);
        return;
    }
    static_assert((int)CU_GEMV_SET <= (int)MM_SET, "a set of weights is converted for at once");
    if (n <= cu_gemv_rows) {
        for (int k = 0; k < nw; k += CU_GEMV_SET)
            gemv(t, w + k, nw - k < CU_GEMV_SET ? nw - k : CU_GEMV_SET, x, y + k, n);
        return;
    }
    cu_blas(t);
    for (int k = 0; k < nw; k += MM_SET)
        products_16(t, w + k, nw - k < MM_SET ? nw - k : MM_SET, x, y + k, n);
}

template <typename T>
__global__ void k_get_rows(const T *w, const int32_t *ids, int64_t n, int64_t d, float unscale, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d)
        dst[i] = ld<T>(w[(int64_t)ids[i / d] * d + i % d]) * unscale;
}

/* get_rows from a weight kept in its blocks: a thread eight elements of a
 * row, decoded as k_qgemv decodes them (d, the row, a multiple of 32) */
template <cb_type QT>
__global__ void k_get_rows_q(const uint8_t *q, size_t rb, const int32_t *ids, int64_t n, int64_t d, float *dst)
{
    enum { BE = qtraits<QT>::elems, BB = qtraits<QT>::bytes };
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = d / 8;
    if (i >= n * per)
        return;
    const int64_t r = i / per, c = i % per * 8;
    float v[8];
    dq8<QT>(q + (size_t)ids[r] * rb + (size_t)(c / BE) * BB, (int)(c % BE), v);
#pragma unroll
    for (int k = 0; k < 8; k++)
        dst[r * d + c + k] = v[k];
}

void cu_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst)
{
    tctx *t = T(b, "get_rows");
    const float unscale = ldexpf(1.0f, -w->e); /* exact */
    if (n == 0)
        return;
    const int32_t *dids = stage_idx(t, ids, n);
    if (w->q) {
#define GR(QT) LAUNCH_1D(t, n * (w->n_in / 8), k_get_rows_q<QT>, w->q, w->rb, dids, n, w->n_in, dst)
        QW_DISPATCH(w->qt, GR)
#undef GR
        return;
    }
    if (w->dt == CUDA_R_16BF)
        LAUNCH_1D(t, n * w->n_in, k_get_rows, (const __nv_bfloat16 *)w->w, dids, n, w->n_in, unscale, dst);
    else
        LAUNCH_1D(t, n * w->n_in, k_get_rows, (const __half *)w->w, dids, n, w->n_in, unscale, dst);
}

const void *cu_mm_kernel(void)
{
    return (const void *)k_add_bias;
}
