/* kv.h - what lib/kv (KV files, blending and its cost model, profiles)
 * gives the layers above it beyond cbcore.h (private to libcbcore: not
 * installed).  Includes only the layers below. */
#ifndef CB_KV_H
#define CB_KV_H

#include "../infer/infer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- KV files */

/* The KV file format (layout at the top of lib/kv/kvfile.c and in
 * cbkv(5)): a self-describing header (model fingerprint, shape, RoPE
 * parameters, element type, token ids, how positions were assigned, per
 * layer checksums, a header checksum) and a layer-major body, each layer
 * (K then V) aligned to 4096 bytes so it can be read alone, with O_DIRECT. */

#define CB_KV_ALIGN 4096

/* The store key of a chunk: hash of its token ids (with the lead-in, so a
 * chunk precomputed after another lead-in is another entry). */
cb_hash128 cb_kv_tokens_hash(const int32_t *lead, int32_t n_lead, const int32_t *ids, int32_t n);
/* Appends what a prompt puts between two chunks (and before the question): a blank line. */
cb_status cb_kv_separator(const cb_model *m, cb_tokens *out);

/* Serialize a chunk's KV (rows pos0..pos0+n-1 of a cache, every layer)
 * into a malloc'd buffer holding a complete KV file.
 * Errors: CB_ERR_NOMEM, CB_ERR_INVALID (type, range). */
cb_status cb_kv_serialize(const cb_model *m, const cb_kvcache *kv, const int32_t *lead,
                          int32_t n_lead, const int32_t *ids, int32_t n, int32_t pos0, cb_type type,
                          void **buf, size_t *size);

/* The coded element types of KV files (lib/kv/kvcodec.c, cbkv(5)): not
 * ggml's row-wise blocks, so a reader decodes a layer to f16 rows.
 * kivi4: 4-bit keys per channel (groups of CB_KIVI4_GROUP tokens) and
 * values per token (groups of 32 channels), scale and minimum in f16. */
/* Read layer l, verified, as f32 k, v [n_tokens, n_head_kv*head_dim] (the tests' and
 * benchmarks' view of a file; the programs place layers with cb_kvfile_load_layer). */
cb_status cb_kvfile_read_layer(cb_kvfile *f, int32_t l, float *k, float *v, cb_error *err);
#define CB_KIVI4_GROUP 32
/* Bytes of one layer's K, and of its V, of n tokens of width w; 0 when w
 * is not a positive multiple of 32 or n < 1. */
uint64_t cb_kivi4_k_bytes(int32_t n, int64_t w);
uint64_t cb_kivi4_v_bytes(int32_t n, int64_t w);
/* k, v [n][w] f32 as one layer's K then V into out (cb_kivi4_k_bytes +
 * cb_kivi4_v_bytes bytes).  Errors: CB_ERR_INVALID (shape). */
cb_status cb_kivi4_encode(const float *k, const float *v, int32_t n, int64_t w, uint8_t *out);
/* One layer's K then V at in decoded to f16 rows k, v [n][w]; scratch
 * holds 2*w floats.  simd 0 takes the portable decoder, 1 the CPU's
 * fastest (the same bits).  Errors: CB_ERR_INVALID (shape). */
cb_status cb_kivi4_decode(const uint8_t *in, int32_t n, int64_t w, uint16_t *k, uint16_t *v,
                          float *scratch, int simd);
/* coded: levels at a step of each group's deviation over s (keys per
 * channel, values per token), entropy coded with zstd's literal stage
 * (kvcoded.c).  s of the first third of the layers, and of the rest,
 * before the writer scales them all by one factor so that a file takes
 * 1/CB_CODED_SHARE of an f16 file's bytes (kvfile.c): */
#define CB_CODED_S_EARLY 1.5f
#define CB_CODED_S_LATE 1.0f
#define CB_CODED_SHARE 4
/* The s the encoder gives layer l of n_layer (the bit allocation). */
float cb_coded_steps(int32_t l, int32_t n_layer);
/* The most bytes a coded layer of n tokens of width w takes; 0 when
 * n < 1 or w < 1. */
uint64_t cb_coded_bound(int32_t n, int64_t w);
/* Bytes of the scratch cb_coded_decode needs (its zstd context within). */
size_t cb_coded_scratch(int32_t n, int64_t w);
/* k, v [n][w] f32 as one coded layer with keys' s sk and values' sv into
 * out (cap bytes, at least cb_coded_bound), its length in *len.  Errors:
 * CB_ERR_INVALID (shape, s, cap), CB_ERR_NOMEM, CB_ERR_INTERNAL (zstd). */
cb_status cb_coded_encode(const float *k, const float *v, int32_t n, int64_t w, float sk, float sv,
                          uint8_t *out, uint64_t cap, uint64_t *len);
/* The coded layer at in (len bytes, possibly padded) decoded to f16 rows
 * k, v [n][w], allocating nothing: its zstd context and levels live in
 * scratch (cb_coded_scratch bytes).  simd as cb_kivi4_decode's.  Errors:
 * CB_ERR_FORMAT (the bytes are not such a layer). */
cb_status cb_coded_decode(const uint8_t *in, uint64_t len, int32_t n, int64_t w, uint16_t *k,
                          uint16_t *v, void *scratch, int simd);
/* 1 when KV files may hold elements of type t (f32, f16, bf16, q8_0, kivi4,
 * coded). */
int cb_kv_type_ok(cb_type t);

/* The size in bytes a KV file must have whose first n bytes are `fixed`:
 * checks the fixed header (its first 128 bytes) as cb_kvfile_open does
 * (magic, version, shape, element type, and the header, layer and total
 * sizes against each other), so that a reader of a stream (an archive
 * member) knows how much a valid file can hold before reading the rest.
 * Messages name `name`.  Errors: CB_ERR_FORMAT (not a KV file, or fewer
 * than 128 bytes), CB_ERR_UNSUPPORTED (another format version). */
cb_status cb_kv_header_size(const void *fixed, size_t n, const char *name, uint64_t *size,
                            cb_error *err);

/* The bytes of part i of the KV file data (size bytes) as its reader
 * reads it: the header (part 0), then one part a layer (cbkv(5): S each,
 * or each layer's span in version 4); 0 when data is not a KV file whose
 * sizes agree with each other, or has no part i. */
uint64_t cb_kv_part_bytes(const void *data, size_t size, size_t i);

/* A KV file's bytes from elsewhere than a local file (the store's shared
 * tier streams them): read(ctx, off, buf, n, err) fills buf with the n
 * bytes at offset off, or returns a status with err set; the reader asks
 * for the header (offset 0) when opened and for one layer (H + l*S, S
 * bytes) at a time, from one thread at a time, and verifies every part by
 * the file's checksums.  release(ctx) (may be NULL) runs once, when the
 * reader is freed or fails to open.  name is copied (for messages). */
typedef struct cb_kv_source {
    cb_status (*read)(void *ctx, uint64_t off, void *buf, size_t n, cb_error *err);
    void (*release)(void *ctx);
    void *ctx;
    uint64_t size; /* the whole file's bytes */
    const char *name;
} cb_kv_source;
/* cb_kvfile_open for a source, which it owns from here (released on
 * failure too).  Errors as cb_kvfile_open, and the source's. */
cb_status cb_kvfile_open_source(cb_kvfile **out, const cb_kv_source *src, cb_error *err);
/* CB_OK when the file belongs to model m (fingerprint and shape), else
 * CB_ERR_MISMATCH with a message naming the file. */
cb_status cb_kvfile_check_model(const cb_kvfile *f, const cb_model *m, cb_error *err);
/* Read layer l, verified: *k and *v point at its n_tokens rows of K and V
 * in cb_kvfile_rows_type(f), valid until the next read of f.  Errors as
 * cb_kvfile_read_layer. */
cb_status cb_kvfile_layer_rows(cb_kvfile *f, int32_t l, const void **k, const void **v,
                               cb_error *err);
/* The type of the rows cb_kvfile_layer_rows gives: the file's element
 * type, or f16 for a coded type (kivi4), which a read decodes. */
cb_type cb_kvfile_rows_type(const cb_kvfile *f);
/* cb_kvfile_layer_rows into the caller's buf of cb_kvfile_layer_bytes(f)
 * bytes (cb-run's loader: memory the device copies from directly); *k and
 * *v point into buf. */
size_t cb_kvfile_layer_bytes(const cb_kvfile *f);
/* Whether reads of f's layers into the callers' buffers may run on several
 * threads at once: a local file's (pread), not a source's. */
int cb_kvfile_concurrent(const cb_kvfile *f);
cb_status cb_kvfile_layer_rows_into(cb_kvfile *f, int32_t l, void *buf, const void **k,
                                    const void **v, cb_error *err);
/* Verify every layer's checksum.  Errors as cb_kvfile_read_layer. */
cb_status cb_kvfile_verify(cb_kvfile *f, cb_error *err);

/* f's KV rewritten in element type `type`: every layer read (verified) as
 * f32 rows and written by the writer cb_kv_serialize uses, with f's header
 * otherwise (same model, tokens, positions: the same store key), as a
 * complete KV file in a malloc'd *buf of *size bytes.  Errors:
 * CB_ERR_UNSUPPORTED (not a KV element type), CB_ERR_INVALID (f's rows are
 * not whole blocks of it), CB_ERR_NOMEM, cb_kvfile_read_layer's. */
cb_status cb_kvfile_recode(cb_kvfile *f, cb_type type, void **buf, size_t *size, cb_error *err);

/* ------------------------------------------------------------- blending */

/* A strategy's name, as cb-run's --strategy takes it ("hkvd", "probe");
 * NULL for a value that names none. */
const char *cb_blend_strategy_name(cb_blend_strategy id);

/* The key temperature p gives on model m: p->key_temp when > 0, else the
 * architecture's (cb_model_key_temp). */
float cb_blend_key_temp(const cb_model *m, const cb_blend_params *p);
/* The stale scale p gives on model m: p->stale_scale when > 0, else the
 * architecture's (cb_model_stale_scale).  cb_blend_prefill applies it to
 * probe's and random's blends, to the others' only when p gives it. */
float cb_blend_stale_scale(const cb_model *m, const cb_blend_params *p);
/* The layers probe's first pass runs and scores, for n_rows uncached rows
 * and want cached rows to recompute: p->probe_depth x n_layer, rounded up,
 * at least 1; probe_depth 0: by cost, every layer while that pass (n_rows
 * rows a layer) costs at most a quarter of the second (n_rows + want), and
 * never fewer than half of them.  Measured on Qwen2.5 (EVAL.md): half the
 * layers select as well as all of them on short prompts, where the
 * question is most of the rows computed, and worse on many-chunk ones,
 * where the first pass costs little.  A model with sliding-window layers
 * (windowed != 0) gets every layer by default: its first layers may all be
 * windowed, where the question sees no cached token far from it. */
int32_t cb_blend_probe_layers(const cb_blend_params *p, int32_t n_layer, int64_t n_rows,
                              int64_t want, int windowed);
/* Whether segment s, starting at row `start`, has a cache that is a true
 * prefix: computed after exactly the segments before it, at its place, so
 * that it is what full prefill computes there (never recomputed). */
int cb_blend_true_prefix(const cb_segment *segs, int32_t s, int32_t start);

/* ---------------------------------------------------------------- profile */

/* Index into kv_bytes_per_token for a KV element type, -1 if none. */
int cb_profile_type_index(cb_type t);

/* Parse a profile from JSON text.  Errors: CB_ERR_FORMAT, CB_ERR_NOMEM. */
cb_status cb_profile_from_json(cb_profile *p, const char *json, size_t len, cb_error *err);
/* The profile's file name in a store: profile-<model hex>-<backend>.json
 * (the store keeps it: cb_store_profile_load, cb_store_profile_save). */
void cb_profile_name(cb_hash128 model, const char *backend, char *buf, size_t n);

/* Predicted time (ms, all layers) to recompute `ratio` of a prompt of L
 * tokens, interpolated linearly in ratio and in L (extrapolated in
 * proportion beyond the measured lengths). */
double cb_profile_recompute_ms(const cb_profile *p, double ratio, int64_t L);
/* The cost model's loading figure (costs.load, of the first tier warm) for
 * a byte read cold from tier; 0: not measured. */
float cb_profile_load_cost(const cb_profile *p, const char *tier);

#ifdef __cplusplus
}
#endif
#endif /* CB_KV_H */
