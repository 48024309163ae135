/* qgemm_avx512vnni.c - qgemm_avx512.c's kernel with vpdpbusd: 32-bit sums
 * of four products, vpmulld by the scales (that file says how it is built
 * and tested). */
#define QGT_VNNI 1
#include "qgemm_avx512.c"
