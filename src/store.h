/* store.h - what the parts of cb-store share: its options, the helpers
 * every command uses, and the commands of store-maint.c (gc, verify,
 * recode, export, import, place). */
#ifndef CB_STORE_CLI_H
#define CB_STORE_CLI_H

#include "cli.h"

typedef struct opts {
    const char *store, *model, *out, *compress, *device, *auth_file, *key_file, *kv_type;
    const char **tiers;
    int n_tiers, json, repair, promote, timeout_ms;
    const char **costs;
    int n_costs;
    double ratio;
    long tokens;
    double project;          /* stat --project: tokens (0: not asked) */
    const char *project_arg; /* as given */
    char **args;             /* after the command */
    int n_args;
} opts;

/* cli_err of err's message: its exit code. */
int cs_fail(cb_error *err);
/* Said once, when a store turns out read-only. */
void cs_readonly_note(const opts *o, const cb_store *s);
/* cli_err's "warning: MSG", as the store's warning callback. */
void cs_warn(void *ctx, const char *msg);
/* Open the store; only init creates one (a missing store is 66): 0 or an exit code. */
int cs_open_store(const opts *o, cb_store **s);
/* 0 when cmd has lo to hi arguments (hi < 0: no limit), else 64 after saying so. */
int cs_need_args(const opts *o, const char *cmd, int lo, int hi);

int cmd_gc(const opts *o);
int cmd_verify(const opts *o);
int cmd_recode(const opts *o);
int cmd_export(const opts *o);
int cmd_import(const opts *o);
int cmd_place(const opts *o);

#endif
