/* core.h - what lib/core gives the layers above it that libcbcore's
 * clients do not need (private to libcbcore: not installed).  The public
 * interface is cbcore.h; the layers, lowest first: core < backend < infer
 * < kv < store < prompt, each header including only those below it. */
#ifndef CB_CORE_H
#define CB_CORE_H

#include "cbcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ core */

/* Compare a view with a NUL-terminated string. 1 when equal. */
int cb_strview_eq(cb_strview a, const char *s);

/* cb_file_write_atomic for content produced piece by piece: emit(ctx, fd,
 * err) writes it to fd (cb_fd_write_all) and returns CB_OK, or an error
 * with err set. */
typedef cb_status (*cb_emit_fn)(void *ctx, int fd, cb_error *err);
cb_status cb_file_write_atomic_fn(const char *path, cb_emit_fn emit, void *ctx, cb_error *err);
/* write(2) all of data to fd, retrying on EINTR.  Errors: CB_ERR_IO (err
 * names `what`). */
cb_status cb_fd_write_all(int fd, const void *data, size_t size, const char *what, cb_error *err);

/* ---------------------------------------------------------- tensor types */

/* Elements per block (1 for plain types), 0 for an unknown id. */
int64_t cb_type_block_elems(cb_type t);
/* Bytes per block, 0 for an unknown id. */
size_t cb_type_block_bytes(cb_type t);
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

/* -------------------------------------------------------------- hashing */

/* XXH3-128 of n bytes. */
cb_hash128 cb_hash128_bytes(const void *data, size_t n);
/* 1 when a and b are the same digest. */
int cb_hash128_eq(cb_hash128 a, cb_hash128 b);

#ifdef __cplusplus
}
#endif
#endif /* CB_CORE_H */
