/* prompt_impl.h - what the files of lib/prompt share (private). */
#ifndef CB_PROMPT_IMPL_H
#define CB_PROMPT_IMPL_H

#include "prompt.h"

/* Format a message and hand it to warn(ctx, msg); nothing when warn is
 * NULL.  (prompt.c) */
void pr_warnf(void (*warn)(void *ctx, const char *msg), void *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
