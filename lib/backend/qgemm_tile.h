/* qgemm_tile.h - the blocked 8-bit kernel of qgemm.h, written once for
 * every x86 vector ISA: included by qgemm_avx2.c, qgemm_avxvnni.c,
 * qgemm_avx512.c and qgemm_avx512vnni.c (and, through SIMDe's portable
 * intrinsics, by tests/unit/test_qgemm_isa.c), each of which defines first:
 *
 *   QGT_GEMM         the entry point's name (qg_gemm_avx2, ...)
 *   QGT_P            rows per panel = 32-bit lanes of a vector (8 or 16)
 *   QGT_VNNI         1: vpdpbusd (32-bit sums, vpmulld by the scales, the
 *                    layout's sc32); 0: vpmaddubsw (16-bit sums, vpmaddwd)
 *   vi, vf           the integer and float vector types
 *   VI_LD(p)  VI_BC32(p)  VI_ZERO  VI_ADD16  VI_ADD32  VI_SUB32  VI_MADD
 *   VI_MADDUBS(w, x) (QGT_VNNI 0)   VI_DPBUSD(acc, w, x)  VI_MULLO (1)
 *   VI_SDOT(acc, w, x)  acc + the 32-bit sums of four products of signed
 *                    bytes w, x per lane (q8_0's weights)
 *   VF_LD(p)  VF_ZERO  VF_SET1  VF_MUL  VF_FMADD  VF_FNMADD  VF_CVT
 *   VF_ST(p, v)      store P floats
 *   PIN(v)           keep v in a register (or nothing)
 *
 * The math is qgemm.h's, in its order: exact integer sums per block, then
 * per block fma(float(I), d_w * d_x, acc) (and fnmadd of the offsets'), so
 * every ISA gives the portable kernel's bits. */

#ifndef QGT_R
#define QGT_R QG_R /* activation rows a step */
#endif

#define QGT_K_BYTES(kind) ((kind) == 6 ? QG_OFF_K6_BYTES * QGT_P : QG_OFF_K45_BYTES * QGT_P)

/* the R rows' P results (lanes past np not stored) */
static inline __attribute__((always_inline)) void qgt_store(const vf *acc, int R, int np, float *y,
                                                            int64_t ldy)
{
    for (int r = 0; r < R; r++) {
        if (np == QGT_P) {
            VF_ST(y + r * ldy, acc[r]);
        } else {
            float t[QGT_P];
            VF_ST(t, acc[r]);
            memcpy(y + r * ldy, t, sizeof(float) * (size_t)np);
        }
    }
}

/* K-quant panel x R activation rows.  kind 4: q4_K, 5: q5_K, 6: q6_K
 * (scales per 16, the -32 in mn).  16-bit sums (QGT_VNNI 0) run over as
 * many chunks as cannot overflow: 4-bit weights 8 (2*15*127*8 < 32768),
 * 5-bit 4, 6-bit 2. */
static inline __attribute__((always_inline)) void qgt_tile_k(const int kind, const int R,
                                                             const uint8_t *panel, int64_t nb,
                                                             const uint8_t *x0, size_t ldx,
                                                             float *y, int64_t ldy, int np)
{
#if QGT_VNNI
    const int per = kind == 6 ? 4 : 8; /* a scale's chunks */
#else
    const int per = kind == 4 ? 8 : kind == 5 ? 4 : 2;
#endif
    vf acc[QGT_R];
    const qg_q8k *xr[QGT_R];
    for (int r = 0; r < R; r++) {
        acc[r] = VF_ZERO;
        xr[r] = (const qg_q8k *)(const void *)(x0 + (size_t)r * ldx);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * QGT_K_BYTES(kind);
        vi iacc[QGT_R];
        for (int r = 0; r < R; r++)
            iacc[r] = VI_ZERO;
        for (int s = 0; s < 8; s++) {
            const uint8_t *ws = blk + 32 * QGT_P * s;
            for (int k0 = 0; k0 < 8; k0 += per) {
                vi part[QGT_R];
                for (int r = 0; r < R; r++)
                    part[r] = VI_ZERO;
                for (int k = k0; k < k0 + per; k++) {
                    vi w = VI_LD(ws + 4 * QGT_P * k);
                    for (int r = 0; r < R; r++) {
#if QGT_VNNI
                        part[r] = VI_DPBUSD(part[r], w, VI_BC32(xr[r][b].q + 32 * s + 4 * k));
#else
                        part[r] =
                            VI_ADD16(part[r], VI_MADDUBS(w, VI_BC32(xr[r][b].q + 32 * s + 4 * k)));
#endif
                        PIN(part[r]);
                    }
                }
                /* q6_K: chunks 0-3 are sub-block 2s of 16, 4-7 are 2s+1 */
                vi sc =
                    VI_LD(blk + (QG_OFF_K_SC + 4 * (kind == 6 ? 2 * s + (k0 >= 4) : s)) * QGT_P);
                for (int r = 0; r < R; r++) {
#if QGT_VNNI
                    iacc[r] = VI_ADD32(iacc[r], VI_MULLO(part[r], sc));
#else
                    iacc[r] = VI_ADD32(iacc[r], VI_MADD(part[r], sc));
#endif
                    PIN(iacc[r]);
                }
            }
        }
        if (kind == 6) {
            for (int p = 0; p < 8; p++) {
                vi mn = VI_LD(blk + (QG_OFF_K6_MN + 4 * p) * QGT_P);
                for (int r = 0; r < R; r++) {
                    iacc[r] = VI_SUB32(iacc[r], VI_MADD(mn, VI_BC32(&xr[r][b].bs16[2 * p])));
                    PIN(iacc[r]);
                }
            }
            vf dv = VF_LD(blk + QG_OFF_K6_D * QGT_P);
            for (int r = 0; r < R; r++)
                acc[r] = VF_FMADD(VF_CVT(iacc[r]), VF_MUL(dv, VF_SET1(xr[r][b].d)), acc[r]);
        } else {
            vi mi[QGT_R];
            for (int r = 0; r < R; r++)
                mi[r] = VI_ZERO;
            for (int p = 0; p < 4; p++) {
                vi mn = VI_LD(blk + (QG_OFF_K45_MN + 4 * p) * QGT_P);
                for (int r = 0; r < R; r++) {
                    mi[r] = VI_ADD32(mi[r], VI_MADD(mn, VI_BC32(&xr[r][b].bs32[2 * p])));
                    PIN(mi[r]);
                }
            }
            vf dv = VF_LD(blk + QG_OFF_K45_D * QGT_P), mv = VF_LD(blk + (QG_OFF_K45_D + 4) * QGT_P);
            for (int r = 0; r < R; r++) {
                vf dx = VF_SET1(xr[r][b].d);
                acc[r] = VF_FMADD(VF_CVT(iacc[r]), VF_MUL(dv, dx), acc[r]);
                acc[r] = VF_FNMADD(VF_CVT(mi[r]), VF_MUL(mv, dx), acc[r]);
            }
        }
    }
    qgt_store(acc, R, np, y, ldy);
}

/* 32-element panel x R rows.  kind 4: 4-bit unsigned (16-bit sums of 8
 * chunks), 5: 5-bit (4), 8: q8_0's signed bytes (VI_SDOT) */
static inline __attribute__((always_inline)) void qgt_tile_0(const int kind, const int R,
                                                             const uint8_t *panel, int64_t nb,
                                                             const uint8_t *x0, size_t ldx,
                                                             float *y, int64_t ldy, int np)
{
#if !QGT_VNNI
    const vi ones = VI_SET16(1);
#endif
    vf acc[QGT_R];
    const qmm_q8 *xr[QGT_R];
    for (int r = 0; r < R; r++) {
        acc[r] = VF_ZERO;
        xr[r] = (const qmm_q8 *)(const void *)(x0 + (size_t)r * ldx);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = panel + (size_t)b * QG_OFF_0_BYTES * QGT_P;
        vi is[QGT_R];
        for (int r = 0; r < R; r++)
            is[r] = VI_ZERO;
        if (kind == 8) {
            for (int k = 0; k < 8; k++) {
                vi w = VI_LD(blk + 4 * QGT_P * k);
                for (int r = 0; r < R; r++) {
                    is[r] = VI_SDOT(is[r], w, VI_BC32(xr[r][b].q + 4 * k));
                    PIN(is[r]);
                }
            }
        } else {
#if QGT_VNNI
            for (int k = 0; k < 8; k++) {
                vi w = VI_LD(blk + 4 * QGT_P * k);
                for (int r = 0; r < R; r++) {
                    is[r] = VI_DPBUSD(is[r], w, VI_BC32(xr[r][b].q + 4 * k));
                    PIN(is[r]);
                }
            }
#else
            const int per = kind == 4 ? 8 : 4;
            for (int k0 = 0; k0 < 8; k0 += per) {
                vi a16[QGT_R];
                for (int r = 0; r < R; r++)
                    a16[r] = VI_ZERO;
                for (int k = k0; k < k0 + per; k++) {
                    vi w = VI_LD(blk + 4 * QGT_P * k);
                    for (int r = 0; r < R; r++) {
                        a16[r] = VI_ADD16(a16[r], VI_MADDUBS(w, VI_BC32(xr[r][b].q + 4 * k)));
                        PIN(a16[r]);
                    }
                }
                for (int r = 0; r < R; r++) {
                    is[r] = VI_ADD32(is[r], VI_MADD(a16[r], ones));
                    PIN(is[r]);
                }
            }
#endif
        }
        vf dv = VF_LD(blk + QG_OFF_0_D * QGT_P), bv = VF_LD(blk + QG_OFF_0_B * QGT_P);
        for (int r = 0; r < R; r++) {
            acc[r] = VF_FMADD(VF_CVT(is[r]), VF_MUL(dv, VF_SET1(xr[r][b].d)), acc[r]);
            acc[r] = VF_FMADD(bv, VF_SET1(xr[r][b].s), acc[r]);
        }
    }
    qgt_store(acc, R, np, y, ldy);
}

typedef void (*qgt_tile_fn)(const uint8_t *panel, int64_t nb, const uint8_t *x0, size_t ldx,
                            float *y, int64_t ldy, int np);

#define QGT_TILE(F, KIND, R)                                                                       \
    static void F##KIND##_##R(const uint8_t *p, int64_t nb, const uint8_t *x, size_t lx, float *y, \
                              int64_t ly, int np)                                                  \
    {                                                                                              \
        F(KIND, R, p, nb, x, lx, y, ly, np);                                                       \
    }
/* the row counts past four, where a step takes eight */
#if QGT_R == 8
#define QGT_TILES_8(F, KIND) \
    QGT_TILE(F, KIND, 5) QGT_TILE(F, KIND, 6) QGT_TILE(F, KIND, 7) QGT_TILE(F, KIND, 8)
#define QGT_TAB_8(F, KIND) , F##KIND##_5, F##KIND##_6, F##KIND##_7, F##KIND##_8
#else
#define QGT_TILES_8(F, KIND)
#define QGT_TAB_8(F, KIND)
#endif
#define QGT_TILES(F, KIND)                                                                      \
    QGT_TILE(F, KIND, 1)                                                                        \
    QGT_TILE(F, KIND, 2)                                                                        \
    QGT_TILE(F, KIND, 3)                                                                        \
    QGT_TILE(F, KIND, 4)                                                                        \
    QGT_TILES_8(F, KIND)                                                                        \
    static const qgt_tile_fn F##KIND[QGT_R + 1] = {NULL, F##KIND##_1, F##KIND##_2, F##KIND##_3, \
                                                   F##KIND##_4 QGT_TAB_8(F, KIND)};

QGT_TILES(qgt_tile_k, 4)
QGT_TILES(qgt_tile_k, 5)
QGT_TILES(qgt_tile_k, 6)
QGT_TILES(qgt_tile_0, 4)
QGT_TILES(qgt_tile_0, 5)
QGT_TILES(qgt_tile_0, 8)

void QGT_GEMM(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq, size_t ldxq,
              int64_t n, int np, float *y, int64_t ldy)
{
    const qgt_tile_fn *f;
    int64_t nb;
    switch (t) {
    case CB_TYPE_Q4_K: f = qgt_tile_k4, nb = n_in / 256; break;
    case CB_TYPE_Q5_K: f = qgt_tile_k5, nb = n_in / 256; break;
    case CB_TYPE_Q6_K: f = qgt_tile_k6, nb = n_in / 256; break;
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1: f = qgt_tile_04, nb = n_in / 32; break;
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1: f = qgt_tile_05, nb = n_in / 32; break;
    case CB_TYPE_Q8_0: f = qgt_tile_08, nb = n_in / 32; break;
    default: return;
    }
    for (int64_t r = 0; r < n; r += QGT_R) {
        int nr = n - r < QGT_R ? (int)(n - r) : QGT_R;
        f[nr](panel, nb, xq + (size_t)r * ldxq, ldxq, y + r * ldy, ldy, np);
    }
}
