/* qgemm_rows.h - the products of a few activation rows (decoding several
 * sequences together, --batch; a blend's short batches) with the
 * activation rows in the vector lanes.  Each weight block is decoded once
 * to bytes; every four of its bytes, broadcast, meet the same four
 * activations of up to QGR_R rows in one 256-bit vpdpbusd (the activations
 * transposed to [group of four][row] a chunk of blocks at a time, once for
 * a tile of weight rows).  K types: a sub-block's 32-bit sums are
 * multiplied by its scale (vpmulld) into the block's exact integer sum per
 * row; then, every type, the block's fused multiply-adds of qg_gemm run in
 * the row lanes: the bits of qg_gemm and qg_gemv (qgemm.h's contract).
 * With AVX-512 (QGR_Z) a 512-bit vpdpbusd takes two groups of the eight
 * rows at once (each weight's two groups broadcast as one 64-bit value).
 * One integer instruction per 32 or 64 products, where the one-row
 * kernels' vpmaddubsw + vpmaddwd take two per 16 and decode each block
 * once per four rows (measured, bench_kernels rowprod, 8 rows, 1536 wide, 64
 * MB of weights, 2 threads, AVX-512 VNNI, GMAC/s: q4_K 335 against 156, q6_K
 * 260 against 143, q8_0 185 against 40, q5_0 168 against 146; 256-bit
 * products: q4_K 243, q6_K 221).
 *
 * Included by qgemm_avx512vnni.c (AVX-512 VNNI, QGR_Z), qgemm_avxvnni.c
 * (AVX-VNNI's 256 bits) and qgemm_avx2.c (vpdpbusd as vpmaddubsw +
 * vpmaddwd, exact for weights of up to 6 bits: not q8_0): the includer
 * defines QI (the intrinsics' prefix), DPB (vpdpbusd on 256 bits; DPBZ on
 * 512 with QGR_Z) and QGR_NAME (the entry point, qg_gemv_fn). */
#include "../core/dequant.h"

#include <string.h>

enum {
    QGR_R = 8,    /* activation rows: the lanes */
    QGR_GB = 8,   /* K blocks a chunk: its transposed activations stay in L1 (16 KB) */
    QGR_GB0 = 64, /* ... 32-element blocks */
    QGR_T = 256,  /* weight rows a tile: the chunk is transposed once for them */
    QGR_W = 8,    /* weight rows decoded together: each activation load serves eight, and
                     their eight chains of vpdpbusd hide its latency (measured with 256-bit
                     sums, seqs:8 on Qwen2.5-1.5B: 4 rows 104 tok/s, 4 rows of two chains
                     104-115, 8 rows 127, 8 of two chains 111, 16 rows 114) */
};

_Static_assert(QGR_W == 8 && QGR_R == 8, "a block's d of the eight weight rows is one vector");

typedef QI(__m256i) qgr_vi;
typedef QI(__m256) qgr_vf;

#define QGR_AI static inline __attribute__((always_inline))

/* The sums' vectors: 256 bits, a group of four products a lane; or with
 * QGR_Z (the includer's DPBZ: vpdpbusd on 512 bits), 512 bits, lanes 2r and
 * 2r+1 row r's two groups of a pair, folded at the block's end */
#ifndef QGR_Z
#define QGR_Z 0
#endif
#if QGR_Z
typedef QI(__m512i) qgr_va;
#define QGR_AN 2 /* groups a step */
#define QGR_AZERO QI(_mm512_setzero_si512)()
#define QGR_ALD(p) QI(_mm512_loadu_si512)((const void *)(p))
#define QGR_ADD QI(_mm512_add_epi32)
#define QGR_AMUL(v, c) QI(_mm512_mullo_epi32)(v, QI(_mm512_set1_epi32)(c))
#define QGR_ADPB(acc, p, x) DPBZ(acc, qgr_bc64(p), x)
#else
typedef QI(__m256i) qgr_va;
#define QGR_AN 1
#define QGR_AZERO QI(_mm256_setzero_si256)()
#define QGR_ALD(p) QI(_mm256_loadu_si256)((const void *)(p))
#define QGR_ADD QI(_mm256_add_epi32)
#define QGR_AMUL(v, c) QI(_mm256_mullo_epi32)(v, QI(_mm256_set1_epi32)(c))
#define QGR_ADPB(acc, p, x) DPB(acc, qgr_bc(p), x)
#endif
#define QGR_LD(p) QI(_mm256_loadu_si256)((const void *)(p))
#define QGR_ST(p, v) QI(_mm256_storeu_si256)((void *)(p), v)

/* A chunk of activation blocks, transposed: group g (elements 4g..4g+3 of
 * the chunk) of row r at q[g][r] (K types: 8 blocks of 64 groups; the
 * 32-element ones: 64 blocks of 8); each block's d per row; and the
 * integers the offsets need: q4_K/q5_K the bs32 pairs (2j, 2j+1) as two
 * int16, j < 4; q6_K the bs16 pairs, j < 8 (its -32 offsets);
 * the 32-element types each block's s, and 128 times its sum of q (q8_0's
 * weights come as w + 128). */
typedef struct qgr_x {
    int32_t q[512][QGR_R];
    float dx[64][QGR_R];
    union {
        int32_t bm[QGR_GB][8][QGR_R];
        struct {
            float sx[64][QGR_R];
            int32_t xs[64][QGR_R];
        } z;
    } u;
} qgr_x;

/* One weight block decoded: its integers (in 0..63), scales, offsets (as
 * int16 pairs) and d, dmin */
typedef struct qgr_blk {
    uint8_t q[256];
    int32_t sc[16];
    int32_t mn[8]; /* q4_K/q5_K: the mins (2j, 2j+1) as two int16; q6_K: the scales */
    float d, dmin;
} qgr_blk;

QGR_AI qgr_vi qgr_bc(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return QI(_mm256_set1_epi32)(v);
}

#if QGR_Z
QGR_AI qgr_va qgr_bc64(const void *p)
{
    long long v;
    memcpy(&v, p, 8);
    return QI(_mm512_set1_epi64)(v);
}

/* each row's two lanes added: lane r of the result */
QGR_AI qgr_vi qgr_fold(qgr_va v)
{
    return QI(_mm512_cvtepi64_epi32)(QI(_mm512_add_epi32)(v, QI(_mm512_srli_epi64)(v, 32)));
}
#else
#define qgr_fold(v) (v)
#endif

/* v[i] = lane i of each of v[0..7] (32-bit lanes): an 8 x 8 transpose */
QGR_AI void qgr_transpose(qgr_vi *v)
{
    qgr_vi t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = QI(_mm256_unpacklo_epi32)(v[i], v[i + 1]);
        t[i + 1] = QI(_mm256_unpackhi_epi32)(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = QI(_mm256_unpacklo_epi64)(t[i], t[i + 2]);
        u[i + 1] = QI(_mm256_unpackhi_epi64)(t[i], t[i + 2]);
        u[i + 2] = QI(_mm256_unpacklo_epi64)(t[i + 1], t[i + 3]);
        u[i + 3] = QI(_mm256_unpackhi_epi64)(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = QI(_mm256_permute2x128_si256)(u[i], u[i + 4], 0x20);
        v[i + 4] = QI(_mm256_permute2x128_si256)(u[i], u[i + 4], 0x31);
    }
}

/* Eight rows' 32 bytes v[r] into a chunk's layout at q: with 256-bit
 * products, group g (4 bytes) of every row together ([g][r]); with 512-bit
 * ones (QGR_Z), pair p of groups of every row together ([p][r][2]: one
 * vector holds two groups of the eight rows, met by a weight's two groups
 * broadcast as one 64-bit value) */
QGR_AI void qgr_put(qgr_vi *v, int32_t (*q)[QGR_R])
{
#if QGR_Z
    qgr_vi t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = QI(_mm256_unpacklo_epi64)(v[i], v[i + 1]);     /* pairs 0, 2 of rows i, i+1 */
        t[i + 1] = QI(_mm256_unpackhi_epi64)(v[i], v[i + 1]); /* pairs 1, 3 */
    }
    for (int h = 0; h < 2; h++) { /* pair h from the low halves, pair 2 + h from the high */
        QGR_ST(q[2 * h], QI(_mm256_permute2x128_si256)(t[h], t[2 + h], 0x20));
        QGR_ST(q[2 * h + 1], QI(_mm256_permute2x128_si256)(t[4 + h], t[6 + h], 0x20));
        QGR_ST(q[4 + 2 * h], QI(_mm256_permute2x128_si256)(t[h], t[2 + h], 0x31));
        QGR_ST(q[4 + 2 * h + 1], QI(_mm256_permute2x128_si256)(t[4 + h], t[6 + h], 0x31));
    }
#else
    qgr_transpose(v);
    for (int i = 0; i < 8; i++)
        QGR_ST(q[i], v[i]);
#endif
}

/* blocks b0 .. b0+nbc-1 of the nr rows x (ldx blocks apart) into t; the
 * lanes of missing rows are zero */
QGR_AI void qgr_load_x(const int kind, const qg_q8k *x, int64_t ldx, int nr, int64_t b0, int nbc,
                       qgr_x *t)
{
    for (int b = 0; b < nbc; b++) {
        const qg_q8k *xr[QGR_R];
        for (int r = 0; r < QGR_R; r++)
            xr[r] = r < nr ? x + r * ldx + b0 + b : NULL;
        for (int k = 0; k < 8; k++) {
            qgr_vi v[8];
            for (int r = 0; r < QGR_R; r++)
                v[r] = xr[r] ? QGR_LD(xr[r]->q + 32 * k) : QI(_mm256_setzero_si256)();
            qgr_put(v, &t->q[64 * b + 8 * k]);
        }
        for (int r = 0; r < QGR_R; r++) {
            t->dx[b][r] = xr[r] ? xr[r]->d : 0.0f;
            for (int j = 0; j < (kind == 6 ? 8 : 4); j++) {
                int32_t v = 0;
                if (xr[r])
                    memcpy(&v, (kind == 6 ? xr[r]->bs16 : xr[r]->bs32) + 2 * j, 4);
                t->u.bm[b][j][r] = v;
            }
        }
    }
}

/* qg_decode_c's integers, scales and offsets of one block, the integers
 * 32 at a time */
QGR_AI void qgr_decode(const int kind, const uint8_t *b, qgr_blk *o)
{
    const qgr_vi m4 = QI(_mm256_set1_epi8)(15);
    if (kind == 6) {
        const qgr_vi m2 = QI(_mm256_set1_epi8)(3);
        for (int n = 0; n < 2; n++) {
            qgr_vi la = QGR_LD(b + 64 * n), lb = QGR_LD(b + 64 * n + 32),
                   h = QGR_LD(b + 128 + 32 * n);
            for (int k = 0; k < 4; k++) {
                qgr_vi l = k & 1 ? lb : la;
                l = QI(_mm256_and_si256)(k & 2 ? QI(_mm256_srli_epi16)(l, 4) : l, m4);
                qgr_vi hh = QI(_mm256_and_si256)(QI(_mm256_srli_epi16)(h, 2 * k), m2);
                QGR_ST(o->q + 128 * n + 32 * k,
                       QI(_mm256_or_si256)(l, QI(_mm256_slli_epi16)(hh, 4)));
            }
        }
        QI(__m128i) sc = QI(_mm_loadu_si128)((const void *)(b + 192));
        QGR_ST(o->sc, QI(_mm256_cvtepi8_epi32)(sc));
        QGR_ST(o->sc + 8, QI(_mm256_cvtepi8_epi32)(QI(_mm_srli_si128)(sc, 8)));
        QGR_ST(o->mn, QI(_mm256_cvtepi8_epi16)(sc));
        o->d = cb_dq_d(b, 208), o->dmin = 0;
        return;
    }
    const uint8_t *qs = b + (kind == 5 ? 48 : 16);
    qgr_vi hb = kind == 5 ? QGR_LD(b + 16) : QI(_mm256_setzero_si256)();
    for (int p = 0; p < 4; p++) {
        qgr_vi v = QGR_LD(qs + 32 * p);
        qgr_vi lo = QI(_mm256_and_si256)(v, m4),
               hi = QI(_mm256_and_si256)(QI(_mm256_srli_epi16)(v, 4), m4);
        if (kind == 5) {
            const qgr_vi one = QI(_mm256_set1_epi8)(1);
            lo = QI(_mm256_or_si256)(
                lo, QI(_mm256_slli_epi16)(
                        QI(_mm256_and_si256)(QI(_mm256_srli_epi16)(hb, 2 * p), one), 4));
            hi = QI(_mm256_or_si256)(
                hi, QI(_mm256_slli_epi16)(
                        QI(_mm256_and_si256)(QI(_mm256_srli_epi16)(hb, 2 * p + 1), one), 4));
        }
        QGR_ST(o->q + 64 * p, lo);
        QGR_ST(o->q + 64 * p + 32, hi);
    }
    /* the twelve bytes of 6-bit scales and mins (cb_dq_scale_min), four at a time */
    uint32_t w0, w1, w2;
    memcpy(&w0, b + 4, 4), memcpy(&w1, b + 8, 4), memcpy(&w2, b + 12, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_lo = w1 & 0x3f3f3f3fu, m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u)
                                                                             << 4;
    QGR_ST(o->sc, QI(_mm256_cvtepu8_epi32)(QI(_mm_set_epi32)(0, 0, (int)sc_hi, (int)sc_lo)));
    QI(_mm_storeu_si128)
    ((void *)o->mn, QI(_mm_cvtepu8_epi16)(QI(_mm_set_epi32)(0, 0, (int)m_hi, (int)m_lo)));
    o->d = cb_dq_d(b, 0), o->dmin = cb_dq_d(b, 2);
}

/* block b of the QGR_W weight rows bk against the chunk's rows: their
 * exact integer sums, then qg_gemm's two fused multiply-adds a block, in
 * the row lanes of acc[w] */
QGR_AI void qgr_block(const int kind, const qgr_blk *bk, const qgr_x *t, int b, qgr_vf *acc)
{
    const int sub = kind == 6 ? 16 : 32;
    qgr_va is[QGR_W];
    for (int w = 0; w < QGR_W; w++)
        is[w] = QGR_AZERO;
        /* a sub-block at a time (unrolled, gcc spilled the sums: 0.8x) */
#pragma GCC unroll 1
    for (int s = 0; s < 256 / sub; s++) {
        qgr_va d[QGR_W];
        for (int w = 0; w < QGR_W; w++)
            d[w] = QGR_AZERO;
#pragma GCC unroll 8
        for (int g = s * sub / 4; g < (s + 1) * sub / 4; g += QGR_AN) {
            qgr_va xg = QGR_ALD(t->q[64 * b + g]);
            for (int w = 0; w < QGR_W; w++)
                d[w] = QGR_ADPB(d[w], bk[w].q + 4 * g, xg);
        }
        for (int w = 0; w < QGR_W; w++)
            is[w] = QGR_ADD(is[w], QGR_AMUL(d[w], bk[w].sc[s]));
    }
    qgr_vf dx = QI(_mm256_loadu_ps)(t->dx[b]);
    for (int w = 0; w < QGR_W; w++) {
        /* the offsets: q4_K/q5_K sum_s m_s bs32_s, q6_K sum_s sc_s bs16_s (times -32) */
        qgr_vi m = QI(_mm256_setzero_si256)();
        for (int j = 0; j < (kind == 6 ? 8 : 4); j++)
            m = QI(_mm256_add_epi32)(m, QI(_mm256_madd_epi16)(QGR_LD(t->u.bm[b][j]),
                                                              QI(_mm256_set1_epi32)(bk[w].mn[j])));
        qgr_vi i = qgr_fold(is[w]);
        if (kind == 6)
            i = QI(_mm256_sub_epi32)(i, QI(_mm256_slli_epi32)(m, 5));
        acc[w] = QI(_mm256_fmadd_ps)(QI(_mm256_cvtepi32_ps)(i),
                                     QI(_mm256_mul_ps)(QI(_mm256_set1_ps)(bk[w].d), dx), acc[w]);
        if (kind != 6)
            acc[w] =
                QI(_mm256_fnmadd_ps)(QI(_mm256_cvtepi32_ps)(m),
                                     QI(_mm256_mul_ps)(QI(_mm256_set1_ps)(bk[w].dmin), dx), acc[w]);
    }
}

/* ---------------------------------------------- the 32-element types */

QGR_AI void qgr_load_x0(const int kind, const qmm_q8 *x, int64_t ldx, int nr, int64_t b0, int nbc,
                        qgr_x *t)
{
    for (int b = 0; b < nbc; b++) {
        qgr_vi v[8];
        for (int r = 0; r < QGR_R; r++)
            v[r] = r < nr ? QGR_LD(x[r * ldx + b0 + b].q) : QI(_mm256_setzero_si256)();
        for (int r = 0; r < QGR_R && kind == 80; r++) {
            /* 128 times each row's sum of q: its bytes times ones */
            int32_t l[8];
            QGR_ST(l, DPB(QI(_mm256_setzero_si256)(), QI(_mm256_set1_epi8)(1), v[r]));
            t->u.z.xs[b][r] = 128 * (l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7]);
        }
        qgr_put(v, &t->q[8 * b]);
        for (int r = 0; r < QGR_R; r++) {
            t->dx[b][r] = r < nr ? x[r * ldx + b0 + b].d : 0.0f;
            t->u.z.sx[b][r] = r < nr ? x[r * ldx + b0 + b].s : 0.0f;
        }
    }
}

/* byte j = 16 where bit j of x is set (the q5 types' fifth bits) */
QGR_AI qgr_vi qgr_bits16(uint32_t x)
{
    const qgr_vi shuf = QI(_mm256_setr_epi8)(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                             2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const qgr_vi bit = QI(_mm256_set1_epi64x)((long long)0x8040201008040201ULL);
    qgr_vi v = QI(_mm256_shuffle_epi8)(QI(_mm256_set1_epi32)((int)x), shuf);
    return QI(_mm256_and_si256)(QI(_mm256_cmpeq_epi8)(QI(_mm256_and_si256)(v, bit), bit),
                                QI(_mm256_set1_epi8)(16));
}

/* eight f16 values as f32 (exact) */
QGR_AI qgr_vf qgr_cvtph(const uint16_t *h)
{
#ifdef QG_EMULATE /* SIMDe 0.7.4 has no vcvtph2ps */
    float f[8];
    for (int i = 0; i < 8; i++)
        f[i] = cb_dq_f16(h[i]);
    return QI(_mm256_loadu_ps)(f);
#else
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
#endif
}

/* a block's 32 integers as unsigned bytes (qmm_group8's; q8_0's plus 128) */
QGR_AI void qgr_decode0(const int kind, const uint8_t *b, uint8_t *q)
{
    qgr_vi v;
    if (kind == 80) {
        v = QI(_mm256_xor_si256)(QGR_LD(b + 2), QI(_mm256_set1_epi8)((char)0x80));
    } else {
        const int o = kind == 40 ? 2 : kind == 41 ? 4 : kind == 50 ? 6 : 8;
        QI(__m128i) h = QI(_mm_loadu_si128)((const void *)(b + o));
        v = QI(_mm256_and_si256)(QI(_mm256_set_m128i)(QI(_mm_srli_epi16)(h, 4), h),
                                 QI(_mm256_set1_epi8)(15));
        if (kind == 50 || kind == 51) {
            uint32_t qh;
            memcpy(&qh, b + o - 4, 4);
            v = QI(_mm256_or_si256)(v, qgr_bits16(qh));
        }
    }
    QGR_ST(q, v);
}

/* block b of the QGR_W weight rows (their blocks of this chunk at row[i])
 * against the chunk's rows, into acc: the K types decode each weight
 * block to bytes and scales for qgr_block; the 32-element types here */
QGR_AI void qgr_wblock(const int kind, const uint8_t *const *row, size_t rb, size_t bb, int b,
                       const qgr_x *t, qgr_vf *acc)
{
    if (kind < 10) {
        qgr_blk bk[QGR_W] __attribute__((aligned(32)));
        for (int i = 0; i < QGR_W; i++) {
            /* the next rows' block, while these compute (a block may
             * touch one line more than its size) */
            const char *nx = (const char *)row[i] + QGR_W * rb + (size_t)b * bb;
            for (size_t l = 0; l < bb; l += 64)
                __builtin_prefetch(nx + l);
            __builtin_prefetch(nx + bb - 1);
            qgr_decode(kind, row[i] + (size_t)b * bb, &bk[i]);
        }
        qgr_block(kind, bk, t, b, acc);
        return;
    }
    uint8_t q[QGR_W][32] __attribute__((aligned(32)));
    uint16_t dh[8] = {0}, mh[8] = {0};
    float dw[8], bw[8];
    for (int i = 0; i < QGR_W; i++) {
        const uint8_t *blk = row[i] + (size_t)b * bb;
        __builtin_prefetch(blk + QGR_W * rb);
        qgr_decode0(kind, blk, q[i]);
        memcpy(&dh[i], blk, 2);
        if (kind == 41 || kind == 51)
            memcpy(&mh[i], blk + 2, 2);
    }
    qgr_vf dv = qgr_cvtph(dh), bv;
    if (kind == 40 || kind == 50) /* qmm_group8's -8 d, -16 d */
        bv = QI(_mm256_mul_ps)(QI(_mm256_set1_ps)(kind == 40 ? -8.0f : -16.0f), dv);
    else if (kind == 80)
        bv = QI(_mm256_setzero_ps)();
    else
        bv = qgr_cvtph(mh);
    QI(_mm256_storeu_ps)(dw, dv);
    QI(_mm256_storeu_ps)(bw, bv);
    qgr_va d[QGR_W];
    for (int i = 0; i < QGR_W; i++)
        d[i] = QGR_AZERO;
    for (int g = 0; g < 8; g += QGR_AN) {
        qgr_va xg = QGR_ALD(t->q[8 * b + g]);
        for (int i = 0; i < QGR_W; i++)
            d[i] = QGR_ADPB(d[i], q[i] + 4 * g, xg);
    }
    qgr_vf dx = QI(_mm256_loadu_ps)(t->dx[b]), sx = QI(_mm256_loadu_ps)(t->u.z.sx[b]);
    for (int i = 0; i < QGR_W; i++) {
        qgr_vi di = qgr_fold(d[i]);
        if (kind == 80)
            di = QI(_mm256_sub_epi32)(di, QGR_LD(t->u.z.xs[b]));
        acc[i] = QI(_mm256_fmadd_ps)(QI(_mm256_cvtepi32_ps)(di),
                                     QI(_mm256_mul_ps)(QI(_mm256_set1_ps)(dw[i]), dx), acc[i]);
        acc[i] = QI(_mm256_fmadd_ps)(QI(_mm256_set1_ps)(bw[i]), sx, acc[i]);
    }
}

/* W rows [o0, o1) against nr <= QGR_R activation rows xq (ldxq bytes
 * apart): kind 4, 5, 6 the K types; 40, 41, 50, 51, 80 the others */
QGR_AI void qgr_rows(const int kind, const uint8_t *w, size_t rb, int64_t n_in, const uint8_t *xq,
                     size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    const int kq = kind < 10, gb = kq ? QGR_GB : QGR_GB0;
    const size_t bb = kind == 4    ? 144
                      : kind == 5  ? 176
                      : kind == 6  ? 210
                      : kind == 40 ? 18
                      : kind == 41 ? 20
                      : kind == 50 ? 22
                      : kind == 51 ? 24
                                   : 34;
    const int64_t nb = n_in / (kq ? 256 : 32);
    qgr_x t __attribute__((aligned(32)));
    float acc[QGR_T][QGR_R] __attribute__((aligned(32)));
    for (int64_t ot = o0; ot < o1; ot += QGR_T) {
        int64_t ot1 = ot + QGR_T < o1 ? ot + QGR_T : o1;
        for (int64_t b0 = 0; b0 < nb; b0 += gb) {
            int nbc = nb - b0 < gb ? (int)(nb - b0) : gb;
            if (kq)
                qgr_load_x(kind, (const qg_q8k *)(const void *)xq, (int64_t)(ldxq / sizeof(qg_q8k)),
                           nr, b0, nbc, &t);
            else
                qgr_load_x0(kind, (const qmm_q8 *)(const void *)xq,
                            (int64_t)(ldxq / sizeof(qmm_q8)), nr, b0, nbc, &t);
            for (int64_t o = ot; o < ot1; o += QGR_W) {
                const uint8_t *row[QGR_W];
                qgr_vf a[QGR_W];
                for (int i = 0; i < QGR_W; i++) {
                    /* a tile's missing last rows repeat its last, not stored */
                    row[i] = w + (size_t)(o + i < ot1 ? o + i : ot1 - 1) * rb + (size_t)b0 * bb;
                    a[i] = b0 == 0 ? QI(_mm256_setzero_ps)() : QI(_mm256_loadu_ps)(acc[o - ot + i]);
                }
                for (int b = 0; b < nbc; b++)
                    qgr_wblock(kind, row, rb, bb, b, &t, a);
                for (int i = 0; i < QGR_W; i++)
                    QI(_mm256_storeu_ps)(acc[o - ot + i], a[i]);
            }
        }
        for (int64_t o = ot; o < ot1; o++)
            for (int r = 0; r < nr; r++)
                y[r * ldy + o] = acc[o - ot][r];
    }
}

void QGR_NAME(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const uint8_t *xq,
              size_t ldxq, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
#define QGR_CASE(T, K) \
    case T: qgr_rows(K, w, row_bytes, n_in, xq, ldxq, nr, o0, o1, y, ldy); break;
    switch (t) {
        QGR_CASE(CB_TYPE_Q4_K, 4)
        QGR_CASE(CB_TYPE_Q5_K, 5)
        QGR_CASE(CB_TYPE_Q6_K, 6)
        QGR_CASE(CB_TYPE_Q4_0, 40)
        QGR_CASE(CB_TYPE_Q4_1, 41)
        QGR_CASE(CB_TYPE_Q5_0, 50)
        QGR_CASE(CB_TYPE_Q5_1, 51)
        QGR_CASE(CB_TYPE_Q8_0, 80)
    default: break;
    }
#undef QGR_CASE
}
