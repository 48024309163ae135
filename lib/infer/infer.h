/* infer.h - what lib/infer (GGUF files, tokenizer, model, forward pass,
 * sampler, chat templates) gives the layers above it beyond cbcore.h
 * (private to libcbcore: not installed).  Includes only the layers below. */
#ifndef CB_INFER_H
#define CB_INFER_H

#include "../core/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ GGUF */

/* Metadata value types, numbered as in GGUF. */
typedef enum cb_gguf_type {
    CB_GGUF_UINT8 = 0,
    CB_GGUF_INT8 = 1,
    CB_GGUF_UINT16 = 2,
    CB_GGUF_INT16 = 3,
    CB_GGUF_UINT32 = 4,
    CB_GGUF_INT32 = 5,
    CB_GGUF_FLOAT32 = 6,
    CB_GGUF_BOOL = 7,
    CB_GGUF_STRING = 8,
    CB_GGUF_ARRAY = 9,
    CB_GGUF_UINT64 = 10,
    CB_GGUF_INT64 = 11,
    CB_GGUF_FLOAT64 = 12,
    CB_GGUF_TYPE_COUNT_ = 13
} cb_gguf_type;

#define CB_GGUF_MAX_DIMS 4

/* Description of one tensor; every pointer borrows from the cb_gguf. */
typedef struct cb_tensor_info {
    cb_strview name;
    uint32_t n_dims;
    int64_t ne[CB_GGUF_MAX_DIMS]; /* ne[0] is the row length; unused dims 1 */
    cb_type type;
    uint64_t offset; /* relative to the start of the data section */
    size_t nbytes;
    const void *data; /* in the mapping; aligned to the file's alignment */
} cb_tensor_info;

/* cb_gguf_open over bytes the caller keeps alive until cb_gguf_free
 * (nothing is copied).  `name` is used in messages. */
cb_status cb_gguf_open_memory(cb_gguf **out, const void *data, size_t size, const char *name,
                              cb_error *err);

/* Name of a metadata type ("uint32", "string", ...); "unknown" otherwise. */
const char *cb_gguf_type_name(cb_gguf_type t);

uint32_t cb_gguf_version(const cb_gguf *g);
size_t cb_gguf_alignment(const cb_gguf *g);
size_t cb_gguf_file_size(const cb_gguf *g);
/* Start of the tensor data section and its size. */
const uint8_t *cb_gguf_data(const cb_gguf *g, size_t *size);

/* Metadata: entries are numbered 0..n_kv-1 in file order. */
int64_t cb_gguf_n_kv(const cb_gguf *g);
/* Index of `key`, or -1. */
int64_t cb_gguf_find_key(const cb_gguf *g, const char *key);
cb_strview cb_gguf_key(const cb_gguf *g, int64_t i);
cb_gguf_type cb_gguf_kv_type(const cb_gguf *g, int64_t i);
/* For arrays: element type and count (0 and CB_GGUF_TYPE_COUNT_ otherwise). */
cb_gguf_type cb_gguf_arr_type(const cb_gguf *g, int64_t i);
uint64_t cb_gguf_arr_len(const cb_gguf *g, int64_t i);
/* For numeric arrays: the raw little-endian elements (maybe unaligned). */
const void *cb_gguf_arr_data(const cb_gguf *g, int64_t i);

/* Scalar values of entry i, converted when exact: an integer of any width
 * for get_int, an integer or float for get_float.  Errors: CB_ERR_INVALID
 * (wrong type, or value out of range of the target). */
cb_status cb_gguf_get_int(const cb_gguf *g, int64_t i, int64_t *v);
cb_status cb_gguf_get_uint(const cb_gguf *g, int64_t i, uint64_t *v);
cb_status cb_gguf_get_float(const cb_gguf *g, int64_t i, double *v);
cb_status cb_gguf_get_bool(const cb_gguf *g, int64_t i, int *v);
cb_status cb_gguf_get_str(const cb_gguf *g, int64_t i, cb_strview *v);
/* Element j of array i, converted as above. */
cb_status cb_gguf_arr_get_int(const cb_gguf *g, int64_t i, uint64_t j, int64_t *v);
cb_status cb_gguf_arr_get_float(const cb_gguf *g, int64_t i, uint64_t j, double *v);
cb_status cb_gguf_arr_get_str(const cb_gguf *g, int64_t i, uint64_t j, cb_strview *v);

/* Conveniences by key; `def` is returned when the key is absent or has
 * another type. */
int64_t cb_gguf_int_or(const cb_gguf *g, const char *key, int64_t def);
double cb_gguf_float_or(const cb_gguf *g, const char *key, double def);
int cb_gguf_bool_or(const cb_gguf *g, const char *key, int def);
/* A view of a string value, or {NULL, 0}. */
cb_strview cb_gguf_str(const cb_gguf *g, const char *key);

/* Tensors, numbered 0..n_tensors-1 in file order. */
int64_t cb_gguf_n_tensors(const cb_gguf *g);
int64_t cb_gguf_find_tensor(const cb_gguf *g, const char *name);
/* Errors: CB_ERR_RANGE. */
cb_status cb_gguf_tensor(const cb_gguf *g, int64_t i, cb_tensor_info *out);

/* ----------------------------------------------------------- GGUF writer */

typedef struct cb_gguf_writer cb_gguf_writer;

/* A writer that collects metadata and tensors in memory and writes a GGUF
 * version 3 file with cb_gguf_writer_save.  alignment 0 means 32. */
cb_gguf_writer *cb_gguf_writer_new(size_t alignment);
void cb_gguf_writer_free(cb_gguf_writer *w);

/* Metadata setters; keys are copied.  A key set twice keeps its first
 * position and takes the new value.  Errors: CB_ERR_NOMEM, CB_ERR_INVALID. */
cb_status cb_gguf_writer_set_u32(cb_gguf_writer *w, const char *key, uint32_t v);
cb_status cb_gguf_writer_set_i32(cb_gguf_writer *w, const char *key, int32_t v);
cb_status cb_gguf_writer_set_u64(cb_gguf_writer *w, const char *key, uint64_t v);
cb_status cb_gguf_writer_set_f32(cb_gguf_writer *w, const char *key, float v);
cb_status cb_gguf_writer_set_bool(cb_gguf_writer *w, const char *key, int v);
cb_status cb_gguf_writer_set_str(cb_gguf_writer *w, const char *key, const char *v);
/* Array of n elements of scalar type t (not STRING or ARRAY), copied from
 * `data` given in that type's C layout. */
cb_status cb_gguf_writer_set_arr(cb_gguf_writer *w, const char *key, cb_gguf_type t,
                                 const void *data, uint64_t n);
/* Array of n NUL-terminated strings. */
cb_status cb_gguf_writer_set_arr_str(cb_gguf_writer *w, const char *key, const char *const *strs,
                                     uint64_t n);
/* Add a tensor of type t with dims ne[0..n_dims-1]; `data` (exactly
 * cb_type_row_bytes(t, ne[0]) * rows bytes) is copied. */
cb_status cb_gguf_writer_add_tensor(cb_gguf_writer *w, const char *name, cb_type t, uint32_t n_dims,
                                    const int64_t *ne, const void *data);
/* Add a tensor whose bytes are produced when the file is written, rows
 * [row0, row0 + n) at a time into dst (fill returns nonzero on failure), so
 * that a file larger than memory can be written.  ne as for add_tensor. */
typedef int (*cb_gguf_fill_fn)(void *ctx, int64_t row0, int64_t n, void *dst);
cb_status cb_gguf_writer_add_tensor_fn(cb_gguf_writer *w, const char *name, cb_type t,
                                       uint32_t n_dims, const int64_t *ne, cb_gguf_fill_fn fill,
                                       void *ctx);
/* Serialize into a malloc'd buffer (caller frees).  Errors: CB_ERR_NOMEM,
 * CB_ERR_INVALID (a tensor added with add_tensor_fn: use save). */
cb_status cb_gguf_writer_bytes(const cb_gguf_writer *w, void **buf, size_t *size);
/* Write atomically to path, streaming the tensors (a few MB of memory
 * beyond the writer's own).  Errors: CB_ERR_CREATE, CB_ERR_IO, CB_ERR_NOMEM,
 * CB_ERR_INVALID (a fill callback failed). */
cb_status cb_gguf_writer_save(const cb_gguf_writer *w, const char *path, cb_error *err);

/* ------------------------------------------------------------- tokenizer */

/* Token attributes, as llama.cpp derives them from tokenizer.ggml.token_type. */
enum {
    CB_TOKEN_NORMAL = 1 << 0,
    CB_TOKEN_UNKNOWN = 1 << 1,
    CB_TOKEN_CONTROL = 1 << 2,
    CB_TOKEN_USER_DEFINED = 1 << 3,
    CB_TOKEN_UNUSED = 1 << 4,
    CB_TOKEN_BYTE = 1 << 5
};

/* Special token ids, -1 when the model has none. */
int32_t cb_vocab_bos(const cb_vocab *v);
int32_t cb_vocab_eos(const cb_vocab *v);
int32_t cb_vocab_eot(const cb_vocab *v);
int cb_vocab_add_bos(const cb_vocab *v);
int cb_vocab_add_eos(const cb_vocab *v);
/* The most input bytes one token of an encoding stands for: the longest
 * token text as stored (a byte-level or SPM text is never shorter than the
 * bytes it covers), at least 1; 0 where a token also swallows the
 * whitespace around it (lstrip, rstrip) and no such bound holds.  A text
 * of more than n times this many bytes encodes to more than n tokens, but
 * for bytes a vocabulary can only drop (no token, no byte fallback, no
 * unknown token). */
size_t cb_vocab_max_token_bytes(const cb_vocab *v);
/* Text of a token as stored in the vocabulary, and its CB_TOKEN_* attrs;
 * {NULL,0} and 0 for an id out of range. */
cb_strview cb_vocab_token_text(const cb_vocab *v, int32_t id);
uint32_t cb_vocab_token_attr(const cb_vocab *v, int32_t id);
/* 1 when the id ends a generation (EOS, EOT, or another end-of-generation token). */
int cb_vocab_is_eog(const cb_vocab *v, int32_t id);

/* The bytes a token stands for (byte-level decoding, byte tokens, the SPM
 * space marker), appended to buf[*len..] growing *buf with realloc as
 * needed.  Control tokens render only with CB_DETOK_UNPARSE_SPECIAL.
 * Errors: CB_ERR_RANGE (bad id), CB_ERR_NOMEM. */
cb_status cb_tok_piece(const cb_vocab *v, int32_t id, unsigned flags, char **buf, size_t *len,
                       size_t *cap);

/* ----------------------------------------------------------------- model */

/* Where the model came from (cb_model_load's path), how long loading it
 * took (ms), and the threads its parameters asked for (0: as many as the
 * cores): what --stats reports of it. */
const char *cb_model_path(const cb_model *m);
double cb_model_load_ms(const cb_model *m);
int cb_model_threads(const cb_model *m);

/* Layer l's attention window: > 0 for a sliding-window layer (a row at
 * position p sees keys p-window+1..p), 0 for a global one (keys 0..p); and
 * its RoPE base.  l must be in range. */
int32_t cb_model_layer_window(const cb_model *m, int32_t l);
float cb_model_layer_rope_base(const cb_model *m, int32_t l);
/* What the engine multiplies a query's dot products with the keys by
 * before the softmax: 1/sqrt(head_dim) (gemma3 27B: 1/sqrt(n_embd /
 * n_head), as llama.cpp). */
float cb_model_attn_scale(const cb_model *m);
/* The blend's defaults for the model's architecture (its table in
 * model.c): the temperature the cached keys are divided by, and the stale
 * scale (the computed rows' attention to the stale cached rows x it);
 * 1: none. */
float cb_model_key_temp(const cb_model *m);
float cb_model_stale_scale(const cb_model *m);
/* The time attention takes per multiply-add (a query's scores and its sum
 * of values) against the products with the weights' (per row and weight),
 * on this model's backend and path: the blend's cost model (--speedup,
 * blend.c) weighs a key a row sees by it. */
float cb_model_attn_cost(const cb_model *m);
/* The query rows one attention task of this model's backend computes
 * together, each against every key up to the last of them (its
 * attn_pairs over the query heads a KV head serves); 0: not declared. */
int32_t cb_model_attn_rows(const cb_model *m);
/* What scoring the cached keys by a query's attention (attn_mass) costs a
 * (row, key) against the attention's, for the blend's cost model. */
float cb_model_score_cost(const cb_model *m);
/* What placing a byte of a cached row's KV in the cache costs against a
 * multiply-add of the products with the weights (0: loading overlaps the
 * compute), for the blend's cost model. */
float cb_model_load_cost(const cb_model *m);
const cb_gguf *cb_model_gguf(const cb_model *m);
/* n bytes of host memory that the model's backend copies from directly
 * (CUDA: page-locked; else malloc's), NULL when there is none; *async
 * says whether it is the backend's, to be given to cb_model_host_free and
 * sent with cb_kv_scratch.async. */
void *cb_model_host_alloc(const cb_model *m, size_t n, int *async);
void cb_model_host_free(const cb_model *m, void *p, int async);
/* Timing marks on the work the calling thread queues: the backend's
 * (backend.h's mark_new: a device's time) or, where it has none, the
 * host's clock at the call.  cb_model_mark_ms gives the milliseconds from
 * a to z, waiting for z's work; negative when either was not recorded (or
 * the backend failed).  new: NULL when out of memory (or the backend's
 * fault). */
typedef struct cb_mark cb_mark;
cb_mark *cb_model_mark_new(const cb_model *m);
void cb_model_mark_free(const cb_model *m, cb_mark *mk);
void cb_model_mark_record(const cb_model *m, cb_mark *mk);
double cb_model_mark_ms(const cb_model *m, const cb_mark *a, const cb_mark *z);
/* whether the marks are the backend's (a device's clock) */
int cb_model_marks_on_device(const cb_model *m);
/* Spans: each begun and ended on one thread's work (begin records a new
 * pair's first mark, end its second), cb_spans_ms their sum (waiting for
 * the last), negative when a mark could not be made or read.  new: NULL
 * when out of memory; every function takes a NULL (and does nothing). */
typedef struct cb_spans cb_spans;
cb_spans *cb_spans_new(const cb_model *m);
void cb_spans_free(cb_spans *s);
void cb_spans_begin(cb_spans *s);
void cb_spans_end(cb_spans *s);
double cb_spans_ms(const cb_spans *s);

/* ------------------------------------------------------------- KV cache */

/* A chunk's K and V of one layer (f32) into rows pos.., K rotated from
 * from_pos0..: the loaders' (lib/kv) way in; a client reaches a cache
 * through cb_blend_prefill. */
cb_status cb_kvcache_load(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, const float *k,
                          const float *v, int32_t from_pos0);

/* Order the calling thread's next work on layer `layer` of the cache
 * after the loads another thread queued into it (a device-side wait;
 * nothing on the CPU).  The forward's operations on the layer do it; a
 * caller timing the wait does it first. */
void cb_kvcache_after_loads(const cb_kvcache *kv, int32_t layer);
/* The other way: the calling thread hands the cache to another thread's
 * loads (it marks the work it queued on the cache so far), and the loading
 * thread orders its writes after that work (cb_kvcache_before_loads, before
 * its first).  On a device each thread queues on its own stream: without
 * it, a blend's loader could write layers that a previous pass over the
 * same cache (a failed blend that is retried) has still to compute.
 * Device-side only; nothing on the CPU. */
void cb_kvcache_hand_over(cb_kvcache *kv);
void cb_kvcache_before_loads(const cb_kvcache *kv);

int32_t cb_kvcache_n_ctx(const cb_kvcache *kv);
cb_type cb_kvcache_type(const cb_kvcache *kv);
const cb_model *cb_kvcache_model(const cb_kvcache *kv);
/* cb_kvcache_load from n rows of type t as a KV file holds them (k, v:
 * host, [n, width] rows of cb_type_row_bytes(t, width)), each key
 * multiplied by key_scale (1: as they are) before it is moved.  Rows of the
 * cache's own type are sent as they are (half the bytes of f32 for f16):
 * V into its rows, K expanded, scaled and rotated on the backend; rows of
 * another type go through f32 on the host.  Errors as cb_kvcache_load, and
 * cb_dequant_row's for another type. */
cb_status cb_kvcache_load_rows(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, cb_type t,
                               const void *k, const void *v, int32_t from_pos0, float key_scale);
/* cb_kvcache_load_rows for several segments of one layer (cb-run's loader:
 * every cached chunk's rows of the layer): the same rows, the same bits,
 * in fewer backend operations (the keys of all the segments read back,
 * scaled, moved and written as one, the layer's mark recorded once).
 * sc is scratch kept from call to call (zeroed first; one thread, one
 * cache), freed with cb_kv_scratch_free.  Errors as cb_kvcache_load_rows;
 * on one, the layer's rows are undefined. */
typedef struct cb_kv_seg {
    int32_t pos, n, from_pos0; /* n rows computed at from_pos0.., placed at pos.. */
    cb_type type;              /* of the rows k and v (host) */
    const void *k, *v;
    float key_scale;
} cb_kv_seg;
typedef struct cb_kv_scratch {
    float *tmp; /* backend [cap, width] */
    int32_t *at, *delta;
    int64_t cap;
    int32_t group; /* segments placed together: 0, the backend's choice (a device: all;
                    * the CPU: one, its rows still in the cache when read back) */
    int async;     /* the rows are in the backend's host_alloc memory: sent with
                    * upload_async, and the caller syncs before it changes them */
} cb_kv_scratch;
cb_status cb_kvcache_load_segs(cb_kvcache *kv, int32_t layer, const cb_kv_seg *segs, int32_t n_segs,
                               cb_kv_scratch *sc);
void cb_kv_scratch_free(const cb_kvcache *kv, cb_kv_scratch *sc);
/* The segments cb_kvcache_load_segs places together: sc->group, else the
 * backend's choice (0: all of them; the CPU: 1, so that a caller reading
 * them one by one places each as soon as it is read, its rows still in
 * the cache). */
int32_t cb_kv_scratch_group(const cb_kvcache *kv, const cb_kv_scratch *sc);
/* Copy n rows of layer `layer`'s K (which 0) or V (which 1) starting at
 * position pos0 to or from f32 host memory [n, n_head_kv*head_dim].
 * K is stored after RoPE, at its position.  Errors: CB_ERR_RANGE. */
cb_status cb_kvcache_read(const cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                          float *dst);
cb_status cb_kvcache_write(cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                           const float *src);

/* -------------------------------------------------------- forward pass */

/* The activations of a batch of up to n_max tokens, with the layer-wise API
 * that full prefill, decoding and cache blending are built from:
 *   cb_fwd_embed   tokens -> hidden rows 0..n-1, each with its position
 *   cb_fwd_layer   one transformer layer for a chosen subset of rows: their
 *                  Q/K/V, K/V written into the cache at their positions,
 *                  attention of each over cache positions <= its own (an
 *                  exact causal mask), the MLP; other rows are left as they are
 *   cb_fwd_logits  final norm and output projection for chosen rows
 * A cb_fwd allocates all its scratch at creation (logits are computed
 * eight rows at a time into a buffer of their own), and the CPU backend
 * sizes its scratch when it is created and when a model's weights are
 * loaded: on the CPU, embed, layer, logits, deviation and cb_model_eval
 * allocate nothing.  (The CUDA backend takes some per-call scratch from its
 * stream-ordered pool; the cache transfers cb_kvcache_read, _write and
 * _load stage their rows in a buffer of their own per call.) */
/* The model f was made for. */
const cb_model *cb_fwd_model(const cb_fwd *f);
/* The part of cb_fwd_layer that later tokens need: the K and V of rows
 * (NULL: all) written into the cache; no attention, no MLP, the hidden
 * states untouched.  A prefill's last layer needs no more for the rows whose
 * output nothing reads (all but the one whose logits are taken).  Errors:
 * those of cb_fwd_layer. */
cb_status cb_fwd_layer_kv(cb_fwd *f, cb_kvcache *kv, int32_t layer, const int32_t *rows,
                          int32_t n_rows);
/* The last layer of a prefill whose output only out_row's logits read:
 * cb_fwd_layer_kv for the rows (NULL: all) but the last, then cb_fwd_layer
 * for the last, which must be out_row (else the whole layer for every
 * row).  Every row's K/V is as cb_fwd_layer writes it; only out_row's
 * hidden state goes through the layer (about 1/n_layer of a prefill's
 * products and attention saved). */
cb_status cb_fwd_last_layer(cb_fwd *f, cb_kvcache *kv, const int32_t *rows, int32_t n_rows,
                            int32_t out_row);
/* The first step of cb_fwd_layer alone, for inspection: the attention
 * norm and Q/K/V projections of rows (NULL: all) at their positions, with
 * RoPE applied to Q and K, copied to host f32 arrays q [n, n_head*hd]
 * (may be NULL), k and v [n, n_head_kv*hd] (may be NULL).  The cache and
 * the hidden states are not touched.  Errors: CB_ERR_RANGE, CB_ERR_NOMEM. */
cb_status cb_fwd_layer_qkv(cb_fwd *f, int32_t layer, const int32_t *rows, int32_t n_rows, float *q,
                           float *k, float *v);
/* Blending's attention mass (the probe strategy's score), summed over
 * layers in the backend's memory with one copy back for all of them (a
 * device waits for its queue at each copy back).  A layer's mass: for the
 * queries of the last cb_fwd_layer (or _qkv with q) on f for its rows[from
 * .. from+n), at `layer`, each head's softmax attention over the cache rows
 * the engine's mask lets the row see (0..its position; on a sliding-window
 * layer the last `window` of them), added to the sum's key j for every j <
 * n_keys; with by_value, each probability times the L2 norm of key j's
 * value row in the head's KV head (what the token adds to the head's
 * output scales with it).  Computed on the model's backend where it has
 * the operation, else on the host.  cb_fwd_mass_begin starts a sum of
 * n_keys zeros on f (CB_ERR_INVALID when one is open), each cb_fwd_mass_add
 * adds a layer (errors: CB_ERR_RANGE: not rows of that call, a position at
 * or past n_keys, n_keys past the cache; CB_ERR_NOMEM, CB_ERR_UNSUPPORTED,
 * CB_ERR_DEVICE), cb_fwd_mass_end copies the sum into mass (host [n_keys];
 * NULL: dropped) and ends it (cb_fwd_free also does). */
cb_status cb_fwd_mass_begin(cb_fwd *f, int32_t n_keys, int by_value);
cb_status cb_fwd_mass_add(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int32_t from, int32_t n);
cb_status cb_fwd_mass_end(cb_fwd *f, float *mass);
/* Blending's stale scale: until set again, every attention over kv (a
 * prefill's rows, decode steps) adds bias to the scores of its rows
 * flagged in stale[0..n) (host, copied); n = 0 clears it.  Errors:
 * CB_ERR_UNSUPPORTED (the backend has no such operation), CB_ERR_RANGE (n
 * past the cache), CB_ERR_NOMEM; nothing is flagged after any of them. */
cb_status cb_kvcache_set_stale(cb_kvcache *kv, const uint8_t *stale, int32_t n, float bias);
/* Blending's selection: recompute K (which 0) or V (1) of `rows` at
 * `layer` from the hidden state (as cb_fwd_layer_qkv), and return in top
 * the k rows whose fresh values are farthest (squared L2) from the cache's
 * at the same positions, farthest first, equal distances by earlier row.
 * Computed on the model's backend; only the k row numbers come back. */
cb_status cb_fwd_deviation(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int which,
                           const int32_t *rows, int32_t n_rows, int32_t k, int32_t *top);
/* logits [n_rows, n_vocab] for rows (NULL: all). */
cb_status cb_fwd_logits(cb_fwd *f, const int32_t *rows, int32_t n_rows, float *logits);

/* Evaluate n tokens at positions pos0..pos0+n-1 through every layer, in
 * batches of the cb_fwd's n_max, writing their KV into the cache; logits of
 * the last token go to `logits` (n_vocab floats) when not NULL.  This is
 * ordinary prefill (n > 1) and decoding (n == 1).  The last layer computes
 * only K/V for the other rows (cb_fwd_last_layer): afterwards their hidden
 * states are those before it. */
cb_status cb_model_eval(cb_fwd *f, cb_kvcache *kv, const int32_t *tokens, int32_t n, int32_t pos0,
                        float *logits);

/* One decoding step of n independent sequences together: sequence i's
 * token tokens[i] at position pos[i] of its own cache kv[i] (n distinct
 * caches of f's model; positions below pos[i] already in it), through
 * every layer, its K/V written into kv[i]; logits [n, n_vocab] (host)
 * receive each sequence's next-token logits.  The matrix products take
 * every sequence's row at once (decoding is bound by reading the weights,
 * so n tokens cost little more than one); attention runs for each row over
 * its own cache.  Sequence i's results are the same bits whatever it is
 * decoded with, or alone (n = 1): the products run only on row counts the
 * backend keeps row-stable (lib/backend/backend.h), padded with copies of
 * row 0 that write nothing.  f must hold cb_fwd_decode_rows(m, n) rows;
 * its hidden states are overwritten.  Errors: CB_ERR_INVALID (n < 1, more
 * rows than f holds, a cache given twice), CB_ERR_RANGE (a token id, a
 * position outside its cache, a cache of another model). */
cb_status cb_fwd_decode(cb_fwd *f, cb_kvcache *const *kv, const int32_t *tokens, const int32_t *pos,
                        int32_t n, float *logits);
/* The rows a cb_fwd needs for cb_fwd_decode of n sequences (n rounded up
 * to the backend's row-stable step); 0 for n < 1. */
int32_t cb_fwd_decode_rows(const cb_model *m, int32_t n);

/* -------------------------------------------------------------- hashing */

/* cb_gguf_fingerprint, remembered across processes: when dir holds a
 * record for the file at path (mapped as g) made while the file had its
 * present device, inode, size, modification and status-change times, its
 * fingerprint without hashing; else computed and recorded there (one small
 * file, made atomically; dir is created, mode 0700; failing to record is
 * not an error).  A file rewritten in place changes its status-change
 * time, which no one can set back, so a stale record is never used.  dir
 * NULL: always computed.  Errors: those of cb_gguf_fingerprint. */
cb_status cb_gguf_fingerprint_cached(const cb_gguf *g, const char *path, const char *dir,
                                     cb_hash128 *out);

/* --------------------------------------------------------------- sampler */

typedef struct cb_sampler cb_sampler;

/* A sampler applying, in llama.cpp's default order, top-k, top-p, min-p,
 * temperature, then a draw from its own seeded generator.  NULL on OOM. */
cb_sampler *cb_sampler_new(const cb_sampler_params *p);
void cb_sampler_free(cb_sampler *s);
/* Pick a token from n_vocab logits (not modified).  Returns -1 for NULL
 * arguments, n_vocab < 1, or when growing its scratch fails. */
int32_t cb_sampler_sample(cb_sampler *s, const float *logits, int32_t n_vocab);

/* ---------------------------------------------------------- chat templates */

/* Recognise a tokenizer.chat_template (Jinja text) the way llama.cpp does;
 * CB_CHAT_NONE when it is empty or unknown. */
cb_chat_kind cb_chat_detect(cb_strview tmpl);

/* The system message a (chatml) template writes when the conversation has
 * none, malloc'd (Qwen2.5's "You are Qwen, ..."); NULL when it writes none.
 * llama.cpp's built-in templates leave it out; the model was trained with it. */
char *cb_chat_default_system(cb_strview tmpl);

/* One system + user exchange rendered in three parts, so that a caller can
 * put its own tokens (cached chunks) between them without re-tokenizing:
 *   prefix  : everything before the user's text (system turn, user header)
 *   suffix  : everything after it (end of turn, assistant header)
 * prefix + user text + suffix is the template's rendering with
 * add_generation_prompt, as llama.cpp's built-in templates render it (which
 * trim the user text for llama3 and gemma: pass it trimmed to match).  With
 * system NULL or empty there is no system turn (templates without a system
 * role, such as gemma's, put it before the user text in prefix).  BOS is not
 * included: the tokenizer adds it when the model wants it.  Strings are malloc'd; free with
 * cb_chat_parts_free.  Errors: CB_ERR_NOMEM, CB_ERR_INVALID (CB_CHAT_NONE). */
typedef struct cb_chat_parts {
    char *prefix;
    char *suffix;
} cb_chat_parts;
cb_status cb_chat_render(cb_chat_kind k, const char *system, cb_chat_parts *out);
void cb_chat_parts_free(cb_chat_parts *p);

#ifdef __cplusplus
}
#endif
#endif /* CB_INFER_H */
