/* cpu.c - the CPU backend: weights stay in their GGUF types (views of the
 * model's mapping, no copy), a persistent thread pool (pool.c), and
 *   matmul  decode and small batches (n <= MM_SMALL rows): each weight row's
 *           blocks decoded into f32 lanes and multiplied into up to four
 *           activation rows at once (qmm.h), threads over output rows (with
 *           act8: the activations quantized to 8 bits, integer products,
 *           but for the rows one value dominates: qg_outliers);
 *           larger batches: panels of weight rows dequantized into per-thread
 *           scratch and multiplied by OpenBLAS sgemm (single-threaded inside
 *           the pool), threads over panels;
 *   attention  in cpu_attn.c (the state both share: cpu_impl.h).
 * Every buffer a call needs is allocated at backend creation or at
 * weight_new (setup), none per call. */
#include "../core/dequant.h"
#include "backend.h"
#include "blas.h"
#include "cpu_impl.h"
#include "opmath.h"
#include "qmm.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void cpu_rows(cb_backend *b);
static int grow_ol(cpu_ctx *c, const cb_bweight *w);

enum { CB_LINE = 64 }; /* bytes in a cache line */

/* Buffers start on a cache line: an f16 KV cache's rows are read head by
 * head, and a head's 128 bytes on a line boundary are two lines where
 * calloc's 16-byte offset made them three.  calloc, not memalign: large
 * blocks come straight from mmap as zero pages, so the caches and
 * activation buffers cost nothing until they are touched.  The block's own
 * address is kept in the word before the one returned. */
static void *cpu_alloc(cb_backend *b, size_t nbytes)
{
    (void)b;
    if (nbytes > SIZE_MAX - CB_LINE)
        return NULL;
    char *raw = calloc(1, nbytes + CB_LINE);
    if (!raw)
        return NULL;
    char *p = raw + CB_LINE - (uintptr_t)raw % CB_LINE;
    ((void **)p)[-1] = raw;
    return p;
}

static void cpu_dealloc(cb_backend *b, void *p)
{
    (void)b;
    if (p)
        free(((void **)p)[-1]);
}

static void cpu_copy(cb_backend *b, void *dst, const void *src, size_t n)
{
    (void)b;
    memcpy(dst, src, n);
}

/* ------------------------------------------------------------ weights */

/* Make every thread's sgemm panel hold PANEL_MAX rows of n_in. */
static int grow_panels(cpu_ctx *c, int64_t n_in)
{
    int ok = 1;
    pthread_mutex_lock(&c->grow_mu);
    for (int t = 0; t < c->n_threads; t++) {
        thread_scratch *s = &c->ts[t];
        if (s->panel_in >= n_in)
            continue;
        float *p = malloc(sizeof(float) * (size_t)PANEL_MAX * (size_t)n_in);
        if (!p) {
            ok = 0;
            break;
        }
        free(s->panel);
        s->panel = p;
        s->panel_in = n_in;
    }
    pthread_mutex_unlock(&c->grow_mu);
    return ok;
}

/* Make every thread's packed panel hold one of type t over n_in, and xg's
 * rows one activation row of that width in t's form. */
static int grow_qpanels(cpu_ctx *c, cb_type t, int64_t n_in)
{
    size_t need = qg_panel_bytes(t, n_in, c->qg.layout.p), row = qg_act_bytes(t, n_in);
    int ok = 1, f = qg_is_k(t) ? 0 : 1;
    pthread_mutex_lock(&c->grow_mu);
    for (int i = 0; i < c->n_threads && ok; i++) {
        thread_scratch *s = &c->ts[i];
        if (s->qpanel_bytes >= need)
            continue;
        uint8_t *p = malloc(need);
        if (!p)
            ok = 0;
        else {
            free(s->qpanel);
            s->qpanel = p;
            s->qpanel_bytes = need;
        }
    }
    pthread_mutex_unlock(&c->grow_mu);
    pthread_mutex_lock(&c->xg_mu);
    if (ok && row > c->xg_row[f]) {
        /* the row layout changes: the buffer is made anew at the next reserve */
        c->xg_row[f] = row;
        free(c->xg);
        c->xg = NULL;
        c->xg_rows = 0;
    }
    pthread_mutex_unlock(&c->xg_mu);
    return ok;
}

/* xg holding n quantized rows of each form (the caller holds xg_mu) */
static int grow_xg(cpu_ctx *c, int64_t n)
{
    if (n <= c->xg_rows)
        return 1;
    uint8_t *p = malloc((c->xg_row[0] + c->xg_row[1]) * (size_t)n + 64);
    if (!p)
        return 0;
    free(c->xg);
    c->xg = p;
    c->xg_rows = n;
    return 1;
}

static cb_bweight *cpu_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out,
                                  const void *data, const float *bias)
{
    cpu_ctx *c = CTX(b);
    cb_bweight *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->type = t;
    w->n_in = n_in;
    w->n_out = n_out;
    w->data = data;
    w->row_bytes = cb_type_row_bytes(t, n_in);
    if (w->row_bytes == 0 || !qmm_select(t, c->simd, &w->k) || !grow_panels(c, n_in))
        goto fail;
    w->qg = c->act8 && qg_has(t);
    if (w->qg && (!grow_qpanels(c, t, n_in) || !grow_ol(c, w)))
        goto fail;
    if (!w->qg && !c->plain_weights) { /* its products follow the exact kernels' row stability */
        c->plain_weights = 1;
        cpu_rows(b);
    }
    if (bias) {
        if (!(w->bias = malloc(sizeof(float) * (size_t)n_out)))
            goto fail;
        memcpy(w->bias, bias, sizeof(float) * (size_t)n_out);
    }
    return w;
fail:
    free(w);
    return NULL;
}

static void cpu_weight_free(cb_backend *b, cb_bweight *w)
{
    (void)b;
    if (!w)
        return;
    free(w->bias);
    free(w);
}

/* ------------------------------------------------------------- matmul */

typedef struct mm_job {
    cpu_ctx *c;
    const cb_bweight *w;
    const float *x;
    float *y;
    int64_t n, rows_per_task;
    int paired; /* a lone last row with the bits it gets among others (QMM_ONE_PAIRED) */
} mm_job;

/* The output rows of a task of a product of w with a few activation rows
 * (the one-row kernels): about 8 tasks a thread, so that a thread the
 * machine holds up leaves its share to the others, but at least TASK_BYTES
 * of weights, in multiples of m.  Each task starts its stream of weights
 * cold; SmolLM2's 576 x 576 weights made 13 KB tasks.  With 128 KB at
 * least its decode ran 8% faster (median of 15 alternated pairs, 14
 * faster; 256 KB: 4% slower than 128), Qwen2.5-0.5B's and -1.5B's, whose
 * tasks were mostly larger, within noise. */
enum { TASK_BYTES = 128 << 10 };
static int64_t task_rows(const cb_bweight *w, int nt, int m)
{
    int64_t per = (w->n_out + 8 * nt - 1) / (8 * nt),
            least = (TASK_BYTES + (int64_t)w->row_bytes - 1) / (int64_t)w->row_bytes;
    per = per < least ? least : per;
    return (per + m - 1) / m * m;
}

/* output rows [i*rows_per_task, ...) for every activation row, QMM_ROWS at a time */
static void mm_dot_task(void *arg, int64_t i, int tid)
{
    const mm_job *j = arg;
    const cb_bweight *w = j->w;
    int64_t o0 = i * j->rows_per_task,
            o1 = o0 + j->rows_per_task < w->n_out ? o0 + j->rows_per_task : w->n_out;
    (void)tid;
    for (int64_t r = 0; r < j->n; r += QMM_ROWS) {
        int nr = j->n - r < QMM_ROWS ? (int)(j->n - r) : QMM_ROWS;
        nr = nr == 1 && j->paired ? QMM_ONE_PAIRED : nr;
        w->k.dot(w->type, w->data, w->row_bytes, w->n_in, j->x + r * w->n_in, w->n_in, nr, o0, o1,
                 j->y + r * w->n_out, w->n_out);
    }
}

/* a panel of weight rows in f32, then y[:, panel] = x . panel^T */
static void mm_panel_task(void *arg, int64_t i, int tid)
{
    const mm_job *j = arg;
    const cb_bweight *w = j->w;
    int64_t o0 = i * j->rows_per_task,
            o1 = o0 + j->rows_per_task < w->n_out ? o0 + j->rows_per_task : w->n_out;
    float *p = j->c->ts[tid].panel;
    w->k.rows(w->type, w->data, w->row_bytes, w->n_in, o0, o1, p);
    cb_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->n, (int)(o1 - o0), (int)w->n_in, 1.0f,
             j->x, (int)w->n_in, p, (int)w->n_in, 0.0f, j->y + o0, (int)w->n_out);
}

/* The products of up to MM_MULTI weights with one input x [n <= MM_SMALL,
 * n_in] in one pool job: the tasks of weight k are [first[k], first[k+1]). */
enum { MM_MULTI = 3 };
typedef struct mm_small {
    mm_job j[MM_MULTI];
    int64_t first[MM_MULTI + 1];
} mm_small;

static void mm_small_task(void *arg, int64_t i, int tid)
{
    mm_small *s = arg;
    int k = 0;
    while (i >= s->first[k + 1])
        k++;
    mm_dot_task(&s->j[k], i - s->first[k], tid);
}

static void mm_small_run(cpu_ctx *c, const cb_bweight *const *w, int nw, const float *x,
                         float *const *y, int64_t n, int paired)
{
    int nt = cb_pool_size(c->pool);
    mm_small s;
    s.first[0] = 0;
    for (int k = 0; k < nw; k++) {
        int64_t per = task_rows(w[k], nt, 4);
        s.j[k] = (mm_job){c, w[k], x, y[k], n, per, paired};
        s.first[k + 1] = s.first[k] + (w[k]->n_out + per - 1) / per;
    }
    cb_pool_for(c->pool, mm_small_task, &s, s.first[nw]);
}

static void mm_panels(cpu_ctx *c, const cb_bweight *w, const float *x, float *y, int64_t n);

/* ------------------------------------------ the blocked 8-bit products */

/* The products of up to MM_MULTI weights (all qg) with one input x [n,
 * n_in] in one pool job, a task a packed panel (qg.layout.p rows): weight k's
 * tasks are [first[k], first[k+1]). */
typedef struct qg_job {
    cpu_ctx *c;
    const cb_bweight *w[MM_MULTI];
    float *y[MM_MULTI];
    int64_t first[MM_MULTI + 1];
    int64_t per; /* output rows a task (one-row mode: a multiple of 8; else a panel) */
    const float *x;
    uint8_t *xq[2]; /* the K form, the 32-element form */
    int need[2];    /* the forms some weight takes */
    int64_t n, r0;  /* rows r0 .. r0+n of x (a slice of the batch) */
} qg_job;

/* quantize row i of the slice into the forms the weights take */
static void qg_quant_task(void *arg, int64_t i, int tid)
{
    qg_job *j = arg;
    cpu_ctx *c = j->c;
    int64_t n_in = j->w[0]->n_in;
    const float *x = j->x + (j->r0 + i) * n_in;
    (void)tid;
    if (j->need[0])
        c->qg.quant_k(x, n_in, (qg_q8k *)(void *)(j->xq[0] + (size_t)i * c->xg_row[0]));
    if (j->need[1])
        c->qg.quant_0(x, n_in, (qmm_q8 *)(void *)(j->xq[1] + (size_t)i * c->xg_row[1]));
}

static void qg_task(void *arg, int64_t i, int tid)
{
    qg_job *j = arg;
    cpu_ctx *c = j->c;
    int k = 0;
    while (i >= j->first[k + 1])
        k++;
    const cb_bweight *w = j->w[k];
    int p = c->qg.layout.p;
    int64_t o0 = (i - j->first[k]) * p;
    int np = w->n_out - o0 < p ? (int)(w->n_out - o0) : p, f = qg_is_k(w->type) ? 0 : 1;
    uint8_t *panel = c->ts[tid].qpanel;
    qg_pack(w->type, w->data, w->row_bytes, w->n_in, o0, np, panel, &c->qg);
    c->qg.gemm(w->type, panel, w->n_in, j->xq[f], c->xg_row[f], j->n, np,
               j->y[k] + j->r0 * w->n_out + o0, w->n_out);
}

/* one-row mode (decode, a few rows): output rows [per*i, ...) of one
 * weight for every activation row, through qg_gemv (the one-row or the
 * few-row kernel; no packing; the same bits as qg_task's) */
static void qg_row_task(void *arg, int64_t i, int tid)
{
    qg_job *j = arg;
    cpu_ctx *c = j->c;
    int k = 0;
    (void)tid;
    while (i >= j->first[k + 1])
        k++;
    const cb_bweight *w = j->w[k];
    int64_t o0 = (i - j->first[k]) * j->per, o1 = o0 + j->per < w->n_out ? o0 + j->per : w->n_out;
    int f = qg_is_k(w->type) ? 0 : 1;
    qg_gemv(&c->qg, w->type, w->data, w->row_bytes, w->n_in, j->xq[f], c->xg_row[f], (int)j->n, o0,
            o1, j->y[k] + j->r0 * w->n_out, w->n_out);
}

/* Whether one value dominates row x [n]: max|x|^2 > half the sum of the
 * squares.  8-bit activations keep 127 steps of the largest value, and in
 * such a row every other value is left a few steps or none.  The rows of
 * attention-sink tokens, whose residual carries a massive activation, are
 * like this at every layer, and every later token attends to them.  With
 * these rows exact, the default path's KL to the float64 reference over
 * every position of make parity's prompts fell from 2.05e-3 to 1.34e-3 on
 * Qwen2.5-0.5B, and from 0.50 to 1.7e-3 on the 1.5B, whose distribution
 * after a lone first token was 6-7 nats off (as llama.cpp's is).  The
 * check is one pass over the row's n values, beside the product's n x
 * n_out. */
static int outlier_row(const float *x, int64_t n)
{
    float s[8] = {0}, m[8] = {0}, ss = 0, am = 0;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) {
            s[k] += x[j + k] * x[j + k];
            m[k] = fabsf(x[j + k]) > m[k] ? fabsf(x[j + k]) : m[k];
        }
    for (; j < n; j++) {
        s[0] += x[j] * x[j];
        m[0] = fabsf(x[j]) > m[0] ? fabsf(x[j]) : m[0];
    }
    for (int k = 0; k < 8; k++) {
        ss += s[k];
        am = m[k] > am ? m[k] : am;
    }
    return 2 * am * am > ss; /* false for NaN and inf */
}

/* The rows of x [n] one value dominates (outlier_row), again through the
 * exact kernels, weight by weight, up to CB_ROWS_MAX at a time, a lone
 * last row with the bits it gets among others (QMM_ONE_PAIRED): the exact
 * kernels give a row the same bits in every even count (backend.h), so the
 * row's result is its own, whatever its batch.  A pair of copies of the
 * lone row did this before, at twice the arithmetic (SmolLM2's output head
 * takes such a row at every decode step: its kernel's share of decode
 * samples went from 21.7% to 20.0%; the reading of the weights bounds it).
 * The caller holds xg_mu. */
static void qg_outliers(cpu_ctx *c, const cb_bweight *const *w, int nw, const float *x,
                        float *const *y, int64_t n)
{
    int64_t n_in = w[0]->n_in, idx[CB_ROWS_MAX];
    size_t rb = sizeof(float) * (size_t)n_in;
    int m = 0;
    for (int64_t i = 0; i <= n; i++) {
        if (i < n) {
            if (!outlier_row(x + i * n_in, n_in))
                continue;
            memcpy(c->ol_x + m * n_in, x + i * n_in, rb);
            idx[m++] = i;
        }
        if (m == 0 || (m < CB_ROWS_MAX && i < n))
            continue;
        for (int k = 0; k < nw; k++) {
            int64_t no = w[k]->n_out;
            float *yo = c->ol_y;
            mm_small_run(c, &w[k], 1, c->ol_x, &yo, m, 1);
            for (int r = 0; r < m; r++)
                memcpy(y[k] + idx[r] * no, c->ol_y + r * no, sizeof(float) * (size_t)no);
        }
        m = 0;
    }
}

/* ol_x and ol_y big enough for w (weight_new) */
static int grow_ol(cpu_ctx *c, const cb_bweight *w)
{
    int ok = 1;
    pthread_mutex_lock(&c->xg_mu);
    if (w->n_in > c->ol_in) {
        float *p = calloc((size_t)CB_ROWS_MAX * (size_t)w->n_in, sizeof(float));
        if ((ok = p != NULL)) {
            free(c->ol_x);
            c->ol_x = p;
            c->ol_in = w->n_in;
        }
    }
    if (ok && w->n_out > c->ol_out) {
        /* calloc: only the rows a product writes become resident */
        float *p = calloc((size_t)CB_ROWS_MAX * (size_t)w->n_out, sizeof(float));
        if ((ok = p != NULL)) {
            free(c->ol_y);
            c->ol_y = p;
            c->ol_out = w->n_out;
        }
    }
    pthread_mutex_unlock(&c->xg_mu);
    return ok;
}

/* y[k] = x . w[k]^T for nw <= MM_MULTI qg weights of one n_in: x quantized
 * once per form, in slices of the rows xg holds (all of them after
 * cpu_reserve); up to the kernels' gemv_max_k rows (QG_ROW_MAX_0 for the
 * 32-element types) through qg_gemv, more through packed panels (the same
 * bits either way) */
static void qg_run(cpu_ctx *c, const cb_bweight *const *w, int nw, const float *x, float *const *y,
                   int64_t n)
{
    qg_job j = {.c = c, .x = x};
    int nt = cb_pool_size(c->pool),
        rows = n <= (qg_is_k(w[0]->type) ? c->qg.gemv_max_k : QG_ROW_MAX_0);
    int64_t n_ol = 0; /* the leading dominated rows: up to the first that is not */
    while (n_ol < n && outlier_row(x + n_ol * w[0]->n_in, w[0]->n_in))
        n_ol++;
    pthread_mutex_lock(&c->xg_mu);
    if (n_ol == n) {
        /* every row goes through the exact kernels anyway (a decode step's
         * lone row often does on SmolLM2: a quarter of its time went to
         * the 8-bit product these rows then threw away) */
        qg_outliers(c, w, nw, x, y, n);
        pthread_mutex_unlock(&c->xg_mu);
        return;
    }
    if (!grow_xg(c, n) && !grow_xg(c, 64)) {
        /* no memory for even a small slice: the exact path, weight by weight */
        pthread_mutex_unlock(&c->xg_mu);
        for (int k = 0; k < nw; k++)
            mm_panels(c, w[k], x, y[k], n);
        return;
    }
    j.xq[0] = c->xg;
    j.xq[1] = c->xg + c->xg_row[0] * (size_t)c->xg_rows;
    j.first[0] = 0;
    j.per = c->qg.layout.p; /* a panel a task */
    for (int k = 0; k < nw; k++) {
        int64_t per = task_rows(w[k], nt, 8); /* one-row mode: the widest weight's */
        if (rows && per > j.per)
            j.per = per;
        j.w[k] = w[k];
        j.y[k] = y[k];
        j.need[qg_is_k(w[k]->type) ? 0 : 1] = 1;
    }
    for (int k = 0; k < nw; k++)
        j.first[k + 1] = j.first[k] + (w[k]->n_out + j.per - 1) / j.per;
    for (int64_t r0 = 0; r0 < n; r0 += c->xg_rows) {
        j.r0 = r0;
        j.n = n - r0 < c->xg_rows ? n - r0 : c->xg_rows;
        if (rows && j.n == 1) /* one row: quantized here, no job */
            qg_quant_task(&j, 0, 0);
        else
            cb_pool_for(c->pool, qg_quant_task, &j, j.n);
        cb_pool_for(c->pool, rows ? qg_row_task : qg_task, &j, j.first[nw]);
    }
    qg_outliers(c, w, nw, x, y, n);
    pthread_mutex_unlock(&c->xg_mu);
}

static void add_bias(const cb_bweight *w, float *y, int64_t n)
{
    if (w->bias)
        for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < w->n_out; o++)
                y[i * w->n_out + o] += w->bias[o];
}

/* the exact large-batch path: f32 panels of weight rows through sgemm */
static void mm_panels(cpu_ctx *c, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    int nt = cb_pool_size(c->pool);
    mm_job j = {c, w, x, y, n, 0, 0};
    cb_blas_single();
    /* panels of up to PANEL_MAX rows, at least 4 a thread */
    int64_t per = (w->n_out + 4 * nt - 1) / (4 * nt);
    per = per < 16 ? 16 : per > PANEL_MAX ? PANEL_MAX : (per + 15) / 16 * 16;
    j.rows_per_task = per > PANEL_MAX ? PANEL_MAX : per;
    cb_pool_for(c->pool, mm_panel_task, &j, (w->n_out + j.rows_per_task - 1) / j.rows_per_task);
}

static void cpu_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    cpu_ctx *c = CTX(b);
    if (w->qg)
        qg_run(c, &w, 1, x, &y, n);
    else if (n <= MM_SMALL)
        mm_small_run(c, &w, 1, x, &y, n, 0);
    else
        mm_panels(c, w, x, y, n);
    add_bias(w, y, n);
}

static void cpu_matmul_multi(cb_backend *b, const cb_bweight *const *w, int nw, const float *x,
                             float *const *y, int64_t n)
{
    cpu_ctx *c = CTX(b);
    int all_qg = nw <= MM_MULTI;
    for (int k = 0; k < nw; k++)
        all_qg &= w[k]->qg;
    if (all_qg) {
        qg_run(c, w, nw, x, y, n); /* the input quantized once for all */
    } else if (n <= MM_SMALL && nw <= MM_MULTI) {
        mm_small_run(c, w, nw, x, y, n, 0);
    } else {
        for (int k = 0; k < nw; k++)
            cpu_matmul(b, w[k], x, y[k], n);
        return;
    }
    for (int k = 0; k < nw; k++)
        add_bias(w[k], y[k], n);
}

/* Size xg for batches of n rows, so that their products allocate nothing. */
static void cpu_reserve(cb_backend *b, int64_t n)
{
    cpu_ctx *c = CTX(b);
    if (!c->act8)
        return;
    pthread_mutex_lock(&c->xg_mu);
    grow_xg(c, n); /* on failure the products go in smaller slices */
    pthread_mutex_unlock(&c->xg_mu);
}

/* rows of an embedding table, decoded by the reference decoder (exact) */
static void cpu_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n,
                         float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        cb_dequant_row(w->type, w->data + (size_t)ids[i] * w->row_bytes, dst + i * w->n_in,
                       w->n_in);
}

/* ------------------------------------------------------ elementwise ops */

/* The elementwise operations of a forward pass (RMSNorm, the residual
 * add, the gated activations) over the pool's threads in equal ranges of
 * rows, each element computed as one thread would (the same bits); a
 * product that small stays on the caller's thread.  (RoPE, kv_write, scale
 * and kv_read stay there: the KV loader calls them from its own thread,
 * next to the forward's jobs.) */
enum { EW_MIN = 16384 /* the least elements a range takes */ };

typedef struct ew_job {
    int op;             /* EW_RMSNORM, EW_ADD, EW_SWIGLU, EW_GEGLU */
    qmm_swiglu_fn fast; /* the 8-bit path's SwiGLU (cpu_ctx.swiglu); NULL: libm's expf */
    const float *a, *b;
    float *y;
    int64_t n, d; /* rows of d elements (d 1: elements) */
    float eps;
    int parts;
} ew_job;

enum { EW_RMSNORM, EW_ADD, EW_SWIGLU, EW_GEGLU };

/* The 8-bit path's SwiGLU, qmm_swiglu1 a row: qmm_exp_neg's polynomial,
 * which gcc vectorizes, where libm's expf is a
 * call per element (on a 3,596-token prefill of Qwen2.5-1.5B: 157 ms
 * against 793 on two threads).  As close to the double-precision values
 * as the exact path's (test_backend_ops: nmse 3.5e-15 against 3.2e-15).
 * gcc vectorizes it only with AVX-512's masks (the float-to-int
 * conversion under its NaN test is control flow to it otherwise): on an
 * AVX2-only CPU it ran scalar, 2.6 s of that prefill on an AMD Zen 3, so
 * there qmm_avx2_swiglu (the same bits, eight lanes) takes its place.
 * y may be g or u (in place). */
__attribute__((optimize("O3"))) static void swiglu_fast(const float *g, const float *u, float *y,
                                                        int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = qmm_swiglu1(g[i], u[i]);
}

static void ew_rows(const ew_job *j, int64_t i0, int64_t i1)
{
    int64_t d = j->d;
    switch (j->op) {
    case EW_RMSNORM:
        for (int64_t i = i0; i < i1; i++) {
            const float *xi = j->a + i * d;
            float *yi = j->y + i * d;
            double ss = 0; /* ggml sums in double too (ggml_vec_*, rms_norm) */
            for (int64_t e = 0; e < d; e++)
                ss += (double)xi[e] * xi[e];
            float scale = cb_op_rms_scale(ss, d, j->eps);
            for (int64_t e = 0; e < d; e++)
                yi[e] = xi[e] * scale * j->b[e];
        }
        break;
    case EW_ADD:
        for (int64_t i = i0; i < i1; i++)
            j->y[i] += j->a[i];
        break;
    case EW_SWIGLU:
        if (j->fast) {
            j->fast(j->a + i0, j->b + i0, j->y + i0, i1 - i0);
            break;
        }
        for (int64_t i = i0; i < i1; i++)
            j->y[i] = cb_op_swiglu(j->a[i], j->b[i]);
        break;
    default:
        for (int64_t i = i0; i < i1; i++)
            j->y[i] = cb_op_geglu(j->a[i], j->b[i]);
    }
}

static void ew_task(void *arg, int64_t p, int tid)
{
    const ew_job *j = arg;
    ew_rows(j, j->n * p / j->parts, j->n * (p + 1) / j->parts);
}

static void ew_run(cb_backend *b, ew_job *j)
{
    cpu_ctx *c = CTX(b);
    int64_t parts = j->n * j->d / EW_MIN, nt = cb_pool_size(c->pool);
    j->parts = parts < 1 ? 1 : parts < nt ? (int)parts : (int)nt;
    if (j->parts == 1)
        ew_rows(j, 0, j->n);
    else
        cb_pool_for(c->pool, ew_task, j, j->parts);
}

static void cpu_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n,
                        int64_t d, float eps)
{
    ew_job j = {.op = EW_RMSNORM, .a = x, .b = g, .y = y, .n = n, .d = d, .eps = eps};
    ew_run(b, &j);
}

static void cpu_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int hd,
                     int n_rot, float base, const float *ff, int neox)
{
    (void)b;
    float inv[512], cs[512], sn[512];
    int half = n_rot / 2;
    if (half > 512)
        half = 512;
    for (int i = 0; i < half; i++)
        inv[i] = ff ? cb_op_rope_freq(i, n_rot, base) / ff[i] : cb_op_rope_freq(i, n_rot, base);
    for (int64_t t = 0; t < n; t++) {
        /* consecutive rows at one position (a chunk moved by one offset)
         * share their angles */
        if (t == 0 || pos[t] != pos[t - 1])
            for (int i = 0; i < half; i++) {
                float th = (float)pos[t] * inv[i];
                cs[i] = cosf(th);
                sn[i] = sinf(th);
            }
        for (int h = 0; h < n_head; h++) {
            float *v = x + (t * n_head + h) * hd;
            for (int i = 0; i < half; i++) {
                int a, bb;
                cb_op_rope_pair(i, n_rot, neox, &a, &bb);
                cb_op_rope_rotate(&v[a], &v[bb], cs[i], sn[i]);
            }
        }
    }
}

static void cpu_add(cb_backend *b, float *x, const float *y, int64_t n)
{
    ew_job j = {.op = EW_ADD, .a = y, .y = x, .n = n, .d = 1};
    ew_run(b, &j);
}

static void cpu_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    cpu_ctx *c = CTX(b);
    ew_job j = {.op = EW_SWIGLU,
                .fast = c->act8 ? c->swiglu : NULL,
                .a = g,
                .b = u,
                .y = out,
                .n = n,
                .d = 1};
    ew_run(b, &j);
}

static void cpu_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    ew_job j = {.op = EW_GEGLU, .a = g, .b = u, .y = out, .n = n, .d = 1};
    ew_run(b, &j);
}

static void cpu_scale(cb_backend *b, float *x, float s, int64_t n)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

static void cpu_kv_write(cb_backend *b, void *cache, cb_type t, int64_t width, const float *src,
                         const int32_t *at, int64_t n)
{
    (void)b;
    for (int64_t i = 0; i < n; i++) {
        const float *s = src + i * width;
        if (t == CB_TYPE_F32) {
            memcpy((float *)cache + (int64_t)at[i] * width, s, sizeof(float) * (size_t)width);
        } else {
            _Float16 *d = (_Float16 *)cache + (int64_t)at[i] * width;
            for (int64_t j = 0; j < width; j++)
                d[j] = (_Float16)s[j];
        }
    }
}

static void cpu_kv_read(cb_backend *b, const void *cache, cb_type t, int64_t width,
                        const int32_t *at, int64_t n, float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++) {
        float *d = dst + i * width;
        if (t == CB_TYPE_F32) {
            memcpy(d, (const float *)cache + (int64_t)at[i] * width, sizeof(float) * (size_t)width);
        } else {
            const _Float16 *s = (const _Float16 *)cache + (int64_t)at[i] * width;
            for (int64_t j = 0; j < width; j++)
                d[j] = (float)s[j];
        }
    }
}

static void cpu_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                       float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * d, src + (int64_t)idx[i] * d, sizeof(float) * (size_t)d);
}

static void cpu_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d,
                        float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + (int64_t)idx[i] * d, src + i * d, sizeof(float) * (size_t)d);
}

static void cpu_deviation(cb_backend *b, const float *src, const void *cache, cb_type t,
                          int64_t width, const int32_t *at, int64_t n, float *dev)
{
    (void)b;
    for (int64_t i = 0; i < n; i++) {
        const float *x = src + i * width;
        double s = 0;
        if (t == CB_TYPE_F32) {
            const float *c = (const float *)cache + (int64_t)at[i] * width;
            for (int64_t j = 0; j < width; j++) {
                double d = (double)x[j] - c[j];
                s += d * d;
            }
        } else {
            const _Float16 *c = (const _Float16 *)cache + (int64_t)at[i] * width;
            for (int64_t j = 0; j < width; j++) {
                double d = (double)x[j] - (float)c[j];
                s += d * d;
            }
        }
        dev[i] = (float)s;
    }
}

/* a ranks before b: larger value, then lower index; NaN after numbers */
static int ranks_before(const float *x, int32_t a, int32_t b)
{
    return cb_op_topk_before(x[a], a, x[b], b); /* NaN last, as on CUDA */
}

/* sift h[i] down a heap of n whose root ranks last */
static void sift_down(const float *x, int32_t *h, int64_t n, int64_t i)
{
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && ranks_before(x, h[c], h[c + 1]))
            c++;
        if (!ranks_before(x, h[i], h[c]))
            return;
        int32_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

/* The k best in idx itself, kept as a heap whose root is the worst of them,
 * then sorted best first: O(n log k) and no scratch. */
static void cpu_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    (void)b;
    k = k < n ? k : n;
    if (k <= 0)
        return;
    for (int64_t i = 0; i < n; i++) {
        if (i < k) {
            int64_t c = i; /* sift up */
            idx[c] = (int32_t)i;
            while (c > 0 && ranks_before(x, idx[(c - 1) / 2], idx[c])) {
                int32_t t = idx[c];
                idx[c] = idx[(c - 1) / 2];
                idx[(c - 1) / 2] = t;
                c = (c - 1) / 2;
            }
        } else if (ranks_before(x, (int32_t)i, idx[0])) {
            idx[0] = (int32_t)i;
            sift_down(x, idx, k, 0);
        }
    }
    for (int64_t m = k - 1; m > 0; m--) { /* the worst goes last */
        int32_t t = idx[0];
        idx[0] = idx[m];
        idx[m] = t;
        sift_down(x, idx, m, 0);
    }
}

static void cpu_free(cb_backend *b)
{
    if (!b)
        return;
    cpu_ctx *c = CTX(b);
    cb_pool_free(c->pool);
    for (int t = 0; c->ts && t < c->n_threads; t++) {
        thread_scratch *s = &c->ts[t];
        free(s->panel), free(s->q), free(s->o), free(s->k), free(s->v), free(s->s), free(s->mx),
            free(s->l);
        free(s->qpanel);
    }
    free(c->ts);
    free(c->parts);
    free(c->xg);
    free(c->ol_x);
    free(c->ol_y);
    free(c->kb_bias);
    free(c->a8);
    pthread_mutex_destroy(&c->grow_mu);
    pthread_mutex_destroy(&c->xg_mu);
    free(c);
    free(b);
}

static void cpu_describe(cb_backend *b)
{
    cpu_ctx *c = CTX(b);
    snprintf(b->desc, sizeof b->desc, "cpu (%d thread%s, %s kernels%s%s%s)", c->n_threads,
             c->n_threads == 1 ? "" : "s", qmm_isa(c->simd), c->act8 ? ", 8-bit activations (" : "",
             c->act8 ? c->qg.isa : "", c->act8 ? ")" : "");
}

/* the row-stable product sizes (backend.h): any count when every weight
 * goes through the 8-bit kernels; else the exact kernels' */
static void cpu_rows(cb_backend *b)
{
    int any = CTX(b)->act8 && !CTX(b)->plain_weights;
    b->rows_step = any ? 1 : CB_ROWS_STEP;
    b->rows_max = any ? INT32_MAX : CB_ROWS_MAX;
}

static void cpu_set_act8(cb_backend *b, int on)
{
    CTX(b)->act8 = on;
    cpu_rows(b);
    cpu_describe(b);
}

static const cb_backend_ops cpu_ops = {
    .name = "cpu",
    .max_head_dim = ATT_HD,
    .attn_pairs = ATT_M,
    .free = cpu_free,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .upload = cpu_copy,
    .download = cpu_copy,
    .weight_new = cpu_weight_new,
    .weight_free = cpu_weight_free,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .add = cpu_add,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .kv_write = cpu_kv_write,
    .kv_read = cpu_kv_read,
    .attention = cpu_attention,
    .gather = cpu_gather,
    .scatter = cpu_scatter,
    .deviation = cpu_deviation,
    .topk = cpu_topk,
    .attn_mass = cpu_attn_mass,
    .set_act8 = cpu_set_act8,
    .reserve = cpu_reserve,
    .reserve_keys = cpu_reserve_keys,
    .set_key_bias = cpu_set_key_bias,
};

cb_backend *cb_backend_cpu_new_ex(int n_threads, int simd)
{
    if (cb_blas_load()) /* no OpenBLAS: cb_backend_open says why */
        return NULL;
    cb_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return NULL;
    }
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    pthread_mutex_init(&c->grow_mu, NULL);
    pthread_mutex_init(&c->xg_mu, NULL);
    b->ops = &cpu_ops;
    b->ctx = c;
    c->simd = simd;
    c->exp_sum = qmm_exp_sum(simd);
    c->f16_row = qmm_f16_row(simd);
    c->swiglu = qmm_swiglu(simd) ? qmm_swiglu(simd) : swiglu_fast;
    c->att_qk = qmm_att_qk(simd);
    c->att_pv = qmm_att_pv(simd);
    qg_select(simd, &c->qg);
    c->act8 = 1; /* the default: 8-bit activations (cpu_set_act8(b, 0) for the exact path) */
    c->pool = cb_pool_new(n_threads);
    if (!c->pool)
        goto fail;
    c->n_threads = n_threads = cb_pool_size(c->pool);
    /* calloc: pages are only resident once touched (a small head dimension
     * touches a corner of each tile) */
    c->ts = calloc((size_t)n_threads, sizeof *c->ts);
    c->parts = calloc(ATT_PARTS, sizeof(float));
    if (!c->ts || !c->parts)
        goto fail;
    for (int t = 0; t < n_threads; t++) {
        thread_scratch *s = &c->ts[t];
        s->q = calloc((size_t)ATT_M * ATT_HD, sizeof(float));
        s->o = calloc((size_t)ATT_M * ATT_HD, sizeof(float));
        s->k = calloc((size_t)ATT_KB * ATT_HD, sizeof(float));
        s->v = calloc((size_t)ATT_KB * ATT_HD, sizeof(float));
        s->s = calloc((size_t)ATT_M * ATT_KB, sizeof(float));
        s->mx = calloc(ATT_M, sizeof(float));
        s->l = calloc(ATT_M, sizeof(float));
        if (!s->q || !s->o || !s->k || !s->v || !s->s || !s->mx || !s->l)
            goto fail;
    }
    cb_blas_quiet();
    b->n_threads = n_threads;
    cpu_rows(b);
    cpu_describe(b);
    return b;
fail:
    cpu_free(b);
    return NULL;
}

cb_backend *cb_backend_cpu_new(int n_threads) { return cb_backend_cpu_new_ex(n_threads, 1); }
