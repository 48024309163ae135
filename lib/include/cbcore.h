/*
 * cbcore.h - the public interface of libcbcore, the library behind the
 * cacheblend tools (cb-chunk, cb-precompute, cb-store, cb-profile, cb-run).
 *
 * Conventions
 *   - Objects are opaque handles created by cb_<object>_open/_new/_load and
 *     released by cb_<object>_free; every _free accepts NULL.
 *   - Functions that can fail return enum cb_status (CB_OK == 0, errors < 0).
 *     Functions that create an object also take a cb_error *, which (when not
 *     NULL) receives the status and a one-line message naming the file and
 *     the problem.  After an error no output argument is touched and nothing
 *     is leaked.
 *   - The library never prints and never exits.
 *   - A compute device that fails while a model computes (a CUDA error, a
 *     kernel's memory fault) makes the function that finds it return
 *     CB_ERR_DEVICE; the fault is sticky, so every later computation with
 *     that model fails the same way, and cb_model_strerror says what
 *     failed.  Free what was made with the model, then the model.
 *   - Strings read from files are not NUL-terminated: they are cb_strview
 *     views (pointer + length) borrowed from the object that owns the bytes.
 */
#ifndef CBCORE_H
#define CBCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The release: the one place it is written.  The Makefile reads it from here
 * for libcbcore.pc and the man pages it installs. */
#define CB_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------ core */

typedef enum cb_status {
    CB_OK = 0,
    CB_ERR_NOMEM = -1,       /* out of memory */
    CB_ERR_IO = -2,          /* read or write failed */
    CB_ERR_NOT_FOUND = -3,   /* file (or key, tensor, token) missing */
    CB_ERR_FORMAT = -4,      /* malformed input data: GGUF, JSON, KV file */
    CB_ERR_UNSUPPORTED = -5, /* well-formed but not supported (type, arch) */
    CB_ERR_INVALID = -6,     /* invalid argument from the caller */
    CB_ERR_RANGE = -7,       /* value out of range (token id, index) */
    CB_ERR_CREATE = -8,      /* cannot create an output file */
    CB_ERR_INTERNAL = -9,    /* a bug: an invariant did not hold */
    CB_ERR_CHECKSUM = -10,   /* stored data does not match its checksum */
    CB_ERR_MISMATCH = -11,   /* data made for another model */
    CB_ERR_DEVICE = -12      /* the compute device is not available, or failed (a device fault) */
} cb_status;

#define CB_ERROR_MSG_MAX 512

/* Error detail for functions that create objects. */
typedef struct cb_error {
    cb_status status;
    char msg[CB_ERROR_MSG_MAX];
} cb_error;

/* A borrowed, not NUL-terminated string. */
typedef struct cb_strview {
    const char *data;
    size_t len;
} cb_strview;

/* Short English description of a status ("malformed input data", ...).
 * Never NULL. */
const char *cb_strerror(cb_status st);

/* Set *err (when not NULL) to st and a printf-formatted message; returns st
 * so that callers can write `return cb_error_set(err, CB_ERR_IO, ...)`. */
cb_status cb_error_set(cb_error *err, cb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Compare a view with a NUL-terminated string. 1 when equal. */
int cb_strview_eq(cb_strview a, const char *s);

/* Milliseconds on a monotonic clock (CLOCK_MONOTONIC) from an arbitrary
 * origin: for measuring durations (time to first token, load and compute
 * times), never for dates. */
double cb_now_ms(void);

/* A read-only memory mapping of a whole file. */
typedef struct cb_mmap {
    const uint8_t *data;
    size_t size;
} cb_mmap;

/* Map `path` read-only.  An empty file maps to data == NULL, size == 0.
 * Errors: CB_ERR_NOT_FOUND (missing or unreadable), CB_ERR_IO. */
cb_status cb_mmap_open(cb_mmap *m, const char *path, cb_error *err);
/* Unmap; accepts a zeroed or already-closed mapping. */
void cb_mmap_close(cb_mmap *m);

/* Write `size` bytes to `path` atomically: a temporary file in the same
 * directory, fsync, rename, fsync of the directory.  On error `path` is as
 * it was and the temporary file is removed.  Errors: CB_ERR_CREATE, CB_ERR_IO. */
cb_status cb_file_write_atomic(const char *path, const void *data, size_t size, cb_error *err);
/* The same for content produced piece by piece: emit(ctx, fd, err) writes
 * it to fd (cb_fd_write_all) and returns CB_OK, or an error with err set. */
typedef cb_status (*cb_emit_fn)(void *ctx, int fd, cb_error *err);
cb_status cb_file_write_atomic_fn(const char *path, cb_emit_fn emit, void *ctx, cb_error *err);
/* write(2) all of data to fd, retrying on EINTR.  Errors: CB_ERR_IO (err
 * names `what`). */
cb_status cb_fd_write_all(int fd, const void *data, size_t size, const char *what, cb_error *err);

/* ---------------------------------------------------------- tensor types */

/* Tensor element types, numbered as in GGUF (ggml_type). */
typedef enum cb_type {
    CB_TYPE_F32 = 0,
    CB_TYPE_F16 = 1,
    CB_TYPE_Q4_0 = 2,
    CB_TYPE_Q4_1 = 3,
    CB_TYPE_Q5_0 = 6,
    CB_TYPE_Q5_1 = 7,
    CB_TYPE_Q8_0 = 8,
    CB_TYPE_Q8_1 = 9,
    CB_TYPE_Q2_K = 10,
    CB_TYPE_Q3_K = 11,
    CB_TYPE_Q4_K = 12,
    CB_TYPE_Q5_K = 13,
    CB_TYPE_Q6_K = 14,
    CB_TYPE_Q8_K = 15,
    CB_TYPE_IQ2_XXS = 16,
    CB_TYPE_IQ2_XS = 17,
    CB_TYPE_IQ3_XXS = 18,
    CB_TYPE_IQ1_S = 19,
    CB_TYPE_IQ4_NL = 20,
    CB_TYPE_IQ3_S = 21,
    CB_TYPE_IQ2_S = 22,
    CB_TYPE_IQ4_XS = 23,
    CB_TYPE_I8 = 24,
    CB_TYPE_I16 = 25,
    CB_TYPE_I32 = 26,
    CB_TYPE_I64 = 27,
    CB_TYPE_F64 = 28,
    CB_TYPE_IQ1_M = 29,
    CB_TYPE_BF16 = 30,
    CB_TYPE_TQ1_0 = 34,
    CB_TYPE_TQ2_0 = 35,
    CB_TYPE_COUNT_ = 40
} cb_type;

/* Name as GGUF tools print it ("q4_K", "f16"), or NULL for an unknown id. */
const char *cb_type_name(cb_type t);
/* Elements per block (1 for plain types), 0 for an unknown id. */
int64_t cb_type_block_elems(cb_type t);
/* Bytes per block, 0 for an unknown id. */
size_t cb_type_block_bytes(cb_type t);
/* Bytes of a row of n elements; 0 when the type is unknown or n is not a
 * multiple of the block size. */
size_t cb_type_row_bytes(cb_type t, int64_t n);
/* 1 when cb_dequant_row (and cb_quant_row) support the type. */
int cb_type_is_supported(cb_type t);

/* Convert n elements of type t at src into f32 at dst.  n must be a multiple
 * of the block size.  src needs no alignment.
 * Errors: CB_ERR_UNSUPPORTED (type), CB_ERR_INVALID (n). */
cb_status cb_dequant_row(cb_type t, const void *src, float *dst, int64_t n);

/* Quantize n f32 values into type t (round to nearest, no search: good for
 * fixtures, not for publishing models).  dst holds cb_type_row_bytes(t, n).
 * Errors: CB_ERR_UNSUPPORTED, CB_ERR_INVALID. */
cb_status cb_quant_row(cb_type t, const float *src, void *dst, int64_t n);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float cb_f16_to_f32(uint16_t h);
uint16_t cb_f32_to_f16(float f);
float cb_bf16_to_f32(uint16_t h);
uint16_t cb_f32_to_bf16(float f);

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

typedef struct cb_gguf cb_gguf;

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

/* Open a GGUF file (version 2 or 3) by memory-mapping it, and validate all of
 * it: header, every metadata entry, every tensor info, tensor bounds and
 * alignment.  Nothing is read outside the file, whatever its contents.
 * Errors: CB_ERR_NOT_FOUND, CB_ERR_IO, CB_ERR_FORMAT (malformed or truncated),
 * CB_ERR_UNSUPPORTED (another GGUF version), CB_ERR_NOMEM. */
cb_status cb_gguf_open(cb_gguf **out, const char *path, cb_error *err);

/* The same over bytes the caller keeps alive until cb_gguf_free (nothing is
 * copied).  `name` is used in messages. */
cb_status cb_gguf_open_memory(cb_gguf **out, const void *data, size_t size, const char *name,
                              cb_error *err);

void cb_gguf_free(cb_gguf *g);

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

typedef struct cb_vocab cb_vocab;

/* Token attributes, as llama.cpp derives them from tokenizer.ggml.token_type. */
enum {
    CB_TOKEN_NORMAL = 1 << 0,
    CB_TOKEN_UNKNOWN = 1 << 1,
    CB_TOKEN_CONTROL = 1 << 2,
    CB_TOKEN_USER_DEFINED = 1 << 3,
    CB_TOKEN_UNUSED = 1 << 4,
    CB_TOKEN_BYTE = 1 << 5
};

typedef enum cb_vocab_kind {
    CB_VOCAB_BPE = 1, /* tokenizer.ggml.model "gpt2": byte-level BPE */
    CB_VOCAB_SPM = 2  /* "llama": SentencePiece-style BPE with byte fallback */
} cb_vocab_kind;

/* Load the tokenizer described by a GGUF's tokenizer.ggml.* metadata.  The
 * vocab copies what it needs; `g` may be freed afterwards.
 * Errors: CB_ERR_FORMAT (missing or inconsistent metadata),
 * CB_ERR_UNSUPPORTED (tokenizer model or pre-tokenizer not supported: the
 * message names it), CB_ERR_NOMEM. */
cb_status cb_vocab_load(cb_vocab **out, const cb_gguf *g, cb_error *err);
void cb_vocab_free(cb_vocab *v);

cb_vocab_kind cb_vocab_kind_of(const cb_vocab *v);
int32_t cb_vocab_n_tokens(const cb_vocab *v);
/* Pre-tokenizer name as in tokenizer.ggml.pre ("default" when absent). */
const char *cb_vocab_pre(const cb_vocab *v);
/* Special token ids, -1 when the model has none. */
int32_t cb_vocab_bos(const cb_vocab *v);
int32_t cb_vocab_eos(const cb_vocab *v);
int32_t cb_vocab_eot(const cb_vocab *v);
int cb_vocab_add_bos(const cb_vocab *v);
int cb_vocab_add_eos(const cb_vocab *v);
/* Text of a token as stored in the vocabulary, and its CB_TOKEN_* attrs;
 * {NULL,0} and 0 for an id out of range. */
cb_strview cb_vocab_token_text(const cb_vocab *v, int32_t id);
uint32_t cb_vocab_token_attr(const cb_vocab *v, int32_t id);
/* 1 when the id ends a generation (EOS, EOT, or another end-of-generation token). */
int cb_vocab_is_eog(const cb_vocab *v, int32_t id);

/* A growable array of token ids. */
typedef struct cb_tokens {
    int32_t *ids;
    size_t n, cap;
} cb_tokens;
void cb_tokens_free(cb_tokens *t); /* frees ids and zeroes the struct */
cb_status cb_tokens_push(cb_tokens *t, int32_t id);

enum {
    CB_TOK_ADD_SPECIAL = 1 << 0,  /* add BOS/EOS as the metadata says */
    CB_TOK_PARSE_SPECIAL = 1 << 1 /* match control tokens in the text */
};

/* Tokenize len bytes of text, appending ids to *out, exactly as llama.cpp's
 * llama_tokenize(vocab, text, add_special, parse_special).  User-defined
 * tokens are always matched; control tokens only with CB_TOK_PARSE_SPECIAL.
 * Invalid UTF-8 is tokenized as llama.cpp does: byte-level BPE vocabs see
 * each bad byte as U+FFFD, SentencePiece vocabs fall back to byte tokens.
 * Errors: CB_ERR_NOMEM. */
cb_status cb_tok_encode(const cb_vocab *v, const char *text, size_t len, unsigned flags,
                        cb_tokens *out);

enum {
    CB_DETOK_REMOVE_SPECIAL = 1 << 0, /* drop a leading BOS / trailing EOS the model adds */
    CB_DETOK_UNPARSE_SPECIAL = 1 << 1 /* render control tokens as their text */
};

/* The bytes a token stands for (byte-level decoding, byte tokens, the SPM
 * space marker), appended to buf[*len..] growing *buf with realloc as
 * needed.  Control tokens render only with CB_DETOK_UNPARSE_SPECIAL.
 * Errors: CB_ERR_RANGE (bad id), CB_ERR_NOMEM. */
cb_status cb_tok_piece(const cb_vocab *v, int32_t id, unsigned flags, char **buf, size_t *len,
                       size_t *cap);

/* Detokenize n ids into a malloc'd NUL-terminated string (*text, length
 * *len), as llama.cpp's llama_detokenize; for SPM vocabs that add a space
 * prefix, the leading space of the first piece is removed, so that
 * decode(encode(s)) == s for valid UTF-8 (except where a vocab's own
 * clean-up rule applies, as llama.cpp's gpt-2 vocab drops the space in " ?").  Errors: CB_ERR_RANGE, CB_ERR_NOMEM. */
cb_status cb_tok_decode(const cb_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                        char **text, size_t *len);


/* ----------------------------------------------------------------- model */

typedef struct cb_model cb_model;

/* Architecture parameters read from GGUF metadata. */
typedef struct cb_hparams {
    char arch[32]; /* "llama", "qwen2", "qwen3", "gemma3" */
    int32_t n_layer;
    int32_t n_embd;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim; /* per head, for Q, K and V */
    int32_t n_ff;
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_rot; /* RoPE dimensions per head */
    float rope_base;
    int rope_neox; /* 0: pairs (2i, 2i+1) (llama); 1: (i, i+n_rot/2) (qwen2, qwen3, gemma3) */
    float norm_eps;
    int tied_output;      /* output projection is token_embd */
    float rope_scale;     /* linear RoPE scaling factor of the global layers (1: none) */
    int rope_freqs;       /* 1: per-pair RoPE frequency factors (Llama 3's rope_freqs) */
    int32_t n_swa;        /* sliding window of the local layers (gemma3), 0: none */
    int32_t n_swa_layers; /* how many layers use it */
    float rope_base_swa;  /* RoPE base of the sliding-window layers */
} cb_hparams;

typedef struct cb_model_params {
    int n_threads;        /* <= 0: every core */
    const char *device;   /* "cpu" (also NULL, ""), "cuda", "cuda:N", or
                              "auto": CUDA device 0 when one is present,
                              else cpu (the programs' default) */
    int exact;            /* 0 (the default): the CPU's products with
                              block-quantized weights quantize their
                              activations to 8 bits (per 32, or per 256
                              for K-quants in batches; as llama.cpp:
                              faster, not exact); 1: f32 activations in
                              every product, the reference path.  A device
                              without an exact path (cuda: f16 products)
                              refuses 1 (CB_ERR_UNSUPPORTED). */
    const char *fp_cache; /* a directory that remembers model fingerprints
                              across loads (cb_gguf_fingerprint_cached; the
                              programs: ~/.cache/cacheblend/fingerprints);
                              NULL: hashed at every load */
} cb_model_params;

/* Load a model: GGUF metadata, tokenizer and every weight, onto a compute
 * backend (p->device).  Architectures: llama (Llama 2/3, Mistral, SmolLM;
 * Llama 3.x's rope_freqs), qwen2, qwen3 and gemma3; anything else, or a
 * RoPE scaling type other than none and linear, is CB_ERR_UNSUPPORTED
 * naming it.  A missing or
 * misshapen tensor is CB_ERR_FORMAT naming it.  A device name that does
 * not parse is CB_ERR_INVALID; a CUDA device asked for by name but absent
 * (or a build without the CUDA module) is CB_ERR_DEVICE.  p may be NULL. */
cb_status cb_model_load(cb_model **out, const char *path, const cb_model_params *p, cb_error *err);
void cb_model_free(cb_model *m);
const cb_hparams *cb_model_hparams(const cb_model *m);
/* Layer l's attention window: > 0 for a sliding-window layer (a row at
 * position p sees keys p-window+1..p), 0 for a global one (keys 0..p); and
 * its RoPE base.  l must be in range. */
int32_t cb_model_layer_window(const cb_model *m, int32_t l);
float cb_model_layer_rope_base(const cb_model *m, int32_t l);
/* What the engine multiplies a query's dot products with the keys by
 * before the softmax: 1/sqrt(head_dim) (gemma3 27B: 1/sqrt(n_embd /
 * n_head), as llama.cpp). */
float cb_model_attn_scale(const cb_model *m);
const cb_vocab *cb_model_vocab(const cb_model *m);
const cb_gguf *cb_model_gguf(const cb_model *m);
/* The compute backend's kind, "cpu" or "cuda" (profiles are kept per
 * kind), and the device, described: "cpu (2 threads)", "cuda:0 (NVIDIA
 * H100 80GB HBM3, sm_90, 79 GiB)". */
const char *cb_model_backend(const cb_model *m);
const char *cb_model_device(const cb_model *m);
/* Wait until the work this thread queued on the model's device is done
 * (a GPU runs it asynchronously; a no-op on the CPU).  Functions that
 * return data to the host wait by themselves; this is for timing.
 * Returns CB_OK, or the device's fault (CB_ERR_DEVICE, see Conventions). */
cb_status cb_model_sync(const cb_model *m);
/* What status st, returned by a computation with m, means: after a device
 * fault, the fault's own message ("cuda:0: matmul: an illegal memory
 * access was encountered (cublasGemmEx(...) at lib/cuda/cuda_mm.cu:343)"),
 * else cb_strerror(st).  Valid while m is; m may be NULL. */
const char *cb_model_strerror(const cb_model *m, cb_status st);

/* ------------------------------------------------------------- KV cache */

/* An in-memory KV cache: per layer, K and V rows indexed by position
 * (row p holds the token at position p), f16 or f32 elements.  Attention at
 * position p reads rows 0..p, so every position below a query's must have
 * been written first. */
typedef struct cb_kvcache cb_kvcache;

/* Errors: CB_ERR_INVALID (type not F16/F32, n_ctx < 1), CB_ERR_NOMEM. */
cb_status cb_kvcache_new(cb_kvcache **out, const cb_model *m, int32_t n_ctx, cb_type type);
void cb_kvcache_free(cb_kvcache *kv);
/* The bytes of K and V a cache of n_ctx positions of type `type` holds
 * (what cb_kvcache_new allocates for them: every layer's K and V). */
uint64_t cb_kvcache_bytes(const cb_model *m, int32_t n_ctx, cb_type type);
int32_t cb_kvcache_n_ctx(const cb_kvcache *kv);
cb_type cb_kvcache_type(const cb_kvcache *kv);
/* Copy n rows of layer `layer`'s K (which 0) or V (which 1) starting at
 * position pos0 to or from f32 host memory [n, n_head_kv*head_dim].
 * K is stored after RoPE, at its position.  Errors: CB_ERR_RANGE. */
cb_status cb_kvcache_read(const cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                          float *dst);
cb_status cb_kvcache_write(cb_kvcache *kv, int32_t layer, int which, int32_t pos0, int32_t n,
                           const float *src);
/* Load a chunk's K and V for one layer (f32 host [n, n_head_kv*head_dim])
 * into cache rows pos..pos+n-1, rotating K from the positions it was
 * computed at (from_pos0..) to its new ones: RoPE is a rotation, so this is
 * exact up to rounding.  k and v may be reused on return.  On a GPU the
 * copy is queued on the calling thread's stream and marked with an event:
 * work any thread queues on this layer afterwards (once the caller has
 * handed the layer over, e.g. through a mutex) waits for it on the device;
 * cb_model_sync waits for it on the host.  Errors: CB_ERR_RANGE,
 * CB_ERR_NOMEM. */
cb_status cb_kvcache_load(cb_kvcache *kv, int32_t layer, int32_t pos, int32_t n, const float *k,
                          const float *v, int32_t from_pos0);

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
typedef struct cb_fwd cb_fwd;

cb_status cb_fwd_new(cb_fwd **out, const cb_model *m, int32_t n_max);
void cb_fwd_free(cb_fwd *f);
const cb_model *cb_fwd_model(const cb_fwd *f);
/* Errors: CB_ERR_INVALID (n > n_max), CB_ERR_RANGE (token id). */
cb_status cb_fwd_embed(cb_fwd *f, const int32_t *tokens, const int32_t *pos, int32_t n);
/* rows: indices into the embedded batch, or NULL for all.  Errors:
 * CB_ERR_RANGE (layer, row, or a position past the cache). */
cb_status cb_fwd_layer(cb_fwd *f, cb_kvcache *kv, int32_t layer, const int32_t *rows,
                       int32_t n_rows);
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
/* The queries (RoPE applied) that the last cb_fwd_layer (or _qkv with q)
 * on f computed for its rows[from .. from+n), copied to q [n, n_head*hd];
 * what those rows attended with, without projecting them again.  Errors:
 * CB_ERR_RANGE (not rows of that call; a call that failed computed none). */
cb_status cb_fwd_layer_queries(const cb_fwd *f, int32_t from, int32_t n, float *q);
/* Blending's attention mass (the probe strategy's score): for the queries
 * of the last cb_fwd_layer (or _qkv with q) on f for its rows[from ..
 * from+n), at `layer`, each head's softmax attention over the cache rows
 * the engine's mask lets the row see (0..its position; on a
 * sliding-window layer the last `window` of them), added to mass[j] for
 * every key j < n_keys (host [n_keys], accumulated: the caller zeroes it
 * once and sums layers into it).  Computed on the model's backend where it
 * has the operation, else on the host.  Errors: CB_ERR_RANGE (not rows of
 * that call, a position at or past n_keys, n_keys past the cache),
 * CB_ERR_NOMEM, CB_ERR_UNSUPPORTED. */
cb_status cb_fwd_attn_mass(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int32_t from, int32_t n,
                           int32_t n_keys, float *mass);
/* Blending's selection: recompute K (which 0) or V (1) of `rows` at
 * `layer` from the hidden state (as cb_fwd_layer_qkv), and return in top
 * the k rows whose fresh values are farthest (squared L2) from the cache's
 * at the same positions, farthest first, equal distances by earlier row.
 * Computed on the model's backend; only the k row numbers come back. */
cb_status cb_fwd_deviation(cb_fwd *f, const cb_kvcache *kv, int32_t layer, int which,
                           const int32_t *rows, int32_t n_rows, int32_t k, int32_t *top);
/* logits [n_rows, n_vocab] for rows (NULL: all). */
cb_status cb_fwd_logits(cb_fwd *f, const int32_t *rows, int32_t n_rows, float *logits);
/* The hidden state of row `row` after the layers run so far [n_embd]. */
cb_status cb_fwd_hidden(const cb_fwd *f, int32_t row, float *dst);

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

/* 128-bit digest (XXH3-128), printed as 32 lowercase hex digits. */
typedef struct cb_hash128 {
    uint64_t lo, hi;
} cb_hash128;

cb_hash128 cb_hash128_bytes(const void *data, size_t n);
/* hex[33]: 32 hex digits (hi then lo, as XXH128_canonical) and a NUL. */
void cb_hash128_hex(cb_hash128 h, char hex[33]);
/* Parse 32 hex digits.  Errors: CB_ERR_FORMAT. */
cb_status cb_hash128_parse(const char *hex, cb_hash128 *out);
int cb_hash128_eq(cb_hash128 a, cb_hash128 b);

/* The model fingerprint: XXH3-128 over the architecture parameters, the
 * tokenizer (tokens, types, scores, merges) and every tensor's name, type,
 * shape and data, so that a KV file can never be used with another model.
 * Hashing reads the whole file once (~4 GB/s with its page faults: a
 * quarter of a second for a 1 GB model); cb_model keeps it. */
cb_status cb_gguf_fingerprint(const cb_gguf *g, cb_hash128 *out);
/* The same, remembered across processes: when dir holds a record for the
 * file at path (mapped as g) made while the file had its present device,
 * inode, size, modification and status-change times, its fingerprint
 * without hashing; else computed and recorded there (one small file, made
 * atomically; dir is created, mode 0700; failing to record is not an
 * error).  A file rewritten in place changes its status-change time, which
 * no one can set back, so a stale record is never used.  dir NULL: always
 * computed.  Errors: those of cb_gguf_fingerprint. */
cb_status cb_gguf_fingerprint_cached(const cb_gguf *g, const char *path, const char *dir,
                                     cb_hash128 *out);
cb_hash128 cb_model_fingerprint(const cb_model *m);

/* ------------------------------------------------------------- KV files */

/* The KV file format (layout at the top of lib/kv/kvfile.c and in
 * cbkv(5)): a self-describing header (model fingerprint, shape, RoPE
 * parameters, element type, token ids, how positions were assigned, per
 * layer checksums, a header checksum) and a layer-major body, each layer
 * (K then V) aligned to 4096 bytes so it can be read alone, with O_DIRECT. */

#define CB_KV_ALIGN 4096

/* How K was positioned when the chunk was prefilled alone. */
typedef struct cb_kv_meta {
    cb_hash128 model;  /* fingerprint */
    cb_hash128 tokens; /* cb_kv_tokens_hash of the token ids */
    int32_t n_layer, n_head_kv, head_dim, n_rot;
    int32_t rope_neox;
    float rope_base;
    cb_type type; /* F16, F32, BF16 or Q8_0 */
    int32_t n_tokens;
    int32_t pos0;                 /* K of token i was computed (after RoPE) at position pos0 + i */
    int32_t n_lead;               /* lead-in tokens prefilled before the chunk and dropped */
    uint32_t flags;               /* bit 0: the global layers' RoPE frequencies are divided
                              (rope_freqs, linear scaling) */
    const int32_t *ids;           /* [n_tokens] (borrowed from the file handle) */
    const int32_t *lead;          /* [n_lead] */
    const int32_t *window;        /* [n_layer] each layer's sliding window, 0: global */
    const float *layer_rope_base; /* [n_layer] the RoPE base each layer's K was rotated with */
} cb_kv_meta;

/* The store key of a chunk: hash of its token ids (with the lead-in, so a
 * chunk precomputed after another lead-in is another entry). */
cb_hash128 cb_kv_tokens_hash(const int32_t *lead, int32_t n_lead, const int32_t *ids, int32_t n);
/* "<model hex>-<tokens hex>" (65 characters + NUL). */
void cb_kv_key(cb_hash128 model, cb_hash128 tokens, char key[66]);

/* Serialize a chunk's KV (rows pos0..pos0+n-1 of a cache, every layer)
 * into a malloc'd buffer holding a complete KV file.
 * Errors: CB_ERR_NOMEM, CB_ERR_INVALID (type, range). */
cb_status cb_kv_serialize(const cb_model *m, const cb_kvcache *kv, const int32_t *lead,
                          int32_t n_lead, const int32_t *ids, int32_t n, int32_t pos0, cb_type type,
                          void **buf, size_t *size);

/* The lead-in a chunk is prefilled after when precomputed alone: the
 * model's BOS when it adds one; else the chat template's user-turn opener
 * (for chatml "<|im_start|>user\n"), which plays the attention-sink role;
 * else BOS if the model has one; else nothing.  Appends to out. */
cb_status cb_kv_lead_in(const cb_model *m, cb_tokens *out);

/* Precompute one chunk: prefill lead-in + ids alone (positions 0..), and
 * serialize the chunk's rows (lead-in dropped, pos0 = n_lead) as a KV file
 * in memory.  f must hold n_lead + n rows or batches are used; kv must
 * hold n_lead + n positions.  Errors: CB_ERR_RANGE (too long for kv),
 * CB_ERR_NOMEM, CB_ERR_INVALID. */
cb_status cb_kv_precompute(cb_fwd *f, cb_kvcache *kv, const int32_t *lead, int32_t n_lead,
                           const int32_t *ids, int32_t n, cb_type type, void **buf, size_t *size);

typedef struct cb_kvfile cb_kvfile;

/* Open and verify the header (magic, version, header checksum, sizes
 * against the file size).  Layers are verified when read.
 * Errors: CB_ERR_NOT_FOUND, CB_ERR_IO, CB_ERR_FORMAT (not a KV file,
 * truncated, inconsistent), CB_ERR_CHECKSUM (header checksum),
 * CB_ERR_UNSUPPORTED (another format version). */
cb_status cb_kvfile_open(cb_kvfile **out, const char *path, cb_error *err);
/* The size in bytes a KV file must have whose first n bytes are `fixed`:
 * checks the fixed header (its first 128 bytes) as cb_kvfile_open does
 * (magic, version, shape, element type, and the header, layer and total
 * sizes against each other), so that a reader of a stream (an archive
 * member) knows how much a valid file can hold before reading the rest.
 * Messages name `name`.  Errors: CB_ERR_FORMAT (not a KV file, or fewer
 * than 128 bytes), CB_ERR_UNSUPPORTED (another format version). */
cb_status cb_kv_header_size(const void *fixed, size_t n, const char *name, uint64_t *size,
                            cb_error *err);

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
void cb_kvfile_free(cb_kvfile *f);
const cb_kv_meta *cb_kvfile_meta(const cb_kvfile *f);
/* CB_OK when the file belongs to model m (fingerprint and shape), else
 * CB_ERR_MISMATCH with a message naming the file. */
cb_status cb_kvfile_check_model(const cb_kvfile *f, const cb_model *m, cb_error *err);
/* Read layer l, verify its checksum, convert to f32: k, v [n_tokens,
 * n_head_kv*head_dim].  Errors: CB_ERR_RANGE, CB_ERR_IO, CB_ERR_CHECKSUM. */
cb_status cb_kvfile_read_layer(cb_kvfile *f, int32_t l, float *k, float *v, cb_error *err);
/* Verify every layer's checksum.  Errors as cb_kvfile_read_layer. */
cb_status cb_kvfile_verify(cb_kvfile *f, cb_error *err);
/* Size of the whole file in bytes. */
uint64_t cb_kvfile_size(const cb_kvfile *f);

/* ------------------------------------------------------------- blending */

/* A prompt is a sequence of segments laid out at consecutive positions from
 * 0.  A segment with a KV file reuses the chunk's cached KV (moved to its
 * position); one without is computed.  Segment ids for cached segments are
 * the file's token ids. */
typedef struct cb_segment {
    const int32_t *ids;
    int32_t n;
    cb_kvfile *kv; /* NULL: no cache, always computed */
} cb_segment;

typedef enum cb_blend_mode {
    CB_MODE_FULL = 0, /* ordinary prefill, caches ignored */
    CB_MODE_PREFIX,   /* prefix caching: reuse the leading cached segment only
                         * when everything before it is exactly its lead-in */
    CB_MODE_REUSE,    /* full KV reuse: every cache moved to its position, no recompute */
    CB_MODE_BLEND     /* CacheBlend: reuse + selective recompute */
} cb_blend_mode;

typedef enum cb_blend_strategy {
    CB_STRATEGY_HKVD = 0, /* the tokens whose KV deviates most at the check layer */
    CB_STRATEGY_SINK,     /* HKVD plus the first tokens of every cached segment */
    CB_STRATEGY_QUERY,    /* the cached tokens the last segment attends to most */
    CB_STRATEGY_PROBE,    /* after ProphetKV: the uncached rows run through every layer
                           * against the loaded cache first; the cached tokens the
                           * last segment attends to most, summed over layers and
                           * heads, are recomputed in every layer (no check layer) */
    CB_STRATEGY_RUNS      /* after CacheClip: HKVD anchors, each with the cached
                           * token after it (half the budget each) */
} cb_blend_strategy;

#define CB_BLEND_MAX_STEPS 8

typedef struct cb_blend_params {
    cb_blend_mode mode;
    cb_blend_strategy strategy;
    int32_t check_layer;              /* first check layer (default 1) */
    int32_t n_ratios;                 /* 1: one check layer; more: gradual filtering */
    float ratios[CB_BLEND_MAX_STEPS]; /* fraction of cached tokens kept at check layer + i
                                   * (chosen among those that can deviate: not an exact
                                   * prefix's) */
    int deviation_v;                  /* 0: deviation of K (after RoPE), 1: of V */
    int32_t sink_tokens;              /* CB_STRATEGY_SINK: tokens per segment (default 4) */
    int sequential_load;              /* 1: load every layer before computing (no pipelining) */
    double load_limit_mbs;            /* > 0: throttle KV reads to this many MB/s (tests,
                                   * emulating a slow tier); 0: as fast as the files come */
    float adapt_mass;                 /* CB_STRATEGY_PROBE, > 0: instead of the ratio, the
                                   * fewest cached tokens holding this share of the
                                   * question's attention to the caches, as a ratio
                                   * clamped to [adapt_min, adapt_max]; 0: the ratio */
    float adapt_min, adapt_max;
    int32_t probe_rows; /* CB_STRATEGY_PROBE: the question rows whose attention
                                   * scores the cached tokens: the last probe_rows uncached
                                   * rows of the last segment; 0 (default): all of them */
    float key_temp;     /* reuse and blend: the cached keys (not a true prefix's)
                                   * divided by it as they are loaded, a temperature on the
                                   * attention to tokens that keep their cached K/V (after
                                   * APE, arXiv 2502.05431); 1: as computed; 0 (default):
                                   * the model's, cb_blend_key_temp */
} cb_blend_params;

/* Defaults: blend, probe (the best measured; hkvd is the paper's), check
 * layer 1 (for the check-layer strategies), one ratio 0.15, deviation on
 * V, 4 sink tokens, adaptive bounds 0.05 and 0.5 (adapt_mass 0: off),
 * probe scoring by every question row, the model's key temperature. */
cb_blend_params cb_blend_defaults(void);

/* The key temperature p gives on model m: p->key_temp when > 0, else the
 * architecture's measured default: 1.05 for gemma3 (measured on
 * Gemma-3-270M), 1 (none) for the others. */
float cb_blend_key_temp(const cb_model *m, const cb_blend_params *p);

typedef struct cb_blend_stats {
    int32_t n_prompt_tokens;
    int32_t n_cached_tokens;                /* tokens whose KV came from a cache */
    int32_t n_exact_tokens;                 /* blend, reuse: those in a true prefix (the first
                                   * cache, after exactly its lead-in): what full prefill
                                   * computes, so never candidates for recompute */
    int32_t n_recomputed_tokens;            /* cached tokens recomputed at the last check layer */
    int32_t n_selected[CB_BLEND_MAX_STEPS]; /* cached tokens kept at each check layer */
    float ratio;             /* the ratio used: the last step's, or adapt_mass's choice */
    float selected_mass;     /* probe: the share of the attention mass selected */
    const char *ratio_bound; /* adapt_mass: "mass" (it reached adapt_mass), "min" or
                                   * "max" (clamped); else "given" */
    float key_temp;          /* reuse, blend: the key temperature used; else 1 */
    double load_ms;          /* reading and placing cached KV (the loader's busy time) */
    double recompute_ms;     /* layer computation (compute busy time, stalls excluded) */
    double overlapped_ms;    /* load time hidden behind computation */
    double stall_ms;         /* computation waiting for a layer still loading */
    uint64_t load_bytes;     /* KV bytes read from files */
    double prefill_ms;       /* all of it, to the logits */
    int32_t failed_segment;  /* after an error: the segment whose cache could not
                                   * be read (a layer missing, corrupt or timed out),
                                   * else -1; see cb_prompt_prefill */
} cb_blend_stats;

/* Build the KV cache of a prompt given as segments, in the chosen mode, and
 * return the last position's logits (n_vocab floats).  f must hold every
 * prompt row (n_max >= total tokens); kv must hold the prompt.  Cached
 * segments' files are read layer by layer and verified; a layer that fails
 * is an error naming the segment in stats->failed_segment: earlier layers
 * of it may already have been used, so the caller computes that chunk and
 * runs the whole prefill again (cb_prompt_prefill does).
 * Errors: CB_ERR_RANGE (too long), CB_ERR_CHECKSUM, CB_ERR_MISMATCH,
 * CB_ERR_IO, CB_ERR_NOMEM, CB_ERR_INVALID (params). */
cb_status cb_blend_prefill(cb_fwd *f, cb_kvcache *kv, const cb_segment *segs, int32_t n_segs,
                           const cb_blend_params *p, float *logits, cb_blend_stats *stats,
                           cb_error *err);

/* ------------------------------------------------- profile and controller */

/* A profile: measured speeds of one model on one backend (cb-profile(1)
 * writes it; the JSON layout is in cb-profile(1)).  Times are medians of
 * repeated runs, per layer. */
typedef struct cb_profile cb_profile;

#define CB_PROFILE_MAX 64

typedef struct cb_profile_point {
    int64_t length;      /* prompt tokens */
    double ratio;        /* recompute ratio; 1 for full prefill */
    double ms_per_layer; /* median */
    double spread;       /* (max - min) / median of the repeats */
} cb_profile_point;

typedef struct cb_profile_tier {
    char name[64];
    double warm_mbs, cold_mbs; /* KV read throughput, page cache warm / dropped */
} cb_profile_tier;

struct cb_profile {
    char model[33], backend[32];
    int32_t n_layer, threads;
    double kv_bytes_per_token[4]; /* f32, f16, bf16, q8_0 files (CB_KV_* order below) */
    int n_prefill, n_recompute, n_tiers;
    cb_profile_point prefill[CB_PROFILE_MAX];
    cb_profile_point recompute[CB_PROFILE_MAX * 8];
    cb_profile_tier tiers[16];
};

/* Index into kv_bytes_per_token for a KV element type, -1 if none. */
int cb_profile_type_index(cb_type t);

/* Serialize to / parse from JSON text.  Errors: CB_ERR_FORMAT, CB_ERR_NOMEM. */
cb_status cb_profile_to_json(const cb_profile *p, char **json);
cb_status cb_profile_from_json(cb_profile *p, const char *json, size_t len, cb_error *err);
/* The profile's file name in a store: profile-<model hex>-<backend>.json
 * (the store keeps it: cb_store_profile_load, cb_store_profile_save). */
void cb_profile_name(cb_hash128 model, const char *backend, char *buf, size_t n);

/* Predicted time (ms, all layers) to recompute `ratio` of a prompt of L
 * tokens, interpolated linearly in ratio and in L (extrapolated in
 * proportion beyond the measured lengths). */
double cb_profile_recompute_ms(const cb_profile *p, double ratio, int64_t L);
/* Predicted time (ms) to load L tokens of KV of type t from a tier
 * (cold: page cache dropped).  -1 when the tier is not in the profile. */
double cb_profile_load_ms(const cb_profile *p, const char *tier, int64_t L, cb_type t, int cold);
/* The controller: r = max(r_min, the r where recompute time equals load
 * time) for L cached tokens in `tier`; 1 when loading is slower than full
 * recompute.  *pred_load and *pred_recompute receive the predictions. */
double cb_controller_ratio(const cb_profile *p, const char *tier, int64_t L, cb_type t, int cold,
                           double r_min, double *pred_load, double *pred_recompute);

/* ---------------------------------------------------------------- store */

/* A tiered store of KV files (layout in cb-store(5)): a directory with a
 * configuration (store.json), an SQLite index in WAL mode (index.db) and one
 * directory per tier, fastest first, each with a capacity in bytes.  An entry
 * is one KV file, named by its key ("<model hex>-<tokens hex>", cb_kv_key).
 * Writes are atomic (temporary file, fsync, rename); a tier over capacity
 * moves its least recently used entries one tier down and the last tier
 * deletes them; pinned entries and entries in use (acquired) are never moved
 * or deleted.  Many processes may use one store at once and any of them may
 * be killed at any moment: the index's transactions, flock(2) locks on the
 * entry files and a lock on DIR/lock keep the store consistent, and
 * cb_store_gc removes what a killed process left behind.
 *
 * A cb_store handle is used by one thread at a time (open one per thread)
 * and must not be used across fork().  Every function below that takes a
 * cb_error * fills it on failure; the others return a status only. */
typedef struct cb_store cb_store;

#define CB_STORE_MAX_TIERS 8
#define CB_STORE_KEY_LEN 65 /* strlen of a key */

/* The default store directory: $CB_STORE, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/store.  Writes into buf and
 * returns it. */
const char *cb_store_default_dir(char *buf, size_t n);

/* One tier as given to cb_store_init and reported by cb_store_tier_info. */
typedef struct cb_store_tier {
    const char *name;      /* 1..32 of [A-Za-z0-9_.-], unique in the store */
    const char *path;      /* directory; relative paths are relative to the store */
    uint64_t capacity;     /* bytes; 0 = unlimited */
    double cost;           /* relative cost of a byte here, for placement (cb-store place);
                        * 0 in cb_store_init: the default, n_tiers - index (fastest
                        * dearest) */
    const char *url;       /* cb_store_init: not NULL for the shared tier on Redis,
                        * redis://HOST[:PORT][/DB] or unix:///PATH (path unused);
                        * at most one, behind the local tiers (see
                        * cb_store_shared_stat) */
    int timeout_ms;        /* the shared tier: connect and per-request time-out in
                        * milliseconds (0: 1000; the environment's
                        * CB_STORE_TIMEOUT_MS overrides it when a store opens) */
    const char *auth_file; /* the shared tier, cb_store_init: a Redis password file
                        * (one line, PASSWORD or USER PASSWORD; mode 0600), or
                        * NULL; its name is recorded, never its contents, and
                        * $CB_REDIS_AUTH_FILE overrides it; relative names are
                        * relative to the store */
    const char *key_file;  /* the shared tier, cb_store_init: its tier key
                        * (cb_store_keygen), or NULL; recorded likewise,
                        * $CB_TIER_KEY_FILE overrides it */
} cb_store_tier;

/* Make a tier key: 32 random bytes (libcrypto's RAND_bytes) written as 64
 * hexadecimal digits and a newline into a new file at path, mode 0600,
 * never over an existing file.  Errors: CB_ERR_CREATE (path exists or
 * cannot be made), CB_ERR_IO, CB_ERR_INTERNAL (no random bytes). */
cb_status cb_store_keygen(const char *path, cb_error *err);

/* Create a store in dir (made with its parents when missing) with n_tiers
 * tiers, fastest first (tiers NULL or n_tiers 0: one tier "main" in
 * DIR/tiers/main, unlimited).  promote_hits: an entry in a slower tier moves
 * to the fastest tier with room on its promote_hits-th and later accesses
 * (0 = never; negative = the default, 2).  Tier directories are created;
 * each must be empty or missing, and no two tiers may share one.
 * Errors: CB_ERR_CREATE (a store already exists there, a directory cannot be
 * created or is not empty), CB_ERR_INVALID (names, duplicates, too many
 * tiers), CB_ERR_IO (the shared tier cannot be reached, or refuses the
 * login), and for the shared tier's secret files CB_ERR_NOT_FOUND (missing
 * or unreadable) and CB_ERR_FORMAT (others may read it, or malformed). */
cb_status cb_store_init(const char *dir, const cb_store_tier *tiers, int n_tiers, int promote_hits,
                        cb_error *err);

/* Open a store; with create, a missing store is initialised with one tier
 * ("main", in DIR/tiers/main, unlimited).  A tier directory that vanished
 * (a RAM disk after a reboot) is made again; its entries are then gone, and
 * the next cb_store_gc drops them from the index.  Errors: CB_ERR_NOT_FOUND
 * (no store there), CB_ERR_FORMAT (bad configuration, a corrupt or missing
 * index: see cb_store_reset_index, or a tier directory that belongs to
 * another store), CB_ERR_CREATE (with create: the store cannot be made),
 * CB_ERR_IO. */
cb_status cb_store_open(cb_store **out, const char *dir, int create, cb_error *err);
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
/* 1 when the handle is read-only (see cb_store_open_readonly), else 0. */
int cb_store_readonly(const cb_store *s);

/* Close the handle; accepts NULL.  References from cb_store_acquire stay
 * valid until released. */
void cb_store_close(cb_store *s);

/* The store directory, tier count and tier i (0 = fastest; strings borrowed
 * from the handle, path absolute; CB_ERR_RANGE for another i), and the
 * promotion threshold. */
const char *cb_store_dir(const cb_store *s);
int cb_store_n_tiers(const cb_store *s);
cb_status cb_store_tier_info(const cb_store *s, int i, cb_store_tier *out);
int cb_store_promote_hits(const cb_store *s);

/* 1 in *found when key is stored and its file is there (no access
 * recorded), else 0.  Errors: CB_ERR_INVALID (not a key), CB_ERR_IO. */
cb_status cb_store_lookup(cb_store *s, const char *key, int *found);

/* Add a KV file given as bytes under key (NULL: the key the file names,
 * cb_kv_key of its model and tokens): reserved in the fastest tier that has
 * room after eviction, written atomically (temporary file, fsync, rename,
 * fsync of the directory), verified (cb_kvfile_open, cb_kvfile_verify, and
 * the key), then indexed.  An existing key (or one another process is
 * writing) is left as it is (CB_OK).  Readers never see a partial entry.
 * Errors: CB_ERR_FORMAT or CB_ERR_CHECKSUM (not a valid KV file),
 * CB_ERR_UNSUPPORTED (another KV format version), CB_ERR_INVALID (key is
 * not a key, or not the file's), CB_ERR_CREATE (no tier has room: the
 * entries that would have to go are pinned or in use), CB_ERR_IO. */
cb_status cb_store_put(cb_store *s, const char *key, const void *data, size_t size, cb_error *err);
/* The same, placing the entry in tier `tier` (by name) or, when it has no
 * room, the next slower one with room.  Errors as cb_store_put, and
 * CB_ERR_NOT_FOUND for an unknown tier name. */
cb_status cb_store_put_in(cb_store *s, const char *key, const void *data, size_t size,
                          const char *tier, cb_error *err);

/* Adopt the KV file at path: verified first (header, every layer's
 * checksum), then copied in as by cb_store_put.  key (may be NULL) receives
 * its key, *existed (may be NULL) 1 when it was already stored.  Errors as
 * cb_store_put, and CB_ERR_NOT_FOUND (no such file). */
cb_status cb_store_put_file(cb_store *s, const char *path, char key[66], int *existed,
                            cb_error *err);

/* Open an entry for reading: records the access (hits, last use), may
 * promote it, and guarantees the file is not deleted or moved until
 * cb_store_release (it holds a shared flock(2) on the file; a process that
 * dies releases it).  *path is valid until then.  Errors: CB_ERR_NOT_FOUND
 * (counted as a miss), CB_ERR_INVALID, CB_ERR_IO. */
typedef struct cb_store_ref cb_store_ref;
cb_status cb_store_acquire(cb_store *s, const char *key, cb_store_ref **ref, const char **path,
                           cb_error *err);
/* Size in bytes of the acquired file. */
uint64_t cb_store_ref_size(const cb_store_ref *ref);
/* The tier that holds the acquired file (0 = fastest, as cb_store_tier_info
 * numbers them): where loading it reads from.  -1 for NULL. */
int cb_store_ref_tier(const cb_store_ref *ref);
/* Release a reference; accepts NULL.  Independent of its store handle. */
void cb_store_release(cb_store_ref *ref);
/* The name of the tier the reference reads from (a local tier's, or the
 * shared tier's for a streamed entry), borrowed from s; NULL for NULL. */
const char *cb_store_ref_tier_name(const cb_store *s, const cb_store_ref *ref);

/* Open an entry's KV file for reading, as cb_store_acquire then
 * cb_kvfile_open, with one difference: an entry that only the shared tier
 * holds is not copied into a local tier first but streamed (*ref's tier
 * is then cb_store_n_tiers(s)): its header is fetched and verified now,
 * every layer is requested at once and taken as the reader reaches it (so
 * that a loader gets layer l+1 while layer l is computed), each verified
 * by the file's checksums when read; a part that does not come within
 * the tier's time-out fails the read.  The bytes stay in memory until the
 * reference and the reader are both freed.  A bad entry (header, metadata)
 * is warned about (cb_store_set_warn), dropped from the shared tier and
 * reported as missing; an unreachable tier as well, and it is not tried
 * again for 5 s.  Errors as cb_store_acquire and cb_kvfile_open. */
cb_status cb_store_open_kv(cb_store *s, const char *key, cb_kvfile **kf, cb_store_ref **ref,
                           cb_error *err);
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

/* Remove an entry: at once invisible to lookups and readers, its file
 * deleted; a file in use stays (still counted against its tier) until its
 * readers release it, and cb_store_gc deletes it then (a put of the same key
 * meanwhile makes it an entry again).  Errors: CB_ERR_NOT_FOUND,
 * CB_ERR_INVALID, CB_ERR_IO. */
cb_status cb_store_remove(cb_store *s, const char *key, cb_error *err);

/* Pin (pinned 1) or unpin (0) an entry: a pinned entry is never demoted,
 * promoted or evicted.  Errors: CB_ERR_NOT_FOUND, CB_ERR_INVALID, CB_ERR_IO. */
cb_status cb_store_pin(cb_store *s, const char *key, int pinned, cb_error *err);

/* One entry as cb_store_list reports it; strings borrowed for the call. */
typedef struct cb_store_entry {
    const char *key;      /* 65 characters */
    const char *model;    /* model fingerprint, 32 hex digits */
    const char *tier;     /* tier name */
    const char *path;     /* the file */
    const char *checksum; /* XXH3-128 of the whole file, 32 hex digits */
    uint64_t bytes;
    int64_t n_tokens;
    int64_t created_us; /* Unix time in microseconds */
    int64_t last_access_us;
    uint64_t hits;
    int pinned;
} cb_store_entry;

/* Call fn for every stored entry (not those being written), in tier order,
 * most recently used first; model (32 hex digits) and tier (a name) filter
 * when not NULL.  fn returns nonzero to stop early.  Errors: CB_ERR_INVALID
 * (unknown tier, malformed fingerprint), CB_ERR_IO. */
cb_status cb_store_list(cb_store *s, const char *model, const char *tier,
                        int (*fn)(void *ctx, const cb_store_entry *e), void *ctx, cb_error *err);

/* Per-tier figures. */
typedef struct cb_store_tier_stat {
    const char *name, *path; /* borrowed from the handle */
    uint64_t capacity;       /* 0 = unlimited */
    uint64_t entries, bytes; /* stored entries and their bytes */
    uint64_t reserved;       /* bytes of writes in progress, and of removed
                              * entries that readers still hold */
    uint64_t pinned;         /* pinned entries */
    uint64_t hits;           /* accesses served by this tier since the store was made */
} cb_store_tier_stat;

/* Fill stats[0..cb_store_n_tiers) and *misses (accesses of missing keys;
 * may be NULL).  A tier's hit rate is its hits over all accesses (every
 * tier's hits plus the misses).  Errors: CB_ERR_IO. */
cb_status cb_store_stat(cb_store *s, cb_store_tier_stat *stats, uint64_t *misses, cb_error *err);

/* The shared tier (a store made with a tier whose url is set): entries on
 * one Redis server that every store configured with it sees, behind the
 * local tiers.  A put writes through to it (and succeeds when only it has
 * room); a key missing from the local tiers is fetched from it, verified
 * (size and checksum against its metadata, then as a put) and kept in the
 * fastest local tier with room.  Its failures (unreachable, time-outs of
 * timeout_ms, a bad entry, which is dropped) are misses, passed to the
 * warning function; after a connection failure it is not tried again for
 * 5 s.  cb_store_list lists its entries after the local ones (tier: its
 * name, path: its address), cb_store_gc recounts its accounting,
 * cb_store_verify reads and checks every entry (repair drops bad ones).
 * Not used by a read-only handle. */
/* Set the function that receives the shared tier's warnings (NULL: none). */
void cb_store_set_warn(cb_store *s, void (*warn)(void *ctx, const char *msg), void *ctx);
/* Its figures (name, path = address, capacity, entries, bytes).  Errors:
 * CB_ERR_NOT_FOUND (no shared tier), CB_ERR_IO (cannot be reached). */
cb_status cb_store_shared_stat(cb_store *s, cb_store_tier_stat *out, cb_error *err);
/* The shared tier's name (borrowed), or NULL when the store has none;
 * nothing is asked of the server. */
const char *cb_store_shared_name(const cb_store *s);
/* How the shared tier is secured, as this handle uses it. */
typedef struct cb_store_shared_auth {
    int authenticated;  /* 1: a tier key: entries are written with MACs and
                          * read only when every part's MAC verifies */
    char key_id[17];    /* the tier key's id (16 hex digits; the same key on
                          * every host gives the same id), "" without one */
    char user[128];     /* the Redis ACL user, "" for none */
    int password;       /* 1: the handle logs in with a password */
    int read_only;      /* 1: the server refused this user a write (NOPERM) */
    uint64_t n_refused; /* entries this handle refused: no MAC, another key's,
                          * or a part whose MAC did not verify */
} cb_store_shared_auth;
/* Fill *out, reading the secret files when not read yet (nothing is asked
 * of the server).  Errors: CB_ERR_NOT_FOUND (no shared tier, or a secret
 * file missing), CB_ERR_FORMAT (a secret file others may read, or
 * malformed). */
cb_status cb_store_shared_auth_info(cb_store *s, cb_store_shared_auth *out, cb_error *err);
/* Drop an entry from the shared tier (for every store using it; the local
 * tiers are left as they are).  Errors: CB_ERR_NOT_FOUND (no shared tier),
 * CB_ERR_INVALID, CB_ERR_CREATE (read-only), CB_ERR_IO (cannot be reached). */
cb_status cb_store_shared_drop(cb_store *s, const char *key, cb_error *err);

/* What cb_store_gc did. */
typedef struct cb_store_gc_report {
    uint64_t demoted; /* entries moved one tier down (or further) */
    uint64_t evicted; /* entries deleted from the last tier */
    uint64_t orphans; /* files of removed entries whose readers are done,
                          * and entry files without an index entry, deleted */
    uint64_t temps;   /* temporary files of dead processes, deleted */
    uint64_t stale;   /* index entries without a file, unfinished writes of dead processes */
    uint64_t busy;    /* entries in use or pinned that kept a tier over capacity */
} cb_store_gc_report;

/* Enforce capacities (LRU demotion and eviction), delete orphan files and
 * stale temporary files, drop index entries whose file is gone and
 * unfinished writes of processes that died.  Safe while other processes
 * use the store; entries in use are left for a later run.  rep may be NULL.
 * Errors: CB_ERR_IO. */
cb_status cb_store_gc(cb_store *s, cb_store_gc_report *rep, cb_error *err);

/* What cb_store_verify found. */
typedef struct cb_store_verify_report {
    uint64_t entries;   /* index entries checked */
    uint64_t files;     /* files in the tier directories checked */
    uint64_t bytes;     /* bytes read and checksummed */
    uint64_t problems;  /* inconsistencies found */
    uint64_t repaired;  /* of those, fixed (with repair) */
    uint64_t remaining; /* inconsistencies left at the end */
} cb_store_verify_report;

/* Check every entry's file against the index (size, whole-file checksum)
 * and against its own header and layer checksums and key, every file in the
 * tier directories against the index, unfinished writes, temporary files
 * and capacities.  Each inconsistency is passed to problem(ctx, what, msg)
 * (may be NULL) as it is found (what: a key or a path).  With repair, the
 * index is rebuilt from the files, which describe themselves: valid files
 * missing from the index are adopted, invalid files and entries without a
 * valid file are removed, capacities are enforced; then the store is checked
 * again.  rep may be NULL.  Returns CB_OK only when the store is (now)
 * consistent, CB_ERR_FORMAT when it is not; CB_ERR_IO on failure. */
cb_status cb_store_verify(cb_store *s, int repair,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          cb_store_verify_report *rep, cb_error *err);

/* Move an index that cannot be read aside (index.db.broken-TIME) and start
 * an empty one, so that cb_store_open works again; cb_store_verify with
 * repair then rebuilds the index from the files.  Use when no other process
 * has the store open.  Errors: CB_ERR_NOT_FOUND (no store), CB_ERR_IO. */
cb_status cb_store_reset_index(const char *dir, cb_error *err);

/* Archive compression for cb_store_export. */
typedef enum cb_store_compress {
    CB_STORE_COMPRESS_AUTO = 0, /* from the archive name (.tar, .tar.gz/.tgz,
                                 * .tar.xz/.txz, .tar.zst/.tzst); else zstd */
    CB_STORE_COMPRESS_NONE,
    CB_STORE_COMPRESS_GZIP,
    CB_STORE_COMPRESS_XZ,
    CB_STORE_COMPRESS_ZSTD
} cb_store_compress;

/* Write the entries named in keys[0..n_keys) (n_keys 0: every entry) into a
 * tar archive (pax format; one regular file "<key>.kv" per entry) at path,
 * atomically, or into the open descriptor fd when path is NULL.  Entries
 * are read under cb_store_acquire's guarantee, without recording an access.
 * *n_out (may be NULL) receives the count.  Errors: CB_ERR_NOT_FOUND (a key
 * is not stored; nothing is written), CB_ERR_INVALID, CB_ERR_CREATE,
 * CB_ERR_IO. */
cb_status cb_store_export(cb_store *s, const char *path, int fd, const char *const *keys,
                          size_t n_keys, cb_store_compress compress, uint64_t *n_out,
                          cb_error *err);

/* What cb_store_import did. */
typedef struct cb_store_import_report {
    uint64_t imported; /* new entries */
    uint64_t existed;  /* already stored */
    uint64_t rejected; /* entries refused (each passed to problem) */
    uint64_t skipped;  /* directory entries, ignored */
} cb_store_import_report;

/* Import an archive (tar in any format libarchive reads, compressed or not;
 * also zip and cpio) from path, or from the descriptor fd when path is NULL.
 * Every entry is staged, verified (cb_store_put_file) and keyed by its
 * contents; entries with absolute names, ".." components, links, devices,
 * anything that is not a valid KV file, or a name "<key>.kv" that is not its
 * contents' key, are rejected and passed to problem(ctx, name, reason) (may
 * be NULL).  Valid entries are imported even when others are rejected.
 * Staging is bounded (decompression bombs): an entry's fixed KV header is
 * read first (cb_kv_header_size), an entry whose archive size is not the
 * size its header gives is rejected without being staged, and no more than
 * that size is ever written.  An entry larger than the largest tier's
 * capacity (when every tier has one) or than the space free for staging
 * stops the import before anything of it is written: CB_ERR_FORMAT
 * (capacity) or CB_ERR_IO (space), the message naming the archive and the
 * entry; entries imported before it stay.  rep may be NULL.  Errors:
 * CB_ERR_FORMAT (some entries were rejected, or the archive is malformed or
 * truncated, or an entry exceeds a tier), CB_ERR_NOT_FOUND, CB_ERR_CREATE,
 * CB_ERR_IO. */
cb_status cb_store_import(cb_store *s, const char *path, int fd,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          cb_store_import_report *rep, cb_error *err);

/* Profiles live in the store directory, one file per (model, backend),
 * named by cb_profile_name; only these functions know where.
 *
 * The path of the profile of (model, backend) in store s, written into buf
 * (truncated to n bytes); returns buf. */
const char *cb_store_profile_path(const cb_store *s, cb_hash128 model, const char *backend,
                                  char *buf, size_t n);
/* Read the profile of (model, backend).  Errors: CB_ERR_NOT_FOUND (none
 * measured yet: the message names the file and says to run cb-profile),
 * CB_ERR_FORMAT, CB_ERR_IO. */
cb_status cb_store_profile_load(const cb_store *s, cb_hash128 model, const char *backend,
                                cb_profile *p, cb_error *err);
/* Write p as the profile of its model (p->model, 32 hex digits) and backend,
 * atomically; *path (may be NULL) receives the file's path.  Errors:
 * CB_ERR_INVALID (p->model is not a fingerprint), CB_ERR_NOMEM,
 * CB_ERR_CREATE, CB_ERR_IO. */
cb_status cb_store_profile_save(const cb_store *s, const cb_profile *p, char *path, size_t path_n,
                                cb_error *err);
/* Placement: the index of the cheapest tier of the store (by its cost)
 * whose predicted cold load time for L tokens does not exceed the
 * recompute time at `ratio`; when none qualifies, the tier that loads
 * fastest.  -1 when the profile measured none of the store's tiers. */
int cb_store_place(const cb_store *s, const cb_profile *p, double ratio, int64_t L, cb_type t,
                   double *pred_load, double *pred_recompute);

/* --------------------------------------------------------------- chunker */

/* Splitting documents into chunks (cb-chunk(1)).  A chunk is a byte span
 * [start, end) of a document, never beginning or ending with whitespace and
 * never cut inside a UTF-8 sequence.  With a vocabulary, a chunk holds at most
 * `max` tokens, counted by tokenizing the chunk's text alone
 * (cb_tok_encode with flags 0: no BOS/EOS); without one, at most `max`
 * characters (code points).  Within that limit a chunk ends at the last
 * paragraph break (a blank line) in the second half of the window, else the
 * last sentence end (. ! ? ... followed by whitespace, or a CJK full stop) in
 * the second half, else the last line break in the second half, else the
 * last word boundary, else the last character that fits.  With `overlap`, a
 * chunk starts `overlap` tokens (or characters) before the end of the previous
 * one, moved forward to the next word start, unless it would then end where
 * the previous one does (it starts after it instead): every chunk ends later
 * than the one before.  With a separator, the document
 * is first cut at every match of the regex (the matched text belongs to no
 * chunk), and each piece is then chunked as above, without overlap across
 * pieces.  Whitespace between chunks belongs to none; whitespace-only pieces
 * give no chunk, and a UTF-8 byte order mark at offset 0 is skipped.  The
 * only chunk that can exceed `max` tokens is a single character whose
 * tokens alone do. */

typedef struct cb_chunker cb_chunker;

#define CB_CHUNK_DEFAULT_TOKENS 512
#define CB_CHUNK_DEFAULT_CHARS 2048

typedef struct cb_chunker_params {
    const cb_vocab *vocab; /* borrowed, must outlive the chunker; NULL: characters */
    int32_t max;           /* tokens or characters per chunk; 0: no limit */
    int32_t overlap;       /* tokens or characters repeated; 0 <= overlap < max */
    const char *separator; /* PCRE2 pattern (UTF, multi-line: ^ and $ match at line
                            * ends); NULL or "": none */
} cb_chunker_params;

typedef struct cb_chunk {
    size_t start, end; /* byte span in the document */
    int32_t n_tokens;  /* tokens of the text alone; -1 without a vocabulary */
    char id[33];       /* XXH3-128 of the chunk's bytes: cb_hash128_hex(cb_hash128_bytes()) */
} cb_chunk;

/* A growable array of chunks; cb_chunks_free frees v and zeroes the struct. */
typedef struct cb_chunks {
    cb_chunk *v;
    size_t n, cap;
} cb_chunks;
void cb_chunks_free(cb_chunks *c);

/* Create a chunker.  Errors: CB_ERR_INVALID (max < 0, overlap out of range,
 * a separator that does not compile: the message gives PCRE2's reason and
 * the offset), CB_ERR_NOMEM. */
cb_status cb_chunker_new(cb_chunker **out, const cb_chunker_params *p, cb_error *err);
void cb_chunker_free(cb_chunker *c);

/* Split len bytes of valid UTF-8 text, appending chunks to *out in document
 * order.  The same text and parameters always give the same chunks.  Cost is
 * linear in len (about two tokenizations of the text).  A chunker keeps
 * scratch buffers: use one per thread.  Errors: CB_ERR_INVALID (text is not
 * valid UTF-8: check with cb_utf8_check first), CB_ERR_NOMEM; after an error
 * *out holds the chunks it had before the call. */
cb_status cb_chunker_split(cb_chunker *c, const char *text, size_t len, cb_chunks *out);

/* Offset of the first byte of s[0..n) that does not start a valid UTF-8
 * sequence (strict: no overlong forms, surrogates or code points above
 * U+10FFFF; a sequence cut by the end is invalid), or n when all is valid. */
size_t cb_utf8_check(const char *s, size_t n);

/* Copy s[0..n) into a malloc'd buffer (*out, *out_len, NUL-terminated),
 * replacing each maximal invalid subsequence with U+FFFD, as Unicode
 * recommends (and Python's errors="replace" does); *n_bad (may be NULL)
 * receives the number of replacements.  Errors: CB_ERR_NOMEM. */
cb_status cb_utf8_repair(const char *s, size_t n, char **out, size_t *out_len, size_t *n_bad);

/* --------------------------------------------------------------- sampler */

typedef struct cb_sampler cb_sampler;

typedef struct cb_sampler_params {
    float temp;    /* <= 0: greedy (argmax, lowest id on ties) */
    int32_t top_k; /* <= 0: off */
    float top_p;   /* >= 1: off */
    float min_p;   /* <= 0: off */
    uint64_t seed;
} cb_sampler_params;

/* Default parameters: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, seed 0. */
cb_sampler_params cb_sampler_defaults(void);
/* A sampler applying, in llama.cpp's default order, top-k, top-p, min-p,
 * temperature, then a draw from its own seeded generator.  NULL on OOM. */
cb_sampler *cb_sampler_new(const cb_sampler_params *p);
void cb_sampler_free(cb_sampler *s);
/* Pick a token from n_vocab logits (not modified).  Returns -1 for NULL
 * arguments, n_vocab < 1, or when growing its scratch fails. */
int32_t cb_sampler_sample(cb_sampler *s, const float *logits, int32_t n_vocab);

/* ---------------------------------------------------------- chat templates */

typedef enum cb_chat_kind {
    CB_CHAT_NONE = 0, /* no template: the text is used as is */
    CB_CHAT_CHATML,   /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen2) */
    CB_CHAT_LLAMA3,   /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CB_CHAT_MISTRAL,  /* [INST] ... [/INST] (Mistral, Llama 2) */
    CB_CHAT_GEMMA     /* <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n */
} cb_chat_kind;

/* Recognise a tokenizer.chat_template (Jinja text) the way llama.cpp does;
 * CB_CHAT_NONE when it is empty or unknown. */
cb_chat_kind cb_chat_detect(cb_strview tmpl);

/* The system message a (chatml) template writes when the conversation has
 * none, malloc'd (Qwen2.5's "You are Qwen, ..."); NULL when it writes none.
 * llama.cpp's built-in templates leave it out; the model was trained with it. */
char *cb_chat_default_system(cb_strview tmpl);
const char *cb_chat_name(cb_chat_kind k);

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

/* ------------------------------------------------------------ generation */

typedef struct cb_gen_params {
    cb_sampler_params sp;
    int32_t n_predict;        /* at most this many tokens */
    const char *const *stops; /* stop strings (not emitted): n_stops of them */
    int n_stops;
} cb_gen_params;

typedef struct cb_gen_result {
    int32_t n_gen;    /* tokens generated, the end-of-generation token not counted */
    double first_ms;  /* from t0 to the first sampled token (cb_now_ms) */
    const char *stop; /* why it ended: "eog", "stop", "length" or "context" */
} cb_gen_result;

/* Generate after a prefill of pos tokens whose last logits are in `logits`
 * (n_vocab floats, overwritten): sample (p->sp), hand the token's text to
 * emit(ctx, text, n), evaluate it at pos, pos+1, ... until an
 * end-of-generation token, a stop string, p->n_predict tokens or the end
 * of the cache.  Text is handed on as soon as it can no longer be the
 * start of a stop string; a stop string and anything after it never is.
 * emit returns CB_OK to go on, else generation ends with its status.
 * The tokens are evaluated by cb_fwd_decode in activations of their own
 * (f gives the model): cb_generate is a cb_gen_batch of one, so a batched
 * sequence's answer is bit for bit this one.  `logits` ends as the last
 * evaluated logits.  Errors: CB_ERR_NOMEM, emit's, and the forward
 * pass's. */
cb_status cb_generate(cb_fwd *f, cb_kvcache *kv, float *logits, int32_t pos, const cb_gen_params *p,
                      cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx,
                      double t0, cb_gen_result *res);

/* Generations decoded together: sequences join after their prefills and
 * leave when done, and each step evaluates one token of every active
 * sequence in one cb_fwd_decode (the weights read once for all of them).
 * A sequence's tokens, text and result are exactly those cb_generate gives
 * it alone with the same parameters (cb_generate is a batch of one).  The
 * batch borrows the model, the caches and the stop strings; it owns its
 * decoding activations (cb_fwd_decode_rows(m, cap) rows), a sampler and
 * the logits of each sequence. */
typedef struct cb_gen_batch cb_gen_batch;

/* A batch of up to cap sequences on model m.  Errors: CB_ERR_INVALID (cap
 * < 1), CB_ERR_NOMEM, CB_ERR_DEVICE (a device fault). */
cb_status cb_gen_batch_new(cb_gen_batch **out, const cb_model *m, int32_t cap);
/* Free it (the caches are the callers'); accepts NULL. */
void cb_gen_batch_free(cb_gen_batch *b);
/* Add a sequence after a prefill of pos tokens into kv whose last logits
 * are `logits` (n_vocab floats, copied): it generates as cb_generate does
 * (p, emit, ctx and t0 as there; p is copied, its stop strings borrowed
 * until the sequence is taken).  *slot receives its slot, until
 * cb_gen_batch_take.  Errors: CB_ERR_RANGE (no free slot, pos outside
 * kv), CB_ERR_INVALID (kv is an active sequence's), CB_ERR_NOMEM. */
cb_status cb_gen_batch_add(cb_gen_batch *b, cb_kvcache *kv, const float *logits, int32_t pos,
                           const cb_gen_params *p,
                           cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx,
                           double t0, int32_t *slot);
/* Sequences still generating. */
int32_t cb_gen_batch_active(const cb_gen_batch *b);
/* One step: every active sequence samples a token, hands its text on, and
 * either ends (end of generation, a stop string, its n_predict, the end of
 * its cache, or an error of its own) or has its token evaluated with the
 * others' in one cb_fwd_decode.  The slots that ended in this step go to
 * done[] (cap entries at most), their count to *n_done; take them with
 * cb_gen_batch_take.  Returns the decode step's status: when it fails,
 * every sequence in it ends with that status (the batch stays usable). */
cb_status cb_gen_batch_step(cb_gen_batch *b, int32_t *done, int32_t *n_done);
/* The result of an ended sequence, and its status (CB_OK, or the error it
 * ended with: emit's, CB_ERR_NOMEM, the forward pass's); logits (may be
 * NULL) receive its last logits.  Frees the slot.  CB_ERR_RANGE for a
 * slot that is free or still generating. */
cb_status cb_gen_batch_take(cb_gen_batch *b, int32_t slot, cb_gen_result *res, float *logits);

/* The teacher-forced score of a continuation after a prefill. */
typedef struct cb_score_result {
    double nll;       /* mean negative log-likelihood per token (nats) */
    int32_t n_tokens; /* tokens scored */
    double top1;      /* fraction of them that were the argmax */
} cb_score_result;

/* Score the continuation cont[0..n) after a prefill of pos tokens whose
 * last logits are in `logits` (n_vocab floats, left as they are): token 0
 * by those logits, token i by the logits after tokens 0..i-1, which are
 * evaluated at positions pos..pos+n-2 in one batch (their KV is written
 * into kv; f must hold n - 1 rows, kv pos + n - 1 positions).  Nothing is
 * sampled.  Errors: CB_ERR_INVALID (n < 1, or more rows than f holds),
 * CB_ERR_RANGE (a token id, or past the cache), CB_ERR_NOMEM, and the
 * forward pass's. */
cb_status cb_score(cb_fwd *f, cb_kvcache *kv, const float *logits, int32_t pos, const int32_t *cont,
                   int32_t n, cb_score_result *res);

/* KL(p || q) of the softmaxes of two logit vectors of n entries (what
 * cb-run --verify reports), and in *top1 whether their argmaxes agree. */
double cb_logits_kl(const float *lp, const float *lq, int32_t n, int *top1);

/* --------------------------------------------------------------- prompts */

/* A RAG prompt assembled from token ids, never by re-tokenizing joined text
 * (that would change the tokens at chunk boundaries and every cache would
 * miss):
 *   [BOS + template prefix] [chunk 1] [sep] [chunk 2] ... [chunk k]
 *   [sep + question + template suffix]
 * one segment each (sep is the tokens of a blank line); a chunk's tokens
 * are those of its text alone, so they are exactly the ones its KV file was
 * computed for (cb_kv_precompute after cb_kv_lead_in), and its store key is
 * cb_kv_key(model, cb_kv_tokens_hash(lead-in, tokens)).  A chunk whose
 * text has no tokens adds only its separator.  The prompt borrows its
 * model. */
typedef struct cb_prompt cb_prompt;

/* Build the segments: `system` (NULL: the template's own default system
 * turn, cb_chat_default_system, when it writes one; "": none) and the question go through
 * the model's chat template unless raw; with raw the question is used as
 * is and control tokens written in it are matched.  chunks[0..n_chunks)
 * are the chunks' texts, in order.  Every chunk starts without a cache.
 * Errors: CB_ERR_NOMEM. */
cb_status cb_prompt_build(cb_prompt **out, const cb_model *m, const char *system, int raw,
                          const cb_strview *chunks, size_t n_chunks, const char *question,
                          size_t len, cb_error *err);
/* A chunk of a prompt: its text, or (text.data NULL) the key of its KV
 * file in a store (what cb-precompute writes as "kv"). */
typedef struct cb_chunk_src {
    cb_strview text;
    const char *key;
} cb_chunk_src;
/* cb_prompt_build with chunks given by text or by key.  A keyed chunk's
 * tokens are the ones its KV file in store s holds (the file is opened as
 * cb_store_open_kv does and attached at once, so cb_prompt_attach leaves
 * it be); a text chunk is as in cb_prompt_build.  Errors: those of
 * cb_prompt_build, and for a keyed chunk (err names the key):
 * CB_ERR_FORMAT (not a key), CB_ERR_NOT_FOUND (s is NULL or does not hold
 * it), CB_ERR_MISMATCH (a file of another model, or whose tokens are not
 * the key's), and cb_store_open_kv's. */
cb_status cb_prompt_build_from(cb_prompt **out, const cb_model *m, cb_store *s, const char *system,
                               int raw, const cb_chunk_src *chunks, size_t n_chunks,
                               const char *question, size_t len, cb_error *err);
/* Free the prompt, its opened KV files and its store references; accepts NULL. */
void cb_prompt_free(cb_prompt *p);

/* The segments for cb_blend_prefill (a chunk's kv is its attached KV file,
 * or NULL), valid until the prompt changes or is freed; *n receives their
 * count. */
const cb_segment *cb_prompt_segments(const cb_prompt *p, int32_t *n);
int64_t cb_prompt_n_tokens(const cb_prompt *p);
/* Chunks (with tokens), and those without a usable cache. */
int cb_prompt_n_chunks(const cb_prompt *p);
int cb_prompt_n_missing(const cb_prompt *p);
cb_chat_kind cb_prompt_chat(const cb_prompt *p);
/* The lead-in chunks were keyed with (cb_kv_lead_in). */
const cb_tokens *cb_prompt_lead(const cb_prompt *p);

/* Find each chunk's cache in store s (NULL: none has one): open the
 * entry (cb_store_open_kv: recording the access; an entry only the shared
 * tier holds is streamed layer by layer), and check that it belongs
 * to the model and holds the chunk's tokens.  A chunk without a usable
 * cache stays missing (to be computed in place); each file found unusable
 * is passed to warn(ctx, message) (may be NULL), message naming the key or
 * the file.  The entries stay acquired until the prompt is freed. */
void cb_prompt_attach(cb_prompt *p, cb_store *s, void (*warn)(void *ctx, const char *msg),
                      void *ctx);

/* The ratio --ratio auto takes (cb_controller_ratio): for the prompt's
 * cached tokens, read from the slowest of the tiers that hold the attached
 * caches, by the store's profile for the model's backend.  Fills *out.
 * Errors: CB_ERR_NOT_FOUND (no profile, or no attached cache lies in a
 * tier the profile measured); the message says which. */
typedef struct cb_ratio_choice {
    double ratio;
    double pred_load_ms, pred_recompute_ms;
    int64_t n_cached; /* tokens whose KV comes from the caches */
    char tier[64];    /* the slowest tier holding one */
} cb_ratio_choice;
cb_status cb_prompt_auto_ratio(const cb_prompt *p, const cb_store *s, const cb_model *m,
                               cb_type kv_type, double r_min, cb_ratio_choice *out, cb_error *err);

/* cb_blend_prefill of the prompt's segments in f and kv; when a cache
 * fails while it is read (a layer missing, corrupt or timed out: see
 * cb_blend_stats.failed_segment), its chunk is computed instead and the
 * prefill runs again, so the answer is the one without that cache, never
 * one from a corrupt entry.  The failure is passed to warn(ctx, message)
 * (or, for an entry streamed from the shared tier, to the store's warning
 * function, the entry dropped; a tier that stopped answering is not used
 * for 5 s and its other streamed chunks are computed too).  Errors as
 * cb_blend_prefill for anything else. */
cb_status cb_prompt_prefill(cb_prompt *p, cb_store *s, cb_fwd *f, cb_kvcache *kv,
                            const cb_blend_params *bp, float *logits, cb_blend_stats *stats,
                            void (*warn)(void *ctx, const char *msg), void *ctx, cb_error *err);
/* After the answer: keep the caches streamed from the shared tier in a
 * local tier (cb_store_keep); a failure is passed to warn (may be NULL). */
void cb_prompt_keep(cb_prompt *p, cb_store *s, void (*warn)(void *ctx, const char *msg), void *ctx);

/* Compute and store the chunks that cb_prompt_attach found missing and the
 * store still lacks, each prefilled alone (cb_precomputer).  *n_stored
 * receives how many were stored; a chunk that cannot be is passed to
 * warn(ctx, message) and skipped.  Errors: CB_ERR_NOMEM (no activations). */
cb_status cb_prompt_store_missing(cb_prompt *p, cb_store *s, cb_type type, int *n_stored,
                                  void (*warn)(void *ctx, const char *msg), void *ctx);

/* ------------------------------------------------------ batches of questions */

/* Many questions answered by one process: the model and store opened once,
 * each question prefilled when it starts (its own mode and parameters, one
 * question at a time), the started ones decoded together, one token of each
 * per step (cb_gen_batch), each with its own KV cache, ending on its own.
 * At most `cap` questions are in flight and their caches stay within a byte
 * budget: a question whose cache would pass it waits, parked, until others
 * end (or runs alone when nothing else is in flight).  A question's answer,
 * token counts and blend statistics are what a lone cb_prompt_build_from,
 * cb_prompt_attach, cb_prompt_prefill and cb_generate (or cb_score) give it
 * with the same parameters: the same calls, and decoding whose rows never
 * depend on their company.  One thread: submit, step and next run in the
 * caller's. */
typedef struct cb_batch cb_batch;

/* One question.  Everything it points to need live only during
 * cb_batch_submit (the stop strings are copied). */
typedef struct cb_request {
    const char *system;         /* system text; NULL: the template's default, "": none */
    int raw;                    /* no chat template (as cb_prompt_build's raw) */
    const cb_chunk_src *chunks; /* texts or store keys, in order */
    size_t n_chunks;
    cb_strview question;
    cb_strview score;   /* .data not NULL: score this continuation (cb_score)
                                 * instead of generating */
    cb_blend_params bp; /* the mode and blending parameters */
    int ratio_auto;     /* blend: the loading controller's ratio (cb_prompt_auto_ratio),
                                 * at least min_ratio, which is also the fallback */
    double min_ratio;
    cb_gen_params gp; /* sampling, n_predict, stop strings */
    int32_t n_ctx;    /* cache positions; 0: prompt + n_predict (or the
                                 * continuation), at most the training context */
    cb_type kv_type;  /* F16 or F32 */
    int store_write;  /* afterwards, store the KV of chunks that had none */
} cb_request;

/* A question's outcome, owned by the caller once cb_batch_next returns it
 * (cb_answer_free).  status CB_OK: answered; else msg says why not, and
 * the fields filled before the failure stay (the prompt's size, ...). */
typedef struct cb_answer {
    void *tag; /* cb_batch_submit's */
    cb_status status;
    char msg[CB_ERROR_MSG_MAX];
    char *text; /* the generated text, NUL-terminated (NULL when none) */
    size_t len;
    int scored; /* score holds the continuation's score; no text */
    cb_score_result score;
    cb_gen_result gen;        /* first_ms: from submission to the first token (TTFT) */
    double gen_ms;            /* from the first token to the last */
    cb_blend_params bp;       /* the parameters used (the ratio --ratio auto chose) */
    const char *ratio_source; /* "given", "controller" or "fallback" */
    cb_ratio_choice rc;       /* the controller's choice, with ratio_auto */
    cb_blend_stats bs;
    int64_t n_prompt_tokens;
    int n_chunks, n_missing, n_stored;
    cb_chat_kind chat;
    uint64_t kv_bytes; /* its cache's (cb_kvcache_bytes) */
} cb_answer;
void cb_answer_free(cb_answer *a);

/* What the batch did so far. */
typedef struct cb_batch_info {
    int32_t cap; /* questions in flight at most */
    uint64_t kv_budget;
    int32_t in_flight, in_flight_peak;
    uint64_t kv_in_flight, kv_peak; /* bytes of the caches in flight, and the most */
    int64_t n_submitted, n_answered, n_failed;
    int64_t n_tokens; /* tokens generated by the questions that ended */
    int64_t n_steps;  /* decode steps */
} cb_batch_info;

/* The most questions in flight by default (decoding 16 together costs about
 * what 12 cost per token: the row-stable products take 12 rows at most). */
#define CB_BATCH_MAX 16
/* The default limit: as many questions as fit kv_budget, each with a cache
 * of the model's whole training context in kv_type, from 1 to
 * CB_BATCH_MAX. */
int32_t cb_batch_default_size(const cb_model *m, cb_type kv_type, uint64_t kv_budget);

/* A batch on model m and store s (NULL: none; chunks are then computed,
 * keyed chunks are missing), at most cap questions in flight, their caches
 * within kv_budget bytes.  warn(ctx, msg) (may be NULL) hears what a lone
 * run would warn about.  Borrows m and s.  Errors: CB_ERR_INVALID (cap <
 * 1), CB_ERR_NOMEM, CB_ERR_DEVICE (a device fault). */
cb_status cb_batch_new(cb_batch **out, cb_model *m, cb_store *s, int32_t cap, uint64_t kv_budget,
                       void (*warn)(void *ctx, const char *msg), void *ctx);
/* Free it and everything in flight or not yet taken; accepts NULL. */
void cb_batch_free(cb_batch *b);
/* 1 when no question can be submitted now (cap in flight, or one parked
 * waiting for room): step until it is 0. */
int cb_batch_full(const cb_batch *b);
/* 1 while questions are in flight or parked, or answers wait to be taken. */
int cb_batch_busy(const cb_batch *b);
/* Start a question: build its prompt and find its caches; if its cache
 * fits, prefill it now (and score it, or have it join the decoding), else
 * park it.  A question that fails (a bad prompt, a chunk key the store
 * lacks, a prompt longer than the context, ...) becomes an answer with its
 * status at once.  Returns CB_OK when the question was taken (whatever
 * becomes of it); CB_ERR_RANGE when the batch is full; CB_ERR_NOMEM. */
cb_status cb_batch_submit(cb_batch *b, const cb_request *rq, void *tag);
/* Start the parked question if it fits now, then one decode step of every
 * question decoding; the ones that end become answers.  Returns the
 * step's status (a failed step ends its questions with it). */
cb_status cb_batch_step(cb_batch *b);
/* The next answer, in the order the questions ended (NULL: none now). */
cb_answer *cb_batch_next(cb_batch *b);
const cb_batch_info *cb_batch_get_info(const cb_batch *b);

/* A precomputer writes chunks' KV files into a store: each chunk prefilled
 * alone after the model's lead-in (cb_kv_lead_in) in an f32 cache that
 * grows with the longest chunk seen (in steps of 512 positions, at most the
 * model's training context), serialized as `type` (F16, F32, BF16, Q8_0)
 * and put into the store (into tier `tier` when not NULL, see
 * cb_store_put_in).  It borrows the model and the store. */
typedef struct cb_precomputer cb_precomputer;

/* Errors: CB_ERR_NOMEM (activations), CB_ERR_INVALID (type), and the
 * lead-in's. */
cb_status cb_precomputer_new(cb_precomputer **out, const cb_model *m, cb_store *s, cb_type type,
                             const char *tier, cb_error *err);
void cb_precomputer_free(cb_precomputer *pc);
const cb_tokens *cb_precomputer_lead(const cb_precomputer *pc);
/* The store key of chunk ids[0..n). */
void cb_precomputer_key(const cb_precomputer *pc, const int32_t *ids, int32_t n, char key[66]);
/* Prefill chunk ids[0..n) alone and keep its KV file in memory, for
 * cb_precomputer_store.  Errors: CB_ERR_RANGE (the lead-in and the chunk
 * exceed the model's context), CB_ERR_INVALID (n < 1), CB_ERR_NOMEM and
 * the forward pass's; the message says which. */
cb_status cb_precomputer_run(cb_precomputer *pc, const int32_t *ids, int32_t n, cb_error *err);
/* Put the KV file of the last cb_precomputer_run into the store under key
 * (an existing entry is left as it is) and drop it.  Errors: CB_ERR_INVALID
 * (nothing computed), and cb_store_put's. */
cb_status cb_precomputer_store(cb_precomputer *pc, const char *key, cb_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CBCORE_H */
