/* qmm.c - the portable kernels of qmm.h and the run-time choice of kernels.
 *
 * Portable path: decode a chunk of a weight row with cb_dequant_row (the
 * reference decoding) into an L1-sized buffer, then dot it with each
 * activation row using eight partial sums (so that gcc vectorizes the
 * loop without reassociating a single sum). */
#include "qmm.h"

#include <string.h>

enum { CHUNK = 1024 }; /* elements: a multiple of every block size */

void qmm_dot_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, const float *x,
               int64_t ldx, int nr, int64_t o0, int64_t o1, float *y, int64_t ldy)
{
    float buf[CHUNK];
    nr = nr == QMM_ONE_PAIRED ? 1 : nr; /* a row's bits do not depend on nr here */
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = w + (size_t)o * row_bytes;
        float acc[QMM_ROWS] = {0};
        for (int64_t c0 = 0; c0 < n_in; c0 += CHUNK) {
            int64_t len = n_in - c0 < CHUNK ? n_in - c0 : CHUNK;
            cb_dequant_row(t, row + cb_type_row_bytes(t, c0), buf, len);
            for (int r = 0; r < nr; r++)
                acc[r] += qmm_dot8(buf, x + r * ldx + c0, len);
        }
        for (int r = 0; r < nr; r++)
            y[r * ldy + o] = acc[r];
    }
}

void qmm_rows_c(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in, int64_t o0, int64_t o1,
                float *dst)
{
    for (int64_t o = o0; o < o1; o++)
        cb_dequant_row(t, w + (size_t)o * row_bytes, dst + (o - o0) * n_in, n_in);
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* F16C by CPUID (leaf 1, ECX bit 29): clang's __builtin_cpu_supports does
 * not know "f16c".  Asked once: CPUID traps to the hypervisor in a virtual
 * machine, and every weight of a model loaded asks. */
int qmm_cpu_avx2(void)
{
    static int known = -1; /* a benign race: every thread computes the same */
    if (known < 0) {
        unsigned a, b, c, d;
        __builtin_cpu_init();
        known = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) &&
                __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
}
#else
int qmm_cpu_avx2(void) { return 0; }
int qmm_avx2_get(cb_type t, qmm_kernels *k)
{
    (void)t, (void)k;
    return 0;
}
float qmm_avx2_exp_sum(float *s, int64_t n, float m)
{
    (void)s, (void)n, (void)m;
    return 0;
}
void qmm_avx2_f16_row(const uint16_t *s, float *d, int64_t n) { (void)s, (void)d, (void)n; }
void qmm_avx2_swiglu(const float *g, const float *u, float *y, int64_t n)
{
    (void)g, (void)u, (void)y, (void)n;
}
#endif

int qmm_has_q8(cb_type t)
{
    switch (t) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1:
    case CB_TYPE_Q8_0:
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

int qmm_select(cb_type t, int simd, qmm_kernels *k)
{
    if (!cb_type_is_supported(t))
        return 0;
    if (simd && qmm_cpu_avx2() && qmm_avx2_get(t, k))
        return 1;
    k->dot = qmm_dot_c;
    k->rows = qmm_rows_c;
    k->quant = qmm_quant8_c;
    k->isa = "c";
    return 1;
}

const char *qmm_isa(int simd)
{
    qmm_kernels k;
    return simd && qmm_cpu_avx2() && qmm_avx2_get(CB_TYPE_Q4_0, &k) ? "avx2" : "c";
}

qmm_exp_sum_fn qmm_exp_sum(int simd) { return simd && qmm_cpu_avx2() ? qmm_avx2_exp_sum : NULL; }

qmm_f16_fn qmm_f16_row(int simd) { return simd && qmm_cpu_avx2() ? qmm_avx2_f16_row : NULL; }

qmm_swiglu_fn qmm_swiglu(int simd) { return simd && qmm_cpu_avx2() ? qmm_avx2_swiglu : NULL; }

qmm_att_qk_fn qmm_att_qk(int simd) { return simd && qmm_cpu_avx2() ? qmm_avx2_att_qk : NULL; }

qmm_att_pv_fn qmm_att_pv(int simd) { return simd && qmm_cpu_avx2() ? qmm_avx2_att_pv : NULL; }

qmm_quant_fn qmm_quant(int simd)
{
    qmm_kernels k;
    return qmm_select(CB_TYPE_Q8_0, simd, &k) ? k.quant : qmm_quant8_c;
}
