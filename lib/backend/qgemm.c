/* qgemm.c - the blocked 8-bit products (qgemm.h): the panel packers, the
 * portable activation quantizer and kernel, and the run-time choice.
 *
 * A packed panel of P rows (the layout's p) is a sequence of blocks, one
 * per weight block of the rows (256 elements for K-quants, 32 otherwise),
 * each laid out as (offsets in qgemm.h's QG_OFF_*)
 *   K types   w    int8 [8 sub-blocks][8 chunks][P rows][4]     256 P B
 *                  (element 32s + 4k + e of row i at ((s*8 + k)*P + i)*4 + e)
 *             sc   [S][P rows] of 4 bytes: each row's scale as the int16
 *                  pair (sc, sc) vpmaddwd sums, or as int32 (sc32, for
 *                  vpmulld); S = 8 (q4_K, q5_K) or 16 (q6_K, per 16)
 *             mn   int16 [S/2][P rows][2]: (m_2p, m_2p+1) for q4_K/q5_K;
 *                  (32 sc_2p, 32 sc_2p+1) for q6_K (its -32 offset)
 *             d    f32 [P], dmin f32 [P]
 *   32-types  w    int8 [8 chunks][P rows][4]                      32 P B
 *             d    f32 [P], b f32 [P]                               8 P B
 * Rows past the panel's last are zero (they compute zeros, never stored). */
#include "qgemm.h"

#include "../core/dequant.h"

#include <math.h>
#include <string.h>

int qg_has(cb_type t) { return qmm_has_q8(t); }

/* qg_gemv's use of the few-row kernel (qgemm_rows.h): from 5 rows (bench_kernels
 * rowprod, 64 MB of weights, 2 threads, AVX-512 VNNI, GMAC/s against the one-row
 * kernel: q4_K at 4 rows 172 against 147, q6_K 130 against 138, q5_0 88
 * against 147; at 5 rows 210/137, 165/125, 110/117; at 8 335/156, 260/143,
 * 168/146); and for the types where it was ahead in cb_fwd_decode of 8
 * sequences (bench_engine seqs:8:512): the K-quants, q8_0 (Qwen2.5-0.5B
 * 170 tok/s without, 245 with), q5_0, q5_1; not q4_0, q4_1 (SmolLM2-135M
 * 468 with, 500 without; rowprod q4_1 at 8 rows 168 against 183) */
#ifndef QG_ROWS_MIN
#define QG_ROWS_MIN 5
#endif
#define QG_ROWS_TYPES                                                                    \
    (1u << CB_TYPE_Q4_K | 1u << CB_TYPE_Q5_K | 1u << CB_TYPE_Q6_K | 1u << CB_TYPE_Q8_0 | \
     1u << CB_TYPE_Q5_0 | 1u << CB_TYPE_Q5_1)
/* ... and of its AVX2 form (vpmaddubsw + vpmaddwd for vpdpbusd; also what
 * AVX-512BW machines run): from 7 rows, on the K-quants (bench_engine
 * seqs:S:512, Qwen2.5-Coder-1.5B, AVX2 on a Zen 3, tok/s against the one-row
 * kernel: 5 sequences 31.6-32.9 against 34.5-37.5, 6 41.1-41.2 against
 * 41.9-42.0, 7 48.7-49.0 against 44.1-45.7, 8 49.1-51.5 against 43.4-44.1;
 * Qwen2.5-Coder-0.5B, whose q5_0 and q8_0 weights are most of its products,
 * 8 sequences 106-111 either way) */
#define QG_ROWS_MIN_AVX2 7
#define QG_ROWS_TYPES_AVX2 (1u << CB_TYPE_Q4_K | 1u << CB_TYPE_Q5_K | 1u << CB_TYPE_Q6_K)
/* The most rows of the K types qg_gemv takes in a batch (cpu.c; more go
 * through packed panels): 24 with the VNNI few-row kernel (measured,
 * Qwen2.5-1.5B, AVX-512 VNNI, bench_engine: batch:24 143-154 rows/s
 * against panels' 130-136, batch:32 144-155 against 154); 12 with the
 * AVX2 form and the one-row kernel (AVX2 on a Zen 3, batch:N:2048 three
 * runs each: the one-row kernel at 16 rows 37.2-37.9 against panels'
 * 41.3-43.6, at 24 39.4 against 50.9, at 12 28-35 either way; the AVX2
 * few-row kernel at 16 rows 43.5-44.5 against panels' 44.4-44.9) */
enum { QG_GEMV_MAX_K_VNNI = 24, QG_GEMV_MAX_K = 12 };

int qg_is_k(cb_type t) { return t == CB_TYPE_Q4_K || t == CB_TYPE_Q5_K || t == CB_TYPE_Q6_K; }

/* the offsets of a packed block's parts, for the C kernel's 8 rows */
enum {
    QGK_W = 0,
    QGK_SC = QG_OFF_K_SC * QG_P,
    QGK45_MN = QG_OFF_K45_MN * QG_P,
    QGK45_D = QG_OFF_K45_D * QG_P,
    QGK6_MN = QG_OFF_K6_MN * QG_P,
    QGK6_D = QG_OFF_K6_D * QG_P,
    QG0_W = 0,
    QG0_D = QG_OFF_0_D * QG_P,
    QG0_B = QG_OFF_0_B * QG_P,
};

/* bytes of one packed block of p rows */
static size_t block_bytes(cb_type t, int p)
{
    return (size_t)p * (t == CB_TYPE_Q6_K ? QG_OFF_K6_BYTES
                        : qg_is_k(t)      ? QG_OFF_K45_BYTES
                                          : QG_OFF_0_BYTES);
}

size_t qg_act_bytes(cb_type t, int64_t n_in)
{
    return qg_is_k(t) ? sizeof(qg_q8k) * (size_t)(n_in / 256)
                      : sizeof(qmm_q8) * (size_t)(n_in / 32);
}

size_t qg_panel_bytes(cb_type t, int64_t n_in, int p)
{
    return block_bytes(t, p) * (size_t)(n_in / (qg_is_k(t) ? 256 : 32));
}

/* ------------------------------------------------------------- packing */

static void put_f32(uint8_t *p, int i, float v) { memcpy(p + 4 * i, &v, 4); }

static void put_i16x2(uint8_t *p, int i, int v0, int v1)
{
    int16_t s[2] = {(int16_t)v0, (int16_t)v1};
    memcpy(p + 4 * i, s, 4);
}

/* a sub-block scale in the layout's form */
static void put_sc(uint8_t *p, int i, int v, qg_layout l)
{
    if (l.sc32) {
        int32_t w = v;
        memcpy(p + 4 * i, &w, 4);
    } else {
        put_i16x2(p, i, v, v);
    }
}

void qg_decode_c(cb_type t, const uint8_t *b, int8_t *q, qg_scales *o)
{
    if (t == CB_TYPE_Q6_K) {
        const int8_t *sc = (const int8_t *)b + 192;
        for (int n = 0; n < 2; n++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++)
                    q[128 * n + 32 * k + l] =
                        (int8_t)(((b[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) |
                                 ((b[128 + 32 * n + l] >> (2 * k)) & 3) << 4);
        /* element j's scale is sc[j / 16] (ggml: element 128n + 32k + l
         * takes scales[8n + 2k + l/16]) */
        for (int k = 0; k < 16; k++)
            o->sc[k] = sc[k], o->mn[k] = (int16_t)(32 * sc[k]);
        o->d = cb_dq_d(b, 208), o->dmin = 0;
    } else if (qg_is_k(t)) {
        int k5 = t == CB_TYPE_Q5_K, sc, m;
        const uint8_t *qs = b + (k5 ? 48 : 16);
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 32; j++) {
                q[64 * p + j] = (int8_t)(qs[32 * p + j] & 15);
                q[64 * p + 32 + j] = (int8_t)(qs[32 * p + j] >> 4);
            }
        for (int s = 0; k5 && s < 8; s++)
            for (int j = 0; j < 32; j++)
                q[32 * s + j] = (int8_t)(q[32 * s + j] | ((b[16 + j] >> s) & 1) << 4);
        for (int s = 0; s < 8; s++) {
            cb_dq_scale_min(s, b + 4, &sc, &m);
            o->sc[s] = (int16_t)sc, o->mn[s] = (int16_t)m;
        }
        o->d = cb_dq_d(b, 0), o->dmin = cb_dq_d(b, 2);
    } else {
        int16_t w[32];
        qmm_group8(t, b, 0, w, &o->d, &o->dmin);
        for (int j = 0; j < 32; j++)
            q[j] = (int8_t)w[j];
    }
}

/* a decoded block of row i into a packed block's scale parts (layout l) */
static void pack_scales(cb_type t, const qg_scales *k, int i, uint8_t *dst, qg_layout l)
{
    int p = l.p;
    if (t == CB_TYPE_Q6_K) {
        for (int s = 0; s < 16; s++)
            put_sc(dst + (QG_OFF_K_SC + 4 * s) * p, i, k->sc[s], l);
        for (int j = 0; j < 8; j++)
            put_i16x2(dst + (QG_OFF_K6_MN + 4 * j) * p, i, k->mn[2 * j], k->mn[2 * j + 1]);
        put_f32(dst + QG_OFF_K6_D * p, i, k->d);
        put_f32(dst + (QG_OFF_K6_D + 4) * p, i, 0.0f);
    } else if (qg_is_k(t)) {
        for (int s = 0; s < 8; s++)
            put_sc(dst + (QG_OFF_K_SC + 4 * s) * p, i, k->sc[s], l);
        for (int j = 0; j < 4; j++)
            put_i16x2(dst + (QG_OFF_K45_MN + 4 * j) * p, i, k->mn[2 * j], k->mn[2 * j + 1]);
        put_f32(dst + QG_OFF_K45_D * p, i, k->d);
        put_f32(dst + (QG_OFF_K45_D + 4) * p, i, k->dmin);
    } else {
        put_f32(dst + QG_OFF_0_D * p, i, k->d);
        put_f32(dst + QG_OFF_0_B * p, i, k->dmin);
    }
}

/* dst [n/4][p][4] = q [p][n], four bytes at a time */
void qg_interleave_c(const int8_t *q, int n, int p, uint8_t *dst)
{
    for (int c = 0; c < n / 4; c++)
        for (int i = 0; i < p; i++)
            memcpy(dst + (c * p + i) * 4, q + i * n + 4 * c, 4);
}

void qg_pack(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int nr,
             uint8_t *dst, const qg_kernels *k)
{
    enum { QBUF = 32768 }; /* the chunk's integers: in L1 until interleaved */
    if (k->pack) {
        k->pack(t, w, row_bytes, n_in, o0, nr, dst, k->layout);
        return;
    }
    qg_layout l = k->layout;
    int n = qg_is_k(t) ? 256 : 32, ch = QBUF / (n * l.p);
    int64_t nb = n_in / n;
    size_t bb = block_bytes(t, l.p), wb = cb_type_row_bytes(t, n);
    int8_t q[QBUF];
    qg_scales sc;
    if (nr < l.p) {
        memset(dst, 0, bb * (size_t)nb);
        memset(q, 0, sizeof q);
    }
    /* each row read straight through a chunk of blocks (one stream the
     * hardware prefetches, with a hint ahead; block by block across the
     * rows it ran at 1-1.7 GB/s), then the chunk's blocks interleaved */
    for (int64_t b0 = 0; b0 < nb; b0 += ch) {
        int nbc = nb - b0 < ch ? (int)(nb - b0) : ch;
        for (int i = 0; i < nr; i++) {
            const uint8_t *row = w + (size_t)(o0 + i) * row_bytes + (size_t)b0 * wb;
            for (int b = 0; b < nbc; b++) {
                __builtin_prefetch(row + (size_t)b * wb + 2048);
                k->decode(t, row + (size_t)b * wb, q + (b * l.p + i) * n, &sc);
                pack_scales(t, &sc, i, dst + (size_t)(b0 + b) * bb, l);
            }
        }
        for (int b = 0; b < nbc; b++)
            k->interleave(q + b * l.p * n, n, l.p, dst + (size_t)(b0 + b) * bb);
    }
}

/* qg_gemm's sums for one activation row, from the GGUF blocks where they lie */
static void gemv_row_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                       const uint8_t *xq, int64_t o0, int64_t o1, float *y)
{
    int k = qg_is_k(t), q6 = t == CB_TYPE_Q6_K, n = k ? 256 : 32;
    int64_t nb = n_in / n;
    size_t wb = cb_type_row_bytes(t, n);
    struct {
        int8_t q[256];
    } blkq;
    qg_scales blk;
    for (int64_t o = o0; o < o1; o++) {
        float acc = 0;
        for (int64_t b = 0; b < nb; b++) {
            qg_decode_c(t, w + (size_t)o * row_bytes + (size_t)b * wb, blkq.q, &blk);
            if (k) {
                const qg_q8k *x = (const qg_q8k *)(const void *)xq + b;
                int sub = q6 ? 16 : 32;
                int32_t isum = 0, msum = 0;
                for (int s = 0; s < 256 / sub; s++) {
                    int32_t d = 0;
                    for (int j = s * sub; j < (s + 1) * sub; j++)
                        d += blkq.q[j] * x->q[j];
                    isum += blk.sc[s] * d;
                    msum += blk.mn[s] * (q6 ? x->bs16[s] : x->bs32[s]);
                }
                if (q6) {
                    acc = fmaf((float)(isum - msum), blk.d * x->d, acc);
                } else {
                    acc = fmaf((float)isum, blk.d * x->d, acc);
                    acc = fmaf(-(float)msum, blk.dmin * x->d, acc);
                }
            } else {
                const qmm_q8 *x = (const qmm_q8 *)(const void *)xq + b;
                int32_t isum = 0;
                for (int j = 0; j < 32; j++)
                    isum += blkq.q[j] * x->q[j];
                acc = fmaf((float)isum, blk.d * x->d, acc);
                acc = fmaf(blk.dmin, x->s, acc);
            }
        }
        y[o] = acc;
    }
}

void qg_gemv_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
               size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    for (int r = 0; r < nr; r++)
        gemv_row_c(t, w, row_bytes, n_in, xq + (size_t)r * ldxq, o0, o1, y + r * ldy);
}

/* ---------------------------------------------------------- activations */

void qg_quant8k_c(const float *x, int64_t n, qg_q8k *xq)
{
    for (int64_t g = 0; g < n / 256; g++, x += 256, xq++) {
        xq->d = qmm_quant_group(x, 256, xq->q);
        for (int s = 0; s < 16; s++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += xq->q[16 * s + j];
            xq->bs16[s] = (int16_t)sum;
        }
        for (int s = 0; s < 8; s++)
            xq->bs32[s] = (int16_t)(xq->bs16[2 * s] + xq->bs16[2 * s + 1]);
    }
}

/* -------------------------------------------------------------- kernel */

static float rd_f32(const uint8_t *p, int i)
{
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

static int rd_i16(const uint8_t *p, int k)
{
    int16_t v;
    memcpy(&v, p + 2 * k, 2);
    return v;
}

/* one activation row against the panel's row i: the sum the AVX2 kernel
 * makes in lane i, block by block, in the same order of f32 operations */
static float dot_k(cb_type t, const uint8_t *panel, int64_t nb, const qg_q8k *x, int i)
{
    size_t bb = block_bytes(t, QG_P);
    int q6 = t == CB_TYPE_Q6_K;
    float acc = 0;
    for (int64_t b = 0; b < nb; b++, x++) {
        const uint8_t *blk = panel + (size_t)b * bb;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 256; j += 4) {
            int32_t s4 = 0;
            for (int e = 0; e < 4; e++)
                s4 += blk[QGK_W + (((j / 32) * 8 + (j % 32) / 4) * QG_P + i) * 4 + e] * x->q[j + e];
            int sub = q6 ? j / 16 : j / 32;
            isum += rd_i16(blk + QGK_SC + 32 * sub, 2 * i) * s4;
        }
        const uint8_t *mn = blk + (q6 ? QGK6_MN : QGK45_MN);
        for (int p = 0; p < (q6 ? 8 : 4); p++) {
            const int16_t *bs = q6 ? x->bs16 : x->bs32;
            msum += rd_i16(mn + 32 * p, 2 * i) * bs[2 * p] +
                    rd_i16(mn + 32 * p, 2 * i + 1) * bs[2 * p + 1];
        }
        const uint8_t *dp = blk + (q6 ? QGK6_D : QGK45_D);
        if (q6) {
            acc = fmaf((float)(isum - msum), rd_f32(dp, i) * x->d, acc);
        } else {
            acc = fmaf((float)isum, rd_f32(dp, i) * x->d, acc);
            acc = fmaf(-(float)msum, rd_f32(dp + 32, i) * x->d, acc);
        }
    }
    return acc;
}

static float dot_0(const uint8_t *panel, int64_t nb, const qmm_q8 *x, int i)
{
    float acc = 0;
    for (int64_t b = 0; b < nb; b++, x++) {
        const uint8_t *blk = panel + (size_t)b * block_bytes(CB_TYPE_Q8_0, QG_P);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++)
            isum += (int8_t)blk[QG0_W + ((j / 4) * QG_P + i) * 4 + j % 4] * x->q[j];
        acc = fmaf((float)isum, rd_f32(blk + QG0_D, i) * x->d, acc);
        acc = fmaf(rd_f32(blk + QG0_B, i), x->s, acc);
    }
    return acc;
}

void qg_gemm_c(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq,
               int64_t n, int np, float *y, int64_t ldy)
{
    int k = qg_is_k(t);
    for (int64_t r = 0; r < n; r++) {
        const uint8_t *x = xq + (size_t)r * ldxq;
        for (int i = 0; i < np; i++)
            y[r * ldy + i] = k ? dot_k(t, panel, n_in / 256, (const qg_q8k *)(const void *)x, i)
                               : dot_0(panel, n_in / 32, (const qmm_q8 *)(const void *)x, i);
    }
}

/* ------------------------------------------------------------- choice */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* XCR0, the register state the OS saves (XGETBV 0; the caller knows OSXSAVE) */
static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

/* Asked once: CPUID traps to the hypervisor in a virtual machine.  By
 * CPUID leaf 7 and XCR0, not __builtin_cpu_supports, which compilers know
 * for different feature names (clang 16 has no "avxvnni"). */
unsigned qg_cpu_isas(void)
{
    static int known = -1; /* a benign race: every thread computes the same */
    if (known < 0) {
        unsigned m = 1u << QG_ISA_C, a, b, c, d;
        if (qmm_cpu_avx2()) {
            m |= 1u << QG_ISA_AVX2;
            uint64_t x = 0;
            if (__get_cpuid(1, &a, &b, &c, &d) && (c & 1u << 27)) /* OSXSAVE */
                x = xcr0();
            int ymm = (x & 0x6) == 0x6,
                zmm = (x & 0xe6) == 0xe6; /* SSE+AVX; and opmask, ZMM state */
            if (ymm && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & 1u << 4)) /* AVX-VNNI */
                m |= 1u << QG_ISA_AVXVNNI;
            if (zmm && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & 1u << 16) &&
                (b & 1u << 30) && (b & 1u << 31)) { /* AVX-512 F, BW, VL */
                m |= 1u << QG_ISA_AVX512;
                if (c & 1u << 11) /* AVX512_VNNI */
                    m |= 1u << QG_ISA_AVX512VNNI;
            }
        }
        known = (int)m;
    }
    return (unsigned)known;
}
#else
unsigned qg_cpu_isas(void) { return 1u << QG_ISA_C; }
void qg_quant8k_avx2(const float *x, int64_t n, qg_q8k *xq) { qg_quant8k_c(x, n, xq); }
void qg_interleave_avx2(const int8_t *q, int n, int p, uint8_t *dst)
{
    qg_interleave_c(q, n, p, dst);
}
void qg_decode_avx2(cb_type t, const uint8_t *b, int8_t *q, qg_scales *s)
{
    qg_decode_c(t, b, q, s);
}
void qg_pack_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int nr,
                  uint8_t *dst, qg_layout l)
{
    (void)t, (void)w, (void)row_bytes, (void)n_in, (void)o0, (void)nr, (void)dst, (void)l;
}
void qg_gemv_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                  size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    qg_gemv_c(t, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy);
}
#define NO_X86(NAME)                                                                         \
    void NAME(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq, \
              int64_t n, int np, float *y, int64_t ldy)                                      \
    {                                                                                        \
        qg_gemm_c(t, panel, n_in, xq, ldxq, n, np, y, ldy);                                  \
    }
void qg_rows_avx2(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                  size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    qg_gemv_c(t, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy);
}
void qg_rows_avxvnni(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
                     size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    qg_gemv_c(t, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy);
}
void qg_rows_avx512vnni(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                        const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y,
                        int64_t ldy)
{
    qg_gemv_c(t, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy);
}
NO_X86(qg_gemm_avx2)
NO_X86(qg_gemm_avxvnni)
NO_X86(qg_gemm_avx512)
NO_X86(qg_gemm_avx512vnni)
#endif

void qg_select_isa(int isa, qg_kernels *k)
{
    static const struct {
        qg_gemm_fn gemm;
        qg_layout layout;
        const char *name;
    } g[] = {
        [QG_ISA_C] = {qg_gemm_c, {QG_P, 0}, "c"},
        [QG_ISA_AVX2] = {qg_gemm_avx2, {QG_P, 0}, "avx2"},
        [QG_ISA_AVXVNNI] = {qg_gemm_avxvnni, {QG_P, 1}, "avxvnni"},
        [QG_ISA_AVX512] = {qg_gemm_avx512, {QG_PMAX, 0}, "avx512"},
        [QG_ISA_AVX512VNNI] = {qg_gemm_avx512vnni, {QG_PMAX, 1}, "avx512vnni"},
    };
    if (!(qg_cpu_isas() & 1u << isa))
        isa = qg_cpu_isa();
    k->gemm = g[isa].gemm;
    k->layout = g[isa].layout;
    k->isa = g[isa].name;
    k->quant_k = isa == QG_ISA_C ? qg_quant8k_c : qg_quant8k_avx2;
    k->gemv = isa == QG_ISA_C ? qg_gemv_c : qg_gemv_avx2;
    k->interleave = isa == QG_ISA_C ? qg_interleave_c : qg_interleave_avx2;
    k->decode = isa == QG_ISA_C ? qg_decode_c : qg_decode_avx2;
    k->pack = isa == QG_ISA_C ? NULL : qg_pack_avx2;
    k->quant_0 = qmm_quant(isa != QG_ISA_C);
    int vnni = isa == QG_ISA_AVX512VNNI || isa == QG_ISA_AVXVNNI,
        dot = vnni || isa == QG_ISA_C; /* a dot product an instruction, or the portable kernels */
    k->rows = isa == QG_ISA_AVX512VNNI ? qg_rows_avx512vnni
              : isa == QG_ISA_AVXVNNI  ? qg_rows_avxvnni
              : isa == QG_ISA_C        ? NULL
                                       : qg_rows_avx2;
    k->rows_min = vnni ? QG_ROWS_MIN : QG_ROWS_MIN_AVX2;
    k->rows_types = vnni ? QG_ROWS_TYPES : QG_ROWS_TYPES_AVX2;
    k->gemv_max_k = dot ? QG_GEMV_MAX_K_VNNI : QG_GEMV_MAX_K;
    /* 8-bit attention where a dot-product instruction takes the products:
     * on AVX2 (an AMD Zen 3, 2 threads) the f32 tiles were faster, by
     * packing the keys and values less and by the keys' second part more
     * (bench_engine, Qwen2.5-Coder-1.5B: prefill 4,096 87.5 -> 96.4
     * tok/s, 16 rows over 2,048 cached 44.7 -> 58.8 rows/s; the 0.5B:
     * 16 rows 111.6 -> 148.4); AVX-512 without VNNI multiplies as AVX2
     * does, twice as wide, against OpenBLAS's f32 twice as wide too (not
     * measured).  The portable kernels keep it: where the tests run them,
     * they show its bits on any CPU. */
    k->att8 = dot;
}

void qg_gemv(const qg_kernels *k, cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
             const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    int r = 0;
    if (k->rows && nr >= k->rows_min && (unsigned)t < 32 && (k->rows_types >> t & 1)) {
        /* more than one chunk of rows: 128 weight rows at a time, which
         * the later chunks read from cache */
        int64_t tile = nr > QG_ROWS ? 128 : o1 - o0;
        int rn = 0;
        for (int64_t a = o0; a < o1; a += tile)
            for (rn = 0; nr - rn >= k->rows_min; rn += QG_ROWS)
                k->rows(t, w, row_bytes, n_in, xq + (size_t)rn * ldxq, ldxq,
                        nr - rn < QG_ROWS ? nr - rn : QG_ROWS, a, a + tile < o1 ? a + tile : o1,
                        y + rn * ldy, ldy);
        r = rn;
    }
    if (r < nr)
        for (int64_t a = o0; a < o1; a += 64)
            k->gemv(t, w, row_bytes, n_in, xq + (size_t)r * ldxq, ldxq, nr - r, a,
                    a + 64 < o1 ? a + 64 : o1, y + r * ldy, ldy);
}

int qg_cpu_isa(void)
{
    unsigned m = qg_cpu_isas();
    int best = QG_ISA_C;
    for (int i = QG_ISA_C; i <= QG_ISA_AVX512VNNI; i++)
        if (m & 1u << i)
            best = i;
    return best;
}

void qg_select(int simd, qg_kernels *k) { qg_select_isa(simd ? qg_cpu_isa() : QG_ISA_C, k); }
