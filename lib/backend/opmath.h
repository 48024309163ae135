/* opmath.h - the per-element math of the backend operations, written once
 * for the CPU backend (cpu.c) and the CUDA kernels (lib/cuda/cuda.cu).  C99
 * that also compiles as CUDA: every function is CB_OP (host and device).
 * Reductions (the sums of RMSNorm, softmax, attention) are each backend's
 * own: their order differs, which the op-parity test bounds. */
#ifndef CB_OPMATH_H
#define CB_OPMATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CB_OP static __host__ __device__ __forceinline__
#else
#define CB_OP static inline
#endif

/* silu(g) * u */
CB_OP float cb_op_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* GELU, tanh form (ggml_gelu's formula):
 * 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) */
CB_OP float cb_op_gelu(float x)
{
    const float c = 0.79788456080286535588f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x)));
}

/* gelu(g) * u */
CB_OP float cb_op_geglu(float g, float u) { return cb_op_gelu(g) * u; }

/* RMSNorm's scale from the sum of squares of d values */
CB_OP float cb_op_rms_scale(double sum_sq, int64_t d, float eps)
{
    return (float)(1.0 / sqrt(sum_sq / (double)d + eps));
}

/* RoPE: the inverse frequency of pair i (< n_rot/2), base^(-2i/n_rot) */
CB_OP float cb_op_rope_freq(int i, int n_rot, float base)
{
    return powf(base, -2.0f * (float)i / (float)n_rot);
}

/* RoPE: the two dimensions of pair i inside a head: (2i, 2i+1) in the
 * "normal" (llama) pairing, (i, i + n_rot/2) in the neox (qwen2) one */
CB_OP void cb_op_rope_pair(int i, int n_rot, int neox, int *a, int *b)
{
    *a = neox ? i : 2 * i;
    *b = neox ? i + n_rot / 2 : 2 * i + 1;
}

/* RoPE: rotate (x0, x1) by the angle whose cosine and sine are c, s */
CB_OP void cb_op_rope_rotate(float *x0, float *x1, float c, float s)
{
    float a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = a * s + b * c;
}

/* topk's order, a total one on any input: does value a at index ia come
 * before value b at index ib?  Larger first, equal values by lower index,
 * NaN below every number (-inf included) and equal to every other NaN, so
 * that k = n ranks every element exactly once. */
CB_OP int cb_op_topk_before(float a, int64_t ia, float b, int64_t ib)
{
    int na = a != a, nb = b != b;
    if (na != nb)
        return nb; /* the number comes first */
    if (!na && a != b)
        return a > b;
    return ia < ib;
}

/* f16 matrix products (CUDA): the power-of-two exponent e that brings a
 * block of values whose largest magnitude is amax to amax 2^e in
 * [2^14, 2^15).  Every element then fits f16 (largest finite 65504) with a
 * bit to spare, and small ones move away from f16's subnormals; scaling by
 * 2^e is exact and is undone through the product's alpha.  e is clamped to
 * [-CB_F16_EXP_MAX, CB_F16_EXP_MAX] so that the alpha of two scaled
 * operands, 2^-(e1+e2), stays a normal f32: blocks with amax from 2^-45 to
 * 2^75 land exactly in range (beyond 2^75, 3.8e22, no model's activations
 * go).  amax 0, inf or NaN: 0 (a non-finite input gives non-finite
 * outputs, as on the CPU). */
#define CB_F16_EXP_MAX 60
CB_OP int cb_op_f16_scale_exp(float amax)
{
    int e;
    if (!(amax > 0.0f) || amax > 3.40282347e38f)
        return 0;
    frexpf(amax, &e); /* amax in [2^(e-1), 2^e) */
    e = 15 - e;
    return e < -CB_F16_EXP_MAX ? -CB_F16_EXP_MAX : e > CB_F16_EXP_MAX ? CB_F16_EXP_MAX : e;
}

#endif
