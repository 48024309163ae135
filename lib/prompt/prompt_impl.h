/* prompt_impl.h - what the files of lib/prompt share (private). */
#ifndef CB_PROMPT_IMPL_H
#define CB_PROMPT_IMPL_H

#include "prompt.h"

/* Format a message and hand it to warn(ctx, msg); nothing when warn is
 * NULL.  (prompt.c) */
void pr_warnf(void (*warn)(void *ctx, const char *msg), void *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A chunk's lead-in when computed after prev, the chunk before it in its
 * document (the context a prompt gives it when prev comes right before
 * it): out = lead, prev, sep (out emptied first).  (prompt.c) */
cb_status pr_lead_after(const cb_tokens *lead, const int32_t *prev, size_t n_prev,
                        const cb_tokens *sep, cb_tokens *out);

/* The passage a chunk is computed after to stand as it does in the middle
 * of a prompt (after the head and other passages), not as its first
 * chunk: a fixed text, so that cb-run finds the cache by the chunk alone
 * (out emptied first).  (prompt.c) */
cb_status pr_middle(const cb_model *m, cb_tokens *out);

/* The head of a prompt with this system message (BOS when the model adds
 * one, the template's system turn and the user turn's opener; system NULL:
 * the template's default turn), appended to out; and the store key of a
 * head's own cache (its tokens prefilled alone, at positions 0..).
 * (prompt.c) */
cb_status pr_head(const cb_model *m, const char *system, cb_tokens *out);
/* A head shorter than this (BOS alone: no chat template) is computed, as
 * its own entry would cost a store entry and a file read to save less than
 * a few rows. */
#define PR_HEAD_MIN 8
void pr_head_key(const cb_model *m, const cb_tokens *head, char key[66]);

/* ids [n] prefilled alone (no lead-in, at positions 0..) and stored
 * under key, in f16 (f32 for an f32 precomputer): a prompt's head.
 * (precomputer.c) */
cb_status pr_precompute_alone(cb_precomputer *pc, const int32_t *ids, int32_t n, const char *key,
                              cb_error *err);

#endif
