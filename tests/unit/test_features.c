/* test_features.c - the CUDA backend's features as one table
 * (lib/cuda/features.h, plain C, checked here on any machine): its shape,
 * its defaults, a feature whose need is off (or whose exclusion is on) is
 * off and says why, the per-backend features read again at each open and
 * the rest kept from the first, the list's format, and every variable of
 * the table in cb-run(1)'s ENVIRONMENT. */
#include "../../lib/cuda/features.h"
#include "cbcore.h" /* (test.h's) */
#include "test.h"

#include <ctype.h>

/* ------------------------------------------------------- the feature table */

/* a fake environment: NAME=VALUE pairs */
static const char *const *fake_env;

static const char *fake_get(const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; fake_env && fake_env[i]; i++)
        if (strncmp(fake_env[i], name, n) == 0 && fake_env[i][n] == '=')
            return fake_env[i] + n + 1;
    return NULL;
}

/* the list the environment env resolves to (proc: a first open's set) */
static const char *resolved(const char *const *env, const cu_feature_set *proc, cu_feature_set *out)
{
    static char buf[192];
    cu_feature_set s;
    fake_env = env;
    cu_features_resolve(&s, fake_get, proc);
    cu_features_format(&s, buf, sizeof buf);
    if (out)
        *out = s;
    return buf;
}

static void t_table(void)
{
    tcase("features: the table's shape (variables, dependencies above, one line each)");
    for (int i = 0; i < CU_F_COUNT; i++) {
        const cu_feature *f = &cu_features[i];
        char env[32] = "CB_CUDA_";
        for (size_t k = 0; f->name[k] && k < 20; k++)
            env[8 + k] = (char)toupper((unsigned char)f->name[k]), env[9 + k] = 0;
        CHECKF(strcmp(f->env, env) == 0, "%s: %s", f->name, f->env);
        CHECKF(f->needs < i && f->excludes < i, "%s depends on one below it", f->name);
        CHECKF(f->what && *f->what && strlen(f->what) < 72, "%s: %s", f->name, f->what);
        for (int j = 0; j < i; j++)
            CHECK(strcmp(cu_features[j].name, f->name) != 0);
    }

    tcase("features: the defaults (unset, or a value other than 0 and 1): mass alone on");
    const char *const none[] = {NULL};
    const char *want = "-sync -pin mass -kbias -gemv -memo -fuse -graph -fa -qw";
    CHECKF(strcmp(resolved(none, NULL, NULL), want) == 0, "%s", resolved(none, NULL, NULL));
    const char *const odd[] = {"CB_CUDA_MASS=yes", "CB_CUDA_GEMV=2", "CB_CUDA_SYNC=", NULL};
    CHECKF(strcmp(resolved(odd, NULL, NULL), want) == 0, "%s", resolved(odd, NULL, NULL));
    const char *const off[] = {"CB_CUDA_MASS=0", "CB_CUDA_GEMV=1", "CB_CUDA_QW=1", NULL};
    CHECKF(strcmp(resolved(off, NULL, NULL),
                  "-sync -pin -mass -kbias gemv -memo -fuse -graph -fa qw") == 0,
           "%s", resolved(off, NULL, NULL));

    tcase("features: graph needs memo and is excluded by sync, and says so");
    const char *const g1[] = {"CB_CUDA_GRAPH=1", NULL};
    cu_feature_set s;
    CHECKF(strstr(resolved(g1, NULL, &s), " -graph(needs:memo) ") != NULL, "%s",
           resolved(g1, NULL, NULL));
    CHECK(!s.on[CU_F_GRAPH]);
    const char *const g2[] = {"CB_CUDA_GRAPH=1", "CB_CUDA_MEMO=1", NULL};
    CHECKF(strstr(resolved(g2, NULL, &s), " memo -fuse graph ") != NULL, "%s",
           resolved(g2, NULL, NULL));
    CHECK(s.on[CU_F_GRAPH] && s.on[CU_F_MEMO]);
    const char *const g3[] = {"CB_CUDA_GRAPH=1", "CB_CUDA_MEMO=1", "CB_CUDA_SYNC=1", NULL};
    CHECKF(strstr(resolved(g3, NULL, &s), " -graph(excluded:sync) ") != NULL, "%s",
           resolved(g3, NULL, NULL));
    CHECK(s.on[CU_F_SYNC] && !s.on[CU_F_GRAPH]);

    tcase("features: fa and qw read at each open, the rest kept from the first");
    cu_feature_set proc, b;
    const char *const first[] = {"CB_CUDA_GEMV=1", "CB_CUDA_FA=1", NULL};
    resolved(first, NULL, &proc);
    const char *const later[] = {"CB_CUDA_MEMO=1", "CB_CUDA_GRAPH=1", "CB_CUDA_QW=1", NULL};
    const char *l = resolved(later, &proc, &b);
    CHECKF(strcmp(l, "-sync -pin mass -kbias gemv -memo -fuse -graph -fa qw") == 0, "%s", l);
    CHECK(b.on[CU_F_GEMV] && !b.on[CU_F_MEMO] && !b.on[CU_F_FA] && b.on[CU_F_QW]);

    tcase("features: the device turns one off, with its word");
    resolved(first, NULL, &b);
    cu_features_off(&b, CU_F_FA, "no-shared-memory");
    cu_features_off(&b, CU_F_QW, "unused"); /* (off already: no word) */
    char buf[192];
    cu_features_format(&b, buf, sizeof buf);
    CHECKF(strstr(buf, " -fa(no-shared-memory) -qw") != NULL, "%s", buf);
    cu_features_format(&b, buf, 12); /* a short buffer: cut, terminated */
    CHECKF(strlen(buf) < 12, "%s", buf);

    tcase("features: cb-run(1)'s ENVIRONMENT names every variable of the table");
    FILE *f = fopen("man/man1/cb-run.1", "r");
    if (!f) {
        tskip("features in cb-run(1)", "man/man1/cb-run.1 not found (run from the repository)");
        return;
    }
    static char man[1 << 20];
    size_t n = fread(man, 1, sizeof man - 1, f);
    man[n] = 0;
    fclose(f);
    const char *env = strstr(man, ".Sh ENVIRONMENT");
    CHECK(env != NULL);
    for (int i = 0; env && i < CU_F_COUNT; i++) {
        char item[64];
        snprintf(item, sizeof item, ".It Ev %s\n", cu_features[i].env);
        CHECKF(strstr(env, item) != NULL, "%s", cu_features[i].env);
        snprintf(item, sizeof item, "Cm %s ", cu_features[i].name);
        CHECKF(strstr(env, item) != NULL, "the table's row of %s", cu_features[i].name);
    }
}

int main(void)
{
    TEST_BEGIN();
    t_table();
    TEST_END();
}
