/* blend_load.c - see blend_load.h.  The loader reads a layer of every
 * used cache into one buffer (page-locked where the backend has such
 * memory) and places the segments in groups (cb_kv_scratch_group: all of
 * them together on a device, each as it is read on the CPU). */
#include "blend_load.h"

#include "../backend/pool.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


/* segments of layer l placed in the cache; a failure said in err */
static cb_status place(loader *ld, int32_t l, const cb_kv_seg *ks, int32_t n, cb_kv_scratch *sc,
                       cb_error *err)
{
    cb_status st = cb_kvcache_load_segs(ld->kv, l, ks, n, sc);
    if (st != CB_OK)
        cb_error_set(err, st, "blend: cannot place layer %d of the caches: %s", l,
                     cb_model_strerror(ld->m, st));
    return st;
}

/* Used segment s's rows of layer l read into at (NULL: the file's own
 * buffer), as the segment to place */
static cb_status read_seg(const loader *ld, int32_t s, int32_t l, uint8_t *at, cb_kv_seg *out,
                          cb_error *err)
{
    cb_kvfile *kf = ld->segs[s].kv;
    const cb_kv_meta *mt = cb_kvfile_meta(kf);
    const void *k, *v;
    cb_status st = at ? cb_kvfile_layer_rows_into(kf, l, at, &k, &v, err)
                      : cb_kvfile_layer_rows(kf, l, &k, &v, err);
    if (st == CB_OK)
        *out = (cb_kv_seg){.pos = ld->start[s],
                           .n = ld->segs[s].n,
                           .from_pos0 = mt->pos0,
                           .type = cb_kvfile_rows_type(kf),
                           .k = k,
                           .v = v,
                           .key_scale = s >= ld->exact_end ? ld->key_scale : 1.0f};
    return st;
}

/* A layer read by several threads (cb_pool_for's tasks: one a used
 * segment), each file into its own place in the buffer; the first failure
 * in the segments' order is the one reported, as one reader would. */
typedef struct layer_reads {
    const loader *ld;
    int32_t l, n;       /* the layer; the used segments */
    const int32_t *seg; /* [n]: their indices */
    const size_t *off;  /* [n]: their places in buf */
    uint8_t *buf;
    cb_kv_seg *ks; /* [n] */
    pthread_mutex_t mu;
    int32_t bad; /* the first failed one, else n */
    cb_status st;
    cb_error err;
} layer_reads;

static void read_task(void *arg, int64_t i, int tid)
{
    layer_reads *r = arg;
    cb_error err;
    (void)tid;
    cb_status st = read_seg(r->ld, r->seg[i], r->l, r->buf + r->off[i], &r->ks[i], &err);
    if (st != CB_OK) {
        pthread_mutex_lock(&r->mu);
        if (i < r->bad)
            r->bad = (int32_t)i, r->st = st, r->err = err;
        pthread_mutex_unlock(&r->mu);
    }
}

/* The readers the backend's choice gives: on a device (which places a
 * layer of every segment together) half the cores this process may run
 * on, up to 8, as reading and checking the files is the loader's work
 * there; on the CPU one, which reads each segment just before placing it
 * while the computing threads take the cores. */
static int32_t auto_readers(int32_t group)
{
    cpu_set_t cpus;
    if (group > 0)
        return 1;
    long n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus)
                                                           : sysconf(_SC_NPROCESSORS_ONLN);
    n /= 2;
    return n < 1 ? 1 : n > 8 ? 8 : (int32_t)n;
}

static void loader_run(loader *ld)
{
    cb_status st = CB_OK;
    cb_error err;
    int32_t bad_seg = -1, n_used = 0;
    cb_kv_seg *ks = calloc((size_t)ld->n_segs, sizeof *ks);
    int32_t *used = calloc((size_t)ld->n_segs, sizeof *used);
    size_t *off = calloc((size_t)ld->n_segs, sizeof *off);
    cb_kv_scratch sc = {0};
    size_t all = 0;
    uint64_t layer_bytes = 0;
    uint8_t *buf = NULL;
    cb_pool *pool = NULL;
    int local = 1;

    cb_kvcache_before_loads(ld->kv);
    /* one buffer for a layer of every cached segment, in memory the
     * device copies from directly (page-locked: no staging copy); the
     * copies out of it may still be queued after the layer is placed, so
     * the next layer is read into it only after a sync (a device's;
     * nothing on the CPU).  Without it, each file's own buffer. */
    for (int32_t s = 0; s < ld->n_segs && used && off; s++)
        if (ld->use[s]) {
            cb_kvfile *kf = ld->segs[s].kv;
            used[n_used] = s, off[n_used++] = all;
            all += cb_kvfile_layer_bytes(kf);
            layer_bytes += cb_kvfile_size(kf) / (uint64_t)ld->n_layer;
            local &= cb_kvfile_concurrent(kf);
        }
    if (!ks || !used || !off)
        st = cb_error_set(&err, CB_ERR_NOMEM, "blend: out of memory");
    else if (!(buf = cb_model_host_alloc(ld->m, all, &sc.async)))
        sc.async = 0;
    int32_t group = cb_kv_scratch_group(ld->kv, &sc), per = group > 0 ? group : n_used;
    /* several readers: local files (pread; a stream's source reads one
     * thing at a time), each into its place in the one buffer */
    int32_t readers = ld->threads > 0 ? ld->threads : auto_readers(group);
    readers = readers > n_used ? n_used : readers;
    if (st == CB_OK && buf && local && readers > 1)
        pool = cb_pool_new(readers); /* (NULL: one reader) */
    ld->threads = pool ? cb_pool_size(pool) : 1;
    layer_reads rd = {.ld = ld, .n = n_used, .seg = used, .off = off, .buf = buf, .ks = ks};
    pthread_mutex_init(&rd.mu, NULL);
    for (int32_t l = 0; l < ld->n_layer && st == CB_OK; l++) {
        double t0 = cb_now_ms();
        if (sc.async && l > 0 && (st = cb_model_sync(ld->m)) != CB_OK) {
            cb_error_set(&err, st, "blend: loading the caches: %s", cb_model_strerror(ld->m, st));
            break;
        }
        /* every cached segment's rows of the layer read, and placed by
         * groups (a device's: all of them together; the CPU's: each as it
         * is read): the file's rows as they are (f16 into an f16 cache is
         * sent as it is), the keys expanded, scaled and moved on the
         * device, in one operation each.  With several readers, the
         * whole layer is read first. */
        if (pool) {
            rd.l = l, rd.bad = n_used;
            cb_pool_for(pool, read_task, &rd, n_used);
            if (rd.bad < n_used)
                st = rd.st, err = rd.err, bad_seg = used[rd.bad];
            for (int32_t i = 0; i < n_used && st == CB_OK; i += per)
                st = place(ld, l, ks + i, n_used - i < per ? n_used - i : per, &sc, &err);
        } else {
            int32_t placed = 0;
            for (int32_t i = 0; i < n_used && st == CB_OK; i++) {
                if ((st = read_seg(ld, used[i], l, buf ? buf + off[i] : NULL, &ks[i], &err)) !=
                    CB_OK) {
                    bad_seg = used[i];
                    break;
                }
                if (i + 1 - placed >= per || i + 1 == n_used)
                    st = place(ld, l, ks + placed, i + 1 - placed, &sc, &err), placed = i + 1;
            }
        }
        if (st == CB_OK)
            ld->bytes += layer_bytes;
        if (ld->limit_mbs > 0) { /* an emulated slow tier: never faster than limit_mbs */
            double due = ld->t_begin + (double)ld->bytes / (ld->limit_mbs * 1e3), now = cb_now_ms();
            if (due > now) {
                struct timespec ts = {(time_t)((due - now) / 1e3),
                                      (long)(fmod(due - now, 1e3) * 1e6)};
                nanosleep(&ts, NULL);
            }
        }
        pthread_mutex_lock(&ld->mu);
        ld->busy_ms += cb_now_ms() - t0;
        if (st == CB_OK)
            ld->ready = l + 1;
        else
            ld->st = st, ld->err = err, ld->failed_seg = bad_seg;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
    }
    pthread_mutex_destroy(&rd.mu);
    cb_pool_free(pool);
    { /* a device queues the copies: wait for them on every exit (after an
       * error too: the caller frees the cache once this thread is joined),
       * and count them as loading time */
        double t0 = cb_now_ms();
        cb_status sst = cb_model_sync(ld->m);
        if (st == CB_OK && sst != CB_OK) {
            st = sst;
            cb_error_set(&err, st, "blend: loading the caches: %s", cb_model_strerror(ld->m, st));
        }
        cb_kv_scratch_free(ld->kv, &sc);
        pthread_mutex_lock(&ld->mu);
        ld->busy_ms += cb_now_ms() - t0;
        pthread_mutex_unlock(&ld->mu);
        /* (not timed: freeing page-locked memory may wait for the whole
         * device, the computing thread's remaining layers included) */
        cb_model_host_free(ld->m, buf, sc.async);
    }
    free(ks), free(used), free(off);
    if (st != CB_OK && ld->st == CB_OK) {
        pthread_mutex_lock(&ld->mu);
        ld->st = st;
        ld->err = err;
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
    }
}

static void *loader_main(void *arg)
{
    loader_run(arg);
    return NULL;
}

/* Start loading every used cache, layer by layer, at its new position
 * (the keys of all but the segments before exact_end divided by the key temperature): on a
 * thread of its own, or right here with p->sequential_load (or when no
 * thread can be made).  Nothing to load: every layer is ready at once. */
void blend_loader_start(loader *ld, const cb_model *m, const cb_segment *segs, int32_t n_segs,
                        const uint8_t *use, const int32_t *start, int32_t exact_end, cb_kvcache *kv,
                        const cb_blend_params *p)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int any = 0;
    for (int32_t s = 0; s < n_segs; s++)
        any |= use[s];
    memset(ld, 0, sizeof *ld);
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv, NULL);
    ld->m = m;
    ld->segs = segs;
    ld->n_segs = n_segs;
    ld->n_layer = hp->n_layer;
    ld->use = use;
    ld->start = start;
    ld->kv = kv;
    ld->limit_mbs = p->load_limit_mbs;
    ld->threads = p->load_threads;
    ld->ready = any ? 0 : hp->n_layer;
    ld->failed_seg = -1;
    ld->exact_end = exact_end;
    ld->key_scale = p->mode == CB_MODE_BLEND || p->mode == CB_MODE_REUSE
                        ? 1.0f / cb_blend_key_temp(m, p)
                        : 1.0f;
    ld->t_begin = cb_now_ms();
    if (!any)
        return;
    cb_kvcache_hand_over(kv); /* the loader writes after what this thread queued on it */
    if (p->sequential_load || pthread_create(&ld->thread, NULL, loader_main, ld) != 0)
        loader_run(ld);
    else
        ld->started = 1;
}

/* Wait for the loader to finish (it always runs to the end or to its
 * first error) and release it. */
void blend_loader_stop(loader *ld)
{
    if (ld->started)
        pthread_join(ld->thread, NULL);
    ld->started = 0;
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv);
}

/* Wait until layer l is in place; adds the time waited to *stall. */
cb_status blend_loader_wait(loader *ld, int32_t l, double *stall, cb_error *err)
{
    cb_status st;
    double t0 = cb_now_ms();
    pthread_mutex_lock(&ld->mu);
    while (ld->ready <= l && ld->st == CB_OK)
        pthread_cond_wait(&ld->cv, &ld->mu);
    st = ld->ready > l ? CB_OK : ld->st;
    if (st != CB_OK && err)
        *err = ld->err;
    pthread_mutex_unlock(&ld->mu);
    *stall += cb_now_ms() - t0;
    return st;
}
