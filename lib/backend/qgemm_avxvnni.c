/* qgemm_avxvnni.c - qgemm_tile.h's blocked kernel on AVX-VNNI (the 256-bit
 * vpdpbusd of Alder Lake and later): 8 weight rows a panel, vpdpbusd into
 * 32-bit sums, vpmulld by the scales.  Compiled with -mavx2 -mfma
 * -mavxvnni whatever the build's -march; qg_select calls it only on a CPU
 * that has them.  With QG_EMULATE (tests/unit/test_qgemm_isa.c's build)
 * the same source runs on SIMDe's portable intrinsics as
 * qg_gemm_avxvnni_emu, so that a machine without AVX-VNNI tests it. */
#if defined(__x86_64__) || defined(__i386__) || defined(QG_EMULATE)
#include "qgemm.h"

#include <string.h>
#ifdef QG_EMULATE
#include <simde/x86/avx512.h>
#define QI(f) simde##f /* simde_mm512_add_epi32, simde__m512i, ... */
#define QGT_GEMM qg_gemm_avxvnni_emu
#define PIN(v) ((void)0)
/* AVX-VNNI's vpdpbusd computes what AVX512-VL's 256-bit one does */
#define DPBUSD256(acc, w, x) simde_mm256_dpbusd_epi32(acc, w, x) /* AVX512-VL's, the same */
#else
#include <immintrin.h>
#define QI(f) f
#define QGT_GEMM qg_gemm_avxvnni
/* keep v in a register (qgemm_avx2.c says why) */
#define PIN(v) __asm__("" : "+x"(v))
#define DPBUSD256(acc, w, x) _mm256_dpbusd_avx_epi32(acc, w, x)
#endif

static inline __attribute__((always_inline)) QI(__m256i) bc32_256(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return QI(_mm256_set1_epi32)(v);
}

#define QGT_P 8
#define QGT_VNNI 1
typedef QI(__m256i) vi;
typedef QI(__m256) vf;
#define VI_LD(p) QI(_mm256_loadu_si256)((const void *)(p))
#define VI_BC32(p) bc32_256(p)
#define VI_ZERO QI(_mm256_setzero_si256)()
#define VI_ADD32 QI(_mm256_add_epi32)
#define VI_SUB32 QI(_mm256_sub_epi32)
#define VI_MADD QI(_mm256_madd_epi16)
#define VI_DPBUSD DPBUSD256
#define VI_MULLO QI(_mm256_mullo_epi32)
/* |w| times x with w's sign */
#define VI_SDOT(acc, w, x) DPBUSD256(acc, QI(_mm256_sign_epi8)(w, w), QI(_mm256_sign_epi8)(x, w))
#define VF_LD(p) QI(_mm256_loadu_ps)((const void *)(p))
#define VF_ZERO QI(_mm256_setzero_ps)()
#define VF_SET1 QI(_mm256_set1_ps)
#define VF_MUL QI(_mm256_mul_ps)
#define VF_FMADD QI(_mm256_fmadd_ps)
#define VF_FNMADD QI(_mm256_fnmadd_ps)
#define VF_CVT QI(_mm256_cvtepi32_ps)
#define VF_ST(p, v) QI(_mm256_storeu_ps)(p, v)
#include "qgemm_tile.h"

/* and the few-row kernel of qgemm_rows.h */
#ifdef QG_EMULATE
#define QGR_NAME qg_rows_avxvnni_emu
#else
#define QGR_NAME qg_rows_avxvnni
#endif
#define DPB DPBUSD256
#include "qgemm_rows.h"
#endif
