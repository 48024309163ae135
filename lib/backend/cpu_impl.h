/* cpu_impl.h - the CPU backend's state, shared by its files (cpu.c: setup,
 * products, elementwise ops, selection; cpu_attn.c: attention, attention
 * mass).  Private to lib/backend. */
#ifndef CB_CPU_IMPL_H
#define CB_CPU_IMPL_H

#include "backend.h"
#include "pool.h"
#include "qgemm.h"
#include "qmm.h"

#include <pthread.h>

enum {
    QG_ROW_MAX_0 = 8,    /* 8-bit activations: up to this many rows of the 32-element types
                         through qg_gemv, more through packed panels (the K types: qg_kernels'
                         gemv_max_k; panels packed per product took 60% of Qwen2.5-0.5B's
                         decode of 8 sequences, whose q5_0 and q8_0 weights then went there:
                         175 tok/s at 4, 245 at 8) */
    MM_SMALL = 12,       /* up to this many rows: the quantized dot kernels (measured: they beat
                         dequantized panels + sgemm up to 12 rows, tie at 16; lean-2 notes) */
    PANEL_MAX = 128,     /* weight rows per sgemm panel */
    ATT_KB = 256,        /* keys per attention tile */
    ATT_SUB = 16,        /* keys a decode task takes in every KV head before the next ones: the
                         cache rows stream whole, not one head's slice of each */
    ATT_M = 256,         /* query (row, head) pairs per attention task */
    ATT_HD = 512,        /* the largest head dimension */
    ATT8_MIN_ROWS = 8,   /* 8-bit activations: attention of at least this many query rows in
                         8-bit products (fewer: the f32 tiles; decode's one row reads the
                         cache, which quantizing once per call would read again) */
    ATT_PARTS = 1 << 20, /* floats of split-key partial results */
};

typedef struct thread_scratch {
    float *panel;     /* [PANEL_MAX, max n_in]: grown by weight_new */
    int64_t panel_in; /* its n_in capacity */
    uint8_t *qpanel;  /* a packed panel of the blocked 8-bit products (qgemm.h) */
    size_t qpanel_bytes;
    float *q, *o;  /* [ATT_M, ATT_HD] */
    float *k, *v;  /* [ATT_KB, ATT_HD] */
    float *s;      /* [ATT_M, ATT_KB] */
    float *mx, *l; /* [ATT_M] */
} thread_scratch;

typedef struct cpu_ctx {
    cb_pool *pool;
    int n_threads;
    int simd;               /* 0: portable kernels only (tests) */
    qmm_exp_sum_fn exp_sum; /* softmax's exponentials (NULL: the loop here) */
    qmm_f16_fn f16_row;     /* f16 cache rows to f32 (NULL: the loop here) */
    qmm_swiglu_fn swiglu;   /* the 8-bit path's SwiGLU (qmm_avx2_swiglu, else swiglu_fast) */
    qmm_att_qk_fn att_qk;   /* the fused f16 products of small attention tasks (NULL: tiles) */
    qmm_att_pv_fn att_pv;
    thread_scratch *ts; /* [n_threads] */
    float *parts;       /* [ATT_PARTS] split-key partials */
    pthread_mutex_t grow_mu;
    int act8;              /* 8-bit activations in every product of block-quantized weights
                               (cpu_set_act8; the default) */
    qg_kernels qg;         /* their kernels (qgemm.h) */
    int plain_weights;     /* 1: some weight goes through the exact kernels (cpu_rows) */
    size_t xg_row[2];      /* bytes of a quantized row in the K and the 32-element form (the
                               widest weight's, set by weight_new) */
    uint8_t *xg;           /* [xg_rows] rows of each form: the batch's quantized activations */
    int64_t xg_rows;       /* grown by cpu_reserve (or a larger batch) */
    pthread_mutex_t xg_mu; /* xg belongs to one product at a time */
    float *ol_x, *ol_y;    /* [CB_ROWS_MAX] rows of the widest input and output: the rows an
                              outlier dominates (qg_outliers; with xg, under xg_mu) */
    int64_t ol_in, ol_out;
    uint8_t *a8;          /* the 8-bit attention's keys and values, packed (cpu_attn.c); grown */
    size_t a8_bytes;      /* its size */
    float *kb_bias;       /* cpu_set_key_bias's: each key's bias (or 0) [kb_n] (kb_cap */
    int64_t kb_n, kb_cap; /* allocated), for the query positions below kb_until */
    int32_t kb_until;
} cpu_ctx;

struct cb_bweight {
    cb_type type;
    int64_t n_in, n_out;
    const uint8_t *data; /* borrowed: n_out rows of row_bytes */
    size_t row_bytes;
    float *bias; /* [n_out] or NULL */
    qmm_kernels k;
    int qg; /* 1: batches through the blocked 8-bit products */
};

static inline cpu_ctx *CTX(cb_backend *b) { return b->ctx; }

/* attention (cpu_attn.c): the backend operations */
/* the 8-bit attention's scratch sized for n_keys keys (backend.h's
 * reserve_keys) */
void cpu_reserve_keys(cb_backend *b, int64_t n_keys, int n_head_kv, int hd);
cb_status cpu_set_key_bias(cb_backend *b, const uint8_t *stale, int64_t n, float bias,
                           int32_t until);
void cpu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                   const void *v, cb_type t, int n_head, int n_head_kv, int hd, float scale,
                   int window, float *out);
cb_status cpu_attn_mass(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k,
                        const void *v, cb_type t, int64_t n_keys, int n_head, int n_head_kv, int hd,
                        float scale, int window, float *mass);

#endif
