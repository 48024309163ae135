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
    CB_ERR_INTERNAL = -9     /* a bug: an invariant did not hold */
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
cb_status cb_file_write_atomic(const char *path, const void *data, size_t size,
                               cb_error *err);

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
    uint64_t offset;              /* relative to the start of the data section */
    size_t nbytes;
    const void *data;             /* in the mapping; aligned to the file's alignment */
} cb_tensor_info;

/* Open a GGUF file (version 2 or 3) by memory-mapping it, and validate all of
 * it: header, every metadata entry, every tensor info, tensor bounds and
 * alignment.  Nothing is read outside the file, whatever its contents.
 * Errors: CB_ERR_NOT_FOUND, CB_ERR_IO, CB_ERR_FORMAT (malformed or truncated),
 * CB_ERR_UNSUPPORTED (another GGUF version), CB_ERR_NOMEM. */
cb_status cb_gguf_open(cb_gguf **out, const char *path, cb_error *err);

/* The same over bytes the caller keeps alive until cb_gguf_free (nothing is
 * copied).  `name` is used in messages. */
cb_status cb_gguf_open_memory(cb_gguf **out, const void *data, size_t size,
                              const char *name, cb_error *err);

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
cb_status cb_gguf_writer_set_arr(cb_gguf_writer *w, const char *key,
                                 cb_gguf_type t, const void *data, uint64_t n);
/* Array of n NUL-terminated strings. */
cb_status cb_gguf_writer_set_arr_str(cb_gguf_writer *w, const char *key,
                                     const char *const *strs, uint64_t n);
/* Add a tensor of type t with dims ne[0..n_dims-1]; `data` (exactly
 * cb_type_row_bytes(t, ne[0]) * rows bytes) is copied. */
cb_status cb_gguf_writer_add_tensor(cb_gguf_writer *w, const char *name, cb_type t,
                                    uint32_t n_dims, const int64_t *ne,
                                    const void *data);
/* Serialize into a malloc'd buffer (caller frees). */
cb_status cb_gguf_writer_bytes(const cb_gguf_writer *w, void **buf, size_t *size);
/* Write atomically to path.  Errors: CB_ERR_CREATE, CB_ERR_IO, CB_ERR_NOMEM. */
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
    CB_TOK_ADD_SPECIAL = 1 << 0,   /* add BOS/EOS as the metadata says */
    CB_TOK_PARSE_SPECIAL = 1 << 1  /* match control tokens in the text */
};

/* Tokenize len bytes of text, appending ids to *out, exactly as llama.cpp's
 * llama_tokenize(vocab, text, add_special, parse_special).  User-defined
 * tokens are always matched; control tokens only with CB_TOK_PARSE_SPECIAL.
 * Invalid UTF-8 is tokenized as llama.cpp does (bytes).
 * Errors: CB_ERR_NOMEM. */
cb_status cb_tok_encode(const cb_vocab *v, const char *text, size_t len,
                        unsigned flags, cb_tokens *out);

enum {
    CB_DETOK_REMOVE_SPECIAL = 1 << 0, /* drop a leading BOS / trailing EOS the model adds */
    CB_DETOK_UNPARSE_SPECIAL = 1 << 1 /* render control tokens as their text */
};

/* The bytes a token stands for (byte-level decoding, byte tokens, the SPM
 * space marker), appended to buf[*len..] growing *buf with realloc as
 * needed.  Control tokens render only with CB_DETOK_UNPARSE_SPECIAL.
 * Errors: CB_ERR_RANGE (bad id), CB_ERR_NOMEM. */
cb_status cb_tok_piece(const cb_vocab *v, int32_t id, unsigned flags,
                       char **buf, size_t *len, size_t *cap);

/* Detokenize n ids into a malloc'd NUL-terminated string (*text, length
 * *len), as llama.cpp's llama_detokenize; for SPM vocabs that add a space
 * prefix, the leading space of the first piece is removed so that
 * decode(encode(s)) == s.  Errors: CB_ERR_RANGE, CB_ERR_NOMEM. */
cb_status cb_tok_decode(const cb_vocab *v, const int32_t *ids, size_t n,
                        unsigned flags, char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* CBCORE_H */
