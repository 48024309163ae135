/* bench_swa - what sliding-window attention changes for blending, measured
 * on a real model (Gemma-3-270M: window 512 on 15 of 18 layers).
 *
 * A prompt [BOS] [chunk 1] [sep] [chunk 2] [question] whose chunks are longer
 * than the window.  A chunk token at offset j >= W-1 has its whole window
 * inside its own chunk, in the prompt as when it was precomputed after BOS;
 * so its K/V in the sliding-window layers before the first global layer are
 * the cached ones exactly ("far" tokens), while a token nearer the chunk's
 * start sees other text in the prompt than it saw alone ("near" tokens).
 * Printed: per layer, the mean relative V deviation of the cached rows from
 * full prefill, near and far; then the first token's KL to full prefill of
 * full KV reuse and of blending (ratio 0.15) with the check at layer 1 and
 * at the layer after the first global one, with how many far tokens each
 * selected and what each cost.
 *
 * usage: bench_swa MODEL TEXTFILE [CHUNK_TOKENS] [THREADS]
 * (TEXTFILE: prose to cut the chunks from; CHUNK_TOKENS default 1024) */
#include "../../lib/infer/infer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double kl(const float *p, const float *q, int n) /* KL(softmax p || softmax q) */
{
    int same;
    return cb_logits_kl(p, q, n, &same);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b)
        b[n] = 0;
    fclose(f);
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_swa MODEL TEXTFILE [CHUNK_TOKENS] [THREADS]\n");
        return 64;
    }
    int L = argc > 3 ? atoi(argv[3]) : 1024;
    cb_model_params mp = {argc > 4 ? atoi(argv[4]) : 0, NULL, 0, NULL};
    cb_model *m;
    cb_error err;
    if (cb_model_load(&m, argv[1], &mp, &err) != CB_OK) {
        fprintf(stderr, "bench_swa: %s\n", err.msg);
        return 65;
    }
    const cb_hparams *hp = cb_model_hparams(m);
    const cb_vocab *v = cb_model_vocab(m);
    int nl = hp->n_layer, W = hp->n_swa, nv = hp->n_vocab;
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    if (W == 0) {
        fprintf(stderr, "bench_swa: %s has no sliding-window layers\n", argv[1]);
        return 65;
    }
    char *text = slurp(argv[2]);
    cb_tokens all = {0}, lead = {0}, sep = {0}, q = {0};
    const char *question = "\n\nQuestion: Which of the places named above is the oldest?\nAnswer:";
    if (!text || cb_tok_encode(v, text, strlen(text), 0, &all) != CB_OK ||
        all.n < (size_t)(2 * L)) {
        fprintf(stderr, "bench_swa: %s: need %d tokens of text\n", argv[2], 2 * L);
        return 66;
    }
    cb_kv_lead_in(m, &lead);
    cb_tok_encode(v, "\n\n", 2, 0, &sep);
    cb_tok_encode(v, question, strlen(question), 0, &q);
    int32_t total = (int32_t)(lead.n + 2 * L + sep.n + q.n);
    cb_fwd *f = NULL;
    cb_kvcache *pkv = NULL, *kfull = NULL, *kreuse = NULL, *kb = NULL;
    if (cb_fwd_new(&f, m, total) != CB_OK ||
        cb_kvcache_new(&pkv, m, (int32_t)lead.n + L, CB_TYPE_F32) != CB_OK) {
        fprintf(stderr, "bench_swa: out of memory\n");
        return 70;
    }
    /* the two chunks, precomputed alone after the lead-in, as f16 files */
    cb_kvfile *file[2];
    char tmpl[] = "/tmp/bench_swa.XXXXXX";
    if (!mkdtemp(tmpl))
        return 73;
    for (int c = 0; c < 2; c++) {
        void *buf;
        size_t size;
        char path[256];
        snprintf(path, sizeof path, "%s/chunk%d.cbkv", tmpl, c);
        if (cb_kv_precompute(f, pkv, lead.ids, (int32_t)lead.n, all.ids + c * L, L, CB_TYPE_F16,
                             &buf, &size) != CB_OK ||
            cb_file_write_atomic(path, buf, size, &err) != CB_OK ||
            cb_kvfile_open(&file[c], path, &err) != CB_OK) {
            fprintf(stderr, "bench_swa: precompute failed\n");
            return 70;
        }
        free(buf);
        unlink(path); /* the handle keeps it */
    }
    rmdir(tmpl);
    cb_segment segs[5] = {{lead.ids, (int32_t)lead.n, NULL},
                          {all.ids, L, file[0]},
                          {sep.ids, (int32_t)sep.n, NULL},
                          {all.ids + L, L, file[1]},
                          {q.ids, (int32_t)q.n, NULL}};
    int32_t start[2] = {(int32_t)lead.n, (int32_t)(lead.n + L + sep.n)};
    float *lf = malloc(sizeof(float) * nv), *lo = malloc(sizeof(float) * nv);
    cb_blend_params p = cb_blend_defaults();
    cb_blend_stats st;
    p.speedup = 0.0f; /* the default ratio, fixed */
    cb_kvcache_new(&kfull, m, total, CB_TYPE_F32);
    cb_kvcache_new(&kreuse, m, total, CB_TYPE_F32);
    cb_kvcache_new(&kb, m, total, CB_TYPE_F32);
    p.mode = CB_MODE_FULL;
    if (cb_blend_prefill(f, kfull, segs, 5, &p, lf, &st, &err) != CB_OK) {
        fprintf(stderr, "bench_swa: %s\n", err.msg);
        return 70;
    }
    double full_ms = st.prefill_ms;
    p.mode = CB_MODE_REUSE;
    cb_blend_prefill(f, kreuse, segs, 5, &p, lo, &st, &err);
    double kl_reuse = kl(lf, lo, nv);

    printf(
        "model %s: %d layers, window %d on %d of them; 2 chunks of %d tokens, prompt %d tokens\n",
        hp->arch, nl, W, hp->n_swa_layers, L, total);
    printf(
        "\nmean relative V deviation of the cached rows from full prefill, |V_full - V_cached|^2 / |V_full|^2\n");
    printf(
        "(near: chunk offset < W-1 = %d, the window reaches outside the chunk; far: the window is inside it)\n",
        W - 1);
    printf("| layer | window | near | far | far / near |\n|---|---|---|---|---|\n");
    float *a = malloc(sizeof(float) * (size_t)L * w), *b = malloc(sizeof(float) * (size_t)L * w);
    double glob_near = 0, glob_far = 0, loc_near = 0, loc_far = 0;
    int n_glob = 0, n_loc = 0;
    for (int l = 0; l < nl; l++) {
        double s[2] = {0, 0};
        int64_t cnt[2] = {0, 0};
        for (int c = 0; c < 2; c++) {
            cb_kvcache_read(kfull, l, 1, start[c], L, a);
            cb_kvcache_read(kreuse, l, 1, start[c], L, b);
            for (int j = 0; j < L; j++) {
                double num = 0, den = 0;
                for (int64_t e = 0; e < w; e++) {
                    double d = (double)a[j * w + e] - b[j * w + e];
                    num += d * d;
                    den += (double)a[j * w + e] * a[j * w + e];
                }
                int far = j >= W - 1;
                s[far] += num / (den > 0 ? den : 1);
                cnt[far]++;
            }
        }
        double near = cnt[0] ? s[0] / cnt[0] : 0, farv = cnt[1] ? s[1] / cnt[1] : 0;
        int win = cb_model_layer_window(m, l);
        printf("| %d | %s | %.3e | %.3e | %.3f |\n", l, win ? "local" : "GLOBAL", near, farv,
               near > 0 ? farv / near : 0);
        if (l > 0) { /* layer 0 is never reused in a blend */
            if (win)
                loc_near += near, loc_far += farv, n_loc++;
            else
                glob_near += near, glob_far += farv, n_glob++;
        }
    }
    printf("layers 1..%d: local near %.3e far %.3e; global near %.3e far %.3e\n", nl - 1,
           loc_near / n_loc, loc_far / n_loc, n_glob ? glob_near / n_glob : 0,
           n_glob ? glob_far / n_glob : 0);

    /* blend with the check at layer 1 and after the first global layer */
    int first_global = -1;
    for (int l = 0; l < nl && first_global < 0; l++)
        if (!cb_model_layer_window(m, l))
            first_global = l;
    printf("\nfirst-token KL to full prefill (full prefill %.0f ms)\n", full_ms);
    printf(
        "| mode | check layer | recomputed | of them far | KL | prefill ms |\n|---|---|---|---|---|---|\n");
    printf("| reuse | - | 0 | 0 | %.3e | - |\n", kl_reuse);
    int checks[2] = {1, first_global + 1};
    for (int i = 0; i < 2 && checks[i] < nl; i++) {
        p = cb_blend_defaults();
        p.speedup = 0.0f;
        p.check_layer = checks[i];
        cb_blend_prefill(f, kb, segs, 5, &p, lo, &st, &err);
        /* the far rows recomputed: their V in the last layer is not the loaded one */
        int n_far = 0;
        for (int c = 0; c < 2; c++) {
            cb_kvcache_read(kb, nl - 1, 1, start[c], L, a);
            cb_kvcache_read(kreuse, nl - 1, 1, start[c], L, b);
            for (int j = W - 1; j < L; j++)
                n_far += memcmp(a + j * w, b + j * w, sizeof(float) * (size_t)w) != 0;
        }
        printf("| blend 0.15 | %d | %d | %d | %.3e | %.0f |\n", checks[i], st.n_recomputed_tokens,
               n_far, kl(lf, lo, nv), st.prefill_ms);
    }
    free(a), free(b), free(lf), free(lo), free(text);
    cb_kvfile_free(file[0]), cb_kvfile_free(file[1]);
    cb_kvcache_free(pkv), cb_kvcache_free(kfull), cb_kvcache_free(kreuse), cb_kvcache_free(kb);
    cb_fwd_free(f);
    cb_tokens_free(&all), cb_tokens_free(&lead), cb_tokens_free(&sep), cb_tokens_free(&q);
    cb_model_free(m);
    return 0;
}
