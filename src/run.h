/* run.h - what the parts of cb-run share: its options (gen_opts), what
 * --stats reports of one answer, and the entry points of a single answer
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

/* What --stats reports of one answer (a lone run's, or each --batch
 * answer's "stats"). */
typedef struct stats_src {
    const cb_blend_params *bp;
    const cb_blend_stats *bs;
    int64_t total;
    const cb_gen_result *gr;
    double gen_ms, t_load;
    int n_chunks, n_missing, n_stored, n_after, n_own;
    cb_chat_kind chat;
    const char *ratio_source; /* with ratio_auto */
    const cb_ratio_choice *rc;
    int ratio_auto;
    const cb_score_result *score; /* or NULL */
} stats_src;

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
/* One answer's --stats object (new reference). */
json_t *gen_stats_json(const gen_opts *o, const cb_model *m, const stats_src *ss);
/* The store's "shared" and "store" blocks into s. */
void gen_store_stats(json_t *s, cb_store *st);

/* Answer one prompt (text, len) and print it: an exit code. */
int run_generate(const gen_opts *o, const char *text, size_t len);
/* Answer the questions of a JSON Lines file (path, '-' stdin) in batches of
 * size (0: as the budget allows) within budget bytes of KV: an exit code. */
int run_batch(const gen_opts *o, const char *path, int32_t size, uint64_t budget);

#endif
