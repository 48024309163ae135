/* test_prompt.c - lib/prompt on the tiny fixture: the prompt's segments
 * against tokens assembled by hand, caches found in the store (and the tier
 * each lies in), missing chunks computed and stored, the generation loop's
 * stop strings against a run without them, the store's profiles and
 * placement, and the KL divergence against a value worked out by hand. */
#include "../../lib/store/store.h"
#include "test.h"

#include <fcntl.h>
#include <unistd.h>

static const char *tmpdir(void)
{
    const char *t = getenv("CB_TEST_TMP");
    return t ? t : "tests/tmp";
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, sizeof(int32_t) * na) == 0);
}

static const char *const texts[4] = {
    "The Kelby ferry crosses the sound twice a day.",
    "",
    "Its engineer, Mara Lund, was born in Tromso.",
    "The bridge replaced the ferry in 1998.",
};

static int n_warn;
static void count_warn(void *ctx, const char *msg)
{
    (void)ctx;
    printf("# warning: %s\n", msg);
    n_warn++;
}

/* Segments by hand: [BOS?] [c0] [sep] [sep] [c2] [sep] [c3] [sep + question]
 * (the empty chunk c1 adds only its separator, as cb-run always did). */
static void check_segments(const cb_model *m, const cb_prompt *p, const char *q)
{
    const cb_vocab *v = cb_model_vocab(m);
    cb_tokens c[4] = {{0}}, sep = {0}, tail = {0}, head = {0};
    int32_t n;
    const cb_segment *s = cb_prompt_segments(p, &n);
    int64_t total = 0;

    for (int i = 0; i < 4; i++)
        cb_tok_encode(v, texts[i], strlen(texts[i]), 0, &c[i]);
    cb_tok_encode(v, "\n\n", 2, 0, &sep);
    for (size_t j = 0; j < sep.n; j++)
        cb_tokens_push(&tail, sep.ids[j]);
    cb_tok_encode(v, q, strlen(q), CB_TOK_PARSE_SPECIAL, &tail);
    if (cb_vocab_add_bos(v) && cb_vocab_bos(v) >= 0)
        cb_tokens_push(&head, cb_vocab_bos(v));
    CHECKF(n == 8, "%d segments", n);
    if (n == 8) {
        CHECK(same_ids(s[0].ids, (size_t)s[0].n, head.ids, head.n));
        CHECK(same_ids(s[1].ids, (size_t)s[1].n, c[0].ids, c[0].n));
        CHECK(same_ids(s[2].ids, (size_t)s[2].n, sep.ids, sep.n));
        CHECK(same_ids(s[3].ids, (size_t)s[3].n, sep.ids, sep.n));
        CHECK(same_ids(s[4].ids, (size_t)s[4].n, c[2].ids, c[2].n));
        CHECK(same_ids(s[5].ids, (size_t)s[5].n, sep.ids, sep.n));
        CHECK(same_ids(s[6].ids, (size_t)s[6].n, c[3].ids, c[3].n));
        CHECK(same_ids(s[7].ids, (size_t)s[7].n, tail.ids, tail.n));
    }
    for (int32_t i = 0; i < n; i++)
        total += s[i].n;
    CHECK(total == cb_prompt_n_tokens(p));
    CHECK(cb_prompt_n_chunks(p) == 3);
    for (int i = 0; i < 4; i++)
        cb_tokens_free(&c[i]);
    cb_tokens_free(&sep);
    cb_tokens_free(&tail);
    cb_tokens_free(&head);
}

static cb_status collect(void *ctx, const char *text, size_t n)
{
    cb_tokens *buf = ctx; /* bytes kept as one int32 each: simple and exact */
    for (size_t i = 0; i < n; i++)
        if (cb_tokens_push(buf, (unsigned char)text[i]) != CB_OK)
            return CB_ERR_NOMEM;
    return CB_OK;
}

/* Greedy generation after a full prefill of "abc"; the text into *out. */
static cb_status gen(const cb_model *m, const cb_gen_params *gp, char *out, size_t cap,
                     cb_gen_result *res)
{
    const cb_vocab *v = cb_model_vocab(m);
    cb_tokens ids = {0}, text = {0};
    cb_fwd *f = NULL;
    cb_kvcache *kv = NULL;
    float *logits = malloc(sizeof(float) * (size_t)cb_model_hparams(m)->n_vocab);
    cb_status st;

    cb_tok_encode(v, "abc", 3, 0, &ids);
    if ((st = cb_fwd_new(&f, m, 64)) == CB_OK &&
        (st = cb_kvcache_new(&kv, m, 64, CB_TYPE_F32)) == CB_OK &&
        (st = cb_model_eval(f, kv, ids.ids, (int32_t)ids.n, 0, logits)) == CB_OK)
        st = cb_generate(f, kv, logits, (int32_t)ids.n, gp, collect, &text, cb_now_ms(), res);
    size_t n = text.n < cap - 1 ? text.n : cap - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)text.ids[i];
    out[n] = 0;
    cb_tokens_free(&ids);
    cb_tokens_free(&text);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    free(logits);
    return st;
}

static void test_generate(const cb_model *m)
{
    cb_gen_params gp = {cb_sampler_defaults(), 24, NULL, 0};
    cb_gen_result r1, r2;
    char all[4096], cut[4096];
    gp.sp.temp = 0;

    tcase("cb_generate: n_predict, and a stop string ends the text just before it");
    CHECK_OK(gen(m, &gp, all, sizeof all, &r1));
    CHECKF(r1.n_gen <= 24 &&
               (r1.n_gen == 24 ? !strcmp(r1.stop, "length") : !strcmp(r1.stop, "eog")),
           "%d tokens, stop %s", r1.n_gen, r1.stop);
    size_t len = strlen(all);
    if (len < 4) {
        tskip("cb_generate: stop strings", "the tiny model's answer is too short");
        return;
    }
    char stop[8] = {0};
    memcpy(stop, all + len / 2, len - len / 2 < 3 ? len - len / 2 : 3);
    const char *stops[2] = {"\x01never", stop};
    gp.stops = stops;
    gp.n_stops = 2;
    CHECK_OK(gen(m, &gp, cut, sizeof cut, &r2));
    const char *first = strstr(all, stop);
    CHECKF(first && strlen(cut) == (size_t)(first - all) && !strncmp(cut, all, strlen(cut)),
           "'%s' cut at '%s' gave '%s'", all, stop, cut);
    CHECK(!strcmp(r2.stop, "stop") && r2.n_gen <= r1.n_gen);
}

static void test_kl(void)
{
    tcase("cb_logits_kl: a case worked out by hand, and identical logits");
    float lp[2] = {0, 0}, lq[2] = {(float)log(3.0), 0};
    int top1;
    /* p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2 ln(2/3) + 1/2 ln 2 */
    double want = 0.5 * log(2.0 / 3.0) + 0.5 * log(2.0);
    CHECKF(fabs(cb_logits_kl(lp, lq, 2, &top1) - want) < 1e-6, "%g",
           cb_logits_kl(lp, lq, 2, &top1));
    CHECK(top1 == 1); /* both argmax to 0 (ties go to the first) */
    CHECK(cb_logits_kl(lq, lq, 2, &top1) < 1e-9 && top1 == 1);
    float lr[2] = {0, 1};
    cb_logits_kl(lq, lr, 2, &top1);
    CHECK(top1 == 0);
}

/* cb_neighbours' definition (neighbours.c) as a plain loop over every
 * pair: the query's terms, their document frequencies and each chunk's
 * counts found by scanning, the score summed in the same order. */
static void ref_neighbours(const cb_tokens *d, int n, int k, int32_t *out)
{
    double avg = 0;
    for (int i = 0; i < n; i++)
        avg += (double)d[i].n;
    avg /= n;
    for (int i = 0; i < n; i++) {
        int32_t terms[512], dfs[512];
        int nt = 0;
        for (size_t a = 0; a < d[i].n; a++) {
            int32_t t = d[i].ids[a], seen = 0, df = 0;
            for (int b = 0; b < nt; b++)
                seen |= terms[b] == t;
            if (seen)
                continue;
            for (int j = 0; j < n; j++)
                for (size_t c = 0; c < d[j].n; c++)
                    if (d[j].ids[c] == t) {
                        df++;
                        break;
                    }
            if (df >= 2)
                terms[nt] = t, dfs[nt++] = df;
        }
        for (int a = 0; a < nt; a++) /* by (df, token): selection sort */
            for (int b = a + 1; b < nt; b++)
                if (dfs[b] < dfs[a] || (dfs[b] == dfs[a] && terms[b] < terms[a])) {
                    int32_t t = terms[a], f = dfs[a];
                    terms[a] = terms[b], dfs[a] = dfs[b], terms[b] = t, dfs[b] = f;
                }
        if (nt > 64)
            nt = 64;
        double sc[256];
        for (int j = 0; j < n; j++) {
            sc[j] = 0;
            for (int a = 0; a < nt && j != i; a++) {
                int tf = 0;
                for (size_t c = 0; c < d[j].n; c++)
                    tf += d[j].ids[c] == terms[a];
                double idf = log(1.0 + (n - dfs[a] + 0.5) / (dfs[a] + 0.5));
                if (tf)
                    sc[j] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * (double)d[j].n / avg));
            }
            if (d[j].n == d[i].n && !memcmp(d[j].ids, d[i].ids, sizeof(int32_t) * d[i].n))
                sc[j] = 0;
        }
        for (int c = 0; c < k; c++) {
            int best = -1;
            for (int j = 0; j < n; j++)
                if (sc[j] > 0 && (best < 0 || sc[j] > sc[best]))
                    best = j;
            out[i * k + c] = best;
            if (best >= 0)
                sc[best] = 0;
        }
    }
}

static void test_neighbours(void)
{
    tcase("cb_neighbours: as a plain loop over every pair (BM25, the 64 rarest shared terms)");
    uint64_t rng = 12345;
    for (int round = 0; round < 3; round++) {
        int n = round == 2 ? 6 : 40, vocab = round == 1 ? 600 : 50, k = round == 2 ? 8 : 3;
        cb_tokens d[40];
        int32_t got[40 * 8], want[40 * 8];
        memset(d, 0, sizeof d);
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            int len = round == 1 ? 100 + (int)(rng >> 33) % 150 : 3 + (int)(rng >> 33) % 25;
            for (int a = 0; a < len; a++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                cb_tokens_push(&d[i], (int32_t)((rng >> 33) % (uint64_t)vocab));
            }
        }
        if (round == 0) { /* a duplicate: never the other's neighbour */
            d[7].n = 0;
            for (size_t a = 0; a < d[3].n; a++)
                cb_tokens_push(&d[7], d[3].ids[a]);
        }
        CHECK_OK(cb_neighbours(d, (size_t)n, k, got));
        ref_neighbours(d, n, k, want);
        int same = !memcmp(got, want, sizeof(int32_t) * (size_t)(n * k));
        CHECKF(same, "round %d: chunk 0's %d %d %d, the loop's %d %d %d", round, got[0], got[1],
               got[2], want[0], want[1], want[2]);
        if (round == 0)
            for (int c = 0; c < k; c++)
                CHECK(got[3 * k + c] != 7 && got[7 * k + c] != 3);
        if (round == 2) /* 5 others: the last 3 of 8 are -1 */
            CHECK(got[5] == -1 && got[6] == -1 && got[7] == -1);
        for (int i = 0; i < n; i++)
            cb_tokens_free(&d[i]);
    }
    int32_t one[2];
    cb_tokens single = {0};
    cb_tokens_push(&single, 5);
    CHECK(cb_neighbours(&single, 1, 2, one) == CB_OK && one[0] == -1 && one[1] == -1);
    CHECK(cb_neighbours(&single, 1, 0, one) == CB_ERR_INVALID);
    cb_tokens_free(&single);
}

static void test_profiles(cb_store *s, const cb_model *m)
{
    cb_profile p, q;
    cb_error err;
    char path[4096], name[256], want[4096 + 256];
    double load = -1, rec = -1;

    tcase("the store's profiles: save, path, load; placement by profile");
    memset(&p, 0, sizeof p);
    cb_hash128_hex(cb_model_fingerprint(m), p.model);
    snprintf(p.backend, sizeof p.backend, "cpu");
    p.n_layer = 10, p.threads = 2;
    p.kv_bytes_per_token[1] = 1000;
    p.prefill[p.n_prefill++] = (cb_profile_point){512, 1.0, 10.0, 0.01};
    p.recompute[p.n_recompute++] = (cb_profile_point){512, 0.1, 2.0, 0.02};
    p.recompute[p.n_recompute++] = (cb_profile_point){512, 0.5, 6.0, 0.02};
    p.tiers[p.n_tiers++] = (cb_profile_tier){"fast", 10000, 10000};
    p.tiers[p.n_tiers++] = (cb_profile_tier){"slow", 100, 50};
    CHECK(cb_store_profile_load(s, cb_model_fingerprint(m), "cpu", &q, &err) == CB_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "cb-profile") != NULL);
    CHECK_OK(cb_store_profile_save(s, &p, path, sizeof path, &err));
    cb_profile_name(cb_model_fingerprint(m), "cpu", name, sizeof name);
    snprintf(want, sizeof want, "%s/%s", cb_store_dir(s), name);
    CHECKF(!strcmp(path, want), "%s", path);
    CHECK(access(want, R_OK) == 0);
    CHECK_OK(cb_store_profile_load(s, cb_model_fingerprint(m), "cpu", &q, &err));
    CHECK(q.n_tiers == 2 && !strcmp(q.tiers[1].name, "slow") && q.n_recompute == 2);
    /* 512 f16 tokens: 0.512 MB; slow cold 50 MB/s: 10.24 ms; fast 0.0512 ms.
     * Recompute at 0.15: 10 layers x (2 + 4 x 0.05 / 0.4) = 25 ms, so the
     * slow tier (cheaper) is fast enough; at 0.01 (2.0 ms) only the fast one. */
    CHECK(cb_store_place(s, &q, 0.15, 512, CB_TYPE_F16, &load, &rec) == 1);
    CHECK(fabs(load - 10.24) < 1e-6 && fabs(rec - 25.0) < 1e-6);
    CHECK(cb_store_place(s, &q, 0.01, 512, CB_TYPE_F16, &load, &rec) == 0);
    q.n_tiers = 0;
    CHECK(cb_store_place(s, &q, 0.15, 512, CB_TYPE_F16, &load, &rec) == -1);
}

/* --ratio auto's loading figure: the profile's, for the slowest tier
 * holding one of the prompt's caches (pr's: one chunk, in "slow") */
static void test_auto_tier(cb_store *s, const cb_model *m, const cb_prompt *pr)
{
    cb_profile *p = calloc(1, sizeof *p);
    cb_blend_params bp = cb_blend_defaults();
    cb_ratio_choice rc;
    cb_error err;

    tcase("--ratio auto: the profile's loading figure in proportion to the slowest tier's speed");
    if (!p || !pr) {
        CHECK(0);
        free(p);
        return;
    }
    cb_hash128_hex(cb_model_fingerprint(m), p->model);
    snprintf(p->backend, sizeof p->backend, "cpu");
    p->n_layer = 1, p->threads = 1;
    p->prefill[p->n_prefill++] = (cb_profile_point){512, 1.0, 10.0, 0.01};
    p->tiers[p->n_tiers++] = (cb_profile_tier){"fast", 1000, 500};
    p->tiers[p->n_tiers++] = (cb_profile_tier){"slow", 100, 40};
    CHECK_OK(cb_store_profile_save(s, p, NULL, 0, &err));
    bp.costs.attn = 3.0f; /* (a caller's figures stay) */
    CHECK(cb_prompt_auto_ratio(pr, s, m, 0.1, &bp, &rc, &err) == CB_ERR_NOT_FOUND);
    CHECKF(strstr(err.msg, "loading figure") && bp.costs.load == 0.0f && bp.ratio_auto, "%s",
           err.msg);       /* the profile has none: the built-in stays */
    p->costs.load = 50.0f; /* a byte of fast, warm */
    CHECK_OK(cb_store_profile_save(s, p, NULL, 0, &err));
    CHECK_OK(cb_prompt_auto_ratio(pr, s, m, 0.1, &bp, &rc, &err));
    CHECKF(!strcmp(rc.tier, "slow") && fabs(bp.costs.load - 50.0 * 1000 / 40) < 1e-3 &&
               bp.costs.attn == 3.0f && bp.ratios[0] == 0.1f && rc.n_cached > 0,
           "tier %s, load %g", rc.tier, (double)bp.costs.load);
    free(p);
}

int main(void)
{
    TEST_BEGIN();
    test_neighbours(); /* no model needed */
    char model[1024], dir[1024];
    cb_model *m = NULL;
    cb_store *s = NULL;
    cb_prompt *p = NULL;
    cb_precomputer *pc = NULL;
    cb_error err;
    cb_strview ch[4];
    const char *q = "Where was the engineer born?";

    snprintf(model, sizeof model, "%s/tiny-f32.gguf", tmpdir());
    snprintf(dir, sizeof dir, "%s/prompt-store-%ld", tmpdir(), (long)getpid());
    if (cb_model_load(&m, model, &T_EXACT, &err) != CB_OK) {
        tskip("lib/prompt", "no tiny fixture (run make test)");
        TEST_END();
    }
    for (int i = 0; i < 4; i++)
        ch[i] = (cb_strview){texts[i], strlen(texts[i])};

    tcase(
        "cb_prompt_build: segments are the tokens of each part alone; an empty chunk adds only its separator");
    CHECK_OK(cb_prompt_build(&p, m, NULL, 1, ch, 4, q, strlen(q), &err));
    if (p) {
        check_segments(m, p, q);
        CHECK(cb_prompt_n_missing(p) == 3);
    }

    tcase("cb_prompt_attach: caches found in the tier that holds them, checked, kept acquired");
    cb_store_tier tiers[2] = {{"fast", "fast", 0, 0, NULL, 0, NULL, NULL},
                              {"slow", "slow", 0, 0, NULL, 0, NULL, NULL}};
    CHECK_OK(cb_store_init(dir, tiers, 2, 0, &err));
    CHECK_OK(cb_store_open(&s, dir, 0, &err));
    CHECK_OK(cb_precomputer_new(&pc, m, s, CB_TYPE_F16, "slow", &err));
    int32_t n;
    const cb_segment *sg = p ? cb_prompt_segments(p, &n) : NULL;
    char key[66], key2[66];
    if (sg && pc) {
        cb_precomputer_key(pc, sg[1].ids, sg[1].n, key);
        CHECK_OK(cb_precomputer_run(pc, sg[1].ids, sg[1].n, &err));
        CHECK_OK(cb_precomputer_store(pc, key, &err));
        CHECK(cb_precomputer_store(pc, key, &err) == CB_ERR_INVALID); /* nothing computed since */
        cb_precomputer_key(pc, sg[4].ids, sg[4].n, key2);
        CHECK(strcmp(key, key2) != 0);
        cb_prompt_attach(p, s, count_warn, NULL);
        sg = cb_prompt_segments(p, &n);
        CHECK(sg[1].kv != NULL && sg[4].kv == NULL && sg[6].kv == NULL && sg[0].kv == NULL &&
              sg[3].kv == NULL);
        CHECK(cb_prompt_n_missing(p) == 2 && n_warn == 0);
        if (sg[1].kv)
            CHECK(same_ids(cb_kvfile_meta(sg[1].kv)->ids,
                           (size_t)cb_kvfile_meta(sg[1].kv)->n_tokens, sg[1].ids, (size_t)sg[1].n));
        cb_ratio_choice rc;
        cb_blend_params bp = cb_blend_defaults();
        CHECK(cb_prompt_auto_ratio(p, s, m, 0.2, &bp, &rc, &err) == CB_ERR_NOT_FOUND);
        CHECK(rc.n_cached == sg[1].n && !rc.tier[0]); /* no profile yet: no tier's figure */
        CHECK(bp.ratio_auto == 1 && bp.speedup == 0.0f && bp.n_ratios == 1 &&
              bp.ratios[0] == 0.2f && bp.costs.load == 0.0f); /* the built-in figure kept */
    }

    tcase("cb_prompt_store_missing: the missing chunks are computed and stored, once");
    int stored = -1, found = 0;
    if (sg) {
        CHECK_OK(cb_prompt_store_missing(p, s, CB_TYPE_F16, &stored, count_warn, NULL));
        CHECKF(stored == 2, "%d stored", stored);
        CHECK(cb_store_lookup(s, key2, &found) == CB_OK && found);
        CHECK_OK(cb_prompt_store_missing(p, s, CB_TYPE_F16, &stored, count_warn, NULL));
        CHECK(stored == 0 && n_warn == 0);
    }
    cb_prompt_free(p);
    p = NULL;

    tcase("a rebuilt prompt finds every cache; its blend equals one from hand-made segments");
    CHECK_OK(cb_prompt_build(&p, m, NULL, 1, ch, 4, q, strlen(q), &err));
    if (p) {
        cb_store_ref *ref = NULL;
        const char *path;
        cb_prompt_attach(p, s, count_warn, NULL);
        CHECK(cb_prompt_n_missing(p) == 0);
        CHECK(cb_store_acquire(s, key, &ref, &path, &err) == CB_OK && cb_store_ref_tier(ref) == 1);
        CHECK(cb_store_ref_tier(NULL) == -1);
        cb_store_release(ref);
        sg = cb_prompt_segments(p, &n);
        cb_segment hand[8];
        cb_kvfile *files[8] = {0};
        for (int32_t i = 0; i < n && i < 8; i++) {
            hand[i] = (cb_segment){sg[i].ids, sg[i].n, NULL};
            if (sg[i].kv) {
                char k[66];
                cb_precomputer_key(pc, sg[i].ids, sg[i].n, k);
                if (cb_store_acquire(s, k, &ref, &path, &err) == CB_OK &&
                    cb_kvfile_open(&files[i], path, &err) == CB_OK)
                    hand[i].kv = files[i];
                cb_store_release(ref);
            }
        }
        int64_t total = cb_prompt_n_tokens(p);
        int32_t nv = cb_model_hparams(m)->n_vocab;
        float *l1 = malloc(sizeof(float) * (size_t)nv), *l2 = malloc(sizeof(float) * (size_t)nv);
        cb_blend_params bp = cb_blend_defaults();
        cb_blend_stats bs1, bs2;
        cb_fwd *f = NULL;
        cb_kvcache *kv = NULL;
        CHECK_OK(cb_fwd_new(&f, m, (int32_t)total));
        CHECK_OK(cb_kvcache_new(&kv, m, (int32_t)total + 1, CB_TYPE_F32));
        CHECK_OK(cb_blend_prefill(f, kv, sg, n, &bp, l1, &bs1, &err));
        CHECK_OK(cb_blend_prefill(f, kv, hand, n, &bp, l2, &bs2, &err));
        double md = 0;
        for (int32_t i = 0; i < nv; i++)
            md = fmax(md, fabs((double)l1[i] - l2[i]));
        CHECKF(md < 1e-5 && bs1.n_cached_tokens == bs2.n_cached_tokens, "max |diff| %g", md);
        CHECK(bs1.n_cached_tokens > 0 && bs1.n_recomputed_tokens > 0);

        tcase(
            "cb_prompt_prefill: a layer found corrupt mid-prefill: dropped, that chunk computed, the answer as without it");
        int fd = -1;
        uint64_t at = 0;
        if (cb_store_acquire(s, key2, &ref, &path, &err) == CB_OK &&
            (fd = open(path, O_RDWR)) >= 0) {
            uint8_t hdr[128], byte;
            uint32_t H, L;
            uint64_t S;
            CHECK(pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr);
            memcpy(&H, hdr + 12, 4), memcpy(&L, hdr + 48, 4), memcpy(&S, hdr + 96, 8);
            at = H + S * (L - 1) + 3; /* the last layer: every earlier one is used first */
            CHECK(pread(fd, &byte, 1, (off_t)at) == 1);
            byte ^= 0x20;
            CHECK(pwrite(fd, &byte, 1, (off_t)at) == 1);
            CHECK(cb_blend_prefill(f, kv, sg, n, &bp, l2, &bs2, &err) == CB_ERR_CHECKSUM &&
                  bs2.failed_segment == 4);
            /* the store drops the bad file and says so (its warning, not the prompt's) */
            cb_store_set_warn(s, count_warn, NULL);
            int warned = n_warn, still = 1;
            CHECK_OK(cb_prompt_prefill(p, s, f, kv, &bp, l1, &bs1, count_warn, NULL, &err));
            CHECK(n_warn == warned + 1 && cb_prompt_n_missing(p) == 1 && bs1.failed_segment == -1);
            CHECK(cb_store_has(s, key2, &still) == CB_OK && !still);
            cb_store_set_warn(s, NULL, NULL);
            sg = cb_prompt_segments(p, &n);
            CHECK(sg[4].kv == NULL && sg[1].kv != NULL);
            hand[4].kv = NULL;
            CHECK_OK(cb_blend_prefill(f, kv, hand, n, &bp, l2, &bs2, &err));
            CHECK(memcmp(l1, l2, sizeof(float) * (size_t)nv) == 0 &&
                  bs1.n_cached_tokens == bs2.n_cached_tokens);
            byte ^= 0x20;
            CHECK(pwrite(fd, &byte, 1, (off_t)at) == 1);
            close(fd);
        } else {
            CHECK(0);
        }
        cb_store_release(ref);
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        free(l1);
        free(l2);
        for (int i = 0; i < 8; i++)
            cb_kvfile_free(files[i]);
    }
    test_profiles(s, m);
    test_auto_tier(s, m, p);
    test_generate(m);
    test_kl();
    cb_prompt_free(p);
    cb_precomputer_free(pc);
    cb_store_close(s);
    cb_model_free(m);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("# could not remove %s\n", dir);
    TEST_END();
}
