/* test_sampler.c - the sampler against references written here: the argmax,
 * the top-k / top-p / min-p candidate sets computed by sorting in double,
 * and softmax(logits / temp) over a set, checked by a chi-square bound on
 * many draws.  The draws are seeded, so each bound either always holds or
 * never does; the bounds sit far in the tail (p < 1e-4 for a correct
 * sampler), so a pass is not luck. */
#include "../../lib/infer/infer.h"
#include "test.h"

#include <stdint.h>

/* ------------------------------------------------------------ helpers */

/* cb_sampler_sample over weights 1:2:3:4 with seed 0, temp 1, no filters:
 * xoshiro256** seeded by splitmix64 (first output 0xe220a8397b1dcdaf), a
 * uniform (x >> 11) * 2^-53 against the running sum.  Recomputed by an
 * independent Python transcription of those algorithms when it was written;
 * a change of generator or draw shows up here. */
#define GOLDEN_SEED0 "3312332233101321"

static uint64_t lcg_state = 0x2545f4914f6cdd1dULL;

static double lcg_unit(void) /* [0, 1) */
{
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

/* Roughly normal with standard deviation `sd` (Irwin-Hall of 12). */
static void fill_logits(float *l, int n, double sd)
{
    for (int i = 0; i < n; i++) {
        double x = -6.0;
        for (int j = 0; j < 12; j++)
            x += lcg_unit();
        l[i] = (float)(x * sd);
    }
}

static cb_sampler *mk(float temp, int32_t top_k, float top_p, float min_p, uint64_t seed)
{
    cb_sampler_params p = {
        .temp = temp, .top_k = top_k, .top_p = top_p, .min_p = min_p, .seed = seed};
    return cb_sampler_new(&p);
}

static int ref_argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

static const float *sort_base;

static int by_logit_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_base[i] != sort_base[j])
        return sort_base[i] > sort_base[j] ? -1 : 1;
    return i - j;
}

/* ids of l[0..n) in descending order of logit, lowest id first on ties */
static int *order_of(const float *l, int n)
{
    int *o = malloc((size_t)n * sizeof *o);
    for (int i = 0; i < n; i++)
        o[i] = i;
    sort_base = l;
    qsort(o, (size_t)n, sizeof *o, by_logit_desc);
    return o;
}

/* The allowed set, as flags in ok[0..n): the chain's definitions applied in
 * double to the sorted order.  `slack` widens top-p and min-p a little so
 * that float rounding at the boundary is not a failure. */
static void ref_set(const float *l, int n, int top_k, double top_p, double min_p, double slack,
                    unsigned char *ok)
{
    int *o = order_of(l, n);
    int m = (top_k > 0 && top_k < n) ? top_k : n;
    double maxl = l[o[0]], total = 0.0;
    for (int i = 0; i < m; i++)
        total += exp((double)l[o[i]] - maxl);
    if (top_p < 1.0) {
        double cum = 0.0;
        int keep = m;
        for (int i = 0; i < m; i++) {
            cum += exp((double)l[o[i]] - maxl) / total;
            if (cum >= top_p + slack) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (min_p > 0.0) {
        int keep = 1;
        while (keep < m && exp((double)l[o[keep]] - maxl) >= min_p * (1.0 - slack))
            keep++;
        m = keep;
    }
    memset(ok, 0, (size_t)n);
    for (int i = 0; i < m; i++)
        ok[o[i]] = 1;
    free(o);
}

/* Chi-square statistic of counts[0..n) against softmax(l / temp) restricted
 * to ok[]; *df receives the degrees of freedom.  A token outside the set
 * counts as a failure through *outside. */
static double chi_square(const float *l, int n, double temp, const unsigned char *ok,
                         const long *counts, long draws, int *df, long *outside)
{
    double maxl = -INFINITY, sum = 0.0, chi = 0.0;
    int k = 0;
    *outside = 0;
    for (int i = 0; i < n; i++)
        if (ok[i] && l[i] > maxl)
            maxl = l[i];
    for (int i = 0; i < n; i++)
        if (ok[i])
            sum += exp(((double)l[i] - maxl) / temp);
    for (int i = 0; i < n; i++) {
        if (!ok[i]) {
            *outside += counts[i];
            continue;
        }
        double e = draws * exp(((double)l[i] - maxl) / temp) / sum;
        chi += (counts[i] - e) * (counts[i] - e) / e;
        k++;
    }
    *df = k - 1;
    return chi;
}

/* Upper bound for a chi-square with df degrees of freedom, beyond its
 * 0.9999 quantile: the Wilson-Hilferty approximation at z = 4. */
static double chi_bound(int df)
{
    double v = 2.0 / (9.0 * df), c = 1.0 - v + 4.0 * sqrt(v);
    return df * c * c * c;
}

/* Draw `draws` tokens, count them, and check them against the reference. */
static void check_distribution(const char *name, const float *l, int n, float temp, int top_k,
                               float top_p, float min_p, long draws)
{
    cb_sampler *s = mk(temp, top_k, top_p, min_p, 1234);
    long *counts = calloc((size_t)n, sizeof *counts), outside;
    unsigned char *ok = malloc((size_t)n);
    int df, bad = 0;
    double chi;
    ref_set(l, n, top_k, top_p, min_p, 0.0, ok);
    for (long i = 0; i < draws; i++) {
        int32_t t = cb_sampler_sample(s, l, n);
        if (t < 0 || t >= n) {
            bad++;
            continue;
        }
        counts[t]++;
    }
    CHECKF(bad == 0, "%s: %d ids out of range", name, bad);
    chi = chi_square(l, n, temp, ok, counts, draws, &df, &outside);
    CHECKF(outside == 0, "%s: %ld draws outside the set", name, outside);
    if (df > 0)
        CHECKF(chi < chi_bound(df), "%s: chi2 %.2f >= %.2f (df %d)", name, chi, chi_bound(df), df);
    cb_sampler_free(s);
    free(counts);
    free(ok);
}

/* Every one of `draws` tokens lies in the reference set (with slack). */
static void check_within(const char *name, const float *l, int n, float temp, int top_k,
                         float top_p, float min_p, uint64_t seed, int draws)
{
    cb_sampler *s = mk(temp, top_k, top_p, min_p, seed);
    unsigned char *ok = malloc((size_t)n);
    int outside = 0, first = -1;
    ref_set(l, n, top_k, top_p, min_p, 1e-6, ok);
    for (int i = 0; i < draws; i++) {
        int32_t t = cb_sampler_sample(s, l, n);
        if (t < 0 || t >= n || !ok[t]) {
            if (first < 0)
                first = t;
            outside++;
        }
    }
    CHECKF(outside == 0, "%s: %d of %d draws outside the set (first id %d)", name, outside, draws,
           first);
    cb_sampler_free(s);
    free(ok);
}

/* ---------------------------------------------------------------- tests */

static void test_defaults(void)
{
    cb_sampler_params p = cb_sampler_defaults();
    cb_sampler *s;
    tcase("defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, seed 0");
    CHECK(p.temp == 0.8f);
    CHECK(p.top_k == 40);
    CHECK(p.top_p == 0.95f);
    CHECK(p.min_p == 0.05f);
    CHECK(p.seed == 0);
    s = cb_sampler_new(NULL);
    CHECK(s != NULL);
    cb_sampler_free(s);
    cb_sampler_free(NULL);
}

static void test_greedy(void)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 2.0f}, copy[6];
    float rnd[1000];
    cb_sampler *s;
    tcase("greedy: argmax, lowest id on ties, logits untouched");
    memcpy(copy, l, sizeof l);
    s = mk(0.0f, 40, 0.95f, 0.05f, 7);
    CHECK(cb_sampler_sample(s, l, 6) == 1);
    CHECK(memcmp(l, copy, sizeof l) == 0);
    cb_sampler_free(s);
    s = mk(-1.0f, 0, 1.0f, 0.0f, 99);
    CHECK(cb_sampler_sample(s, l, 6) == 1);
    l[0] = 3.0f;
    CHECK(cb_sampler_sample(s, l, 6) == 0);
    l[5] = 4.0f;
    CHECK(cb_sampler_sample(s, l, 6) == 5);
    for (int r = 0; r < 20; r++) {
        fill_logits(rnd, 1000, 2.0);
        CHECK(cb_sampler_sample(s, rnd, 1000) == ref_argmax(rnd, 1000));
    }
    cb_sampler_free(s);

    tcase("greedy: NaN logits never win");
    {
        float nl[4] = {NAN, -5.0f, NAN, -4.0f};
        s = mk(0.0f, 0, 1.0f, 0.0f, 0);
        CHECK(cb_sampler_sample(s, nl, 4) == 3);
        cb_sampler_free(s);
        s = mk(1.0f, 0, 1.0f, 0.0f, 0);
        for (int i = 0; i < 200; i++) {
            int32_t t = cb_sampler_sample(s, nl, 4);
            CHECKF(t == 1 || t == 3, "drew %d", t);
            if (t != 1 && t != 3)
                break;
        }
        cb_sampler_free(s);
    }
}

static void test_top_k1(void)
{
    static const float temps[] = {0.01f, 0.5f, 1.0f, 2.0f, 100.0f};
    float l[500];
    tcase("top_k = 1 equals greedy at any temperature (ties included)");
    for (int r = 0; r < 10; r++) {
        fill_logits(l, 500, 1.0);
        if (r % 2) { /* a tie for the max */
            int a = ref_argmax(l, 500);
            l[(a + 250) % 500] = l[a];
            l[(a + 100) % 500] = l[a];
        }
        for (size_t t = 0; t < sizeof temps / sizeof *temps; t++) {
            cb_sampler *s = mk(temps[t], 1, 0.9f, 0.1f, (uint64_t)r);
            for (int i = 0; i < 5; i++)
                CHECKF(cb_sampler_sample(s, l, 500) == ref_argmax(l, 500), "round %d temp %g", r,
                       temps[t]);
            cb_sampler_free(s);
        }
    }
}

static void test_seed(void)
{
    float l[64];
    int32_t a[300], b[300], c[300];
    cb_sampler *s1 = mk(1.0f, 0, 1.0f, 0.0f, 42), *s2 = mk(1.0f, 0, 1.0f, 0.0f, 42),
               *s3 = mk(1.0f, 0, 1.0f, 0.0f, 43);
    int same12 = 1, same13 = 1;
    tcase("seed: same seed same sequence, another seed another");
    fill_logits(l, 64, 0.5);
    for (int i = 0; i < 300; i++) {
        a[i] = cb_sampler_sample(s1, l, 64);
        b[i] = cb_sampler_sample(s2, l, 64);
        c[i] = cb_sampler_sample(s3, l, 64);
        same12 &= a[i] == b[i];
        same13 &= a[i] == c[i];
    }
    CHECK(same12);
    CHECK(!same13);
    cb_sampler_free(s1);
    cb_sampler_free(s2);
    cb_sampler_free(s3);

    tcase("seed: golden sequence of seed 0 (portable generator)");
    {
        /* Weights 1..4 for ids 0..3: any change to the generator or the
         * draw changes this sequence; it must be the same on every host. */
        float g[4] = {0.0f, 0.6931472f, 1.0986123f, 1.3862944f};
        cb_sampler *s = mk(1.0f, 0, 1.0f, 0.0f, 0);
        int32_t seq[16];
        char got[64];
        size_t off = 0;
        for (int i = 0; i < 16; i++) {
            seq[i] = cb_sampler_sample(s, g, 4);
            off += (size_t)snprintf(got + off, sizeof got - off, "%d", (int)seq[i]);
        }
        CHECKF(strcmp(got, GOLDEN_SEED0) == 0, "got %s, want %s", got, GOLDEN_SEED0);
        cb_sampler_free(s);
    }
}

static void test_distribution(void)
{
    float l8[8] = {1.0f, 0.2f, -0.5f, 1.5f, 0.0f, -2.0f, 0.9f, 1.2f};
    float l40[40];
    static float l1100[1100];
    tcase("distribution: softmax(logits / temp) over all tokens");
    check_distribution("t=1", l8, 8, 1.0f, 0, 1.0f, 0.0f, 200000);
    check_distribution("t=0.7", l8, 8, 0.7f, 0, 1.0f, 0.0f, 200000);
    check_distribution("t=2.5", l8, 8, 2.5f, 0, 1.0f, 0.0f, 200000);
    tcase("distribution: renormalized over the top-k / top-p / min-p set");
    check_distribution("top_k=3 t=0.8", l8, 8, 0.8f, 3, 1.0f, 0.0f, 200000);
    /* top-p on temperature-1 probabilities, then temperature 3 */
    check_distribution("top_p=0.7 t=3", l8, 8, 3.0f, 0, 0.7f, 0.0f, 200000);
    check_distribution("min_p=0.3 t=1.5", l8, 8, 1.5f, 0, 1.0f, 0.3f, 200000);
    fill_logits(l40, 40, 1.0);
    check_distribution("chain k=20 p=0.9 min_p=0.05 t=0.8", l40, 40, 0.8f, 20, 0.9f, 0.05f, 300000);
    /* over 1024 candidates top-p takes its histogram path: 30 likely tokens
     * spread through 1100 unlikely ones */
    fill_logits(l1100, 1100, 1.0);
    for (int i = 0; i < 30; i++)
        l1100[i * 37 + 5] += 12.0f;
    check_distribution("n=1100 top_p=0.8 t=1.3", l1100, 1100, 1.3f, 0, 0.8f, 0.0f, 20000);
    check_distribution("n=1100 top_p=0.999 t=0.9", l1100, 1100, 0.9f, 0, 0.999f, 0.0f, 20000);
    /* logits on a grid of 1/4: ~20 tied tokens a value, so the cut falls
     * inside a crowded bucket and the ties are cut by id */
    fill_logits(l1100, 1100, 1.0);
    for (int i = 0; i < 1100; i++)
        l1100[i] = roundf(l1100[i] * 4.0f) / 4.0f;
    check_distribution("n=1100 grid top_p=0.3", l1100, 1100, 1.0f, 0, 0.3f, 0.0f, 20000);
}

static void test_sets(void)
{
    enum { N = 2000, BIG = 262144 };
    float *l = malloc(BIG * sizeof *l);
    tcase("top-p: draws stay in the smallest set reaching p");
    fill_logits(l, N, 2.0);
    check_within("p=0.5", l, N, 1.0f, 0, 0.5f, 0.0f, 1, 3000);
    check_within("p=0.9", l, N, 1.0f, 0, 0.9f, 0.0f, 2, 3000);
    check_within("p=0.99 t=5", l, N, 5.0f, 0, 0.99f, 0.0f, 3, 3000);
    check_within("p=0 (argmax only)", l, N, 1.0f, 0, 0.0f, 0.0f, 4, 500);
    check_within("p=0.8 k=50", l, N, 1.0f, 50, 0.8f, 0.0f, 5, 3000);

    tcase("min-p: draws stay in p_i >= min_p * p_max");
    check_within("min_p=0.05", l, N, 1.0f, 0, 1.0f, 0.05f, 6, 3000);
    check_within("min_p=0.5 t=4", l, N, 4.0f, 0, 1.0f, 0.5f, 7, 3000);
    check_within("min_p=0.01 k=100", l, N, 1.0f, 100, 1.0f, 0.01f, 8, 3000);
    check_within("min_p=0.2 p=0.95", l, N, 1.5f, 0, 0.95f, 0.2f, 9, 3000);

    tcase("n_vocab 262144: defaults, and top-p over a flat distribution");
    fill_logits(l, BIG, 3.0);
    check_within("defaults", l, BIG, 0.8f, 40, 0.95f, 0.05f, 10, 200);
    /* nearly flat: top-p needs most of the vocabulary */
    fill_logits(l, BIG, 0.05);
    check_within("flat p=0.9", l, BIG, 1.0f, 0, 0.9f, 0.0f, 11, 50);
    check_within("flat p=0.9 min_p=0.9", l, BIG, 1.0f, 0, 0.9f, 0.9f, 12, 50);
    free(l);
}

static void test_edges(void)
{
    float one = -3.0f, two[2] = {-INFINITY, -INFINITY};
    cb_sampler *s = mk(1.0f, 40, 0.95f, 0.05f, 5), *g = mk(0.0f, 0, 1.0f, 0.0f, 5);
    tcase("n_vocab 1 gives 0; bad arguments give -1");
    CHECK(cb_sampler_sample(s, &one, 1) == 0);
    CHECK(cb_sampler_sample(g, &one, 1) == 0);
    CHECK(cb_sampler_sample(s, &one, 0) == -1);
    CHECK(cb_sampler_sample(s, NULL, 4) == -1);
    CHECK(cb_sampler_sample(NULL, &one, 1) == -1);
    tcase("all -inf logits give the lowest id");
    CHECK(cb_sampler_sample(s, two, 2) == 0);
    CHECK(cb_sampler_sample(g, two, 2) == 0);
    cb_sampler_free(s);
    s = mk(1.0f, 0, 1.0f, 0.0f, 5);
    CHECK(cb_sampler_sample(s, two, 2) == 0);
    tcase("+inf logits win; min_p above 1 keeps the max");
    {
        float inf3[3] = {1.0f, INFINITY, 2.0f}, l3[3] = {0.5f, 0.25f, 0.75f};
        CHECK(cb_sampler_sample(s, inf3, 3) == 1);
        CHECK(cb_sampler_sample(g, inf3, 3) == 1);
        cb_sampler_free(s);
        s = mk(1.0f, 0, 0.5f, 0.0f, 5);
        CHECK(cb_sampler_sample(s, inf3, 3) == 1);
        cb_sampler_free(s);
        s = mk(1.0f, 0, 1.0f, 5.0f, 5);
        CHECK(cb_sampler_sample(s, l3, 3) == 2);
        cb_sampler_free(s);
        s = mk(1.0f, 2, 0.9f, 5.0f, 5);
        CHECK(cb_sampler_sample(s, l3, 3) == 2);
    }
    cb_sampler_free(s);
    cb_sampler_free(g);
}

int main(void)
{
    TEST_BEGIN();
    test_defaults();
    test_greedy();
    test_top_k1();
    test_seed();
    test_distribution();
    test_sets();
    test_edges();
    TEST_END();
}
