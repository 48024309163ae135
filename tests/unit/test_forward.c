/* test_forward.c - the forward pass against a slow plain-loop reference
 * (refmodel.h: double precision, token by token, no BLAS, no backend),
 * on the tiny fixture models in every tensor type; and the engine's own
 * invariants: batched prefill == token-by-token decoding, logits at position
 * j == logits of the prefix ending at j (the causal mask is exact), a layer
 * run on an explicit subset of rows == the same layer on all rows, a
 * prefill's last layer as K/V only for rows whose output nobody reads ==
 * the whole layer. */
#include "../../lib/infer/diag.h"
#include "refmodel.h"
#include "test.h"

#include <math.h>

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

    /* a tensor type, or an architecture / RoPE scaling fixture (tests/run.sh) */
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmp ? tmp : "tests/tmp", type);
    tcase("forward %s: all positions' logits match the plain-loop reference", type);
    if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK) {
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
    CHECK(cb_model_load(&m, path, &T_EXACT, &err) == CB_ERR_FORMAT);
    CHECKF(strstr(err.msg, "token_embd.weight") != NULL, "%s", err.msg);

    tcase("model: unsupported architecture is named");
    cb_gguf_writer *w = cb_gguf_writer_new(0);
    cb_gguf_writer_set_str(w, "general.architecture", "mamba");
    snprintf(path, sizeof path, "%s/mamba.gguf", tmp ? tmp : "tests/tmp");
    CHECK_OK(cb_gguf_writer_save(w, path, &err));
    cb_gguf_writer_free(w);
    CHECK(cb_model_load(&m, path, &T_EXACT, &err) == CB_ERR_UNSUPPORTED);
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
        CHECK(cb_model_load(&m, path, &T_EXACT, &err) == CB_ERR_FORMAT && m == NULL);
        CHECKF(strstr(err.msg, "block_count") != NULL, "%s", err.msg);
        remove(path);
    }
    free(f);

    tcase("model: an unsupported RoPE scaling type is named");
    snprintf(path, sizeof path, "%s/tiny-yarn.gguf", tmp ? tmp : "tests/tmp");
    CHECK(cb_model_load(&m, path, &T_EXACT, &err) == CB_ERR_UNSUPPORTED);
    CHECKF(strstr(err.msg, "'yarn'") != NULL, "%s", err.msg);
    CHECK(m == NULL);

    tcase("model: gemma3's layers: windows, RoPE bases, scaling only on the global layers");
    snprintf(path, sizeof path, "%s/tiny-gemma3-linear.gguf", tmp ? tmp : "tests/tmp");
    if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    CHECK(hp->n_layer == 7 && hp->n_swa == 8 && hp->n_swa_layers == 6 && hp->rope_scale == 4.0f);
    for (int l = 0; l < hp->n_layer; l++) {
        CHECKF(cb_model_layer_window(m, l) == (l == 5 ? 0 : 8), "layer %d window %d", l,
               cb_model_layer_window(m, l));
        CHECK(cb_model_layer_rope_base(m, l) == (l == 5 ? 1e6f : 10000.0f));
    }
    cb_model_free(m);
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
        if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK) {
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
        float *c = malloc(sizeof(float) * (size_t)(n * w)),
              *fresh = malloc(sizeof(float) * (size_t)(17 * w));
        CHECK_OK(cb_kvcache_read(kv, 1, which, 0, n, c));
        for (int32_t i = 0; i < n; i++)
            for (int64_t e = 0; e < w; e++)
                c[i * w + e] += (float)((i * 7) % 5) * 0.25f * (float)((e % 3) - 1);
        CHECK_OK(cb_kvcache_write(kv, 1, which, 0, n, c));
        CHECK_OK(cb_kvcache_read(kv, 1, which, 0, n, c)); /* as the cache holds them (f16) */
        for (int i = 0; i < 17; i++)
            rows[i] = (i * 5) % n; /* a scattered, unordered subset */
        CHECK_OK(
            cb_fwd_layer_qkv(f, 1, rows, 17, NULL, which ? NULL : fresh, which ? fresh : NULL));
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
            CHECKF(top[i] == rows[d[i].row], "rank %d: row %d, expected %d", i, top[i],
                   rows[d[i].row]);
        CHECK(cb_fwd_deviation(f, kv, 1, which, rows, 17, 18, top) == CB_ERR_RANGE);
        free(c), free(fresh);
        cb_fwd_free(f), cb_kvcache_free(kv), cb_model_free(m);
        f = NULL, kv = NULL, m = NULL;
    }
}

/* The fixture model `name` (exact path), a 32-row f16 cache and a pass of
 * n rows: 0, or -1 after a failed check (the model missing) */
static int open_fixture(const char *name, int32_t n, cb_model **m, cb_kvcache **kv, cb_fwd **f)
{
    const char *tmp = getenv("CB_TEST_TMP");
    char path[1024];
    cb_error err;
    snprintf(path, sizeof path, "%s/%s", tmp ? tmp : "tests/tmp", name);
    if (cb_model_load(m, path, &T_EXACT, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return -1;
    }
    CHECK_OK(cb_kvcache_new(kv, *m, 32, CB_TYPE_F16));
    CHECK_OK(cb_fwd_new(f, *m, n));
    return 0;
}

/* cb_fwd_layer_queries: the queries a layer pass attended with, rows
 * [from, from+n) of that pass, equal those cb_fwd_layer_qkv projects for
 * the same rows alone (same hidden states: taken before the layer runs). */
static void test_layer_queries(void)
{
    cb_model *m = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    int32_t n = 20, toks[20], pos[20], rows[11];
    tcase("forward: cb_fwd_layer_queries returns the queries the layer pass computed for its rows");
    if (open_fixture("tiny-qwen3.gguf", n, &m, &kv, &f) != 0) /* Q norms too */
        return;
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t dq = (int64_t)hp->n_head * hp->head_dim;
    float *want = malloc(sizeof(float) * (size_t)(4 * dq)),
          *got = malloc(sizeof(float) * (size_t)(4 * dq));
    for (int32_t i = 0; i < n; i++)
        toks[i] = (i * 29 + 5) % hp->n_vocab, pos[i] = i;
    for (int i = 0; i < 11; i++)
        rows[i] = (i * 7) % n; /* unordered */
    CHECK_OK(cb_fwd_embed(f, toks, pos, n));
    CHECK_OK(cb_fwd_layer(f, kv, 0, NULL, 0));
    CHECK_OK(cb_fwd_layer_qkv(f, 1, rows + 5, 4, want, NULL, NULL));
    CHECK_OK(cb_fwd_layer(f, kv, 1, rows, 11));
    CHECK_OK(cb_fwd_layer_queries(f, 5, 4, got));
    double md = 0, mx = 0;
    for (int64_t i = 0; i < 4 * dq; i++) {
        md = fabs((double)got[i] - want[i]) > md ? fabs((double)got[i] - want[i]) : md;
        mx = fabs((double)want[i]) > mx ? fabs((double)want[i]) : mx;
    }
    CHECKF(md <= 1e-5 * mx && mx > 0, "max |diff| %.3g of %.3g", md, mx);
    CHECK(cb_fwd_layer_queries(f, 8, 4, got) == CB_ERR_RANGE); /* past the pass's 11 rows */
    CHECK(cb_fwd_layer_queries(f, -1, 1, got) == CB_ERR_RANGE);
    CHECK_OK(cb_fwd_layer_qkv(f, 1, rows, 3, NULL, got, NULL)); /* keys only: q is not touched */
    CHECK(cb_fwd_layer_queries(f, 0, 1, got) == CB_OK); /* K only: the pass's queries stay */
    free(want), free(got);
    cb_fwd_free(f), cb_kvcache_free(kv), cb_model_free(m);
}

/* cb_fwd_mass_begin/add/end (probe's score summed in the backend's
 * memory, copied back once) give, bit for bit, what cb_fwd_attn_mass
 * accumulates layer by layer on the host, plain and weighted by the value
 * norms (which changes it); and the sum's misuses fail. */
static void test_mass_sum(void)
{
    cb_model *m = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    int32_t n = 24, toks[24], pos[24], rows[9];
    float host[2][24] = {{0}}, dev[2][24];
    tcase(
        "forward: cb_fwd_mass_* sums the layers' attention mass as cb_fwd_attn_mass does, bit for "
        "bit, plain and by value; misuse fails");
    if (open_fixture("tiny-gemma3.gguf", n, &m, &kv, &f) != 0) /* windows too */
        return;
    const cb_hparams *hp = cb_model_hparams(m);
    for (int32_t i = 0; i < n; i++)
        toks[i] = (i * 31 + 3) % hp->n_vocab, pos[i] = i;
    for (int i = 0; i < 9; i++)
        rows[i] = 15 + i; /* the last 9: the "question" */
    CHECK_OK(cb_fwd_embed(f, toks, pos, n));
    CHECK(cb_fwd_mass_add(f, kv, 0, 0, 1) == CB_ERR_INVALID); /* no sum open */
    CHECK(cb_fwd_mass_end(f, dev[0]) == CB_ERR_INVALID);
    CHECK_OK(cb_fwd_mass_end(f, NULL));
    CHECK(cb_fwd_mass_begin(f, 0, 0) == CB_ERR_RANGE);
    for (int bv = 0; bv < 2; bv++) {
        CHECK_OK(cb_fwd_embed(f, toks, pos, n));
        CHECK_OK(cb_fwd_mass_begin(f, n, bv));
        CHECK(cb_fwd_mass_begin(f, n, bv) == CB_ERR_INVALID); /* one at a time */
        for (int32_t l = 0; l < hp->n_layer; l++) {
            CHECK_OK(cb_fwd_layer(f, kv, l, l == 0 ? NULL : rows, l == 0 ? 0 : 9));
            int32_t from = l == 0 ? 15 : 0;
            CHECK_OK(cb_fwd_attn_mass(f, kv, l, from, 9, n, bv, host[bv]));
            CHECK_OK(cb_fwd_mass_add(f, kv, l, from, 9));
        }
        CHECK(cb_fwd_mass_add(f, kv, 0, 0, 99) == CB_ERR_RANGE); /* not rows of the last pass */
        CHECK_OK(cb_fwd_mass_end(f, dev[bv]));
        double total = 0;
        for (int32_t j = 0; j < n; j++)
            total += host[bv][j];
        CHECKF(memcmp(host[bv], dev[bv], sizeof host[bv]) == 0 && (bv || total > hp->n_layer) &&
                   total > 0,
               "%s: sums differ, or hold no mass (total %g)", bv ? "by value" : "plain", total);
    }
    CHECK(memcmp(host[0], host[1], sizeof host[0]) != 0);
    CHECK_OK(cb_fwd_mass_begin(f, n, 0)); /* dropped, then freed with f */
    CHECK_OK(cb_fwd_mass_end(f, NULL));
    CHECK_OK(cb_fwd_mass_begin(f, n, 1));
    cb_fwd_free(f), cb_kvcache_free(kv), cb_model_free(m);
}

/* The fixture `name` loaded (exact), the test case named; NULL (a failed
 * check) when it does not load. */
static cb_model *fixture_case(const char *name, const char *what)
{
    const char *tmp = getenv("CB_TEST_TMP");
    char path[1024];
    cb_model *m = NULL;
    cb_error err;
    snprintf(path, sizeof path, "%s/%s", tmp ? tmp : "tests/tmp", name);
    tcase(what);
    if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return NULL;
    }
    return m;
}

/* Two caches of n_ctx and two passes of n rows, each with toks embedded. */
static void two_passes(const cb_model *m, int32_t n_ctx, int32_t n, const int32_t *toks,
                       const int32_t *pos, cb_kvcache **kv, cb_fwd **f)
{
    for (int k = 0; k < 2; k++) {
        CHECK_OK(cb_kvcache_new(&kv[k], m, n_ctx, CB_TYPE_F32));
        CHECK_OK(cb_fwd_new(&f[k], m, n));
        CHECK_OK(cb_fwd_embed(f[k], toks, pos, n));
    }
}

/* A row's hidden state set from another pass: the layers after it give
 * what that pass's layers gave (same bits), whatever the layers before. */
static void test_set_hidden(void)
{
    cb_kvcache *kv[2] = {NULL, NULL};
    cb_fwd *f[2] = {NULL, NULL};
    enum { N = 12, K = 1 };
    int32_t toks[N], pos[N];
    cb_model *m = fixture_case(
        "tiny-qwen2.gguf",
        "forward: a row's hidden state set mid-way continues as the pass it came from");
    if (!m)
        return;
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t d = hp->n_embd;
    float *h = malloc(sizeof(float) * N * d), *a = malloc(sizeof(float) * d),
          *b = malloc(sizeof(float) * d);
    for (int32_t i = 0; i < N; i++)
        toks[i] = (i * 17 + 5) % hp->n_vocab, pos[i] = i;
    two_passes(m, 16, N, toks, pos, kv, f);
    for (int32_t l = 0; l < K; l++) /* f[1] skips the layers before K */
        CHECK_OK(cb_fwd_layer(f[0], kv[0], l, NULL, 0));
    for (int32_t i = 0; i < N; i++) {
        CHECK_OK(cb_fwd_hidden(f[0], i, h + i * d));
        CHECK_OK(cb_fwd_set_hidden(f[1], i, h + i * d));
        CHECK_OK(cb_fwd_hidden(f[1], i, a));
        CHECK(memcmp(a, h + i * d, sizeof(float) * (size_t)d) == 0);
    }
    for (int32_t l = K; l < hp->n_layer; l++)
        for (int k = 0; k < 2; k++)
            CHECK_OK(cb_fwd_layer(f[k], kv[k], l, NULL, 0));
    int same = 1;
    for (int32_t i = 0; i < N; i++) {
        CHECK_OK(cb_fwd_hidden(f[0], i, a));
        CHECK_OK(cb_fwd_hidden(f[1], i, b));
        same &= memcmp(a, b, sizeof(float) * (size_t)d) == 0;
    }
    CHECK(same);
    CHECK_OK(cb_fwd_hidden(f[0], 0, a)); /* the layers after K did move it */
    CHECK(hp->n_layer > K && memcmp(h, a, sizeof(float) * (size_t)d) != 0);
    CHECK(cb_fwd_set_hidden(f[1], N, h) == CB_ERR_RANGE);
    CHECK(cb_fwd_set_hidden(f[1], -1, h) == CB_ERR_RANGE);
    free(h), free(a), free(b);
    for (int k = 0; k < 2; k++)
        cb_fwd_free(f[k]), cb_kvcache_free(kv[k]);
    cb_model_free(m);
}

/* cb_fwd_layer_kv and cb_fwd_last_layer against cb_fwd_layer on the same
 * rows: the same cache (every row's K and V, to 1e-6 of the largest), the
 * out row's hidden state the same, the other rows' untouched; the fallback
 * when the out row is not the last; cb_model_eval's logits and cache
 * against a run of whole layers.  On gemma3 (windows, Q/K norms, tied
 * output). */
static void test_last_layer(void)
{
    cb_kvcache *kv[2] = {NULL, NULL};
    cb_fwd *f[2] = {NULL, NULL};
    enum { N = 24 };
    int32_t toks[N], pos[N], rows[9];
    cb_model *m = fixture_case(
        "tiny-gemma3.gguf",
        "forward: the last layer computes K/V only for rows whose output no one reads");
    if (!m)
        return;
    const cb_hparams *hp = cb_model_hparams(m);
    int32_t L = hp->n_layer - 1, nv = hp->n_vocab;
    int64_t d = hp->n_embd, w = (int64_t)hp->n_head_kv * hp->head_dim;
    float *ka = malloc(sizeof(float) * N * w), *kb = malloc(sizeof(float) * N * w);
    float *ha = malloc(sizeof(float) * d), *hb = malloc(sizeof(float) * d),
          *h0 = malloc(sizeof(float) * d);
    float *la = malloc(sizeof(float) * nv), *lb = malloc(sizeof(float) * nv);
    for (int32_t i = 0; i < N; i++)
        toks[i] = (i * 31 + 3) % nv, pos[i] = i;
    for (int i = 0; i < 9; i++)
        rows[i] = 2 * i + 5; /* in order, the out row (21) last */
    two_passes(m, 32, N, toks, pos, kv, f);
    for (int k = 0; k < 2; k++)
        for (int32_t l = 0; l < L; l++)
            CHECK_OK(cb_fwd_layer(f[k], kv[k], l, NULL, 0));
    double e = 0;
    CHECK_OK(cb_fwd_hidden(f[1], 7, h0));
    CHECK_OK(cb_fwd_layer(f[0], kv[0], L, rows, 9));
    CHECK_OK(cb_fwd_last_layer(f[1], kv[1], rows, 9, 21));
    for (int which = 0; which < 2; which++) {
        CHECK_OK(cb_kvcache_read(kv[0], L, which, 0, N, ka));
        CHECK_OK(cb_kvcache_read(kv[1], L, which, 0, N, kb));
        double ew = rel_err_f(kb, ka, (size_t)(N * w));
        e = ew > e ? ew : e;
    }
    CHECK_OK(cb_fwd_hidden(f[0], 21, ha));
    CHECK_OK(cb_fwd_hidden(f[1], 21, hb));
    double eh = rel_err_f(hb, ha, (size_t)d);
    CHECK_OK(cb_fwd_hidden(f[1], 7, hb));
    int untouched = memcmp(hb, h0, sizeof(float) * (size_t)d) == 0;
    CHECK_OK(cb_fwd_hidden(f[0], 7, ha));
    int moved = memcmp(ha, h0, sizeof(float) * (size_t)d) != 0;
    CHECKF(e < 1e-6 && eh < 1e-6 && untouched && moved,
           "K/V %.3g, out row %.3g, row 7 untouched %d (moved %d)", e, eh, untouched, moved);
    CHECK_OK(cb_fwd_last_layer(f[1], kv[1], rows, 9, 13)); /* 13 is not last: the whole layer */
    CHECK_OK(cb_fwd_hidden(f[1], 7, hb));
    CHECK(memcmp(hb, h0, sizeof(float) * (size_t)d) != 0);
    CHECK(cb_fwd_layer_kv(f[1], kv[1], L + 1, NULL, 0) == CB_ERR_RANGE);
    /* cb_model_eval (K/V only for all but the last row in the last layer)
     * against embed + whole layers + logits */
    for (int k = 0; k < 2; k++) {
        cb_kvcache_free(kv[k]);
        kv[k] = NULL;
        CHECK_OK(cb_kvcache_new(&kv[k], m, 32, CB_TYPE_F32));
    }
    CHECK_OK(cb_model_eval(f[1], kv[1], toks, N, 0, lb));
    CHECK_OK(cb_fwd_embed(f[0], toks, pos, N));
    for (int32_t l = 0; l <= L; l++)
        CHECK_OK(cb_fwd_layer(f[0], kv[0], l, NULL, 0));
    int32_t last = N - 1;
    CHECK_OK(cb_fwd_logits(f[0], &last, 1, la));
    CHECK_OK(cb_kvcache_read(kv[0], L, 1, 0, N, ka));
    CHECK_OK(cb_kvcache_read(kv[1], L, 1, 0, N, kb));
    double ev = rel_err_f(kb, ka, (size_t)(N * w)), el = rel_err_f(lb, la, (size_t)nv);
    CHECKF(ev < 1e-6 && el < 1e-5, "cb_model_eval: last layer's V %.3g, logits %.3g", ev, el);
    free(ka), free(kb), free(ha), free(hb), free(h0), free(la), free(lb);
    for (int k = 0; k < 2; k++)
        cb_fwd_free(f[k]), cb_kvcache_free(kv[k]);
    cb_model_free(m);
}

/* The real Gemma-3-270M against the plain loop on one chat prompt: the
 * whole architecture at its real size (262,144-token tied output, 18
 * layers, head dimension 256, one KV head).  llama.cpp on this file is
 * KL ~1e-2 away from the plain loop (its 8-bit activation rounding). */
static void test_gemma(void)
{
    const char *path = t_gemma_model();
    static const char prompt[] =
        "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
        "<start_of_turn>model\n";
    if (!path) {
        tskip("forward gemma-3-270m: last logits match the plain-loop reference",
              "Gemma-3-270M not fetched (make model MODEL=gemma)");
        return;
    }
    tcase("forward gemma-3-270m: last logits match the plain-loop reference");
    cb_model *m = NULL;
    cb_error err;
    ref r = {0};
    if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK || ref_load(&r, path) != 0) {
        CHECKF(0, "%s", err.msg);
        cb_model_free(m);
        return;
    }
    const cb_vocab *v = cb_model_vocab(m);
    cb_tokens t = {0};
    cb_tokens_push(&t, cb_vocab_bos(v));
    CHECK_OK(cb_tok_encode(v, prompt, strlen(prompt), CB_TOK_PARSE_SPECIAL, &t));
    int nv = cb_model_hparams(m)->n_vocab, n = (int)t.n;
    double *want = malloc(sizeof(double) * (size_t)nv);
    float *got = malloc(sizeof(float) * (size_t)nv);
    ref_forward_at(&r, t.ids, n, want, 1);
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    CHECK_OK(cb_kvcache_new(&kv, m, n, CB_TYPE_F32));
    CHECK_OK(cb_fwd_new(&f, m, n));
    CHECK_OK(cb_model_eval(f, kv, t.ids, n, 0, got));
    /* KL(reference || ours) of the next-token distributions */
    double mw = -1e300, mg = -1e300, zw = 0, zg = 0, kl = 0;
    for (int i = 0; i < nv; i++)
        mw = want[i] > mw ? want[i] : mw, mg = got[i] > mg ? got[i] : mg;
    for (int i = 0; i < nv; i++)
        zw += exp(want[i] - mw), zg += exp(got[i] - mg);
    for (int i = 0; i < nv; i++) {
        double lw = want[i] - mw - log(zw), lg = got[i] - mg - log(zg);
        kl += exp(lw) * (lw - lg);
    }
    double e = rel_err(got, want, (size_t)nv);
    CHECKF(e < 1e-3 && kl < 1e-5, "relative error %.3g, KL %.3g", e, kl);
    printf("# gemma-3-270m, %d tokens: max relative error vs reference %.2e, KL %.2e\n", n, e, kl);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_tokens_free(&t);
    free(want), free(got);
    ref_free(&r);
    cb_model_free(m);
}

/* KL(p || q) in nats of two next-token distributions given as logits */
static double logit_kl(const float *a, const float *b, int nv)
{
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, kl = 0;
    for (int i = 0; i < nv; i++)
        ma = a[i] > ma ? a[i] : ma, mb = b[i] > mb ? b[i] : mb;
    for (int i = 0; i < nv; i++)
        za += exp(a[i] - ma), zb += exp(b[i] - mb);
    for (int i = 0; i < nv; i++) {
        double pa = exp(a[i] - ma) / za, pb = exp(b[i] - mb) / zb;
        kl += pa * log(pa / pb);
    }
    return kl;
}

/* The default path (8-bit activations) on a fixture, against the exact
 * engine's next-token distribution after the prompt: KL(exact || default)
 * in nats, twice: the prompt fed one token at a time (every product through
 * the one-row kernels, the KV cache included) and as one batch of N_TOK
 * rows (the blocked kernels, qgemm.h): the same products, so the same
 * figure.  Measured: 5e-4 (q8_0, q4_0) to 9e-3 (q4_K) and 6.8e-2 (q6_K,
 * whose activations are rounded per 256 as llama.cpp's Q8_K) on these
 * random-weight models, whose flat distributions magnify it (Qwen2.5's
 * real q4_K/q6_K file: median 1.8e-3 over 128 positions, bench_engine kl),
 * ~1e-11 on the gemma3 one (a nearly certain next token); bound 0.15, and
 * not 0 (the path ran).  A wrong scale or sign gives KL of order 1. */
static void test_act8(const char *type)
{
    char path[1024];
    const char *tmp = getenv("CB_TEST_TMP");
    cb_model *m = NULL, *m8 = NULL;
    cb_error err;
    cb_model_params p8 = {2, "cpu", 0, NULL};
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmp ? tmp : "tests/tmp", type);
    tcase(
        "forward %s, 8-bit activations: next-token KL to the exact path bounded, not 0 (decode, batch)",
        type);
    if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK ||
        cb_model_load(&m8, path, &p8, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        cb_model_free(m);
        return;
    }
    int nv = cb_model_hparams(m)->n_vocab;
    int32_t tok[N_TOK];
    for (int i = 0; i < N_TOK; i++)
        tok[i] = (int32_t)((i * 37 + 11) % nv);
    float *a = malloc(sizeof(float) * nv), *b = malloc(sizeof(float) * nv),
          *c = malloc(sizeof(float) * nv);
    cb_kvcache *kv = NULL, *kv8 = NULL, *kvb = NULL;
    cb_fwd *f = NULL, *f8 = NULL;
    CHECK_OK(cb_kvcache_new(&kv, m, 64, CB_TYPE_F16));
    CHECK_OK(cb_kvcache_new(&kv8, m8, 64, CB_TYPE_F16));
    CHECK_OK(cb_kvcache_new(&kvb, m8, 64, CB_TYPE_F16));
    CHECK_OK(cb_fwd_new(&f, m, N_TOK));
    CHECK_OK(cb_fwd_new(&f8, m8, N_TOK));
    CHECK_OK(cb_model_eval(f, kv, tok, N_TOK, 0, a));
    for (int i = 0; i < N_TOK; i++)
        CHECK_OK(cb_model_eval(f8, kv8, tok + i, 1, i, b));
    CHECK_OK(cb_model_eval(f8, kvb, tok, N_TOK, 0, c));
    double kl = logit_kl(a, b, nv), klb = logit_kl(a, c, nv);
    printf("# %s, 8-bit activations: %s; KL to exact %.3e nats (decode), %.3e (one batch)\n", type,
           cb_model_device(m8), kl, klb);
    CHECKF(kl < 0.15 && kl > 0 && klb < 0.15 && klb > 0, "KL %.3e, %.3e", kl, klb);
    cb_fwd_free(f), cb_fwd_free(f8);
    cb_kvcache_free(kv), cb_kvcache_free(kv8), cb_kvcache_free(kvb);
    free(a), free(b), free(c);
    cb_model_free(m), cb_model_free(m8);
}

int main(void)
{
    static const char *types[] = {"f32",          "f16",          "bf16",  "q8_0",   "q4_0",
                                  "q4_1",         "q5_0",         "q5_1",  "q4_K",   "q5_K",
                                  "q6_K",         "qwen2",        "qwen3", "gemma3", "llama3",
                                  "llama-linear", "gemma3-linear"};
    TEST_BEGIN();
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        test_fixture(types[i]);
    for (size_t i = 3; i < 11; i++) /* q8_0 .. q6_K */
        test_act8(types[i]);
    test_act8("gemma3");
    test_deviation();
    test_layer_queries();
    test_mass_sum();
    test_last_layer();
    test_set_hidden();
    test_errors();
    test_gemma();
    TEST_END();
}
