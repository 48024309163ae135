/* cuda_impl.cuh - what the CUDA backend's files share (private to the
 * module): the error machinery, the per-thread context, the staging
 * helpers, the element conversions, and the operations each file defines
 * for the table in cuda.cu.
 *
 *   cuda.cu       errors, thread contexts, memory, events, the table, open
 *   cuda_mm.cu    weights (dequantization on the device), matmul, get_rows
 *   cuda_attn.cu  attention (online softmax, split keys; the tensor-core
 *                 kernel under CB_CUDA_FA=1), probe's attention mass
 *   cuda_ops.cu   rmsnorm, rope, elementwise, KV rows, gather/scatter,
 *                 blending's deviation and top-k
 *   cuda_graph.cu graphs: a decode step recorded and replayed (under
 *                 CB_CUDA_GRAPH=1) */
#ifndef CB_CUDA_IMPL_CUH
#define CB_CUDA_IMPL_CUH

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

/* A failure inside an operation: thrown by CK, CKB and cu_fail, caught by
 * the table's entry (cuda.cu), which records it as the backend's fault.
 * It never leaves the module. */
struct cu_fault {
    cb_status st;
    char msg[384];
};

/* CB_CUDA_SYNC=1: every operation waits for its work and checks it */
extern int cu_sync_each;

/* CB_CUDA_GEMV=1: products of up to CU_GEMV_ROWS rows through k_gemv
 * (cuda_mm.cu), row-stable; cu_gemv_rows is then CU_GEMV_ROWS, else 0 */
enum { CU_GEMV_ROWS = 8 };
extern int cu_gemv_rows;

/* CB_CUDA_FUSE=1: besides the fused operations' entries, a product's
 * input scale needs no memset (cuda_mm.cu's amax slots) */
extern int cu_fuse;

/* CB_CUDA_MEMO=1: stage() sends an index array or small table only when
 * its contents differ from the N_MEMO the thread sent last (cuda.cu), and
 * attention keeps its scratch from call to call (cuda_attn.cu) */
extern int cu_memo;

/* CB_CUDA_GRAPH=1 (cuda_graph.cu): whether the calling thread records a
 * graph (REC_ON), or did and the recording failed (REC_BROKEN: the
 * table's entries do nothing until graph_end) */
enum { REC_OFF, REC_ON, REC_BROKEN };
extern thread_local int cu_rec;

/* Throw a cu_fault: `what` (a call) failed at file:line for reason `why`,
 * in the backend operation the calling thread is in ("matmul: an illegal
 * memory access was encountered (cublasGemmEx(...) at file:line)").  cuda:
 * a CUDA or cuBLAS error (CB_ERR_DEVICE), else a failed invariant. */
[[noreturn]] void cu_fail(cb_status st, int cuda, const char *what, const char *file, int line, const char *why);

#define CK(x)                                                                                                         \
    do {                                                                                                              \
        cudaError_t e_ = (x);                                                                                         \
        if (e_ != cudaSuccess)                                                                                        \
            cu_fail(CB_ERR_DEVICE, 1, #x, __FILE__, __LINE__, cudaGetErrorString(e_));                                \
    } while (0)

#define CKB(x)                                                                                                        \
    do {                                                                                                              \
        cublasStatus_t s_ = (x);                                                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                              \
            cu_fail(CB_ERR_DEVICE, 1, #x, __FILE__, __LINE__, cublasGetStatusString(s_));                             \
    } while (0)

/* after a kernel launch */
#define CKL() CK(cudaGetLastError())

/* a broken invariant (a bug, or a caller past the backend's limits) */
#define BUG(op, why) cu_fail(CB_ERR_INTERNAL, 0, op, __FILE__, __LINE__, why)

static inline unsigned nblocks(int64_t n, int per)
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
enum { N_IDX = 64, STAGE_BYTES = 8 << 20, IDX_CAP = 64 << 10 };

typedef struct slot {
    void *host;      /* page-locked */
    void *dev;       /* device mirror (index slots only) */
    size_t cap;
    cudaEvent_t ev;  /* the last copy out of host */
} slot;

/* A staged array kept for reuse (CB_CUDA_MEMO=1): while a forward pass's
 * layers stage the same positions and RoPE table again and again, the
 * device copy of the first is handed out, and nothing is sent.  Each
 * slot is made at MEMO_BYTES (at open: tctx_warm), so that none grows,
 * pinning memory, inside the timed work of a long prompt. */
enum { N_MEMO = 8, MEMO_BYTES = 64 << 10 };

typedef struct memo {
    slot sl;             /* host: the contents last sent; dev: their copy */
    size_t len;          /* 0: holds nothing */
    unsigned long used;  /* the thread's memo clock at the last hand-out */
} memo;

/* A scratch buffer a thread keeps from call to call (keep_on) */
typedef struct kept {
    void *p;
    size_t cap;
} kept;

/* A key-bias row on the device and what it was made from */
enum { N_KB = 8 };
typedef struct kb_row {
    kept dev;       /* [n] floats: the bias, or 0 */
    uint8_t *flags; /* host: the flags [n] */
    int64_t n;      /* 0: empty */
    float val;      /* the bias */
    unsigned long used;
} kb_row;

/* A thread's device scalars for its matrix products (stream-ordered: each
 * product rewrites them after the previous one has read them). */
enum { MM_SET = 4 }; /* the most weights one product's input is converted for */
typedef struct mm_scalars {
    /* the input's largest magnitude, as f32 bits (NaN above inf), in
     * amax[0]; under CB_CUDA_FUSE=1 in amax[amax_at] (struct tctx), the
     * other one zeroed by the same product's conversion for the next */
    unsigned amax[2];
    float alpha[MM_SET];   /* each weight's undoing of both scales, and zero: */
    float zero;            /* cuBLAS reads them from here (device pointer mode) */
    unsigned n_bad;        /* CB_CUDA_SYNC: non-finite outputs of the last product */
    unsigned amax_dbg;     /* and its input's largest magnitude, where the product did not find it */
} mm_scalars;

/* CB_CUDA_GRAPH=1 (cuda_graph.cu): the recordings' arena (host arrays
 * staged while recording), the stagings of one recording it reuses, the
 * executable graphs a thread keeps (one per key), and the failed
 * recordings in a row after which the thread records no more */
enum { ARENA_BYTES = 64 << 10, REC_SEEN = 16, N_GX = 4, GR_TRIES = 8 };

typedef struct gexec {
    cudaGraphExec_t ex; /* NULL: none */
    int key;
    unsigned long used;
} gexec;

typedef struct cuda_ctx cuda_ctx;

typedef struct tctx {
    cuda_ctx *owner;
    cudaStream_t s;
    cublasHandle_t blas;  /* cu_blas: at open for the opening thread, else first matmul */
    mm_scalars *scal;     /* device, with the handle */
    int amax_at;          /* CB_CUDA_FUSE=1: scal->amax's slot the next product takes (zero) */
    void *blas_ws;        /* the handle's workspace (cu_blas) */
    slot idx[N_IDX];      /* index arrays, round robin */
    int next_idx;
    memo memo[N_MEMO];    /* CB_CUDA_MEMO=1's reused stagings */
    unsigned long memo_clock;
    slot stage[2];        /* upload staging, alternating */
    int next_stage;
    kept act;             /* 16-bit copy of a matmul's input rows */
    kept tile32, tile16;  /* CB_CUDA_QW=1: a block weight's rows dequantized, f32 then 16-bit */
    kept att_part;        /* CB_CUDA_MEMO=1: attention's split shares, kept */
    kept mass_buf;        /* and attn_mass's normalizers and per-head sums */
    /* set_key_bias's (cuda_attn.cu): bias rows on the device, each sent
     * once while its flags are in use (every layer of a blend sets the
     * same; a batch's decoding, each sequence's in turn) */
    kb_row kbr[N_KB];     /* the last N_KB rows sent */
    unsigned long kb_clock;
    float *kb_host;       /* host: a row being made */
    const float *kb_cur;  /* the row attention adds now (one of kbr's) */
    int64_t kb_n;         /* its keys (0: none biased) */
    int32_t kb_until;     /* for the rows at positions below it */
    /* CB_CUDA_GRAPH=1's (cuda_graph.cu) */
    slot arena;           /* host: what a recording staged, read when its graph runs; ev: its last launch */
    size_t rec_off;       /* the arena's bytes in use by this recording */
    struct {
        size_t off, len;
    } rec_seen[REC_SEEN]; /* this recording's stagings, reused while their contents repeat */
    int rec_n, rec_key;
    int rec_amax_at;      /* amax_at when the recording began (restored when it does not run) */
    gexec gx[N_GX];
    unsigned long gx_clock;
    int gr_fails, gr_off; /* failed recordings in a row; graphs off for the thread */
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
    /* CB_CUDA_FA=1 at open: attention of FA_MIN_ROWS rows or more on the
     * tensor cores (cuda_attn.cu), for head dimensions whose tiles fit in
     * fa_smem bytes of shared memory (0: none) */
    int fa;
    size_t fa_smem;
    /* CB_CUDA_QW=1 at open: block-quantized weights stay in their GGUF
     * blocks on the device (cuda_mm.cu): few-row products read the blocks
     * (k_qgemv), larger ones dequantize a tile of rows at a time */
    int qw;
};

static inline cuda_ctx *CTX(cb_backend *b)
{
    return (cuda_ctx *)b->ctx;
}

/* The calling thread's context, made current on the backend's device; op
 * names the backend operation for error reports. */
tctx *T(cb_backend *b, const char *op);

/* the context's cuBLAS handle, made if it has none (cuda_mm.cu) */
void cu_blas(tctx *t);

/* Copy `bytes` of host data (index arrays, small tables) to the device
 * through the next staging slot; the device copy is valid for work queued
 * after it on t->s, until N_IDX more stagings (CB_CUDA_MEMO=1: up to
 * MEMO_BYTES come from the memo, valid until N_MEMO other contents have
 * been staged).  Kernels only read it. */
const void *stage(tctx *t, const void *h, size_t bytes);
const int32_t *stage_idx(tctx *t, const int32_t *h, int64_t n);

/* cudaMallocAsync on the thread's stream: NULL only when the device is out
 * of memory (the error is cleared); any other error throws. */
void *alloc_on(tctx *t, size_t nbytes);
void free_on(tctx *t, void *p);
/* k's buffer, grown to at least nbytes (the old one freed after the work
 * queued on it), for work on t->s: stream order keeps one call's kernels
 * from writing it before the last call's have read it.  NULL when the
 * device is out of memory. */
void *keep_on(tctx *t, kept *k, size_t nbytes);
/* host src -> device dst through the page-locked staging buffers */
void upload_on(tctx *t, void *dst, const void *src, size_t nbytes);

static inline float bits_float(unsigned u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* cuda_graph.cu: while recording, stage() and upload_on() send through
 * the arena (rec_stage, rec_upload), and what may not be recorded throws
 * (rec_refuse), which fails the recording (rec_broken, in the table's
 * entries), not the backend */
const void *rec_stage(tctx *t, const void *h, size_t bytes);
void rec_upload(tctx *t, void *dst, const void *src, size_t bytes);
[[noreturn]] void rec_refuse(const char *what);
void rec_broken(const char *why);
void rec_abandon(tctx *t);
void rec_destroy(tctx *t);
int cu_graph_begin(cb_backend *b, int key);
int cu_graph_end(cb_backend *b, int run);

/* ------------------------------------------------- element conversions */

template <typename T> __device__ __forceinline__ float ld(T x);
template <> __device__ __forceinline__ float ld<float>(float x) { return x; }
template <> __device__ __forceinline__ float ld<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T st(float x);
template <> __device__ __forceinline__ float st<float>(float x) { return x; }
template <> __device__ __forceinline__ __half st<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* --------------------------------------------------------- operations
 * (backend.h's contracts; each may throw a cu_fault) */

void cu_dealloc(cb_backend *b, void *p);

/* cuda_mm.cu */
cb_bweight *cu_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out, const void *data,
                          const float *bias);
void cu_weight_free(cb_backend *b, cb_bweight *w);
void cu_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n);
void cu_matmul_multi(cb_backend *b, const cb_bweight *const *w, int nw, const float *x, float *const *y,
                     int64_t n);
void cu_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst);

/* One kernel of each file (each file's kernels are a module of their own:
 * no relocatable device code), from which cuda.cu's load_kernels finds
 * the module and loads all of its kernels when the backend opens */
const void *cu_mm_kernel(void);
const void *cu_attn_kernel(void);
const void *cu_ops_kernel(void);

/* cuda_attn.cu: head dimensions up to CU_ATT_HD_MAX; cu_attention_setup
 * gives the scalar kernels the shared memory that takes (*smem bytes), and
 * the tensor-core kernel what its tiles take at the largest head dimension
 * the device allows (*fa_smem bytes; 0: none), once */
enum { CU_ATT_HD_MAX = 256 };
cudaError_t cu_attention_setup(const cudaDeviceProp *prop, size_t *smem, size_t *fa_smem);
void cu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                  cb_type ty, int n_head, int n_head_kv, int hd, float scale, int window, float *out);
/* backend.h's set_key_bias (in the table under CB_CUDA_KBIAS=1): both
 * attention kernels add the bias to the flagged keys' scores */
cb_status cu_set_key_bias(cb_backend *b, const uint8_t *stale, int64_t n, float bias, int32_t until);
/* backend.h's attn_mass (in the table unless CB_CUDA_MASS=0, which scores
 * on the host from copies) */
cb_status cu_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                       cb_type ty, int64_t n_keys, int n_head, int n_head_kv, int hd, float scale, int window,
                       float *mass);

/* cuda_ops.cu */
void cu_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d, float eps);
void cu_add_rmsnorm(cb_backend *b, float *x, const float *y, const float *g, float *out, int64_t n, int64_t d,
                    float eps);
void cu_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot, float base,
             const float *ff, int neox);
void cu_rope_qk(cb_backend *b, float *q, float *k, const int32_t *pos, int64_t n, int n_head, int n_head_kv, int hd,
                int n_rot, float base, const float *ff, int neox);
void cu_add(cb_backend *b, float *x, const float *y, int64_t n);
void cu_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n);
void cu_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n);
void cu_scale(cb_backend *b, float *x, float s, int64_t n);
void cu_kv_write(cb_backend *b, void *cache, cb_type ty, int64_t width, const float *src, const int32_t *at,
                 int64_t n);
void cu_kv_write_kv(cb_backend *b, void *kc, void *vc, cb_type ty, int64_t width, const float *ks, const float *vs,
                    const int32_t *at, int64_t n);
void cu_kv_read(cb_backend *b, const void *cache, cb_type ty, int64_t width, const int32_t *at, int64_t n,
                float *dst);
void cu_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst);
void cu_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst);
void cu_deviation(cb_backend *b, const float *src, const void *cache, cb_type ty, int64_t width,
                  const int32_t *at, int64_t n, float *dev);
void cu_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx);

#endif
