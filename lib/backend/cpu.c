/* cpu.c - the CPU backend: OpenBLAS sgemm for every matrix product (weights
 * dequantized to f32 once, at load), a small persistent thread pool for
 * attention and the elementwise work.
 *
 * Why f32 weights: OpenBLAS sgemm runs prefill 1.8-2.7x faster than
 * llama.cpp's quantized kernels on this project's 2-core AVX-512 machines
 * (make bench).  The price is memory (4 bytes a weight) and decoding speed
 * (0.43x llama.cpp's; an f16 copy for matrix-vector products was measured
 * and gained nothing there). */
#include "backend.h"
#include "opmath.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* OpenBLAS' own controls (declared in its cblas.h on Debian; repeated here
 * in case another cblas.h is found first). */
extern void openblas_set_num_threads(int n);

/* ------------------------------------------------------------ thread pool */

typedef void (*task_fn)(void *arg, int64_t i);

typedef struct pool {
    int n;              /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;       /* bumped for every job */
    int busy;           /* workers still in the current job */
    int quit;
    task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_llong next;
} pool;

static void pool_run_tasks(pool *p)
{
    for (;;) {
        int64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_tasks)
            break;
        p->fn(p->arg, i);
    }
}

static void *pool_main(void *arg)
{
    pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->quit)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->quit)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        pool_run_tasks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static pool *pool_new(int n)
{
    pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n < 1 ? 1 : n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = calloc((size_t)p->n, sizeof *p->th);
    for (int i = 1; i < p->n; i++)
        if (pthread_create(&p->th[i], NULL, pool_main, p) != 0)
            p->n = i; /* run with what we got */
    return p;
}

static void pool_free(pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

/* Run fn(arg, i) for i in [0, n_tasks) on all threads; returns when done. */
static void pool_for(pool *p, task_fn fn, void *arg, int64_t n_tasks)
{
    if (p->n == 1 || n_tasks <= 1) {
        for (int64_t i = 0; i < n_tasks; i++)
            fn(arg, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    pool_run_tasks(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* ---------------------------------------------------------------- backend */

typedef struct cpu_ctx {
    pool *pool;
    int n_threads;
} cpu_ctx;

struct cb_bweight {
    int64_t n_in, n_out;
    float *w;    /* [n_out, n_in] */
    float *bias; /* [n_out] or NULL */
};

static cpu_ctx *CTX(cb_backend *b)
{
    return b->ctx;
}

static void *cpu_alloc(cb_backend *b, size_t nbytes)
{
    (void)b;
    /* calloc: large blocks come straight from mmap as zero pages, so the
     * caches and activation buffers cost nothing until they are touched */
    return calloc(1, nbytes ? nbytes : 1);
}

static void cpu_dealloc(cb_backend *b, void *p)
{
    (void)b;
    free(p);
}

static void cpu_copy(cb_backend *b, void *dst, const void *src, size_t n)
{
    (void)b;
    memcpy(dst, src, n);
}

typedef struct dq_job {
    cb_type t;
    const uint8_t *src;
    size_t row_bytes;
    int64_t n_in, n_out;
    float *dst;
    int bad;
} dq_job;

static void dq_task(void *arg, int64_t i)
{
    dq_job *j = arg;
    int64_t r0 = i * 64, r1 = r0 + 64 < j->n_out ? r0 + 64 : j->n_out;
    for (int64_t r = r0; r < r1; r++)
        if (cb_dequant_row(j->t, j->src + (size_t)r * j->row_bytes, j->dst + r * j->n_in, j->n_in) != CB_OK)
            j->bad = 1;
}

static cb_bweight *cpu_weight_new(cb_backend *b, cb_type t, int64_t n_in, int64_t n_out, const void *data,
                                  const float *bias)
{
    cb_bweight *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->n_in = n_in;
    w->n_out = n_out;
    w->w = cpu_alloc(b, sizeof(float) * (size_t)(n_in * n_out));
    if (bias) {
        w->bias = cpu_alloc(b, sizeof(float) * (size_t)n_out);
        if (w->bias)
            memcpy(w->bias, bias, sizeof(float) * (size_t)n_out);
    }
    if (!w->w || (bias && !w->bias))
        goto fail;
    dq_job j = {t, data, cb_type_row_bytes(t, n_in), n_in, n_out, w->w, 0};
    if (j.row_bytes == 0)
        goto fail;
    pool_for(CTX(b)->pool, dq_task, &j, (n_out + 63) / 64);
    if (j.bad)
        goto fail;
    return w;
fail:
    free(w->w);
    free(w->bias);
    free(w);
    return NULL;
}

static void cpu_weight_free(cb_backend *b, cb_bweight *w)
{
    (void)b;
    if (!w)
        return;
    free(w->w);
    free(w->bias);
    free(w);
}

static void cpu_matmul(cb_backend *b, const cb_bweight *w, const float *x, float *y, int64_t n)
{
    (void)b;
    if (n == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)w->n_out, (int)w->n_in, 1.0f, w->w, (int)w->n_in, x, 1, 0.0f,
                    y, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)w->n_out, (int)w->n_in, 1.0f, x,
                    (int)w->n_in, w->w, (int)w->n_in, 0.0f, y, (int)w->n_out);
    }
    if (w->bias)
        for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < w->n_out; o++)
                y[i * w->n_out + o] += w->bias[o];
}

static void cpu_get_rows(cb_backend *b, const cb_bweight *w, const int32_t *ids, int64_t n, float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * w->n_in, w->w + (int64_t)ids[i] * w->n_in, sizeof(float) * (size_t)w->n_in);
}

static void cpu_rmsnorm(cb_backend *b, const float *x, const float *g, float *y, int64_t n, int64_t d, float eps)
{
    (void)b;
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d;
        float *yi = y + i * d;
        double ss = 0; /* ggml sums in double too (ggml_vec_*, rms_norm) */
        for (int64_t j = 0; j < d; j++)
            ss += (double)xi[j] * xi[j];
        float scale = cb_op_rms_scale(ss, d, eps);
        for (int64_t j = 0; j < d; j++)
            yi[j] = xi[j] * scale * g[j];
    }
}

static void cpu_rope(cb_backend *b, float *x, const int32_t *pos, int64_t n, int n_head, int hd, int n_rot,
                     float base, const float *ff, int neox)
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
    (void)b;
    for (int64_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void cpu_swiglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        out[i] = cb_op_swiglu(g[i], u[i]);
}

static void cpu_geglu(cb_backend *b, const float *g, const float *u, float *out, int64_t n)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        out[i] = cb_op_geglu(g[i], u[i]);
}

static void cpu_scale(cb_backend *b, float *x, float s, int64_t n)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
}

static void cpu_kv_write(cb_backend *b, void *cache, cb_type t, int64_t width, const float *src, const int32_t *at,
                         int64_t n)
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

static void cpu_kv_read(cb_backend *b, const void *cache, cb_type t, int64_t width, const int32_t *at, int64_t n,
                        float *dst)
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

/* e^x for x <= 0 (softmax after subtracting the max), written so that gcc
 * vectorizes the loops calling it: x log2(e) = n + f with |f| <= 1/2, 2^f
 * from Cephes' exp2f polynomial (relative error < 2e-7), 2^n by exponent
 * bits.  libm's expf is a call per element and was a quarter of prefill
 * time at 4K tokens. */
static inline float exp_neg(float x)
{
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504088896341f, n = __builtin_rintf(t), f = t - n;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    /* NaN (a model with NaN weights) stays NaN; converting it to int is UB */
    int32_t bits = ((n == n ? (int32_t)n : 0) + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* Attention work is split into (head, block of ATT_BLOCK query rows) tasks;
 * each computes S = Q K^T with sgemm over keys 0..max position in the block,
 * masks keys past each row's own position, softmaxes, and O = P V. */
#define ATT_BLOCK 64

typedef struct att_job {
    const float *q;
    const int32_t *pos;
    int64_t n;
    const float *k, *v; /* f32 [n_keys, n_head_kv*hd] */
    int n_head, n_head_kv, hd;
    float scale;
    int window; /* > 0: keys pos-window+1 .. pos only */
    float *out;
    int64_t n_blocks;
    int64_t n_keys;
} att_job;

/* O3: gcc 12 -O2 only vectorizes loops of known trip count; the softmax loops need it */
__attribute__((optimize("O3"))) static void att_task(void *arg, int64_t task)
{
    att_job *j = arg;
    int h = (int)(task / j->n_blocks);
    int64_t i0 = (task % j->n_blocks) * ATT_BLOCK, i1 = i0 + ATT_BLOCK < j->n ? i0 + ATT_BLOCK : j->n;
    int kvh = h / (j->n_head / j->n_head_kv);
    int ldq = j->n_head * j->hd, ldk = j->n_head_kv * j->hd;
    int32_t maxp = 0;
    for (int64_t i = i0; i < i1; i++)
        if (j->pos[i] > maxp)
            maxp = j->pos[i];
    int64_t nk = (int64_t)maxp + 1, m = i1 - i0;
    float *s = malloc(sizeof(float) * (size_t)(m * nk));
    if (!s)
        abort(); /* a few hundred KB: treat like a stack overflow */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nk, j->hd, j->scale, j->q + i0 * ldq + h * j->hd,
                ldq, j->k + kvh * j->hd, ldk, 0.0f, s, (int)nk);
    for (int64_t r = 0; r < m; r++) {
        float *row = s + r * nk;
        int64_t lim = (int64_t)j->pos[i0 + r] + 1;
        int64_t lo = j->window > 0 && lim > j->window ? lim - j->window : 0;
        float mx = -INFINITY, sum = 0;
        for (int64_t c = 0; c < lo; c++)
            row[c] = 0.0f;
        row += lo;
        lim -= lo;
        for (int64_t c = 0; c < lim; c++)
            mx = row[c] > mx ? row[c] : mx;
        for (int64_t c = 0; c < lim; c++)
            row[c] = exp_neg(row[c] - mx);
        for (int64_t c = 0; c < lim; c++)
            sum += row[c];
        float inv = 1.0f / sum;
        for (int64_t c = 0; c < lim; c++)
            row[c] *= inv;
        for (int64_t c = lim; c < nk - lo; c++)
            row[c] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, j->hd, (int)nk, 1.0f, s, (int)nk, j->v + kvh * j->hd,
                ldk, 0.0f, j->out + i0 * ldq + h * j->hd, ldq);
    free(s);
}

typedef struct cvt_job {
    const void *src;
    float *dst;
    int64_t n;
} cvt_job;

static void cvt_task(void *arg, int64_t i)
{
    cvt_job *j = arg;
    int64_t a = i * 65536, e = a + 65536 < j->n ? a + 65536 : j->n;
    const _Float16 *s = j->src;
    for (int64_t x = a; x < e; x++)
        j->dst[x] = (float)s[x];
}

static void cpu_attention(cb_backend *b, const float *q, const int32_t *pos, int64_t n, const void *k, const void *v,
                          cb_type t, int n_head, int n_head_kv, int hd, float scale, int window, float *out)
{
    cpu_ctx *c = CTX(b);
    int32_t maxp = 0;
    for (int64_t i = 0; i < n; i++)
        if (pos[i] > maxp)
            maxp = pos[i];
    int64_t n_keys = (int64_t)maxp + 1, width = (int64_t)n_head_kv * hd;
    const float *kf = k, *vf = v;
    float *tmp = NULL;
    if (t != CB_TYPE_F32) {
        tmp = malloc(sizeof(float) * (size_t)(2 * n_keys * width));
        if (!tmp)
            abort();
        cvt_job ck = {k, tmp, n_keys * width}, cv = {v, tmp + n_keys * width, n_keys * width};
        pool_for(c->pool, cvt_task, &ck, (ck.n + 65535) / 65536);
        pool_for(c->pool, cvt_task, &cv, (cv.n + 65535) / 65536);
        kf = tmp;
        vf = tmp + n_keys * width;
    }
    att_job j = {q,     pos, n,   kf, vf, n_head, n_head_kv, hd, scale, window,
                 out, (n + ATT_BLOCK - 1) / ATT_BLOCK, n_keys};
    /* Tasks run concurrently on the pool: each sgemm must be single-threaded. */
    if (c->n_threads > 1)
        openblas_set_num_threads(1);
    pool_for(c->pool, att_task, &j, j.n_blocks * n_head);
    if (c->n_threads > 1)
        openblas_set_num_threads(c->n_threads);
    free(tmp);
}

static void cpu_gather(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * d, src + (int64_t)idx[i] * d, sizeof(float) * (size_t)d);
}

static void cpu_scatter(cb_backend *b, const float *src, const int32_t *idx, int64_t n, int64_t d, float *dst)
{
    (void)b;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + (int64_t)idx[i] * d, src + i * d, sizeof(float) * (size_t)d);
}

static void cpu_deviation(cb_backend *b, const float *src, const void *cache, cb_type t, int64_t width,
                          const int32_t *at, int64_t n, float *dev)
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

typedef struct ranked {
    float v;
    int32_t i;
} ranked;

static int by_value_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b; /* indices differ: never equal */
    return cb_op_topk_before(x->v, x->i, y->v, y->i) ? -1 : 1;
}

static void cpu_topk(cb_backend *b, const float *x, int64_t n, int64_t k, int32_t *idx)
{
    (void)b;
    ranked *r = malloc(sizeof(ranked) * (size_t)(n ? n : 1));
    if (!r)
        abort(); /* n floats' worth: treat like a stack overflow */
    for (int64_t i = 0; i < n; i++)
        r[i] = (ranked){x[i], (int32_t)i};
    qsort(r, (size_t)n, sizeof *r, by_value_desc);
    for (int64_t i = 0; i < k && i < n; i++)
        idx[i] = r[i].i;
    free(r);
}

static void cpu_free(cb_backend *b)
{
    if (!b)
        return;
    pool_free(CTX(b)->pool);
    free(b->ctx);
    free(b);
}

static const cb_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .upload = cpu_copy,
    .download = cpu_copy,
    .weight_new = cpu_weight_new,
    .weight_free = cpu_weight_free,
    .matmul = cpu_matmul,
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
};

cb_backend *cb_backend_cpu_new(int n_threads)
{
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
    c->n_threads = n_threads;
    c->pool = pool_new(n_threads);
    if (!c->pool) {
        free(b);
        free(c);
        return NULL;
    }
    openblas_set_num_threads(n_threads);
    b->ops = &cpu_ops;
    b->ctx = c;
    b->n_threads = n_threads;
    snprintf(b->desc, sizeof b->desc, "cpu (%d thread%s)", n_threads, n_threads == 1 ? "" : "s");
    return b;
}
