/* test_batch.c - decoding many sequences together (cb_fwd_decode,
 * cb_gen_batch) on the tiny fixture models in every tensor type and
 * architecture, with exact and 8-bit activations:
 *   - a sequence decoded among others gives the bits it gives alone (the
 *     property cb-run --batch's answers rest on), for batches of 1 to 13
 *     sequences (odd counts padded, more than CB_ROWS_MAX rows split);
 *   - the decoded logits are right: against the double-precision plain-loop
 *     reference of each whole sequence;
 *   - generations in a cb_gen_batch give cb_generate's text, token count and
 *     stop reason for each sequence (greedy and sampled, stop strings,
 *     different lengths, sequences joining late);
 *   - a decode step recorded as a graph (backend.h's graph_begin and
 *     graph_end, which the CPU has not: simulated here on its operations)
 *     queues only what a recording may hold, relies on nothing a recording
 *     has not run, and gives the bits of a step queued as usual, whether
 *     the graph runs or the recording fails and the step is queued again. */
#include "../../lib/infer/model_impl.h" /* the model's backend, for the graph simulation */
#include "../../lib/prompt/prompt.h"
#include "refmodel.h"
#include "test.h"

#include <math.h>

#define MAX_SEQ 13
#define PROMPT 9
#define STEPS 6

static const char *tmp_dir(void)
{
    const char *t = getenv("CB_TEST_TMP");
    return t ? t : "tests/tmp";
}

static cb_model *load(const char *type, int act8)
{
    char path[1024];
    cb_model *m = NULL;
    cb_error err;
    cb_model_params p = {2, "cpu", !act8, NULL}; /* exact unless act8 */
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmp_dir(), type);
    if (cb_model_load(&m, path, &p, &err) != CB_OK) {
        printf("# %s\n", err.msg);
        return NULL;
    }
    return m;
}

/* sequence s's token at position i: a different prompt for each */
static int32_t tok_of(int s, int i, int nv) { return (int32_t)((s * 101 + i * 37 + 11) % nv); }

/* != 0: decode_run flags every third prompt key of each cache (but every
 * fourth from the second) stale with this bias (a blend's stale scale,
 * cb_kvcache_set_stale) */
static float stale_bias;

/* n sequences prefilled alone (cb_model_eval), then STEPS decode steps in
 * batches of `group` (group 1: each alone); logits of every step
 * [STEPS][n][nv] */
static int decode_run(cb_model *m, int n, int group, float *out)
{
    int nv = cb_model_hparams(m)->n_vocab;
    cb_kvcache *kv[MAX_SEQ] = {0};
    cb_fwd *f = NULL, *fd = NULL;
    int32_t ids[PROMPT + STEPS], tok[MAX_SEQ], pos[MAX_SEQ];
    int ok = cb_fwd_new(&f, m, PROMPT) == CB_OK &&
             cb_fwd_new(&fd, m, cb_fwd_decode_rows(m, group)) == CB_OK;
    for (int s = 0; ok && s < n; s++) {
        for (int i = 0; i < PROMPT; i++)
            ids[i] = tok_of(s, i, nv);
        ok = cb_kvcache_new(&kv[s], m, PROMPT + STEPS, CB_TYPE_F16) == CB_OK &&
             cb_model_eval(f, kv[s], ids, PROMPT, 0, NULL) == CB_OK;
        uint8_t stale[PROMPT];
        for (int i = 0; i < PROMPT; i++)
            stale[i] = i % 3 == s % 3;
        if (ok && stale_bias != 0.0f && s % 4 != 1) /* (a batch mixes caches with and without) */
            ok = cb_kvcache_set_stale(kv[s], stale, PROMPT, stale_bias) == CB_OK;
    }
    for (int t = 0; ok && t < STEPS; t++)
        for (int s0 = 0; ok && s0 < n; s0 += group) {
            int g = n - s0 < group ? n - s0 : group;
            for (int s = 0; s < g; s++) {
                tok[s] = tok_of(s0 + s, PROMPT + t, nv);
                pos[s] = PROMPT + t;
            }
            ok = cb_fwd_decode(fd, &kv[s0], tok, pos, g, out + ((size_t)t * n + s0) * nv) == CB_OK;
        }
    for (int s = 0; s < n; s++)
        cb_kvcache_free(kv[s]);
    cb_fwd_free(f), cb_fwd_free(fd);
    return ok;
}

static void test_decode(const char *type, int act8)
{
    static const int counts[] = {2, 3, 5, 8, 13};
    cb_model *m = load(type, act8);
    tcase("decode %s%s: a sequence decoded with 1..12 others gives the bits it gives alone", type,
          act8 ? " act8" : "");
    if (!m) {
        CHECK(0);
        return;
    }
    int nv = cb_model_hparams(m)->n_vocab;
    size_t sz = (size_t)STEPS * MAX_SEQ * nv;
    float *alone = malloc(sizeof(float) * sz), *together = malloc(sizeof(float) * sz);
    CHECK(decode_run(m, MAX_SEQ, 1, alone));
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        int n = counts[c], bad = 0;
        CHECK(decode_run(m, n, n, together));
        for (int t = 0; t < STEPS; t++)
            for (int s = 0; s < n; s++)
                bad += memcmp(together + ((size_t)t * n + s) * nv,
                              alone + ((size_t)t * MAX_SEQ + s) * nv, sizeof(float) * nv) != 0;
        CHECKF(bad == 0, "%d sequences together: %d of %d rows differ from alone", n, bad,
               n * STEPS);
    }
    free(alone), free(together);
    cb_model_free(m);
}

/* The decoded logits against the plain-loop reference of each sequence's
 * whole token list (prompt, then the decoded tokens). */
static void test_decode_ref(const char *type)
{
    char path[1024];
    ref r = {0};
    cb_model *m = load(type, 0);
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmp_dir(), type);
    tcase("decode %s: 5 sequences' logits at every step match the plain-loop reference", type);
    if (!m || ref_load(&r, path) != 0) {
        CHECK(0);
        cb_model_free(m);
        return;
    }
    int nv = cb_model_hparams(m)->n_vocab, n = 5;
    float *got = malloc(sizeof(float) * STEPS * n * nv);
    double *want = malloc(sizeof(double) * (PROMPT + STEPS) * nv), worst = 0;
    int32_t ids[PROMPT + STEPS];
    CHECK(decode_run(m, n, n, got));
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < PROMPT + STEPS; i++)
            ids[i] = tok_of(s, i, nv);
        ref_forward(&r, ids, PROMPT + STEPS, want);
        for (int t = 0; t < STEPS; t++) {
            const float *a = got + ((size_t)t * n + s) * nv;
            const double *b = want + (size_t)(PROMPT + t) * nv;
            double md = 0, mb = 0;
            for (int v = 0; v < nv; v++) {
                md = fmax(md, fabs(a[v] - b[v]));
                mb = fmax(mb, fabs(b[v]));
            }
            worst = fmax(worst, md / (mb > 0 ? mb : 1));
        }
    }
    printf("# %s: decode vs reference, max relative error %.2e (f16 cache)\n", type, worst);
    CHECKF(worst < 5e-3, "relative error %.3g", worst);
    free(got), free(want);
    ref_free(&r);
    cb_model_free(m);
}

/* ---------------------------------------------------------- generation */

typedef struct text {
    char buf[4096];
    size_t len;
} text;

static cb_status collect(void *ctx, const char *p, size_t n)
{
    text *t = ctx;
    if (t->len + n >= sizeof t->buf)
        return CB_ERR_NOMEM;
    memcpy(t->buf + t->len, p, n);
    t->len += n;
    t->buf[t->len] = 0;
    return CB_OK;
}

/* a prefilled cache for sequence s and its last logits */
static int prefill(cb_model *m, int s, cb_kvcache **kv, float *logits)
{
    int nv = cb_model_hparams(m)->n_vocab;
    int32_t ids[PROMPT];
    cb_fwd *f = NULL;
    for (int i = 0; i < PROMPT; i++)
        ids[i] = tok_of(s, i, nv);
    int ok = cb_fwd_new(&f, m, PROMPT) == CB_OK &&
             cb_kvcache_new(kv, m, PROMPT + 40, CB_TYPE_F16) == CB_OK &&
             cb_model_eval(f, *kv, ids, PROMPT, 0, logits) == CB_OK;
    cb_fwd_free(f);
    return ok;
}

static void test_generate(const char *type, int act8)
{
    enum { NS = 7 };
    cb_model *m = load(type, act8);
    tcase("generate %s%s: 7 sequences in a cb_gen_batch give cb_generate's answers", type,
          act8 ? " act8" : "");
    if (!m) {
        CHECK(0);
        return;
    }
    int nv = cb_model_hparams(m)->n_vocab;
    float *lg = malloc(sizeof(float) * nv);
    cb_gen_params gp[NS];
    cb_gen_result lone[NS], got[NS];
    text ta[NS], tb[NS];
    cb_kvcache *kv[NS] = {0};
    int32_t slot[NS], done[NS], n_done;
    const char *stops[1] = {NULL};
    /* the stop string: two characters of sequence 0's greedy answer */
    cb_fwd *f1 = NULL; /* cb_generate's model */
    memset(ta, 0, sizeof ta), memset(tb, 0, sizeof tb);
    CHECK_OK(cb_fwd_new(&f1, m, 1));
    for (int s = 0; s < NS; s++) {
        gp[s] = (cb_gen_params){cb_sampler_defaults(), 8 + 5 * s, NULL, 0};
        gp[s].sp.temp = s % 2 ? 0.9f : 0.0f; /* greedy and sampled */
        gp[s].sp.seed = (uint64_t)s;
    }
    /* sequence 2 (greedy) stops at two characters of its own answer; 5
     * (sampled) is given the same stop string */
    CHECK(prefill(m, 2, &kv[2], lg));
    CHECK_OK(cb_generate(f1, kv[2], lg, PROMPT, &gp[2], collect, &ta[2], cb_now_ms(), &lone[2]));
    cb_kvcache_free(kv[2]);
    char stop[3] = "";
    if (ta[2].len >= 6)
        memcpy(stop, ta[2].buf + 4, 2);
    stops[0] = stop;
    gp[2].stops = gp[5].stops = stops;
    gp[2].n_stops = gp[5].n_stops = stop[0] ? 1 : 0;
    memset(ta, 0, sizeof ta);
    for (int s = 0; s < NS; s++) {
        CHECK(prefill(m, s, &kv[s], lg));
        CHECK_OK(
            cb_generate(f1, kv[s], lg, PROMPT, &gp[s], collect, &ta[s], cb_now_ms(), &lone[s]));
        cb_kvcache_free(kv[s]);
        kv[s] = NULL;
    }
    cb_gen_batch *b = NULL;
    CHECK_OK(cb_gen_batch_new(&b, m, NS));
    /* sequences join over the first steps, as a batch runner adds them */
    for (int s = 0; b && s < NS; s++) {
        CHECK(prefill(m, s, &kv[s], lg));
        CHECK_OK(
            cb_gen_batch_add(b, kv[s], lg, PROMPT, &gp[s], collect, &tb[s], cb_now_ms(), &slot[s]));
        if (s % 3 == 2)
            cb_gen_batch_step(b, done, &n_done);
    }
    while (b && cb_gen_batch_active(b) > 0)
        cb_gen_batch_step(b, done, &n_done);
    for (int s = 0; b && s < NS; s++) {
        CHECK_OK(cb_gen_batch_take(b, slot[s], &got[s], NULL));
        CHECKF(strcmp(ta[s].buf, tb[s].buf) == 0, "sequence %d: alone '%s', batched '%s'", s,
               ta[s].buf, tb[s].buf);
        CHECKF(lone[s].n_gen == got[s].n_gen && strcmp(lone[s].stop, got[s].stop) == 0,
               "sequence %d: alone %d tokens (%s), batched %d (%s)", s, lone[s].n_gen, lone[s].stop,
               got[s].n_gen, got[s].stop);
    }
    printf("# %s: stops %s/%s/%s, tokens %d/%d/%d\n", type, lone[0].stop, lone[2].stop,
           lone[6].stop, lone[0].n_gen, lone[2].n_gen, lone[6].n_gen);
    cb_gen_batch_free(b);
    cb_fwd_free(f1);
    for (int s = 0; s < NS; s++)
        cb_kvcache_free(kv[s]);
    free(lg);
    cb_model_free(m);
}

/* ------------------------------------------------- graphs, simulated */

/* The simulation's modes: SIM_RUN, the recorded operations run as they are
 * queued (the CPU cannot defer them) and graph_end(run) says they ran;
 * SIM_FAIL, they do nothing, as on a device whose recording failed, and
 * graph_end says so, so the step must queue them again; SIM_EVERY_OTHER,
 * the two in turn.  Either way an operation a recording may not hold
 * (backend.h) is counted as a breach. */
enum { SIM_RUN, SIM_FAIL, SIM_EVERY_OTHER };
static struct {
    const cb_backend_ops *inner;
    cb_backend_ops ops;
    int mode, recording, skip, turns;
    int begins, ends_run, ends_redo, keys_bad, breaches, recorded_ops;
    const char *breach;
} sim;

static int sim_begin(cb_backend *b, int key)
{
    (void)b;
    if (sim.recording)
        sim.breaches++, sim.breach = "graph_begin while recording";
    sim.begins++;
    sim.keys_bad += key < 1 || key > MAX_SEQ + 1;
    sim.recording = 1;
    sim.skip = sim.mode == SIM_FAIL || (sim.mode == SIM_EVERY_OTHER && sim.turns++ % 2);
    return 1;
}

static int sim_end(cb_backend *b, int run)
{
    (void)b;
    if (!sim.recording)
        sim.breaches++, sim.breach = "graph_end without graph_begin";
    sim.recording = 0;
    int ran = run && !sim.skip;
    sim.skip = 0;
    ran ? sim.ends_run++ : sim.ends_redo++;
    return ran;
}

/* an operation a recording may hold: run unless the recording is failing */
#define SIM_OP(name, proto, args)          \
    static void sim_##name proto           \
    {                                      \
        sim.recorded_ops += sim.recording; \
        if (!sim.skip)                     \
            sim.inner->name args;          \
    }
SIM_OP(matmul, (cb_backend * b, const cb_bweight *w, const float *x, float *y, int64_t n),
       (b, w, x, y, n))
SIM_OP(matmul_multi,
       (cb_backend * b, const cb_bweight *const *w, int nw, const float *x, float *const *y,
        int64_t n),
       (b, w, nw, x, y, n))
SIM_OP(get_rows, (cb_backend * b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst),
       (b, w, ids, n, dst))
SIM_OP(rmsnorm,
       (cb_backend * b, const float *x, const float *g, float *y, int64_t n, int64_t d, float eps),
       (b, x, g, y, n, d, eps))
SIM_OP(rope,
       (cb_backend * b, float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot,
        float base, const float *ff, int neox),
       (b, x, pos, n, n_head, hd, n_rot, base, ff, neox))
SIM_OP(add, (cb_backend * b, float *x, const float *y, int64_t n), (b, x, y, n))
SIM_OP(swiglu, (cb_backend * b, const float *g, const float *u, float *out, int64_t n),
       (b, g, u, out, n))
SIM_OP(geglu, (cb_backend * b, const float *g, const float *u, float *out, int64_t n),
       (b, g, u, out, n))
SIM_OP(scale, (cb_backend * b, float *x, float s, int64_t n), (b, x, s, n))
SIM_OP(kv_write,
       (cb_backend * b, void *cache, cb_type t, int64_t width, const float *src, const int32_t *at,
        int64_t n),
       (b, cache, t, width, src, at, n))
SIM_OP(attention,
       (cb_backend * b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
        cb_type t, int n_head, int n_head_kv, int hd, float scale, int window, float *out),
       (b, q, pos, n, k, v, t, n_head, n_head_kv, hd, scale, window, out))
SIM_OP(upload, (cb_backend * b, void *dst, const void *src, size_t n), (b, dst, src, n))
#undef SIM_OP

/* skipped too when the recording fails, as a device's failed recording
 * skips every operation after the failure (here: all of them) */
static cb_status sim_set_key_bias(cb_backend *b, const uint8_t *stale, int64_t n, float bias,
                                  int32_t until)
{
    sim.recorded_ops += sim.recording;
    return sim.skip ? CB_OK : sim.inner->set_key_bias(b, stale, n, bias, until);
}

/* the operations a recording may not hold: a breach when recording */
static void sim_download(cb_backend *b, void *dst, const void *src, size_t n)
{
    if (sim.recording)
        sim.breaches++, sim.breach = "download";
    sim.inner->download(b, dst, src, n);
}

static void *sim_alloc_tmp(cb_backend *b, size_t n)
{
    if (sim.recording)
        sim.breaches++, sim.breach = "alloc_tmp";
    return sim.inner->alloc_tmp(b, n);
}

static void *sim_alloc(cb_backend *b, size_t n)
{
    if (sim.recording)
        sim.breaches++, sim.breach = "alloc";
    return sim.inner->alloc(b, n);
}

static void sim_dealloc(cb_backend *b, void *p)
{
    if (sim.recording)
        sim.breaches++, sim.breach = "dealloc";
    sim.inner->dealloc(b, p);
}

static void sim_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    if (sim.recording)
        sim.breaches++, sim.breach = "topk";
    sim.inner->topk(b, x, n, k, idx);
}

static void sim_deviation(cb_backend *b, const float *src, const void *cache, cb_type t,
                          int64_t width, const int32_t *at, int64_t n, float *dev)
{
    if (sim.recording)
        sim.breaches++, sim.breach = "deviation";
    sim.inner->deviation(b, src, cache, t, width, at, n, dev);
}

/* the table on m's backend: the CPU's, with the graph entries and the
 * operations above in place (every other entry stays the CPU's: a
 * recorded step that called one, such as a fused operation the CPU has
 * not, would not be simulated, so the CPU's optional fused entries stay
 * NULL as they are) */
static void sim_wrap(cb_model *m, int mode)
{
    memset(&sim, 0, sizeof sim);
    sim.inner = m->be->ops;
    sim.ops = *sim.inner;
    sim.mode = mode;
    sim.ops.graph_begin = sim_begin;
    sim.ops.graph_end = sim_end;
#define SET(name) sim.ops.name = sim.inner->name ? sim_##name : NULL
    SET(matmul);
    SET(matmul_multi);
    SET(get_rows);
    SET(rmsnorm);
    SET(rope);
    SET(add);
    SET(swiglu);
    SET(geglu);
    SET(scale);
    SET(kv_write);
    SET(attention);
    SET(upload);
    SET(set_key_bias);
    SET(download);
    SET(alloc_tmp);
    SET(alloc);
    SET(dealloc);
    SET(topk);
    SET(deviation);
#undef SET
    /* fused and other optional entries would escape the simulation */
    sim.ops.add_rmsnorm = NULL;
    sim.ops.rope_qk = NULL;
    sim.ops.kv_write_kv = NULL;
    m->be->ops = &sim.ops;
}

static void sim_unwrap(cb_model *m) { m->be->ops = sim.inner; }

/* Decoding under each simulated mode gives the bits of decoding without
 * graphs, alone and in batches, with and without a blend's stale keys
 * (set_key_bias inside the recording); no breach, a step per recording. */
static void test_graph(const char *type)
{
    static const int counts[] = {1, 3, 5};
    static const char *const mode_name[] = {"graph runs", "recording fails", "in turn"};
    cb_model *m = load(type, 0);
    tcase("decode %s: a step recorded as a graph (simulated: it runs, it fails, in turn) gives "
          "the bits of one queued as usual, and records nothing a graph may not hold",
          type);
    if (!m) {
        CHECK(0);
        return;
    }
    int nv = cb_model_hparams(m)->n_vocab;
    size_t sz = (size_t)STEPS * MAX_SEQ * nv;
    float *plain = malloc(sizeof(float) * sz), *graphed = malloc(sizeof(float) * sz);
    for (size_t c = 0; plain && graphed && c < 2 * sizeof counts / sizeof counts[0]; c++) {
        int n = counts[c / 2];
        stale_bias = c % 2 ? -0.7f : 0.0f;
        CHECK(decode_run(m, n, n, plain));
        for (int mode = SIM_RUN; mode <= SIM_EVERY_OTHER; mode++) {
            sim_wrap(m, mode);
            int ok = decode_run(m, n, n, graphed);
            sim_unwrap(m);
            int bad = 0;
            for (size_t i = 0; ok && i < (size_t)STEPS * n; i++)
                bad += memcmp(graphed + i * nv, plain + i * nv, sizeof(float) * nv) != 0;
            int want_run = mode == SIM_RUN ? STEPS : mode == SIM_FAIL ? 0 : STEPS / 2;
            CHECKF(ok && bad == 0, "%d sequences%s, %s: %d of %d rows differ", n,
                   stale_bias != 0.0f ? " with stale keys" : "", mode_name[mode], bad, n * STEPS);
            CHECKF(sim.breaches == 0,
                   "%d sequences, %s: %d operations a recording may not hold "
                   "(the last: %s)",
                   n, mode_name[mode], sim.breaches, sim.breach);
            CHECKF(sim.begins == STEPS && sim.ends_run == want_run &&
                       sim.ends_redo == STEPS - want_run && sim.keys_bad == 0 &&
                       sim.recorded_ops > STEPS * 4,
                   "%d sequences, %s: %d recordings, %d ran, %d queued again, %d bad keys, %d "
                   "operations recorded",
                   n, mode_name[mode], sim.begins, sim.ends_run, sim.ends_redo, sim.keys_bad,
                   sim.recorded_ops);
        }
    }
    stale_bias = 0.0f;
    free(plain), free(graphed);
    cb_model_free(m);
}

int main(void)
{
    static const char *types[] = {"f32",  "f16",   "bf16",  "q8_0",   "q4_0",
                                  "q4_1", "q5_0",  "q5_1",  "q4_K",   "q5_K",
                                  "q6_K", "qwen2", "qwen3", "gemma3", "llama3"};
    TEST_BEGIN();
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        test_decode(types[i], 0);
    for (size_t i = 3; i < 11; i++) /* the block types, which have an 8-bit activation path */
        test_decode(types[i], 1);
    test_decode("gemma3", 1);
    test_decode_ref("q8_0");
    test_decode_ref("qwen3");
    test_decode_ref("gemma3");
    test_generate("q8_0", 0);
    test_generate("q4_K", 1);
    test_generate("gemma3", 0);
    test_graph("q8_0");
    test_graph("gemma3");
    TEST_END();
}
