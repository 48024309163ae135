/* bench_load - the blend's KV loader (lib/kv/blend_load.c) by its readers:
 * CHUNKS cached chunks of TOKENS tokens each (one chunk's KV, precomputed
 * once, written to CHUNKS files, read hot from the page cache) loaded into
 * a prompt's cache at new positions, every layer of every chunk read,
 * checked and placed (keys moved), with cb_blend_params.sequential_load so
 * that nothing is computed beside it: the loader's busy time (--stats'
 * load_ms) for each count of reader threads, the counts measured in turn,
 * REPS rounds, the median.  On the CPU the placing (the keys' move) is
 * computed on the cores the readers share; on a device (CB_BENCH_DEVICE=
 * cuda) it is queued, and the reading is the loader's work.
 *
 * usage: bench_load MODEL [CHUNKS [TOKENS [REPS [THREADS,...]]]]
 *   (defaults 6, 512, 5, "1,2"; THREADS 0: the backend's choice)
 * Prints "load_T_ms", "load_T_gb_s" and "load_T_threads" lines. */
#include "../../lib/kv/kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_CHUNKS = 64, MAX_COUNTS = 16 };

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_load MODEL [CHUNKS [TOKENS [REPS [THREADS,...]]]]\n");
        return 64;
    }
    int n_chunks = argc > 2 ? atoi(argv[2]) : 6, n_tok = argc > 3 ? atoi(argv[3]) : 512;
    int reps = argc > 4 ? atoi(argv[4]) : 5, counts[MAX_COUNTS], n_counts = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", argc > 5 ? argv[5] : "1,2");
    for (char *t = strtok(list, ","); t && n_counts < MAX_COUNTS; t = strtok(NULL, ","))
        counts[n_counts++] = atoi(t);
    if (n_chunks < 1 || n_chunks > MAX_CHUNKS || n_tok < 1 || reps < 1 || n_counts == 0) {
        fprintf(stderr, "bench_load: bad arguments\n");
        return 64;
    }
    const char *dev = getenv("CB_BENCH_DEVICE");
    cb_model_params mp = {0, dev && *dev ? dev : "cpu", 0, NULL};
    cb_model *m = NULL;
    cb_error err;
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK) {
        fprintf(stderr, "bench_load: %s\n", err.msg);
        return 65;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    cb_tokens lead = {0};
    cb_kv_lead_in(m, &lead);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_tok), q[8];
    for (int i = 0; i < n_tok; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    for (int i = 0; i < 8; i++)
        q[i] = (int32_t)((i * 104729 + 7) % hp->n_vocab);
    /* one chunk's KV, precomputed after the lead-in, in CHUNKS files */
    int32_t total = (int32_t)lead.n + n_chunks * n_tok + 8;
    cb_fwd *f = NULL;
    cb_kvcache *kv = NULL;
    void *buf = NULL;
    size_t size = 0;
    if (cb_fwd_new(&f, m, total) != CB_OK || cb_kvcache_new(&kv, m, total, CB_TYPE_F16) != CB_OK ||
        cb_kv_precompute(f, kv, lead.ids, (int32_t)lead.n, ids, n_tok, CB_TYPE_F16, &buf, &size) !=
            CB_OK) {
        fprintf(stderr, "bench_load: cannot precompute the chunk\n");
        return 70;
    }
    char dir[] = "/tmp/bench_load.XXXXXX", path[MAX_CHUNKS][300];
    cb_kvfile *kf[MAX_CHUNKS];
    cb_segment segs[MAX_CHUNKS + 2];
    int32_t ns = 0;
    if (!mkdtemp(dir))
        return 70;
    segs[ns++] = (cb_segment){lead.ids, (int32_t)lead.n, NULL};
    for (int c = 0; c < n_chunks; c++) {
        snprintf(path[c], sizeof path[c], "%s/chunk-%d.cbkv", dir, c);
        if (cb_file_write_atomic(path[c], buf, size, &err) != CB_OK ||
            cb_kvfile_open(&kf[c], path[c], &err) != CB_OK) {
            fprintf(stderr, "bench_load: %s\n", err.msg);
            return 70;
        }
        segs[ns++] = (cb_segment){ids, n_tok, kf[c]};
    }
    segs[ns++] = (cb_segment){q, 8, NULL};
    printf("device %s\nload_chunks %d\nload_tokens %d\nload_file_mb %.2f\n", cb_model_device(m),
           n_chunks, n_tok, (double)size / 1e6);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    double *ms = malloc(sizeof(double) * (size_t)(reps * n_counts));
    int32_t used[MAX_COUNTS] = {0};
    uint64_t bytes = 0;
    for (int r = -1; r < reps; r++) /* round -1: the files into the page cache */
        for (int i = 0; i < n_counts; i++) {
            cb_blend_params p = cb_blend_defaults();
            cb_blend_stats st;
            p.mode = CB_MODE_REUSE;
            p.sequential_load = 1;
            p.load_threads = counts[i];
            if (cb_blend_prefill(f, kv, segs, ns, &p, logits, &st, &err) != CB_OK) {
                fprintf(stderr, "bench_load: %s\n", err.msg);
                return 70;
            }
            if (r >= 0)
                ms[i * reps + r] = st.load_ms;
            used[i] = st.load_threads, bytes = st.load_bytes;
        }
    for (int i = 0; i < n_counts; i++) {
        double *v = ms + i * reps, med;
        qsort(v, (size_t)reps, sizeof *v, cmp_d);
        med = reps % 2 ? v[reps / 2] : (v[reps / 2 - 1] + v[reps / 2]) / 2;
        printf("load_%d_ms %.2f\nload_%d_gb_s %.2f\nload_%d_threads %d\n", counts[i], med,
               counts[i], (double)bytes / med / 1e6, counts[i], used[i]);
    }
    for (int c = 0; c < n_chunks; c++) {
        cb_kvfile_free(kf[c]);
        unlink(path[c]);
    }
    rmdir(dir);
    free(buf), free(ids), free(logits), free(ms);
    cb_tokens_free(&lead);
    cb_kvcache_free(kv);
    cb_fwd_free(f);
    cb_model_free(m);
    return 0;
}
