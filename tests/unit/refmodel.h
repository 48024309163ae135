/* refmodel.h - the independent reference transformer: double precision,
 * token by token, plain loops, no BLAS and no backend, written from the
 * architectures' definitions (llama.cpp's graphs for llama, qwen2, qwen3,
 * gemma3) apart from the engine.  test_forward checks the engine against it
 * on every fixture; cb-ref-logits (tests/bench) gives `make parity` its
 * logits on a real model.  Header-only, static functions. */
#ifndef CB_TEST_REFMODEL_H
#define CB_TEST_REFMODEL_H

#include "../../lib/infer/infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

typedef struct ref {
    int n_layer, d, H, Hkv, hd, ff, n_vocab, n_rot;
    double base, eps;
    int neox;
    int gemma;       /* gemma3: embedding scale, GELU, sliding windows */
    int *window;     /* [n_layer]: 0 global, else the sliding window */
    double base_swa; /* RoPE base of the sliding-window layers */
    double *ff_div;  /* [n_rot/2] frequency divisors of the global layers, or NULL */
    float *embd, *out_norm, *output;
    float **bq, **bk, **bv; /* qwen2 biases, else NULL entries */
    float **attn_norm, **ffn_norm, **wq, **wk, **wv, **wo, **wg, **wu, **wd;
    float **q_norm, **k_norm, **post_attn, **post_ffn; /* qwen3/gemma3, else NULL entries */
} ref;

__attribute__((unused)) static float *ref_tensor(const cb_gguf *g, const char *name, int64_t *n_el)
{
    int64_t i = cb_gguf_find_tensor(g, name);
    cb_tensor_info ti;
    if (i < 0)
        return NULL;
    cb_gguf_tensor(g, i, &ti);
    int64_t n = ti.ne[0] * ti.ne[1];
    float *f = malloc(sizeof(float) * (size_t)n);
    size_t rb = cb_type_row_bytes(ti.type, ti.ne[0]);
    for (int64_t r = 0; r < ti.ne[1]; r++)
        cb_dequant_row(ti.type, (const uint8_t *)ti.data + r * rb, f + r * ti.ne[0], ti.ne[0]);
    if (n_el)
        *n_el = n;
    return f;
}

__attribute__((unused)) static float **ref_layers_kind(const cb_gguf *g, int n_layer,
                                                       const char *what, const char *kind)
{
    float **a = calloc((size_t)n_layer, sizeof *a);
    char name[96];
    for (int l = 0; l < n_layer; l++) {
        snprintf(name, sizeof name, "blk.%d.%s.%s", l, what, kind);
        a[l] = ref_tensor(g, name, NULL);
    }
    return a;
}

__attribute__((unused)) static float **ref_layers(const cb_gguf *g, int n_layer, const char *what)
{
    return ref_layers_kind(g, n_layer, what, "weight");
}

/* metadata "<arch>.<key>" */
__attribute__((unused)) static double ref_hp(const cb_gguf *g, const char *key, double def)
{
    char k[128];
    cb_strview a = cb_gguf_str(g, "general.architecture");
    snprintf(k, sizeof k, "%.*s.%s", (int)a.len, a.data, key);
    return cb_gguf_float_or(g, k, def);
}

__attribute__((unused)) static int ref_load(ref *r, const char *path)
{
    cb_gguf *g;
    cb_error err;
    if (cb_gguf_open(&g, path, &err) != CB_OK) {
        printf("# %s\n", err.msg);
        return -1;
    }
    cb_strview arch = cb_gguf_str(g, "general.architecture");
    r->n_layer = (int)ref_hp(g, "block_count", 0);
    r->d = (int)ref_hp(g, "embedding_length", 0);
    r->H = (int)ref_hp(g, "attention.head_count", 0);
    r->Hkv = (int)ref_hp(g, "attention.head_count_kv", r->H);
    r->hd = (int)ref_hp(g, "attention.key_length", r->d / r->H);
    r->n_rot = (int)ref_hp(g, "rope.dimension_count", r->hd);
    r->ff = (int)ref_hp(g, "feed_forward_length", 0);
    r->base = ref_hp(g, "rope.freq_base", 10000.0);
    r->eps = ref_hp(g, "attention.layer_norm_rms_epsilon", 1e-5);
    r->neox = !cb_strview_eq(arch, "llama");
    r->gemma = cb_strview_eq(arch, "gemma3");
    /* gemma3: layers 5, 11, 17, ... global, the others see the last
     * sliding_window keys, with RoPE base 10000 */
    r->window = calloc((size_t)r->n_layer, sizeof(int));
    r->base_swa = ref_hp(g, "rope.freq_base_swa", 10000.0);
    for (int l = 0; r->gemma && l < r->n_layer; l++)
        r->window[l] = (l + 1) % 6 ? (int)ref_hp(g, "attention.sliding_window", 0) : 0;
    /* RoPE scaling of the global layers: rope_freqs (Llama 3) and a linear factor */
    float *rf = cb_strview_eq(arch, "llama") ? ref_tensor(g, "rope_freqs.weight", NULL) : NULL;
    double lin = ref_hp(g, "rope.scaling.factor", 0.0);
    if (rf || lin != 0.0) {
        r->ff_div = malloc(sizeof(double) * (size_t)(r->n_rot / 2));
        for (int i = 0; i < r->n_rot / 2; i++)
            r->ff_div[i] = (rf ? rf[i] : 1.0) * (lin != 0.0 ? lin : 1.0);
    }
    free(rf);
    r->q_norm = ref_layers(g, r->n_layer, "attn_q_norm");
    r->k_norm = ref_layers(g, r->n_layer, "attn_k_norm");
    r->post_attn = ref_layers(g, r->n_layer, "post_attention_norm");
    r->post_ffn = ref_layers(g, r->n_layer, "post_ffw_norm");
    r->bq = ref_layers_kind(g, r->n_layer, "attn_q", "bias");
    r->bk = ref_layers_kind(g, r->n_layer, "attn_k", "bias");
    r->bv = ref_layers_kind(g, r->n_layer, "attn_v", "bias");
    int64_t ne;
    r->embd = ref_tensor(g, "token_embd.weight", &ne);
    r->n_vocab = (int)(ne / r->d);
    r->out_norm = ref_tensor(g, "output_norm.weight", NULL);
    r->output = ref_tensor(g, "output.weight", NULL);
    if (!r->output)
        r->output = r->embd; /* tied */
    r->attn_norm = ref_layers(g, r->n_layer, "attn_norm");
    r->ffn_norm = ref_layers(g, r->n_layer, "ffn_norm");
    r->wq = ref_layers(g, r->n_layer, "attn_q");
    r->wk = ref_layers(g, r->n_layer, "attn_k");
    r->wv = ref_layers(g, r->n_layer, "attn_v");
    r->wo = ref_layers(g, r->n_layer, "attn_output");
    r->wg = ref_layers(g, r->n_layer, "ffn_gate");
    r->wu = ref_layers(g, r->n_layer, "ffn_up");
    r->wd = ref_layers(g, r->n_layer, "ffn_down");
    cb_gguf_free(g);
    return 0;
}

__attribute__((unused)) static void ref_free(ref *r)
{
    float ***all[] = {&r->attn_norm, &r->ffn_norm, &r->wq,        &r->wk,      &r->wv, &r->wo,
                      &r->wg,        &r->wu,       &r->wd,        &r->bq,      &r->bk, &r->bv,
                      &r->q_norm,    &r->k_norm,   &r->post_attn, &r->post_ffn};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        for (int l = 0; l < r->n_layer; l++)
            free((*all[k])[l]);
        free(*all[k]);
    }
    if (r->output != r->embd)
        free(r->output);
    free(r->embd);
    free(r->out_norm);
    free(r->window);
    free(r->ff_div);
}

/* y[o] = sum_i W[o*n_in + i] x[i] */
__attribute__((unused)) static void ref_matvec(const float *W, const double *x, double *y, int n_in,
                                               int n_out)
{
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++)
            s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

__attribute__((unused)) static void ref_rmsnorm(const double *x, const float *g, double *y, int d,
                                                double eps)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++)
        y[i] = x[i] * s * g[i];
}

/* "normal" pairs (2i, 2i+1); neox pairs (i, i + n_rot/2); div: frequency
 * divisors or NULL */
__attribute__((unused)) static void ref_rope(double *v, int n_heads, int hd, int n_rot, int pos,
                                             double base, const double *div, int neox)
{
    for (int h = 0; h < n_heads; h++) {
        double *x = v + h * hd;
        for (int i = 0; i < n_rot / 2; i++) {
            double th = pos * pow(base, -2.0 * i / n_rot) / (div ? div[i] : 1.0);
            int ia = neox ? i : 2 * i, ib = neox ? i + n_rot / 2 : 2 * i + 1;
            double a = x[ia], b = x[ib];
            x[ia] = a * cos(th) - b * sin(th);
            x[ib] = a * sin(th) + b * cos(th);
        }
    }
}

__attribute__((unused)) static void add_bias(double *y, const float *b, int n)
{
    for (int i = 0; b && i < n; i++)
        y[i] += b[i];
}

/* logits [n, n_vocab] for every position of tokens[0..n), positions 0..n-1
 * (last_only: only the last position's, into logits[0..n_vocab)) */
__attribute__((unused)) static void ref_forward_at(const ref *r, const int32_t *tokens, int n,
                                                   double *logits, int last_only)
{
    int d = r->d, dq = r->H * r->hd, dkv = r->Hkv * r->hd;
    double *K = calloc((size_t)r->n_layer * n * dkv, sizeof(double));
    double *V = calloc((size_t)r->n_layer * n * dkv, sizeof(double));
    double *x = malloc(sizeof(double) * d), *xn = malloc(sizeof(double) * d),
           *q = malloc(sizeof(double) * dq);
    double *att = malloc(sizeof(double) * dq),
           *tmp = malloc(sizeof(double) * (r->ff > d ? r->ff : d));
    double *gt = malloc(sizeof(double) * r->ff), *up = malloc(sizeof(double) * r->ff);
    double *sc = malloc(sizeof(double) * n), *hn = malloc(sizeof(double) * r->hd);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < d; i++)
            x[i] = r->embd[(size_t)tokens[t] * d + i] * (r->gemma ? sqrt((double)d) : 1.0);
        for (int l = 0; l < r->n_layer; l++) {
            double *Kl = K + (size_t)l * n * dkv, *Vl = V + (size_t)l * n * dkv,
                   *kt = Kl + (size_t)t * dkv;
            ref_rmsnorm(x, r->attn_norm[l], xn, d, r->eps);
            ref_matvec(r->wq[l], xn, q, d, dq);
            ref_matvec(r->wk[l], xn, kt, d, dkv);
            ref_matvec(r->wv[l], xn, Vl + (size_t)t * dkv, d, dkv);
            add_bias(q, r->bq[l], dq);
            add_bias(kt, r->bk[l], dkv);
            add_bias(Vl + (size_t)t * dkv, r->bv[l], dkv);
            for (int h = 0; r->q_norm[l] && h < r->H; h++) { /* each head normalized on its own */
                ref_rmsnorm(q + h * r->hd, r->q_norm[l], hn, r->hd, r->eps);
                memcpy(q + h * r->hd, hn, sizeof(double) * (size_t)r->hd);
            }
            for (int h = 0; r->k_norm[l] && h < r->Hkv; h++) {
                ref_rmsnorm(kt + h * r->hd, r->k_norm[l], hn, r->hd, r->eps);
                memcpy(kt + h * r->hd, hn, sizeof(double) * (size_t)r->hd);
            }
            int win = r->window[l];
            double base = win ? r->base_swa : r->base;
            const double *div = win ? NULL : r->ff_div;
            ref_rope(q, r->H, r->hd, r->n_rot, t, base, div, r->neox);
            ref_rope(kt, r->Hkv, r->hd, r->n_rot, t, base, div, r->neox);
            int j0 = win && t - win + 1 > 0 ? t - win + 1 : 0; /* the window's first key */
            for (int h = 0; h < r->H; h++) {
                int kh = h / (r->H / r->Hkv);
                double mx = -1e300, sum = 0;
                for (int j = j0; j <= t; j++) {
                    double s = 0;
                    for (int c = 0; c < r->hd; c++)
                        s += q[h * r->hd + c] * Kl[(size_t)j * dkv + kh * r->hd + c];
                    sc[j] = s / sqrt((double)r->hd);
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                for (int j = j0; j <= t; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (int c = 0; c < r->hd; c++) {
                    double o = 0;
                    for (int j = j0; j <= t; j++)
                        o += sc[j] / sum * Vl[(size_t)j * dkv + kh * r->hd + c];
                    att[h * r->hd + c] = o;
                }
            }
            ref_matvec(r->wo[l], att, tmp, dq, d);
            if (r->post_attn[l]) {
                ref_rmsnorm(tmp, r->post_attn[l], xn, d, r->eps);
                memcpy(tmp, xn, sizeof(double) * (size_t)d);
            }
            for (int i = 0; i < d; i++)
                x[i] += tmp[i];
            ref_rmsnorm(x, r->ffn_norm[l], xn, d, r->eps);
            ref_matvec(r->wg[l], xn, gt, d, r->ff);
            ref_matvec(r->wu[l], xn, up, d, r->ff);
            for (int i = 0; i < r->ff; i++) {
                double g = gt[i];
                gt[i] = (r->gemma
                             ? 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)))
                             : g / (1.0 + exp(-g))) *
                        up[i];
            }
            ref_matvec(r->wd[l], gt, tmp, r->ff, d);
            if (r->post_ffn[l]) {
                ref_rmsnorm(tmp, r->post_ffn[l], xn, d, r->eps);
                memcpy(tmp, xn, sizeof(double) * (size_t)d);
            }
            for (int i = 0; i < d; i++)
                x[i] += tmp[i];
        }
        if (last_only && t < n - 1)
            continue;
        ref_rmsnorm(x, r->out_norm, xn, d, r->eps);
        ref_matvec(r->output, xn, logits + (size_t)(last_only ? 0 : t) * r->n_vocab, d, r->n_vocab);
    }
    free(K), free(V), free(x), free(xn), free(q), free(att), free(tmp), free(gt), free(up),
        free(sc), free(hn);
}

__attribute__((unused)) static void ref_forward(const ref *r, const int32_t *tokens, int n,
                                                double *logits)
{
    ref_forward_at(r, tokens, n, logits, 0);
}

#endif
