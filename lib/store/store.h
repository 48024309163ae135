/* store.h - what lib/store (the tiered store) gives the layers above it
 * beyond cbcore.h (private to libcbcore: not installed).  The store's own
 * layout is in store_impl.h.  Includes only the layers below. */
#ifndef CB_STORE_H
#define CB_STORE_H

#include "../kv/kv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cb_store_lookup, and where the local tiers lack it, the shared tier asked (records no
 * access either) */
cb_status cb_store_has(cb_store *s, const char *key, int *found);

/* Open a store read-only: nothing in it is written (no lock file is made,
 * no owner file, no access times, hits or misses recorded, no promotion,
 * entries whose file is gone are not dropped from the index; only SQLite
 * may make the index's -wal and -shm files, where it can, to read beside
 * writers).  Lookups,
 * cb_store_acquire, cb_store_list, cb_store_stat, cb_store_export, the
 * profiles and cb_store_verify without repair work; put, remove, pin, gc,
 * import, profile saving and verify with repair fail with CB_ERR_CREATE.
 * cb_store_open opens a store this way by itself (create then ignored)
 * when its directory is on a read-only file system or this process may not
 * write it or its index; cb_store_readonly tells.  Errors as cb_store_open. */
cb_status cb_store_open_readonly(cb_store **out, const char *dir, cb_error *err);

/* cb_store_put, placing the entry in tier `tier` (by name) or, when it
 * has no room, the next slower one with room.  Errors as cb_store_put, and
 * CB_ERR_NOT_FOUND for an unknown tier name. */
cb_status cb_store_put_in(cb_store *s, const char *key, const void *data, size_t size,
                          const char *tier, cb_error *err);

/* Size in bytes of the acquired file. */
uint64_t cb_store_ref_size(const cb_store_ref *ref);
/* The tier that holds the acquired file (0 = fastest, as cb_store_tier_info
 * numbers them): where loading it reads from.  -1 for NULL. */
int cb_store_ref_tier(const cb_store_ref *ref);
/* The name of the tier the reference reads from (a local tier's, or the
 * shared tier's for a streamed entry), borrowed from s; NULL for NULL. */
const char *cb_store_ref_tier_name(const cb_store *s, const cb_store_ref *ref);

/* A streamed entry failed while read (why: the reader's message, naming
 * it): warned; 1 when the entry was dropped from the shared tier (or had
 * been evicted meanwhile), 2 when
 * the connection failed or timed out (the tier is then not used for 5 s:
 * other entries streamed from it will fail too), 0 for a local entry
 * (nothing done). */
int cb_store_ref_bad(cb_store *s, cb_store_ref *ref, const char *why);
/* Keep a streamed entry in the fastest local tier with room (not written
 * back): the parts not read yet are received, the whole value checked
 * against its metadata (size, XXH3-128), then put as by cb_store_put.
 * CB_OK at once for a local entry or a read-only store.  Errors:
 * CB_ERR_CHECKSUM (the value is bad: warned and dropped), cb_store_put's. */
cb_status cb_store_keep(cb_store *s, cb_store_ref *ref, cb_error *err);

/* Profiles live in the store directory, one file per (model, backend),
 * named by cb_profile_name; only these functions know where.
 *
 * The path of the profile of (model, backend) in store s, written into buf
 * (truncated to n bytes); returns buf. */
const char *cb_store_profile_path(const cb_store *s, cb_hash128 model, const char *backend,
                                  char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* CB_STORE_H */
