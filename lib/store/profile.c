/* profile.c - the store's profile files and placement by profile.
 *
 * A profile (lib/kv/controller.c: its JSON and the predictions made from
 * it) is kept in the store directory, one file per (model, backend) named
 * by cb_profile_name.  profile_path below is the only place that builds
 * that path. */
#include "store_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cb_store_profile_path(const cb_store *s, cb_hash128 model, const char *backend,
                                  char *buf, size_t n)
{
    char name[160];
    cb_profile_name(model, backend, name, sizeof name);
    snprintf(buf, n, "%s/%s", s->dir, name);
    return buf;
}

cb_status cb_store_profile_load(const cb_store *s, cb_hash128 model, const char *backend,
                                cb_profile *p, cb_error *err)
{
    char path[4096];
    cb_mmap m;
    cb_status st;

    cb_store_profile_path(s, model, backend, path, sizeof path);
    if ((st = cb_mmap_open(&m, path, err)) != CB_OK) {
        if (st == CB_ERR_NOT_FOUND)
            cb_error_set(err, st, "%s: no profile for this model and backend (run cb-profile)",
                         path);
        return st;
    }
    st = cb_profile_from_json(p, (const char *)m.data, m.size, err);
    cb_mmap_close(&m);
    if (st != CB_OK && err) { /* the message with its path (a copy: the buffers must not overlap) */
        char why[CB_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err->msg);
        cb_error_set(err, st, "%s: %s", path, why);
    }
    return st;
}

cb_status cb_store_profile_save(const cb_store *s, const cb_profile *p, char *path, size_t path_n,
                                cb_error *err)
{
    cb_hash128 model;
    char buf[4096];
    char *json = NULL;
    cb_status st;

    if (cb_hash128_parse(p->model, &model) != CB_OK)
        return cb_error_set(err, CB_ERR_INVALID, "profile: '%s' is not a model fingerprint",
                            p->model);
    if ((st = st_writable(s, "save a profile", err)) != CB_OK)
        return st;
    if ((st = cb_profile_to_json(p, &json)) != CB_OK)
        return cb_error_set(err, st, "profile: %s", cb_strerror(st));
    cb_store_profile_path(s, model, p->backend, buf, sizeof buf);
    st = cb_file_write_atomic(buf, json, strlen(json), err);
    free(json);
    if (st == CB_OK && path)
        snprintf(path, path_n, "%s", buf);
    return st;
}

int cb_store_place(const cb_store *s, const cb_profile *p, double ratio, int64_t L, cb_type t,
                   double *pred_load, double *pred_recompute)
{
    double rec = cb_profile_recompute_ms(p, ratio, L), best_cost = 0, fastest = -1;
    int best = -1, fast = -1;
    for (int i = 0; i < s->n_tiers; i++) {
        const st_tier *ti = &s->tiers[i];
        double load = cb_profile_load_ms(p, ti->name, L, t, 1);
        if (load < 0)
            continue;
        if (fast < 0 || load < fastest)
            fast = i, fastest = load;
        /* cheaper wins; at equal cost the slower one, saving the faster */
        if (load <= rec &&
            (best < 0 || ti->cost < best_cost || (ti->cost == best_cost && i > best)))
            best = i, best_cost = ti->cost;
    }
    if (best < 0)
        best = fast;
    if (pred_recompute)
        *pred_recompute = rec;
    if (pred_load && best >= 0)
        *pred_load = cb_profile_load_ms(p, s->tiers[best].name, L, t, 1);
    return best;
}
