/* test_noalloc.c - the forward pass allocates nothing per call after setup
 * (cbcore.h's promise for the CPU backend).
 *
 * Linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc (Makefile), so
 * every allocation made by this program and by libcbcore.a goes through the
 * counters below.  After the model, cache and cb_fwd are made, prefill (in
 * batches smaller than the prompt), decode steps, logits of several rows, a
 * layer on selected rows and a deviation must not allocate. */
#include "../../lib/infer/infer.h"
#include "test.h"

#include <stdatomic.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
static atomic_long n_allocs;
static atomic_int counting;

void *__wrap_malloc(size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t s)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
    return __real_calloc(n, s);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
    return __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
    return __real_aligned_alloc(a, n);
}

static void run(const char *path, const char *label, int exact)
{
    cb_model *m = NULL;
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    cb_error err;
    cb_model_params mp = {2, "cpu", exact, NULL};
    tcase("%s: prefill, decode, logits, selected rows and deviation allocate nothing", label);
    if (cb_model_load(&m, path, &mp, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    int32_t tok[48], rows[5] = {1, 5, 7, 9, 11}, top[2], pos[48];
    for (int i = 0; i < 48; i++)
        tok[i] = (i * 37 + 5) % hp->n_vocab, pos[i] = i;
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab * 12);
    CHECK_OK(cb_kvcache_new(&kv, m, 128, CB_TYPE_F16));
    CHECK_OK(cb_fwd_new(&f, m, 16));
    if (!kv || !f || !logits)
        goto out;
    atomic_store(&n_allocs, 0);
    atomic_store(&counting, 1);
    CHECK_OK(cb_model_eval(f, kv, tok, 40, 0, logits)); /* three batches of 16 */
    for (int i = 0; i < 4; i++)
        CHECK_OK(cb_model_eval(f, kv, &tok[40 + i], 1, 40 + i, logits));
    CHECK_OK(cb_fwd_embed(f, tok, pos, 12));
    CHECK_OK(cb_fwd_layer(f, kv, 0, rows, 3));
    CHECK_OK(cb_fwd_deviation(f, kv, 1, 0, rows, 4, 2, top));
    CHECK_OK(cb_fwd_logits(f, NULL, 12, logits));
    atomic_store(&counting, 0);
    CHECKF(atomic_load(&n_allocs) == 0, "%ld allocations during the forward pass",
           atomic_load(&n_allocs));
    /* the counter itself works: a cache transfer stages its rows */
    float *row = malloc(sizeof(float) * (size_t)hp->n_head_kv * (size_t)hp->head_dim);
    atomic_store(&counting, 1);
    CHECK_OK(cb_kvcache_read(kv, 0, 0, 3, 1, row));
    atomic_store(&counting, 0);
    CHECKF(atomic_load(&n_allocs) > 0, "the allocation counter saw nothing");
    free(row);
out:
    free(logits);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_model_free(m);
}

int main(void)
{
    char path[1024];
    const char *tmp = getenv("CB_TEST_TMP");
    TEST_BEGIN();
    snprintf(path, sizeof path, "%s/tiny-q4_K.gguf", tmp ? tmp : "tests/tmp");
    run(path, "tiny q4_K, exact", 1);
    run(path, "tiny q4_K, 8-bit activations (their buffers are sized at setup)", 0);
    snprintf(path, sizeof path, "%s/tiny-qwen2.gguf", tmp ? tmp : "tests/tmp");
    run(path, "tiny qwen2 q8_0 (biases), exact", 1);
    run(path, "tiny qwen2 q8_0, 8-bit activations", 0);
    TEST_END();
}
