/* qgemm_avx512vnni.c - qgemm_avx512.c's kernel with vpdpbusd: 32-bit sums
 * of four products, vpmulld by the scales (that file says how it is built
 * and tested). */
#define QGT_VNNI 1
#include "qgemm_avx512.c"

/* and the few-row kernel of qgemm_rows.h, its sums on 512 bits */
#if defined(__x86_64__) || defined(__i386__) || defined(QG_EMULATE)
#ifdef QG_EMULATE
#define QGR_NAME qg_rows_avx512vnni_emu
#else
#define QGR_NAME qg_rows_avx512vnni
#endif
#define DPB(acc, w, x) QI(_mm256_dpbusd_epi32)(acc, w, x)
#define DPBZ(acc, w, x) QI(_mm512_dpbusd_epi32)(acc, w, x)
#define QGR_Z 1
#include "qgemm_rows.h"
#endif
