/* fuzz_model - cb_model_load on arbitrary GGUF bytes (seeded with tiny
 * fixture models in several tensor types), then, for a model that loads,
 * one forward pass of two tokens: a model the loader accepts must evaluate
 * without a memory error, whatever its metadata and shapes claim. */
#include "../../lib/infer/infer.h"
#include "fuzz.h"

static char *path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (asprintf(&path, "%s/model.gguf", fuzz_tmpdir()) < 0)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cb_model_params mp = {1, "cpu", 0, NULL};
    cb_model *m = NULL;
    cb_error err = {0};

    fuzz_write_file(path, data, size);
    cb_status st = cb_model_load(&m, path, &mp, &err);
    if (st != CB_OK) {
        FUZZ_CHECK(m == NULL && err.msg[0]);
        return 0;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    FUZZ_CHECK(hp->n_layer > 0 && hp->n_embd > 0 && hp->n_head > 0 && hp->n_head_kv > 0 &&
               hp->head_dim > 0);
    FUZZ_CHECK(hp->n_vocab > 0 && hp->n_vocab == cb_vocab_n_tokens(cb_model_vocab(m)));
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    float *logits = malloc(sizeof(float) * 2 * (size_t)hp->n_vocab);
    int32_t toks[2] = {0, hp->n_vocab - 1};
    if (logits && cb_kvcache_new(&kv, m, 8, CB_TYPE_F32) == CB_OK && cb_fwd_new(&f, m, 4) == CB_OK)
        cb_model_eval(f, kv, toks, 2, 0, logits);
    free(logits);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_model_free(m);
    return 0;
}
