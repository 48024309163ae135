/* blend_load.h - blend.c's KV loader (blend_load.c, private to lib/kv):
 * a thread that reads every used cache's layers, in order, and places
 * them in the prompt's cache at their new positions, while the layers are
 * computed; the computing thread waits for each layer it is about to use. */
#ifndef CB_BLEND_LOAD_H
#define CB_BLEND_LOAD_H

#include "kv.h"

#include <pthread.h>

typedef struct blend_loader {
    const cb_model *m;
    const cb_segment *segs;
    int32_t n_segs, n_layer;
    const uint8_t *use;
    const int32_t *start;
    cb_kvcache *kv;
    double limit_mbs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t ready; /* layers 0..ready-1 are in place */
    cb_status st;
    cb_error err;
    int32_t failed_seg; /* the segment whose file failed to read, or -1 */
    int32_t exact_end;  /* the caches of segments before it are exact (keys kept as they are) */
    float key_scale;    /* the other caches' keys are multiplied by it (1 / key_temp) */
    double busy_ms, t_begin;
    uint64_t bytes;
    int32_t threads; /* readers asked for (0: the backend's choice); then those used */
    pthread_t thread;
    int started; /* the thread runs (else loading ran on the caller's) */
} loader;

/* Start loading every used cache, layer by layer, at its new position:
 * on a thread of its own, or right here with p->sequential_load (or when
 * no thread can be made).  Nothing to load: every layer is ready at once. */
void blend_loader_start(loader *ld, const cb_model *m, const cb_segment *segs, int32_t n_segs,
                        const uint8_t *use, const int32_t *start, int32_t exact_end, cb_kvcache *kv,
                        const cb_blend_params *p);
/* Wait for the loader to finish (it always runs to the end or to its
 * first error) and release it. */
void blend_loader_stop(loader *ld);
/* Wait until layer l is in place (queued, on a device); adds the time
 * waited to *stall. */
cb_status blend_loader_wait(loader *ld, int32_t l, double *stall, cb_error *err);

#endif
