/* qgemm_avx512.c - qgemm_tile.h's blocked kernel on AVX-512BW: 16 weight
 * rows a panel, vpmaddubsw into 16-bit sums, vpmaddwd by the scales; and,
 * included by qgemm_avx512vnni.c with QGT_VNNI 1, on AVX-512 VNNI:
 * vpdpbusd into 32-bit sums, vpmulld by the scales.  Compiled with
 * -mavx512f -mavx512bw -mavx512vl (-mavx512vnni) whatever the build's
 * -march; qg_select calls them only on a CPU that has them.  With
 * QG_EMULATE (tests/unit/test_qgemm.c's build) the same source runs on
 * SIMDe's portable intrinsics as qg_gemm_avx512[vnni]_emu, so that a
 * machine without AVX-512 tests it against the portable kernel. */
#if defined(__x86_64__) || defined(__i386__) || defined(QG_EMULATE)
#include "qgemm.h"

#ifndef QGT_VNNI
#define QGT_VNNI 0
#endif

#include <string.h>
#ifdef QG_EMULATE
#include <simde/x86/avx512.h>
#define QI(f) simde##f /* simde_mm512_add_epi32, simde__m512i, ... */
/* SIMDe 0.7.4 has no vcvtdq2ps of 16 lanes: the C conversion rounds as it does */
static inline simde__m512 cvt512(simde__m512i v)
{
    int32_t a[16];
    float f[16];
    simde_mm512_storeu_si512(a, v);
    for (int i = 0; i < 16; i++)
        f[i] = (float)a[i];
    return simde_mm512_loadu_ps(f);
}
#if QGT_VNNI
#define QGT_GEMM qg_gemm_avx512vnni_emu
#else
#define QGT_GEMM qg_gemm_avx512_emu
#endif
#define PIN(v) ((void)0)
#else
#include <immintrin.h>
#define QI(f) f
#define cvt512 _mm512_cvtepi32_ps
#if QGT_VNNI
#define QGT_GEMM qg_gemm_avx512vnni
#else
#define QGT_GEMM qg_gemm_avx512
#endif
/* keep v in a register (qgemm_avx2.c says why) */
#define PIN(v) __asm__("" : "+v"(v))
#endif

static inline __attribute__((always_inline)) QI(__m512i) bc32_512(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return QI(_mm512_set1_epi32)(v);
}

/* x with the sign of w (0 where w is 0 does not matter: |w| is 0 there) */
static inline __attribute__((always_inline)) QI(__m512i) sign512(QI(__m512i) x, QI(__m512i) w)
{
    return QI(_mm512_mask_sub_epi8)(x, QI(_mm512_movepi8_mask)(w), QI(_mm512_setzero_si512)(), x);
}

#define QGT_P 16
#ifndef QGT_R
#define QGT_R 8 /* activation rows a step: eight chains of products a weight load */
#endif
typedef QI(__m512i) vi;
typedef QI(__m512) vf;
#define VI_LD(p) QI(_mm512_loadu_si512)((const void *)(p))
#define VI_BC32(p) bc32_512(p)
#define VI_ZERO QI(_mm512_setzero_si512)()
#define VI_SET16(v) QI(_mm512_set1_epi16)(v)
#define VI_ADD16 QI(_mm512_add_epi16)
#define VI_ADD32 QI(_mm512_add_epi32)
#define VI_SUB32 QI(_mm512_sub_epi32)
#define VI_MADD QI(_mm512_madd_epi16)
#if QGT_VNNI
#define VI_DPBUSD QI(_mm512_dpbusd_epi32)
#define VI_MULLO QI(_mm512_mullo_epi32)
#define VI_SDOT(acc, w, x) QI(_mm512_dpbusd_epi32)(acc, QI(_mm512_abs_epi8)(w), sign512(x, w))
#else
#define VI_MADDUBS QI(_mm512_maddubs_epi16)
#define VI_SDOT(acc, w, x)                                                                       \
    QI(_mm512_add_epi32)                                                                         \
    (acc, QI(_mm512_madd_epi16)(QI(_mm512_maddubs_epi16)(QI(_mm512_abs_epi8)(w), sign512(x, w)), \
                                QI(_mm512_set1_epi16)(1)))
#endif
#define VF_LD(p) QI(_mm512_loadu_ps)((const void *)(p))
#define VF_ZERO QI(_mm512_setzero_ps)()
#define VF_SET1 QI(_mm512_set1_ps)
#define VF_MUL QI(_mm512_mul_ps)
#define VF_FMADD QI(_mm512_fmadd_ps)
#define VF_FNMADD QI(_mm512_fnmadd_ps)
#define VF_CVT cvt512
#define VF_ST(p, v) QI(_mm512_storeu_ps)(p, v)
#include "qgemm_tile.h"
#endif
