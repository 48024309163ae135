/* cuda_ops.cu - the CUDA backend's small kernels, one per operation:
 * rmsnorm, RoPE, the elementwise operations, KV cache rows, gather and
 * scatter, and blending's deviation and top-k.  Each is a thread (or a
 * block) per output element (row), with index arrays and small tables
 * staged through the thread's page-locked slots. */
#include "cuda_impl.cuh"

/* ------------------------------------------------------- normalization */

/* sum of v over the block's threads (blockDim.x a multiple of 32, <= 1024) */
static __device__ float block_sum(float v)
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

void cu_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d, float eps)
{
    tctx *t = T(b, "rmsnorm");
    if (n == 0)
        return;
    k_rmsnorm<<<(unsigned)n, 256, 0, t->s>>>(x, g, y, d, eps);
    CKL();
}

/* backend.h's add_rmsnorm (CB_CUDA_FUSE=1): k_add's sums, then
 * k_rmsnorm's with the same threads in the same order (each thread reads
 * back only what it wrote), so the bits of the two; out may be y (a
 * thread reads its y before the block's barrier, writes out after) */
__global__ void k_add_rmsnorm(float *x, const float *y, const float *g, float *out, int64_t d, float eps)
{
    float *xi = x + (int64_t)blockIdx.x * d;
    const float *yi = y + (int64_t)blockIdx.x * d;
    float *oi = out + (int64_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const float s = xi[j] + yi[j];
        xi[j] = s;
        ss += s * s;
    }
    float scale = cb_op_rms_scale((double)block_sum(ss), d, eps);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = xi[j] * scale * g[j];
}

void cu_add_rmsnorm(cb_backend *b, float *x, const float *y, const float *g, float *out, int64_t n, int64_t d,
                    float eps)
{
    tctx *t = T(b, "add_rmsnorm");
    if (n == 0)
        return;
    k_add_rmsnorm<<<(unsigned)n, 256, 0, t->s>>>(x, y, g, out, d, eps);
    CKL();
}

/* thread per (row, head, pair); inv [n_rot/2]: the pairs' inverse
 * frequencies, computed on the host exactly as the CPU backend does (a
 * device powf differs from the host's in the last bit, which the angle
 * multiplies by the position: 1e-3 rad at 32K); ff [n_rot/2] (device) or
 * NULL: RoPE scaling's divisors, applied by one correctly rounded division
 * as on the CPU */
__device__ __forceinline__ void rope_one(float *x, const int32_t *pos, int64_t i, int n_head, int hd, int n_rot,
                                         const float *inv, const float *ff, int neox)
{
    int half = n_rot / 2;
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

__global__ void k_rope(float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot, const float *inv,
                       const float *ff, int neox)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * n_head * (n_rot / 2))
        rope_one(x, pos, i, n_head, hd, n_rot, inv, ff, neox);
}

/* k_rope over q's (row, head, pair)s, then k's */
__global__ void k_rope_qk(float *q, float *k, const int32_t *pos, int64_t n, int n_head, int n_head_kv, int hd,
                          int n_rot, const float *inv, const float *ff, int neox)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nq = n * n_head * (n_rot / 2);
    if (i < nq)
        rope_one(q, pos, i, n_head, hd, n_rot, inv, ff, neox);
    else if (i - nq < n * n_head_kv * (n_rot / 2))
        rope_one(k, pos, i - nq, n_head_kv, hd, n_rot, inv, ff, neox);
}

/* the pairs' inverse frequencies (k_rope's inv), staged */
static const float *rope_table(tctx *t, int n_rot, float base)
{
    enum { HALF_MAX = 128 };
    float inv[HALF_MAX];
    if (n_rot / 2 > HALF_MAX) /* n_rot <= head_dim <= max_head_dim (256) */
        BUG("rope", "rotated dimensions above 256");
    for (int i = 0; i < n_rot / 2; i++)
        inv[i] = cb_op_rope_freq(i, n_rot, base);
    return (const float *)stage(t, inv, sizeof(float) * (size_t)(n_rot / 2));
}

void cu_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot,
                    float base, const float *ff, int neox)
{
    tctx *t = T(b, "rope");
    int64_t nt = n * n_head * (n_rot / 2);
    if (nt == 0)
        return;
    const float *dinv = rope_table(t, n_rot, base);
    LAUNCH_1D(t, nt, k_rope, x, stage_idx(t, pos, n), n, n_head, hd, n_rot, dinv, ff, neox);
}

/* backend.h's rope_qk (CB_CUDA_FUSE=1): one launch for both */
void cu_rope_qk(cb_backend *b, float *q, float *k, const int32_t *pos, int64_t n, int n_head, int n_head_kv, int hd,
                int n_rot, float base, const float *ff, int neox)
{
    tctx *t = T(b, "rope_qk");
    int64_t nt = n * (n_head + n_head_kv) * (n_rot / 2);
    if (nt == 0)
        return;
    const float *dinv = rope_table(t, n_rot, base);
    LAUNCH_1D(t, nt, k_rope_qk, q, k, stage_idx(t, pos, n), n, n_head, n_head_kv, hd, n_rot, dinv, ff, neox);
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

void cu_add(cb_backend *b, float *x, const float *y, int64_t n)
{
    LAUNCH_1D(T(b, "add"), n, k_add, x, y, n);
}

void cu_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    LAUNCH_1D(T(b, "swiglu"), n, k_swiglu, g, u, out, n);
}

void cu_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    LAUNCH_1D(T(b, "geglu"), n, k_geglu, g, u, out, n);
}

void cu_scale(cb_backend *b, float *x, float s, int64_t n)
{
    LAUNCH_1D(T(b, "scale"), n, k_scale, x, s, n);
}

/* ------------------------------------------------------ KV cache rows */

/* element i of rows src [*, width] into cache row at[i / width] */
template <typename T>
__device__ __forceinline__ void kv_put(T *cache, int64_t width, const float *src, const int32_t *at, int64_t i)
{
    cache[(int64_t)at[i / width] * width + i % width] = st<T>(src[i]);
}

template <typename T> __global__ void k_kv_write(T *cache, int64_t width, const float *src, const int32_t *at, int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * width)
        kv_put(cache, width, src, at, i);
}

/* k_kv_write for K's rows, then V's */
template <typename T>
__global__ void k_kv_write_kv(T *kc, T *vc, int64_t width, const float *ks, const float *vs, const int32_t *at,
                              int64_t n)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, ne = n * width;
    if (i < ne)
        kv_put(kc, width, ks, at, i);
    else if (i - ne < ne)
        kv_put(vc, width, vs, at, i - ne);
}

template <typename T> __global__ void k_kv_read(const T *cache, int64_t width, const int32_t *at, int64_t n, float *dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * width)
        dst[i] = ld<T>(cache[(int64_t)at[i / width] * width + i % width]);
}

void cu_kv_write(cb_backend *b, void *cache, cb_type ty, int64_t width, const float *src, const int32_t *at,
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

/* backend.h's kv_write_kv (CB_CUDA_FUSE=1): one launch for both */
void cu_kv_write_kv(cb_backend *b, void *kc, void *vc, cb_type ty, int64_t width, const float *ks, const float *vs,
                    const int32_t *at, int64_t n)
{
    tctx *t = T(b, "kv_write_kv");
    if (n == 0)
        return;
    const int32_t *dat = stage_idx(t, at, n);
    if (ty == CB_TYPE_F32)
        LAUNCH_1D(t, 2 * n * width, k_kv_write_kv, (float *)kc, (float *)vc, width, ks, vs, dat, n);
    else
        LAUNCH_1D(t, 2 * n * width, k_kv_write_kv, (__half *)kc, (__half *)vc, width, ks, vs, dat, n);
}

void cu_kv_read(cb_backend *b, const void *cache, cb_type ty, int64_t width, const int32_t *at, int64_t n,
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

void cu_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    tctx *t = T(b, "gather");
    if (n > 0)
        LAUNCH_1D(t, n * d, k_gather, src, stage_idx(t, idx, n), n, d, dst);
}

void cu_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
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

void cu_deviation(cb_backend *b, const float *src, const void *cache, cb_type ty, int64_t width,
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

void cu_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
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
            BUG("topk", "a rank slot was left unwritten");
}

const void *cu_ops_kernel(void)
{
    return (const void *)k_add;
}
