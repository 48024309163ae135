/* run.h - what the parts of cb-run share: its options (gen_opts), the
 * model, store and --stats helpers, and the entry points of a single answer
 * (run-answer.c) and of --batch (run-batch.c).  Options, help and main are
 * cb-run.c's. */
#ifndef CB_RUN_H
#define CB_RUN_H

#include "cli.h"

#include <jansson.h>

typedef struct gen_opts {
    const char *model, *system, *stats_path, *in_name, *store_dir, *chunks_path, *logits_out,
        *device;
    const char *score, *score_file; /* --score TEXT, --score-file FILE */
    int raw, n_predict, n_ctx, n_threads, verify, store_write, ratio_auto, min_ratio_given;
    int no_context;                 /* --tune no-context */
    int ratio_given, speedup_given; /* --ratio or --tune ratios; --speedup */
    double min_ratio;
    cb_type kv_type;
    cb_sampler_params sp;
    cb_blend_params bp;
    int mode_given;
    const char **stops;
    int n_stops;
} gen_opts;

/* cli_err's "warning: MSG", as the library's warning callback. */
void gen_warn(void *ctx, const char *msg);
/* --chunks' records (into *chunks) and the model (its load time into
 * *t_load); -c within the context the model was trained for.  0 or an exit code. */
int gen_open_model(const gen_opts *o, json_t **chunks, cb_model **m, double *t_load);
/* The store (created when it will be written): a missing one is a warning,
 * every chunk then computed.  0 or an exit code. */
int gen_open_store(const gen_opts *o, cb_store **s);
/* The store's profile's cost figures for this model and backend into bp
 * (zeros, the built-in figures, where it has none). */
void gen_profile_costs(const cb_store *s, const cb_model *m, cb_blend_params *bp);
/* One answer's --stats object (cb_answer_to_json's, parsed: a new
 * reference), with the store's counters unless st is NULL; NULL when out
 * of memory. */
json_t *gen_stats_json(const cb_answer *a, const cb_model *m, cb_store *st);

/* Answer one prompt (text, len) and print it: an exit code. */
int run_generate(const gen_opts *o, const char *text, size_t len);
/* Answer the questions of a JSON Lines file (path, '-' stdin) in batches of
 * size (0: as the budget allows) within budget bytes of KV: an exit code. */
int run_batch(const gen_opts *o, const char *path, int32_t size, uint64_t budget);

#endif
