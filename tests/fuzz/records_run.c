/* records_run.c - the chunk records cb-run reads (--chunks): the programs'
 * shared reader cli_read_records (src/cli.c), then the prompt cb-run builds
 * from them (cb_prompt_build); part of fuzz_records. */
#include "cli.h"
#include "fuzz.h"

#include <jansson.h>

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0;
    *n = 0;
    if (!f)
        abort();
    for (;;) {
        if (*n == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096)))
            abort();
        size_t r = fread(buf + *n, 1, cap - *n, f);
        if (r == 0)
            break;
        *n += r;
    }
    fclose(f);
    return buf;
}

/* Read the records in file `path` as `cb-run --chunks path` does; when they
 * are accepted, every line that is not blank is one of them, and the prompt
 * built from their texts holds in-range ids.  Returns 1 when accepted. */
int fuzz_run_records(const cb_model *m, const char *path)
{
    json_t *chunks = NULL;
    int32_t nv = cb_vocab_n_tokens(cb_model_vocab(m));

    cli_verbosity = 0;
    if (cli_read_records(path, "text", (void **)&chunks) != 0) {
        FUZZ_CHECK(chunks == NULL);
        return 0;
    }
    FUZZ_CHECK(json_is_array(chunks));
    size_t n = 0, lines = 0, nc = json_array_size(chunks);
    char *all = slurp(path, &n);
    for (size_t i = 0, start = 0; i <= n; i++)
        if (i == n || all[i] == '\n') {
            int blank = 1;
            for (size_t j = start; j < i; j++)
                blank &= all[j] == ' ' || all[j] == '\t' || all[j] == '\r';
            lines += !blank;
            start = i + 1;
        }
    free(all);
    FUZZ_CHECK(nc == lines);

    cb_strview *texts = malloc(sizeof *texts * (nc ? nc : 1));
    FUZZ_CHECK(texts != NULL);
    for (size_t i = 0; i < nc; i++) {
        json_t *t = json_object_get(json_array_get(chunks, i), "text");
        FUZZ_CHECK(json_is_string(t));
        texts[i] = (cb_strview){json_string_value(t), json_string_length(t)};
    }
    cb_prompt *p = NULL;
    cb_error err;
    if (cb_prompt_build(&p, m, NULL, 0, texts, nc, "Which city?", 11, &err) == CB_OK) {
        int32_t ns = 0;
        const cb_segment *segs = cb_prompt_segments(p, &ns);
        int64_t total = 0;
        for (int32_t i = 0; i < ns; i++) {
            for (int32_t j = 0; j < segs[i].n; j++)
                FUZZ_CHECK(segs[i].ids[j] >= 0 && segs[i].ids[j] < nv);
            FUZZ_CHECK(segs[i].kv == NULL);
            total += segs[i].n;
        }
        FUZZ_CHECK(total == cb_prompt_n_tokens(p));
        FUZZ_CHECK(cb_prompt_n_chunks(p) >= 0 && (size_t)cb_prompt_n_chunks(p) <= nc);
    }
    cb_prompt_free(p);
    free(texts);
    json_decref(chunks);
    return 1;
}
