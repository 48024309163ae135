/* records_run.c - cb-run's chunk-record reader (read_chunks) and prompt
 * assembly (build_prompt), compiled from src/cb-run.c itself so that the
 * fuzzer runs the program's own code; part of fuzz_records. */
#define main cb_run_main
#include "../../src/cb-run.c"
#undef main

#include "fuzz.h"

static char *t_slurp(const char *path, size_t *n)
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
 * are accepted, assemble a prompt from them: every chunk segment must hold
 * ids of the model's vocabulary and a key.  Returns 1 when accepted. */
int fuzz_run_records(const cb_model *m, const char *path)
{
    json_t *chunks = NULL;
    gen_opts o;
    prompt_t p = {0};
    cb_tokens lead = {0};
    int32_t nv = cb_vocab_n_tokens(cb_model_vocab(m));

    memset(&o, 0, sizeof o);
    if (read_chunks(path, &chunks) != 0) {
        FUZZ_CHECK(chunks == NULL);
        return 0;
    }
    FUZZ_CHECK(json_is_array(chunks));
    /* every line that is not blank is a record: none is dropped */
    size_t n = 0, lines = 0;
    char *all = t_slurp(path, &n);
    for (size_t i = 0, start = 0; i <= n; i++)
        if (i == n || all[i] == '\n') {
            int blank = 1;
            for (size_t j = start; j < i; j++)
                blank &= all[j] == ' ' || all[j] == '\t' || all[j] == '\r';
            lines += !blank;
            start = i + 1;
        }
    free(all);
    FUZZ_CHECK(json_array_size(chunks) == lines);
    for (size_t i = 0; i < json_array_size(chunks); i++)
        FUZZ_CHECK(json_is_string(json_object_get(json_array_get(chunks, i), "text")));
    FUZZ_CHECK(cb_kv_lead_in(m, &lead) == CB_OK);
    if (build_prompt(m, &o, "Which city?", 11, chunks, &lead, &p) == CB_OK) {
        int n_chunks = 0;
        for (int i = 0; i < p.n; i++) {
            for (size_t j = 0; j < p.s[i].toks.n; j++)
                FUZZ_CHECK(p.s[i].toks.ids[j] >= 0 && p.s[i].toks.ids[j] < nv);
            if (p.s[i].is_chunk) {
                n_chunks++;
                FUZZ_CHECK(p.s[i].toks.n > 0 && strlen(p.s[i].key) == CB_STORE_KEY_LEN);
            }
        }
        FUZZ_CHECK(n_chunks == p.n_chunks && (size_t)n_chunks <= json_array_size(chunks));
    }
    prompt_free(&p);
    cb_tokens_free(&lead);
    json_decref(chunks);
    return 1;
}
