/* kvfile.c - the KV file: one chunk's precomputed keys and values.
 *
 * Byte layout (little endian), format version 2, 3 for kivi4, 4 for coded;
 * also in cbkv(5):
 *
 *   offset  size  field
 *   0       8     magic "CBKV\r\n\x1a\n"
 *   8       4     format version: 2, 3 when the element type is kivi4, 4
 *                 when it is coded (layers of varying size); a writer
 *                 writes the lowest that describes the file, so a plain
 *                 type's file still reads in builds that know only 2;
 *                 version 1 files are still read
 *   12      4     H: header bytes, a multiple of 4096; the body starts at H
 *   16      16    model fingerprint (lo u64, hi u64), cb_gguf_fingerprint
 *   32      16    token hash (lo, hi), cb_kv_tokens_hash(lead, ids)
 *   48      4     n_layer
 *   52      4     n_head_kv
 *   56      4     head_dim
 *   60      4     n_rot (RoPE dimensions per head)
 *   64      4     rope pairing: 0 (2i, 2i+1) "normal", 1 (i, i+n_rot/2) neox
 *   68      4     rope base (f32) of the global layers
 *   72      4     element type: a ggml id (0 f32, 1 f16, 8 q8_0, 30 bf16)
 *                 in version 1 and 2, or a coded type: 1024 kivi4 in
 *                 version 3, 1025 coded in version 4 (only there)
 *   76      4     n_tokens
 *   80      4     pos0: K of token i was computed, after RoPE, at position pos0+i
 *   84      4     n_lead: lead-in tokens prefilled before the chunk, dropped
 *   88      4     position mode: 1 = "K after RoPE at pos0+i" (the only one)
 *   92      4     flags: bit 0, the global layers' RoPE frequencies are divided
 *                 (Llama 3's rope_freqs, a linear factor); version 1: 0
 *   96      8     S: layer stride in bytes, a multiple of 4096; version 4:
 *                 the largest layer's span
 *   104     8     B: bytes of one layer's K: n_tokens rows of
 *                 n_head_kv*head_dim elements; V's are as many for a ggml
 *                 type, and for kivi4 what its layout gives; version 4: 0
 *   112     8     total file size, H + n_layer*S (version 4: H + the
 *                 layers' spans)
 *   120     8     header checksum: XXH3-64 of bytes [0, H) with this field 0
 *   128     4n    token ids (int32)
 *   ...     4m    lead-in token ids (int32)
 *   ...     8L    per-layer checksums: XXH3-64 of the layer's S bytes (K, V
 *                 and padding, so that a flip anywhere in the file shows;
 *                 version 4: of its span)
 *   ...     8L    per-layer attention (version 2): the sliding window (u32, 0
 *                 for a global layer: keys p-window+1..p) and the RoPE base
 *                 (f32) the layer's K was rotated with; version 1 files are
 *                 read as window 0 and the base at 68 for every layer
 *   ...     16L   version 4 only: each layer's offset (u64; layer 0's is H,
 *                 each next one's the one before's end) and span (u64, a
 *                 multiple of 4096, at most S)
 *   ...           zeros up to H
 *   H + l*S       layer l: K (B bytes), V (B bytes, or kivi4's), zeros up
 *                 to S; version 4: layer l at its offset, coded as
 *                 kvcoded.c lays it out, zeros up to its span
 *
 * A coded type's layer is not rows of blocks: kivi4 groups keys per channel
 * along the tokens (kvcodec.c has its layout), coded entropy codes them
 * (kvcoded.c), so a reader decodes a whole layer, after its checksum, into
 * f16 rows, which the loader places as it places an f16 file's.
 *
 * Every layer starts on a 4096-byte boundary, so one layer can be read alone
 * (and with O_DIRECT).  Moving the chunk to position p is a RoPE rotation of
 * K by p - (pos0 + i), exact up to rounding. */
#include "kv.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define KV_MAGIC "CBKV\r\n\x1a\n"
#define KV_VERSION 2       /* the plain element types' files */
#define KV_VERSION_CODED 3 /* kivi4's */
#define KV_VERSION_VAR 4   /* coded's: layers of varying size */
#define KV_FLAG_ROPE_DIV 1u
#define KV_FIXED 128
#define KV_MAX_TOKENS (1 << 24)
#define KV_MAX_LAYERS 4096

struct cb_kvfile {
    char *path;
    int fd;           /* a local file, or -1 for a source */
    cb_kv_source src; /* src.read NULL for a local file */
    uint8_t *hdr;     /* H bytes */
    uint32_t H;
    uint64_t S, B, size;
    uint64_t BV;  /* bytes of one layer's V (B but for a coded type) */
    uint8_t *buf; /* one layer, S bytes, and for a coded type its rows */
    cb_kv_meta meta;
    int32_t *ids, *lead;
    uint64_t *sums;
    uint64_t *off, *span; /* [n_layer]: where each layer is, its bytes */
    int32_t *window;      /* [n_layer] */
    float *rope_base;     /* [n_layer] */
};

int cb_kv_type_ok(cb_type t)
{
    return t == CB_TYPE_F32 || t == CB_TYPE_F16 || t == CB_TYPE_BF16 || t == CB_TYPE_Q8_0 ||
           t == CB_TYPE_KIVI4 || t == CB_TYPE_CODED;
}

static int coded(cb_type t) { return t == CB_TYPE_KIVI4 || t == CB_TYPE_CODED; }

/* The format version of a file of element type t */
static uint32_t version_of(cb_type t)
{
    return t == CB_TYPE_CODED ? KV_VERSION_VAR : t == CB_TYPE_KIVI4 ? KV_VERSION_CODED : KV_VERSION;
}

/* Bytes of one layer's K and V of n tokens of width w in type t: 1, or 0
 * when the width is not whole blocks of the type. */
static int part_bytes(cb_type t, int32_t n, int64_t w, uint64_t *bk, uint64_t *bv)
{
    if (t == CB_TYPE_CODED) { /* no fixed size: a bound */
        *bk = 0;
        *bv = cb_coded_bound(n, w);
        return *bv > 0;
    }
    if (coded(t)) {
        *bk = cb_kivi4_k_bytes(n, w);
        *bv = cb_kivi4_v_bytes(n, w);
    } else {
        *bk = *bv = (uint64_t)cb_type_row_bytes(t, w) * (uint64_t)n;
    }
    return *bk > 0 && *bv > 0;
}

static uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

cb_hash128 cb_kv_tokens_hash(const int32_t *lead, int32_t n_lead, const int32_t *ids, int32_t n)
{
    XXH3_state_t *st = XXH3_createState();
    cb_hash128 out = {0, 0};
    int32_t nl = n_lead, nn = n;
    if (!st)
        return out;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, &nl, 4);
    XXH3_128bits_update(st, lead, sizeof(int32_t) * (size_t)n_lead);
    XXH3_128bits_update(st, &nn, 4);
    XXH3_128bits_update(st, ids, sizeof(int32_t) * (size_t)n);
    XXH128_hash_t h = XXH3_128bits_digest(st);
    XXH3_freeState(st);
    out.lo = h.low64;
    out.hi = h.high64;
    return out;
}

void cb_kv_key(cb_hash128 model, cb_hash128 tokens, char key[66])
{
    char a[33], b[33];
    cb_hash128_hex(model, a);
    cb_hash128_hex(tokens, b);
    snprintf(key, 66, "%s-%s", a, b);
}

/* Header flags of a model: bit 0 when its global layers' RoPE frequencies
 * are divided (rope_freqs, a linear factor) */
static uint32_t rope_flags(const cb_hparams *hp)
{
    return hp->rope_freqs || hp->rope_scale != 1.0f ? KV_FLAG_ROPE_DIV : 0;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
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

/* Where kv_write gets layer l's K (which 0) or V (which 1): n_tokens rows
 * of f32 [n_tokens, n_head_kv*head_dim] into rows. */
typedef cb_status (*kv_rows_fn)(void *ctx, int32_t l, int which, float *rows);

/* Every layer of a coded file from get, each at its steps (cb_coded_steps)
 * times g, laid from H on in buf (n_layer*S bytes there): the table and
 * checksums filled, where the body ends (*end), its largest span, and the
 * padding to pages in it (*pad). */
static cb_status coded_pass(const cb_kv_meta *mt, kv_rows_fn get, void *ctx, uint8_t *buf,
                            uint64_t H, uint64_t S, float g, float *tmp, uint64_t *end,
                            uint64_t *most, uint64_t *pad)
{
    int32_t n = mt->n_tokens, L = mt->n_layer;
    int64_t w = (int64_t)mt->n_head_kv * mt->head_dim;
    uint8_t *sums = buf + KV_FIXED + 4 * (size_t)(n + mt->n_lead), *table = sums + 16 * (size_t)L;
    uint64_t at = H;
    *most = *pad = 0;
    for (int32_t l = 0; l < L; l++) {
        uint64_t len;
        cb_status st = get(ctx, l, 0, tmp);
        if (st == CB_OK)
            st = get(ctx, l, 1, tmp + (int64_t)n * w);
        float s = cb_coded_steps(l, L) * g;
        if (st == CB_OK)
            st = cb_coded_encode(tmp, tmp + (int64_t)n * w, n, w, s, s, buf + at, S, &len);
        if (st != CB_OK)
            return st;
        uint64_t span = align_up(len, CB_KV_ALIGN);
        memset(buf + at + len, 0, (size_t)(S - len)); /* what zstd left: zeros */
        put64(table + 16 * (size_t)l, at);
        put64(table + 16 * (size_t)l + 8, span);
        put64(sums + 8 * (size_t)l, XXH3_64bits(buf + at, (size_t)span));
        *most = span > *most ? span : *most;
        *pad += span - len;
        at += span;
    }
    *end = at;
    return CB_OK;
}

/* A coded file's body at the rate CB_CODED_SHARE sets: the layers' steps
 * scaled by one g, within [1/4, 4], the largest tried whose file takes at
 * most 1/CB_CODED_SHARE of f16's bytes for its tokens (2 bytes an element;
 * its header and pages included), else the largest of those giving the
 * smallest file (chunks of a few tokens, whose pages are most of the file,
 * keep their steps).  A level's code grows by about
 * a bit when its steps double, so each pass moves g by 2^(the bits an
 * element is over or under, its pages as the last pass padded), or halves
 * the interval between a g that fit and one that did not; a few passes,
 * then the chosen g again if the last was not it. */
static cb_status write_coded(const cb_kv_meta *mt, kv_rows_fn get, void *ctx, uint8_t *buf,
                             uint64_t H, uint64_t S, float *tmp, uint64_t *end, uint64_t *most)
{
    int32_t n = mt->n_tokens, L = mt->n_layer;
    double elems = 2.0 * (double)n * (double)mt->n_head_kv * mt->head_dim * L;
    double target = 2 * elems / CB_CODED_SHARE;
    float g = 1, fit = 0, over = 0; /* the largest g that fit, the smallest that did not */
    float small = 1;                /* the largest g of the smallest file */
    uint64_t pad, least = UINT64_MAX;
    for (int pass = 0; pass < 6; pass++) {
        cb_status st = coded_pass(mt, get, ctx, buf, H, S, g, tmp, end, most, &pad);
        if (st != CB_OK)
            return st;
        if (*end > target && *end >= least && g == 0.25f)
            break; /* the fewest steps make it no smaller: its pages, not its codes */
        if (*end < least || (*end == least && g > small))
            least = *end, small = g;
        if ((double)*end <= target)
            fit = g > fit ? g : fit;
        else
            over = over == 0 || g < over ? g : over;
        if ((double)*end <= target && (double)*end > 0.98 * target)
            return CB_OK; /* within 2% under: close enough */
        /* the coded bytes aimed a little under what the pages leave them */
        double room = target - (double)H - (double)pad - 2048.0 * (pad > 0);
        float next = g * exp2f((float)(1.5 * (room - (double)(*end - H - pad)) * 8 / elems));
        /* at least 7% a pass, so that pages come or go */
        next = (double)*end > target ? fminf(next, 0.93f * g) : fmaxf(next, 1.07f * g);
        next = next < 0.25f ? 0.25f : next > 4 ? 4 : next;
        if (fit > 0 && over > 0 && (next <= fit || next >= over))
            next = sqrtf(fit * over); /* between the two known: halve the interval */
        if (next == g)
            break;
        g = next;
    }
    float best = fit > 0 ? fit : small;
    return best == g ? CB_OK : coded_pass(mt, get, ctx, buf, H, S, best, tmp, end, most, &pad);
}

/* The one KV file writer (cb_kv_serialize, cb_kvfile_recode): the header
 * that mt describes (model, shape, RoPE, flags, positions, ids, lead-in,
 * each layer's window and RoPE base; its token hash and type are not read)
 * and every layer's rows from get, in element type `type`, as a complete
 * file in a malloc'd *out. */
static cb_status kv_write(const cb_kv_meta *mt, kv_rows_fn get, void *ctx, cb_type type, void **out,
                          size_t *out_size)
{
    int32_t n = mt->n_tokens, n_lead = mt->n_lead;
    const int32_t *ids = mt->ids, *lead = mt->lead;
    int64_t width = (int64_t)mt->n_head_kv * mt->head_dim;
    size_t row = cb_type_row_bytes(type, width);
    uint64_t B, BV, S, H, total;
    uint8_t *buf;
    float *tmp;

    if (!cb_kv_type_ok(type) || n < 1 || n > KV_MAX_TOKENS || n_lead < 0 || mt->pos0 < 0 ||
        !part_bytes(type, n, width, &B, &BV))
        return CB_ERR_INVALID;
    int var = version_of(type) == KV_VERSION_VAR;
    S = align_up(B + BV, CB_KV_ALIGN); /* version 4: the most a layer may take */
    H = align_up(KV_FIXED + 4 * (uint64_t)(n + n_lead) + (var ? 32 : 16) * (uint64_t)mt->n_layer,
                 CB_KV_ALIGN);
    total = H + S * (uint64_t)mt->n_layer;
    buf = calloc(1, (size_t)total);
    /* a coded type encodes a layer's K and V together: both read at once */
    tmp = malloc(sizeof(float) * (size_t)(n * width) * (coded(type) ? 2 : 1));
    if (!buf || !tmp) {
        free(buf);
        free(tmp);
        return CB_ERR_NOMEM;
    }
    cb_hash128 th = cb_kv_tokens_hash(lead, n_lead, ids, n);
    memcpy(buf, KV_MAGIC, 8);
    put32(buf + 8, version_of(type));
    put32(buf + 12, (uint32_t)H);
    put64(buf + 16, mt->model.lo);
    put64(buf + 24, mt->model.hi);
    put64(buf + 32, th.lo);
    put64(buf + 40, th.hi);
    put32(buf + 48, (uint32_t)mt->n_layer);
    put32(buf + 52, (uint32_t)mt->n_head_kv);
    put32(buf + 56, (uint32_t)mt->head_dim);
    put32(buf + 60, (uint32_t)mt->n_rot);
    put32(buf + 64, (uint32_t)mt->rope_neox);
    memcpy(buf + 68, &mt->rope_base, 4);
    put32(buf + 72, (uint32_t)type);
    put32(buf + 76, (uint32_t)n);
    put32(buf + 80, (uint32_t)mt->pos0);
    put32(buf + 84, (uint32_t)n_lead);
    put32(buf + 88, 1);
    put32(buf + 92, mt->flags);
    put64(buf + 104, B);
    memcpy(buf + KV_FIXED, ids, 4 * (size_t)n);
    if (n_lead)
        memcpy(buf + KV_FIXED + 4 * (size_t)n, lead, 4 * (size_t)n_lead);
    uint8_t *sums = buf + KV_FIXED + 4 * (size_t)(n + n_lead),
            *att = sums + 8 * (size_t)mt->n_layer;
    for (int32_t l = 0; l < mt->n_layer; l++) {
        put32(att + 8 * (size_t)l, (uint32_t)mt->window[l]);
        memcpy(att + 8 * (size_t)l + 4, &mt->layer_rope_base[l], 4);
    }
    uint64_t at = H, most = 0; /* where the body ends; the largest span */
    cb_status st = var ? write_coded(mt, get, ctx, buf, H, S, tmp, &at, &most) : CB_OK;
    for (int32_t l = 0; !var && st == CB_OK && l < mt->n_layer; l++) {
        uint8_t *layer = buf + H + S * (uint64_t)l;
        for (int which = 0; which < 2 && st == CB_OK; which++) {
            float *x = coded(type) ? tmp + which * (int64_t)n * width : tmp;
            st = get(ctx, l, which, x);
            for (int32_t i = 0; i < n && !coded(type) && st == CB_OK; i++)
                cb_quant_row(type, tmp + i * width, layer + which * B + (uint64_t)i * row, width);
        }
        if (type == CB_TYPE_KIVI4 && st == CB_OK)
            cb_kivi4_encode(tmp, tmp + (int64_t)n * width, n, width, layer);
        put64(sums + 8 * (size_t)l, XXH3_64bits(layer, (size_t)S));
        most = S;
        at += S;
    }
    if (st != CB_OK) {
        free(buf);
        free(tmp);
        return st;
    }
    put64(buf + 96, most);
    put64(buf + 112, at);
    put64(buf + 120, XXH3_64bits(buf, (size_t)H));
    free(tmp);
    if (at < total) { /* coded layers took less than their bound */
        uint8_t *fit = realloc(buf, (size_t)at);
        buf = fit ? fit : buf;
    }
    *out = buf;
    *out_size = (size_t)at;
    return CB_OK;
}

/* kv_write's rows from a cache: rows pos0.. of layer l. */
typedef struct cache_rows {
    const cb_kvcache *kv;
    int32_t pos0, n;
} cache_rows;

static cb_status rows_of_cache(void *ctx, int32_t l, int which, float *rows)
{
    const cache_rows *c = ctx;
    return cb_kvcache_read(c->kv, l, which, c->pos0, c->n, rows);
}

cb_status cb_kv_serialize(const cb_model *m, const cb_kvcache *kv, const int32_t *lead,
                          int32_t n_lead, const int32_t *ids, int32_t n, int32_t pos0, cb_type type,
                          void **out, size_t *out_size)
{
    const cb_hparams *hp = cb_model_hparams(m);
    cb_kv_meta mt = {0};
    cache_rows c = {kv, pos0, n};
    cb_status st;

    if (n < 1 || n > KV_MAX_TOKENS || n_lead < 0 || pos0 < 0 || pos0 > cb_kvcache_n_ctx(kv) - n)
        return CB_ERR_INVALID;
    int32_t *window = malloc(sizeof(int32_t) * (size_t)hp->n_layer);
    float *base = malloc(sizeof(float) * (size_t)hp->n_layer);
    if (!window || !base) {
        free(window);
        free(base);
        return CB_ERR_NOMEM;
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        window[l] = cb_model_layer_window(m, l);
        base[l] = cb_model_layer_rope_base(m, l);
    }
    mt.model = cb_model_fingerprint(m);
    mt.n_layer = hp->n_layer;
    mt.n_head_kv = hp->n_head_kv;
    mt.head_dim = hp->head_dim;
    mt.n_rot = hp->n_rot;
    mt.rope_neox = hp->rope_neox;
    mt.rope_base = hp->rope_base;
    mt.flags = rope_flags(hp);
    mt.n_tokens = n;
    mt.pos0 = pos0;
    mt.n_lead = n_lead;
    mt.ids = ids;
    mt.lead = lead;
    mt.window = window;
    mt.layer_rope_base = base;
    st = kv_write(&mt, rows_of_cache, &c, type, out, out_size);
    free(window);
    free(base);
    return st;
}

/* ----------------------------------------------------------------- reader */

static cb_status bad(cb_error *err, const char *path, const char *what)
{
    return cb_error_set(err, CB_ERR_FORMAT, "%s: not a valid KV file: %s", path, what);
}

static int read_fd(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* The fields of the fixed header, checked as far as they can be without
 * the rest of the file; NULL, or why they are impossible. */
static const char *parse_fixed(const uint8_t *fixed, cb_kv_meta *mt, uint32_t *H, uint64_t *S,
                               uint64_t *B, uint64_t *BV, uint64_t *size)
{
    uint32_t version = get32(fixed + 8);
    *H = get32(fixed + 12);
    *S = get64(fixed + 96);
    *B = get64(fixed + 104);
    *size = get64(fixed + 112);
    mt->model.lo = get64(fixed + 16);
    mt->model.hi = get64(fixed + 24);
    mt->tokens.lo = get64(fixed + 32);
    mt->tokens.hi = get64(fixed + 40);
    mt->n_layer = (int32_t)get32(fixed + 48);
    mt->n_head_kv = (int32_t)get32(fixed + 52);
    mt->head_dim = (int32_t)get32(fixed + 56);
    mt->n_rot = (int32_t)get32(fixed + 60);
    mt->rope_neox = (int32_t)get32(fixed + 64);
    memcpy(&mt->rope_base, fixed + 68, 4);
    mt->type = (cb_type)get32(fixed + 72);
    mt->n_tokens = (int32_t)get32(fixed + 76);
    mt->pos0 = (int32_t)get32(fixed + 80);
    mt->n_lead = (int32_t)get32(fixed + 84);
    mt->flags = version == 1 ? 0 : get32(fixed + 92);
    /* checksum, then (v2) window and base, then (v4) offset and span */
    uint64_t per_layer = version == 1 ? 8 : version == KV_VERSION_VAR ? 32 : 16;

    if (mt->n_layer < 1 || mt->n_layer > KV_MAX_LAYERS || mt->n_head_kv < 1 ||
        mt->n_head_kv > 4096 || mt->head_dim < 1 || mt->head_dim > 4096 || mt->n_rot < 0 ||
        mt->n_rot > mt->head_dim || (mt->rope_neox != 0 && mt->rope_neox != 1))
        return "impossible model shape";
    if (!cb_kv_type_ok(mt->type) || (version >= KV_VERSION_CODED) != coded(mt->type) ||
        (coded(mt->type) && version != version_of(mt->type)))
        return "unknown element type";
    if (mt->n_tokens < 1 || mt->n_tokens > KV_MAX_TOKENS || mt->n_lead < 0 ||
        mt->n_lead > KV_MAX_TOKENS || mt->pos0 < 0 || get32(fixed + 88) != 1)
        return "impossible token counts or positions";
    if (mt->flags & ~KV_FLAG_ROPE_DIV)
        return "unknown flags";
    uint64_t bk;
    if (!part_bytes(mt->type, mt->n_tokens, (int64_t)mt->n_head_kv * mt->head_dim, &bk, BV))
        return "rows are not whole blocks of the element type";
    if (version == KV_VERSION_VAR) { /* S: the largest span, at most the bound's */
        if (*B != 0 || *S == 0 || *S > align_up(*BV, CB_KV_ALIGN) || *S % CB_KV_ALIGN)
            return "inconsistent layer sizes";
    } else if (*B != bk || *S < *B + *BV || *S % CB_KV_ALIGN || *S > (1ull << 40))
        return "inconsistent layer sizes";
    if (*H % CB_KV_ALIGN || *H < KV_FIXED + 4 * (uint64_t)(mt->n_tokens + mt->n_lead) +
                                     per_layer * (uint64_t)mt->n_layer)
        return "inconsistent header size";
    if (version == KV_VERSION_VAR ? *size < *H + CB_KV_ALIGN * (uint64_t)mt->n_layer ||
                                        *size > *H + *S * (uint64_t)mt->n_layer
                                  : *size != *H + *S * (uint64_t)mt->n_layer)
        return "inconsistent total size";
    return NULL;
}

/* Magic and version of a fixed header: CB_OK, or the error. */
static cb_status check_magic(const uint8_t *fixed, const char *path, cb_error *err)
{
    if (memcmp(fixed, KV_MAGIC, 8) != 0)
        return bad(err, path, "bad magic");
    uint32_t version = get32(fixed + 8);
    if (version < 1 || version > KV_VERSION_VAR)
        return cb_error_set(err, CB_ERR_UNSUPPORTED,
                            "%s: KV format version %u is not supported (this build reads 1 to %d)",
                            path, version, KV_VERSION_VAR);
    return CB_OK;
}

cb_status cb_kv_header_size(const void *fixed, size_t n, const char *name, uint64_t *size,
                            cb_error *err)
{
    cb_kv_meta mt;
    uint32_t H;
    uint64_t S, B, BV;
    cb_status st;
    if (n < KV_FIXED)
        return bad(err, name, "shorter than its fixed header");
    if ((st = check_magic(fixed, name, err)) != CB_OK)
        return st;
    const char *why = parse_fixed(fixed, &mt, &H, &S, &B, &BV, size);
    return why ? bad(err, name, why) : CB_OK;
}

uint64_t cb_kv_part_bytes(const void *data, size_t size, size_t i)
{
    const uint8_t *p = data;
    if (size < KV_FIXED || memcmp(p, KV_MAGIC, 8) != 0 || get64(p + 112) != size)
        return 0;
    uint64_t H = get32(p + 12), L = get32(p + 48), S = get64(p + 96);
    uint64_t n = get32(p + 76), lead = get32(p + 84);
    if (H == 0 || H > size || L == 0 || L > KV_MAX_LAYERS || S == 0 || i > L)
        return 0;
    if (get32(p + 8) != KV_VERSION_VAR)
        return H + L * S == size ? (i == 0 ? H : S) : 0;
    uint64_t table = KV_FIXED + 4 * (n + lead) + 16 * L, at = H;
    if (n > KV_MAX_TOKENS || lead > KV_MAX_TOKENS || table + 16 * L > H)
        return 0;
    for (uint64_t l = 0; l < L; l++) { /* the whole table, or none of it */
        uint64_t span = get64(p + table + 16 * l + 8);
        if (get64(p + table + 16 * l) != at || span == 0 || span > size - at)
            return 0;
        at += span;
    }
    return at != size ? 0 : i == 0 ? H : get64(p + table + 16 * (i - 1) + 8);
}

/* n bytes at off from the file or the source: CB_OK, or a status with
 * err set (a source says why; a file's short read is CB_ERR_IO). */
static cb_status read_at(cb_kvfile *f, void *buf, size_t n, uint64_t off, const char *what,
                         cb_error *err)
{
    if (f->src.read)
        return f->src.read(f->src.ctx, off, buf, n, err);
    if (read_fd(f->fd, buf, n, off) != 0)
        return cb_error_set(err, CB_ERR_IO, "%s: read error in %s", f->path, what);
    return CB_OK;
}

static void release_input(int fd, const cb_kv_source *src)
{
    if (fd >= 0)
        close(fd);
    if (src && src->release)
        src->release(src->ctx);
}

static cb_status kv_open(cb_kvfile **out, const char *path, int fd, const cb_kv_source *src,
                         uint64_t file_size, cb_error *err);

cb_status cb_kvfile_open(cb_kvfile **out, const char *path, cb_error *err)
{
    struct stat sb;
    cb_status st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        int e = errno;
        return cb_error_set(err, e == ENOENT || e == EACCES ? CB_ERR_NOT_FOUND : CB_ERR_IO,
                            "%s: %s", path, strerror(e));
    }
    if (fstat(fd, &sb) != 0) {
        st = cb_error_set(err, CB_ERR_IO, "%s: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    return kv_open(out, path, fd, NULL, (uint64_t)sb.st_size, err);
}

cb_status cb_kvfile_open_source(cb_kvfile **out, const cb_kv_source *src, cb_error *err)
{
    if (!src || !src->read) {
        release_input(-1, src);
        return cb_error_set(err, CB_ERR_INVALID, "KV source: no read function");
    }
    return kv_open(out, src->name ? src->name : "(KV source)", -1, src, src->size, err);
}

/* Each layer's offset and span: version 4's from its table (at), checked
 * to tile the body from H to the end, else H + l*S and S.  NULL, or why
 * the table is impossible. */
static const char *layer_table(cb_kvfile *f, uint32_t version, const uint8_t *at)
{
    uint64_t next = f->H;
    for (int32_t l = 0; l < f->meta.n_layer; l++) {
        f->off[l] = version == KV_VERSION_VAR ? get64(at + 16 * (size_t)l) : next;
        f->span[l] = version == KV_VERSION_VAR ? get64(at + 16 * (size_t)l + 8) : f->S;
        if (f->off[l] != next || f->span[l] == 0 || f->span[l] > f->S || f->span[l] % CB_KV_ALIGN)
            return "impossible layer table";
        next += f->span[l];
    }
    return next == f->size ? NULL : "impossible layer table";
}

/* The reader of a file (fd) or a source (src), which it owns from here:
 * released on failure, else by cb_kvfile_free. */
static cb_status kv_open(cb_kvfile **out, const char *path, int fd, const cb_kv_source *src,
                         uint64_t file_size, cb_error *err)
{
    uint8_t fixed[KV_FIXED];
    cb_kvfile *f;
    cb_status st;

    f = calloc(1, sizeof *f);
    if (!f) {
        release_input(fd, src);
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    }
    f->fd = fd;
    if (src)
        f->src = *src;
    if (!(f->path = strdup(path))) {
        cb_kvfile_free(f);
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    }
    if (file_size < KV_FIXED) {
        cb_kvfile_free(f);
        return bad(err, path, "shorter than its fixed header");
    }
    if ((st = read_at(f, fixed, KV_FIXED, 0, "its header", err)) != CB_OK) {
        cb_kvfile_free(f);
        return st;
    }
    if ((st = check_magic(fixed, path, err)) != CB_OK) {
        cb_kvfile_free(f);
        return st;
    }
    uint32_t version = get32(fixed + 8);
    cb_kv_meta *mt = &f->meta;

    /* Bounds before any allocation sized by the file. */
    const char *why = parse_fixed(fixed, mt, &f->H, &f->S, &f->B, &f->BV, &f->size);
    if (!why && f->size != file_size)
        why = "truncated or extended (size differs from its header)";
    if (why) {
        cb_kvfile_free(f);
        return bad(err, path, why);
    }
    f->hdr = malloc(f->H);
    f->buf = malloc(cb_kvfile_layer_bytes(f));
    f->ids = malloc(4 * (size_t)mt->n_tokens);
    f->lead = malloc(4 * (size_t)(mt->n_lead ? mt->n_lead : 1));
    f->sums = malloc(8 * (size_t)mt->n_layer);
    f->window = malloc(sizeof(int32_t) * (size_t)mt->n_layer);
    f->rope_base = malloc(sizeof(float) * (size_t)mt->n_layer);
    f->off = malloc(sizeof(uint64_t) * (size_t)mt->n_layer);
    f->span = malloc(sizeof(uint64_t) * (size_t)mt->n_layer);
    if (!f->hdr || !f->buf || !f->ids || !f->lead || !f->sums || !f->window || !f->rope_base ||
        !f->off || !f->span) {
        cb_kvfile_free(f);
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", path);
    }
    if ((st = read_at(f, f->hdr, f->H, 0, "its header", err)) != CB_OK) {
        cb_kvfile_free(f);
        return st;
    }
    uint64_t want = get64(f->hdr + 120);
    put64(f->hdr + 120, 0);
    if (XXH3_64bits(f->hdr, f->H) != want) {
        cb_kvfile_free(f);
        return cb_error_set(err, CB_ERR_CHECKSUM,
                            "%s: header checksum mismatch: the KV file is corrupt", path);
    }
    memcpy(f->ids, f->hdr + KV_FIXED, 4 * (size_t)mt->n_tokens);
    memcpy(f->lead, f->hdr + KV_FIXED + 4 * (size_t)mt->n_tokens, 4 * (size_t)mt->n_lead);
    const uint8_t *sums = f->hdr + KV_FIXED + 4 * (size_t)(mt->n_tokens + mt->n_lead);
    memcpy(f->sums, sums, 8 * (size_t)mt->n_layer);
    for (int32_t l = 0; l < mt->n_layer; l++) {
        const uint8_t *a = sums + 8 * (size_t)mt->n_layer + 8 * (size_t)l;
        f->window[l] = version == 1 ? 0 : (int32_t)get32(a);
        if (version == 1)
            f->rope_base[l] = mt->rope_base;
        else
            memcpy(&f->rope_base[l], a + 4, 4);
        if (f->window[l] < 0 || !(f->rope_base[l] > 0)) {
            cb_kvfile_free(f);
            return bad(err, path, "impossible per-layer window or RoPE base");
        }
    }
    if ((why = layer_table(f, version, sums + 16 * (size_t)mt->n_layer)) != NULL) {
        cb_kvfile_free(f);
        return bad(err, path, why);
    }
    mt->ids = f->ids;
    mt->lead = f->lead;
    mt->window = f->window;
    mt->layer_rope_base = f->rope_base;
    if (!cb_hash128_eq(cb_kv_tokens_hash(f->lead, mt->n_lead, f->ids, mt->n_tokens), mt->tokens)) {
        cb_kvfile_free(f);
        return bad(err, path, "token hash does not match its token ids");
    }
    *out = f;
    return CB_OK;
}

void cb_kvfile_free(cb_kvfile *f)
{
    if (!f)
        return;
    release_input(f->fd, &f->src);
    free(f->path);
    free(f->hdr);
    free(f->buf);
    free(f->ids);
    free(f->lead);
    free(f->sums);
    free(f->window);
    free(f->rope_base);
    free(f->off);
    free(f->span);
    free(f);
}

const cb_kv_meta *cb_kvfile_meta(const cb_kvfile *f) { return &f->meta; }
uint64_t cb_kvfile_size(const cb_kvfile *f) { return f->size; }

cb_status cb_kvfile_check_model(const cb_kvfile *f, const cb_model *m, cb_error *err)
{
    const cb_hparams *hp = cb_model_hparams(m);
    const cb_kv_meta *mt = &f->meta;
    int same = cb_hash128_eq(mt->model, cb_model_fingerprint(m)) && mt->n_layer == hp->n_layer &&
               mt->n_head_kv == hp->n_head_kv && mt->head_dim == hp->head_dim &&
               mt->n_rot == hp->n_rot && mt->rope_neox == hp->rope_neox &&
               mt->rope_base == hp->rope_base && mt->flags == rope_flags(hp);
    for (int32_t l = 0; same && l < hp->n_layer;
         l++) /* the fusor moves K with the layer's own RoPE */
        same = mt->window[l] == cb_model_layer_window(m, l) &&
               mt->layer_rope_base[l] == cb_model_layer_rope_base(m, l);
    if (!same) {
        char a[33], b[33];
        cb_hash128_hex(mt->model, a);
        cb_hash128_hex(cb_model_fingerprint(m), b);
        return cb_error_set(err, CB_ERR_MISMATCH,
                            "%s: made for another model (fingerprint %s, this model %s)", f->path,
                            a, b);
    }
    return CB_OK;
}

/* layer l's span (S bytes but in version 4) into buf, verified */
static cb_status load_layer_into(cb_kvfile *f, int32_t l, uint8_t *buf, cb_error *err)
{
    if (l < 0 || l >= f->meta.n_layer)
        return cb_error_set(err, CB_ERR_RANGE, "%s: layer %d out of range", f->path, l);
    char what[32];
    snprintf(what, sizeof what, "layer %d", l);
    cb_status st = read_at(f, buf, (size_t)f->span[l], f->off[l], what, err);
    if (st != CB_OK)
        return st;
    if (XXH3_64bits(buf, (size_t)f->span[l]) != f->sums[l])
        return cb_error_set(err, CB_ERR_CHECKSUM,
                            "%s: layer %d checksum mismatch: the KV file is corrupt", f->path, l);
    return CB_OK;
}

static cb_status load_layer(cb_kvfile *f, int32_t l, cb_error *err)
{
    return load_layer_into(f, l, f->buf, err);
}

/* Bytes of a layer's decoded rows (K then V, f16) of a coded type */
static size_t rows_bytes(const cb_kvfile *f)
{
    return 4 * (size_t)f->meta.n_tokens * (size_t)f->meta.n_head_kv * (size_t)f->meta.head_dim;
}

/* Bytes of the decoder's scratch: kivi4's 2 floats a channel, coded's
 * cb_coded_scratch */
static size_t scratch_bytes(const cb_kvfile *f)
{
    int64_t w = (int64_t)f->meta.n_head_kv * f->meta.head_dim;
    if (f->meta.type == CB_TYPE_CODED)
        return cb_coded_scratch(f->meta.n_tokens, w);
    return 2 * sizeof(float) * (size_t)w;
}

/* A coded type's buffer: the decoded rows, the largest layer's bytes as
 * stored (S), then the decoder's scratch; whole pages, as S is, so that
 * buffers laid end to end (the loader's) start on pages */
size_t cb_kvfile_layer_bytes(const cb_kvfile *f)
{
    if (!coded(f->meta.type))
        return (size_t)f->S;
    return (size_t)align_up(rows_bytes(f) + f->S + scratch_bytes(f), CB_KV_ALIGN);
}

cb_type cb_kvfile_rows_type(const cb_kvfile *f)
{
    return coded(f->meta.type) ? CB_TYPE_F16 : f->meta.type;
}

int cb_kvfile_concurrent(const cb_kvfile *f) { return f->src.read == NULL; }

cb_status cb_kvfile_layer_rows_into(cb_kvfile *f, int32_t l, void *buf, const void **k,
                                    const void **v, cb_error *err)
{
    const cb_kv_meta *mt = &f->meta;
    if (!coded(mt->type)) {
        cb_status st = load_layer_into(f, l, buf, err);
        if (st != CB_OK)
            return st;
        *k = buf;
        *v = (const uint8_t *)buf + f->B;
        return CB_OK;
    }
    int64_t w = (int64_t)mt->n_head_kv * mt->head_dim;
    uint8_t *rows = buf, *raw = rows + rows_bytes(f);
    uint16_t *dk = (uint16_t *)rows, *dv = dk + (int64_t)mt->n_tokens * w;
    cb_status st = load_layer_into(f, l, raw, err);
    if (st != CB_OK)
        return st;
    if (mt->type == CB_TYPE_CODED) {
        /* the checksum holds, but the bytes must still be a coded layer */
        if (cb_coded_decode(raw, f->span[l], mt->n_tokens, w, dk, dv, raw + f->S, 1) != CB_OK)
            return cb_error_set(err, CB_ERR_FORMAT,
                                "%s: not a valid KV file: layer %d does not decode", f->path, l);
    } else /* the layer's checksum holds: its bytes are the ones written */
        cb_kivi4_decode(raw, mt->n_tokens, w, dk, dv, (float *)(raw + f->S), 1);
    *k = dk;
    *v = dv;
    return CB_OK;
}

cb_status cb_kvfile_read_layer(cb_kvfile *f, int32_t l, float *k, float *v, cb_error *err)
{
    const cb_kv_meta *mt = &f->meta;
    int64_t width = (int64_t)mt->n_head_kv * mt->head_dim;
    cb_type rt = cb_kvfile_rows_type(f);
    size_t row = cb_type_row_bytes(rt, width);
    const void *rk, *rv;
    cb_status st = cb_kvfile_layer_rows(f, l, &rk, &rv, err);
    if (st != CB_OK)
        return st;
    for (int32_t i = 0; i < mt->n_tokens; i++) {
        cb_dequant_row(rt, (const uint8_t *)rk + (size_t)i * row, k + i * width, width);
        cb_dequant_row(rt, (const uint8_t *)rv + (size_t)i * row, v + i * width, width);
    }
    return CB_OK;
}

cb_status cb_kvfile_layer_rows(cb_kvfile *f, int32_t l, const void **k, const void **v,
                               cb_error *err)
{
    return cb_kvfile_layer_rows_into(f, l, f->buf, k, v, err);
}

cb_status cb_kvfile_load_layer(cb_kvfile *f, int32_t l, cb_kvcache *kv, int32_t pos, cb_error *err)
{
    const void *k, *v;
    cb_status st = cb_kvfile_layer_rows(f, l, &k, &v, err);
    if (st != CB_OK)
        return st;
    if ((st = cb_kvcache_load_rows(kv, l, pos, f->meta.n_tokens, cb_kvfile_rows_type(f), k, v,
                                   f->meta.pos0, 1.0f)) != CB_OK)
        cb_error_set(err, st, "%s: layer %d: cannot place it in the cache: %s", f->path, l,
                     cb_model_strerror(cb_kvcache_model(kv), st));
    return st;
}

cb_status cb_kvfile_verify(cb_kvfile *f, cb_error *err)
{
    for (int32_t l = 0; l < f->meta.n_layer; l++) {
        cb_status st = load_layer(f, l, err);
        if (st != CB_OK)
            return st;
    }
    return CB_OK;
}

/* ---------------------------------------------------------------- recode */


cb_status cb_kv_type_parse(const char *name, cb_type *out)
{
    /* the ggml ids, then the element types of KV files only */
    for (int t = 0; name && t < CB_TYPE_COUNT_ + 2; t++) {
        cb_type ty = t < CB_TYPE_COUNT_    ? (cb_type)t
                     : t == CB_TYPE_COUNT_ ? CB_TYPE_KIVI4
                                           : CB_TYPE_CODED;
        const char *tn = cb_type_name(ty);
        if (tn && cb_kv_type_ok(ty) && strcmp(tn, name) == 0) {
            *out = ty;
            return CB_OK;
        }
    }
    return CB_ERR_UNSUPPORTED;
}

/* kv_write's rows from a KV file: layer l read, verified and made f32 when
 * its K is asked for, its V kept for the call after. */
typedef struct file_rows {
    cb_kvfile *f;
    float *v; /* [n_tokens, width] */
    cb_error *err;
} file_rows;

static cb_status rows_of_file(void *ctx, int32_t l, int which, float *rows)
{
    file_rows *r = ctx;
    const cb_kv_meta *mt = &r->f->meta;
    if (which == 0)
        return cb_kvfile_read_layer(r->f, l, rows, r->v, r->err);
    memcpy(rows, r->v, sizeof(float) * (size_t)mt->n_tokens * (size_t)mt->n_head_kv * mt->head_dim);
    return CB_OK;
}

cb_status cb_kvfile_recode(cb_kvfile *f, cb_type type, void **buf, size_t *size, cb_error *err)
{
    const cb_kv_meta *mt = &f->meta;
    file_rows r = {f, NULL, err};
    if (!cb_kv_type_ok(type))
        return cb_error_set(err, CB_ERR_UNSUPPORTED, "%s: %s is not an element type of KV files",
                            f->path, cb_type_name(type) ? cb_type_name(type) : "(unknown)");
    if (!(r.v = malloc(sizeof(float) * (size_t)mt->n_tokens * (size_t)mt->n_head_kv *
                       (size_t)mt->head_dim)))
        return cb_error_set(err, CB_ERR_NOMEM, "%s: out of memory", f->path);
    if (err)
        err->status = CB_OK;
    cb_status st = kv_write(mt, rows_of_file, &r, type, buf, size);
    free(r.v);
    if (st != CB_OK && (!err || err->status == CB_OK))
        cb_error_set(err, st, "%s: cannot write it as %s: %s", f->path, cb_type_name(type),
                     cb_strerror(st));
    return st;
}
