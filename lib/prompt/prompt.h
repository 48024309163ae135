/* prompt.h - what lib/prompt (prompts, generation, batches, the
 * precomputer) declares beyond cbcore.h, for its own files and the tests
 * (private to libcbcore: not installed).  Includes only the layers below. */
#ifndef CB_PROMPT_H
#define CB_PROMPT_H

#include "../store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ generation */

/* Generations decoded together: sequences join after their prefills and
 * leave when done, and each step evaluates one token of every active
 * sequence in one cb_fwd_decode (the weights read once for all of them).
 * A sequence's tokens, text and result are exactly those cb_generate gives
 * it alone with the same parameters (cb_generate is a batch of one).  The
 * batch borrows the model, the caches and the stop strings; it owns its
 * decoding activations (cb_fwd_decode_rows(m, cap) rows), a sampler and
 * the logits of each sequence. */
typedef struct cb_gen_batch cb_gen_batch;

/* A batch of up to cap sequences on model m.  Errors: CB_ERR_INVALID (cap
 * < 1), CB_ERR_NOMEM. */
cb_status cb_gen_batch_new(cb_gen_batch **out, const cb_model *m, int32_t cap);
/* Free it (the caches are the callers'); accepts NULL. */
void cb_gen_batch_free(cb_gen_batch *b);
/* Add a sequence after a prefill of pos tokens into kv whose last logits
 * are `logits` (n_vocab floats, copied): it generates as cb_generate does
 * (p, emit, ctx and t0 as there; p is copied, its stop strings borrowed
 * until the sequence is taken).  *slot receives its slot, until
 * cb_gen_batch_take.  Errors: CB_ERR_RANGE (no free slot, pos outside
 * kv), CB_ERR_INVALID (kv is an active sequence's), CB_ERR_NOMEM. */
cb_status cb_gen_batch_add(cb_gen_batch *b, cb_kvcache *kv, const float *logits, int32_t pos,
                           const cb_gen_params *p,
                           cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx,
                           double t0, int32_t *slot);
/* Sequences still generating. */
int32_t cb_gen_batch_active(const cb_gen_batch *b);
/* One step: every active sequence samples a token, hands its text on, and
 * either ends (end of generation, a stop string, its n_predict, the end of
 * its cache, or an error of its own) or has its token evaluated with the
 * others' in one cb_fwd_decode.  The slots that ended in this step go to
 * done[] (cap entries at most), their count to *n_done; take them with
 * cb_gen_batch_take.  Returns the decode step's status: when it fails,
 * every sequence in it ends with that status (the batch stays usable). */
cb_status cb_gen_batch_step(cb_gen_batch *b, int32_t *done, int32_t *n_done);
/* The result of an ended sequence, and its status (CB_OK, or the error it
 * ended with: emit's, CB_ERR_NOMEM, the forward pass's); logits (may be
 * NULL) receive its last logits.  Frees the slot.  CB_ERR_RANGE for a
 * slot that is free or still generating. */
cb_status cb_gen_batch_take(cb_gen_batch *b, int32_t slot, cb_gen_result *res, float *logits);

/* --------------------------------------------------------------- prompts */

/* cb_prompt_build_from (cbcore.h): cb_prompt_build with chunks given by
 * text, by key, or both (the key names the cache cb_prompt_attach tries
 * first, after the chunk's cache after the chunk before it; where it is
 * not in s, not the chunk's tokens or computed after another prompt head,
 * a warning and the text's own caches).  A keyed chunk's
 * tokens are the ones its KV file in store s holds (the file is opened as
 * cb_store_open_kv does and attached at once, so cb_prompt_attach leaves
 * it be, unless it finds the chunk's cache computed after the chunk before
 * it); a text chunk is as in cb_prompt_build.  Errors: those of
 * cb_prompt_build, and for a keyed chunk (err names the key):
 * CB_ERR_FORMAT (not a key), CB_ERR_NOT_FOUND (s is NULL or does not hold
 * it), CB_ERR_MISMATCH (a file of another model, or whose tokens are not
 * the key's), and cb_store_open_kv's. */
/* The lead-in chunks were keyed with (cb_kv_lead_in). */
const cb_tokens *cb_prompt_lead(const cb_prompt *p);

/* ------------------------------------------------------------- batches */

/* The model and the store (NULL: none) the batch was made on. */
const cb_model *cb_batch_model(const cb_batch *b);
cb_store *cb_batch_store(const cb_batch *b);

#ifdef __cplusplus
}
#endif
#endif /* CB_PROMPT_H */
