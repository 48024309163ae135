/* blend_diag - where a blend's quality goes (issue 31 item 2): for each
 * question, full prefill against reuse and blend, layer by layer.
 * usage: blend_diag MODEL STORE THREADS QFILE MODE...
 *   QFILE  JSON Lines: {"question": text, "chunks": [text...], "gold": [i...]}
 *          (gold: the chunks holding an answer; "system": text, optional, as
 *          cb-run --system); each chunk's KV must be in STORE (cb-precompute,
 *          as tests/bench/diag.py does)
 *   MODE   full (always run first), reuse, or STRATEGY:RATIO[:DEPTH[:SCALE]] (probe:0.15;
 *          DEPTH: probe's first pass through that share of the layers, 0: by cost;
 *          SCALE: the stale scale, cb-run --tune stale-scale, 1 unless given),
 *          or ORACLE:RATIO: the loaded caches with the rows picked by a
 *          score that only full prefill gives, recomputed as probe's second
 *          pass does (the headroom of selection; oracle_scores):
 *          oatt, odev, ovdev, ostale, and oprobe (probe's own score, a check);
 *          oiter: probe's score in two rounds, the second over the cache
 *          the first one's half of the rows left (not an oracle: it knows
 *          nothing of full prefill, but costs about 1.5 blends); pshr:R:S,
 *          probe's rows with a budget shrinking with depth, (1 + S) x R's
 *          at layer 0 to (1 - S) x R's at the last (the same cost);
 *          late:R:K, probe's rows recomputed from layer K on only, from the
 *          hidden state each had there when its chunk was computed alone
 *          after the default lead-in (as cb-precompute without
 *          --for-system stores it): what storing that state with the KV
 *          would save (K/n_layer of a recomputed row) and lose
 * For each question and mode one JSON line on stdout:
 *   kl, top1   the first answer token's distribution against full's
 *   per layer (arrays of n_layer):
 *     the question turn's attention (its rows' softmax, summed over heads
 *     and rows, as a share of the whole) on the prompt's head (BOS and the
 *     system turn: the sink), on each chunk's first 4 tokens (heads), on
 *     the gold chunks and the other chunks (their rows past the heads), on
 *     the separators and on the question turn itself; tv: total variation
 *     between that distribution and full prefill's;
 *     kdev, vdev: ||K - K_full|| / ||K_full|| over the chunks' rows (the
 *     staleness of the cache the question attends to), kdev_gold, kdev_heads
 *     (the gold chunks', the chunks' first 4 tokens'), kdev0: layer 0's
 *     unrounded (a moved chunk's keys against those computed in place);
 *     knorm, vnorm: ||K|| / ||K_full|| over the chunks' rows, kcos, vcos:
 *     the mean cosine of a row's K (V) with full's;
 *     cos: cosine of the question's last hidden state with full's.
 *   chunk_mass, chunk_mass_half (arrays of the chunks): each chunk's share
 *   of the question's attention, the mean over every layer and over the
 *   first half (the layers probe's first pass scores at on long prompts);
 *   gold_rank, gold_rank_half: the best rank of a gold chunk by it (0: the
 *   most attended; -1: no gold chunk).
 *   vdev_pos, vdev_chunk: ||V - V_full|| / ||V_full|| of a chunk's row, the
 *   mean over rows and layers, by the row's place in its chunk (0, 1, 2-3,
 *   4-7, ..., 512 on; the chunks whose caches are not true prefixes) and by
 *   chunk (every one).
 * The chunks are the passages: the prompt's head is none of them, cached
 * or not.
 * The question turn is run again, layer by layer, against the cache the
 * prefill left (the same K/V the prefill's last pass attended to). */
#include "../../lib/infer/diag.h"  /* cb_fwd_attn_mass, cb_fwd_hidden, cb_fwd_set_hidden */
#include "../../lib/kv/strategy.h" /* blend_scored, blend_by_score_desc */

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_TOKENS 4
#define POS_BUCKETS 11 /* a row's place in its chunk: 0, 1, 2-3, 4-7, ..., 512 on */

enum { R_HEAD, R_CHUNK_HEAD, R_GOLD, R_OTHER, R_SEP, R_SELF, R_N };
static const char *const r_name[R_N] = {"prefix", "heads", "gold", "other", "sep", "self"};

typedef struct qdiag {
    int32_t n_layer, total;
    float *mass;   /* [n_layer][total], normalized */
    float *hidden; /* [n_layer][n_embd] the last row's */
    float *logits;
} qdiag;

static void warn(void *ctx, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "blend_diag: warning: %s\n", msg);
}

/* The question turn (the last segment) through every layer against kv. */
static cb_status question_pass(cb_fwd *f, cb_kvcache *kv, const cb_segment *tail, int32_t total,
                               const cb_hparams *hp, qdiag *d)
{
    int32_t n = tail->n, *pos = malloc(sizeof *pos * (size_t)n);
    cb_status st = CB_ERR_NOMEM;
    if (!pos)
        return st;
    for (int32_t i = 0; i < n; i++)
        pos[i] = total - n + i;
    if ((st = cb_fwd_embed(f, tail->ids, pos, n)) != CB_OK)
        goto out;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        float *m = d->mass + (size_t)l * (size_t)total;
        memset(m, 0, sizeof *m * (size_t)total);
        if ((st = cb_fwd_layer(f, kv, l, NULL, n)) != CB_OK ||
            (st = cb_fwd_attn_mass(f, kv, l, 0, n, total, 0, m)) != CB_OK ||
            (st = cb_fwd_hidden(f, n - 1, d->hidden + (size_t)l * (size_t)hp->n_embd)) != CB_OK)
            goto out;
        double s = 0;
        for (int32_t j = 0; j < total; j++)
            s += m[j];
        for (int32_t j = 0; j < total; j++)
            m[j] = (float)(m[j] / s);
    }
out:
    free(pos);
    return st;
}

static double rel_dev(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return den > 0 ? sqrt(num / den) : 0;
}

/* ||a|| / ||b|| and the mean cosine of their rows of w */
static void norm_cos(const float *a, const float *b, size_t n, size_t w, double *ratio, double *cs)
{
    double na = 0, nb = 0, c = 0;
    size_t rows = 0;
    for (size_t r = 0; r + w <= n; r += w, rows++) {
        double d = 0, x = 0, y = 0;
        for (size_t i = r; i < r + w; i++)
            d += (double)a[i] * b[i], x += (double)a[i] * a[i], y += (double)b[i] * b[i];
        na += x, nb += y, c += x > 0 && y > 0 ? d / sqrt(x * y) : 1;
    }
    *ratio = nb > 0 ? sqrt(na / nb) : 1, *cs = rows ? c / (double)rows : 1;
}

static json_t *jarr(const double *x, int32_t n)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < n; i++)
        json_array_append_new(a, json_real(round(x[i] * 1e5) / 1e5));
    return a;
}

/* One mode's line: its distribution against full's, its cache against full's
 * (chunk_flags[c]: bit 0, chunk c holds an answer; bit 1, its cache is a
 * true prefix). */
static json_t *compare(const char *label, const qdiag *d, const qdiag *full, const uint8_t *cls,
                       const cb_hparams *hp, cb_kvcache *kv, cb_kvcache *kv_full,
                       const int16_t *chunk_of, const uint8_t *chunk_flags, int32_t n_chunks,
                       int32_t n_vocab)
{
    int32_t L = hp->n_layer, T = d->total;
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    double *share = calloc((size_t)L * R_N, sizeof *share), *tv = calloc((size_t)L, sizeof *tv);
    double *cs = calloc((size_t)L, sizeof *cs), *dev[4], *nc[4];
    float *a = malloc(sizeof *a * (size_t)(T * w)), *b = malloc(sizeof *b * (size_t)(T * w));
    float *ca = malloc(sizeof *ca * (size_t)(T * w)), *cb = malloc(sizeof *cb * (size_t)(T * w));
    json_t *o = json_object();
    double pb[POS_BUCKETS] = {0}, pn[POS_BUCKETS] = {0};
    double *cbk = calloc((size_t)n_chunks + 1, sizeof *cbk),
           *cbn = calloc((size_t)n_chunks + 1, sizeof *cbn);
    int bad = !cbk || !cbn || !share || !tv || !cs || !a || !b || !ca || !cb || !o;
    for (int i = 0; i < 4; i++) {
        dev[i] = calloc((size_t)L, sizeof *dev[i]), nc[i] = calloc((size_t)L, sizeof *nc[i]);
        bad |= !dev[i] || !nc[i];
    }
    if (bad) {
        fprintf(stderr, "blend_diag: out of memory\n");
        exit(70);
    }
    for (int32_t l = 0; l < L; l++) {
        const float *m = d->mass + (size_t)l * T, *mf = full->mass + (size_t)l * T;
        for (int32_t j = 0; j < T; j++) {
            share[l * R_N + cls[j]] += m[j];
            tv[l] += 0.5 * fabs((double)m[j] - mf[j]);
        }
        const float *h = d->hidden + (size_t)l * hp->n_embd,
                    *hf = full->hidden + (size_t)l * hp->n_embd;
        double dot = 0, na = 0, nb = 0;
        for (int32_t i = 0; i < hp->n_embd; i++)
            dot += (double)h[i] * hf[i], na += (double)h[i] * h[i], nb += (double)hf[i] * hf[i];
        cs[l] = dot / sqrt(na * nb);
        /* K over the chunks' rows, the gold ones, the chunks' first tokens; V over all */
        for (int which = 0; which < 2; which++) {
            if (cb_kvcache_read(kv, l, which, 0, T, a) != CB_OK ||
                cb_kvcache_read(kv_full, l, which, 0, T, b) != CB_OK)
                continue;
            for (int32_t j = 0, place = 0; which && j < T; j++) { /* V's staleness by place */
                int c = chunk_of[j];
                place = j > 0 && chunk_of[j - 1] == c ? place + 1 : 0; /* the row's, in its chunk */
                if (c < 0)
                    continue;
                int by_place = !(chunk_flags[c] & 2); /* a true prefix's rows are not stale */
                double dd = 0, nn = 0;
                for (int64_t e = 0; e < w; e++) {
                    double x = (double)a[j * w + e] - b[j * w + e];
                    dd += x * x, nn += (double)b[j * w + e] * b[j * w + e];
                }
                int bk = 0;
                for (int32_t i = place; i > 0 && bk < POS_BUCKETS - 1; i >>= 1)
                    bk++;
                double rd = nn > 0 ? sqrt(dd / nn) : 0;
                pb[bk] += by_place * rd, pn[bk] += by_place, cbk[c] += rd, cbn[c] += 1;
            }
            for (int sel = 0; sel < (which ? 1 : 3); sel++) {
                size_t n = 0;
                for (int32_t j = 0; j < T; j++) {
                    int c = chunk_of[j];
                    if (c < 0 || (sel == 1 && !(chunk_flags[c] & 1)) ||
                        (sel == 2 && cls[j] != R_CHUNK_HEAD))
                        continue;
                    memcpy(ca + n, a + (size_t)j * w, sizeof *a * (size_t)w);
                    memcpy(cb + n, b + (size_t)j * w, sizeof *b * (size_t)w);
                    n += (size_t)w;
                }
                dev[which ? 1 : sel == 0 ? 0 : sel + 1][l] = rel_dev(ca, cb, n);
                if (sel == 0)
                    norm_cos(ca, cb, n, (size_t)w, &nc[2 * which][l], &nc[2 * which + 1][l]);
            }
        }
    }
    json_object_set_new(o, "mode", json_string(label));
    for (int i = 0; i < POS_BUCKETS; i++)
        pb[i] = pn[i] > 0 ? pb[i] / pn[i] : 0;
    for (int32_t c = 0; c < n_chunks; c++)
        cbk[c] = cbn[c] > 0 ? cbk[c] / cbn[c] : 0;
    json_object_set_new(o, "vdev_pos", jarr(pb, POS_BUCKETS));
    json_object_set_new(o, "vdev_chunk", jarr(cbk, n_chunks));
    free(cbk), free(cbn);
    { /* each chunk's share of the question's attention, over all layers and the first half */
        double *cm = calloc((size_t)(2 * n_chunks + 1), sizeof *cm);
        if (!cm) {
            fprintf(stderr, "blend_diag: out of memory\n");
            exit(70);
        }
        for (int32_t l = 0; l < L; l++)
            for (int32_t j = 0; j < T; j++)
                if (chunk_of[j] >= 0) {
                    double x = d->mass[(size_t)l * T + j];
                    cm[chunk_of[j]] += x / L;
                    if (l < (L + 1) / 2)
                        cm[n_chunks + chunk_of[j]] += x / ((L + 1) / 2);
                }
        json_object_set_new(o, "chunk_mass", jarr(cm, n_chunks));
        json_object_set_new(o, "chunk_mass_half", jarr(cm + n_chunks, n_chunks));
        for (int h = 0; h < 2; h++) { /* a gold chunk's best rank: chunks attended more */
            const double *x = cm + h * n_chunks;
            int32_t best = -1;
            for (int32_t c = 0; c < n_chunks; c++) {
                if (!(chunk_flags[c] & 1))
                    continue;
                int32_t above = 0;
                for (int32_t e = 0; e < n_chunks; e++)
                    above += x[e] > x[c] || (x[e] == x[c] && e < c);
                best = best < 0 || above < best ? above : best;
            }
            json_object_set_new(o, h ? "gold_rank_half" : "gold_rank", json_integer(best));
        }
        free(cm);
    }
    if (full->logits != d->logits) {
        int top1 = 0;
        double kl = cb_logits_kl(full->logits, d->logits, n_vocab, &top1);
        json_object_set_new(o, "kl", json_real(kl));
        json_object_set_new(o, "top1", json_boolean(top1));
    }
    for (int r = 0; r < R_N; r++) {
        double *x = malloc(sizeof *x * (size_t)L);
        for (int32_t l = 0; l < L; l++)
            x[l] = share[l * R_N + r];
        json_object_set_new(o, r_name[r], jarr(x, L));
        free(x);
    }
    json_object_set_new(o, "tv", jarr(tv, L));
    json_object_set_new(o, "cos", jarr(cs, L));
    json_object_set_new(o, "kdev", jarr(dev[0], L));
    json_object_set_new(o, "vdev", jarr(dev[1], L));
    json_object_set_new(o, "kdev_gold", jarr(dev[2], L));
    json_object_set_new(o, "kdev_heads", jarr(dev[3], L));
    json_object_set_new(o, "kdev0", json_real(dev[0][0]));
    json_object_set_new(o, "knorm", jarr(nc[0], L));
    json_object_set_new(o, "kcos", jarr(nc[1], L));
    json_object_set_new(o, "vnorm", jarr(nc[2], L));
    json_object_set_new(o, "vcos", jarr(nc[3], L));
    for (int i = 0; i < 4; i++)
        free(dev[i]), free(nc[i]);
    free(share), free(tv), free(cs), free(a), free(b), free(ca), free(cb);
    return o;
}

/* The oracle modes: what only full prefill knows picks the rows. */
static float shr_slope = 0.5f; /* pshr:R:S, the budget from (1 + S) x to (1 - S) x */
enum { OR_NONE, OR_ATT, OR_DEV, OR_VDEV, OR_PROBE, OR_STALE, OR_ITER, OR_SHR, OR_LATE };
static int late_k = 0; /* late:R:K */


/* The oracle's scores [T] of the rows: kind OR_VDEV sums ||V_full - V||
 * over the layers (hkvd's deviation, at every layer, against the truth);
 * the others run the question turn over a cache and add, at every layer,
 * each head's attention to a row times the norm of a V row, through
 * cb_fwd_attn_mass over a scratch cache holding that cache's K and that V:
 *   OR_ATT    over full prefill's cache, V_full (probe's score, had it the
 *             true cache)
 *   OR_DEV    over full prefill's cache, V_full - V (what the stale row
 *             changes in the head's output, weighed as full prefill reads)
 *   OR_PROBE  over the loaded cache, its V (probe's own score: a check)
 *   OR_STALE  over the loaded cache, V_full - V (weighed as the stale
 *             question reads). */
static cb_status oracle_scores(cb_fwd *f, cb_kvcache *kv, cb_kvcache *kv_full, cb_kvcache *tmp,
                               const cb_hparams *hp, const cb_segment *tail, int32_t T, int kind,
                               float *score)
{
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    float *a = malloc(sizeof *a * (size_t)(T * w)), *b = malloc(sizeof *b * (size_t)(T * w));
    int32_t *pos = malloc(sizeof *pos * (size_t)tail->n);
    cb_status st = CB_ERR_NOMEM;
    if (!a || !b || !pos)
        goto out;
    memset(score, 0, sizeof *score * (size_t)T);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        if ((st = cb_kvcache_read(kv, l, 1, 0, T, a)) != CB_OK ||
            (st = cb_kvcache_read(kv_full, l, 1, 0, T, b)) != CB_OK)
            goto out;
        for (int64_t i = 0; i < T * w; i++)
            a[i] = kind == OR_ATT ? b[i] : kind == OR_PROBE ? a[i] : b[i] - a[i];
        if (kind == OR_VDEV) {
            for (int32_t j = 0; j < T; j++) {
                double d = 0;
                for (int64_t e = 0; e < w; e++)
                    d += (double)a[j * w + e] * a[j * w + e];
                score[j] += (float)sqrt(d);
            }
            continue;
        }
        cb_kvcache *qkv = kind == OR_PROBE || kind == OR_STALE ? kv : kv_full;
        if ((st = cb_kvcache_write(tmp, l, 1, 0, T, a)) != CB_OK ||
            (st = cb_kvcache_read(qkv, l, 0, 0, T, b)) != CB_OK ||
            (st = cb_kvcache_write(tmp, l, 0, 0, T, b)) != CB_OK)
            goto out;
    }
    if (kind != OR_VDEV) {
        for (int32_t i = 0; i < tail->n; i++)
            pos[i] = T - tail->n + i;
        if ((st = cb_fwd_embed(f, tail->ids, pos, tail->n)) != CB_OK)
            goto out;
        for (int32_t l = 0; l < hp->n_layer; l++)
            if ((st = cb_fwd_layer(f, kind == OR_PROBE || kind == OR_STALE ? kv : kv_full, l, NULL,
                                   tail->n)) != CB_OK ||
                (st = cb_fwd_attn_mass(f, tmp, l, 0, tail->n, T, 1, score)) != CB_OK)
                goto out;
    }
    st = CB_OK;
out:
    free(a), free(b), free(pos);
    return st;
}

/* The top `want` candidates still open (cand 1) by score, marked chosen
 * (cand 0); how many there were. */
static int64_t choose(uint8_t *cand, const float *score, int32_t T, int64_t want, blend_scored *sc)
{
    int64_t n_c = 0;
    for (int32_t j = 0; j < T; j++)
        if (cand[j] == 1)
            sc[n_c].score = score[j], sc[n_c++].row = j;
    qsort(sc, (size_t)n_c, sizeof *sc, blend_by_score_desc);
    want = want > n_c ? n_c : want;
    for (int64_t i = 0; i < want; i++)
        cand[sc[i].row] = 0;
    return want;
}

/* The rows that are no candidates (cand 0: uncached or chosen) from the
 * embeddings through every layer over kv, the last one's logits (probe's
 * second pass); ids and pos are scratch of T. */
static cb_status recompute(cb_fwd *f, cb_kvcache *kv, const cb_hparams *hp, const int32_t *all_ids,
                           const uint8_t *cand, int32_t T, int32_t *ids, int32_t *pos,
                           float *logits)
{
    int32_t n = 0;
    cb_status st;
    for (int32_t j = 0; j < T; j++)
        if (!cand[j])
            ids[n] = all_ids[j], pos[n++] = j;
    if ((st = cb_fwd_embed(f, ids, pos, n)) != CB_OK)
        return st;
    for (int32_t l = 0; l < hp->n_layer; l++)
        if ((st = cb_fwd_layer(f, kv, l, NULL, n)) != CB_OK)
            return st;
    int32_t last = n - 1;
    return cb_fwd_logits(f, &last, 1, logits);
}

/* probe's rows by a budget that shrinks with depth: at layer l the top
 * w_l of the rows by score (rank[j], -1: not chosen), w_l falling
 * linearly from a x want at layer 0 to (2 - a) x want at the last (the
 * same rows in all, a row dropped keeps its loaded K/V from there on). */
static cb_status recompute_shr(cb_fwd *f, cb_kvcache *kv, const cb_hparams *hp,
                               const int32_t *all_ids, const uint8_t *cand, const int32_t *rank,
                               int32_t T, int64_t want, float a, int32_t *ids, int32_t *pos,
                               float *logits)
{
    cb_status st;
    for (int32_t j = 0; j < T; j++)
        ids[j] = all_ids[j], pos[j] = j;
    if ((st = cb_fwd_embed(f, ids, pos, T)) != CB_OK)
        return st;
    int32_t L = hp->n_layer;
    for (int32_t l = 0; l < L; l++) {
        double g = L > 1 ? a - 2.0 * (a - 1.0) * l / (L - 1) : 1.0;
        int64_t wl = (int64_t)llround(g * (double)want);
        int32_t n = 0;
        for (int32_t j = 0; j < T; j++)
            if (cand[j] == 0 && (rank[j] < 0 || rank[j] < wl))
                pos[n++] = j;
        if ((st = cb_fwd_layer(f, kv, l, pos, n)) != CB_OK)
            return st;
    }
    int32_t last = T - 1;
    return cb_fwd_logits(f, &last, 1, logits);
}

/* late:R:K: the chosen rows (was 1, cand 0) recomputed only from layer K
 * on, from the hidden state they had there when their chunk was computed
 * alone after the default lead-in; in layers 0..K-1 they keep their loaded
 * K/V and only the uncached rows are computed.  ids and pos: scratch of T. */
static cb_status recompute_late(cb_fwd *f, cb_kvcache *kv, const cb_model *m,
                                const cb_segment *segs, int32_t n_segs, const int32_t *all_ids,
                                const uint8_t *was, const uint8_t *cand, int32_t T, int32_t K,
                                int32_t *ids, int32_t *pos, float *logits)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t d = hp->n_embd;
    float *hid = malloc(sizeof(float) * (size_t)T * (size_t)d);
    uint8_t *chosen = calloc((size_t)T, 1);
    int32_t *ids2 = NULL, *pos2 = NULL; /* a chunk's own pass */
    cb_tokens lead = {0};
    cb_fwd *f2 = NULL;
    cb_kvcache *kv2 = NULL;
    cb_status st = CB_ERR_NOMEM;
    if (!hid || !chosen)
        goto out;
    if (K > hp->n_layer) {
        st = CB_ERR_RANGE;
        goto out;
    }
    for (int32_t j = 0; j < T; j++)
        chosen[j] = was[j] == 1 && cand[j] == 0;
    if ((st = cb_kv_lead_in(m, &lead)) != CB_OK)
        goto out;
    int32_t nl = (int32_t)lead.n, n2 = 1; /* the longest lead-in and chunk */
    for (int32_t sg = 0; sg < n_segs; sg++)
        n2 = segs[sg].kv && nl + segs[sg].n > n2 ? nl + segs[sg].n : n2;
    st = CB_ERR_NOMEM;
    if (!(ids2 = malloc(sizeof *ids2 * (size_t)n2)) ||
        !(pos2 = malloc(sizeof *pos2 * (size_t)n2)) || (st = cb_fwd_new(&f2, m, n2)) != CB_OK ||
        (st = cb_kvcache_new(&kv2, m, n2, CB_TYPE_F16)) != CB_OK)
        goto out;
    for (int32_t sg = 0, r0 = 0; sg < n_segs && K > 0; r0 += segs[sg++].n) {
        int any = 0;
        for (int32_t j = 0; j < segs[sg].n; j++)
            any |= chosen[r0 + j];
        if (!segs[sg].kv || !any)
            continue;
        int32_t n = nl + segs[sg].n;
        for (int32_t j = 0; j < n; j++)
            ids2[j] = j < nl ? lead.ids[j] : segs[sg].ids[j - nl], pos2[j] = j;
        if ((st = cb_fwd_embed(f2, ids2, pos2, n)) != CB_OK)
            goto out;
        for (int32_t l = 0; l < K; l++)
            if ((st = cb_fwd_layer(f2, kv2, l, NULL, n)) != CB_OK)
                goto out;
        for (int32_t j = 0; j < segs[sg].n; j++)
            if (chosen[r0 + j] && (st = cb_fwd_hidden(f2, nl + j, hid + (r0 + j) * d)) != CB_OK)
                goto out;
    }
    for (int32_t j = 0; j < T; j++)
        ids[j] = all_ids[j], pos[j] = j;
    if ((st = cb_fwd_embed(f, ids, pos, T)) != CB_OK)
        goto out;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        int32_t n = 0;
        if (l == K && K > 0)
            for (int32_t j = 0; j < T; j++)
                if (chosen[j] && (st = cb_fwd_set_hidden(f, j, hid + j * d)) != CB_OK)
                    goto out;
        for (int32_t j = 0; j < T; j++)
            if (cand[j] == 0 && (l >= K || !chosen[j]))
                pos[n++] = j;
        if ((st = cb_fwd_layer(f, kv, l, pos, n)) != CB_OK)
            goto out;
    }
    int32_t last = T - 1;
    st = cb_fwd_logits(f, &last, 1, logits);
out:
    cb_fwd_free(f2);
    cb_kvcache_free(kv2);
    cb_tokens_free(&lead);
    free(hid), free(chosen), free(ids2), free(pos2);
    return st;
}

/* An oracle blend at ratio r: reuse's loaded caches, the top ceil(r x
 * cached rows) candidates by oracle_scores recomputed with the uncached
 * rows through every layer (probe's second pass, another choice of rows).
 * OR_ITER: probe's score picks half of them, those are recomputed, the
 * question's attention over that cache picks the rest, and all of them are
 * recomputed (selection in two rounds). */
static cb_status oracle_prefill(cb_prompt *p, cb_store *s, cb_fwd *f, cb_kvcache *kv,
                                cb_kvcache *kv_full, cb_kvcache *tmp, const cb_hparams *hp,
                                int kind, float r, float *logits, int32_t *n_recomputed,
                                cb_error *err)
{
    int32_t n_segs, T = (int32_t)cb_prompt_n_tokens(p);
    const cb_segment *segs = cb_prompt_segments(p, &n_segs), *tail = &segs[n_segs - 1];
    cb_blend_params bp = cb_blend_defaults();
    cb_blend_stats bs;
    bp.mode = CB_MODE_REUSE;
    cb_status st = cb_prompt_prefill(p, s, f, kv, &bp, logits, &bs, warn, NULL, err);
    if (st != CB_OK)
        return st;
    uint8_t *cand = calloc((size_t)T, 1);
    int32_t *all = malloc(sizeof *all * (size_t)T), *ids = malloc(sizeof *ids * (size_t)T),
            *pos = malloc(sizeof *pos * (size_t)T);
    float *score = malloc(sizeof *score * (size_t)T);
    blend_scored *sc = malloc(sizeof *sc * (size_t)T);
    st = CB_ERR_NOMEM;
    if (!cand || !all || !ids || !pos || !score || !sc)
        goto out;
    int64_t n_cached = 0;
    int exact = 1; /* the leading caches while each is a true prefix */
    for (int32_t sg = 0, r0 = 0; sg < n_segs; r0 += segs[sg++].n) {
        memcpy(all + r0, segs[sg].ids, sizeof *all * (size_t)segs[sg].n);
        if (!segs[sg].kv)
            continue;
        exact = exact && cb_blend_true_prefix(segs, sg, r0);
        for (int32_t j = 0; j < segs[sg].n; j++)
            if (r0 + j != T - 1)
                n_cached++, cand[r0 + j] = exact ? 2 : 1;
    }
    int64_t want = (int64_t)ceilf(r * (float)n_cached), got = 0;
    if (kind == OR_ITER) {
        if ((st = oracle_scores(f, kv, kv_full, tmp, hp, tail, T, OR_PROBE, score)) != CB_OK)
            goto out;
        got = choose(cand, score, T, (want + 1) / 2, sc);
        if ((st = recompute(f, kv, hp, all, cand, T, ids, pos, logits)) != CB_OK)
            goto out;
    }
    if ((st = oracle_scores(f, kv, kv_full, tmp, hp, tail, T,
                            kind == OR_ITER || kind == OR_SHR || kind == OR_LATE ? OR_PROBE : kind,
                            score)) != CB_OK)
        goto out;
    if (kind == OR_SHR) {
        float a = 1.0f + shr_slope;
        int64_t top = (int64_t)llround(a * (double)want);
        got = choose(cand, score, T, top, sc);
        for (int32_t j = 0; j < T; j++)
            pos[j] = -1;
        for (int64_t i = 0; i < got; i++)
            pos[sc[i].row] = (int32_t)i;
        int32_t *rank = malloc(sizeof *rank * (size_t)T);
        if (!rank) {
            st = CB_ERR_NOMEM;
            goto out;
        }
        memcpy(rank, pos, sizeof *rank * (size_t)T);
        st = recompute_shr(f, kv, hp, all, cand, rank, T, want, a, ids, pos, logits);
        free(rank);
        *n_recomputed = (int32_t)want;
        goto out;
    }
    uint8_t *was = NULL;
    if (kind == OR_LATE && !(was = malloc((size_t)T))) {
        st = CB_ERR_NOMEM;
        goto out;
    }
    if (was)
        memcpy(was, cand, (size_t)T);
    got += choose(cand, score, T, want - got, sc);
    st = was ? recompute_late(f, kv, cb_fwd_model(f), segs, n_segs, all, was, cand, T, late_k, ids,
                              pos, logits)
             : recompute(f, kv, hp, all, cand, T, ids, pos, logits);
    free(was);
    *n_recomputed = (int32_t)got;
out:
    if (st == CB_ERR_RANGE && kind == OR_LATE)
        snprintf(err->msg, sizeof err->msg, "late:%g:%d starts past the model's %d layers",
                 (double)r, late_k, hp->n_layer);
    else if (st != CB_OK)
        snprintf(err->msg, sizeof err->msg, "the oracle blend failed (%d)", (int)st);
    free(cand), free(all), free(ids), free(pos), free(score), free(sc);
    return st;
}

static int parse_mode(const char *s, cb_blend_params *bp, int *oracle)
{
    *bp = cb_blend_defaults();
    *oracle = OR_NONE;
    if (!strcmp(s, "full"))
        return bp->mode = CB_MODE_FULL, 0;
    if (!strcmp(s, "reuse"))
        return bp->mode = CB_MODE_REUSE, 0;
    char name[32];
    float r, depth = 0.0f, scale = 1.0f;
    int got = sscanf(s, "%31[a-z]:%f:%f:%f", name, &r, &depth, &scale);
    if (got >= 2 && !strcmp(name, "late")) {
        *bp = cb_blend_defaults();
        bp->mode = CB_MODE_BLEND, bp->ratios[0] = r, bp->speedup = 0.0f, bp->stale_scale = 1.0f;
        if (r < 0 || r > 1 || depth < 0 || depth > 4096)
            return -1;
        late_k = got >= 3 ? (int)depth : 0;
        if (depth != (float)late_k)
            return -1;
        return *oracle = OR_LATE, 0;
    }
    if (got < 2 || r < 0 || r > 1 || depth < 0 || depth > 1 || !(scale > 0))
        return -1;
    bp->mode = CB_MODE_BLEND;
    bp->ratios[0] = r; /* as given: no speedup */
    bp->speedup = 0.0f;
    bp->probe_depth = depth;
    bp->stale_scale = scale; /* 1 unless given: the oracle modes have none */
    if (!strcmp(name, "probe"))
        bp->strategy = CB_STRATEGY_PROBE;
    else if (!strcmp(name, "hkvd"))
        bp->strategy = CB_STRATEGY_HKVD;
    else if (!strcmp(name, "query"))
        bp->strategy = CB_STRATEGY_QUERY;
    else if (!strcmp(name, "oatt"))
        *oracle = OR_ATT;
    else if (!strcmp(name, "odev"))
        *oracle = OR_DEV;
    else if (!strcmp(name, "ovdev"))
        *oracle = OR_VDEV;
    else if (!strcmp(name, "oprobe"))
        *oracle = OR_PROBE;
    else if (!strcmp(name, "ostale"))
        *oracle = OR_STALE;
    else if (!strcmp(name, "oiter"))
        *oracle = OR_ITER;
    else if (!strcmp(name, "pshr"))
        *oracle = OR_SHR, shr_slope = depth;
    else
        return -1;
    return 0;
}

static int one_question(cb_model *m, cb_store *s, json_t *q, int qi, char **modes, int n_modes)
{
    const cb_hparams *hp = cb_model_hparams(m);
    json_t *jc = json_object_get(q, "chunks"), *jg = json_object_get(q, "gold");
    const char *question = json_string_value(json_object_get(q, "question"));
    const char *sys = json_string_value(json_object_get(q, "system")); /* NULL: the template's */
    size_t nc = json_array_size(jc);
    cb_strview *texts = calloc(nc ? nc : 1, sizeof *texts);
    cb_prompt *p = NULL;
    cb_kvcache *kv_full = NULL, *kv = NULL, *kv_tmp = NULL;
    cb_fwd *f = NULL;
    qdiag full = {0}, d = {0};
    uint8_t *cls = NULL, *gold_chunk = NULL;
    int16_t *chunk_of = NULL; /* each row's chunk, or -1 */
    cb_error err;
    int rc = 1;

    if (!question || !texts)
        goto out;
    for (size_t i = 0; i < nc; i++) {
        const char *t = json_string_value(json_array_get(jc, i));
        texts[i] = (cb_strview){t ? t : "", t ? strlen(t) : 0};
    }
    if (cb_prompt_build(&p, m, sys, 0, texts, nc, question, strlen(question), &err) != CB_OK) {
        fprintf(stderr, "blend_diag: question %d: %s\n", qi, err.msg);
        goto out;
    }
    cb_prompt_attach(p, s, warn, NULL);
    if (cb_prompt_n_missing(p) > 0) {
        fprintf(stderr, "blend_diag: question %d: %d chunks not in the store\n", qi,
                cb_prompt_n_missing(p));
        goto out;
    }
    int32_t n_segs, T = (int32_t)cb_prompt_n_tokens(p);
    const cb_segment *segs = cb_prompt_segments(p, &n_segs);
    cls = calloc((size_t)T, 1), chunk_of = malloc(sizeof *chunk_of * (size_t)T);
    gold_chunk = calloc((size_t)n_segs, 1);
    full.n_layer = d.n_layer = hp->n_layer, full.total = d.total = T;
    full.mass = malloc(sizeof(float) * (size_t)hp->n_layer * (size_t)T);
    d.mass = malloc(sizeof(float) * (size_t)hp->n_layer * (size_t)T);
    full.hidden = malloc(sizeof(float) * (size_t)hp->n_layer * (size_t)hp->n_embd);
    d.hidden = malloc(sizeof(float) * (size_t)hp->n_layer * (size_t)hp->n_embd);
    full.logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    d.logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (!cls || !chunk_of || !gold_chunk || !full.mass || !d.mass || !full.hidden || !d.hidden ||
        !full.logits || !d.logits)
        goto out;
    /* each row's class: head, chunk (its first tokens, gold or other), separator, question */
    int32_t r0 = 0, chunk = -1;
    int exact = 1; /* the leading caches while each is a true prefix (the head's first) */
    for (int32_t sgi = 0; sgi < n_segs; r0 += segs[sgi++].n) {
        int gold = 0;
        if (segs[sgi].kv) /* as blend.c's: uncached segments between do not end it */
            exact = exact && cb_blend_true_prefix(segs, sgi, r0);
        if (segs[sgi].kv && sgi > 0) { /* a chunk (the head's cache is none of them) */
            chunk++;
            for (size_t g = 0; g < json_array_size(jg); g++)
                gold |= json_integer_value(json_array_get(jg, g)) == chunk;
            gold_chunk[chunk] = (uint8_t)(gold | exact << 1);
        }
        for (int32_t i = 0; i < segs[sgi].n; i++) {
            uint8_t c = sgi == 0            ? R_HEAD
                        : sgi == n_segs - 1 ? R_SELF
                        : !segs[sgi].kv     ? R_SEP
                        : i < HEAD_TOKENS   ? R_CHUNK_HEAD
                        : gold              ? R_GOLD
                                            : R_OTHER;
            cls[r0 + i] = c;
            chunk_of[r0 + i] = segs[sgi].kv && sgi > 0 ? (int16_t)chunk : -1;
        }
    }
    if (cb_kvcache_new(&kv_full, m, T, CB_TYPE_F16) != CB_OK ||
        cb_kvcache_new(&kv, m, T, CB_TYPE_F16) != CB_OK || cb_fwd_new(&f, m, T) != CB_OK)
        goto out;
    for (int mi = -1; mi < n_modes; mi++) {
        cb_blend_params bp;
        cb_blend_stats bs = {0};
        int oracle;
        const char *label = mi < 0 ? "full" : modes[mi];
        if (mi >= 0 && !strcmp(label, "full"))
            continue;
        parse_mode(label, &bp, &oracle);
        cb_kvcache *k = mi < 0 ? kv_full : kv;
        qdiag *dd = mi < 0 ? &full : &d;
        if (oracle && !kv_tmp && cb_kvcache_new(&kv_tmp, m, T, CB_TYPE_F32) != CB_OK)
            goto out;
        if (oracle
                ? oracle_prefill(p, s, f, k, kv_full, kv_tmp, hp, oracle, bp.ratios[0], dd->logits,
                                 &bs.n_recomputed_tokens, &err) != CB_OK
                : cb_prompt_prefill(p, s, f, k, &bp, dd->logits, &bs, warn, NULL, &err) != CB_OK) {
            fprintf(stderr, "blend_diag: question %d, %s: %s\n", qi, label, err.msg);
            goto out;
        }
        if (question_pass(f, k, &segs[n_segs - 1], T, hp, dd) != CB_OK) {
            fprintf(stderr, "blend_diag: question %d, %s: the question's pass failed\n", qi, label);
            goto out;
        }
        json_t *o = compare(label, dd, &full, cls, hp, k, kv_full, chunk_of, gold_chunk, chunk + 1,
                            hp->n_vocab);
        json_object_set_new(o, "q", json_integer(qi));
        json_object_set_new(o, "n_tokens", json_integer(T));
        json_object_set_new(o, "n_chunks", json_integer((json_int_t)nc));
        json_object_set_new(o, "n_recomputed", json_integer(bs.n_recomputed_tokens));
        json_object_set_new(o, "probe_layers", json_integer(bs.probe_layers));
        char *line = json_dumps(o, JSON_COMPACT);
        if (line)
            puts(line);
        free(line);
        json_decref(o);
        fflush(stdout);
    }
    rc = 0;
out:
    cb_fwd_free(f);
    cb_kvcache_free(kv), cb_kvcache_free(kv_full), cb_kvcache_free(kv_tmp);
    cb_prompt_free(p);
    free(texts), free(cls), free(chunk_of), free(gold_chunk);
    free(full.mass), free(d.mass), free(full.hidden), free(d.hidden), free(full.logits),
        free(d.logits);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: blend_diag MODEL STORE THREADS QFILE MODE...\n");
        return 64;
    }
    cb_blend_params bp;
    int oracle;
    for (int i = 5; i < argc; i++)
        if (parse_mode(argv[i], &bp, &oracle) != 0) {
            fprintf(
                stderr,
                "blend_diag: bad mode '%s' (full, reuse, probe:R[:DEPTH[:SCALE]], hkvd:R, query:R, "
                "oatt:R, odev:R, ovdev:R, oprobe:R, ostale:R, oiter:R, pshr:R:S, late:R:K)\n",
                argv[i]);
            return 64;
        }
    cb_model *m;
    cb_store *s;
    cb_error err;
    const char *ex = getenv("CB_EXACT");
    cb_model_params mp = {atoi(argv[3]), "cpu", ex && !strcmp(ex, "1"), NULL};
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK ||
        cb_store_open(&s, argv[2], 0, &err) != CB_OK) {
        fprintf(stderr, "blend_diag: %s\n", err.msg);
        return 65;
    }
    FILE *in = fopen(argv[4], "r");
    if (!in) {
        perror(argv[4]);
        return 66;
    }
    char *line = NULL;
    size_t cap = 0;
    int qi = 0, bad = 0;
    while (getline(&line, &cap, in) > 0) {
        json_error_t je;
        json_t *q = json_loads(line, 0, &je);
        if (!q) {
            fprintf(stderr, "blend_diag: %s:%d: %s\n", argv[4], qi + 1, je.text);
            bad = 1;
        } else {
            bad |= one_question(m, s, q, qi, argv + 5, argc - 5);
            json_decref(q);
        }
        qi++;
    }
    free(line);
    fclose(in);
    cb_store_close(s);
    cb_model_free(m);
    return bad ? 65 : 0;
}
