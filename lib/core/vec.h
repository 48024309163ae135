/* vec.h - growable arrays: room by doubling (private to libcbcore).
 *
 * The one way the library grows an array it appends to:
 *
 *     if (l->n == l->cap) {
 *         item *v = cb_vec_reserve(l->v, &l->cap, l->n + 1, sizeof *v, 16);
 *         if (!v)
 *             return CB_ERR_NOMEM;
 *         l->v = v;
 *     }
 *     l->v[l->n++] = x;
 */
#ifndef CB_VEC_H
#define CB_VEC_H

#include <stdint.h>
#include <stdlib.h>

/* The array p of *cap elements of elem bytes, with room for at least need
 * elements: p itself when it has it; else p reallocated to twice *cap (or
 * to first when *cap is 0), doubled until need fits, and *cap updated.
 * NULL when memory runs out or the size overflows: then p and *cap are as
 * they were, and p is still the caller's to free.  first must be > 0. */
static inline void *cb_vec_reserve(void *p, size_t *cap, size_t need, size_t elem, size_t first)
{
    size_t c = *cap ? *cap : first;
    void *q;
    if (need <= *cap)
        return p;
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return NULL;
        c *= 2;
    }
    if (c > SIZE_MAX / elem)
        return NULL;
    q = realloc(p, c * elem);
    if (q)
        *cap = c;
    return q;
}

#endif
