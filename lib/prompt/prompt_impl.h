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

#endif
