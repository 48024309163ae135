/* blas.c - OpenBLAS, loaded with dlopen when a backend first needs it
 * (blas.h says why it is not linked). */
#include "blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

cb_sgemm_fn cb_sgemm;
static void (*set_threads)(int);
static int (*get_threads)(void);
/* ends OpenBLAS' spinning workers (exported for fork handling); OpenBLAS
 * starts them again by itself if a program asks it for threads later */
static int (*thread_shutdown)(void);
static char why[600];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* OpenBLAS' names for the library on Debian and most distributions; a
 * generic CBLAS (reference, BLIS) last: it has no threads to control. */
static const char *const names[] = {"libopenblas.so.0", "libopenblas.so", "libopenblasp.so.0",
                                    "libcblas.so.3"};

static void load(void)
{
    /* OpenBLAS reads its thread count from the environment in its
     * constructor: 1 for its start, unless the caller set a count (the
     * variable is removed again after) */
    int set = getenv("OPENBLAS_NUM_THREADS") == NULL;
    if (set)
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
    void *h = NULL;
    char tried[480] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h && n < sizeof tried - 1)
            n += (size_t)snprintf(tried + n, sizeof tried - n, "%s%s", n ? "; " : "", dlerror());
    }
    if (set)
        unsetenv("OPENBLAS_NUM_THREADS");
    if (!h) {
        snprintf(why, sizeof why, "cannot load OpenBLAS (install libopenblas0): %s", tried);
        return;
    }
    cb_sgemm = (cb_sgemm_fn)dlsym(h, "cblas_sgemm");
    set_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
    get_threads = (int (*)(void))dlsym(h, "openblas_get_num_threads");
    thread_shutdown = (int (*)(void))dlsym(h, "blas_thread_shutdown_");
    if (!cb_sgemm) {
        snprintf(why, sizeof why, "the BLAS library loaded has no cblas_sgemm");
        return;
    }
    why[0] = 0;
}

const char *cb_blas_load(void)
{
    pthread_once(&once, load);
    return why[0] ? why : NULL;
}

void cb_blas_single(void)
{
    if (get_threads && set_threads && get_threads() != 1)
        set_threads(1);
}

void cb_blas_quiet(void)
{
    cb_blas_single();
    if (thread_shutdown)
        thread_shutdown();
}
