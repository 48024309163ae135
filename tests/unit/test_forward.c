/* test_forward.c - the forward pass against a slow plain-loop reference
 * written here (double precision, token by token, no BLAS, no backend),
 * on the tiny fixture models in every tensor type; and the engine's own
 * invariants: batched prefill == token-by-token decoding, logits at position
 * j == logits of the prefix ending at j (the causal mask is exact), a layer
 * run on an explicit subset of rows == the same layer on all rows. */
#include "cbcore.h"
#include "test.h"

#include <math.h>

/* ------------------------------------------------------ reference model */

typedef struct ref {
    int n_layer, d, H, Hkv, hd, ff, n_vocab, n_rot;
    double base, eps;
    int neox;
    float *embd, *out_norm, *output;
    float **bq, **bk, **bv; /* qwen2 biases, else NULL entries */
    float **attn_norm, **ffn_norm, **wq, **wk, **wv, **wo, **wg, **wu, **wd;
} ref;

static float *ref_tensor(const cb_gguf *g, const char *name, int64_t *n_el)
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

static float **ref_layers_kind(const cb_gguf *g, int n_layer, const char *what, const char *kind)
{
    float **a = calloc((size_t)n_layer, sizeof *a);
    char name[96];
    for (int l = 0; l < n_layer; l++) {
        snprintf(name, sizeof name, "blk.%d.%s.%s", l, what, kind);
        a[l] = ref_tensor(g, name, NULL);
    }
    return a;
}

static float **ref_layers(const cb_gguf *g, int n_layer, const char *what)
{
    return ref_layers_kind(g, n_layer, what, "weight");
}

/* metadata "<arch>.<key>" */
static double hp(const cb_gguf *g, const char *key, double def)
{
    char k[128];
    cb_strview a = cb_gguf_str(g, "general.architecture");
    snprintf(k, sizeof k, "%.*s.%s", (int)a.len, a.data, key);
    return cb_gguf_float_or(g, k, def);
}

static int ref_load(ref *r, const char *path)
{
    cb_gguf *g;
    cb_error err;
    if (cb_gguf_open(&g, path, &err) != CB_OK) {
        printf("# %s\n", err.msg);
        return -1;
    }
    r->n_layer = (int)hp(g, "block_count", 0);
    r->d = (int)hp(g, "embedding_length", 0);
    r->H = (int)hp(g, "attention.head_count", 0);
    r->Hkv = (int)hp(g, "attention.head_count_kv", r->H);
    r->hd = r->d / r->H;
    r->n_rot = (int)hp(g, "rope.dimension_count", r->hd);
    r->ff = (int)hp(g, "feed_forward_length", 0);
    r->base = hp(g, "rope.freq_base", 10000.0);
    r->eps = hp(g, "attention.layer_norm_rms_epsilon", 1e-5);
    r->neox = cb_strview_eq(cb_gguf_str(g, "general.architecture"), "qwen2");
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

static void ref_free(ref *r)
{
    float ***all[] = {&r->attn_norm, &r->ffn_norm, &r->wq, &r->wk, &r->wv, &r->wo, &r->wg, &r->wu, &r->wd,
                      &r->bq, &r->bk, &r->bv};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        for (int l = 0; l < r->n_layer; l++)
            free((*all[k])[l]);
        free(*all[k]);
    }
    if (r->output != r->embd)
        free(r->output);
    free(r->embd);
    free(r->out_norm);
}

/* y[o] = sum_i W[o*n_in + i] x[i] */
static void ref_matvec(const float *W, const double *x, double *y, int n_in, int n_out)
{
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++)
            s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

static void ref_rmsnorm(const double *x, const float *g, double *y, int d, double eps)
{
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++)
        y[i] = x[i] * s * g[i];
}

/* "normal" pairs (2i, 2i+1); neox pairs (i, i + n_rot/2) */
static void ref_rope(double *v, int n_heads, int hd, int n_rot, int pos, double base, int neox)
{
    for (int h = 0; h < n_heads; h++) {
        double *x = v + h * hd;
        for (int i = 0; i < n_rot / 2; i++) {
            double th = pos * pow(base, -2.0 * i / n_rot);
            int ia = neox ? i : 2 * i, ib = neox ? i + n_rot / 2 : 2 * i + 1;
            double a = x[ia], b = x[ib];
            x[ia] = a * cos(th) - b * sin(th);
            x[ib] = a * sin(th) + b * cos(th);
        }
    }
}

static void add_bias(double *y, const float *b, int n)
{
    for (int i = 0; b && i < n; i++)
        y[i] += b[i];
}

/* logits [n, n_vocab] for every position of tokens[0..n), positions 0..n-1 */
static void ref_forward(const ref *r, const int32_t *tokens, int n, double *logits)
{
    int d = r->d, dkv = r->Hkv * r->hd;
    double *K = calloc((size_t)r->n_layer * n * dkv, sizeof(double));
    double *V = calloc((size_t)r->n_layer * n * dkv, sizeof(double));
    double *x = malloc(sizeof(double) * d), *xn = malloc(sizeof(double) * d), *q = malloc(sizeof(double) * d);
    double *att = malloc(sizeof(double) * d), *tmp = malloc(sizeof(double) * (r->ff > d ? r->ff : d));
    double *gt = malloc(sizeof(double) * r->ff), *up = malloc(sizeof(double) * r->ff);
    double *sc = malloc(sizeof(double) * n);
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < d; i++)
            x[i] = r->embd[(size_t)tokens[t] * d + i];
        for (int l = 0; l < r->n_layer; l++) {
            double *Kl = K + (size_t)l * n * dkv, *Vl = V + (size_t)l * n * dkv;
            ref_rmsnorm(x, r->attn_norm[l], xn, d, r->eps);
            ref_matvec(r->wq[l], xn, q, d, d);
            ref_matvec(r->wk[l], xn, Kl + (size_t)t * dkv, d, dkv);
            ref_matvec(r->wv[l], xn, Vl + (size_t)t * dkv, d, dkv);
            add_bias(q, r->bq[l], d);
            add_bias(Kl + (size_t)t * dkv, r->bk[l], dkv);
            add_bias(Vl + (size_t)t * dkv, r->bv[l], dkv);
            ref_rope(q, r->H, r->hd, r->n_rot, t, r->base, r->neox);
            ref_rope(Kl + (size_t)t * dkv, r->Hkv, r->hd, r->n_rot, t, r->base, r->neox);
            for (int h = 0; h < r->H; h++) {
                int kh = h / (r->H / r->Hkv);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int c = 0; c < r->hd; c++)
                        s += q[h * r->hd + c] * Kl[(size_t)j * dkv + kh * r->hd + c];
                    sc[j] = s / sqrt((double)r->hd);
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                for (int j = 0; j <= t; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                for (int c = 0; c < r->hd; c++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += sc[j] / sum * Vl[(size_t)j * dkv + kh * r->hd + c];
                    att[h * r->hd + c] = o;
                }
            }
            ref_matvec(r->wo[l], att, tmp, d, d);
            for (int i = 0; i < d; i++)
                x[i] += tmp[i];
            ref_rmsnorm(x, r->ffn_norm[l], xn, d, r->eps);
            ref_matvec(r->wg[l], xn, gt, d, r->ff);
            ref_matvec(r->wu[l], xn, up, d, r->ff);
            for (int i = 0; i < r->ff; i++)
                gt[i] = gt[i] / (1.0 + exp(-gt[i])) * up[i];
            ref_matvec(r->wd[l], gt, tmp, r->ff, d);
            for (int i = 0; i < d; i++)
                x[i] += tmp[i];
        }
        ref_rmsnorm(x, r->out_norm, xn, d, r->eps);
        ref_matvec(r->output, xn, logits + (size_t)t * r->n_vocab, d, r->n_vocab);
    }
    free(K), free(V), free(x), free(xn), free(q), free(att), free(tmp), free(gt), free(up), free(sc);
}

/* max |a - b| / max |b| */
static double rel_err(const float *a, const double *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        md = e > md ? e : md;
        mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
    }
    return md / (mb > 0 ? mb : 1);
}

static double rel_err_f(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        md = e > md ? e : md;
        mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
    }
    return md / (mb > 0 ? mb : 1);
}

#define N_TOK 40

static void test_fixture(const char *type)
{
    char path[1024];
    const char *tmp = getenv("CB_TEST_TMP");
    cb_model *m = NULL;
    cb_error err;
    ref r = {0};

    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmp ? tmp : "tests/tmp", type);
    if (!strcmp(type, "qwen2")) /* a qwen2 model: Q/K/V biases, NEOX RoPE */
        snprintf(path, sizeof path, "%s/tiny-qwen2.gguf", tmp ? tmp : "tests/tmp");
    tcase("forward %s: all positions' logits match the plain-loop reference", type);
    if (cb_model_load(&m, path, NULL, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    if (ref_load(&r, path) != 0) {
        CHECK(0);
        cb_model_free(m);
        return;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    int nv = hp->n_vocab;
    int32_t tok[N_TOK], pos[N_TOK];
    for (int i = 0; i < N_TOK; i++) {
        tok[i] = (int32_t)((i * 37 + 11) % nv);
        pos[i] = i;
    }
    double *want = malloc(sizeof(double) * N_TOK * nv);
    float *got = malloc(sizeof(float) * N_TOK * nv);
    ref_forward(&r, tok, N_TOK, want);

    for (int kvt = 0; kvt < 2; kvt++) {
        cb_kvcache *kv = NULL;
        cb_fwd *f = NULL;
        CHECK_OK(cb_kvcache_new(&kv, m, 64, kvt ? CB_TYPE_F16 : CB_TYPE_F32));
        CHECK_OK(cb_fwd_new(&f, m, N_TOK));
        if (!kv || !f)
            break;
        CHECK_OK(cb_fwd_embed(f, tok, pos, N_TOK));
        for (int l = 0; l < hp->n_layer; l++)
            CHECK_OK(cb_fwd_layer(f, kv, l, NULL, 0));
        CHECK_OK(cb_fwd_logits(f, NULL, N_TOK, got));
        double e = rel_err(got, want, (size_t)N_TOK * nv);
        double bound = kvt ? 5e-3 : 1e-4;
        CHECKF(e < bound, "kv %s: relative error %.3g >= %.1g", kvt ? "f16" : "f32", e, bound);
        printf("# %s, kv %s: max relative error vs reference %.2e\n", type, kvt ? "f16" : "f32", e);
        cb_fwd_free(f);
        cb_kvcache_free(kv);
    }

    tcase("forward %s: prefill == token-by-token decoding; causal mask exact", type);
    {
        cb_kvcache *kv = NULL, *kv2 = NULL;
        cb_fwd *f = NULL;
        float *last = malloc(sizeof(float) * nv), *step = malloc(sizeof(float) * nv);
        CHECK_OK(cb_kvcache_new(&kv, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_kvcache_new(&kv2, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_fwd_new(&f, m, 16)); /* batches of 16: exercises batch boundaries */
        CHECK_OK(cb_model_eval(f, kv, tok, N_TOK, 0, last));
        double worst = 0;
        for (int i = 0; i < N_TOK; i++) {
            CHECK_OK(cb_model_eval(f, kv2, tok + i, 1, i, step));
            /* the logits after token i are the reference's at position i */
            double e = rel_err(step, want + (size_t)i * nv, (size_t)nv);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst < 1e-4, "token-by-token vs reference: %.3g", worst);
        double e = rel_err_f(last, step, (size_t)nv);
        CHECKF(e < 1e-5, "prefill vs decode, last position: %.3g", e);
        printf("# %s: decode vs reference %.2e, prefill vs decode %.2e\n", type, worst, e);
        CHECK(cb_model_eval(f, kv, tok, 30, 40, last) == CB_ERR_RANGE); /* past the cache */
        free(last);
        free(step);
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        cb_kvcache_free(kv2);
    }

    tcase("forward %s: a layer on an explicit subset equals the same rows of a full run", type);
    {
        cb_kvcache *kv = NULL, *kv2 = NULL;
        cb_fwd *f = NULL, *f2 = NULL;
        int32_t rows[N_TOK];
        float *h1 = malloc(sizeof(float) * hp->n_embd), *h2 = malloc(sizeof(float) * hp->n_embd);
        CHECK_OK(cb_kvcache_new(&kv, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_kvcache_new(&kv2, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_fwd_new(&f, m, N_TOK));
        CHECK_OK(cb_fwd_new(&f2, m, N_TOK));
        /* f: full prefill.  f2: every layer in two calls, the lower half of
         * the positions first, then the upper half, each in descending
         * order.  The first call must not see the (still empty) cache rows
         * above its positions, and the second must see the first's keys:
         * only an exact causal mask gives the full run's states. */
        CHECK_OK(cb_fwd_embed(f, tok, pos, N_TOK));
        CHECK_OK(cb_fwd_embed(f2, tok, pos, N_TOK));
        int half = N_TOK / 2;
        for (int l = 0; l < hp->n_layer; l++) {
            CHECK_OK(cb_fwd_layer(f, kv, l, NULL, 0));
            for (int i = 0; i < half; i++)
                rows[i] = half - 1 - i;
            CHECK_OK(cb_fwd_layer(f2, kv2, l, rows, half));
            for (int i = 0; i < N_TOK - half; i++)
                rows[i] = N_TOK - 1 - i;
            CHECK_OK(cb_fwd_layer(f2, kv2, l, rows, N_TOK - half));
        }
        double worst = 0;
        for (int i = 0; i < N_TOK; i++) {
            cb_fwd_hidden(f, i, h1);
            cb_fwd_hidden(f2, i, h2);
            double e = rel_err_f(h2, h1, (size_t)hp->n_embd);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst < 1e-5, "subset vs full: %.3g", worst);
        int32_t bad = N_TOK;
        CHECK(cb_fwd_layer(f2, kv2, 0, &bad, 1) == CB_ERR_RANGE);
        CHECK(cb_fwd_layer(f2, kv2, hp->n_layer, NULL, 0) == CB_ERR_RANGE);
        free(h1);
        free(h2);
        cb_fwd_free(f);
        cb_fwd_free(f2);
        cb_kvcache_free(kv);
        cb_kvcache_free(kv2);
    }
    free(want);
    free(got);
    ref_free(&r);
    cb_model_free(m);
}

static void test_errors(void)
{
    const char *tmp = getenv("CB_TEST_TMP");
    char path[1024];
    cb_model *m = NULL;
    cb_error err;

    tcase("model: vocabulary-only file is rejected naming the missing tensor");
    snprintf(path, sizeof path, "%s/tiny-vocab.gguf", tmp ? tmp : "tests/tmp");
    CHECK(cb_model_load(&m, path, NULL, &err) == CB_ERR_FORMAT);
    CHECKF(strstr(err.msg, "token_embd.weight") != NULL, "%s", err.msg);

    tcase("model: unsupported architecture is named");
    cb_gguf_writer *w = cb_gguf_writer_new(0);
    cb_gguf_writer_set_str(w, "general.architecture", "mamba");
    snprintf(path, sizeof path, "%s/mamba.gguf", tmp ? tmp : "tests/tmp");
    CHECK_OK(cb_gguf_writer_save(w, path, &err));
    cb_gguf_writer_free(w);
    CHECK(cb_model_load(&m, path, NULL, &err) == CB_ERR_UNSUPPORTED);
    CHECKF(strstr(err.msg, "mamba") != NULL, "%s", err.msg);
    CHECK(m == NULL);

    /* fuzz_model: a 20 KB file claiming 10^9 layers made the loader size
     * its layer table (a GB-scale calloc) before looking for one tensor;
     * out of memory instead of malformed. */
    tcase("model: a layer count the file cannot hold is CB_ERR_FORMAT (fuzz finding)");
    size_t n = 0;
    char src[1024];
    snprintf(src, sizeof src, "%s/tiny-f32.gguf", tmp ? tmp : "tests/tmp");
    uint8_t *f = (uint8_t *)t_read_file(src, &n);
    uint8_t *k = f ? memmem(f, n, "llama.block_count", 17) : NULL;
    uint32_t type = 0, big = 1000000000;
    if (k)
        memcpy(&type, k + 17, 4);
    CHECK(k && type == CB_GGUF_UINT32);
    if (k && type == CB_GGUF_UINT32) {
        memcpy(k + 21, &big, 4);
        snprintf(path, sizeof path, "%s/layers.gguf", tmp ? tmp : "tests/tmp");
        FILE *o = fopen(path, "wb");
        CHECK(o && fwrite(f, 1, n, o) == n);
        if (o)
            fclose(o);
        CHECK(cb_model_load(&m, path, NULL, &err) == CB_ERR_FORMAT && m == NULL);
        CHECKF(strstr(err.msg, "block_count") != NULL, "%s", err.msg);
        remove(path);
    }
    free(f);
}

typedef struct dev_row {
    double d;
    int32_t row;
} dev_row;

static int by_dev(const void *a, const void *b)
{
    const dev_row *x = a, *y = b;
    if (x->d != y->d)
        return x->d < y->d ? 1 : -1;
    return (x->row > y->row) - (x->row < y->row);
}

/* cb_fwd_deviation against a plain loop over cb_fwd_layer_qkv and
 * cb_kvcache_read: the k rows whose fresh K or V is farthest from the
 * cache's, farthest first.  The cache rows are moved by different amounts
 * first, and the rows are asked for out of order. */
static void test_deviation(void)
{
    const char *tmp = getenv("CB_TEST_TMP");
    char path[1024];
    cb_model *m = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_error err;
    int32_t n = 24, toks[24], pos[24], rows[17], top[7];
    snprintf(path, sizeof path, "%s/tiny-f32.gguf", tmp ? tmp : "tests/tmp");
    for (int which = 0; which < 2; which++) {
        tcase("forward: cb_fwd_deviation picks the rows whose fresh %s deviates most (plain loop)",
              which ? "V" : "K");
        if (cb_model_load(&m, path, NULL, &err) != CB_OK) {
            CHECKF(0, "%s", err.msg);
            return;
        }
        const cb_hparams *hp = cb_model_hparams(m);
        int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
        CHECK_OK(cb_kvcache_new(&kv, m, 32, CB_TYPE_F16));
        CHECK_OK(cb_fwd_new(&f, m, n));
        for (int32_t i = 0; i < n; i++)
            toks[i] = (i * 37 + 11) % hp->n_vocab, pos[i] = i;
        CHECK_OK(cb_fwd_embed(f, toks, pos, n));
        CHECK_OK(cb_fwd_layer(f, kv, 0, NULL, 0));
        CHECK_OK(cb_fwd_layer(f, kv, 1, NULL, 0)); /* layer 1's cache = the fresh values */
        /* disturb some rows of layer 1's cache by different amounts */
        float *c = malloc(sizeof(float) * (size_t)(n * w)), *fresh = malloc(sizeof(float) * (size_t)(17 * w));
        CHECK_OK(cb_kvcache_read(kv, 1, which, 0, n, c));
        for (int32_t i = 0; i < n; i++)
            for (int64_t e = 0; e < w; e++)
                c[i * w + e] += (float)((i * 7) % 5) * 0.25f * (float)((e % 3) - 1);
        CHECK_OK(cb_kvcache_write(kv, 1, which, 0, n, c));
        CHECK_OK(cb_kvcache_read(kv, 1, which, 0, n, c)); /* as the cache holds them (f16) */
        for (int i = 0; i < 17; i++)
            rows[i] = (i * 5) % n; /* a scattered, unordered subset */
        CHECK_OK(cb_fwd_layer_qkv(f, 1, rows, 17, NULL, which ? NULL : fresh, which ? fresh : NULL));
        dev_row d[17];
        for (int i = 0; i < 17; i++) {
            double s = 0;
            for (int64_t e = 0; e < w; e++) {
                double x = (double)fresh[i * w + e] - c[rows[i] * w + e];
                s += x * x;
            }
            d[i] = (dev_row){(float)s, (int32_t)i};
        }
        qsort(d, 17, sizeof d[0], by_dev);
        CHECK_OK(cb_fwd_deviation(f, kv, 1, which, rows, 17, 7, top));
        for (int i = 0; i < 7; i++)
            CHECKF(top[i] == rows[d[i].row], "rank %d: row %d, expected %d", i, top[i], rows[d[i].row]);
        CHECK(cb_fwd_deviation(f, kv, 1, which, rows, 17, 18, top) == CB_ERR_RANGE);
        free(c), free(fresh);
        cb_fwd_free(f), cb_kvcache_free(kv), cb_model_free(m);
        f = NULL, kv = NULL, m = NULL;
    }
}

int main(void)
{
    static const char *types[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", "q4_1",
                                  "q5_0", "q5_1", "q4_K", "q5_K", "q6_K", "qwen2"};
    TEST_BEGIN();
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        test_fixture(types[i]);
    test_deviation();
    test_errors();
    TEST_END();
}
