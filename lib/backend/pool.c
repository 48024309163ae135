/* pool.c - see pool.h.  Workers wait on a generation counter: spin with
 * pause for SPIN_NS, then futex-wait on it; the caller wakes sleepers only
 * when there are any (a counter of sleepers, sequentially consistent with
 * the generation, so no wake-up is lost).  A spinning thread yields the CPU
 * only when the pool has more threads than the CPUs this process may run
 * on (then the thread it waits for may be waiting for a CPU); otherwise a
 * yield hands the core to another process for a time slice while the
 * thread it waits for runs, and every decode step pays it. */
#include "pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

enum { SPIN_NS = 200000 }; /* 0.2 ms: longer than the gaps inside a decode step */

struct cb_pool {
    int n;
    int yield; /* more threads than CPUs: spinners yield */
    pthread_t *th;
    pthread_mutex_t job_mu; /* one job at a time */
    atomic_uint gen;        /* futex word: bumped for every job (and quit) */
    atomic_int sleepers;
    atomic_int pending; /* workers still in the current job */
    atomic_uint done;   /* futex word for the caller: bumped when pending hits 0 */
    atomic_int caller_sleeps;
    atomic_int quit;
    cb_task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_llong next;
};

typedef struct worker_arg {
    cb_pool *p;
    int tid;
} worker_arg;

static void futex_wait(atomic_uint *w, unsigned v)
{
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *w)
{
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait until *w != v: spin, then sleep.  *sleepers counts the sleepers. */
static void wait_change(atomic_uint *w, unsigned v, atomic_int *sleepers, int yield)
{
    int64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load(w) != v)
            return;
        cpu_relax();
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                break;
            if (yield)
                sched_yield(); /* oversubscribed: let the thread we wait for run */
        }
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(w) == v)
        futex_wait(w, v);
    atomic_fetch_sub(sleepers, 1);
}

static void run_tasks(cb_pool *p, int tid)
{
    for (;;) {
        int64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_tasks)
            break;
        p->fn(p->arg, i, tid);
    }
}

static void *worker(void *a)
{
    worker_arg wa = *(worker_arg *)a;
    cb_pool *p = wa.p;
    free(a);
    unsigned seen = 0; /* gen at creation: a job may come before this thread runs */
    for (;;) {
        wait_change(&p->gen, seen, &p->sleepers, p->yield);
        seen = atomic_load(&p->gen);
        if (atomic_load(&p->quit))
            break;
        run_tasks(p, wa.tid);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            atomic_fetch_add(&p->done, 1);
            if (atomic_load(&p->caller_sleeps))
                futex_wake(&p->done);
        }
    }
    return NULL;
}

cb_pool *cb_pool_new(int n)
{
    cb_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n < 1 ? 1 : n;
    cpu_set_t cpus;
    p->yield = sched_getaffinity(0, sizeof cpus, &cpus) != 0 || p->n > CPU_COUNT(&cpus);
    p->th = calloc((size_t)p->n, sizeof *p->th);
    if (!p->th) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->job_mu, NULL);
    for (int i = 1; i < p->n; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa)
            *wa = (worker_arg){p, i};
        if (!wa || pthread_create(&p->th[i], NULL, worker, wa) != 0) {
            free(wa);
            p->n = i; /* run with what we got */
            break;
        }
    }
    return p;
}

void cb_pool_free(cb_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->quit, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->job_mu);
    free(p->th);
    free(p);
}

int cb_pool_size(const cb_pool *p) { return p->n; }

void cb_pool_for(cb_pool *p, cb_task_fn fn, void *arg, int64_t n_tasks)
{
    if (n_tasks <= 0)
        return;
    pthread_mutex_lock(&p->job_mu);
    if (p->n == 1 || n_tasks == 1) {
        for (int64_t i = 0; i < n_tasks; i++)
            fn(arg, i, 0);
        pthread_mutex_unlock(&p->job_mu);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n - 1);
    unsigned done = atomic_load(&p->done);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake(&p->gen);
    run_tasks(p, 0);
    /* wait for the workers: spin, then sleep */
    int64_t t0 = 0;
    for (unsigned i = 1; atomic_load(&p->done) == done; i++) {
        cpu_relax();
        if ((i & 255) == 0) {
            int64_t t = now_ns();
            if (!t0) {
                t0 = t;
            } else if (t - t0 > SPIN_NS) {
                atomic_store(&p->caller_sleeps, 1);
                while (atomic_load(&p->done) == done)
                    futex_wait(&p->done, done);
                atomic_store(&p->caller_sleeps, 0);
                break;
            }
            if (p->yield)
                sched_yield();
        }
    }
    pthread_mutex_unlock(&p->job_mu);
}
