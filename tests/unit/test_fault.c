/* test_fault.c - device faults, injected (cb_backend_fail_at,
 * $CB_BACKEND_FAIL_AT) on the CPU backend since no faulty GPU is at hand:
 * the injecting table's own contract (the n-th operation fails, later ones
 * do nothing, releases still release, the fault is sticky and set on
 * return in every thread), and every caller's error path: a model used the
 * way the programs use it (load, KV caches, prefill, decode, deviation and
 * top-k, KV reads and loads) with a fault from each operation on in turn
 * returns CB_ERR_DEVICE from the function that meets it, names it, fails
 * the same way afterwards, and frees cleanly (the ASan build checks for
 * leaks: make test); past the last operation the results are the
 * uninjected run's, bit for bit. */
#include "../../lib/backend/backend.h"
#include "../../lib/prompt/prompt.h"
#include "test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const cb_model_params T_CPU = {.n_threads = 2, .device = "cpu", .exact = 1};

#define N_PROMPT 12
#define N_CTX 64
#define N_STAGES 13

/* What one use of the model computes (compared between runs). */
typedef struct outputs {
    float *logits; /* [3, n_vocab]: two prefills' last logits; the third the sticky check's */
    float *dec;    /* [2, n_vocab]: one decode step of both sequences */
    float *keys;   /* [N_PROMPT + 1, kv width]: layer 0's K of the first cache */
    int32_t top[4];
} outputs;

static int outputs_new(outputs *o, const cb_hparams *hp)
{
    size_t nv = (size_t)hp->n_vocab, w = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    o->logits = calloc(3 * nv, sizeof(float));
    o->dec = calloc(2 * nv, sizeof(float));
    o->keys = calloc((N_PROMPT + 1) * w, sizeof(float));
    memset(o->top, 0, sizeof o->top);
    return o->logits && o->dec && o->keys;
}

static void outputs_free(outputs *o)
{
    free(o->logits), free(o->dec), free(o->keys);
    memset(o, 0, sizeof *o);
}

static int outputs_same(const outputs *a, const outputs *b, const cb_hparams *hp)
{
    size_t nv = (size_t)hp->n_vocab, w = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    return memcmp(a->logits, b->logits, 3 * nv * sizeof(float)) == 0 &&
           memcmp(a->dec, b->dec, 2 * nv * sizeof(float)) == 0 &&
           memcmp(a->keys, b->keys, (N_PROMPT + 1) * w * sizeof(float)) == 0 &&
           memcmp(a->top, b->top, sizeof a->top) == 0;
}

/* The stages of one use, in order; each runs only after the ones before it
 * succeeded, as a program stops at its first error.  Returns the first
 * failing stage's number (1..N_STAGES) and its status, or 0. */
static int use_model(cb_model *m, outputs *o, cb_status *failed)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    cb_kvcache *kv[2] = {NULL, NULL};
    cb_fwd *f = NULL, *fd = NULL;
    int32_t toks[N_PROMPT], pos[N_PROMPT], rows[N_PROMPT];
    float *k = calloc((size_t)(4 * w), sizeof(float)), *v = calloc((size_t)(4 * w), sizeof(float));
    int stage = 0;
    cb_status st = k && v ? CB_OK : CB_ERR_NOMEM;

    for (int32_t i = 0; i < N_PROMPT; i++) {
        toks[i] = (int32_t)((i * 7 + 3) % hp->n_vocab);
        pos[i] = rows[i] = i;
        k[i % 4 * w] = v[i % 4 * w] = (float)i; /* something to load */
    }
    /* a stage that returns CB_OK has left no fault behind (the CPU has no
     * sync operation: cb_model_sync only reads the fault) */
#define STAGE(expr)                                                                          \
    do {                                                                                     \
        if (st == CB_OK) {                                                                   \
            stage++;                                                                         \
            st = (expr);                                                                     \
            CHECKF(st != CB_OK || cb_model_sync(m) == CB_OK, "stage %d: CB_OK over a fault", \
                   stage);                                                                   \
        }                                                                                    \
    } while (0)
    STAGE(cb_kvcache_new(&kv[0], m, N_CTX, CB_TYPE_F16));
    STAGE(cb_kvcache_new(&kv[1], m, N_CTX, CB_TYPE_F32));
    STAGE(cb_fwd_new(&f, m, 16));
    STAGE(cb_model_eval(f, kv[0], toks, N_PROMPT, 0, o->logits));
    STAGE(cb_model_eval(f, kv[1], toks + 2, N_PROMPT - 2, 0, o->logits + hp->n_vocab));
    STAGE(cb_fwd_new(&fd, m, cb_fwd_decode_rows(m, 2)));
    STAGE(cb_fwd_decode(fd, kv, (const int32_t[]){toks[1], toks[2]},
                        (const int32_t[]){N_PROMPT, N_PROMPT - 2}, 2, o->dec));
    STAGE(cb_kvcache_read(kv[0], 0, 0, 0, N_PROMPT + 1, o->keys));
    STAGE(cb_fwd_embed(f, toks, pos, N_PROMPT));
    STAGE(cb_fwd_layer(f, kv[0], 0, rows, N_PROMPT));
    STAGE(cb_fwd_layer_kv(f, kv[0], 1, NULL, 0));
    STAGE(cb_fwd_deviation(f, kv[0], 1, 0, rows, N_PROMPT, 4, o->top));
    STAGE(cb_kvcache_load(kv[1], 1, 20, 4, k, v, 0));
#undef STAGE
    *failed = st;
    if (st != CB_OK && f) { /* sticky: the next computation fails the same way */
        int32_t last = 0;
        CHECK(cb_fwd_logits(f, &last, 1, o->logits + 2 * hp->n_vocab) == st);
        CHECK(cb_model_sync(m) == st);
    }
    cb_fwd_free(fd);
    cb_fwd_free(f);
    cb_kvcache_free(kv[1]);
    cb_kvcache_free(kv[0]);
    free(k), free(v);
    return st == CB_OK ? 0 : stage;
}

static void fail_at_env(long at)
{
    char s[32];
    snprintf(s, sizeof s, "%ld", at);
    if (at > 0)
        setenv("CB_BACKEND_FAIL_AT", s, 1);
    else
        unsetenv("CB_BACKEND_FAIL_AT");
}

/* Every operation in turn: the first to fail is the n-th. */
static void test_sweep(const char *type)
{
    char path[1024];
    const char *tmp = getenv("CB_TEST_TMP");
    cb_model *m = NULL;
    cb_error err;
    outputs ref = {0}, o = {0};
    cb_status st;
    int fails[N_STAGES + 1] = {0}, load_fails = 0, bad_status = 0, no_name = 0, done = 0;
    long at;

    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmp ? tmp : "tests/tmp", type);
    tcase("%s: a fault at each backend operation in turn is CB_ERR_DEVICE where it is met", type);
    fail_at_env(0);
    if (cb_model_load(&m, path, &T_CPU, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    const cb_hparams hp = *cb_model_hparams(m);
    CHECK(outputs_new(&ref, &hp) && outputs_new(&o, &hp));
    CHECK(use_model(m, &ref, &st) == 0 && st == CB_OK);
    cb_model_free(m);
    for (at = 1; at < 100000 && !done; at++) {
        fail_at_env(at);
        st = cb_model_load(&m, path, &T_CPU, &err);
        fail_at_env(0);
        if (st != CB_OK) {
            load_fails++;
            bad_status += st != CB_ERR_DEVICE;
            no_name += !strstr(err.msg, "injected device fault");
            continue;
        }
        int stage = use_model(m, &o, &st);
        if (stage) {
            fails[stage]++;
            bad_status += st != CB_ERR_DEVICE;
            no_name += !strstr(cb_model_strerror(m, st), "injected device fault");
        } else {
            done = 1; /* past the last operation: the uninjected results */
            CHECKF(outputs_same(&o, &ref, &hp), "fault injection at %ld changed the results", at);
            CHECK(strcmp(cb_model_strerror(m, CB_ERR_DEVICE), cb_strerror(CB_ERR_DEVICE)) == 0);
        }
        cb_model_free(m);
    }
    CHECKF(done, "every run up to operation %ld failed", at);
    CHECKF(load_fails > 5, "only %d faults hit the load", load_fails);
    for (int s = 1; s <= N_STAGES; s++)
        CHECKF(fails[s] > 0, "no fault reached stage %d", s);
    CHECKF(bad_status == 0, "%d faults came back as another status", bad_status);
    CHECKF(no_name == 0, "%d faults' messages do not name them", no_name);
    printf("# %s: %ld operations; %d faults in the load, %d in its use\n", type, at - 2, load_fails,
           (int)(at - 2 - load_fails));
    outputs_free(&ref);
    outputs_free(&o);
}

static void test_env(void)
{
    char path[1024];
    const char *tmp = getenv("CB_TEST_TMP");
    cb_model *m = NULL;
    cb_error err;
    snprintf(path, sizeof path, "%s/tiny-q8_0.gguf", tmp ? tmp : "tests/tmp");
    tcase("$CB_BACKEND_FAIL_AT that is not a count >= 1 is CB_ERR_INVALID, naming it");
    const char *bad[] = {"x", "0", "-3", "12k"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("CB_BACKEND_FAIL_AT", bad[i], 1);
        cb_status st = cb_model_load(&m, path, &T_CPU, &err);
        CHECKF(st == CB_ERR_INVALID && strstr(err.msg, "CB_BACKEND_FAIL_AT"), "%s: %d %s", bad[i],
               st, st ? err.msg : "");
        if (st == CB_OK)
            cb_model_free(m);
    }
    unsetenv("CB_BACKEND_FAIL_AT");
}

/* The injecting table on its own. */
static void test_table(void)
{
    tcase("the n-th operation fails; later ones do nothing but release; the table is kept");
    cb_backend *b = cb_backend_cpu_new(1);
    if (!b) {
        CHECK(0);
        return;
    }
    const cb_backend_ops *cpu = b->ops;
    CHECK(cb_backend_fail_at(b, 0) == CB_ERR_INVALID && b->ops == cpu);
    CHECK_OK(cb_backend_fail_at(b, 3));
    CHECK(b->ops != cpu && strcmp(b->ops->name, cpu->name) == 0);
    CHECK(!b->ops->sync == !cpu->sync && !b->ops->event_new == !cpu->event_new);
    float src[4] = {1, 2, 3, 4}, dst[4] = {0, 0, 0, 0};
    float *d = b->ops->alloc(b, sizeof src); /* 1 */
    CHECK(d != NULL);
    b->ops->upload(b, d, src, sizeof src); /* 2 */
    CHECK(cb_backend_status(b) == CB_OK);
    b->ops->download(b, dst, d, sizeof dst); /* 3: fails */
    CHECK(cb_backend_status(b) == CB_ERR_DEVICE);
    CHECK(dst[0] == 0 && dst[3] == 0);
    CHECKF(strstr(b->fault_msg, "cpu: download: injected device fault at backend operation 3"),
           "%s", b->fault_msg);
    CHECK(b->ops->alloc(b, 16) == NULL && cb_backend_nomem(b) == CB_ERR_DEVICE);
    b->ops->dealloc(b, d); /* still released (ASan: no leak) */
    b->ops->free(b);
}

static void *fail_twice(void *arg)
{
    cb_backend *b = arg;
    cb_backend_fail(b, CB_ERR_INTERNAL, "%s", "second");
    return (void *)(intptr_t)(cb_backend_status(b) != CB_OK);
}

static void test_race(void)
{
    tcase("a fault is set on return in every thread that records one; the first one stays");
    int ok = 1, first = 1;
    for (int i = 0; i < 200; i++) {
        cb_backend b;
        pthread_t th;
        void *r = NULL;
        memset(&b, 0, sizeof b);
        if (pthread_create(&th, NULL, fail_twice, &b) != 0) {
            ok = 0;
            break;
        }
        cb_backend_fail(&b, CB_ERR_DEVICE, "%s", "first");
        ok &= cb_backend_status(&b) != CB_OK;
        pthread_join(th, &r);
        ok &= r != NULL;
        cb_status st = cb_backend_status(&b);
        first &= (st == CB_ERR_DEVICE && strcmp(b.fault_msg, "first") == 0) ||
                 (st == CB_ERR_INTERNAL && strcmp(b.fault_msg, "second") == 0);
    }
    CHECK(ok);
    CHECK(first);
}

int main(void)
{
    TEST_BEGIN();
    test_table();
    test_race();
    test_env();
    test_sweep("q8_0");
    test_sweep("qwen3"); /* Q/K norms, four layers */
    TEST_END();
}
