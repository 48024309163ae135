/* status.c - status codes, error messages and small string helpers. */
#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *cb_strerror(cb_status st)
{
    switch (st) {
    case CB_OK: return "success";
    case CB_ERR_NOMEM: return "out of memory";
    case CB_ERR_IO: return "I/O error";
    case CB_ERR_NOT_FOUND: return "not found";
    case CB_ERR_FORMAT: return "malformed input data";
    case CB_ERR_UNSUPPORTED: return "not supported";
    case CB_ERR_INVALID: return "invalid argument";
    case CB_ERR_RANGE: return "value out of range";
    case CB_ERR_CREATE: return "cannot create output";
    case CB_ERR_INTERNAL: return "internal error";
    case CB_ERR_CHECKSUM: return "checksum mismatch";
    case CB_ERR_MISMATCH: return "made for another model";
    case CB_ERR_DEVICE: return "compute device not available or failed";
    }
    return "unknown status";
}

cb_status cb_error_set(cb_error *err, cb_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->status = st;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

int cb_strview_eq(cb_strview a, const char *s)
{
    size_t n = strlen(s);
    return a.len == n && (n == 0 || memcmp(a.data, s, n) == 0);
}
