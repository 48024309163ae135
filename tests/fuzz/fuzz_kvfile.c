/* fuzz_kvfile - the KV file reader (cb_kvfile_open, cb_kvfile_read_layer,
 * cb_kvfile_verify) on arbitrary bytes, seeded with KV files the tiny
 * fixture model precomputed.
 *
 * Input: one flag byte, then the file.  With bit 0 of the flag set, the
 * harness first repairs the token hash, the per-layer checksums and the
 * header checksum wherever the (mutated) header says they are, so that the
 * fuzzer reaches the code behind the checksums instead of stopping at them;
 * with it clear the file is taken as is.
 *
 * Properties of an accepted file: its shape has a nonzero row size, its
 * size is the file's, and (after repair) every layer reads and verifies,
 * but a coded layer (version 4) whose bytes do not decode, which is a
 * format error. */
#include "../../lib/kv/kv.h"
#include "fuzz.h"

#include <xxhash.h>

static char *path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (asprintf(&path, "%s/chunk.kv", fuzz_tmpdir()) < 0)
        abort();
    return 0;
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Recompute the checksums the header's own fields point at (layout in
 * lib/kv/kvfile.c), staying inside the buffer whatever the fields say. */
static void repair(uint8_t *f, size_t size)
{
    if (size < 128)
        return;
    uint64_t H = get32(f + 12), S = get64(f + 96);
    uint32_t n_layer = get32(f + 48), n_tok = get32(f + 76), n_lead = get32(f + 84);
    uint64_t ids_end = 128 + 4 * ((uint64_t)n_tok + n_lead);
    if (n_tok <= (1u << 24) && n_lead <= (1u << 24) && ids_end <= size) {
        cb_hash128 h =
            cb_kv_tokens_hash((const int32_t *)(f + 128 + 4 * (size_t)n_tok), (int32_t)n_lead,
                              (const int32_t *)(f + 128), (int32_t)n_tok);
        put64(f + 32, h.lo);
        put64(f + 40, h.hi);
        /* version 4: each layer where its table says, else H + l*S */
        uint64_t table = ids_end + 16 * (uint64_t)n_layer, v4 = get32(f + 8) == 4;
        for (uint64_t l = 0; l < n_layer && S > 0; l++) {
            uint64_t slot = ids_end + 8 * l, off = H + S * l, len = S;
            if (v4 && table + 16 * (l + 1) <= size)
                off = get64(f + table + 16 * l), len = get64(f + table + 16 * l + 8);
            if (slot + 8 > size || slot + 8 > H || H > size || off > size || len > size - off ||
                (!v4 && S > (size - H) / (l + 1)))
                break;
            put64(f + slot, XXH3_64bits(f + off, (size_t)len));
        }
    }
    if (H >= 128 && H <= size) {
        put64(f + 120, 0);
        put64(f + 120, XXH3_64bits(f, (size_t)H));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int fix = data[0] & 1;
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, n);
    if (fix)
        repair(buf, n);
    fuzz_write_file(path, buf, n);
    free(buf);

    cb_kvfile *f = NULL;
    cb_error err = {0};
    cb_status st = cb_kvfile_open(&f, path, &err);
    if (st != CB_OK) {
        FUZZ_CHECK(f == NULL && err.msg[0]);
        return 0;
    }
    const cb_kv_meta *mt = cb_kvfile_meta(f);
    int64_t width = (int64_t)mt->n_head_kv * mt->head_dim;
    FUZZ_CHECK(cb_kvfile_size(f) == n);
    FUZZ_CHECK(mt->n_tokens >= 1 && mt->n_layer >= 1 && width >= 1);
    FUZZ_CHECK(cb_type_row_bytes(cb_kvfile_rows_type(f), width) > 0);
    cb_hash128 h = cb_kv_tokens_hash(mt->lead, mt->n_lead, mt->ids, mt->n_tokens);
    FUZZ_CHECK(cb_hash128_eq(h, mt->tokens));
    size_t floats = (size_t)mt->n_tokens * (size_t)width;
    float *k = malloc(sizeof(float) * floats), *v = malloc(sizeof(float) * floats);
    if (k && v) {
        for (int32_t l = 0; l < mt->n_layer; l++) {
            st = cb_kvfile_read_layer(f, l, k, v, &err);
            int undecodable = mt->type == CB_TYPE_CODED && st == CB_ERR_FORMAT;
            FUZZ_CHECK(st == CB_OK || st == CB_ERR_CHECKSUM || undecodable);
            if (fix)
                FUZZ_CHECK(st == CB_OK || undecodable);
        }
        FUZZ_CHECK(cb_kvfile_read_layer(f, mt->n_layer, k, v, &err) == CB_ERR_RANGE);
        st = cb_kvfile_verify(f, &err);
        FUZZ_CHECK(st == CB_OK || (!fix && st == CB_ERR_CHECKSUM));
    }
    free(k);
    free(v);
    cb_kvfile_free(f);
    return 0;
}
