/* test_stats.c - what --stats reports, built by the library:
 * cb_answer_to_json and cb_batch_to_json on the CPU: a batch's answer
 * reports the keys a lone run does, the model's path, load time, threads
 * and the answer's KV type, and no "cuda_features" (the CPU has none:
 * cb_model_features is ""). */
#include "../../lib/prompt/prompt.h"
#include "test.h"

#include <jansson.h>

/* ------------------------------------------------------ the stats objects */

static void t_stats(void)
{
    const char *t = getenv("CB_TEST_TMP");
    char path[1024];
    cb_model_params mp = {2, "cpu", 1, NULL};
    cb_model *m = NULL;
    cb_batch *b = NULL;
    cb_answer *a = NULL;
    cb_error err;
    snprintf(path, sizeof path, "%s/tiny-q8_0.gguf", t ? t : "tests/tmp");
    if (cb_model_load(&m, path, &mp, &err) != CB_OK) {
        tskip("stats on the CPU", err.msg);
        return;
    }
    tcase("stats: a batch's answer as JSON on the CPU");
    cb_chunk_src chunks[2] = {{{"The river Vale runs past Kelby.", 31}, NULL},
                              {{"Its bridge was built by Norden.", 31}, NULL}};
    cb_request rq = {0};
    rq.chunks = chunks, rq.n_chunks = 2;
    rq.question = (cb_strview){"Who built the bridge?", 21};
    rq.bp = cb_blend_defaults();
    rq.gp.n_predict = 3;
    rq.kv_type = CB_TYPE_F32;
    CHECK_OK(cb_batch_new(&b, m, NULL, 1, 1 << 28, NULL, NULL));
    if (b)
        CHECK_OK(cb_batch_submit(b, &rq, NULL));
    while (b && !(a = cb_batch_next(b)) && cb_batch_busy(b))
        cb_batch_step(b);
    CHECK(a && a->status == CB_OK);
    CHECK(strcmp(cb_model_features(m), "") == 0);
    char *text = NULL;
    json_t *s = NULL;
    if (a && cb_answer_to_json(a, m, NULL, &text) == CB_OK)
        s = json_loads(text, 0, NULL);
    free(text);
    CHECK(s != NULL);
    static const char *const keys[] = {"mode",
                                       "n_prompt_tokens",
                                       "n_cached_tokens",
                                       "n_recomputed_tokens",
                                       "ratio",
                                       "ttft_ms",
                                       "prefill_ms",
                                       "n_gen_tokens",
                                       "n_selected",
                                       "stop",
                                       "n_chunks",
                                       "n_chunks_missing",
                                       "n_chunks_stored",
                                       "strategy",
                                       "threads",
                                       "backend",
                                       "device",
                                       "kv_type",
                                       "model",
                                       "model_load_ms",
                                       "stale_scale",
                                       "stall_clock",
                                       "n_chunks_after",
                                       "n_chunks_system",
                                       "strategy_used",
                                       "plan"};
    for (size_t i = 0; s && i < sizeof keys / sizeof keys[0]; i++)
        CHECKF(json_object_get(s, keys[i]) != NULL, "no %s", keys[i]);
    if (s) {
        CHECK(strcmp(json_string_value(json_object_get(s, "model")), path) == 0);
        CHECK(strcmp(json_string_value(json_object_get(s, "kv_type")), "f32") == 0);
        CHECK(strcmp(json_string_value(json_object_get(s, "backend")), "cpu") == 0);
        CHECK(json_integer_value(json_object_get(s, "threads")) == 2);
        CHECK(json_integer_value(json_object_get(s, "n_chunks_missing")) == 2);
        CHECK(json_real_value(json_object_get(s, "model_load_ms")) > 0);
        CHECK(json_object_get(s, "cuda_features") == NULL);
        CHECK(json_object_get(s, "store") == NULL && json_object_get(s, "shared") == NULL);
        /* the defaults' --speedup 4 sets the ratio, and no controller ran */
        CHECK(strcmp(json_string_value(json_object_get(s, "ratio_source")), "speedup") == 0);
        CHECK(json_object_get(s, "predicted_load_ms") == NULL);
    }
    json_decref(s), s = NULL;

    tcase("stats: the batch's totals as JSON on the CPU");
    if (b && cb_batch_to_json(b, 10.0, &text) == CB_OK)
        s = json_loads(text, 0, NULL);
    free(text);
    CHECK(s != NULL);
    if (s) {
        CHECK(json_integer_value(json_object_get(s, "n_questions")) == 1);
        CHECK(json_integer_value(json_object_get(s, "n_answered")) == 1);
        CHECK(strcmp(json_string_value(json_object_get(s, "model")), path) == 0);
        CHECK(json_object_get(s, "cuda_features") == NULL && json_object_get(s, "store") == NULL);
    }
    json_decref(s);
    cb_answer_free(a);
    cb_batch_free(b);
    cb_model_free(m);
}

int main(void)
{
    TEST_BEGIN();
    t_stats();
    TEST_END();
}
