/* records_batch.c - the question lines cb-run --batch reads: the programs'
 * parser cli_question_parse (src/cli.c), then the prompt cb_batch builds
 * from the request (cb_prompt_build_from, here without a store); part of
 * fuzz_records. */
#include "cli.h"
#include "../../lib/prompt/prompt.h" /* cb_prompt_build_from */
#include "fuzz.h"

#include <jansson.h>

/* One line as cb-run --batch takes it, over defaults as its options make
 * them.  When the line is accepted: it is an object with one question
 * string, and the request holds exactly what the line says (its question,
 * a chunk for every element of "chunks", each a text or a key, the mode
 * blend with chunks and full without unless "mode" says, a ratio in
 * [0, 1], non-empty stop strings); the prompt built from it holds in-range
 * ids, or, for a line with keyed chunks (no store here), fails naming
 * them.  When it is refused, the reason is given.  Returns 1 when accepted. */
int fuzz_batch_line(const cb_model *m, const char *line, size_t len)
{
    static const char *const stops[1] = {"\n"};
    cb_request d = {NULL,
                    0,
                    NULL,
                    0,
                    {NULL, 0},
                    {NULL, 0},
                    cb_blend_defaults(),
                    0,
                    0.15,
                    {cb_sampler_defaults(), 16, stops, 1},
                    0,
                    CB_TYPE_F16,
                    1};
    cli_question q;
    cb_request rq;
    char msg[256] = "";
    int32_t nv = cb_vocab_n_tokens(cb_model_vocab(m));

    if (cli_question_parse(line, len, &d, 0, NULL, &q, &rq, msg, sizeof msg) != 0) {
        FUZZ_CHECK(msg[0] != 0);
        cli_question_free(&q);
        return 0;
    }
    json_t *o = q.obj, *qt = json_object_get(o, "question"), *pt = json_object_get(o, "prompt");
    json_t *ch = json_object_get(o, "chunks");
    FUZZ_CHECK(json_is_object(o) && !(qt && pt) && json_is_string(qt ? qt : pt));
    FUZZ_CHECK(rq.question.data == json_string_value(qt ? qt : pt));
    FUZZ_CHECK(rq.n_chunks == (json_is_array(ch) ? json_array_size(ch) : 0));
    int keyed = 0;
    for (size_t i = 0; i < rq.n_chunks; i++) { /* text, key, or text and its record's "kv" */
        json_t *e = json_array_get(ch, i),
               *kv = json_is_object(e) ? json_object_get(e, "kv") : NULL;
        FUZZ_CHECK(rq.chunks[i].text.data != NULL || rq.chunks[i].key != NULL);
        if (rq.chunks[i].text.data)
            FUZZ_CHECK(rq.chunks[i].key == (json_is_string(kv) ? json_string_value(kv) : NULL));
        keyed |= rq.chunks[i].text.data == NULL;
    }
    FUZZ_CHECK(rq.bp.mode >= CB_MODE_FULL && rq.bp.mode <= CB_MODE_BLEND);
    FUZZ_CHECK(json_object_get(o, "mode") ||
               rq.bp.mode == (rq.n_chunks ? CB_MODE_BLEND : CB_MODE_FULL));
    FUZZ_CHECK(rq.bp.strategy >= CB_STRATEGY_HKVD && rq.bp.strategy <= CB_STRATEGY_AUTO);
    FUZZ_CHECK(rq.bp.ratios[0] >= 0 && rq.bp.ratios[0] <= 1 && rq.gp.n_predict >= 0);
    for (int i = 0; i < rq.gp.n_stops; i++)
        FUZZ_CHECK(rq.gp.stops[i] && rq.gp.stops[i][0] != 0);
    cb_prompt *p = NULL;
    cb_error err;
    cb_status st = cb_prompt_build_from(&p, m, NULL, rq.system, rq.raw, rq.chunks, rq.n_chunks,
                                        rq.question.data, rq.question.len, &err);
    if (keyed) {
        FUZZ_CHECK(st == CB_ERR_NOT_FOUND || st == CB_ERR_FORMAT);
    } else if (st == CB_OK) {
        int32_t ns = 0;
        const cb_segment *segs = cb_prompt_segments(p, &ns);
        for (int32_t i = 0; i < ns; i++)
            for (int32_t j = 0; j < segs[i].n; j++)
                FUZZ_CHECK(segs[i].ids[j] >= 0 && segs[i].ids[j] < nv);
        FUZZ_CHECK(cb_prompt_n_chunks(p) >= 0 && (size_t)cb_prompt_n_chunks(p) <= rq.n_chunks);
    }
    cb_prompt_free(p);
    cli_question_free(&q);
    return 1;
}
