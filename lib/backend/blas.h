/* blas.h - OpenBLAS, loaded the first time a matrix product needs it.
 *
 * Linked as a dependency, OpenBLAS' pthread build starts one thread a core
 * in its constructor, before main: a program that never multiplies a
 * matrix (cb-store, cb-chunk) paid for them, and on a 16-core machine
 * under an address-space limit (ulimit -v 1G) pthread_create failed there
 * and OpenBLAS raised SIGINT, killing the program before it began.  Loaded
 * here instead, with its thread count set to 1 for its start: the
 * library runs every product inside its own pool, one per thread. */
#ifndef CB_BLAS_H
#define CB_BLAS_H

#include <cblas.h>

typedef __typeof__(&cblas_sgemm) cb_sgemm_fn;

/* The loaded cblas_sgemm; valid after cb_blas_load() returned NULL. */
extern cb_sgemm_fn cb_sgemm;

/* Load OpenBLAS once (thread-safe); NULL when it is loaded, else why it
 * cannot be (the libraries tried and dlopen's message). */
const char *cb_blas_load(void);

/* One thread for OpenBLAS' own products (the library's pool calls it on
 * each of its threads). */
void cb_blas_single(void);

/* The same, and OpenBLAS' idle worker threads ended, if any were started. */
void cb_blas_quiet(void);

#endif
