/* qgemm.h - the blocked 8-bit products of the CPU backend (private to
 * lib/backend): y [n, n_out] = x [n, n_in] . W^T for batches of more than a
 * few rows (prefill, a blend's recomputed rows), with block-quantized
 * weights W kept in their GGUF type and activations quantized to 8 bits.
 *
 * The math, per weight row o and activation row r:
 *
 *   K-quant weights (q4_K, q5_K, q6_K), activations as qg_q8k: each 256
 *   activations of a row are d * q[j] with d = max|x| / 127 and q[j] =
 *   round-half-even(x[j] / d) in [-127, 127] (llama.cpp's Q8_K), plus the
 *   sums of q per 16 and per 32.  A weight block is d_w * sc_s * w[j] -
 *   dmin_w * m_s with unsigned integers w and integer sub-block scales sc_s,
 *   offsets m_s (q6_K: w = q in 0..63, sc_s its int8 scale per 16, and the
 *   offset -32 * sc_s * d_w folded into the integers).  The block's product
 *   is then d_x * (d_w * I - dmin_w * M) with exact integer sums
 *   I = sum_s sc_s * sum_{j in s} w[j] q[j] and M = sum_s m_s * bsum_s.
 *
 *   32-element types (q4_0, q4_1, q5_0, q5_1, q8_0), activations as
 *   qmm_q8 (per 32: d, q, s = d * sum q, as llama.cpp's Q8_0): a block is
 *   d_w * w[j] + b_w (b_w = -8 d, m, -16 d, m, 0), its product
 *   d_w * d_x * sum w[j] q[j] + b_w * s_x.
 *
 * Block results are summed in f32, block by block in order, with fused
 * multiply-adds (the order is part of the contract: the AVX2 and portable
 * kernels agree bit for bit).  The only departures from the f32 product of
 * the activations are the rounding of q (relative 1/254 of a block's largest
 * activation at most) and f32 sums.
 *
 * Work is split by panels of p weight rows, p the lanes of the kernels'
 * vectors (8: AVX2, AVX-VNNI and portable; 16: AVX-512): a panel is packed
 * once (qg_pack: the rows' integers interleaved four bytes at a time, so
 * that one vector holds four consecutive elements of each of the p rows,
 * beside their scales), and then multiplied with every activation row, up
 * to QG_R (AVX-512: 8) rows at a time.  Packing reads the GGUF blocks where they lie (no
 * copy of the model is kept) and costs one pass over the panel's bytes per
 * product, paid back over the batch's rows.
 *
 * The kernels, chosen at run time: AVX2 (vpmaddubsw into 16-bit sums,
 * vpmaddwd with the scales), AVX-VNNI (vpdpbusd into 32-bit sums, vpmulld
 * with the scales), AVX-512BW and AVX-512 VNNI (the same on 16 rows), and
 * portable C.  The AVX-512 and AVX-VNNI ones are also compiled through
 * SIMDe's portable intrinsics (test_qgemm_isa), so that machines without
 * them test their logic against the portable kernel bit for bit. */
#ifndef CB_QGEMM_H
#define CB_QGEMM_H

#include "../core/core.h"
#include "qmm.h"

#include <stddef.h>
#include <stdint.h>

enum {
    QG_P = 8,     /* weight rows per panel of the 256-bit and portable kernels */
    QG_PMAX = 16, /* ... of the 512-bit ones */
    QG_R = 4,     /* activation rows per kernel step (the AVX-512 panels: qgemm_tile.h's QGT_R) */
};

/* The offsets of a packed block's parts, and its size, in units of p bytes
 * (qgemm.c states the layout) */
enum {
    QG_OFF_K_SC = 256, /* after w */
    QG_OFF_K45_MN = 288,
    QG_OFF_K45_D = 304,
    QG_OFF_K45_BYTES = 312, /* q4_K, q5_K: 8 scales */
    QG_OFF_K6_MN = 320,
    QG_OFF_K6_D = 352,
    QG_OFF_K6_BYTES = 360, /* q6_K: 16 scales */
    QG_OFF_0_D = 32,
    QG_OFF_0_B = 36,
    QG_OFF_0_BYTES = 40, /* the 32-element types */
};

/* A packed panel's layout: p rows; the sub-block scales as int16 pairs
 * (sc, sc) for vpmaddwd (sc32 0) or as int32 for vpmulld (sc32 1) */
typedef struct qg_layout {
    int p, sc32;
} qg_layout;

/* 256 activations quantized (llama.cpp's Q8_K): x[j] ~ d * q[j]; bs16[i]
 * and bs32[i] the sums of q over elements 16i.. and 32i.. */
typedef struct qg_q8k {
    float d;
    int16_t bs16[16];
    int16_t bs32[8];
    int8_t q[256];
} qg_q8k;

/* 1: type t has blocked 8-bit kernels (the eight block types) */
int qg_has(cb_type t);
/* 1: t is a K-quant (activations as qg_q8k, 256 a block), 0: a 32-element
 * type (qmm_q8) */
int qg_is_k(cb_type t);
/* Bytes of one quantized activation row of n_in elements for type t, and
 * of a packed panel of n_in elements. */
size_t qg_act_bytes(cb_type t, int64_t n_in);
size_t qg_panel_bytes(cb_type t, int64_t n_in, int p);

/* dst [n/4][p][4] = q [p][n] (n a multiple of 32, p 8 or 16): the rows'
 * integers interleaved four bytes at a time */
typedef void (*qg_interleave_fn)(const int8_t *q, int n, int p, uint8_t *dst);
void qg_interleave_c(const int8_t *q, int n, int p, uint8_t *dst);
void qg_interleave_avx2(const int8_t *q, int n, int p, uint8_t *dst);

/* One weight block in integer form: its integers into q[32] (the 32-element
 * types) or q[256] (K-quants), its scales into s: value[j] = d * sc[s(j)] *
 * q[j] - dmin * mn[s(j)] for q4_K/q5_K (8 sub-blocks of 32), d * sc[s(j)] *
 * q[j] - d * mn[s(j)] for q6_K (q in 0..63, 16 sub-blocks of 16, mn = 32 *
 * sc), d * q[j] + dmin for the 32-element types (dmin being qmm_group8's
 * offset). */
typedef struct qg_scales {
    int16_t sc[16], mn[16];
    float d, dmin;
} qg_scales;
typedef void (*qg_decode_fn)(cb_type t, const uint8_t *b, int8_t *q, qg_scales *s);
void qg_decode_c(cb_type t, const uint8_t *b, int8_t *q, qg_scales *s);
void qg_decode_avx2(cb_type t, const uint8_t *b, int8_t *q, qg_scales *s);

typedef struct qg_kernels qg_kernels;
/* The AVX2 packer (qg_pack's work in one pass, the same bytes as the
 * portable one): k->pack when the kernels have it. */
typedef void (*qg_pack_fn)(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0,
                           int nr, uint8_t *dst, qg_layout l);
void qg_pack_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int nr,
                  uint8_t *dst, qg_layout l);
/* The packed panel of W rows o0 .. o0+nr-1 (nr <= k->layout.p; missing
 * rows are zero) into dst [qg_panel_bytes], in k's layout, decoded and
 * interleaved by k's kernels. */
void qg_pack(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int nr,
             uint8_t *dst, const qg_kernels *k);

/* Activations: the K form of n elements (a multiple of 256) into xq. */
typedef void (*qg_quant_fn)(const float *x, int64_t n, qg_q8k *xq);
void qg_quant8k_c(const float *x, int64_t n, qg_q8k *xq);
void qg_quant8k_avx2(const float *x, int64_t n, qg_q8k *xq);

/* y[r*ldy + i] (i < np <= the layout's p) = the product of activation row
 * r (at xq + r * ldxq bytes, qg_act_bytes apart) with the packed panel's
 * row i, for r < n.  Each kernel reads its own layout (qg_kernels.layout). */
typedef void (*qg_gemm_fn)(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq,
                           size_t ldxq, int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_c(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq,
               int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_avx2(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq,
                  int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_avxvnni(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq,
                     int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_avx512(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq,
                    int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_avx512vnni(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq,
                        size_t ldxq, int64_t n, int np, float *y, int64_t ldy);

/* y[r*ldy + o] for o in [o0, o1) and r < nr = W row o (GGUF layout,
 * row_bytes apart) times activation row r (at xq + r * ldxq bytes, in t's
 * form): the same bits qg_gemm gives for that row (decode and a few rows:
 * no packing; the rows share each weight block's decoding, QG_R at a
 * time). */
typedef void (*qg_gemv_fn)(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                           const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y,
                           int64_t ldy);
void qg_gemv_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
               size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy);
void qg_gemv_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                  size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy);

/* The same for 1 <= nr <= QG_ROWS activation rows of any of the eight
 * types, with the rows in the vector lanes (qgemm_rows.h: AVX-VNNI,
 * AVX-512 VNNI, and AVX2 with vpmaddubsw + vpmaddwd for vpdpbusd, q8_0
 * there through the one-row kernel; qg_gemv gives it the types where it
 * is ahead) */
enum { QG_ROWS = 8 };
void qg_rows_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                  size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy);
void qg_rows_avxvnni(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                     size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy);
void qg_rows_avx512vnni(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                        const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y,
                        int64_t ldy);

struct qg_kernels {
    qg_quant_fn quant_k;  /* K types' activation quantizer */
    qmm_quant_fn quant_0; /* the 32-element types' (qmm.h's) */
    qg_gemm_fn gemm;
    qg_layout layout; /* the panels gemm reads */
    qg_gemv_fn gemv;
    qg_gemv_fn rows; /* rows_min .. QG_ROWS rows at a time of rows_types (NULL: none) */
    int rows_min;
    unsigned rows_types; /* the types (bit t: cb_type t) qg_gemv gives it */
    int gemv_max_k;      /* the most rows of a K type a batch gives qg_gemv (more: panels) */
    int att8; /* attention's products in 8 bits too (cpu_attn.c), where they beat its f32 tiles */
    qg_decode_fn decode; /* the portable packer's */
    qg_pack_fn pack;     /* NULL: the portable packer (decode, interleave) */
    qg_interleave_fn interleave;
    const char *isa; /* the blocked kernels': "avx512vnni", "avx512", "avxvnni", "avx2" or "c" */
};

/* qg_gemv_fn's product through k: QG_ROWS activation rows at a time by
 * k->rows where it has one for t (while rows_min are left), the rest by
 * k->gemv, 64 weight rows at a time (every activation row then reads
 * them from cache) */
void qg_gemv(const qg_kernels *k, cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
             const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy);

/* The ISAs, in order of preference: the set this CPU runs (bit i for
 * QG_ISA_i; asks CPUID once) and the best of them. */
enum { QG_ISA_C, QG_ISA_AVX2, QG_ISA_AVXVNNI, QG_ISA_AVX512, QG_ISA_AVX512VNNI };
unsigned qg_cpu_isas(void);
int qg_cpu_isa(void);

/* The kernels of isa (QG_ISA_*; one the CPU lacks: its best). */
void qg_select_isa(int isa, qg_kernels *k);
/* simd 0: the portable kernels; 1: the best the CPU runs */
void qg_select(int simd, qg_kernels *k);

#endif
