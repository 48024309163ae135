/* neighbours.c - each chunk's most similar chunks of a corpus, by BM25
 * over their token ids: the chunks cb-precompute --neighbours computes a
 * chunk after (cross-chunk context at precompute, after FusionRAG), so
 * that its cache holds the attention to the text it is likely to be
 * retrieved with.
 *
 * Lexical on purpose: no second model, and the token ids are at hand.
 * Chunk i is the query: its NB_TERMS rarest distinct tokens that occur in
 * another chunk too (document frequency >= 2, ties by token id) score
 * every other chunk j by BM25 (k1 1.2, b 0.75, idf ln(1 + (N - df + 0.5)
 * / (df + 0.5))).  Taking the rarest terms only keeps the work near
 * linear in the corpus (a common token's postings list is every chunk)
 * and loses little: common tokens weigh least.  Chunks with exactly i's
 * tokens are never its neighbours (they add nothing); ties go to the
 * lower index.  tests/unit/test_prompt.c checks this against a plain loop
 * over every pair. */
#include "prompt_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NB_TERMS 64
#define NB_K1 1.2
#define NB_B 0.75

typedef struct nb_term {
    int32_t tok, tf, df; /* df: filled in for the query's sort */
} nb_term;

typedef struct nb_post {
    int32_t doc, tf;
} nb_post;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A chunk's distinct tokens with their counts, by token id. */
static cb_status distinct(const cb_tokens *d, nb_term **out, int32_t *n_out)
{
    int32_t *ids = malloc(sizeof *ids * (d->n ? d->n : 1));
    nb_term *t = malloc(sizeof *t * (d->n ? d->n : 1));
    int32_t n = 0;
    if (!ids || !t) {
        free(ids);
        free(t);
        return CB_ERR_NOMEM;
    }
    memcpy(ids, d->ids, sizeof *ids * d->n);
    qsort(ids, d->n, sizeof *ids, cmp_i32);
    for (size_t i = 0; i < d->n; i++) {
        if (n > 0 && t[n - 1].tok == ids[i])
            t[n - 1].tf++;
        else
            t[n++] = (nb_term){ids[i], 1, 0};
    }
    free(ids);
    *out = t;
    *n_out = n;
    return CB_OK;
}

static int cmp_rare(const void *a, const void *b)
{
    const nb_term *x = a, *y = b;
    if (x->df != y->df)
        return (x->df > y->df) - (x->df < y->df);
    return (x->tok > y->tok) - (x->tok < y->tok);
}

static int same_tokens(const cb_tokens *a, const cb_tokens *b)
{
    return a->n == b->n && (a->n == 0 || !memcmp(a->ids, b->ids, sizeof(int32_t) * a->n));
}

cb_status cb_neighbours(const cb_tokens *docs, size_t n, int k, int32_t *out)
{
    cb_status st = CB_OK;
    nb_term **terms = NULL;
    int32_t *n_terms = NULL, *df = NULL, *start = NULL, *fill = NULL, *touched = NULL;
    nb_post *post = NULL;
    double *score = NULL, avg = 0;
    int32_t n_tok = 0;
    size_t n_post = 0;

    if (k < 1 || n > INT32_MAX)
        return CB_ERR_INVALID;
    for (size_t i = 0; i < n * (size_t)k; i++)
        out[i] = -1;
    if (n < 2)
        return CB_OK;
    terms = calloc(n, sizeof *terms);
    n_terms = calloc(n, sizeof *n_terms);
    score = calloc(n, sizeof *score);
    touched = malloc(sizeof *touched * n);
    if (!terms || !n_terms || !score || !touched) {
        st = CB_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if ((st = distinct(&docs[i], &terms[i], &n_terms[i])) != CB_OK)
            goto done;
        for (int32_t t = 0; t < n_terms[i]; t++)
            if (terms[i][t].tok >= n_tok)
                n_tok = terms[i][t].tok + 1;
        n_post += (size_t)n_terms[i];
        avg += (double)docs[i].n;
    }
    avg /= (double)n;
    /* the postings, by token: start[t] .. start[t + 1] */
    df = calloc((size_t)n_tok + 1, sizeof *df);
    start = calloc((size_t)n_tok + 2, sizeof *start);
    fill = calloc((size_t)n_tok + 1, sizeof *fill);
    post = malloc(sizeof *post * (n_post ? n_post : 1));
    if (!df || !start || !fill || !post) {
        st = CB_ERR_NOMEM;
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        for (int32_t t = 0; t < n_terms[i]; t++)
            if (terms[i][t].tok >= 0)
                df[terms[i][t].tok]++;
    for (int32_t t = 0; t < n_tok; t++)
        start[t + 1] = start[t] + df[t];
    for (size_t i = 0; i < n; i++)
        for (int32_t t = 0; t < n_terms[i]; t++) {
            int32_t tok = terms[i][t].tok;
            if (tok >= 0)
                post[start[tok] + fill[tok]++] = (nb_post){(int32_t)i, terms[i][t].tf};
        }
    for (size_t i = 0; i < n; i++) {
        /* the query: i's rarest terms shared with another chunk (reordering
         * i's own list is fine: the postings are built) */
        nb_term *q = terms[i];
        int32_t nq = 0, nt = 0;
        for (int32_t t = 0; t < n_terms[i]; t++)
            if (q[t].tok >= 0 && df[q[t].tok] >= 2) {
                q[nq] = q[t];
                q[nq++].df = df[q[t].tok];
            }
        qsort(q, (size_t)nq, sizeof *q, cmp_rare);
        if (nq > NB_TERMS)
            nq = NB_TERMS;
        for (int32_t t = 0; t < nq; t++) {
            int32_t tok = q[t].tok;
            double idf = log(1.0 + ((double)n - df[tok] + 0.5) / (df[tok] + 0.5));
            for (int32_t p = start[tok]; p < start[tok + 1]; p++) {
                int32_t j = post[p].doc;
                if ((size_t)j == i)
                    continue;
                double tf = post[p].tf,
                       norm = NB_K1 * (1.0 - NB_B + NB_B * (double)docs[j].n / avg);
                if (score[j] == 0)
                    touched[nt++] = j;
                score[j] += idf * tf * (NB_K1 + 1.0) / (tf + norm);
            }
        }
        /* the k best (a chunk's list is short: insertion) */
        int32_t *best = out + i * (size_t)k;
        for (int32_t c = 0; c < nt; c++) {
            int32_t j = touched[c];
            double s = score[j];
            if (s > 0 && !same_tokens(&docs[i], &docs[j])) {
                int pos = k;
                while (pos > 0 && (best[pos - 1] < 0 || score[best[pos - 1]] < s ||
                                   (score[best[pos - 1]] == s && best[pos - 1] > j)))
                    pos--;
                if (pos < k) {
                    memmove(best + pos + 1, best + pos, sizeof *best * (size_t)(k - pos - 1));
                    best[pos] = j;
                }
            }
        }
        for (int32_t c = 0; c < nt; c++)
            score[touched[c]] = 0;
    }
done:
    if (terms)
        for (size_t i = 0; i < n; i++)
            free(terms[i]);
    free(terms);
    free(n_terms);
    free(df);
    free(start);
    free(fill);
    free(post);
    free(score);
    free(touched);
    return st;
}
