/* cb-ref-logits - for `make parity`: the reference transformer's logits
 * (tests/unit/refmodel.h: double precision, plain loops) on a real model.
 * Reads lines of space-separated token ids on stdin, evaluates each as a
 * fresh prompt (positions 0..n-1) and writes the last position's logits as
 * n_vocab little-endian float64 ($CB_LOGITS_ALL=1: every position's, n rows
 * a line).  Slow (seconds per prompt on a 270M model)
 * and memory-hungry (the weights as f32): a check, not an engine.
 * usage: cb-ref-logits MODEL < ids.txt > logits.f64 */
#include "../unit/refmodel.h"

int main(int argc, char **argv)
{
    static char line[1 << 20];
    ref r = {0};

    if (argc != 2) {
        fprintf(stderr, "usage: cb-ref-logits MODEL < ids.txt > logits.f64\n");
        return 64;
    }
    if (ref_load(&r, argv[1]) != 0) {
        fprintf(stderr, "cb-ref-logits: %s: cannot load\n", argv[1]);
        return 65;
    }
    const char *la = getenv("CB_LOGITS_ALL");
    int all = la && strcmp(la, "1") == 0;
    double *logits = malloc(sizeof(double) * (size_t)r.n_vocab);
    int32_t *ids = malloc(sizeof(int32_t) * (sizeof line / 2));
    if (!logits || !ids)
        return 70;
    while (fgets(line, sizeof line, stdin)) {
        int n = 0;
        char *p = line, *end;
        for (long v = strtol(p, &end, 10); end != p; v = strtol(p, &end, 10)) {
            if (v < 0 || v >= r.n_vocab) {
                fprintf(stderr, "cb-ref-logits: token id %ld out of range\n", v);
                return 65;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
        if (n == 0)
            continue;
        size_t nw = (size_t)r.n_vocab * (size_t)(all ? n : 1);
        if (all && !(logits = realloc(logits, sizeof(double) * nw)))
            return 70;
        ref_forward_at(&r, ids, n, logits, !all);
        if (fwrite(logits, sizeof(double), nw, stdout) != nw)
            return 74;
    }
    ref_free(&r);
    free(logits);
    free(ids);
    return fclose(stdout) == 0 ? 0 : 74;
}
