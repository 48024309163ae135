/* features.h - the CUDA backend's optional features as one table, and its
 * resolution (plain C: cuda.cu resolves it when a backend opens, and
 * test_cuda_features checks the resolution on any machine).
 *
 * A feature's environment variable set to 1 turns it on, 0 off; unset (or
 * any other value) leaves its default.  A feature switched on is on when
 * the feature it needs is on and the one it excludes is off; else it is
 * off, and the resolved list says why.  The table is in dependency order:
 * a feature needs or excludes only those above it.  Features marked
 * per_backend are read at every open (test_backend_ops holds one backend
 * with and one without); the others once for the process, at the first
 * open, since the operations table they shape is the process's.  The
 * defaults are those a GPU run has checked; cb-run(1)'s ENVIRONMENT lists
 * the table. */
#ifndef CB_CUDA_FEATURES_H
#define CB_CUDA_FEATURES_H

#include <stdio.h>
#include <string.h>

enum cu_feature_id {
    CU_F_SYNC,
    CU_F_PIN,
    CU_F_MASS,
    CU_F_KBIAS,
    CU_F_GEMV,
    CU_F_MEMO,
    CU_F_FUSE,
    CU_F_GRAPH,
    CU_F_FA,
    CU_F_QW,
    CU_F_COUNT
};

typedef struct cu_feature {
    const char *name;    /* its key in --stats' cuda_features */
    const char *env;     /* the variable that switches it */
    int on;              /* its default */
    int needs, excludes; /* a feature that must be on, one that must be off; -1: none */
    int per_backend;     /* read at every open, else once for the process */
    const char *what;
} cu_feature;

static const cu_feature cu_features[CU_F_COUNT] = {
    {"sync", "CB_CUDA_SYNC", 0, -1, -1, 0, "wait for and check every operation (debugging)"},
    {"pin", "CB_CUDA_PIN", 0, -1, -1, 0, "the loader's layers in page-locked memory, no staging"},
    {"mass", "CB_CUDA_MASS", 1, -1, -1, 0, "probe's attention mass on the device"},
    {"kbias", "CB_CUDA_KBIAS", 0, -1, -1, 0, "blending's stale scale in the attention kernels"},
    {"gemv", "CB_CUDA_GEMV", 0, -1, -1, 0, "products of up to 8 rows by a row-stable kernel"},
    {"memo", "CB_CUDA_MEMO", 0, -1, -1, 0, "index arrays sent once while they repeat"},
    {"fuse", "CB_CUDA_FUSE", 0, -1, -1, 0,
     "RoPE of Q and K, K and V rows, residual and norm fused"},
    {"graph", "CB_CUDA_GRAPH", 0, CU_F_MEMO, CU_F_SYNC, 0, "a decode step replayed as a graph"},
    {"fa", "CB_CUDA_FA", 0, -1, -1, 1, "tensor-core attention for 16 query rows or more"},
    {"qw", "CB_CUDA_QW", 0, -1, -1, 1, "block-quantized weights kept as in the file"},
};

/* The resolution: each feature on or off; an off one switched on says
 * why (NULL: its default or its variable turned it off). */
typedef struct cu_feature_set {
    unsigned char on[CU_F_COUNT];
    const char *why[CU_F_COUNT];
} cu_feature_set;

/* Resolve the table into s, each variable read with get (getenv, or a
 * test's; NULL: unset).  With proc (a set resolved before, at the
 * process's first open) the features not per_backend are proc's. */
static inline void cu_features_resolve(cu_feature_set *s, const char *(*get)(const char *),
                                       const cu_feature_set *proc)
{
    for (int i = 0; i < CU_F_COUNT; i++) {
        const cu_feature *f = &cu_features[i];
        const char *v = get(f->env);
        if (proc && !f->per_backend) {
            s->on[i] = proc->on[i], s->why[i] = proc->why[i];
            continue;
        }
        s->on[i] = v && strcmp(v, "1") == 0 ? 1 : v && strcmp(v, "0") == 0 ? 0 : f->on;
        s->why[i] = NULL;
        if (s->on[i] && f->needs >= 0 && !s->on[f->needs])
            s->on[i] = 0, s->why[i] = "needs";
        else if (s->on[i] && f->excludes >= 0 && s->on[f->excludes])
            s->on[i] = 0, s->why[i] = "excluded";
    }
}

/* Turn feature i off for a reason of the device's (one word, no spaces). */
static inline void cu_features_off(cu_feature_set *s, int i, const char *why)
{
    if (s->on[i])
        s->on[i] = 0, s->why[i] = why;
}

/* The resolved set as cb_backend's features: "name" for one on, "-name"
 * for one off, "-name(why)" for one switched on but off ("needs:memo",
 * "excluded:sync", or the device's word), separated by spaces. */
static inline void cu_features_format(const cu_feature_set *s, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < CU_F_COUNT && at < n; i++) {
        const cu_feature *f = &cu_features[i];
        const char *why = s->why[i];
        int k;
        if (s->on[i])
            k = snprintf(buf + at, n - at, "%s%s", at ? " " : "", f->name);
        else if (!why)
            k = snprintf(buf + at, n - at, "%s-%s", at ? " " : "", f->name);
        else if (strcmp(why, "needs") == 0 || strcmp(why, "excluded") == 0)
            k = snprintf(buf + at, n - at, "%s-%s(%s:%s)", at ? " " : "", f->name, why,
                         cu_features[why[0] == 'n' ? f->needs : f->excludes].name);
        else
            k = snprintf(buf + at, n - at, "%s-%s(%s)", at ? " " : "", f->name, why);
        if (k < 0)
            break;
        at += (size_t)k;
    }
}

#endif
