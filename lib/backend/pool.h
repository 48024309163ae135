/* pool.h - the CPU backend's persistent thread pool (private to lib/;
 * also the blend's KV loader's readers, lib/kv/blend_load.c).
 *
 * n threads including the caller.  A job is fn(arg, i, tid) for i in
 * [0, n_tasks), tasks taken in order from a shared counter; tid (0..n-1)
 * names the thread running it, for per-thread scratch.  Between jobs the
 * workers spin for a short while (the next matrix product of a layer comes
 * within microseconds), then sleep on a futex, so that a decode step does
 * not pay a wake-up per operation and an idle program burns no CPU.  Jobs
 * from several threads are serialized (one job at a time). */
#ifndef CB_POOL_H
#define CB_POOL_H

#include <stdint.h>

typedef void (*cb_task_fn)(void *arg, int64_t i, int tid);
typedef struct cb_pool cb_pool;

/* NULL when out of memory; fewer threads than asked when the system
 * refuses to create more (cb_pool_size says how many). */
cb_pool *cb_pool_new(int n_threads);
void cb_pool_free(cb_pool *p);
int cb_pool_size(const cb_pool *p);
/* Run the job on every thread; returns when all tasks are done. */
void cb_pool_for(cb_pool *p, cb_task_fn fn, void *arg, int64_t n_tasks);

#endif
