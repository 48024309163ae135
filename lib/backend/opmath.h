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
CB_OP float cb_op_swiglu(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* GELU, tanh form (ggml_gelu's formula):
 * 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) */
CB_OP float cb_op_gelu(float x)
{
    const float c = 0.79788456080286535588f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * x * (1.0f + 0.044715f * x * x)));
}

/* gelu(g) * u */
CB_OP float cb_op_geglu(float g, float u)
{
    return cb_op_gelu(g) * u;
}

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

#endif
