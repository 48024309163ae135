/* diag.h - what lib/infer gives the tests and the diagnostics (make diag:
 * tests/bench/blend_diag.c) alone: a forward pass's hidden states and
 * queries read or set from outside, the probe's attention mass a layer at
 * a time.  The product (cb-run, the blend) never calls these; private to
 * libcbcore's tree, not installed. */
#ifndef CB_INFER_DIAG_H
#define CB_INFER_DIAG_H

#include "infer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The queries (RoPE applied) that the last cb_fwd_layer (or _qkv with q)
 * on f computed for its rows[from .. from+n), copied to q [n, n_head*hd];
 * what those rows attended with, without projecting them again.  Errors:
 * CB_ERR_RANGE (not rows of that call; a call that failed computed none). */
cb_status cb_fwd_layer_queries(const cb_fwd *f, int32_t from, int32_t n, float *q);
/* One layer's attention mass (infer.h, cb_fwd_mass_add) with its own copy
 * back: added to the host's mass[j] for every key j < n_keys (accumulated:
 * the caller zeroes it once and sums layers into it), the bits the sum on
 * the backend gets.  Errors: those of cb_fwd_mass_add. */
cb_status cb_fwd_attn_mass(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int32_t from, int32_t n,
                           int32_t n_keys, int by_value, float *mass);
/* The hidden state of row `row` after the layers run so far [n_embd]. */
cb_status cb_fwd_hidden(const cb_fwd *f, int32_t row, float *dst);
/* Replaces row `row`'s hidden state with src [n_embd]: the layers run
 * after it start from there (make diag's late:R:K, tests/bench/blend_diag). */
cb_status cb_fwd_set_hidden(cb_fwd *f, int32_t row, const float *src);

#ifdef __cplusplus
}
#endif
#endif /* CB_INFER_DIAG_H */
