/* fingerprint.c - the model fingerprint that ties KV files to one model.
 *
 * XXH3-128 over, in order: a format tag; every metadata entry whose key
 * starts with "<arch>." or "tokenizer.ggml." (key, type, value; arrays
 * element by element in their file encoding); then every tensor's name,
 * type, shape and data.  general.* (names, licences, quantization notes)
 * is left out on purpose: it does not change what the model computes. */
#include "cbcore.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static void upd(XXH3_state_t *st, const void *p, size_t n)
{
    XXH3_128bits_update(st, p, n);
}

static void upd_str(XXH3_state_t *st, cb_strview s)
{
    uint64_t n = s.len;
    upd(st, &n, 8);
    upd(st, s.data, s.len);
}

static int has_prefix(cb_strview k, const char *p, size_t n)
{
    return k.len > n && memcmp(k.data, p, n) == 0;
}

cb_status cb_gguf_fingerprint(const cb_gguf *g, cb_hash128 *out)
{
    static const size_t esz[CB_GGUF_TYPE_COUNT_] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    XXH3_state_t *st = XXH3_createState();
    cb_strview arch = cb_gguf_str(g, "general.architecture");
    char prefix[80];
    size_t plen;

    if (!st)
        return CB_ERR_NOMEM;
    snprintf(prefix, sizeof prefix, "%.*s.", (int)(arch.len < 70 ? arch.len : 70), arch.data ? arch.data : "");
    plen = strlen(prefix);
    XXH3_128bits_reset(st);
    upd(st, "cacheblend-fingerprint-1", 24);
    upd_str(st, arch);
    for (int64_t i = 0; i < cb_gguf_n_kv(g); i++) {
        cb_strview k = cb_gguf_key(g, i);
        if (!has_prefix(k, prefix, plen) && !has_prefix(k, "tokenizer.ggml.", 15))
            continue;
        uint32_t t = cb_gguf_kv_type(g, i);
        upd_str(st, k);
        upd(st, &t, 4);
        if (t == CB_GGUF_STRING) {
            cb_strview v;
            cb_gguf_get_str(g, i, &v);
            upd_str(st, v);
        } else if (t == CB_GGUF_ARRAY) {
            uint32_t et = cb_gguf_arr_type(g, i);
            uint64_t n = cb_gguf_arr_len(g, i);
            upd(st, &et, 4);
            upd(st, &n, 8);
            if (et == CB_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    cb_strview v;
                    cb_gguf_arr_get_str(g, i, j, &v);
                    upd_str(st, v);
                }
            } else if (et < CB_GGUF_TYPE_COUNT_ && esz[et]) {
                upd(st, cb_gguf_arr_data(g, i), (size_t)n * esz[et]);
            }
        } else {
            /* scalars: their value widened, so the encoding width does not matter */
            int64_t iv;
            double fv;
            int bv;
            if (cb_gguf_get_int(g, i, &iv) == CB_OK)
                upd(st, &iv, 8);
            else if (cb_gguf_get_float(g, i, &fv) == CB_OK)
                upd(st, &fv, 8);
            else if (cb_gguf_get_bool(g, i, &bv) == CB_OK)
                upd(st, &bv, sizeof bv);
        }
    }
    for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++) {
        cb_tensor_info ti;
        uint32_t t;
        cb_gguf_tensor(g, i, &ti);
        t = ti.type;
        upd_str(st, ti.name);
        upd(st, &t, 4);
        upd(st, ti.ne, sizeof ti.ne);
        upd(st, ti.data, ti.nbytes);
    }
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    out->lo = h.low64;
    out->hi = h.high64;
    return CB_OK;
}
