/* precomputer.c - chunks' KV files computed alone (or, after
 * cb_precomputer_after, after the chunk before them or its neighbours)
 * and put into a store: what cb-precompute does for every record and
 * cb-run for the chunks it found without a cache; and a prompt's head,
 * prefilled alone. */
#include "prompt_impl.h"

#include <stdlib.h>
#include <string.h>

#define PC_BATCH 512 /* rows per prefill batch, and the cache's growth step */

struct cb_precomputer {
    const cb_model *m;
    cb_store *store;
    cb_type type;
    char *tier; /* NULL: the fastest tier with room */
    cb_tokens lead;
    cb_tokens sep;   /* what a prompt puts between chunks */
    cb_tokens after; /* lead, chunks each with sep: cb_precomputer_after's lead-in */
    int use_after;   /* key and run use it */
    cb_hash128 fp;
    cb_fwd *f;      /* PC_BATCH rows */
    cb_kvcache *kv; /* f32, kv_cap positions */
    int32_t kv_cap;
    void *file; /* the last KV file computed */
    size_t file_size;
};

static void store_head(cb_precomputer *pc);

cb_status cb_precomputer_new(cb_precomputer **out, const cb_model *m, cb_store *s, cb_type type,
                             const char *tier, cb_error *err)
{
    cb_precomputer *pc = calloc(1, sizeof *pc);
    cb_status st;

    if (!pc)
        return cb_error_set(err, CB_ERR_NOMEM, "precompute: out of memory");
    pc->m = m;
    pc->store = s;
    pc->type = type;
    pc->fp = cb_model_fingerprint(m);
    if (!cb_kv_type_ok(type)) {
        st = cb_error_set(err, CB_ERR_INVALID, "precompute: KV files of type %s are not supported",
                          cb_type_name(type) ? cb_type_name(type) : "?");
        goto fail;
    }
    if (tier && !(pc->tier = strdup(tier))) {
        st = cb_error_set(err, CB_ERR_NOMEM, "precompute: out of memory");
        goto fail;
    }
    if ((st = cb_kv_lead_in(m, &pc->lead)) != CB_OK) {
        cb_error_set(err, st, "precompute: the lead-in: %s", cb_strerror(st));
        goto fail;
    }
    if ((st = cb_kv_separator(m, &pc->sep)) != CB_OK) {
        cb_error_set(err, st, "precompute: the separator: %s", cb_strerror(st));
        goto fail;
    }
    if ((st = cb_fwd_new(&pc->f, m, PC_BATCH)) != CB_OK) {
        cb_error_set(err, st, "precompute: activations for %d tokens: %s", PC_BATCH,
                     cb_model_strerror(m, st));
        goto fail;
    }
    if (s)
        store_head(pc);
    *out = pc;
    return CB_OK;
fail:
    cb_precomputer_free(pc);
    return st;
}

void cb_precomputer_free(cb_precomputer *pc)
{
    if (!pc)
        return;
    free(pc->file);
    cb_kvcache_free(pc->kv);
    cb_fwd_free(pc->f);
    cb_tokens_free(&pc->lead);
    cb_tokens_free(&pc->sep);
    cb_tokens_free(&pc->after);
    free(pc->tier);
    free(pc);
}

/* The lead-in key and run put before the chunk. */
static const cb_tokens *lead_of(const cb_precomputer *pc)
{
    return pc->use_after ? &pc->after : &pc->lead;
}

const cb_tokens *cb_precomputer_lead(const cb_precomputer *pc) { return lead_of(pc); }

void cb_precomputer_key(const cb_precomputer *pc, const int32_t *ids, int32_t n, char key[66])
{
    const cb_tokens *lead = lead_of(pc);
    cb_kv_key(pc->fp, cb_kv_tokens_hash(lead->ids, (int32_t)lead->n, ids, n), key);
}

cb_status cb_precomputer_after(cb_precomputer *pc, const cb_tokens *prev, int n)
{
    cb_status st = CB_OK;
    pc->use_after = 0;
    if (n <= 0)
        return CB_OK;
    st = pr_lead_after(&pc->lead, prev[0].ids, prev[0].n, &pc->sep, &pc->after);
    for (int i = 1; i < n && st == CB_OK; i++) {
        for (size_t j = 0; j < prev[i].n && st == CB_OK; j++)
            st = cb_tokens_push(&pc->after, prev[i].ids[j]);
        for (size_t j = 0; j < pc->sep.n && st == CB_OK; j++)
            st = cb_tokens_push(&pc->after, pc->sep.ids[j]);
    }
    pc->use_after = st == CB_OK;
    return st;
}

cb_status cb_precomputer_middle(cb_precomputer *pc)
{
    cb_tokens mid = {0};
    cb_status st = pr_middle(pc->m, &mid);
    if (st == CB_OK)
        st = cb_precomputer_after(pc, &mid, 1);
    cb_tokens_free(&mid);
    return st;
}

/* The lead-in from now on: the head of prompts with this system message
 * (pr_head), so that such a prompt's first chunk is a true prefix and the
 * others follow the head they were computed after.  The head itself is
 * stored too (cb_precomputer_head), as the runs load it. */
cb_status cb_precomputer_system(cb_precomputer *pc, const char *system, cb_error *err)
{
    cb_tokens head = {0};
    size_t n;
    cb_status st = pr_head(pc->m, system, &head);
    if (st != CB_OK) {
        cb_tokens_free(&head);
        return cb_error_set(err, st, "precompute: the prompt's head: %s", cb_strerror(st));
    }
    cb_tokens_free(&pc->lead);
    pc->lead = head;
    pc->use_after = 0;
    return pc->store ? cb_precomputer_head(pc, system, &n, err) : CB_OK;
}

/* Grow the f32 cache to hold `need` positions, in steps of PC_BATCH, at
 * most n_ctx. */
static cb_status reserve(cb_precomputer *pc, int64_t need, int32_t n_ctx, cb_error *err)
{
    cb_status st;
    if (need <= pc->kv_cap)
        return CB_OK;
    int64_t want = (need + PC_BATCH - 1) / PC_BATCH * PC_BATCH;
    cb_kvcache_free(pc->kv);
    pc->kv = NULL;
    pc->kv_cap = (int32_t)(want < n_ctx ? want : n_ctx);
    if ((st = cb_kvcache_new(&pc->kv, pc->m, pc->kv_cap, CB_TYPE_F32)) != CB_OK) {
        cb_error_set(err, st, "precompute: a KV cache of %d positions: %s", (int)pc->kv_cap,
                     cb_model_strerror(pc->m, st));
        pc->kv_cap = 0;
    }
    return st;
}

/* The KV file of ids prefilled after the given lead-in. */
static cb_status run_lead(cb_precomputer *pc, const cb_tokens *lead, const int32_t *ids, int32_t n,
                          cb_error *err)
{
    int32_t n_ctx = cb_model_hparams(pc->m)->n_ctx_train;
    int64_t need = (int64_t)lead->n + n;
    cb_status st;

    free(pc->file);
    pc->file = NULL;
    if (n < 1)
        return cb_error_set(err, CB_ERR_INVALID, "precompute: an empty chunk");
    if (need > n_ctx)
        return cb_error_set(err, CB_ERR_RANGE,
                            lead == &pc->lead ? "chunk longer than the model's context"
                                              : "chunk and the one before it longer than "
                                                "the model's context");
    if ((st = reserve(pc, need, n_ctx, err)) != CB_OK)
        return st;
    st = cb_kv_precompute(pc->f, pc->kv, lead->ids, (int32_t)lead->n, ids, n, pc->type, &pc->file,
                          &pc->file_size);
    if (st != CB_OK) {
        pc->file = NULL;
        return cb_error_set(err, st, "precompute failed: %s", cb_model_strerror(pc->m, st));
    }
    return CB_OK;
}

cb_status cb_precomputer_run(cb_precomputer *pc, const int32_t *ids, int32_t n, cb_error *err)
{
    return run_lead(pc, lead_of(pc), ids, n, err);
}

cb_status cb_precomputer_store(cb_precomputer *pc, const char *key, cb_error *err)
{
    cb_status st;
    if (!pc->file)
        return cb_error_set(err, CB_ERR_INVALID, "precompute: no KV file to store");
    st = pc->tier ? cb_store_put_in(pc->store, key, pc->file, pc->file_size, pc->tier, err)
                  : cb_store_put(pc->store, key, pc->file, pc->file_size, err);
    free(pc->file);
    pc->file = NULL;
    return st;
}

cb_status pr_precompute_alone(cb_precomputer *pc, const int32_t *ids, int32_t n, const char *key,
                              cb_error *err)
{
    cb_tokens none = {0};
    cb_type t = pc->type;
    if (t != CB_TYPE_F32) /* a head is loaded as exact: f16 as the cache, never 8 bits */
        pc->type = CB_TYPE_F16;
    cb_status st = run_lead(pc, &none, ids, n, err);
    pc->type = t;
    return st == CB_OK ? cb_precomputer_store(pc, key, err) : st;
}

/* The head cb-run gives a prompt with this system message (NULL: none
 * given; BOS, the template's system turn and user opener: pr_head) as an
 * entry of its own, computed alone at positions 0.., unless the store has
 * it: every such prompt starts with it, and cb-run loads it as it is (an
 * exact prefix) instead of computing it.  *n_head: its length, 0 when it is
 * too short to be worth an entry (no chat template). */
cb_status cb_precomputer_head(cb_precomputer *pc, const char *system, size_t *n_head, cb_error *err)
{
    cb_tokens head = {0};
    char key[66];
    int found = 0;
    cb_status st;
    *n_head = 0;
    if (!pc->store)
        return cb_error_set(err, CB_ERR_INVALID, "precompute: no store for the prompt's head");
    if ((st = pr_head(pc->m, system, &head)) != CB_OK) {
        cb_error_set(err, st, "precompute: the prompt's head: %s", cb_strerror(st));
    } else if (head.n >= PR_HEAD_MIN) {
        *n_head = head.n;
        pr_head_key(pc->m, &head, key);
        if ((st = cb_store_has(pc->store, key, &found)) != CB_OK)
            cb_error_set(err, st, "precompute: the prompt's head %s: %s", key, cb_strerror(st));
        else if (!found)
            st = pr_precompute_alone(pc, head.ids, (int32_t)head.n, key, err);
    }
    cb_tokens_free(&head);
    return st;
}

/* The default head, when a precomputer is made (so a run of cb-precompute
 * over chunks all stored already adds it to an older store); a failure
 * costs only that saving. */
static void store_head(cb_precomputer *pc)
{
    size_t n;
    cb_error err;
    cb_precomputer_head(pc, NULL, &n, &err);
}
