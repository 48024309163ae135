/* hash.c - 128-bit digests (XXH3-128 from libxxhash) and their hex form. */
#include "core.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

cb_hash128 cb_hash128_bytes(const void *data, size_t n)
{
    XXH128_hash_t h = XXH3_128bits(data, n);
    return (cb_hash128){h.low64, h.high64};
}

void cb_hash128_hex(cb_hash128 h, char hex[33])
{
    /* XXH128_canonical order: high 64 bits first, big-endian */
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}

cb_status cb_hash128_parse(const char *hex, cb_hash128 *out)
{
    uint64_t part[2] = {0, 0};
    for (int i = 0; i < 32; i++) {
        char c = hex[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return CB_ERR_FORMAT;
        part[i / 16] = part[i / 16] << 4 | (uint64_t)v;
    }
    out->hi = part[0];
    out->lo = part[1];
    return CB_OK;
}

int cb_hash128_eq(cb_hash128 a, cb_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }
