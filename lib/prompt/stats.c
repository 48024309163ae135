/* stats.c - the statistics of an answer and of a batch as JSON (cb-run(1)'s
 * --stats): built here once, from the blend's stats and plan, the answer's
 * counts and timings, the store's counters and the backend's features, so
 * that a lone answer and each answer of a batch report the same keys the
 * same way. */
#include "prompt.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* cb_blend_mode's names, as cb-run's --mode takes them */
static const char *const mode_names[] = {"full", "prefix", "reuse", "blend"};

static const char *mode_name(cb_blend_mode m)
{
    return (unsigned)m < sizeof mode_names / sizeof mode_names[0] ? mode_names[m] : "?";
}

static const char *strategy_name(int s)
{
    const char *n = cb_blend_strategy_name((cb_blend_strategy)s);
    return n ? n : "?";
}

/* Where the ratio came from: the controller (--ratio auto), the mode, the
 * adaptive mass, the speedup, or the ratio given. */
static const char *ratio_source(const cb_answer *a)
{
    const cb_blend_params *bp = &a->bp;
    return strcmp(a->ratio_source, "given") != 0 ? a->ratio_source
           : bp->mode != CB_MODE_BLEND           ? "mode"
           : bp->adapt_mass > 0                  ? "adaptive"
           : bp->speedup > 0                     ? "speedup"
                                                 : "given";
}

/* The plan the blend resolved before any layer ran (cb_blend_prefill):
 * its ratio, where it came from and what bounded it, the strategy, the
 * keys' temperature, the stale scale, and the cost model's figures, each
 * with its source: the store's profile (cb-profile(1)) or the built-in. */
static json_t *plan_json(const cb_answer *a)
{
    const cb_blend_params *bp = &a->bp;
    const cb_blend_stats *bs = &a->bs;
    const char *src = ratio_source(a);
    const float fig[3] = {bs->costs.load, bs->costs.attn, bs->costs.score};
    const char *const names[3] = {"load", "attn", "score"};
    json_t *costs = json_object();
    for (int i = 0; i < 3; i++)
        json_object_set_new(costs, names[i],
                            json_pack("{s:f, s:s}", "value", (double)fig[i], "source",
                                      bs->costs_given >> i & 1 ? "profile" : "built-in"));
    json_t *p = json_pack(
        "{s:f, s:s, s:s, s:o, s:f, s:f, s:o}", "ratio", (double)bs->plan_ratio, "ratio_source", src,
        "bound", bs->plan_bound ? bs->plan_bound : "given", "strategy",
        bp->mode == CB_MODE_BLEND ? json_string(strategy_name(bs->strategy)) : json_null(),
        "key_temp", (double)bs->key_temp, "stale_scale", (double)bs->stale_scale, "costs", costs);
    if (p && strcmp(src, "speedup") == 0)
        json_object_set_new(p, "speedup", json_real((double)bp->speedup));
    if (p && bp->ratio_auto && bp->mode == CB_MODE_BLEND)
        json_object_set_new(p, "predicted",
                            json_pack("{s:f, s:f}", "load", (double)bs->pred_load, "recompute",
                                      (double)bs->pred_recompute));
    return p;
}

/* The counts, times and parameters every answer reports. */
static json_t *answer_core(const cb_answer *a, const cb_model *m)
{
    const cb_blend_params *bp = &a->bp;
    const cb_blend_stats *bs = &a->bs;
    const cb_gen_result *gr = &a->gen;
    json_t *sel = json_array();

    for (int i = 0; bp->mode == CB_MODE_BLEND && i < bp->n_ratios; i++)
        json_array_append_new(sel, json_integer(bs->n_selected[i]));
    return json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:o, s:f, s:f, s:s, s:i, "
        "s:i, s:i, s:i, s:s, s:s, s:i, s:s, s:s, s:s, s:s, s:f, s:s, s:f, s:f, s:I, s:i, s:f, s:i, "
        "s:f}",
        "mode", mode_name(bp->mode), "n_prompt_tokens", (json_int_t)a->n_prompt_tokens,
        "n_cached_tokens", (json_int_t)bs->n_cached_tokens, "n_exact_tokens",
        (json_int_t)bs->n_exact_tokens, "n_recomputed_tokens", (json_int_t)bs->n_recomputed_tokens,
        "ratio", (double)bs->ratio, "ttft_ms", gr->first_ms, "prefill_ms", bs->prefill_ms,
        "load_ms", bs->load_ms, "n_gen_tokens", (json_int_t)gr->n_gen, "gen_ms", a->gen_ms,
        "recompute_ms", bs->recompute_ms, "n_selected", sel, "prefill_tok_s",
        a->n_prompt_tokens / (bs->prefill_ms / 1e3), "gen_tok_s",
        gr->n_gen ? gr->n_gen / (a->gen_ms / 1e3) : 0.0, "stop", gr->stop, "n_chunks", a->n_chunks,
        "n_chunks_missing", a->n_missing, "n_chunks_stored", a->n_stored, "check_layer",
        bp->check_layer, "strategy", strategy_name(bp->strategy), "deviation",
        bp->deviation_v ? "v" : "k", "threads", cb_model_threads(m), "backend", cb_model_backend(m),
        "device", cb_model_device(m), "chat_template", cb_chat_name(a->chat), "kv_type",
        cb_type_name(a->kv_type), "model_load_ms", cb_model_load_ms(m), "model", cb_model_path(m),
        "overlapped_ms", bs->overlapped_ms, "stall_ms", bs->stall_ms, "load_bytes",
        (json_int_t)bs->load_bytes, "probe_rows", bp->probe_rows, "probe_depth",
        (double)bp->probe_depth, "probe_layers", bs->probe_layers, "key_temp",
        (double)bs->key_temp);
}

/* The ratio's policy: the controller's prediction (--ratio auto), the
 * speedup's or the adaptive mass's bounds, the plan, and a score. */
static void answer_policy(json_t *s, const cb_answer *a)
{
    const cb_blend_params *bp = &a->bp;
    const cb_blend_stats *bs = &a->bs;
    if (strcmp(a->ratio_source, "given") != 0) {
        json_object_set_new(s, "ratio_source", json_string(a->ratio_source));
        if (a->rc.tier[0])
            json_object_set_new(s, "tier", json_string(a->rc.tier));
    }
    if (bp->mode == CB_MODE_BLEND && bp->n_ratios == 1)
        json_object_set_new(s, "predicted_speedup", json_real(bs->pred_speedup));
    if (bp->speedup > 0 && bp->adapt_mass == 0 && bp->mode == CB_MODE_BLEND) {
        json_object_set_new(s, "ratio_source", json_string("speedup"));
        json_object_set_new(s, "speedup",
                            json_pack("{s:f, s:f, s:s}", "target", (double)bp->speedup, "min_ratio",
                                      (double)bp->ratios[0], "bound", bs->ratio_bound));
    }
    if (bp->adapt_mass > 0 && bp->mode == CB_MODE_BLEND) {
        json_object_set_new(s, "ratio_source", json_string("adaptive"));
        json_object_set_new(s, "adaptive",
                            json_pack("{s:f, s:f, s:f, s:f, s:s}", "mass", bp->adapt_mass,
                                      "selected_mass", bs->selected_mass, "min_ratio",
                                      bp->adapt_min, "max_ratio", bp->adapt_max, "bound",
                                      bs->ratio_bound));
    }
    if (bp->mode != CB_MODE_FULL)
        json_object_set_new(s, "plan", plan_json(a));
    if (a->scored)
        json_object_set_new(s, "score",
                            json_pack("{s:f, s:I, s:f}", "nll", a->score.nll, "n_tokens",
                                      (json_int_t)a->score.n_tokens, "top1", a->score.top1));
}

/* "cuda_features": the CUDA backend's features, each on or off (the
 * backend's list, "-" before those off); none on another backend. */
static void features_json(json_t *s, const cb_model *m)
{
    const char *f = cb_model_features(m);
    json_t *o;
    if (strcmp(cb_model_backend(m), "cuda") != 0 || !(o = json_object()))
        return;
    while (*f) {
        size_t n = strcspn(f, " ");
        int on = *f != '-';
        const char *name = f + !on;
        size_t nn = strcspn(name, " (");
        char key[32];
        if (nn > 0 && nn < sizeof key) {
            memcpy(key, name, nn), key[nn] = 0;
            json_object_set_new(o, key, json_boolean(on));
        }
        f += n;
        f += strspn(f, " ");
    }
    json_object_set_new(s, "cuda_features", o);
}

/* "shared" and "store": how the shared tier is secured and what it
 * refused; the entries the store dropped as bad when read (to be computed
 * and put again) and the puts that a tier's full file system sent to a
 * later tier. */
static void store_json(json_t *s, cb_store *st)
{
    cb_store_shared_auth sa;
    cb_store_tier_stat ts[CB_STORE_MAX_TIERS + 1];
    cb_error e2;
    uint64_t healed = 0, full = 0;
    int n = cb_store_n_tiers(st);
    if (cb_store_shared_name(st) && cb_store_shared_auth_info(st, &sa, &e2) == CB_OK)
        json_object_set_new(s, "shared",
                            json_pack("{s:s, s:b, s:b, s:I, s:I}", "tier", cb_store_shared_name(st),
                                      "authenticated", sa.authenticated, "login_refused",
                                      sa.login_refused, "n_refused", (json_int_t)sa.n_refused,
                                      "n_resealed", (json_int_t)sa.n_resealed));
    if (cb_store_stat(st, ts, NULL, &e2) == CB_OK)
        for (int i = 0; i < n; i++)
            healed += ts[i].healed, full += ts[i].full;
    if (cb_store_shared_name(st)) {
        cb_store_shared_stat(st, &ts[n], &e2); /* its count even when it is down */
        healed += ts[n].healed;
    }
    json_object_set_new(
        s, "store",
        json_pack("{s:I, s:I}", "n_healed", (json_int_t)healed, "n_full", (json_int_t)full));
}

/* The object as text, malloc'd, s released; CB_ERR_NOMEM when either
 * failed. */
static cb_status dump(json_t *s, char **json)
{
    *json = s ? json_dumps(s, JSON_COMPACT) : NULL;
    json_decref(s);
    return *json ? CB_OK : CB_ERR_NOMEM;
}

/* The object is built whole, then written: *json is NULL unless it
 * returns CB_OK (CB_ERR_NOMEM: out of memory), the caller's to free.
 * "ratio_source" is reported where --ratio auto chose the ratio
 * (a->ratio_source "controller"), the controller's prediction in the plan. */
cb_status cb_answer_to_json(const cb_answer *a, const cb_model *m, cb_store *st, char **json)
{
    const cb_blend_stats *bs = &a->bs;
    json_t *s = answer_core(a, m);
    if (s) {
        json_object_set_new(s, "stale_scale", json_real((double)bs->stale_scale));
        json_object_set_new(s, "probe_weight", json_string(a->bp.probe_values ? "value" : "none"));
        json_object_set_new(s, "probe_passages", json_integer(a->bp.probe_passages));
        json_object_set_new(s, "stall_clock",
                            json_string(bs->stall_clock ? bs->stall_clock : "host"));
        json_object_set_new(s, "load_threads", json_integer(bs->load_threads));
        json_object_set_new(s, "n_chunks_after", json_integer(a->n_after));
        json_object_set_new(s, "n_chunks_system", json_integer(a->n_own));
        json_object_set_new(s, "n_chunks_named", json_integer(a->n_named));
        json_object_set_new(s, "n_chunks_middle", json_integer(a->n_middle));
        json_object_set_new(s, "strategy_used",
                            a->bp.mode == CB_MODE_BLEND ? json_string(strategy_name(bs->strategy))
                                                        : json_null());
        answer_policy(s, a);
        features_json(s, m);
        if (st)
            store_json(s, st);
    }
    return dump(s, json);
}

/* The batch's totals (cb_batch_info) over wall_ms, its model's, and its
 * store's counters; *json as cb_answer_to_json's. */
cb_status cb_batch_to_json(const cb_batch *b, double wall_ms, char **json)
{
    const cb_batch_info *in = cb_batch_get_info(b);
    const cb_model *m = cb_batch_model(b);
    cb_store *st = cb_batch_store(b);
    json_t *s = json_pack(
        "{s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:i, s:i, s:I, s:I, s:I, s:f, s:s, s:s}",
        "n_questions", (json_int_t)in->n_submitted, "n_answered", (json_int_t)in->n_answered,
        "n_failed", (json_int_t)in->n_failed, "n_gen_tokens", (json_int_t)in->n_tokens, "wall_ms",
        wall_ms, "questions_s", in->n_submitted / (wall_ms / 1e3), "gen_tok_s",
        in->n_tokens / (wall_ms / 1e3), "batch_size", in->cap, "in_flight_peak", in->in_flight_peak,
        "kv_budget", (json_int_t)in->kv_budget, "kv_peak", (json_int_t)in->kv_peak, "n_steps",
        (json_int_t)in->n_steps, "model_load_ms", cb_model_load_ms(m), "model", cb_model_path(m),
        "device", cb_model_device(m));
    if (s) {
        features_json(s, m);
        if (st)
            store_json(s, st);
    }
    return dump(s, json);
}
