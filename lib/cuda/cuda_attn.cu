/* cuda_attn.cu - the CUDA backend's attention: query rows against a
 * layer's cached keys and values with an exact causal mask (and a sliding
 * window), one pass of online softmax over tiles of keys, the keys split
 * over several blocks when there are few query rows: a scalar f32 kernel
 * (the reference), and under CB_CUDA_FA=1 a tensor-core one for 16 rows
 * or more; either adds set_key_bias's bias to the flagged keys' scores.
 * Then blending's attention mass. */
#include "cuda_impl.cuh"

/* set_key_bias's row as the kernels take it: b[key] added to the scores
 * of keys below n for the query rows at positions below until (b NULL:
 * none) */
struct kbias {
    const float *b;
    int n, until;
};

__device__ __forceinline__ float key_bias(const kbias &kb, int key, int p)
{
    return kb.b && key < kb.n && p < kb.until ? kb.b[key] : 0.0f;
}

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
enum { ATT_WARPS = 4, ATT_ROWS = 4, ATT_KT = 32, ATT_HD_MAX = CU_ATT_HD_MAX, ATT_DPL = ATT_HD_MAX / 32 };

static size_t att_smem(int hd)
{
    return sizeof(float) * (size_t)(ATT_KT * (hd + 1) + ATT_KT * hd + ATT_WARPS * ATT_ROWS * hd);
}

/* the first key a query row at position p sees: the window's first in a
 * sliding-window layer, else 0 (attention, its splits and attn_mass) */
__host__ __device__ __forceinline__ int first_key(int p, int window)
{
    return window > 0 && p >= window ? p - window + 1 : 0;
}

/* whether a query row at position p (-1: none) sees a key of the tile
 * [k0, k0 + kt) (both kernels skip the tiles it does not) */
__device__ __forceinline__ bool sees_tile(int p, int window, int k0, int kt)
{
    return p >= k0 && first_key(p, window) < k0 + kt;
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
                int hd, float scale, int window, kbias kb, float *out, float *part)
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
        atomicMin(&s_minlo, first_key(p, window));
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
            if (!sees_tile(myp[r], window, k0, ATT_KT)) /* (the same in every lane) */
                continue;
            /* lowest visible key of this row (the window's first, else 0) */
            const int lo = first_key(myp[r], window);
            const bool vis = key <= myp[r] && key >= lo;
            const float *qr = Qs + (warp * ATT_ROWS + r) * hd;
            float s = -INFINITY;
            if (vis) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot += qr[d] * Ks[lane * ldk + d];
                s = dot + key_bias(kb, key, myp[r]);
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
 * ATT_MIN_TILES tiles, at most ATT_MAX_SPLIT.  rows, kt: a block's query
 * rows and key tile (the scalar kernel's, or the tensor-core kernel's). */
enum { ATT_FILL = 4, ATT_MIN_TILES = 2, ATT_MAX_SPLIT = 64 };

static int att_splits(const cudaDeviceProp *prop, int64_t n, const int32_t *pos, int n_head, int window, int rows,
                      int kt)
{
    int64_t base = (int64_t)nblocks(n, rows) * n_head;
    int64_t want = (int64_t)ATT_FILL * prop->multiProcessorCount;
    if (base >= want)
        return 1;
    int32_t maxp = -1, minlo = INT32_MAX;
    for (int64_t i = 0; i < n; i++) {
        int32_t p = pos[i], lo = first_key(p, window);
        maxp = p > maxp ? p : maxp;
        minlo = lo < minlo ? lo : minlo;
    }
    int64_t tiles = maxp < 0 ? 0 : maxp / kt - minlo / kt + 1;
    int64_t z = (want + base - 1) / base, most = tiles / ATT_MIN_TILES;
    z = z < most ? z : most;
    z = z < (int64_t)ATT_MAX_SPLIT ? z : (int64_t)ATT_MAX_SPLIT;
    return z > 1 ? (int)z : 1;
}

/* ------------------------------------------- tensor-core attention */

/* CB_CUDA_FA=1 (the scalar kernel above stays the reference):
 * query rows in tiles of FA_BQ, FA_BK keys a step, both products on the
 * tensor cores in f16 with f32 sums (wmma 16x16x16), the softmax online
 * in f32, flash-attention style.  Warp w owns rows 16w..16w+15 of the
 * block's tile:
 *   S = (Q scale) K^T      16 x FA_BK, into shared memory (f32)
 *   per row (two lanes a row, 16 keys each): the mask, m' = max(m, max_j s_j),
 *     corr = e^(m - m'), p_j = e^(s_j - m') rounded to f16,
 *     l = l corr + sum_j p_j (the rounded p_j: the weights the product uses)
 *   O = O corr + P V       O in shared memory (f32), hd/16 tiles of 16
 * Q, K and V are rounded to f16 (K, V of an f16 cache already are); the
 * head dimension is padded with zeros to a multiple of 16.  Rows, masks,
 * splits over keys (the same shares and merge as the scalar kernel) and
 * tile skipping as there; a warp skips the tiles none of its rows sees.
 * Bound: f16's unit roundoff (4.9e-4) on Q, K, V and P: test_backend_ops
 * states it. */
#include <mma.h>

enum { FA_BQ = 64, FA_BK = 32, FA_WARPS = FA_BQ / 16, FA_MIN_ROWS = 16 };

/* the head dimension padded to the products' 16 */
__host__ __device__ static inline int fa_hp(int hd)
{
    return (hd + 15) / 16 * 16;
}

struct fa_layout {
    size_t q, k, v, s, p, o, st, total; /* byte offsets in the block's shared memory */
    int ldh, lds, ldp, ldo;             /* row strides, in elements */
};

__host__ __device__ static inline size_t fa_up(size_t x)
{
    return (x + 127) / 128 * 128;
}

__host__ __device__ static inline fa_layout fa_lay(int hp)
{
    fa_layout L;
    L.ldh = hp + 8; /* halves: rows 16 bytes apart from a bank's period */
    L.lds = FA_BK + 4;
    L.ldp = FA_BK + 8;
    L.ldo = hp + 4;
    L.q = 0;
    L.k = L.q + fa_up((size_t)FA_BQ * L.ldh * 2);
    L.v = L.k + fa_up((size_t)FA_BK * L.ldh * 2);
    L.s = L.v + fa_up((size_t)FA_BK * L.ldh * 2);
    L.p = L.s + fa_up((size_t)FA_BQ * L.lds * 4);
    L.o = L.p + fa_up((size_t)FA_BQ * L.ldp * 2);
    L.st = L.o + fa_up((size_t)FA_BQ * L.ldo * 4);
    L.total = L.st + fa_up((size_t)FA_BQ * 4 * 4) + 128; /* m, l, corr, pos; alignment */
    return L;
}

template <typename T>
__global__ void __launch_bounds__(FA_WARPS * 32)
    k_flash(const float *q, const int32_t *pos, int64_t n, const T *k, const T *v, int n_head, int n_head_kv,
            int hd, float scale, int window, kbias kb, float *out, float *part)
{
    using namespace nvcuda;
    extern __shared__ unsigned char fa_raw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)fa_raw + 127) & ~(uintptr_t)127);
    const int hp = fa_hp(hd);
    const fa_layout L = fa_lay(hp);
    __half *Qs = (__half *)(sm + L.q), *Ks = (__half *)(sm + L.k), *Vs = (__half *)(sm + L.v),
           *Ps = (__half *)(sm + L.p);
    float *Ss = (float *)(sm + L.s), *Os = (float *)(sm + L.o);
    float *fm = (float *)(sm + L.st), *fl = fm + FA_BQ, *fc = fl + FA_BQ;
    int *fp = (int *)(fc + FA_BQ);

    const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * 16;
    const int64_t row0 = (int64_t)blockIdx.x * FA_BQ;
    const int64_t ldq = (int64_t)n_head * hd, ldkv = (int64_t)n_head_kv * hd;

    for (int e = threadIdx.x; e < FA_BQ * hp; e += blockDim.x) {
        const int r = e / hp, d = e % hp;
        const int64_t row = row0 + r;
        Qs[r * L.ldh + d] = __float2half_rn(row < n && d < hd ? q[row * ldq + (int64_t)h * hd + d] * scale : 0.0f);
        Os[r * L.ldo + d] = 0.0f;
    }
    for (int r = threadIdx.x; r < FA_BQ; r += blockDim.x) {
        fp[r] = row0 + r < n ? pos[row0 + r] : -1;
        fm[r] = -INFINITY;
        fl[r] = 0.0f;
    }
    __syncthreads();
    /* the block's key range: the lowest key a row sees to the highest */
    int maxp = -1, minlo = INT32_MAX;
    for (int r = 0; r < FA_BQ; r++)
        if (fp[r] >= 0) {
            maxp = max(maxp, fp[r]);
            minlo = min(minlo, first_key(fp[r], window));
        }
    const int t_lo = maxp < 0 ? 0 : minlo / FA_BK, n_tiles = maxp < 0 ? 0 : maxp / FA_BK - t_lo + 1;
    const int per = (n_tiles + (int)gridDim.z - 1) / (int)gridDim.z;
    const int k_first = (t_lo + (int)blockIdx.z * per) * FA_BK;
    const int k_end = min(maxp + 1, (t_lo + ((int)blockIdx.z + 1) * per) * FA_BK);

    /* this lane's row (lanes 16..31 repeat 0..15) */
    const int my_p = fp[r0 + lane % 16];

    for (int k0 = k_first; k0 < k_end; k0 += FA_BK) {
        for (int e = threadIdx.x; e < FA_BK * hp; e += blockDim.x) {
            const int j = e / hp, d = e % hp;
            const int64_t key = (int64_t)k0 + j;
            float kk = 0.0f, vv = 0.0f;
            if (key <= maxp && d < hd) {
                kk = ld<T>(k[key * ldkv + (int64_t)kvh * hd + d]);
                vv = ld<T>(v[key * ldkv + (int64_t)kvh * hd + d]);
            }
            Ks[j * L.ldh + d] = __float2half_rn(kk);
            Vs[j * L.ldh + d] = __float2half_rn(vv);
        }
        __syncthreads();
        if (__any_sync(0xffffffffu, sees_tile(my_p, window, k0, FA_BK))) {
            /* S = Q K^T: each Q tile loaded once for the tile's keys */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[FA_BK / 16];
#pragma unroll
            for (int c = 0; c < FA_BK / 16; c++)
                wmma::fill_fragment(sacc[c], 0.0f);
            for (int kk = 0; kk < hp / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::load_matrix_sync(a, Qs + r0 * L.ldh + kk * 16, L.ldh);
#pragma unroll
                for (int c = 0; c < FA_BK / 16; c++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                    wmma::load_matrix_sync(b, Ks + c * 16 * L.ldh + kk * 16, L.ldh);
                    wmma::mma_sync(sacc[c], a, b, sacc[c]);
                }
            }
#pragma unroll
            for (int c = 0; c < FA_BK / 16; c++)
                wmma::store_matrix_sync(Ss + r0 * L.lds + c * 16, sacc[c], L.lds, wmma::mem_row_major);
            __syncwarp();
            /* the online softmax: two lanes a row, 16 keys each */
            {
                const int r = r0 + lane / 2, jb = (lane & 1) * (FA_BK / 2);
                const int p = fp[r], lo = first_key(p, window);
                float sv[FA_BK / 2], mx = -INFINITY;
#pragma unroll
                for (int i = 0; i < FA_BK / 2; i++) {
                    const int key = k0 + jb + i;
                    sv[i] = key <= p && key >= lo ? Ss[r * L.lds + jb + i] + key_bias(kb, key, p) : -INFINITY;
                    mx = fmaxf(mx, sv[i]);
                }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                const float mo = fm[r], mn = fmaxf(mo, mx);
                const bool any = mn != -INFINITY; /* a key seen: masked ones get e^-inf = 0 */
                const float corr = any ? expf(mo - mn) : 1.0f; /* 0 on the row's first visible tile */
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < FA_BK / 2; i++) {
                    const __half ph = __float2half_rn(any ? expf(sv[i] - mn) : 0.0f);
                    Ps[r * L.ldp + jb + i] = ph;
                    sum += __half2float(ph);
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                __syncwarp(); /* both lanes have read m before one rewrites it */
                if ((lane & 1) == 0) {
                    fl[r] = fl[r] * corr + sum;
                    fm[r] = mn;
                    fc[r] = corr;
                }
            }
            __syncwarp();
            for (int e = lane; e < 16 * hp; e += 32) {
                const int r = r0 + e / hp, d = e % hp;
                Os[r * L.ldo + d] *= fc[r];
            }
            __syncwarp();
            /* O += P V: the P tiles loaded once */
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa[FA_BK / 16];
#pragma unroll
            for (int kk = 0; kk < FA_BK / 16; kk++)
                wmma::load_matrix_sync(pa[kk], Ps + r0 * L.ldp + kk * 16, L.ldp);
            for (int c = 0; c < hp / 16; c++) {
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
                wmma::load_matrix_sync(acc, Os + r0 * L.ldo + c * 16, L.ldo, wmma::mem_row_major);
#pragma unroll
                for (int kk = 0; kk < FA_BK / 16; kk++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                    wmma::load_matrix_sync(b, Vs + kk * 16 * L.ldh + c * 16, L.ldh);
                    wmma::mma_sync(acc, pa[kk], b, acc);
                }
                wmma::store_matrix_sync(Os + r0 * L.ldo + c * 16, acc, L.ldo, wmma::mem_row_major);
            }
        }
        __syncthreads(); /* before the next tile overwrites K and V */
    }
    /* the warp's rows out: normalized, or this split's share as the
     * scalar kernel leaves it (unnormalized, with m and l) */
    for (int e = lane; e < 16 * hd; e += 32) {
        const int r = r0 + e / hd, d = e % hd;
        const int64_t row = row0 + r;
        if (row >= n)
            continue;
        if (gridDim.z > 1) {
            float *pp = part + (((int64_t)blockIdx.z * n + row) * n_head + h) * (hd + 2);
            pp[d] = Os[r * L.ldo + d];
            if (d == 0)
                pp[hd] = fm[r], pp[hd + 1] = fl[r];
        } else {
            out[row * ldq + (int64_t)h * hd + d] = Os[r * L.ldo + d] / fl[r];
        }
    }
}

/* the scalar kernel's, or with CB_CUDA_FA=1 from FA_MIN_ROWS rows of an
 * f16 cache on the tensor-core kernel's where the device gives it the
 * shared memory */
void cu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                         cb_type ty, int n_head, int n_head_kv, int hd, float scale, int window, float *out)
{
    tctx *t = T(b, "attention");
    if (n == 0)
        return;
    if (hd > ATT_HD_MAX) /* cb_model_load refuses such models (max_head_dim) */
        BUG("attention", "head dimension above 256");
    const cuda_ctx *c = t->owner;
    const size_t fa_smem = fa_lay(fa_hp(hd)).total;
    /* an f16 cache only: the kernel rounds K and V to f16, and an f32
     * cache's values may lie past its range (inf, then NaN in the tile) */
    const bool fa = c->fa && ty == CB_TYPE_F16 && n >= FA_MIN_ROWS && fa_smem <= c->fa_smem;
    const int rows = fa ? FA_BQ : ATT_WARPS * ATT_ROWS;
    const int32_t *dpos = stage_idx(t, pos, n);
    int z = att_splits(&c->prop, n, pos, n_head, window, rows, fa ? (int)FA_BK : (int)ATT_KT);
    float *part = NULL;
    const size_t part_bytes = sizeof(float) * (size_t)z * (size_t)(n * n_head) * (size_t)(hd + 2);
    if (z > 1 && cu_memo) {
        /* the thread's shares buffer, kept (a decode step's every layer
         * splits its keys) */
        if (!(part = (float *)keep_on(t, &t->att_part, part_bytes)))
            z = 1;
    } else if (z > 1 && !(part = (float *)alloc_on(t, part_bytes))) {
        z = 1; /* no memory for the shares: unsplit, slower, the same result */
    }
    dim3 grid(nblocks(n, rows), (unsigned)n_head, (unsigned)z);
    const kbias kb = {t->kb_n > 0 ? t->kb_cur : NULL, (int)t->kb_n, t->kb_until};
    if (fa)
        k_flash<__half><<<grid, FA_WARPS * 32, fa_smem, t->s>>>(q, dpos, n, (const __half *)k, (const __half *)v,
                                                                n_head, n_head_kv, hd, scale, window, kb, out, part);
    else if (ty == CB_TYPE_F32)
        k_attention<float><<<grid, ATT_WARPS * 32, att_smem(hd), t->s>>>(
            q, dpos, n, (const float *)k, (const float *)v, n_head, n_head_kv, hd, scale, window, kb, out, part);
    else
        k_attention<__half><<<grid, ATT_WARPS * 32, att_smem(hd), t->s>>>(
            q, dpos, n, (const __half *)k, (const __half *)v, n_head, n_head_kv, hd, scale, window, kb, out, part);
    CKL();
    if (z > 1) {
        k_att_merge<<<dim3((unsigned)n, (unsigned)n_head), (unsigned)hd, 0, t->s>>>(part, z, n, n_head, hd, out);
        CKL();
        if (!cu_memo)
            free_on(t, part);
    }
}

/* A bias row is made and sent only when no row of the last N_KB sent has
 * the same flags and bias: a blend sets the same ones at every layer's
 * attention (and clears them after), and a batch's decoding each of its
 * sequences' in turn, at every layer of every step.  The least recently
 * used row is rewritten by a copy queued on the thread's stream, after
 * every attention that read it before. */
cb_status cu_set_key_bias(cb_backend *b, const uint8_t *stale, int64_t n, float bias, int32_t until)
{
    tctx *t = T(b, "set_key_bias");
    t->kb_n = 0;
    if (n <= 0 || !stale)
        return CB_OK;
    if (n > INT32_MAX)
        return CB_ERR_RANGE;
    kb_row *r = &t->kbr[0];
    bool hit = false;
    t->kb_clock++;
    for (int i = 0; i < N_KB && !hit; i++) {
        kb_row *e = &t->kbr[i];
        if ((hit = e->n == n && e->val == bias && memcmp(stale, e->flags, (size_t)n) == 0))
            r = e;
        else if (e->used < r->used)
            r = e;
    }
    if (!hit) {
        if (cu_rec) /* (a row sent by a recording that fails would be taken for sent) */
            rec_refuse("set_key_bias (a row to send)");
        r->n = 0; /* until refilled */
        uint8_t *fl = (uint8_t *)realloc(r->flags, (size_t)n);
        if (!fl)
            return CB_ERR_NOMEM;
        r->flags = fl;
        float *row = (float *)realloc(t->kb_host, sizeof(float) * (size_t)n);
        if (!row)
            return CB_ERR_NOMEM;
        t->kb_host = row;
        if (!keep_on(t, &r->dev, sizeof(float) * (size_t)n))
            return CB_ERR_NOMEM;
        for (int64_t k = 0; k < n; k++)
            row[k] = stale[k] ? bias : 0.0f;
        upload_on(t, r->dev.p, row, sizeof(float) * (size_t)n); /* (copied out of row before it returns) */
        memcpy(fl, stale, (size_t)n);
        r->n = n, r->val = bias;
    }
    r->used = t->kb_clock;
    t->kb_cur = (const float *)r->dev.p, t->kb_n = n, t->kb_until = until;
    return CB_OK;
}

cudaError_t cu_attention_setup(const cudaDeviceProp *prop, size_t *smem, size_t *fa_smem)
{
    cudaError_t e;
    *smem = att_smem(ATT_HD_MAX);
    if ((e = cudaFuncSetAttribute(k_attention<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem)) !=
            cudaSuccess ||
        (e = cudaFuncSetAttribute(k_attention<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem)) !=
            cudaSuccess)
        return e;
    /* the tensor-core kernel: up to the largest head dimension whose tiles
     * the device's shared memory holds (sm_80 and sm_90: 256; sm_86 and
     * sm_89, 99 KB a block: 160); larger ones take the scalar kernel */
    *fa_smem = 0;
    for (int hd = ATT_HD_MAX; hd >= 16; hd -= 16) {
        size_t need = fa_lay(fa_hp(hd)).total;
        if (need > prop->sharedMemPerBlockOptin)
            continue;
        if ((e = cudaFuncSetAttribute(k_flash<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need)) !=
            cudaSuccess)
            return e;
        *fa_smem = need;
        break;
    }
    return cudaSuccess;
}

/* ------------------------------------------------------ attention mass */

/* Blending's attention mass (probe's score, backend.h's attn_mass) on the
 * device, in three kernels, no host copy and no atomics (the same bits
 * every run, so that top-k picks the same tokens):
 *   k_mass_norm: per (query row, head), one block: the row's max logit m
 *     and 1 / sum e^(s - m) over the keys its mask leaves it;
 *   k_mass_head: per (tile of MASS_KT keys, head): each thread a key, the
 *     sum over the query rows (MASS_RC at a time through shared memory) of
 *     e^(s - m) / l, times the norm of the key's value row in the head's
 *     KV head where v is given, to part[head][key];
 *   k_mass_add: mass[key] += the heads' sums, head by head.
 * Logits are f32 dot products in order over the head dimension (the CPU's
 * come from sgemm: test_backend_ops bounds the difference). */
enum { MASS_NT = 128, MASS_KT = 32, MASS_RC = 8 };

template <typename T>
__global__ void __launch_bounds__(MASS_NT)
    k_mass_norm(const float *q, const int32_t *pos, const T *k, int n_head, int n_head_kv, int hd, float scale,
                int window, float2 *ml)
{
    __shared__ float qs[ATT_HD_MAX];
    __shared__ float red_m[MASS_NT / 32], red_l[MASS_NT / 32];
    const int64_t row = blockIdx.x;
    const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    const int64_t ldkv = (int64_t)n_head_kv * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = q[row * (int64_t)n_head * hd + (int64_t)h * hd + d] * scale;
    __syncthreads();
    const int p = pos[row], lo = first_key(p, window);
    float m = -INFINITY, l = 0.0f; /* this thread's keys, online */
    for (int j = lo + (int)threadIdx.x; j <= p; j += blockDim.x) {
        const T *kr = k + (int64_t)j * ldkv + (int64_t)kvh * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++)
            s += qs[d] * ld<T>(kr[d]);
        if (s > m) {
            l = l * expf(m - s) + 1.0f;
            m = s;
        } else {
            l += expf(s - m);
        }
    }
    /* the block's: max, then each thread's sum rescaled to it */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float wm = warp_max(m);
    if (lane == 0)
        red_m[warp] = wm;
    __syncthreads();
    float bm = red_m[0];
    for (int w = 1; w < MASS_NT / 32; w++)
        bm = fmaxf(bm, red_m[w]);
    float wl = warp_sum(m == -INFINITY ? 0.0f : l * expf(m - bm));
    if (lane == 0)
        red_l[warp] = wl;
    __syncthreads();
    if (threadIdx.x == 0) {
        float bl = 0.0f;
        for (int w = 0; w < MASS_NT / 32; w++)
            bl += red_l[w];
        ml[row * n_head + h] = make_float2(bm, 1.0f / bl); /* every row sees its own position: bl >= 1 */
    }
}

template <typename T>
__global__ void __launch_bounds__(MASS_KT)
    k_mass_head(const float *q, const int32_t *pos, int64_t n, const T *k, const T *v, int64_t n_keys, int n_head,
                int n_head_kv, int hd, float scale, int window, const float2 *ml, float *part)
{
    extern __shared__ float sm[];
    const int ldk = hd + 1; /* padded: threads read different key rows */
    float *Ks = sm, *Qs = Ks + MASS_KT * ldk;
    const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    const int64_t ldkv = (int64_t)n_head_kv * hd, ldq = (int64_t)n_head * hd;
    const int64_t k0 = (int64_t)blockIdx.x * MASS_KT, key = k0 + threadIdx.x;
    for (int e = threadIdx.x; e < MASS_KT * hd; e += blockDim.x) {
        int64_t j = k0 + e / hd;
        Ks[(e / hd) * ldk + e % hd] = j < n_keys ? ld<T>(k[j * ldkv + (int64_t)kvh * hd + e % hd]) : 0.0f;
    }
    float sum = 0.0f;
    for (int64_t r0 = 0; r0 < n; r0 += MASS_RC) {
        __syncthreads(); /* the keys in; the last chunk's rows read */
        for (int e = threadIdx.x; e < MASS_RC * hd; e += blockDim.x) {
            int64_t row = r0 + e / hd;
            Qs[e] = row < n ? q[row * ldq + (int64_t)h * hd + e % hd] * scale : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < MASS_RC && r0 + r < n; r++) {
            const int p = pos[r0 + r];
            if (key > p || key < first_key(p, window))
                continue;
            float s = 0.0f;
            for (int d = 0; d < hd; d++)
                s += Qs[r * hd + d] * Ks[threadIdx.x * ldk + d];
            const float2 mi = ml[(r0 + r) * n_head + h];
            sum += expf(s - mi.x) * mi.y;
        }
    }
    if (key >= n_keys)
        return;
    if (v) { /* the value row's norm: f32, in order over the head dimension, as the CPU's */
        const T *vr = v + key * ldkv + (int64_t)kvh * hd;
        float s2 = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float x = ld<T>(vr[d]);
            s2 += x * x;
        }
        sum *= sqrtf(s2);
    }
    part[(int64_t)h * n_keys + key] = sum;
}

__global__ void k_mass_add(const float *part, int64_t n_keys, int n_head, float *mass)
{
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_keys)
        return;
    float s = 0.0f;
    for (int h = 0; h < n_head; h++)
        s += part[(int64_t)h * n_keys + j];
    mass[j] += s;
}

static size_t mass_smem(int hd)
{
    return sizeof(float) * (size_t)(MASS_KT * (hd + 1) + MASS_RC * hd);
}

cb_status cu_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                       cb_type ty, int64_t n_keys, int n_head, int n_head_kv, int hd, float scale, int window,
                       float *mass)
{
    tctx *t = T(b, "attn_mass");
    if (n == 0 || n_keys == 0)
        return CB_OK;
    if (hd > ATT_HD_MAX)
        BUG("attn_mass", "head dimension above 256");
    const int32_t *dpos = stage_idx(t, pos, n);
    const size_t ml_bytes = sizeof(float2) * (size_t)(n * n_head), part_bytes = sizeof(float) * (size_t)(n_keys * n_head);
    float2 *ml;
    float *part;
    if (cu_memo) { /* one buffer the thread keeps: a probe scores every layer */
        ml = (float2 *)keep_on(t, &t->mass_buf, ml_bytes + part_bytes);
        part = ml ? (float *)(ml + n * n_head) : NULL;
    } else {
        ml = (float2 *)alloc_on(t, ml_bytes);
        part = (float *)alloc_on(t, part_bytes);
    }
    if (!ml || !part) {
        if (!cu_memo) {
            free_on(t, ml);
            free_on(t, part);
        }
        return CB_ERR_NOMEM;
    }
    dim3 gn((unsigned)n, (unsigned)n_head), gh(nblocks(n_keys, MASS_KT), (unsigned)n_head);
    size_t smem = mass_smem(hd);
    if (ty == CB_TYPE_F32) {
        k_mass_norm<float><<<gn, MASS_NT, 0, t->s>>>(q, dpos, (const float *)k, n_head, n_head_kv, hd, scale, window,
                                                     ml);
        CKL();
        k_mass_head<float><<<gh, MASS_KT, smem, t->s>>>(q, dpos, n, (const float *)k, (const float *)v, n_keys,
                                                        n_head, n_head_kv, hd, scale, window, ml, part);
    } else {
        k_mass_norm<__half><<<gn, MASS_NT, 0, t->s>>>(q, dpos, (const __half *)k, n_head, n_head_kv, hd, scale,
                                                      window, ml);
        CKL();
        k_mass_head<__half><<<gh, MASS_KT, smem, t->s>>>(q, dpos, n, (const __half *)k, (const __half *)v, n_keys,
                                                         n_head, n_head_kv, hd, scale, window, ml, part);
    }
    CKL();
    LAUNCH_1D(t, n_keys, k_mass_add, part, n_keys, n_head, mass);
    if (!cu_memo) {
        free_on(t, ml);
        free_on(t, part);
    }
    return CB_OK;
}

const void *cu_attn_kernel(void)
{
    return (const void *)k_att_merge;
}
