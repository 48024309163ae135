/* fuzz_store_conf - a store's configuration (DIR/store.json) as
 * cb_store_open reads it: the input replaces store.json of a store made once
 * in this process's temporary directory, and the store is opened.
 *
 * Sandbox: tier paths are directories the store creates, so an input whose
 * JSON holds any string (key or value) that starts with '/', contains ".."
 * or holds "://" anywhere but after "redis://" or "unix://" at its start is
 * skipped: every tier stays inside the temporary directory.  A shared
 * tier's address (the "shared" section) is parsed and checked when the store
 * opens, but nothing here connects: the store is empty, so no lookup reaches
 * the shared tier (and CB_STORE_TIMEOUT_MS=1 bounds any attempt).
 * After each input everything but the index and the lock is removed.
 *
 * Properties of an accepted configuration: 1..CB_STORE_MAX_TIERS tiers with
 * valid, distinct names and distinct directories that exist and carry the
 * store's marker; a "shared" section gives a shared tier whose name is a
 * valid tier name; the store answers a lookup. */
#include "cbcore.h"
#include "fuzz.h"

#include <dirent.h>
#include <jansson.h>

static char *dir, *conf;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    cb_error err;
    if (asprintf(&dir, "%s/store", fuzz_tmpdir()) < 0 || asprintf(&conf, "%s/store.json", dir) < 0)
        abort();
    setenv("CB_STORE_TIMEOUT_MS", "1", 1);
    if (cb_store_init(dir, NULL, 0, -1, &err) != CB_OK) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        exit(1);
    }
    return 0;
}

/* 1 when some string in the document could point outside the sandbox. */
static int escapes(json_t *j)
{
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        size_t skip = !strncmp(s, "redis://", 8) ? 8 : !strncmp(s, "unix://", 7) ? 7 : 0;
        return (n > 0 && s[0] == '/') || memmem(s, n, "..", 2) ||
               memmem(s + skip, n - skip, "://", 3);
    }
    if (json_is_object(j)) {
        json_object_foreach(j, k, v) {
            if (k[0] == '/' || strstr(k, "..") || strstr(k, "://") || escapes(v))
                return 1;
        }
    }
    if (json_is_array(j))
        json_array_foreach(j, i, v)
            if (escapes(v))
                return 1;
    return 0;
}

static void reset(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        abort();
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "index.db") ||
            !strcmp(n, "index.db-wal") || !strcmp(n, "index.db-shm") ||
            !strcmp(n, "index.db-journal") || !strcmp(n, "lock"))
            continue;
        char *p;
        if (asprintf(&p, "%s/%s", dir, n) < 0)
            abort();
        fuzz_rmtree(p);
        free(p);
    }
    closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    /* the same decoder cb_store_open uses, so the sandbox test sees what it sees */
    json_t *j = json_loadb((const char *)data, size, 0, &je);
    int skip = j && escapes(j);
    int has_shared = json_is_object(j) && json_object_get(j, "shared") != NULL;
    json_decref(j);
    if (skip)
        return 0;
    fuzz_write_file(conf, data, size);
    cb_store *s = NULL;
    cb_error err = {0};
    if (cb_store_open(&s, dir, 0, &err) == CB_OK) {
        int n = cb_store_n_tiers(s);
        FUZZ_CHECK(n >= 1 && n <= CB_STORE_MAX_TIERS);
        char *real[CB_STORE_MAX_TIERS] = {0};
        for (int i = 0; i < n; i++) {
            cb_store_tier t;
            struct stat sb;
            FUZZ_CHECK(cb_store_tier_info(s, i, &t) == CB_OK);
            FUZZ_CHECK(t.name && strlen(t.name) >= 1 && strlen(t.name) <= 32 && t.path &&
                       t.path[0] == '/');
            FUZZ_CHECK(stat(t.path, &sb) == 0 && S_ISDIR(sb.st_mode));
            real[i] = realpath(t.path, NULL);
            FUZZ_CHECK(real[i] != NULL);
            for (int k = 0; k < i; k++) {
                cb_store_tier u;
                cb_store_tier_info(s, k, &u);
                FUZZ_CHECK(strcmp(u.name, t.name) != 0);
                FUZZ_CHECK(strcmp(real[k], real[i]) != 0);
            }
        }
        for (int i = 0; i < n; i++)
            free(real[i]);
        FUZZ_CHECK(cb_store_tier_info(s, n, &(cb_store_tier){0}) == CB_ERR_RANGE);
        const char *sh = cb_store_shared_name(s);
        FUZZ_CHECK(!sh == !has_shared);
        FUZZ_CHECK(!sh || (strlen(sh) >= 1 && strlen(sh) <= 32));
        int found = 1;
        FUZZ_CHECK(
            cb_store_lookup(s, "00000000000000000000000000000000-00000000000000000000000000000000",
                            &found) == CB_OK &&
            !found);
        cb_store_close(s);
    } else {
        FUZZ_CHECK(s == NULL && err.msg[0]);
    }
    reset();
    return 0;
}
