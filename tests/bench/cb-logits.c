/* cb-logits - for `make parity`: read lines of space-separated token ids on
 * stdin, evaluate each line as a fresh prompt (positions 0..n-1) and write
 * the last position's logits to stdout as n_vocab little-endian float32.
 * usage: cb-logits MODEL [THREADS] < ids.txt > logits.f32
 * $CB_DEVICE picks the device (default cpu); $CB_EXACT=1 the exact path
 * (default: 8-bit activations, as the programs); $CB_LOGITS_ALL=1 every
 * position's logits, n rows a line (the tokens fed one at a time, as
 * decode: on the 8-bit path a row's products do not depend on its batch). */
#include "../../lib/infer/infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    cb_model *m;
    cb_error err;
    const char *ex = getenv("CB_EXACT"), *la = getenv("CB_LOGITS_ALL");
    int all = la && strcmp(la, "1") == 0;
    cb_model_params mp = {argc > 2 ? atoi(argv[2]) : 0, getenv("CB_DEVICE"), /* NULL: the CPU */
                          ex && strcmp(ex, "1") == 0, NULL};
    static char line[1 << 20];

    if (argc < 2) {
        fprintf(stderr, "usage: cb-logits MODEL [THREADS] < ids.txt > logits.f32\n");
        return 64;
    }
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK) {
        fprintf(stderr, "cb-logits: %s\n", err.msg);
        return 65;
    }
    int nv = cb_model_hparams(m)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)nv);
    while (fgets(line, sizeof line, stdin)) {
        cb_tokens ids = {0};
        char *p = line, *end;
        for (long v = strtol(p, &end, 10); end != p; v = strtol(p, &end, 10)) {
            cb_tokens_push(&ids, (int32_t)v);
            p = end;
        }
        if (ids.n == 0)
            continue;
        cb_kvcache *kv;
        cb_fwd *f;
        int step = all ? 1 : (int)ids.n;
        if (cb_kvcache_new(&kv, m, (int32_t)ids.n, CB_TYPE_F16) != CB_OK ||
            cb_fwd_new(&f, m, step) != CB_OK) {
            fprintf(stderr, "cb-logits: evaluation failed\n");
            return 70;
        }
        for (int i = 0; i < (int)ids.n; i += step) {
            if (cb_model_eval(f, kv, ids.ids + i, step, i, logits) != CB_OK) {
                fprintf(stderr, "cb-logits: evaluation failed\n");
                return 70;
            }
            fwrite(logits, sizeof(float), (size_t)nv, stdout);
        }
        cb_fwd_free(f);
        cb_kvcache_free(kv);
        cb_tokens_free(&ids);
    }
    free(logits);
    cb_model_free(m);
    return fclose(stdout) == 0 ? 0 : 74;
}
