/* test_blend.c - the invariants of cache blending, on the tiny fixture and
 * on the default model: ratio 1 reproduces full prefill; ratio 0 equals
 * full KV reuse; prefix caching of a true prefix equals full prefill, and
 * blend leaves that prefix's cache as loaded; the key temperature divides
 * exactly the loaded keys it should; reordering chunks only moves their
 * caches; selection counts follow the ratios (one check layer, gradual
 * filtering, every strategy); probe's scores against a plain loop;
 * cb_score against a plain-loop NLL.
 *
 * For Valgrind (tests/memcheck.sh), whose slowdown the real models' cases
 * do not survive at full length: CB_BLEND_MODELS=tiny, =real, =smollm2 or
 * =gemma runs only those models, and CB_BLEND_SHORT=1 makes the three
 * chunks about half as long and stops after full, ratio 1, ratio 0, reuse
 * and blend at 0.15 (not required to beat reuse there), then scores once:
 * the strategies, probe, prefix caching, reordering and pipelining run on
 * every fixture. */
#include "../../lib/infer/model_impl.h" /* a KV cache's stale flags */
#include "../../lib/kv/kv.h"
#include "test.h"

#include <time.h>
#include <unistd.h>

static const char *tmpdir(void)
{
    const char *t = getenv("CB_TEST_TMP");
    return t ? t : "tests/tmp";
}

typedef struct fixture {
    cb_model *m;
    cb_tokens lead, sep, question;
    cb_tokens chunk[3];
    cb_kvfile *file[3];
} fixture;

static double rel(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        md = e > md ? e : md;
        mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
    }
    return md / (mb > 0 ? mb : 1);
}

static int setup(fixture *fx, const char *model_path, cb_type kvt, const char *const texts[3],
                 const char *q)
{
    cb_error err;
    memset(fx, 0, sizeof *fx);
    if (cb_model_load(&fx->m, model_path, &T_EXACT, &err) != CB_OK) {
        printf("# %s\n", err.msg);
        return -1;
    }
    const cb_vocab *v = cb_model_vocab(fx->m);
    cb_kv_lead_in(fx->m, &fx->lead);
    cb_tok_encode(v, "\n\n", 2, 0, &fx->sep);
    cb_tok_encode(v, q, strlen(q), 0, &fx->question);
    cb_fwd *f = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd_new(&f, fx->m, 512);
    cb_kvcache_new(&kv, fx->m, 512, CB_TYPE_F32);
    for (int i = 0; i < 3; i++) {
        void *buf;
        size_t size;
        char path[1024];
        cb_tok_encode(v, texts[i], strlen(texts[i]), 0, &fx->chunk[i]);
        if (cb_kv_precompute(f, kv, fx->lead.ids, (int32_t)fx->lead.n, fx->chunk[i].ids,
                             (int32_t)fx->chunk[i].n, kvt, &buf, &size) != CB_OK)
            return -1;
        snprintf(path, sizeof path, "%s/blend-%d-%s.cbkv", tmpdir(), i, cb_type_name(kvt));
        if (cb_file_write_atomic(path, buf, size, &err) != CB_OK ||
            cb_kvfile_open(&fx->file[i], path, &err) != CB_OK)
            return -1;
        free(buf);
    }
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    return 0;
}

static void teardown(fixture *fx)
{
    for (int i = 0; i < 3; i++) {
        cb_tokens_free(&fx->chunk[i]);
        cb_kvfile_free(fx->file[i]);
    }
    cb_tokens_free(&fx->lead);
    cb_tokens_free(&fx->sep);
    cb_tokens_free(&fx->question);
    cb_model_free(fx->m);
}

/* [lead] [c order[0]] [sep] [c order[1]] [sep] [c order[2]] [question] */
static int32_t build(fixture *fx, const int order[3], cb_segment *segs)
{
    int32_t n = 0;
    segs[n++] = (cb_segment){fx->lead.ids, (int32_t)fx->lead.n, NULL};
    for (int i = 0; i < 3; i++) {
        int c = order[i];
        segs[n++] = (cb_segment){fx->chunk[c].ids, (int32_t)fx->chunk[c].n, fx->file[c]};
        if (i < 2)
            segs[n++] = (cb_segment){fx->sep.ids, (int32_t)fx->sep.n, NULL};
    }
    segs[n++] = (cb_segment){fx->question.ids, (int32_t)fx->question.n, NULL};
    return n;
}

/* the cached tokens a blend may recompute: all but a true prefix's */
/* The defaults at a fixed ratio (no speedup): what every test but the
 * speedup's states its expectations for. */
/* the defaults with the ratio as given and no stale scale: the plain
 * blend, whose ratio 0 is reuse (the stale scale has its own case) */
static cb_blend_params fixed_defaults(void)
{
    cb_blend_params p = cb_blend_defaults();
    p.speedup = 0.0f;
    p.stale_scale = 1.0f;
    return p;
}

static int32_t cand(const cb_blend_stats *st) { return st->n_cached_tokens - st->n_exact_tokens; }

static cb_status run(fixture *fx, const cb_segment *segs, int32_t n_segs, const cb_blend_params *p,
                     float *logits, cb_blend_stats *st, cb_kvcache **kv_out)
{
    cb_fwd *f = NULL;
    cb_kvcache *kv = NULL;
    cb_error err;
    cb_fwd_new(&f, fx->m, 512);
    cb_kvcache_new(&kv, fx->m, 512, CB_TYPE_F32);
    cb_status s = cb_blend_prefill(f, kv, segs, n_segs, p, logits, st, &err);
    if (s != CB_OK)
        printf("# %s\n", err.msg);
    cb_fwd_free(f);
    if (kv_out)
        *kv_out = kv;
    else
        cb_kvcache_free(kv);
    return s;
}

/* The plain loop: one forward over prompt + continuation, every row's
 * logits, the continuation's mean NLL and top-1 in double. */
static void score_by_hand(fixture *fx, const cb_segment *segs, int32_t n_segs,
                          const cb_tokens *cont, double *nll, double *top1)
{
    int nv = cb_model_hparams(fx->m)->n_vocab, nl = cb_model_hparams(fx->m)->n_layer;
    int32_t ids[512], pos[512], n = 0;
    for (int32_t s = 0; s < n_segs; s++)
        for (int32_t j = 0; j < segs[s].n; j++)
            ids[n++] = segs[s].ids[j];
    int32_t p0 = n;
    for (size_t j = 0; j < cont->n; j++)
        ids[n++] = cont->ids[j];
    for (int32_t i = 0; i < n; i++)
        pos[i] = i;
    cb_fwd *f = NULL;
    cb_kvcache *kv = NULL;
    float *lg = malloc(sizeof(float) * (size_t)nv * (size_t)n);
    cb_fwd_new(&f, fx->m, 512);
    cb_kvcache_new(&kv, fx->m, 512, CB_TYPE_F32);
    cb_fwd_embed(f, ids, pos, n);
    for (int l = 0; l < nl; l++)
        cb_fwd_layer(f, kv, l, NULL, 0);
    cb_fwd_logits(f, NULL, 0, lg);
    double sum = 0, hits = 0;
    for (int32_t i = p0; i < n; i++) {
        const float *row = lg + (size_t)(i - 1) * (size_t)nv;
        double mx = -INFINITY, z = 0;
        int arg = 0;
        for (int v = 0; v < nv; v++)
            if (row[v] > mx)
                mx = row[v], arg = v;
        for (int v = 0; v < nv; v++)
            z += exp(row[v] - mx);
        sum -= row[ids[i]] - mx - log(z);
        hits += arg == ids[i];
    }
    *nll = sum / (n - p0);
    *top1 = hits / (n - p0);
    free(lg);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
}

/* cb_score after a prefill in mode p->mode. */
static cb_status score_after(fixture *fx, const cb_segment *segs, int32_t n_segs,
                             const cb_blend_params *p, const cb_tokens *cont, cb_score_result *res)
{
    cb_fwd *f = NULL;
    cb_kvcache *kv = NULL;
    cb_blend_stats st;
    cb_error err;
    float *lg = malloc(sizeof(float) * (size_t)cb_model_hparams(fx->m)->n_vocab);
    cb_fwd_new(&f, fx->m, 512);
    cb_kvcache_new(&kv, fx->m, 512, CB_TYPE_F32);
    cb_status s = cb_blend_prefill(f, kv, segs, n_segs, p, lg, &st, &err);
    if (s == CB_OK)
        s = cb_score(f, kv, lg, st.n_prompt_tokens, cont->ids, (int32_t)cont->n, res);
    free(lg);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    return s;
}

static int short_texts(void)
{
    const char *e = getenv("CB_BLEND_SHORT");
    return e && *e && strcmp(e, "0") != 0;
}

/* The segments whose caches are exact: the cached ones before the index
 * returned (0: none), the leading ones while the tokens before each are
 * its file's lead-in and it was computed where it sits (blend never
 * recomputes their rows). */
static int32_t exact_end(const cb_segment *segs, int32_t n_segs)
{
    int32_t at = 0, end = 0;
    for (int32_t s = 0; s < n_segs; at += segs[s++].n) {
        if (!segs[s].kv)
            continue;
        const cb_kv_meta *mt = cb_kvfile_meta(segs[s].kv);
        int same = mt->n_lead == at && mt->pos0 == at;
        for (int32_t i = 0, k = 0; same && i < s; i++)
            for (int32_t j = 0; same && j < segs[i].n; j++)
                same = segs[i].ids[j] == mt->lead[k++];
        if (!same)
            break;
        end = s + 1;
    }
    return end;
}

/* probe's scoring by hand: the uncached rows through every layer against
 * the loaded caches (a reuse prefill leaves exactly those caches), the
 * question's last q_rows uncached rows' softmax attention (double, the
 * causal mask and each layer's sliding window, or none when windows is 0)
 * summed per cached row over layers and heads; returns the share of the
 * total held by the top `want` cached rows (what probe's stats call
 * selected_mass), or -1. */
static double probe_by_hand(fixture *fx, const cb_segment *segs, int32_t n_segs, int32_t q_rows,
                            int windows, double ratio, int32_t n_layers, int by_value)
{
    const cb_hparams *hp = cb_model_hparams(fx->m);
    int32_t ids[512], pos[512], rows[512], qrows[512], n = 0, n_rows = 0, nq = 0, n_c = 0;
    uint8_t cached[512];
    double *score = calloc(512, sizeof(double)), *sc = malloc(512 * sizeof(double)), mass = -1;
    int64_t dq = (int64_t)hp->n_head * hp->head_dim, w = (int64_t)hp->n_head_kv * hp->head_dim;
    float *q = malloc(sizeof(float) * 512 * (size_t)dq),
          *k = malloc(sizeof(float) * 512 * (size_t)w),
          *v = malloc(sizeof(float) * 512 * (size_t)w), *lg = NULL;
    cb_blend_params p = fixed_defaults();
    cb_blend_stats st;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    int32_t ex = exact_end(segs, n_segs);
    for (int32_t s = 0; s < n_segs; s++)
        for (int32_t j = 0; j < segs[s].n; j++, n++) {
            ids[n] = segs[s].ids[j], pos[n] = n;
            cached[n] = segs[s].kv != NULL ? (s < ex ? 2 : 1) : 0;
            if (s == n_segs - 1 && !cached[n])
                qrows[nq++] = n;
        }
    cached[n - 1] = 0; /* the last row is always computed */
    for (int32_t r = 0; r < n; r++)
        if (!cached[r])
            rows[n_rows++] = r;
        else
            n_c++;
    int32_t q0 = q_rows > 0 && nq > q_rows ? nq - q_rows : 0;
    p.mode = CB_MODE_REUSE;
    lg = malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (run(fx, segs, n_segs, &p, lg, &st, &kv) != CB_OK || cb_fwd_new(&f, fx->m, 512) != CB_OK ||
        cb_fwd_embed(f, ids, pos, n) != CB_OK)
        goto out;
    for (int32_t l = 0; l < n_layers; l++) {
        int32_t win = windows ? cb_model_layer_window(fx->m, l) : 0;
        if (cb_fwd_layer_qkv(f, l, qrows + q0, nq - q0, q, NULL, NULL) != CB_OK ||
            cb_fwd_layer(f, kv, l, rows, n_rows) != CB_OK ||
            cb_kvcache_read(kv, l, 0, 0, n, k) != CB_OK ||
            cb_kvcache_read(kv, l, 1, 0, n, v) != CB_OK)
            goto out;
        for (int32_t i = 0; i < nq - q0; i++)
            for (int32_t h = 0; h < hp->n_head; h++) {
                int32_t row = qrows[q0 + i], j0 = win > 0 && row + 1 > win ? row + 1 - win : 0;
                int64_t kh = (int64_t)(h / (hp->n_head / hp->n_head_kv)) * hp->head_dim;
                double a[512], mx = -INFINITY, sum = 0;
                for (int32_t j = j0; j <= row; j++) {
                    double d = 0;
                    for (int32_t e = 0; e < hp->head_dim; e++)
                        d += (double)q[i * dq + (int64_t)h * hp->head_dim + e] *
                             k[j * w + (int64_t)(h / (hp->n_head / hp->n_head_kv)) * hp->head_dim +
                               e];
                    a[j] = d / sqrt((double)hp->head_dim);
                    mx = a[j] > mx ? a[j] : mx;
                }
                for (int32_t j = j0; j <= row; j++)
                    sum += (a[j] = exp(a[j] - mx));
                for (int32_t j = j0; j <= row; j++) {
                    double vn = 0; /* the value row's norm in this head's KV head */
                    for (int32_t e = 0; e < hp->head_dim && by_value; e++)
                        vn += (double)v[j * w + kh + e] * v[j * w + kh + e];
                    score[j] += cached[j] == 1 ? a[j] / sum * (by_value ? sqrt(vn) : 1) : 0;
                }
            }
    }
    double total = 0, top = 0;
    int32_t m = 0;
    for (int32_t r = 0; r < n; r++)
        if (cached[r] == 1)
            sc[m++] = score[r], total += score[r];
    for (int32_t i = 0; i < m; i++) /* the top want, by selection */
        for (int32_t j = i + 1; j < m; j++)
            if (sc[j] > sc[i]) {
                double t = sc[i];
                sc[i] = sc[j], sc[j] = t;
            }
    for (int32_t i = 0; i < (int32_t)ceil(ratio * n_c) && i < m; i++)
        top += sc[i];
    mass = total > 0 ? top / total : -1;
out:
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    free(score), free(sc), free(q), free(k), free(v), free(lg);
    return mass;
}

/* The blend's timing spans (lib/infer/marks.c) where the backend has no
 * clock of its own: the host's, a span of a 20 ms sleep read as such, a
 * pool grown past its first 64 spans, a span never ended or a mark never
 * recorded read as unknown (negative). */
static void test_spans(cb_model *m)
{
    tcase("timing spans on the host's clock: a 20 ms sleep, 200 empty spans, unrecorded marks");
    CHECK(!cb_model_marks_on_device(m));
    cb_spans *s = cb_spans_new(m);
    CHECK(s != NULL);
    cb_spans_begin(s);
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    cb_spans_end(s);
    for (int i = 0; i < 200; i++) {
        cb_spans_begin(s);
        cb_spans_end(s);
    }
    double ms = cb_spans_ms(s);
    CHECKF(ms >= 19.9 && ms < 2000, "%.3f ms", ms);
    cb_spans_begin(s);
    CHECK(cb_spans_ms(s) < 0);
    cb_spans_free(s);
    CHECK(cb_spans_ms(NULL) < 0);
    cb_spans_begin(NULL), cb_spans_end(NULL), cb_spans_free(NULL);
    cb_mark *a = cb_model_mark_new(m), *z = cb_model_mark_new(m);
    CHECK(a && z && cb_model_mark_ms(m, a, z) < 0);
    cb_model_mark_record(m, a);
    cb_model_mark_record(m, z);
    CHECK(cb_model_mark_ms(m, a, z) >= 0 && cb_model_mark_ms(m, z, a) <= 0);
    cb_model_mark_free(m, a), cb_model_mark_free(m, z);
}

/* A copy of path at to, with one bit of layer 0's data flipped */
static int corrupt_copy(const char *path, const char *to)
{
    cb_error err;
    size_t n = 0;
    uint8_t *d = (uint8_t *)t_read_file(path, &n);
    uint32_t H = 0;
    if (d && n > 128)
        memcpy(&H, d + 12, 4);
    int ok = d && n > 128 && H + 3 < (uint64_t)n;
    if (ok) {
        d[H + 3] ^= 0x20;
        ok = cb_file_write_atomic(to, d, n, &err) == CB_OK;
    }
    free(d);
    return ok ? 0 : -1;
}

/* The loader's readers (cb_blend_params.load_threads): three threads read
 * each layer's files together and give the bits one does; with two of the
 * files corrupt, the first of them in the prompt is the one reported
 * (failed_segment), whichever reader met its fault first. */
static void test_readers(fixture *fx, const cb_segment *segs0, int32_t ns, float *one, float *three,
                         const char *label)
{
    int nv = cb_model_hparams(fx->m)->n_vocab;
    cb_blend_params p = fixed_defaults();
    cb_blend_stats st;
    tcase("%s: three readers of the caches' files: one reader's bits; the first corrupt file in "
          "the prompt named",
          label);
    CHECK_OK(run(fx, segs0, ns, &p, one, &st, NULL));
    CHECK(st.load_threads == 1); /* the CPU's choice */
    p.load_threads = 3;
    CHECK_OK(run(fx, segs0, ns, &p, three, &st, NULL));
    CHECK(st.load_threads == 3 && memcmp(one, three, sizeof(float) * (size_t)nv) == 0);
    p.load_threads = 8; /* more than the files: one a file */
    CHECK_OK(run(fx, segs0, ns, &p, three, &st, NULL));
    CHECK(st.load_threads == 3 && memcmp(one, three, sizeof(float) * (size_t)nv) == 0);
    char from[1024], to[2][1024];
    cb_kvfile *bad[2] = {NULL, NULL};
    cb_segment segs[16];
    cb_error err;
    memcpy(segs, segs0, sizeof *segs * (size_t)ns);
    int32_t first = -1;
    for (int c = 1, k = 0; c < 3; c++, k++) { /* the 2nd and 3rd chunks */
        snprintf(from, sizeof from, "%s/blend-%d-%s.cbkv", tmpdir(), c,
                 cb_type_name(cb_kvfile_meta(fx->file[c])->type));
        snprintf(to[k], sizeof to[k], "%s/blend-bad-%d.cbkv", tmpdir(), c);
        CHECK(corrupt_copy(from, to[k]) == 0 && cb_kvfile_open(&bad[k], to[k], &err) == CB_OK);
        for (int32_t s = 0; s < ns; s++)
            if (segs[s].kv == fx->file[c]) {
                segs[s].kv = bad[k];
                first = first < 0 ? s : first;
            }
    }
    int named = 1;
    for (int r = 0; r < 6 && bad[0] && bad[1]; r++) {
        cb_status s = run(fx, segs, ns, &p, three, &st, NULL);
        named &= s == CB_ERR_CHECKSUM && st.failed_segment == first;
    }
    CHECKF(named && first > 0, "failed_segment %d, the first corrupt one %d", st.failed_segment,
           first);
    for (int k = 0; k < 2; k++) {
        cb_kvfile_free(bad[k]);
        unlink(to[k]);
    }
}

static void invariants(const char *label, const char *model_path, cb_type kvt, double tol_full,
                       double tol_reuse)
{
    static const char *const long_texts[3] = {
        "Alice Brown is the chief engineer of the Norden Bridge project, which began in 2019.",
        "The Norden Bridge spans the river Vale and is 1,240 metres long; its main tower is made of steel.",
        "Alice Brown studied civil engineering in Delft and later worked on harbour cranes in Rotterdam."};
    static const char *const few_texts[3] = {
        "Alice Brown is the chief engineer of the Norden Bridge project.",
        "The Norden Bridge spans the river Vale; its tower is steel.",
        "Alice Brown studied civil engineering in Delft."};
    int few = short_texts();
    const char *const *texts = few ? few_texts : long_texts;
    fixture fx;
    tcase("%s: set up three precomputed chunks", label);
    if (setup(&fx, model_path, kvt, texts,
              "Where did the chief engineer of the Norden Bridge study?") != 0) {
        CHECK(0);
        return;
    }
    const cb_hparams *hp = cb_model_hparams(fx.m);
    int nv = hp->n_vocab;
    float *full = malloc(sizeof(float) * nv), *a = malloc(sizeof(float) * nv),
          *b = malloc(sizeof(float) * nv);
    cb_segment segs[16];
    int order[3] = {0, 1, 2};
    int32_t ns = build(&fx, order, segs);
    cb_blend_params p = fixed_defaults();
    cb_blend_stats st;

    p.mode = CB_MODE_FULL;
    CHECK_OK(run(&fx, segs, ns, &p, full, &st, NULL));
    CHECK(st.n_cached_tokens == 0);

    tcase("%s: blend at ratio 1 reproduces full prefill", label);
    p = fixed_defaults();
    p.ratios[0] = 1.0f;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    double e = rel(a, full, (size_t)nv);
    CHECKF(e < tol_full, "relative error %.3g", e);
    CHECK(st.n_recomputed_tokens == cand(&st) && st.n_cached_tokens > 0);
    printf("# %s: ratio 1 vs full: %.2e (%d cached tokens)\n", label, e, st.n_cached_tokens);

    tcase("%s: blend at ratio 0 equals full KV reuse", label);
    p.ratios[0] = 0.0f;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    CHECK(st.n_recomputed_tokens == 0);
    p.mode = CB_MODE_REUSE;
    CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
    e = rel(a, b, (size_t)nv);
    CHECKF(e < tol_reuse, "relative error %.3g", e);
    double dr = rel(b, full, (size_t)nv);
    printf("# %s: ratio 0 vs reuse: %.2e; reuse vs full: %.2e\n", label, e, dr);

    tcase("%s: blend at 0.15 selects ceil(0.15 x cached) and lies between reuse and full", label);
    p = fixed_defaults();
    p.key_temp =
        1.0f; /* the selection alone (the temperature is a measured choice, not a property) */
    p.mode = CB_MODE_REUSE;
    CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
    dr = rel(b, full, (size_t)nv);
    p.mode = CB_MODE_BLEND;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    CHECKF(st.n_selected[0] == (int32_t)ceilf(0.15f * st.n_cached_tokens), "%d of %d",
           st.n_selected[0], st.n_cached_tokens);
    double eb = rel(a, full, (size_t)nv);
    /* a quality property of these texts, checked at full length only: with
     * the short ones 5 recomputed tokens do not always beat reuse (Gemma) */
    CHECKF(few || eb < dr, "blend %.3g is not closer to full than reuse %.3g", eb, dr);
    printf("# %s: blend 0.15 vs full: %.2e (reuse %.2e)\n", label, eb, dr);
    if (few) {
        /* Valgrind's pace on a real model is some 30 MFLOP/s: each run
         * there costs minutes, so the short mode stops at the paths that
         * depend on the model (quantized weights, its vocabulary, sizes)
         * and scores once; the strategies, prefix, reordering and
         * pipelining run on every fixture. */
        tskip("strategies, prefix, reordering, pipelining",
              "CB_BLEND_SHORT: checked on the fixtures");
        goto score;
    }

    tcase("%s: gradual filtering and the sink and query strategies", label);
    p.strategy = CB_STRATEGY_HKVD; /* gradual filtering is the check-layer strategies' */
    p.n_ratios = 2;
    p.ratios[0] = 0.5f;
    p.ratios[1] = 0.25f;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    CHECK(st.n_selected[0] == (int32_t)ceilf(0.5f * st.n_cached_tokens));
    CHECK(st.n_selected[1] == (int32_t)ceilf(0.25f * st.n_cached_tokens));
    p = fixed_defaults();
    p.strategy = CB_STRATEGY_SINK;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    CHECK(st.n_selected[0] >= (int32_t)ceilf(0.15f * st.n_cached_tokens));
    CHECK(st.n_selected[0] <= (int32_t)ceilf(0.15f * st.n_cached_tokens) + 3 * p.sink_tokens);
    p.strategy = CB_STRATEGY_QUERY;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    CHECK(st.n_selected[0] == (int32_t)ceilf(0.15f * st.n_cached_tokens));
    p = fixed_defaults();
    p.deviation_v = 0;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));

    static const char *const names[] = {"hkvd", "sink", "query", "probe", "runs", "auto", "random"};
    static const cb_blend_strategy tried[] = {CB_STRATEGY_HKVD,  CB_STRATEGY_SINK,
                                              CB_STRATEGY_QUERY, CB_STRATEGY_PROBE,
                                              CB_STRATEGY_RUNS,  CB_STRATEGY_RANDOM};
    for (size_t ti = 0; ti < sizeof tried / sizeof tried[0]; ti++) {
        int sg = tried[ti];
        tcase(
            "%s: strategy %s: ratio 1 is full prefill, ratio 0 is reuse (sink: the sinks), 0.15 its budget",
            label, names[sg]);
        p = fixed_defaults();
        p.strategy = (cb_blend_strategy)sg;
        /* the check-layer strategies compute every row before the check layer: untempered
         * there */
        if (sg != CB_STRATEGY_PROBE && sg != CB_STRATEGY_RANDOM)
            p.key_temp = 1.0f;
        p.ratios[0] = 1.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        p.mode = CB_MODE_FULL;
        CHECK_OK(run(&fx, segs, ns, &p, full, &st, NULL));
        e = rel(a, full, (size_t)nv);
        CHECKF(e < tol_full, "ratio 1 vs full: relative error %.3g", e);
        p.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
        p.mode = CB_MODE_BLEND;
        p.ratios[0] = 0.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        e = rel(a, b, (size_t)nv);
        if (sg ==
            CB_STRATEGY_SINK) /* by design: the sinks even at ratio 0 (not chunk 0's: exact) */
            CHECKF(st.n_recomputed_tokens == 2 * p.sink_tokens, "%d sinks", st.n_recomputed_tokens);
        else
            CHECKF(e < tol_reuse && st.n_recomputed_tokens == 0,
                   "ratio 0 vs reuse: relative error %.3g", e);
        p.ratios[0] = 0.15f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        int32_t budget = (int32_t)ceilf(0.15f * st.n_cached_tokens);
        CHECKF(sg == CB_STRATEGY_SINK ? st.n_selected[0] >= budget : st.n_selected[0] == budget,
               "%d selected of %d", st.n_selected[0], st.n_cached_tokens);
        double es = rel(a, full, (size_t)nv);
        printf("# %s: %s at 0.15 vs full: %.2e (reuse %.2e)\n", label, names[sg], es,
               rel(b, full, (size_t)nv));
        if (sg == CB_STRATEGY_RANDOM) { /* the same prompt draws the same rows */
            CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
            CHECKF(memcmp(a, b, sizeof(float) * (size_t)nv) == 0,
                   "random: two runs of one prompt differ");
        }
    }

    tcase("%s: probe's scores equal a plain double loop (the question's last rows, the layers' "
          "windows, the first layers: probe_depth; by value and plain)",
          label);
    {
        int32_t nly = cb_model_hparams(fx.m)->n_layer, n_moved = 0;
        for (int32_t qr = 0; qr <= 3; qr += 3)
            for (int d = 0; d < 5; d++) {
                int bv = d < 4; /* the default, by value, at every depth; plain at all layers */
                /* by cost (the default), all, half, one layer */
                float depth = d == 0 ? 0.0f : d == 1 || d == 4 ? 1.0f : d == 2 ? 0.5f : 0.01f;
                int32_t nl = (int32_t)ceilf(depth * (float)nly - 1e-4f);
                nl = nl < 1 ? 1 : nl;
                p = fixed_defaults();
                p.strategy = CB_STRATEGY_PROBE; /* auto would be hkvd on these short chunks */
                p.probe_rows = qr;
                p.probe_depth = depth;
                CHECK(p.probe_values == 1);
                p.probe_values = bv;
                CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
                if (d == 0)
                    nl = st.probe_layers;
                CHECKF(nl >= 1 && st.probe_layers == nl, "%d layers scored, want %d",
                       st.probe_layers, nl);
                double want = probe_by_hand(&fx, segs, ns, qr, 1, 0.15, nl, bv),
                       nowin = probe_by_hand(&fx, segs, ns, qr, 0, 0.15, nl, bv),
                       other = probe_by_hand(&fx, segs, ns, qr, 1, 0.15, nl, !bv);
                /* -1: the scored layers' windows keep every cached token from the rows
                 * that score (gemma3's first layers, its last question rows): no mass */
                CHECKF(want < 0 ? st.selected_mass == 0 && depth > 0 && qr > 0
                                : fabs(st.selected_mass - want) < 1e-3 * want,
                       "probe rows %d, %d of %d layers: selected mass %.6f, by hand %.6f", qr, nl,
                       nly, st.selected_mass, want);
                printf("# %s: probe rows %d, depth %g, %s: %d of %d layers: selected mass %.6f, "
                       "by hand %.6f (without windows %.6f; %s %.6f)\n",
                       label, qr, (double)depth, bv ? "by value" : "plain", nl, nly,
                       st.selected_mass, want, nowin, bv ? "plain" : "by value", other);
                n_moved += want >= 0 && other >= 0 && fabs(want - other) > 3e-3 * want;
            }
        /* the weighting changes what the reference selects, so it is tested */
        CHECKF(n_moved > 0, "the value norms never moved the selected mass");
        p = fixed_defaults();
        for (int i = 0; i < 3; i++) { /* outside [0, 1]: refused */
            p.probe_depth = i == 0 ? -0.5f : i == 1 ? 1.01f : NAN;
            CHECK(run(&fx, segs, ns, &p, a, &st, NULL) == CB_ERR_INVALID);
        }
        p.probe_depth = 0.0f;
    }
    p.probe_rows = (int32_t)fx.question.n + 100; /* more than the question has: all of it, as 0 */
    CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
    p.probe_rows = 0;
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    CHECK(rel(a, b, (size_t)nv) == 0);

    tcase("%s: probe's depth by cost: every layer while the first pass is at most a quarter of "
          "the second, half of them at least",
          label);
    {
        cb_blend_params q = fixed_defaults();
        CHECK(q.probe_depth == 0.0f);
        /* (uncached rows, rows to recompute) -> layers of 28: a short prompt (65 question
         * rows, 44 to recompute) gets half; a long one (65, 345) all; between, the share */
        CHECK(cb_blend_probe_layers(&q, 28, 65, 44, 0) == 14);
        CHECK(cb_blend_probe_layers(&q, 28, 65, 345, 0) == 28);
        CHECK(cb_blend_probe_layers(&q, 28, 100, 300, 0) == 28);
        CHECK(cb_blend_probe_layers(&q, 28, 100, 200, 0) == 21);
        CHECK(cb_blend_probe_layers(&q, 28, 1, 0, 0) == 14);
        CHECK(cb_blend_probe_layers(&q, 1, 65, 0, 0) == 1);
        CHECK(cb_blend_probe_layers(&q, 28, 65, 44, 1) == 28); /* sliding windows: every layer */
        q.probe_depth = 0.25f;
        CHECK(cb_blend_probe_layers(&q, 28, 65, 345, 0) == 7);
        CHECK(cb_blend_probe_layers(&q, 28, 65, 345, 1) == 7);
        q.probe_depth = 0.01f;
        CHECK(cb_blend_probe_layers(&q, 28, 65, 345, 0) == 1);
    }

    tcase("%s: the plan: its cost figures the given ones (a profile's) or the model's, in the "
          "stats; loading priced slow enough keeps a speedup's ratio at its minimum",
          label);
    {
        cb_blend_params q = cb_blend_defaults();
        q.strategy = CB_STRATEGY_HKVD;
        q.speedup = 1.05f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.costs_given == 0 && st.costs.load == cb_model_load_cost(fx.m) &&
              st.costs.attn == cb_model_attn_cost(fx.m) &&
              st.costs.score == cb_model_score_cost(fx.m));
        float built = st.plan_ratio;
        int at_min = !strcmp(st.plan_bound, "min"); /* (gemma3's windows: full prefill is cheap) */
        int64_t lo = (int64_t)ceilf(0.15f * (float)st.n_cached_tokens);
        CHECKF(st.plan_ratio == st.ratio && (at_min || !strcmp(st.plan_bound, "speedup")) &&
                   (at_min || (int64_t)st.n_recomputed_tokens > lo),
               "built-in: ratio %g (%s), %d recomputed", (double)st.plan_ratio, st.plan_bound,
               st.n_recomputed_tokens);
        q.costs.load = 1e6f;
        q.costs.attn = 3.0f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.costs_given == 3 && st.costs.load == 1e6f && st.costs.attn == 3.0f &&
              st.costs.score == cb_model_score_cost(fx.m));
        CHECKF(!strcmp(st.plan_bound, "min") && st.n_recomputed_tokens == lo &&
                   (at_min ? st.plan_ratio == built : st.plan_ratio < built),
               "slow loading: ratio %g (%s), %d recomputed", (double)st.plan_ratio, st.plan_bound,
               st.n_recomputed_tokens);
        q.costs.score = -1.0f;
        CHECK(run(&fx, segs, ns, &q, a, &st, NULL) == CB_ERR_INVALID);
        /* cb-profile's figures: prefill a layer a L + c L^2 / 2 ms, a a multiply-add of
         * 1e-9 ms over the layer's weights, c an attention multiply-add of 3e-9 ms (attn
         * 3); the first tier 1000 MB/s warm, 1e-6 ms a byte (load 1000); probe's scoring
         * at 1.7 x the attention's time a key (score 1.7), each step within 5% of it */
        cb_profile *pf = calloc(1, sizeof *pf);
        double qd = (double)hp->n_head * hp->head_dim, kvd = (double)hp->n_head_kv * hp->head_dim;
        double wts = (double)hp->n_embd * (2 * qd + 2 * kvd) + 3.0 * hp->n_embd * hp->n_ff;
        static const double wobble[3] = {1.05, 0.97, 1.01};
        for (int i = 0; pf && i < 3; i++) {
            double len = 100 << i;
            pf->prefill[pf->n_prefill++] = (cb_profile_point){
                100 << i, 1.0, wts * 1e-9 * len + 2 * qd * 3e-9 * len * len / 2, 0};
            int64_t keys = 0;
            for (int64_t r = (int64_t)len - 32; r < (int64_t)len; r++)
                keys += r + 1;
            pf->scoring[pf->n_scoring++] = (cb_profile_scoring){
                100 << i, 32, keys, 1.7 * 2 * qd * 3e-9 * (double)keys * wobble[i], 0};
        }
        if (pf)
            pf->tiers[pf->n_tiers++] = (cb_profile_tier){"local", 1000, 500}; /* warm, cold */
            /* score_fit(key_ms): the least squares through the origin of the steps' times on
         * key_ms x their keys, over key_ms (a plain loop) */
#define score_fit(key_ms)                                         \
    do {                                                          \
        double sxt = 0, sxx = 0;                                  \
        for (int i = 0; i < pf->n_scoring; i++) {                 \
            double x = (key_ms) * (double)pf->scoring[i].keys;    \
            sxt += x * pf->scoring[i].ms_per_layer, sxx += x * x; \
        }                                                         \
        ref = sxt / sxx;                                          \
    } while (0)
        double ref = 0;
        if (pf) {
            cb_profile_fit_costs(pf, fx.m);
            score_fit(2 * qd * 3e-9);
        }
        CHECKF(pf && fabs(pf->costs.attn - 3.0) < 1e-3 && fabs(pf->costs.load - 1000.0) < 1e-1 &&
                   fabs(pf->costs.score - ref) < 1e-4 * ref && fabs(ref - 1.7) < 0.05 * 1.7,
               "fitted: load %g, attn %g, score %g (want %g)", pf ? (double)pf->costs.load : 0.0,
               pf ? (double)pf->costs.attn : 0.0, pf ? (double)pf->costs.score : 0.0, ref);
        if (pf) { /* one length: the attention at the built-in figure, loading's and
                   * scoring's from it */
            pf->n_prefill = 1;
            cb_profile_fit_costs(pf, fx.m);
            double y = pf->prefill[0].ms_per_layer / 100, ab = cb_model_attn_cost(fx.m);
            double mac = y / (wts + ab * qd * 100), want = 1e-6 / mac;
            score_fit(ab * 2 * qd * mac);
            CHECKF(pf->costs.attn == 0.0f && fabs(pf->costs.load - want) < 1e-4 * want &&
                       fabs(pf->costs.score - ref) < 1e-4 * ref,
                   "one length: load %g (want %g), attn %g, score %g (want %g)",
                   (double)pf->costs.load, want, (double)pf->costs.attn, (double)pf->costs.score,
                   ref);
            pf->n_scoring = 0; /* a profile from before scoring was measured: the built-in */
            cb_profile_fit_costs(pf, fx.m);
            CHECK(pf->costs.score == 0.0f && pf->costs.load > 0);
        }
#undef score_fit
        free(pf);
    }

    tcase("%s: probe's scoring step timed (cb-profile): the last rows' keys, a time a sample; "
          "a dearer scoring figure lowers probe's --speedup ratio",
          label);
    {
        int32_t L = 40, n = 16, layer = hp->n_layer - 1, toks[40], pos[40];
        int64_t keys = -1, want = 0;
        double ms[3] = {-1, -1, -1};
        cb_fwd *f = NULL;
        cb_kvcache *kv = NULL;
        for (int32_t i = 0; i < L; i++)
            toks[i] = (i * 31 + 7) % hp->n_vocab, pos[i] = i;
        for (int32_t r = L - n, w = cb_model_layer_window(fx.m, layer); r < L; r++)
            want += w > 0 && r + 1 > w ? w : r + 1;
        CHECK_OK(cb_fwd_new(&f, fx.m, L));
        CHECK_OK(cb_kvcache_new(&kv, fx.m, L, CB_TYPE_F16));
        cb_status s = f && kv ? cb_fwd_embed(f, toks, pos, L) : CB_ERR_NOMEM;
        for (int32_t l = 0; l < hp->n_layer && s == CB_OK; l++)
            s = cb_fwd_layer(f, kv, l, NULL, 0);
        CHECK_OK(s);
        if (s == CB_OK) {
            CHECK_OK(cb_profile_time_score(f, kv, layer, L, n, 3, ms, &keys));
            CHECKF(keys == want && ms[0] > 0 && ms[1] > 0 && ms[2] > 0, "%lld keys (want %lld)",
                   (long long)keys, (long long)want);
            CHECK(cb_profile_time_score(f, kv, layer, L, L + 1, 1, ms, &keys) == CB_ERR_RANGE);
            CHECK(cb_profile_time_score(f, kv, hp->n_layer, L, n, 1, ms, &keys) == CB_ERR_RANGE);
            CHECK_OK(cb_profile_time_score(f, kv, 0, L, n, 1, ms, &keys)); /* (none left open) */
        }
        cb_kvcache_free(kv);
        cb_fwd_free(f);
        cb_blend_params q = cb_blend_defaults();
        q.strategy = CB_STRATEGY_PROBE;
        q.speedup = 1.1f;
        q.costs.score = 0.001f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        float cheap = st.plan_ratio;
        int32_t layers = st.probe_layers, at_min = !strcmp(st.plan_bound, "min");
        q.costs.score = 50.0f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        printf("# %s: probe at 1.1x: ratio %g at score 0.001 (%s), %g at 50 (%s)\n", label,
               (double)cheap, at_min ? "min" : "speedup", (double)st.plan_ratio, st.plan_bound);
        CHECKF(layers > 0 && !at_min ? st.plan_ratio < cheap : st.plan_ratio <= cheap,
               "score 0.001: ratio %g (%d layers scored); 50: %g (%s)", (double)cheap, layers,
               (double)st.plan_ratio, st.plan_bound);
    }

    tcase("%s: a speedup: the most rows whose cost (products and attention), as blend computes "
          "them, is at most 1/speedup of full prefill's; the given ratio at least",
          label);
    {
        cb_blend_params q = cb_blend_defaults(), h;
        CHECK(q.speedup == 4.0f && q.n_ratios == 1 && q.ratios[0] == 0.15f);
        q.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        int64_t tot = st.n_prompt_tokens, n_c = st.n_cached_tokens, u = tot - n_c,
                n_cand = cand(&st), lo = (int64_t)ceilf(0.15f * (float)n_c), n_between = 0,
                n_refit = 0, n_all = 0;
        double L = hp->n_layer;
        /* the cost model by hand: a row at position r costs 1 + kc x the keys
         * it sees (a layer's mean), kc a key's 2 n_head head_dim multiply-adds
         * over a layer's weights x cb_model_attn_cost; the sums: every row,
         * the uncached, the candidates, the keys the question's rows see (x cb_model_score_cost);
         * then loading (every cached row's K and V bytes x
         * cb_model_load_cost, over a row's multiply-adds through every
         * layer) and the keys the attention's blocks of B rows compute and
         * mask: (min(n, B) - 1) / 2 x the span of n rows (wst), probe's
         * first pass block by block (W1) */
        double qd = (double)hp->n_head * hp->head_dim, kvd = (double)hp->n_head_kv * hp->head_dim;
        double wts = (double)hp->n_embd * (2 * qd + 2 * kvd) + 3.0 * hp->n_embd * hp->n_ff;
        double kc = cb_model_attn_cost(fx.m) * 2 * qd / wts;
        int64_t B = cb_model_attn_rows(fx.m);
        double F = 0, U = 0, C = 0, S = 0, W1 = 0, Ld, span = (double)tot;
        int32_t xe = exact_end(segs, ns), unc[512], n_unc = 0;
        CHECK(B > 1 && cb_model_load_cost(fx.m) > 0); /* the CPU declares both */
#define wst(n) ((n) > 1 ? kc * (double)(((n) < B ? (n) : B) - 1) / 2 * span : 0.0)
        for (int32_t sg = 0; sg < xe && segs[sg].kv; sg++)
            span -= segs[sg].n; /* a leading exact prefix: never computed */
        Ld = (double)n_c * 2 * L * (double)cb_type_row_bytes(CB_TYPE_F32, (int64_t)kvd) *
             cb_model_load_cost(fx.m) / (wts * L);
        for (int32_t sg = 0, r = 0; sg < ns; sg++)
            for (int32_t j = 0; j < segs[sg].n; j++, r++) {
                double keys = 0;
                for (int32_t l = 0; l < hp->n_layer; l++) {
                    int32_t w = cb_model_layer_window(fx.m, l);
                    keys += w > 0 && r + 1 > w ? w : r + 1;
                }
                double c = 1 + kc * keys / L;
                F += c;
                if (segs[sg].kv && r != tot - 1)
                    C += sg >= xe ? c : 0;
                else
                    U += c, /* the question's rows score */
                        S += sg == ns - 1 ? (c - 1) * cb_model_score_cost(fx.m) : 0,
                        unc[n_unc++] = r;
            }
        F += kc * (double)((tot < B ? tot : B) - 1) / 2 * (double)tot; /* full prefill's rows */
        for (int32_t i = 0; i < n_unc; i += (int32_t)B)
            for (int32_t k = i, ke = i + (int32_t)B < n_unc ? i + (int32_t)B : n_unc; k < ke; k++)
                W1 += kc * (unc[ke - 1] - unc[k]);
        /* (below 1: every row recomputed, which costs more than full prefill with the loading) */
        static const float speedups[] = {0.5f, 0.7f, 0.8f, 0.9f, 1.01f, 1.05f,  1.1f,
                                         1.2f, 1.5f, 2.0f, 3.0f, 4.0f,  1000.0f};
        static const cb_blend_strategy strats[] = {CB_STRATEGY_AUTO, CB_STRATEGY_PROBE,
                                                   CB_STRATEGY_HKVD};
        for (size_t si = 0; si < 3; si++)
            for (size_t k = 0; k < sizeof speedups / sizeof speedups[0]; k++) {
                q = cb_blend_defaults();
                q.strategy = strats[si];
                q.speedup = speedups[k];
                double limit = F / q.speedup;
                CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
                /* the prediction before any selection, at the candidates' mean
                 * cost: down from every candidate row to the first that fits;
                 * auto takes probe's when it is 3x the uncached rows, else hkvd's */
                int64_t want[2];
                int32_t nl = 0;
                double cost[2];
                for (int probe = 0; probe < 2; probe++) {
                    int64_t w = n_cand;
                    for (;; w--) {
                        nl = probe && w > 0 && w < n_cand
                                 ? cb_blend_probe_layers(&q, hp->n_layer, (int64_t)u, w,
                                                         hp->n_swa_layers > 0)
                                 : 0;
                        double sel = C * (double)w / (double)n_cand;
                        cost[probe] = probe ? (U + S + W1) * nl / L + U + sel + wst(u + w) + Ld
                                            : (U + C + wst(u + n_cand)) / L +
                                                  (U + sel + wst(u + w)) * (L - 1) / L + Ld;
                        if (w <= lo || cost[probe] <= limit)
                            break;
                    }
                    want[probe] = w;
                }
                int probe = strats[si] == CB_STRATEGY_PROBE ||
                            (strats[si] == CB_STRATEGY_AUTO &&
                             (want[1] >= 3 * u || want[1] == 0 || hp->n_swa_layers > 0));
                const char *how = probe ? "probe" : "hkvd";
                CHECKF(st.strategy == (int32_t)(probe ? CB_STRATEGY_PROBE : CB_STRATEGY_HKVD),
                       "%s at %g: ran %d", how, (double)q.speedup, (int)st.strategy);
                int64_t got = st.n_recomputed_tokens;
                if (!probe || nl == 0) { /* the predicted budget is the selection */
                    CHECKF(got == want[probe] &&
                               !strcmp(st.ratio_bound, cost[probe] <= limit ? "speedup" : "min"),
                           "%s at %g: %lld rows (%s), want %lld (%s, predicted %.3f)", how,
                           (double)q.speedup, (long long)got, st.ratio_bound,
                           (long long)want[probe], cost[probe] <= limit ? "speedup" : "min",
                           F / cost[probe]);
                } else { /* probe selects by the costs of its top rows: the most that fit
                          * what the first pass and the uncached rows leave, lo at least */
                    CHECKF(st.probe_layers == nl &&
                               (!strcmp(st.ratio_bound, "speedup")
                                    ? got >= lo && st.pred_speedup >= q.speedup * (1 - 1e-5f)
                                    : !strcmp(st.ratio_bound, "min") && got == lo &&
                                          st.pred_speedup < q.speedup * (1 + 1e-5f)),
                           "probe at %g: %lld rows (%s, predicted %.3f), %d layers (%d)",
                           (double)q.speedup, (long long)got, st.ratio_bound,
                           (double)st.pred_speedup, st.probe_layers, nl);
                    if (got < n_cand) { /* one more row would not fit */
                        h = fixed_defaults();
                        h.strategy = CB_STRATEGY_PROBE;
                        h.probe_depth = (float)nl / (float)hp->n_layer;
                        h.stale_scale = q.stale_scale;
                        h.ratios[0] = (float)(got + 1) / (float)n_c;
                        while ((int64_t)ceilf(h.ratios[0] * (float)n_c) > got + 1)
                            h.ratios[0] = nextafterf(h.ratios[0], 0.0f);
                        while ((int64_t)ceilf(h.ratios[0] * (float)n_c) < got + 1)
                            h.ratios[0] = nextafterf(h.ratios[0], 2.0f);
                        cb_blend_stats s1;
                        CHECK_OK(run(&fx, segs, ns, &h, b, &s1, NULL));
                        n_refit += !strcmp(st.ratio_bound, "speedup");
                        CHECKF(s1.n_recomputed_tokens == got + 1 &&
                                   s1.pred_speedup < q.speedup * (1 + 1e-5f),
                               "probe at %g: %lld + 1 rows predict %.4f", (double)q.speedup,
                               (long long)got, (double)s1.pred_speedup);
                    }
                }
                double all =
                    U + C + wst(u + n_cand) + Ld + (probe ? (U + S + W1) * st.probe_layers / L : 0);
                n_all += got == n_cand;
                if (got == n_cand) /* every row's cost known: the prediction by hand */
                    CHECKF(fabs(st.pred_speedup * all / F - 1) < 1e-5,
                           "%s at %g: every row, predicted %.4f, by hand %.4f", how,
                           (double)q.speedup, (double)st.pred_speedup, F / all);
                n_between += got > lo && got < n_cand;
                /* the same as that ratio (and probe's depth), given, bit for bit */
                h = fixed_defaults();
                h.strategy = (cb_blend_strategy)st.strategy;
                h.ratios[0] = st.ratio;
                h.stale_scale = q.stale_scale;
                if (probe && st.probe_layers > 0)
                    h.probe_depth = (float)st.probe_layers / (float)hp->n_layer;
                cb_blend_stats sh;
                CHECK_OK(run(&fx, segs, ns, &h, b, &sh, NULL));
                CHECKF(rel(a, b, (size_t)nv) == 0 &&
                           sh.n_recomputed_tokens == st.n_recomputed_tokens &&
                           sh.pred_speedup == st.pred_speedup,
                       "at %g: %d rows, ratio %.4f given: %d (predicted %.4f, %.4f)",
                       (double)q.speedup, st.n_recomputed_tokens, (double)st.ratio,
                       sh.n_recomputed_tokens, (double)st.pred_speedup, (double)sh.pred_speedup);
            }
        /* a fixture too small for any budget between the bounds would test only them;
         * probe's selection by its rows' costs, bound by the speedup, at least once */
        CHECKF(n_between > 0 && n_refit > 0 && n_all > 0,
               "%lld cached rows (%lld candidates), %lld uncached: %lld between, %lld by cost, "
               "%lld every row",
               (long long)n_c, (long long)n_cand, (long long)u, (long long)n_between,
               (long long)n_refit, (long long)n_all);
#undef wst
        q = cb_blend_defaults(); /* an adaptive ratio sets its own */
        q.adapt_mass = 0.5f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(strcmp(st.ratio_bound, "speedup") != 0 && strcmp(st.ratio_bound, "given") != 0);
        q = cb_blend_defaults(); /* refused: gradual filtering, a speedup below 0 or not a number */
        q.strategy = CB_STRATEGY_HKVD;
        q.n_ratios = 2;
        q.ratios[1] = 0.1f;
        CHECK(run(&fx, segs, ns, &q, a, &st, NULL) == CB_ERR_INVALID);
        q.speedup = 0.0f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        q = cb_blend_defaults();
        for (int i = 0; i < 2; i++) {
            q.speedup = i ? NAN : -1.0f;
            CHECK(run(&fx, segs, ns, &q, a, &st, NULL) == CB_ERR_INVALID);
        }
        q = cb_blend_defaults(); /* the other modes: no speedup, no prediction */
        q.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.pred_speedup == 0.0f && !strcmp(st.ratio_bound, "given"));
    }

    tcase("%s: the loading controller (ratio_auto): the most rows whose computing the loading "
          "hides, on --speedup's cost model and figures; the given ratio at least",
          label);
    {
        static const cb_blend_strategy sgs[] = {CB_STRATEGY_HKVD, CB_STRATEGY_PROBE};
        int n_between = 0, n_min = 0, n_all = 0;
        for (int k = 0; k < 2; k++) {
            cb_blend_params q = cb_blend_defaults();
            q.strategy = sgs[k];
            q.speedup = 0.0f;
            q.ratio_auto = 1;
            q.ratios[0] = 0.05f;
            /* loading priced at 1 and 1e8 a byte (the least ratio, every row), then at
             * figures whose predicted loading lies a quarter, half, three quarters of the
             * way from the least ratio's computing to every row's (it is linear in it) */
            float loads[5] = {1.0f, 1e8f}, ratio[5], sp_ratio[2];
            double per_load = 0, rec[2] = {0};
            for (int i = 0; i < 5; i++) {
                if (i >= 2)
                    loads[i] = (float)((rec[0] + (rec[1] - rec[0]) * (i - 1) / 4.0) / per_load);
                q.costs.load = loads[i];
                CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
                int64_t n_c = st.n_cached_tokens, w = (int64_t)ceilf(st.plan_ratio * (float)n_c);
                int64_t lo = (int64_t)ceilf(0.05f * (float)n_c);
                int load = !strcmp(st.plan_bound, "load");
                ratio[i] = st.plan_ratio;
                if (i < 2)
                    rec[i] = st.pred_recompute;
                if (i == 0)
                    per_load = st.pred_load / loads[0];
                CHECKF(st.plan_ratio == st.ratio && w >= lo && w <= cand(&st) &&
                           (load || !strcmp(st.plan_bound, "min")) &&
                           (load ? st.pred_recompute <= st.pred_load
                                 : st.pred_recompute > st.pred_load && w == lo) &&
                           st.costs_given == 1 && st.pred_load > 0 &&
                           (i < 3 || ratio[i] >= ratio[i - 1]) &&
                           (i < 2 || (ratio[i] >= ratio[0] && ratio[i] <= ratio[1])),
                       "%s, load %g: ratio %g (%lld rows of %lld, %s), predicted load %g, "
                       "recompute %g",
                       k ? "probe" : "hkvd", (double)q.costs.load, (double)st.plan_ratio,
                       (long long)w, (long long)cand(&st), st.plan_bound, (double)st.pred_load,
                       (double)st.pred_recompute);
                n_min += !load, n_all += load && w == cand(&st);
                if (load && w < cand(&st) && w > lo) { /* one row more is not hidden */
                    cb_blend_params up = q;
                    cb_blend_stats su;
                    up.ratios[0] = (float)(w + 1) / (float)n_c;
                    while ((int64_t)ceilf(up.ratios[0] * (float)n_c) > w + 1)
                        up.ratios[0] = nextafterf(up.ratios[0], 0.0f);
                    CHECK_OK(run(&fx, segs, ns, &up, a, &su, NULL));
                    CHECKF(!strcmp(su.plan_bound, "min") && su.pred_recompute > su.pred_load &&
                               su.pred_load == st.pred_load,
                           "%s, load %g: %lld + 1 rows: %s, recompute %g, load %g",
                           k ? "probe" : "hkvd", (double)q.costs.load, (long long)w, su.plan_bound,
                           (double)su.pred_recompute, (double)su.pred_load);
                    n_between++;
                }
                if (i < 2) { /* the same figure moves --speedup the other way */
                    cb_blend_params sp = q;
                    sp.ratio_auto = 0;
                    sp.speedup = 1.05f;
                    CHECK_OK(run(&fx, segs, ns, &sp, a, &st, NULL));
                    CHECK(st.costs.load == q.costs.load);
                    sp_ratio[i] = st.plan_ratio;
                }
            }
            CHECKF(ratio[0] < ratio[1] && sp_ratio[0] >= sp_ratio[1],
                   "%s: loading cheap and dear: --ratio auto %g, %g; --speedup %g, %g",
                   k ? "probe" : "hkvd", (double)ratio[0], (double)ratio[1], (double)sp_ratio[0],
                   (double)sp_ratio[1]);
        }
        CHECKF(n_between > 0 && n_min > 0 && n_all > 0,
               "%d between the bounds, %d at the least ratio, %d every row", n_between, n_min,
               n_all);
        cb_blend_params q = cb_blend_defaults(); /* the built-in figures, by default */
        q.speedup = 0.0f;
        q.ratio_auto = 1;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.costs_given == 0 && st.costs.load == cb_model_load_cost(fx.m) &&
              st.pred_load > 0 && st.plan_ratio >= 0.15f);
        q.speedup = 2.0f; /* refused: with a speedup, an adaptive ratio or gradual filtering */
        CHECK(run(&fx, segs, ns, &q, a, &st, NULL) == CB_ERR_INVALID);
        q.speedup = 0.0f;
        q.adapt_mass = 0.5f;
        CHECK(run(&fx, segs, ns, &q, a, &st, NULL) == CB_ERR_INVALID);
        q.adapt_mass = 0.0f;
        q.n_ratios = 2;
        q.ratios[1] = 0.1f;
        CHECK(run(&fx, segs, ns, &q, a, &st, NULL) == CB_ERR_INVALID);
    }

    tcase("%s: auto is hkvd where fewer rows are to be recomputed than 3x those without a cache, "
          "else probe",
          label);
    {
        cb_blend_params q = fixed_defaults(), h;
        CHECK(q.strategy == CB_STRATEGY_AUTO);
        q.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        int32_t n_c = st.n_cached_tokens, n_unc = 0;
        for (int32_t s = 0; s < ns; s++)
            n_unc += segs[s].n;
        n_unc -= n_c;
        /* the ratio just under / at three times the uncached rows' count (a
         * prompt with too few cached rows for the second: hkvd at every ratio
         * up to 1, the first tried at 1) */
        float r_lo = (3.0f * (float)n_unc - 1.5f) / (float)n_c,
              r_hi = 3.0f * (float)n_unc / (float)n_c;
        r_lo = r_lo < 1.0f ? r_lo : 1.0f;
        CHECKF(n_unc > 2, "%d uncached rows, %d cached", n_unc, n_c);
        if (r_hi > 1.0f)
            printf("# %s: %d uncached rows, %d cached: auto is hkvd up to ratio 1\n", label, n_unc,
                   n_c);
        for (int hi = 0; hi < 2 && !(hi && r_hi > 1.0f); hi++) {
            q = fixed_defaults();
            q.ratios[0] = hi ? r_hi : r_lo;
            CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
            h = q; /* sliding-window layers (gemma3): always probe */
            h.strategy = hi || hp->n_swa_layers > 0 ? CB_STRATEGY_PROBE : CB_STRATEGY_HKVD;
            cb_blend_stats sh;
            CHECK_OK(run(&fx, segs, ns, &h, b, &sh, NULL));
            CHECKF(st.strategy == (int32_t)h.strategy && sh.strategy == (int32_t)h.strategy &&
                       rel(a, b, (size_t)nv) == 0 &&
                       st.n_recomputed_tokens == sh.n_recomputed_tokens,
                   "ratio %.3f: ran %d, want %d", (double)q.ratios[0], (int)st.strategy,
                   (int)h.strategy);
        }
        q = fixed_defaults(); /* probe whatever the budget: a fixed depth, a mass, ratio 0 */
        q.ratios[0] = r_lo;
        q.probe_depth = 0.5f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.strategy == (int32_t)CB_STRATEGY_PROBE);
        q.probe_depth = 0.0f;
        q.adapt_mass = 0.5f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.strategy == (int32_t)CB_STRATEGY_PROBE);
        q.adapt_mass = 0.0f;
        q.ratios[0] = 0.0f;
        CHECK_OK(run(&fx, segs, ns, &q, a, &st, NULL));
        CHECK(st.strategy == (int32_t)CB_STRATEGY_PROBE && st.n_recomputed_tokens == 0);
    }

    tcase("%s: probe's adaptive ratio: the fewest tokens holding the mass, within its bounds",
          label);
    {
        int32_t n_sel[3];
        float masses[3] = {0.3f, 0.6f, 0.9f};
        p = fixed_defaults();
        p.strategy = CB_STRATEGY_PROBE;
        p.adapt_min = 0.0f;
        p.adapt_max = 1.0f;
        for (int i = 0; i < 3; i++) {
            p.adapt_mass = masses[i];
            CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
            n_sel[i] = st.n_selected[0];
            CHECKF(!strcmp(st.ratio_bound, "mass") && st.selected_mass >= masses[i] &&
                       fabsf(st.ratio - (float)n_sel[i] / st.n_cached_tokens) < 1e-6,
                   "mass %.1f: %d selected, %.3f of the mass, bound %s", masses[i], n_sel[i],
                   st.selected_mass, st.ratio_bound);
            printf("# %s: mass %.1f: ratio %.3f (%d of %d)\n", label, masses[i], st.ratio, n_sel[i],
                   st.n_cached_tokens);
        }
        CHECK(0 < n_sel[0] && n_sel[0] <= n_sel[1] && n_sel[1] <= n_sel[2]);
        p.adapt_mass = 0.6f; /* one token fewer would not hold it: the choice is the smallest */
        p.adapt_max = ((float)n_sel[1] - 1.5f) / (float)st.n_cached_tokens; /* ceil: n_sel[1] - 1 */
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECKF(!strcmp(st.ratio_bound, "max") && st.n_selected[0] == n_sel[1] - 1 &&
                   st.selected_mass < 0.6f,
               "%s %d %.3f", st.ratio_bound, st.n_selected[0], st.selected_mass);
        p.adapt_mass = 1e-6f;
        p.adapt_min = 0.2f;
        p.adapt_max = 0.5f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECK(!strcmp(st.ratio_bound, "min") &&
              st.n_selected[0] == (int32_t)ceilf(0.2f * st.n_cached_tokens));
        p.strategy = CB_STRATEGY_HKVD;
        CHECK(run(&fx, segs, ns, &p, a, &st, NULL) == CB_ERR_INVALID);
        p = fixed_defaults(); /* probe selects once */
        p.strategy = CB_STRATEGY_PROBE;
        p.n_ratios = 2;
        p.ratios[1] = 0.1f;
        CHECK(run(&fx, segs, ns, &p, a, &st, NULL) == CB_ERR_INVALID);
    }

    tcase("%s: prefix caching reuses a true prefix exactly, and nothing else", label);
    cb_segment ps[3] = {{fx.lead.ids, (int32_t)fx.lead.n, NULL},
                        {fx.chunk[0].ids, (int32_t)fx.chunk[0].n, fx.file[0]},
                        {fx.question.ids, (int32_t)fx.question.n, NULL}};
    p = fixed_defaults();
    p.mode = CB_MODE_FULL;
    CHECK_OK(run(&fx, ps, 3, &p, full, &st, NULL));
    p.mode = CB_MODE_PREFIX;
    CHECK_OK(run(&fx, ps, 3, &p, a, &st, NULL));
    CHECK(st.n_cached_tokens == (int32_t)fx.chunk[0].n);
    e = rel(a, full, (size_t)nv);
    CHECKF(e < tol_full, "prefix vs full %.3g", e);
    CHECK_OK(run(&fx, segs, ns, &p, a, &st,
                 NULL)); /* the 3-chunk prompt: chunk 1 is a true prefix too */
    CHECK(st.n_cached_tokens == (int32_t)fx.chunk[0].n);
    cb_segment shifted[4] = {ps[0], {fx.sep.ids, (int32_t)fx.sep.n, NULL}, ps[1], ps[2]};
    CHECK_OK(run(&fx, shifted, 4, &p, a, &st, NULL));
    CHECK(st.n_cached_tokens == 0); /* not after its lead-in: nothing reused */

    tcase("%s: blend keeps a true prefix's cache as loaded, and only that one", label);
    {
        /* chunk 0 right after its lead-in is exact: at ratio 1 every other
         * cached row is recomputed, its rows stay as reuse loads them */
        int32_t n0 = (int32_t)fx.chunk[0].n, n1 = (int32_t)fx.chunk[1].n, p0 = (int32_t)fx.lead.n;
        int32_t p1 = p0 + n0 + (int32_t)fx.sep.n;
        int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
        float *kr = malloc(sizeof(float) * 512 * w), *kbl = malloc(sizeof(float) * 512 * w);
        cb_kvcache *kreuse = NULL, *kblend = NULL;
        p = fixed_defaults();
        p.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, &kreuse));
        CHECK(st.n_exact_tokens == n0); /* reuse knows it too (no temperature on it) */
        p.mode = CB_MODE_BLEND;
        p.ratios[0] = 1.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, &kblend));
        CHECKF(st.n_exact_tokens == n0 && exact_end(segs, ns) == 2,
               "%d exact tokens, chunk 0 has %d", st.n_exact_tokens, n0);
        int same0 = 1, same1 = 1;
        for (int l = 0; l < hp->n_layer && kreuse && kblend; l++)
            for (int kv_ = 0; kv_ < 2; kv_++) {
                cb_kvcache_read(kreuse, l, kv_, 0, p1 + n1, kr);
                cb_kvcache_read(kblend, l, kv_, 0, p1 + n1, kbl);
                same0 &= memcmp(kr + p0 * w, kbl + p0 * w, sizeof(float) * (size_t)(n0 * w)) == 0;
                same1 &= l == 0 ||
                         memcmp(kr + p1 * w, kbl + p1 * w, sizeof(float) * (size_t)(n1 * w)) == 0;
            }
        CHECKF(same0, "chunk 0's K/V were recomputed");
        CHECKF(!same1, "chunk 1's K/V were not recomputed");
        cb_segment moved[16];
        int order3[3] = {1, 0, 2};
        int32_t ns3 = build(&fx, order3, moved); /* chunk 1 first: exact; chunk 0 elsewhere: not */
        CHECK_OK(run(&fx, moved, ns3, &p, a, &st, NULL));
        CHECK(st.n_exact_tokens == n1 && exact_end(moved, ns3) == 2);
        cb_segment lagged[16] = {segs[0], {fx.sep.ids, (int32_t)fx.sep.n, NULL}};
        for (int32_t i = 1; i < ns; i++)
            lagged[i + 1] = segs[i];
        CHECK_OK(
            run(&fx, lagged, ns + 1, &p, a, &st, NULL)); /* not after its lead-in: none exact */
        CHECK(st.n_exact_tokens == 0 && exact_end(lagged, ns + 1) == 0 &&
              st.n_recomputed_tokens == st.n_cached_tokens);
        free(kr), free(kbl);
        cb_kvcache_free(kreuse), cb_kvcache_free(kblend);
    }

    tcase("%s: a chunk's cache computed after the chunk before it is a true prefix after it",
          label);
    {
        /* chunk 1 precomputed after [lead][chunk 0][sep] (cb-precompute
         * --context): right after chunk 0 it is exact too, in every mode */
        int32_t n0 = (int32_t)fx.chunk[0].n, n1 = (int32_t)fx.chunk[1].n;
        cb_tokens lead1 = {0};
        cb_kvfile *f1 = NULL;
        cb_fwd *fw = NULL;
        cb_kvcache *kc = NULL;
        void *buf = NULL;
        size_t size = 0;
        char path[1024];
        cb_error err;
        for (size_t i = 0; i < fx.lead.n; i++)
            cb_tokens_push(&lead1, fx.lead.ids[i]);
        for (int32_t i = 0; i < n0; i++)
            cb_tokens_push(&lead1, fx.chunk[0].ids[i]);
        for (size_t i = 0; i < fx.sep.n; i++)
            cb_tokens_push(&lead1, fx.sep.ids[i]);
        snprintf(path, sizeof path, "%s/blend-after-%s.cbkv", tmpdir(), cb_type_name(kvt));
        CHECK_OK(cb_fwd_new(&fw, fx.m, 512));
        CHECK_OK(cb_kvcache_new(&kc, fx.m, 512, CB_TYPE_F32));
        CHECK_OK(cb_kv_precompute(fw, kc, lead1.ids, (int32_t)lead1.n, fx.chunk[1].ids, n1, kvt,
                                  &buf, &size));
        CHECK_OK(cb_file_write_atomic(path, buf, size, &err));
        CHECK_OK(cb_kvfile_open(&f1, path, &err));
        cb_segment two[5] = {{fx.lead.ids, (int32_t)fx.lead.n, NULL},
                             {fx.chunk[0].ids, n0, fx.file[0]},
                             {fx.sep.ids, (int32_t)fx.sep.n, NULL},
                             {fx.chunk[1].ids, n1, f1},
                             {fx.question.ids, (int32_t)fx.question.n, NULL}};
        p = fixed_defaults();
        p.mode = CB_MODE_FULL;
        CHECK_OK(run(&fx, two, 5, &p, full, &st, NULL));
        p.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, two, 5, &p, a, &st, NULL));
        e = rel(a, full, (size_t)nv);
        CHECKF(e < tol_full && st.n_exact_tokens == n0 + n1 && exact_end(two, 5) == 4,
               "reuse vs full %.3g, %d exact tokens of %d", e, st.n_exact_tokens, n0 + n1);
        p.mode = CB_MODE_PREFIX;
        CHECK_OK(run(&fx, two, 5, &p, b, &st, NULL));
        CHECKF(st.n_cached_tokens == n0 + n1 && rel(b, full, (size_t)nv) < tol_full,
               "prefix caching reused %d tokens of %d", st.n_cached_tokens, n0 + n1);
        two[3].kv = fx.file[1]; /* its own cache there: not exact, reuse is not full */
        p.mode = CB_MODE_REUSE;
        CHECK_OK(run(&fx, two, 5, &p, b, &st, NULL));
        CHECK(st.n_exact_tokens == n0 && exact_end(two, 5) == 2 && rel(b, full, (size_t)nv) > e);
        cb_segment three[16];
        int32_t n3 = build(&fx, order, three); /* [lead] c0 sep c1 sep c2 [question] */
        three[3].kv = f1;
        p.mode = CB_MODE_BLEND;
        p.ratios[0] = 0.5f;
        CHECK_OK(run(&fx, three, n3, &p, a, &st, NULL));
        int32_t want = (int32_t)ceilf(0.5f * (float)st.n_cached_tokens);
        CHECKF(st.n_exact_tokens == n0 + n1 && cand(&st) == (int32_t)fx.chunk[2].n &&
                   st.n_recomputed_tokens == (want < cand(&st) ? want : cand(&st)),
               "%d exact, %d recomputed of %d cached", st.n_exact_tokens, st.n_recomputed_tokens,
               st.n_cached_tokens);
        three[3].kv = NULL; /* chunk 1 computed: chunk 2's cache is not after it */
        CHECK_OK(run(&fx, three, n3, &p, a, &st, NULL));
        CHECK(st.n_exact_tokens == n0 && exact_end(three, n3) == 2);
        free(buf);
        cb_kvfile_free(f1);
        cb_kvcache_free(kc);
        cb_fwd_free(fw);
        cb_tokens_free(&lead1);
    }

    tcase(
        "%s: key_temp divides the loaded keys of all but a true prefix, and ratio 1 still is full",
        label);
    {
        /* reuse with T: every cached key but chunk 0's is T=1's divided by T
         * (RoPE is linear: rotating a scaled key scales the rotated one), the
         * values unchanged; blend at ratio 0 is that reuse; at ratio 1 every
         * scaled key is recomputed, so full prefill again */
        const float T = 1.25f;
        int32_t n_all = 0, lo = (int32_t)fx.lead.n, hi = lo + (int32_t)fx.chunk[0].n;
        for (int32_t s = 0; s < ns; s++)
            n_all += segs[s].n;
        int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
        float *k1 = malloc(sizeof(float) * (size_t)(n_all * w)),
              *kt = malloc(sizeof(float) * (size_t)(n_all * w));
        float *v1 = malloc(sizeof(float) * (size_t)(n_all * w)),
              *vt = malloc(sizeof(float) * (size_t)(n_all * w));
        cb_kvcache *kv1 = NULL, *kvT = NULL;
        p = fixed_defaults();
        p.mode = CB_MODE_REUSE;
        p.key_temp = 1.0f;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, &kv1));
        p.key_temp = T;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, &kvT));
        double worst = 0;
        int exact_same = 1, v_same = 1, scaled_rows = 0;
        for (int l = 0; l < hp->n_layer && kv1 && kvT; l++) {
            cb_kvcache_read(kv1, l, 0, 0, n_all, k1), cb_kvcache_read(kvT, l, 0, 0, n_all, kt);
            cb_kvcache_read(kv1, l, 1, 0, n_all, v1), cb_kvcache_read(kvT, l, 1, 0, n_all, vt);
            int32_t at = 0;
            for (int32_t s = 0; s < ns; at += segs[s++].n) {
                if (!segs[s].kv) /* computed rows: they attended to the scaled keys */
                    continue;
                for (int32_t r = at; r < at + segs[s].n && r < n_all - 1; r++) {
                    v_same &= memcmp(v1 + r * w, vt + r * w, sizeof(float) * (size_t)w) == 0;
                    if (r >= lo && r < hi) {
                        exact_same &=
                            memcmp(k1 + r * w, kt + r * w, sizeof(float) * (size_t)w) == 0;
                        continue;
                    }
                    double d = 0, m = 0; /* relative to the row's largest element */
                    for (int64_t j = 0; j < w; j++) {
                        double want = (double)k1[r * w + j] / T;
                        d = fabs(kt[r * w + j] - want) > d ? fabs(kt[r * w + j] - want) : d;
                        m = fabs(want) > m ? fabs(want) : m;
                    }
                    worst = d / m > worst ? d / m : worst;
                    scaled_rows += l == 0;
                }
            }
        }
        CHECKF(worst < 1e-5 && exact_same && v_same && scaled_rows > 0,
               "scaled keys off by %.3g (relative), chunk 0 kept %d, values kept %d, %d rows",
               worst, exact_same, v_same, scaled_rows);
        p.mode = CB_MODE_BLEND;
        p.ratios[0] = 0.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECKF(rel(a, b, (size_t)nv) < tol_reuse, "ratio 0 vs reuse, both at T: %.3g",
               rel(a, b, (size_t)nv));
        p.ratios[0] = 1.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        p.mode = CB_MODE_FULL;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
        CHECKF(rel(a, b, (size_t)nv) < tol_full, "ratio 1 at T vs full: %.3g",
               rel(a, b, (size_t)nv));
        p = fixed_defaults();
        p.key_temp = -1.0f;
        CHECK(run(&fx, segs, ns, &p, a, &st, NULL) == CB_ERR_INVALID);
        free(k1), free(kt), free(v1), free(vt);
        cb_kvcache_free(kv1), cb_kvcache_free(kvT);
    }

    tcase("%s: stale_scale flags the rows a blend leaves stale (and only those), which "
          "changes its answer; 1, reuse, full and ratio 1 are as without it",
          label);
    {
        cb_kvcache *ks = NULL;
        float *c = malloc(sizeof(float) * (size_t)nv);
        p = fixed_defaults();
        p.ratios[0] = 0.3f;
        p.stale_scale = 1.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECK(st.stale_scale == 1.0f);
        p.stale_scale = 0.35f;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, &ks));
        int32_t flagged = 0, left = cand(&st) - st.n_recomputed_tokens;
        for (int32_t r = 0; ks && r < ks->n_stale; r++)
            flagged += ks->stale[r];
        CHECKF(st.stale_scale == 0.35f && left > 0 && flagged == left &&
                   ks->stale_bias == logf(0.35f) && rel(a, b, (size_t)nv) > 1e-6,
               "stats %g, %d flagged of %d left stale, logits moved %.3g", (double)st.stale_scale,
               flagged, left, rel(a, b, (size_t)nv));
        /* the next prompt in that cache starts without them */
        cb_fwd *fw = NULL;
        cb_error err;
        cb_fwd_new(&fw, fx.m, 512);
        p.mode = CB_MODE_REUSE;
        CHECK_OK(cb_blend_prefill(fw, ks, segs, ns, &p, c, &st, &err));
        CHECK(ks->n_stale == 0 && st.stale_scale == 1.0f);
        cb_fwd_free(fw);
        cb_kvcache_free(ks);
        p.stale_scale = 1.0f; /* reuse, full, ratio 1: nothing is left stale to scale */
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        p.stale_scale = 0.35f;
        CHECK_OK(run(&fx, segs, ns, &p, c, &st, NULL));
        CHECK(memcmp(a, c, sizeof(float) * (size_t)nv) == 0 && st.stale_scale == 1.0f);
        p.mode = CB_MODE_BLEND;
        p.ratios[0] = 1.0f;
        p.stale_scale = 1.0f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        p.stale_scale = 0.35f;
        CHECK_OK(run(&fx, segs, ns, &p, c, &st, NULL));
        CHECK(memcmp(a, c, sizeof(float) * (size_t)nv) == 0);
        p.mode = CB_MODE_FULL;
        CHECK_OK(run(&fx, segs, ns, &p, c, &st, NULL));
        CHECK(st.stale_scale == 1.0f);
        p = fixed_defaults();
        p.stale_scale = -1.0f;
        CHECK(run(&fx, segs, ns, &p, a, &st, NULL) == CB_ERR_INVALID);
        /* the default: the architecture's (qwen2 0.35, else 1) with probe;
         * 1 with the check-layer strategies (unless given) */
        const float want = strcmp(hp->arch, "qwen2") == 0 ? 0.35f : 1.0f;
        p = cb_blend_defaults();
        p.speedup = 0.0f;
        p.ratios[0] = 0.3f;
        p.strategy = CB_STRATEGY_PROBE;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECKF(p.stale_scale == 0.0f && cb_blend_stale_scale(fx.m, &p) == want &&
                   st.stale_scale == want,
               "%s: %g, stats %g", hp->arch, (double)cb_blend_stale_scale(fx.m, &p),
               (double)st.stale_scale);
        p.strategy = CB_STRATEGY_HKVD;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECK(st.stale_scale == 1.0f);
        p.stale_scale = 0.35f;
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECK(st.stale_scale == 0.35f);
        free(c);
    }

    tcase("%s: the default key temperature is the architecture's (gemma3 1.05, else 1)", label);
    {
        const float want = strcmp(hp->arch, "gemma3") == 0 ? 1.05f : 1.0f;
        p = fixed_defaults();
        p.mode = CB_MODE_REUSE;
        CHECK(p.key_temp == 0.0f && cb_blend_key_temp(fx.m, &p) == want);
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECKF(st.key_temp == want, "stats say %g", (double)st.key_temp);
        p.key_temp = want; /* the same run, bit for bit */
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
        CHECK(memcmp(a, b, sizeof(float) * (size_t)nv) == 0);
        p.key_temp = 1.0f; /* and on gemma3 not the unscaled one */
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
        CHECK((memcmp(a, b, sizeof(float) * (size_t)nv) != 0) == (want != 1.0f) &&
              st.key_temp == 1.0f);
        p.key_temp = 1.3f;
        p.mode = CB_MODE_FULL; /* nothing loaded: no temperature */
        CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
        CHECK(st.key_temp == 1.0f && cb_blend_key_temp(fx.m, &p) == 1.3f);
    }

    tcase("%s: reordering chunks only moves their caches", label);
    int order2[3] = {2, 0, 1};
    cb_segment segs2[16];
    int32_t ns2 = build(&fx, order2, segs2);
    cb_kvcache *ka = NULL, *kb = NULL, *ca = NULL, *cbk = NULL;
    p = fixed_defaults();
    p.mode = CB_MODE_REUSE;
    p.key_temp = 1.0f; /* chunk 0 is a true prefix in one prompt only: tempered in the other */
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, &ka));
    CHECK_OK(run(&fx, segs2, ns2, &p, b, &st, &kb));
    /* chunk 0 sits after the lead-in in the first prompt, after chunk 2 and a
     * separator in the second; rotate both back to one place and compare */
    int32_t pa = (int32_t)fx.lead.n, pb = (int32_t)(fx.lead.n + fx.chunk[2].n + fx.sep.n),
            n0 = (int32_t)fx.chunk[0].n;
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    float *k1 = malloc(sizeof(float) * n0 * w), *v1 = malloc(sizeof(float) * n0 * w);
    float *k2 = malloc(sizeof(float) * n0 * w), *v2 = malloc(sizeof(float) * n0 * w);
    cb_kvcache_new(&ca, fx.m, 512, CB_TYPE_F32);
    cb_kvcache_new(&cbk, fx.m, 512, CB_TYPE_F32);
    double worst = 0;
    for (int l = 1; l < hp->n_layer; l++) {
        cb_kvcache_read(ka, l, 0, pa, n0, k1);
        cb_kvcache_read(ka, l, 1, pa, n0, v1);
        cb_kvcache_read(kb, l, 0, pb, n0, k2);
        cb_kvcache_read(kb, l, 1, pb, n0, v2);
        cb_kvcache_load(ca, l, 100, n0, k1, v1, pa);
        cb_kvcache_load(cbk, l, 100, n0, k2, v2, pb);
        cb_kvcache_read(ca, l, 0, 100, n0, k1);
        cb_kvcache_read(cbk, l, 0, 100, n0, k2);
        double ek = rel(k2, k1, (size_t)(n0 * w)), ev = rel(v2, v1, (size_t)(n0 * w));
        worst = ek > worst ? ek : worst;
        worst = ev > worst ? ev : worst;
    }
    CHECKF(worst < 1e-5, "chunk 0's caches differ by %.3g after undoing the move", worst);
    free(k1), free(v1), free(k2), free(v2);
    cb_kvcache_free(ka), cb_kvcache_free(kb), cb_kvcache_free(ca), cb_kvcache_free(cbk);

    tcase("%s: pipelined and sequential loading give identical results", label);
    p = fixed_defaults();
    CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
    p.sequential_load = 1;
    CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
    CHECK(memcmp(a, b, sizeof(float) * (size_t)nv) == 0);
    CHECK(st.load_bytes > 0 && st.stall_ms >= 0);
    if (strstr(label, "tiny 4-layer")) {
        test_spans(fx.m);
        tcase("%s: the stats' stall on the backend's clock (%s here), recompute = prefill - stall",
              label, cb_model_marks_on_device(fx.m) ? "a device's" : "the host's");
        p.sequential_load = 0;
        CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
        CHECK(st.stall_clock &&
              !strcmp(st.stall_clock, cb_model_marks_on_device(fx.m) ? "device" : "host"));
        CHECKF(st.stall_ms >= 0 && st.stall_ms <= st.prefill_ms &&
                   fabs(st.recompute_ms - (st.prefill_ms - st.stall_ms)) < 1e-9,
               "prefill %.3f, stall %.3f, recompute %.3f ms", st.prefill_ms, st.stall_ms,
               st.recompute_ms);
        test_readers(&fx, segs, ns, a, b, label);
    }

    if (strstr(label, "SmolLM2")) {
        /* A slow tier, emulated by throttling the loader so that loading
         * takes about as long as the blend's computation: pipelined, the
         * prefill takes about the longer of the two; sequential, their sum. */
        tcase("%s: with a slow tier, pipelined prefill follows max(load, recompute), not the sum",
              label);
        /* timings on a shared machine: the best of three attempts */
        int good = 0;
        for (int attempt = 0; attempt < 3 && !good; attempt++) {
            p = fixed_defaults();
            p.strategy = CB_STRATEGY_HKVD; /* recompute overlapping every layer's load */
            p.sequential_load = 1;
            CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL)); /* warm-up */
            CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
            double compute = st.recompute_ms, bytes = (double)st.load_bytes;
            p.load_limit_mbs = bytes / 1e6 / (compute / 1e3); /* load time = compute time */
            CHECK_OK(run(&fx, segs, ns, &p, a, &st, NULL));
            double seq = st.prefill_ms, load = st.load_ms;
            p.sequential_load = 0;
            CHECK_OK(run(&fx, segs, ns, &p, b, &st, NULL));
            double pip = st.prefill_ms;
            CHECK(memcmp(a, b, sizeof(float) * (size_t)nv) == 0);
            printf(
                "# %s: compute %.0f ms, throttled load %.0f ms: sequential %.0f ms, pipelined %.0f ms "
                "(overlapped %.0f, stall %.0f)\n",
                label, compute, load, seq, pip, st.overlapped_ms, st.stall_ms);
            good = pip < 0.8 * seq && pip > 0.9 * (load > compute ? load : compute) - 20;
        }
        CHECKF(good, "pipelined prefill did not follow max(load, recompute) in three attempts");
    }

score:
    tcase("%s: cb_score equals the NLL of a full forward over prompt + continuation", label);
    {
        cb_tokens cont = {0};
        const char *ans = " She studied civil engineering in Delft.";
        cb_tok_encode(cb_model_vocab(fx.m), ans, strlen(ans), 0, &cont);
        double hn, ht;
        cb_score_result sr, sb;
        score_by_hand(&fx, segs, ns, &cont, &hn, &ht);
        p = fixed_defaults();
        p.mode = CB_MODE_FULL;
        CHECK_OK(score_after(&fx, segs, ns, &p, &cont, &sr));
        CHECKF(fabs(sr.nll - hn) < tol_full * 10 * (1 + hn), "cb_score %.6f, by hand %.6f", sr.nll,
               hn);
        CHECK(sr.n_tokens == (int32_t)cont.n && fabs(sr.top1 - ht) < 1e-9);
        printf("# %s: continuation of %d tokens: NLL %.5f (by hand %.5f), top-1 %.2f\n", label,
               sr.n_tokens, sr.nll, hn, sr.top1);
        p.mode = CB_MODE_REUSE; /* a different prefill scores differently, a single token too */
        CHECK_OK(score_after(&fx, segs, ns, &p, &cont, &sb));
        CHECKF(fabs(sb.nll - sr.nll) > 1e-6, "reuse %.6f = full %.6f", sb.nll, sr.nll);
        cb_tokens one = {cont.ids, 1, 1};
        CHECK_OK(score_after(&fx, segs, ns, &p, &one, &sb));
        CHECK(sb.n_tokens == 1);
        cb_tokens none = {cont.ids, 0, 0}, bad = {(int32_t[]){-1}, 1, 1};
        CHECK(score_after(&fx, segs, ns, &p, &none, &sb) == CB_ERR_INVALID);
        CHECK(score_after(&fx, segs, ns, &p, &bad, &sb) == CB_ERR_RANGE);
        cb_tokens_free(&cont);
    }

    tcase("%s: a bad parameter is refused", label);
    p = fixed_defaults();
    p.check_layer = hp->n_layer;
    CHECK(run(&fx, segs, ns, &p, a, &st, NULL) == CB_ERR_INVALID);
    free(full), free(a), free(b);
    teardown(&fx);
}

int main(void)
{
    char path[1024];
    const char *which = getenv("CB_BLEND_MODELS");
    int all = !which || !*which, tiny = all || !strcmp(which, "tiny");
    int real =
        all || !strcmp(which, "real") || !strcmp(which, "smollm2") || !strcmp(which, "gemma");
    int smol = real && strcmp(which ? which : "", "gemma") != 0,
        gemma = real && strcmp(which ? which : "", "smollm2") != 0;
    TEST_BEGIN();
    if (!tiny)
        tskip("tiny fixtures' blend invariants", "CB_BLEND_MODELS says real models only");
    if (!smol)
        tskip("SmolLM2 blend invariants", "CB_BLEND_MODELS leaves it out");
    if (!gemma)
        tskip("Gemma-3-270M blend invariants", "CB_BLEND_MODELS leaves it out");
    snprintf(path, sizeof path, "%s/tiny4-f32.gguf", tmpdir());
    if (tiny)
        invariants("tiny 4-layer f32", path, CB_TYPE_F32, 1e-4, 1e-4);
    /* the other architectures: Q/K norms (qwen3); sliding windows of 8
     * tokens, so that a chunk's later tokens do not see its start,
     * post-norms, BOS lead-in (gemma3); Llama 3.1's rope_freqs, which the
     * loaded keys are moved with; qwen2's Q/K/V biases (a moved key is
     * rotated with its bias: exact, as the reorder case checks) */
    static const char *const arch[] = {"qwen2", "qwen3", "gemma3", "llama3"};
    for (int i = 0; i < 4 && tiny; i++) {
        char label[64];
        snprintf(path, sizeof path, "%s/tiny%s-%s.gguf", tmpdir(), i == 0 ? "4" : "", arch[i]);
        snprintf(label, sizeof label, "tiny %s", arch[i]);
        invariants(label, path, CB_TYPE_F32, 1e-4, 1e-4);
    }
    const char *m = smol ? t_smol_model() : NULL;
    if (m)
        invariants("SmolLM2 f16", m, CB_TYPE_F16, 2e-2, 2e-2);
    else if (smol)
        tskip("SmolLM2 blend invariants", "default model not fetched (make model)");
    if (gemma && (m = t_gemma_model()))
        invariants("Gemma-3-270M f16", m, CB_TYPE_F16, 2e-2, 2e-2);
    else if (gemma)
        tskip("Gemma-3-270M blend invariants", "Gemma-3-270M not fetched (make model MODEL=gemma)");
    TEST_END();
}
