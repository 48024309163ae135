/* sampler.c - next-token sampling: greedy, or llama.cpp's default chain
 * top-k -> top-p -> min-p -> temperature -> draw (src/llama-sampling.cpp,
 * as common/sampling.cpp assembles it, with min_keep 0).
 *
 * Definitions, on the candidate set left by the previous stage:
 *   top-k   keep the k highest logits (ties: lowest id first).
 *   top-p   softmax of the candidates (temperature 1); keep the shortest
 *           prefix of the descending order whose mass reaches p (>= p), at
 *           least one token; all of them when rounding keeps the sum below p.
 *   min-p   keep logits >= max_logit + log(min_p), i.e. p_i >= min_p * p_max
 *           (llama.cpp's test, in the logit domain; the max always stays).
 *   temp    divide the survivors' logits by temp, softmax, draw one token
 *           with a uniform double in [0, 1) against the running sum.  A
 *           single survivor is returned without a draw, as llama.cpp does.
 * top-p and min-p both keep a prefix of the descending order and min-p's
 * reference (the max) is the same before and after top-p, so the two
 * commute; the code uses that to sort only what it must.
 *
 * Cost for n_vocab = 262144: top-k is a k-element heap over one pass of the
 * logits (O(n log k)), never a full sort.  Without top-k, min-p filters in
 * one pass, and top-p finds its cut with a histogram of the probability
 * mass by logit and sorts only the tokens of the bucket the cut falls in.
 * Scratch (candidates and weights) is sized to the largest n_vocab seen and
 * kept, so sampling allocates nothing after the first call.
 *
 * The generator is xoshiro256** seeded through splitmix64: the same seed
 * gives the same stream on every machine.  Weights use expf and a double
 * running sum; a libm whose expf rounds differently could, in a rare tie at
 * the draw boundary, pick a neighbouring token. */
#include "infer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    int32_t id;
    float logit;
};

#define TOP_P_BUCKETS 1024

struct cb_sampler {
    cb_sampler_params p;
    uint64_t rng[4];   /* xoshiro256** state */
    struct cand *cand; /* [cap] candidates of the current call */
    float *w;          /* [cap] unnormalized weights for the draw */
    size_t cap;
    double mass[TOP_P_BUCKETS]; /* top-p histogram, see top_p_unsorted */
};

/* ------------------------------------------------------------ generator */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_unit(uint64_t s[4]) { return (double)(xoshiro_next(s) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------------ ordering */

/* NaN never wins: it is read as -inf. */
static float logit_at(const float *logits, int32_t i)
{
    float x = logits[i];
    return isnan(x) ? -INFINITY : x;
}

/* The descending order: higher logit first, lower id on equal logits.  A
 * total order, so every selection and sort below is deterministic. */
static int better(struct cand a, struct cand b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int cand_cmp(const void *pa, const void *pb)
{
    struct cand a = *(const struct cand *)pa, b = *(const struct cand *)pb;
    return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

/* Min-heap on `better`: h[0] is the worst of the heap. */
static void heap_down(struct cand *h, size_t n, size_t i)
{
    struct cand x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && better(h[c], h[c + 1]))
            c++;
        if (!better(x, h[c]))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* The k best of logits[0..n) into out[0..k), in descending order.
 * 1 <= k <= n.  O(n log k): most logits lose to the heap's root at once. */
static void select_top(const float *logits, int32_t n, int32_t k, struct cand *out)
{
    size_t m = (size_t)k;
    for (int32_t i = 0; i < k; i++)
        out[i] = (struct cand){i, logit_at(logits, i)};
    for (size_t i = m / 2; i-- > 0;)
        heap_down(out, m, i);
    for (int32_t i = k; i < n; i++) {
        struct cand c = {i, logit_at(logits, i)};
        if (better(c, out[0])) {
            out[0] = c;
            heap_down(out, m, 0);
        }
    }
    /* heap sort: the worst moves to the end each round */
    for (size_t end = m; end > 1; end--) {
        struct cand t = out[0];
        out[0] = out[end - 1];
        out[end - 1] = t;
        heap_down(out, end - 1, 0);
    }
}

/* Histogram bucket of a logit: 0 holds the max, TOP_P_BUCKETS - 1 the
 * lowest `span` edge and everything below it (-inf included). */
static size_t bucket_of(float logit, float maxl, float span, float scale)
{
    float d = maxl - logit;
    if (!(d < span))
        return TOP_P_BUCKETS - 1;
    return (size_t)(d * scale);
}

static int32_t argmax(const float *logits, int32_t n)
{
    int32_t best = 0;
    float bl = logit_at(logits, 0);
    for (int32_t i = 1; i < n; i++) {
        float x = logit_at(logits, i);
        if (x > bl) { /* strict: the lowest id wins a tie */
            bl = x;
            best = i;
        }
    }
    return best;
}

/* ---------------------------------------------------------------- API */

cb_sampler_params cb_sampler_defaults(void)
{
    cb_sampler_params p = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 0};
    return p;
}

/* Copies *p (NULL means the defaults) and seeds the generator; scratch is
 * allocated on the first cb_sampler_sample.  Returns NULL on OOM. */
cb_sampler *cb_sampler_new(const cb_sampler_params *p)
{
    cb_sampler *s = calloc(1, sizeof *s);
    uint64_t x;
    if (!s)
        return NULL;
    s->p = p ? *p : cb_sampler_defaults();
    x = s->p.seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x); /* never all zero */
    return s;
}

void cb_sampler_free(cb_sampler *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s->w);
    free(s);
}

static int reserve(cb_sampler *s, size_t n)
{
    struct cand *c;
    float *w;
    if (n <= s->cap)
        return 0;
    c = realloc(s->cand, n * sizeof *c);
    if (!c)
        return -1;
    s->cand = c;
    w = realloc(s->w, n * sizeof *w);
    if (!w)
        return -1;
    s->w = w;
    s->cap = n;
    return 0;
}

/* Length of the top-p prefix of cand[0..m) (descending), whose weights
 * exp(logit - maxl) are measured against `total` (the weight of the whole
 * candidate set); m when the prefix does not reach p. */
static size_t top_p_len(const struct cand *cand, size_t m, float maxl, double total, float top_p)
{
    double goal = (double)top_p * total, cum = 0.0;
    for (size_t i = 0; i < m; i++) {
        cum += expf(cand[i].logit - maxl);
        if (cum >= goal)
            return i + 1;
    }
    return m;
}

/* Top-p over cand[0..m) in any order: moves the kept tokens to the front
 * and returns their count, without sorting all m.  A histogram of the
 * weights by logit (TOP_P_BUCKETS buckets over [maxl - span, maxl], the
 * rest in the last) finds the bucket where the running mass reaches p; the
 * buckets above it are kept whole, and only the boundary bucket is sorted
 * and walked token by token.  The kept set is the sorted prefix that
 * top_p_len would give, up to the rounding of the partial sums. */
static size_t top_p_unsorted(cb_sampler *s, size_t m, float maxl, double total, float top_p)
{
    struct cand *c = s->cand;
    double goal = (double)top_p * total, cum = 0.0;
    float lo = maxl, span, scale;
    size_t a, j, b;
    if (m <= 1024) {
        qsort(c, m, sizeof *c, cand_cmp);
        return top_p_len(c, m, maxl, total, top_p);
    }
    for (size_t i = 0; i < m; i++)
        if (c[i].logit < lo && isfinite(c[i].logit))
            lo = c[i].logit;
    span = maxl - lo < 40.0f ? maxl - lo : 40.0f; /* e^-40: nothing below */
    scale = span > 0.0f ? (float)(TOP_P_BUCKETS - 1) / span : 0.0f;
    memset(s->mass, 0, sizeof s->mass);
    for (size_t i = 0; i < m; i++)
        s->mass[bucket_of(c[i].logit, maxl, span, scale)] += expf(c[i].logit - maxl);
    for (b = 0; b < TOP_P_BUCKETS - 1; b++) {
        if (cum + s->mass[b] >= goal)
            break;
        cum += s->mass[b];
    }
    /* partition: buckets above b to the front, bucket b after them */
    a = 0;
    for (size_t i = 0; i < m; i++) {
        if (bucket_of(c[i].logit, maxl, span, scale) < b) {
            struct cand t = c[a];
            c[a++] = c[i];
            c[i] = t;
        }
    }
    j = a;
    for (size_t i = a; i < m; i++) {
        if (bucket_of(c[i].logit, maxl, span, scale) == b) {
            struct cand t = c[j];
            c[j++] = c[i];
            c[i] = t;
        }
    }
    qsort(c + a, j - a, sizeof *c, cand_cmp);
    for (size_t i = a; i < j; i++) {
        cum += expf(c[i].logit - maxl);
        if (cum >= goal)
            return i + 1;
    }
    return j; /* rounding: the boundary bucket did not quite reach p */
}

/* Temperature and the draw over cand[0..m), m >= 1. */
static int32_t draw(cb_sampler *s, size_t m)
{
    const struct cand *c = s->cand;
    float maxl = c[0].logit, inv = 1.0f / s->p.temp;
    double sum = 0.0, target, cum = 0.0;
    size_t last = 0;
    if (m == 1)
        return c[0].id;
    for (size_t i = 1; i < m; i++)
        if (c[i].logit > maxl)
            maxl = c[i].logit;
    if (!isfinite(maxl)) { /* all -inf, or +inf: the first of the max */
        size_t i = 0;
        while (c[i].logit != maxl)
            i++;
        return c[i].id;
    }
    for (size_t i = 0; i < m; i++) {
        s->w[i] = expf((c[i].logit - maxl) * inv);
        sum += s->w[i];
    }
    target = rng_unit(s->rng) * sum;
    /* The same sums in the same order, so cum reaches sum > target; `>`
     * never lands on a zero weight. */
    for (size_t i = 0; i < m; i++) {
        if (s->w[i] == 0.0f)
            continue;
        cum += s->w[i];
        last = i;
        if (cum > target)
            return c[i].id;
    }
    return c[last].id;
}

/* Returns a token id in [0, n_vocab), or -1 when s or logits is NULL,
 * n_vocab < 1, or the scratch cannot grow (out of memory).  logits are only
 * read; NaN counts as -inf.  Greedy (temp <= 0) ignores the other filters
 * (the argmax survives all of them) and does not advance the generator;
 * n_vocab == 1 returns 0 without a draw. */
int32_t cb_sampler_sample(cb_sampler *s, const float *logits, int32_t n_vocab)
{
    const cb_sampler_params *p;
    size_t m;
    int sorted = 0;
    float maxl;
    double total;
    if (!s || !logits || n_vocab < 1)
        return -1;
    p = &s->p;
    if (n_vocab == 1)
        return 0;
    if (!(p->temp > 0.0f))
        return argmax(logits, n_vocab);
    if (reserve(s, (size_t)n_vocab) != 0)
        return -1;

    /* top-k */
    if (p->top_k > 0 && p->top_k < n_vocab) {
        select_top(logits, n_vocab, p->top_k, s->cand);
        m = (size_t)p->top_k;
        sorted = 1;
    } else {
        for (int32_t i = 0; i < n_vocab; i++)
            s->cand[i] = (struct cand){i, logit_at(logits, i)};
        m = (size_t)n_vocab;
    }
    if (!(p->top_p < 1.0f) && !(p->min_p > 0.0f))
        return draw(s, m);

    maxl = s->cand[0].logit;
    if (!sorted)
        for (size_t i = 1; i < m; i++)
            if (s->cand[i].logit > maxl)
                maxl = s->cand[i].logit;
    if (!isfinite(maxl))
        return sorted ? s->cand[0].id : argmax(logits, n_vocab);
    total = 0.0;
    for (size_t i = 0; i < m; i++)
        total += expf(s->cand[i].logit - maxl);

    /* min-p first: it keeps a prefix too, and shrinks what top-p sorts */
    if (p->min_p > 0.0f) {
        float thresh = maxl + logf(p->min_p);
        if (thresh > maxl) /* min_p > 1: the max stays, as in llama.cpp */
            thresh = maxl;
        size_t j = 0;
        if (sorted) {
            while (j < m && s->cand[j].logit >= thresh)
                j++;
        } else {
            for (size_t i = 0; i < m; i++)
                if (s->cand[i].logit >= thresh)
                    s->cand[j++] = s->cand[i];
        }
        m = j; /* >= 1: the max passes */
    }

    if (p->top_p < 1.0f)
        m = sorted ? top_p_len(s->cand, m, maxl, total, p->top_p)
                   : top_p_unsorted(s, m, maxl, total, p->top_p);
    return draw(s, m);
}
