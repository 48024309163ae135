/* test_kv.c - the KV file format and precompute semantics: round trip per
 * element type, a precomputed chunk's layer-0 K/V moved to position p equal
 * full prefill's at p, a bit flip anywhere is detected, another model's
 * file is refused, another format version is its own status, a file
 * rewritten in another element type keeps its header. */
#include "../../lib/kv/kv.h"
#include "test.h"

#include <unistd.h>
#include <xxhash.h>

static const char *tmpdir(void)
{
    const char *t = getenv("CB_TEST_TMP");
    return t ? t : "tests/tmp";
}

static cb_model *load(const char *type)
{
    char path[1024];
    cb_model *m = NULL;
    cb_error err;
    snprintf(path, sizeof path, "%s/tiny-%s.gguf", tmpdir(), type);
    if (cb_model_load(&m, path, &T_EXACT, &err) != CB_OK)
        printf("# %s\n", err.msg);
    return m;
}

static double max_abs(const float *a, const float *b, size_t n, double *scale)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        md = e > md ? e : md;
        mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
    }
    if (scale)
        *scale = mb;
    return md;
}

static int write_file(const char *path, const void *buf, size_t n)
{
    cb_error err;
    return cb_file_write_atomic(path, buf, n, &err) == CB_OK ? 0 : -1;
}

#define NC 12 /* chunk tokens */

/* The loader's path (cb_kvfile_layer_rows, cb_kvcache_load_rows: rows of
 * the cache's type sent as they are, K expanded, scaled and moved on the
 * backend; others through f32 on the host) against the plain one (f32 on
 * the host, keys scaled there, cb_kvcache_load): the same cache, bit for
 * bit, into an f16 and an f32 cache, moved and not, keys scaled and not;
 * and cb_kvfile_load_layer as the first. */
static void check_load_rows(cb_model *m, cb_kvfile *kf)
{
    const cb_hparams *hp = cb_model_hparams(m);
    const cb_kv_meta *mt = cb_kvfile_meta(kf);
    cb_type rt = cb_kvfile_rows_type(kf); /* f16 for a coded type */
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim, e = (int64_t)mt->n_tokens * w;
    float *k = malloc(sizeof(float) * (size_t)e), *v = malloc(sizeof(float) * (size_t)e);
    float *ra = malloc(sizeof(float) * (size_t)e), *rb = malloc(sizeof(float) * (size_t)e);
    static const cb_type ctypes[] = {CB_TYPE_F16, CB_TYPE_F32};
    static const float scales[] = {1.0f, 1.0f / 1.05f};
    cb_error err;
    int bad = 0, n = 0;
    for (int ci = 0; ci < 2; ci++)
        for (int si = 0; si < 2; si++)
            for (int moved = 0; moved < 2; moved++) {
                int32_t pos = moved ? 29 : mt->pos0;
                cb_kvcache *a = NULL, *b = NULL, *c = NULL;
                CHECK_OK(cb_kvcache_new(&a, m, 64, ctypes[ci]));
                CHECK_OK(cb_kvcache_new(&b, m, 64, ctypes[ci]));
                CHECK_OK(cb_kvcache_new(&c, m, 64, ctypes[ci]));
                if (!a || !b || !c)
                    break;
                for (int32_t l = 0; l < hp->n_layer; l++) {
                    const void *rk, *rv;
                    CHECK_OK(cb_kvfile_read_layer(kf, l, k, v, &err));
                    for (int64_t i = 0; i < e && scales[si] != 1.0f; i++)
                        k[i] *= scales[si];
                    CHECK_OK(cb_kvcache_load(a, l, pos, mt->n_tokens, k, v, mt->pos0));
                    CHECK_OK(cb_kvfile_layer_rows(kf, l, &rk, &rv, &err));
                    CHECK_OK(cb_kvcache_load_rows(b, l, pos, mt->n_tokens, rt, rk, rv, mt->pos0,
                                                  scales[si]));
                    if (si == 0)
                        CHECK_OK(cb_kvfile_load_layer(kf, l, c, pos, &err));
                    for (int which = 0; which < 2; which++) {
                        CHECK_OK(cb_kvcache_read(a, l, which, pos, mt->n_tokens, ra));
                        CHECK_OK(cb_kvcache_read(b, l, which, pos, mt->n_tokens, rb));
                        bad += memcmp(ra, rb, sizeof(float) * (size_t)e) != 0;
                        if (si == 0) {
                            CHECK_OK(cb_kvcache_read(c, l, which, pos, mt->n_tokens, rb));
                            bad += memcmp(ra, rb, sizeof(float) * (size_t)e) != 0;
                        }
                        n += 1 + (si == 0);
                    }
                }
                cb_kvcache_free(a);
                cb_kvcache_free(b);
                cb_kvcache_free(c);
            }
    CHECKF(bad == 0, "%d of %d layer reads differ from the plain path", bad, n);
    /* out of range, as cb_kvcache_load */
    cb_kvcache *a = NULL;
    const void *rk, *rv;
    CHECK_OK(cb_kvcache_new(&a, m, 16, CB_TYPE_F16));
    CHECK_OK(cb_kvfile_layer_rows(kf, 0, &rk, &rv, &err));
    CHECK(cb_kvcache_load_rows(a, 0, 16 - mt->n_tokens + 1, mt->n_tokens, rt, rk, rv, mt->pos0,
                               1.0f) == CB_ERR_RANGE);
    CHECK(cb_kvfile_load_layer(kf, hp->n_layer, a, 0, &err) == CB_ERR_RANGE);
    cb_kvcache_free(a);
    free(k), free(v), free(ra), free(rb);
}

/* cb_kvcache_load_segs (the loader's layer of every cached chunk at once)
 * against cb_kvcache_load_rows on each segment: the same cache, bit for
 * bit, into an f16 and an f32 cache, by groups of 1, 2 and all segments
 * (the CPU's and a device's choices) and the backend's own; segments
 * unmoved and moved, keys scaled (by two scales) and not, rows of the
 * file's type and f32 rows (another type for an f16 cache), empty ones. */
static void check_load_segs(cb_model *m, cb_kvfile *kf)
{
    const cb_hparams *hp = cb_model_hparams(m);
    const cb_kv_meta *mt = cb_kvfile_meta(kf);
    cb_type rt = cb_kvfile_rows_type(kf); /* f16 for a coded type */
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim, e = (int64_t)mt->n_tokens * w;
    enum { CTX = 96 };
    float *k = malloc(sizeof(float) * (size_t)e), *v = malloc(sizeof(float) * (size_t)e);
    float *ra = malloc(sizeof(float) * CTX * (size_t)w),
          *rb = malloc(sizeof(float) * CTX * (size_t)w);
    static const cb_type ctypes[] = {CB_TYPE_F16, CB_TYPE_F32};
    static const int32_t groups[] = {0, 1, 2, 64};
    const float s1 = 1.0f / 1.05f, s2 = 1.0f / 1.1f;
    cb_error err;
    int bad = 0, n = 0;
    for (int ci = 0; ci < 2; ci++)
        for (int gi = 0; gi < 4; gi++)
            for (int set = 0; set < 2; set++) {
                cb_kvcache *a = NULL, *b = NULL;
                cb_kv_scratch sc = {.group = groups[gi]};
                CHECK_OK(cb_kvcache_new(&a, m, CTX, ctypes[ci]));
                CHECK_OK(cb_kvcache_new(&b, m, CTX, ctypes[ci]));
                if (!a || !b)
                    break;
                for (int32_t l = 0; l < hp->n_layer; l++) {
                    const void *rk, *rv;
                    CHECK_OK(cb_kvfile_read_layer(kf, l, k, v, &err));
                    CHECK_OK(cb_kvfile_layer_rows(kf, l, &rk, &rv, &err));
                    int32_t p0 = mt->pos0, nt = mt->n_tokens;
                    /* set 0: unmoved as is, moved and scaled, moved alone,
                     * f32 rows moved and scaled, empty, moved at another
                     * scale; set 1: unmoved and scaled, then moved at one
                     * scale (a run across segments) */
                    cb_kv_seg s0[] = {{p0, nt, p0, rt, rk, rv, 1.0f},
                                      {p0 + nt + 3, nt, p0, rt, rk, rv, s1},
                                      {p0 + 2 * nt + 5, nt, p0, rt, rk, rv, 1.0f},
                                      {p0 + 3 * nt + 6, nt, p0, CB_TYPE_F32, k, v, s1},
                                      {p0 + 4 * nt + 6, 0, p0, rt, rk, rv, s1},
                                      {p0 + 4 * nt + 6, nt, p0, rt, rk, rv, s2}};
                    cb_kv_seg s1s[] = {{p0, nt, p0, rt, rk, rv, s1},
                                       {p0 + nt, nt, p0, rt, rk, rv, s1},
                                       {p0 + 2 * nt + 1, nt, p0, rt, rk, rv, s1}};
                    const cb_kv_seg *segs = set ? s1s : s0;
                    int32_t ns = set ? 3 : 6;
                    CHECK_OK(cb_kvcache_load_segs(a, l, segs, ns, &sc));
                    for (int32_t i = 0; i < ns; i++)
                        CHECK_OK(cb_kvcache_load_rows(b, l, segs[i].pos, segs[i].n, segs[i].type,
                                                      segs[i].k, segs[i].v, segs[i].from_pos0,
                                                      segs[i].key_scale));
                    for (int which = 0; which < 2; which++, n++) {
                        CHECK_OK(cb_kvcache_read(a, l, which, 0, CTX, ra));
                        CHECK_OK(cb_kvcache_read(b, l, which, 0, CTX, rb));
                        bad += memcmp(ra, rb, sizeof(float) * CTX * (size_t)w) != 0;
                    }
                }
                CHECK(sc.group == groups[gi]);
                cb_kv_scratch_free(a, &sc);
                CHECK(sc.tmp == NULL && sc.cap == 0 && sc.group == groups[gi]);
                cb_kvcache_free(a);
                cb_kvcache_free(b);
            }
    CHECKF(bad == 0, "%d of %d layer reads differ from placing segment by segment", bad, n);
    /* a segment out of range: refused before anything is placed */
    cb_kvcache *a = NULL;
    const void *rk, *rv;
    cb_kv_scratch sc = {0};
    CHECK_OK(cb_kvcache_new(&a, m, 16, CB_TYPE_F16));
    CHECK_OK(cb_kvfile_layer_rows(kf, 0, &rk, &rv, &err));
    cb_kv_seg over[] = {{0, 2, 0, rt, rk, rv, 1.0f}, {15, 2, 0, rt, rk, rv, 1.0f}};
    CHECK(cb_kvcache_load_segs(a, 0, over, 2, &sc) == CB_ERR_RANGE && sc.tmp == NULL);
    cb_kv_scratch_free(a, &sc);
    cb_kvcache_free(a);
    free(k), free(v), free(ra), free(rb);
}

static int coded_type(cb_type t) { return t == CB_TYPE_KIVI4 || t == CB_TYPE_CODED; }

static void test_roundtrip_and_move(cb_model *m)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    cb_tokens lead = {0};
    int32_t ids[NC], prefix[7];
    cb_error err;
    char path[1024];

    CHECK_OK(cb_kv_lead_in(m, &lead));
    for (int i = 0; i < NC; i++)
        ids[i] = (int32_t)((i * 53 + 7) % hp->n_vocab);
    for (int i = 0; i < 7; i++)
        prefix[i] = (int32_t)((i * 31 + 100) % hp->n_vocab);

    static const cb_type types[] = {CB_TYPE_F32,  CB_TYPE_F16,   CB_TYPE_BF16,
                                    CB_TYPE_Q8_0, CB_TYPE_KIVI4, CB_TYPE_CODED};
    /* relative to max |value|; kivi4: half of a 4-bit step of a group's range;
     * coded: half a step of a deviation or more (s = 1) */
    static const double tol[] = {1e-6, 2e-3, 1.6e-2, 1.6e-2, 0.1, 0.5};
    size_t bytes_f16 = 0;
    for (size_t ti = 0; ti < 6; ti++) {
        cb_type t = types[ti];
        tcase(
            "kv %s %s: precompute, save, open, read back; moved layer-0 K/V equal full prefill at p",
            hp->arch, cb_type_name(t));
        cb_kvcache *kv = NULL, *full = NULL, *moved = NULL;
        cb_fwd *f = NULL;
        void *buf = NULL;
        size_t size = 0;
        CHECK_OK(cb_kvcache_new(&kv, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_fwd_new(&f, m, 64));
        CHECK_OK(cb_kv_precompute(f, kv, lead.ids, (int32_t)lead.n, ids, NC, t, &buf, &size));
        if (!buf)
            return;
        CHECK(size % CB_KV_ALIGN == 0);
        if (t == CB_TYPE_F16)
            bytes_f16 = size;
        snprintf(path, sizeof path, "%s/chunk-%s.cbkv", tmpdir(), cb_type_name(t));
        CHECK(write_file(path, buf, size) == 0);
        cb_kvfile *kf = NULL;
        CHECK_OK(cb_kvfile_open(&kf, path, &err));
        if (!kf) {
            printf("# %s\n", err.msg);
            return;
        }
        const cb_kv_meta *mt = cb_kvfile_meta(kf);
        CHECK(mt->n_tokens == NC && mt->n_lead == (int32_t)lead.n && mt->pos0 == (int32_t)lead.n);
        CHECK(mt->type == t && mt->n_layer == hp->n_layer && mt->n_head_kv == hp->n_head_kv);
        CHECK(memcmp(mt->ids, ids, sizeof ids) == 0);
        for (int l = 0; l < hp->n_layer; l++) /* what the fusor moves K with, per layer */
            CHECK(mt->window[l] == cb_model_layer_window(m, l) &&
                  mt->layer_rope_base[l] == cb_model_layer_rope_base(m, l));
        CHECK(cb_hash128_eq(mt->model, cb_model_fingerprint(m)));
        CHECK(cb_hash128_eq(mt->tokens, cb_kv_tokens_hash(lead.ids, (int32_t)lead.n, ids, NC)));
        CHECK_OK(cb_kvfile_check_model(kf, m, &err));
        CHECK_OK(cb_kvfile_verify(kf, &err));
        CHECK(cb_kvfile_size(kf) == size);

        float *k = malloc(sizeof(float) * NC * w), *v = malloc(sizeof(float) * NC * w);
        float *rk = malloc(sizeof(float) * NC * w), *rv = malloc(sizeof(float) * NC * w);
        double worst = 0;
        for (int l = 0; l < hp->n_layer; l++) {
            double sk, sv;
            CHECK_OK(cb_kvfile_read_layer(kf, l, k, v, &err));
            CHECK_OK(cb_kvcache_read(kv, l, 0, (int32_t)lead.n, NC, rk));
            CHECK_OK(cb_kvcache_read(kv, l, 1, (int32_t)lead.n, NC, rv));
            double ek = max_abs(k, rk, (size_t)(NC * w), &sk) / sk,
                   ev = max_abs(v, rv, (size_t)(NC * w), &sv) / sv;
            worst = ek > worst ? ek : worst;
            worst = ev > worst ? ev : worst;
        }
        CHECKF(worst <= tol[ti], "read back error %.3g > %.3g", worst, tol[ti]);

        /* Full prefill of prefix + chunk: the chunk sits at p = 7.  Layer 0's
         * K/V depend only on token and position, so the stored ones moved
         * to p must equal it. */
        int32_t all[7 + NC];
        memcpy(all, prefix, sizeof prefix);
        memcpy(all + 7, ids, sizeof ids);
        CHECK_OK(cb_kvcache_new(&full, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_kvcache_new(&moved, m, 64, CB_TYPE_F32));
        CHECK_OK(cb_model_eval(f, full, all, 7 + NC, 0, NULL));
        CHECK_OK(cb_kvfile_read_layer(kf, 0, k, v, &err));
        CHECK_OK(cb_kvcache_load(moved, 0, 7, NC, k, v, mt->pos0));
        CHECK_OK(cb_kvcache_read(full, 0, 0, 7, NC, rk));
        CHECK_OK(cb_kvcache_read(moved, 0, 0, 7, NC, k));
        CHECK_OK(cb_kvcache_read(full, 0, 1, 7, NC, rv));
        CHECK_OK(cb_kvcache_read(moved, 0, 1, 7, NC, v));
        double sk, sv;
        double ek = max_abs(k, rk, (size_t)(NC * w), &sk) / sk,
               ev = max_abs(v, rv, (size_t)(NC * w), &sv) / sv;
        CHECKF(ek <= tol[ti] + 1e-5 && ev <= tol[ti] + 1e-5,
               "moved layer 0: K err %.3g, V err %.3g", ek, ev);
        printf("# %s %s: %zu bytes, read-back error %.2e, moved layer-0 K %.2e V %.2e\n", hp->arch,
               cb_type_name(t), size, worst, ek, ev);
        /* and a deeper layer differs (the chunk now has context): the
         * deviation blending corrects */
        CHECK_OK(cb_kvfile_read_layer(kf, hp->n_layer - 1, k, v, &err));
        CHECK_OK(cb_kvcache_read(full, hp->n_layer - 1, 1, 7, NC, rv));
        if (!coded_type(t)) /* the model's deviation: beyond a coded type's steps */
            CHECK(max_abs(v, rv, (size_t)(NC * w), &sv) / sv > 10 * tol[ti]);
        tcase("kv %s %s: the loader's rows placed as the f32 path places them, bit for bit",
              hp->arch, cb_type_name(t));
        check_load_rows(m, kf);
        tcase("kv %s %s: a layer's segments placed together as one by one, bit for bit", hp->arch,
              cb_type_name(t));
        check_load_segs(m, kf);
        free(k), free(v), free(rk), free(rv);
        cb_kvfile_free(kf);
        cb_kvcache_free(kv);
        cb_kvcache_free(full);
        cb_kvcache_free(moved);
        cb_fwd_free(f);
        free(buf);
        if (t == CB_TYPE_Q8_0 && bytes_f16) {
            tcase("kv q8_0 is about half the size of f16");
            /* per token, before page padding (a 12-token chunk fits a page either way) */
            double r = (double)cb_type_row_bytes(CB_TYPE_Q8_0, w) /
                       (double)cb_type_row_bytes(CB_TYPE_F16, w);
            CHECKF(r <= 0.55, "q8_0 / f16 bytes per token = %.3f", r);
        }
        if (t == CB_TYPE_KIVI4) {
            tcase("kv kivi4 is under a third of the size of f16");
            /* per token, groups of 32 full, before page padding */
            double r = (double)(cb_kivi4_k_bytes(32, w) + cb_kivi4_v_bytes(32, w)) /
                       (double)(2 * 32 * cb_type_row_bytes(CB_TYPE_F16, w));
            CHECKF(r <= 0.32, "kivi4 / f16 bytes per token = %.3f", r);
        }
    }
    cb_tokens_free(&lead);
}

static void test_corruption(cb_model *m, cb_model *other, const char *type)
{
    char path[1024], flip[1024];
    cb_error err;
    size_t n;
    snprintf(path, sizeof path, "%s/chunk-%s.cbkv", tmpdir(), type);
    snprintf(flip, sizeof flip, "%s/flip.cbkv", tmpdir());
    char *orig = t_read_file(path, &n);

    tcase("kv %s: a bit flip anywhere in the file is detected", type);
    if (!orig) {
        CHECK(0);
        return;
    }
    /* every byte of the f16 file, every 7th of another (the same checks) */
    int missed = 0, by_open = 0, by_verify = 0;
    size_t step = strcmp(type, "f16") ? 7 : 1;
    for (size_t at = 0; at < n; at += step) {
        orig[at] ^= (char)(1 << (at % 8));
        write_file(flip, orig, n);
        orig[at] ^= (char)(1 << (at % 8));
        cb_kvfile *kf = NULL;
        if (cb_kvfile_open(&kf, flip, &err) != CB_OK) {
            by_open++;
            continue;
        }
        if (cb_kvfile_verify(kf, &err) != CB_OK && err.status == CB_ERR_CHECKSUM)
            by_verify++;
        else
            missed++;
        cb_kvfile_free(kf);
    }
    CHECKF(missed == 0, "%d of %zu flips went unnoticed", missed, n / step);
    printf("# %zu single-bit flips: %d refused at open, %d by a layer checksum, %d missed\n",
           (n + step - 1) / step, by_open, by_verify, missed);

    tcase("kv %s: truncation, another version, another model: distinct statuses", type);
    cb_kvfile *kf = NULL;
    char version = orig[8];
    write_file(flip, orig, n - 4096);
    CHECK(cb_kvfile_open(&kf, flip, &err) == CB_ERR_FORMAT && strstr(err.msg, "truncated"));
    write_file(flip, orig, 100);
    CHECK(cb_kvfile_open(&kf, flip, &err) == CB_ERR_FORMAT);
    orig[8] = 5;
    write_file(flip, orig, n);
    CHECK(cb_kvfile_open(&kf, flip, &err) == CB_ERR_UNSUPPORTED && strstr(err.msg, "version 5"));
    /* a coded type only in version 3 (kivi4) or 4 (coded) files, a plain
     * one only before */
    orig[8] = version == 3 ? 2 : 3;
    write_file(flip, orig, n);
    orig[8] = version;
    CHECK(cb_kvfile_open(&kf, flip, &err) == CB_ERR_FORMAT && strstr(err.msg, "element type"));
    orig[130] ^= 1; /* a token id: header checksum */
    write_file(flip, orig, n);
    orig[130] ^= 1;
    CHECK(cb_kvfile_open(&kf, flip, &err) == CB_ERR_CHECKSUM);
    CHECK(cb_kvfile_open(&kf, "/nonexistent/x.cbkv", &err) == CB_ERR_NOT_FOUND);
    CHECK_OK(cb_kvfile_open(&kf, path, &err));
    if (kf && other) {
        CHECK(cb_kvfile_check_model(kf, other, &err) == CB_ERR_MISMATCH);
        CHECKF(strstr(err.msg, "another model") != NULL, "%s", err.msg);
        CHECK_OK(cb_kvfile_check_model(kf, m, &err));
    }
    cb_kvfile_free(kf);
    unlink(flip);
    free(orig);
}

/* A source in memory: the bytes, where reads start failing, and how many
 * times it was released. */
typedef struct memsrc {
    const uint8_t *data;
    uint64_t fail_from; /* reads reaching past this offset fail */
    int released, reads;
} memsrc;

static cb_status mem_read(void *ctx, uint64_t off, void *buf, size_t n, cb_error *err)
{
    memsrc *ms = ctx;
    ms->reads++;
    if (off + n > ms->fail_from)
        return cb_error_set(err, CB_ERR_IO, "memsrc: gone at %llu", (unsigned long long)off);
    memcpy(buf, ms->data + off, n);
    return CB_OK;
}

static void mem_release(void *ctx) { ((memsrc *)ctx)->released++; }

/* The same file through a source: the same layers; a source's failure and
 * a flipped byte in a layer reach the reader as errors of that layer only;
 * the source is released once, on free or on a failed open. */
static void test_source(const char *type)
{
    char path[1024];
    size_t n;
    cb_error err;
    snprintf(path, sizeof path, "%s/chunk-%s.cbkv", tmpdir(), type);
    uint8_t *orig = (uint8_t *)t_read_file(path, &n);

    tcase("kv source %s: layers equal the file's; failures and corruption are that layer's "
          "errors; released once",
          type);
    if (!orig) {
        CHECK(0);
        return;
    }
    cb_kvfile *a = NULL, *b = NULL;
    memsrc ms = {orig, n, 0, 0};
    cb_kv_source src = {mem_read, mem_release, &ms, n, "mem"};
    CHECK_OK(cb_kvfile_open(&a, path, &err));
    CHECK_OK(cb_kvfile_open_source(&b, &src, &err));
    if (!a || !b) {
        cb_kvfile_free(a);
        cb_kvfile_free(b);
        free(orig);
        return;
    }
    const cb_kv_meta *mt = cb_kvfile_meta(a);
    size_t per = (size_t)mt->n_tokens * (size_t)(mt->n_head_kv * mt->head_dim);
    float *k1 = malloc(4 * per), *v1 = malloc(4 * per), *k2 = malloc(4 * per),
          *v2 = malloc(4 * per);
    /* where the last layer starts: the file's end less its span */
    uint64_t at = n - cb_kv_part_bytes(orig, n, (size_t)mt->n_layer);
    int same = 1;
    for (int32_t l = 0; l < mt->n_layer; l++) {
        CHECK_OK(cb_kvfile_read_layer(a, l, k1, v1, &err));
        CHECK_OK(cb_kvfile_read_layer(b, l, k2, v2, &err));
        same &= !memcmp(k1, k2, 4 * per) && !memcmp(v1, v2, 4 * per);
    }
    CHECK(same && cb_kvfile_size(b) == n && ms.released == 0);
    /* the last layer's bytes stop coming: that layer fails, earlier ones read */
    int32_t last = mt->n_layer - 1;
    ms.fail_from = at + 1;
    CHECK(cb_kvfile_read_layer(b, last, k2, v2, &err) == CB_ERR_IO &&
          strstr(err.msg, "memsrc: gone"));
    CHECK_OK(cb_kvfile_read_layer(b, 0, k2, v2, &err));
    /* a flipped byte in a layer: a checksum error of that layer */
    ms.fail_from = n;
    orig[at + 5] ^= 4;
    CHECK(cb_kvfile_read_layer(b, last, k2, v2, &err) == CB_ERR_CHECKSUM &&
          strstr(err.msg, "mem: layer"));
    orig[at + 5] ^= 4;
    cb_kvfile_free(b);
    CHECK(ms.released == 1);
    /* a failed open releases it too: a bad header, a short source, no reader */
    memsrc m2 = {orig, n, 0, 0};
    cb_kv_source s2 = {mem_read, mem_release, &m2, n, "mem"};
    orig[130] ^= 1;
    CHECK(cb_kvfile_open_source(&b, &s2, &err) == CB_ERR_CHECKSUM && m2.released == 1);
    orig[130] ^= 1;
    s2.size = n - 1;
    CHECK(cb_kvfile_open_source(&b, &s2, &err) == CB_ERR_FORMAT && m2.released == 2);
    s2.read = NULL;
    CHECK(cb_kvfile_open_source(&b, &s2, &err) == CB_ERR_INVALID && m2.released == 3);
    free(k1), free(v1), free(k2), free(v2);
    cb_kvfile_free(a);
    free(orig);
}

/* Version 1 (no per-layer table, no flags) is still read: every layer
 * global at the header's RoPE base.  Made here from a version 2 file: the
 * table zeroed (padding in version 1), version 1, the header checksum
 * redone. */
static void test_version1(cb_model *m)
{
    char path[1024], v1[1024];
    cb_error err;
    size_t n;
    snprintf(path, sizeof path, "%s/chunk-f16.cbkv", tmpdir());
    snprintf(v1, sizeof v1, "%s/chunk-v1.cbkv", tmpdir());
    uint8_t *b = (uint8_t *)t_read_file(path, &n);
    tcase("kv: a version 1 file opens as all-global layers at its RoPE base");
    if (!b || n < 4096) {
        CHECK(0);
        free(b);
        return;
    }
    uint32_t nl, nt, nlead, H;
    memcpy(&H, b + 12, 4), memcpy(&nl, b + 48, 4), memcpy(&nt, b + 76, 4),
        memcpy(&nlead, b + 84, 4);
    uint8_t *table = b + 128 + 4 * (size_t)(nt + nlead) + 8 * (size_t)nl;
    memset(table, 0, 8 * (size_t)nl);
    b[8] = 1;
    memset(b + 92, 0, 4);
    memset(b + 120, 0, 8);
    uint64_t sum = XXH3_64bits(b, H);
    memcpy(b + 120, &sum, 8);
    write_file(v1, b, n);
    cb_kvfile *kf = NULL;
    CHECK_OK(cb_kvfile_open(&kf, v1, &err));
    if (kf) {
        const cb_kv_meta *mt = cb_kvfile_meta(kf);
        int ok = 1;
        for (int32_t l = 0; l < mt->n_layer; l++)
            ok &= mt->window[l] == 0 && mt->layer_rope_base[l] == mt->rope_base;
        CHECK(ok && mt->flags == 0);
        CHECK_OK(cb_kvfile_check_model(kf, m, &err)); /* the fixture is all global */
        CHECK_OK(cb_kvfile_verify(kf, &err));
    }
    cb_kvfile_free(kf);
    free(b);
}

/* A version 4 file (coded): its offset and span table. */
typedef struct v4 {
    uint8_t *b;
    size_t n;
    uint32_t H, L;
    size_t sums, table; /* offsets of the checksums and of the table */
} v4;

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The header's checksum redone, and (l >= 0) layer l's first */
static void reseal(v4 *f, int32_t l)
{
    if (l >= 0) {
        const uint8_t *t = f->b + f->table + 16 * (size_t)l;
        wr64(f->b + f->sums + 8 * (size_t)l, XXH3_64bits(f->b + rd64(t), rd64(t + 8)));
    }
    memset(f->b + 120, 0, 8);
    wr64(f->b + 120, XXH3_64bits(f->b, f->H));
}

/* f's bytes written to path and opened: the status, err filled */
static cb_status try_open(const v4 *f, size_t n, const char *path, cb_kvfile **kf, cb_error *err)
{
    *kf = NULL;
    write_file(path, f->b, n);
    return cb_kvfile_open(kf, path, err);
}

/* Version 4: its table and layers checked beyond their checksums (a file
 * whose checksums were redone over a wrong table or a cut layer is still
 * refused, naming the file), its parts are its layers; fuzzed tables and
 * layers, resealed, never crash the reader. */
static void test_coded_file(void)
{
    char path[1024], bad_path[1024];
    cb_error err;
    cb_kvfile *kf;
    v4 f = {0};
    snprintf(path, sizeof path, "%s/chunk-coded.cbkv", tmpdir());
    snprintf(bad_path, sizeof bad_path, "%s/bad-coded.cbkv", tmpdir());
    uint8_t *orig = (uint8_t *)t_read_file(path, &f.n);
    tcase("kv coded: version 4's parts are its header and its layers' spans");
    if (!orig || f.n < 8192 || orig[8] != 4) {
        CHECK(0);
        free(orig);
        return;
    }
    uint32_t nt, nlead;
    memcpy(&f.H, orig + 12, 4), memcpy(&f.L, orig + 48, 4), memcpy(&nt, orig + 76, 4),
        memcpy(&nlead, orig + 84, 4);
    f.sums = 128 + 4 * (size_t)(nt + nlead);
    f.table = f.sums + 16 * (size_t)f.L;
    f.b = malloc(f.n);
    uint64_t total = 0;
    for (size_t i = 0; i <= f.L; i++)
        total += cb_kv_part_bytes(orig, f.n, i);
    CHECK(total == f.n && cb_kv_part_bytes(orig, f.n, 0) == f.H &&
          cb_kv_part_bytes(orig, f.n, 1) == rd64(orig + f.table + 8) &&
          cb_kv_part_bytes(orig, f.n, f.L + 1) == 0);

    tcase("kv coded: a wrong layer table or a cut coded layer is refused, naming the file");
    static const struct {
        int l, field;
        int64_t add;
    } bad_tables[] = {{1, 0, 4096}, {0, 1, -4096}, {0, 1, 1}, {-1, 1, 4096}, {0, 0, -1}};
    for (size_t i = 0; i < sizeof bad_tables / sizeof *bad_tables; i++) {
        memcpy(f.b, orig, f.n);
        int32_t l = bad_tables[i].l < 0 ? (int32_t)f.L - 1 : bad_tables[i].l;
        uint8_t *e = f.b + f.table + 16 * (size_t)l + 8 * (size_t)bad_tables[i].field;
        wr64(e, rd64(e) + (uint64_t)bad_tables[i].add);
        reseal(&f, -1);
        cb_status st = try_open(&f, f.n, bad_path, &kf, &err);
        CHECKF(st == CB_ERR_FORMAT && strstr(err.msg, bad_path) && strstr(err.msg, "table"),
               "table case %zu: status %d: %s", i, st, st ? err.msg : "opened");
        cb_kvfile_free(kf);
    }
    for (int field = 12; field <= 16; field += 4) { /* a frame cut: its length less 9 */
        memcpy(f.b, orig, f.n);
        uint8_t *layer = f.b + rd64(f.b + f.table + 16), *z = layer + field;
        uint32_t zl;
        memcpy(&zl, z, 4);
        zl -= 9;
        memcpy(z, &zl, 4);
        reseal(&f, 1);
        CHECK_OK(try_open(&f, f.n, bad_path, &kf, &err));
        const cb_kv_meta *mt = kf ? cb_kvfile_meta(kf) : NULL;
        size_t per = mt ? (size_t)mt->n_tokens * (size_t)(mt->n_head_kv * mt->head_dim) : 1;
        float *k = malloc(4 * per), *v = malloc(4 * per);
        if (kf) {
            CHECK_OK(cb_kvfile_read_layer(kf, 0, k, v, &err));
            cb_status st = cb_kvfile_read_layer(kf, 1, k, v, &err);
            CHECKF(st == CB_ERR_FORMAT && strstr(err.msg, bad_path) && strstr(err.msg, "layer 1"),
                   "cut frame: status %d: %s", st, st ? err.msg : "read");
        }
        cb_kvfile_free(kf);
        free(k), free(v);
    }

    tcase("kv coded: fuzzed tables, layers and lengths, resealed: refused or read, no crash");
    int opened = 0, read_ok = 0, read_bad = 0;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 300; i++) {
        memcpy(f.b, orig, f.n);
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        int32_t l = (int32_t)(seed % f.L);
        size_t n = f.n;
        if (i % 3 == 0) { /* the header's fields and table */
            size_t at = (seed >> 8) % 2 ? 8 + (seed >> 16) % 112
                                        : f.table + (seed >> 16) % (16 * (size_t)f.L);
            f.b[at] ^= (uint8_t)(1 + (seed >> 40) % 255);
            reseal(&f, -1);
        } else if (i % 3 == 1) { /* a layer's bytes */
            const uint8_t *t = f.b + f.table + 16 * (size_t)l;
            uint64_t span = rd64(t + 8), off = rd64(t);
            for (int j = 0; j < 1 + (int)(seed >> 60); j++)
                f.b[off + (seed >> (8 + j)) % (seed & 1 || span < 256 ? span : 256)] ^=
                    (uint8_t)(1 + j); /* anywhere, or among its fields */
            reseal(&f, l);
        } else /* cut anywhere */
            n = (size_t)((seed >> 8) % f.n);
        if (try_open(&f, n, bad_path, &kf, &err) != CB_OK) {
            CHECKF(strstr(err.msg, bad_path) != NULL, "%s", err.msg);
            continue;
        }
        opened++;
        const cb_kv_meta *mt = cb_kvfile_meta(kf);
        size_t per = (size_t)mt->n_tokens * (size_t)(mt->n_head_kv * mt->head_dim);
        float *k = malloc(4 * per), *v = malloc(4 * per);
        for (int32_t j = 0; j < mt->n_layer; j++) {
            if (cb_kvfile_read_layer(kf, j, k, v, &err) == CB_OK)
                read_ok++;
            else
                read_bad++;
        }
        free(k), free(v);
        cb_kvfile_free(kf);
    }
    printf("# 300 fuzzed files: %d opened; their layers %d read, %d refused\n", opened, read_ok,
           read_bad);
    CHECK(opened > 0 && opened < 300);
    unlink(bad_path);
    free(f.b);
    free(orig);
}

/* fuzz_kvfile's invariant on a crafted header: one claiming q8_0 for a row of 16 elements
 * (not a multiple of q8_0's 32-element block) has row bytes 0, so B = 0 and
 * S = 0 passed the size checks; the file opened and read_layer returned
 * without writing k and v.  Open must refuse it. */
static void test_fuzz_findings(void)
{
    char path[1024], bad[1024];
    size_t n;
    cb_error err;
    cb_kvfile *kf = NULL;
    snprintf(path, sizeof path, "%s/chunk-f16.cbkv", tmpdir());
    snprintf(bad, sizeof bad, "%s/q8-rows.cbkv", tmpdir());
    uint8_t *f = (uint8_t *)t_read_file(path, &n);
    tcase("kv: a row that is not whole q8_0 blocks is refused at open (fuzz finding)");
    if (!f || n < 4096) {
        CHECK(0);
        free(f);
        return;
    }
    uint32_t H, one = 1, q8 = CB_TYPE_Q8_0;
    uint64_t zero = 0, size, sum;
    memcpy(&H, f + 12, 4);
    size = H;
    memcpy(f + 52, &one, 4);   /* n_head_kv 1: rows of head_dim (16) elements */
    memcpy(f + 72, &q8, 4);    /* q8_0 */
    memcpy(f + 96, &zero, 8);  /* S */
    memcpy(f + 104, &zero, 8); /* B: 0 rows of 0 bytes "match" */
    memcpy(f + 112, &size, 8); /* total: the header alone */
    memcpy(f + 120, &zero, 8);
    sum = XXH3_64bits(f, H);
    memcpy(f + 120, &sum, 8);
    write_file(bad, f, H);
    CHECK(cb_kvfile_open(&kf, bad, &err) == CB_ERR_FORMAT && kf == NULL);
    CHECKF(strstr(err.msg, "q8-rows.cbkv") != NULL, "%s", err.msg);
    cb_kvfile_free(kf);
    unlink(bad);
    free(f);
}

static void test_fingerprint(cb_model *m, cb_model *other)
{
    tcase("fingerprint: stable per file, differs between models");
    cb_model *again = load("f32");
    CHECK(again && cb_hash128_eq(cb_model_fingerprint(m), cb_model_fingerprint(again)));
    CHECK(other && !cb_hash128_eq(cb_model_fingerprint(m), cb_model_fingerprint(other)));
    char hex[33];
    cb_hash128 back;
    cb_hash128_hex(cb_model_fingerprint(m), hex);
    CHECK(strlen(hex) == 32 && cb_hash128_parse(hex, &back) == CB_OK &&
          cb_hash128_eq(back, cb_model_fingerprint(m)));
    CHECK(cb_hash128_parse("zz", &back) == CB_ERR_FORMAT);
    char key[66];
    cb_kv_key(cb_model_fingerprint(m), back, key);
    CHECK(strlen(key) == 65 && key[32] == '-');
    cb_model_free(again);
}

/* The fingerprint remembered across loads: recorded on the first, used
 * while the file is unchanged (a record made to say otherwise is believed,
 * which shows it is read), not used once the file is touched (its status
 * change time moves), and an unwritable directory only costs the hashing. */
static void test_fingerprint_cache(cb_model *m)
{
    char src[1024], path[1024], dir[1024], cmd[3200];
    const char *tmp = getenv("CB_TEST_TMP");
    tcase(
        "fingerprint cache: recorded, used while the file is unchanged, not after, never an error");
    snprintf(src, sizeof src, "%s/tiny-f32.gguf", tmp ? tmp : "tests/tmp");
    snprintf(path, sizeof path, "%s/fpc-%d.gguf", tmpdir(), (int)getpid());
    snprintf(dir, sizeof dir, "%s/fpc-%d.d", tmpdir(), (int)getpid());
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, path);
    CHECK(system(cmd) == 0);
    cb_gguf *g = NULL;
    cb_error err;
    cb_hash128 a, b, c, fake = {1, 2};
    CHECK_OK(cb_gguf_open(&g, path, &err));
    if (!g)
        return;
    CHECK_OK(cb_gguf_fingerprint_cached(g, path, dir, &a));
    CHECK(cb_hash128_eq(a, cb_model_fingerprint(m)));
    /* the record: one line, the identity then the hex; rewrite its hex */
    snprintf(cmd, sizeof cmd,
             "f=$(ls '%s'/fp-*) && [ $(wc -l < \"$f\") = 1 ] && "
             "sed -i 's/ [0-9a-f]\\{32\\}$/ 00000000000000020000000000000001/' \"$f\"",
             dir);
    CHECK(system(cmd) == 0);
    CHECK_OK(cb_gguf_fingerprint_cached(g, path, dir, &b));
    char hx[33];
    cb_hash128_hex(b, hx);
    CHECKF(cb_hash128_eq(b, fake) || strcmp(hx, "00000000000000020000000000000001") == 0,
           "record not used: %s", hx);
    cb_gguf_free(g);
    /* touched: the same bytes, a new status change time: hashed again */
    snprintf(cmd, sizeof cmd, "sleep 0.01; touch '%s'", path);
    CHECK(system(cmd) == 0);
    CHECK_OK(cb_gguf_open(&g, path, &err));
    CHECK_OK(cb_gguf_fingerprint_cached(g, path, dir, &c));
    CHECK(cb_hash128_eq(c, a));
    CHECK_OK(cb_gguf_fingerprint_cached(g, path, "/proc/no-such-dir", &c));
    CHECK(cb_hash128_eq(c, a));
    cb_gguf_free(g);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", path, dir);
    CHECK(system(cmd) == 0);
}

/* buf written to DIR/name and opened (NULL on failure, said). */
static cb_kvfile *open_buf(const char *name, const void *buf, size_t size)
{
    char path[1024];
    cb_kvfile *f = NULL;
    cb_error err;
    snprintf(path, sizeof path, "%s/%s", tmpdir(), name);
    if (write_file(path, buf, size) != 0 || cb_kvfile_open(&f, path, &err) != CB_OK)
        printf("# %s: cannot write or open it\n", path);
    return f;
}

/* cb_kvfile_recode: another type through the writer, the header (positions,
 * lead-in, per-layer attention) kept; f16 -> f32 -> f16 restores the file. */
static void test_recode(cb_model *m)
{
    const cb_hparams *hp = cb_model_hparams(m);
    int64_t w = (int64_t)hp->n_head_kv * hp->head_dim;
    cb_tokens lead = {0};
    int32_t ids[NC];
    cb_error err;
    cb_type t;

    tcase("kv %s: recode f16 -> f32 -> f16 restores the file; q8_0 within its rounding", hp->arch);
    CHECK_OK(cb_kv_lead_in(m, &lead));
    for (int i = 0; i < NC; i++)
        ids[i] = (int32_t)((i * 29 + 3) % hp->n_vocab);
    cb_kvcache *kv = NULL;
    cb_fwd *f = NULL;
    void *b16 = NULL, *b32 = NULL, *b16b = NULL, *b8 = NULL;
    size_t s16 = 0, s32 = 0, s16b = 0, s8 = 0;
    CHECK_OK(cb_kvcache_new(&kv, m, 64, CB_TYPE_F32));
    CHECK_OK(cb_fwd_new(&f, m, 64));
    CHECK_OK(cb_kv_precompute(f, kv, lead.ids, (int32_t)lead.n, ids, NC, CB_TYPE_F16, &b16, &s16));
    cb_kvfile *k16 = b16 ? open_buf("recode-f16.kv", b16, s16) : NULL;
    if (!k16)
        goto done;
    CHECK_OK(cb_kvfile_recode(k16, CB_TYPE_F32, &b32, &s32, &err));
    cb_kvfile *k32 = b32 ? open_buf("recode-f32.kv", b32, s32) : NULL;
    if (!k32) {
        cb_kvfile_free(k16);
        goto done;
    }
    const cb_kv_meta *a = cb_kvfile_meta(k16), *b = cb_kvfile_meta(k32);
    CHECK(b->type == CB_TYPE_F32 && s32 >= s16);
    CHECK(cb_hash128_eq(a->model, b->model) && cb_hash128_eq(a->tokens, b->tokens));
    CHECK(a->n_tokens == b->n_tokens && a->n_lead == b->n_lead && a->pos0 == b->pos0 &&
          a->flags == b->flags && a->rope_base == b->rope_base);
    CHECK(memcmp(a->lead, b->lead, sizeof(int32_t) * (size_t)a->n_lead) == 0);
    for (int l = 0; l < hp->n_layer; l++)
        CHECK(a->window[l] == b->window[l] && a->layer_rope_base[l] == b->layer_rope_base[l]);
    CHECK_OK(cb_kvfile_check_model(k32, m, &err));
    CHECK_OK(cb_kvfile_verify(k32, &err));
    CHECK_OK(cb_kvfile_recode(k32, CB_TYPE_F16, &b16b, &s16b, &err));
    CHECK(b16b && s16b == s16 && memcmp(b16b, b16, s16) == 0);
    CHECK_OK(cb_kvfile_recode(k16, CB_TYPE_Q8_0, &b8, &s8, &err));
    cb_kvfile *k8 = b8 ? open_buf("recode-q8_0.kv", b8, s8) : NULL;
    if (k8) {
        float *x = malloc(sizeof(float) * NC * w), *y = malloc(sizeof(float) * NC * w),
              *xv = malloc(sizeof(float) * NC * w), *yv = malloc(sizeof(float) * NC * w);
        double worst = 0, sc;
        for (int l = 0; l < hp->n_layer; l++) {
            CHECK_OK(cb_kvfile_read_layer(k16, l, x, xv, &err));
            CHECK_OK(cb_kvfile_read_layer(k8, l, y, yv, &err));
            double e = max_abs(x, y, (size_t)(NC * w), &sc) / sc;
            worst = e > worst ? e : worst;
            e = max_abs(xv, yv, (size_t)(NC * w), &sc) / sc;
            worst = e > worst ? e : worst;
        }
        CHECK(cb_kvfile_meta(k8)->type == CB_TYPE_Q8_0 && worst < 1.6e-2);
        free(x), free(y), free(xv), free(yv);
    }
    CHECK(cb_kvfile_recode(k16, CB_TYPE_Q4_0, &b8, &s8, &err) == CB_ERR_UNSUPPORTED);
    cb_kvfile_free(k8);
    if (w % 32 == 0) { /* kivi4's groups of 32 elements: recode reaches it unchanged */
        void *b4 = NULL;
        size_t s4 = 0;
        CHECK_OK(cb_kvfile_recode(k16, CB_TYPE_KIVI4, &b4, &s4, &err));
        cb_kvfile *k4 = b4 ? open_buf("recode-kivi4.kv", b4, s4) : NULL;
        CHECK(k4 && cb_kvfile_meta(k4)->type == CB_TYPE_KIVI4 &&
              s4 <= s16); /* pages: tiny models */
        if (k4)
            CHECK_OK(cb_kvfile_verify(k4, &err));
        cb_kvfile_free(k4);
        free(b4);
    }
    { /* coded and back: a coded file of the same key, f16 again readable */
        void *bc = NULL, *bb = NULL;
        size_t sc = 0, sb = 0;
        CHECK_OK(cb_kvfile_recode(k16, CB_TYPE_CODED, &bc, &sc, &err));
        cb_kvfile *kc = bc ? open_buf("recode-coded.kv", bc, sc) : NULL;
        CHECK(kc && cb_kvfile_meta(kc)->type == CB_TYPE_CODED &&
              cb_hash128_eq(cb_kvfile_meta(kc)->tokens, cb_kvfile_meta(k16)->tokens));
        if (kc) {
            CHECK_OK(cb_kvfile_verify(kc, &err));
            CHECK_OK(cb_kvfile_recode(kc, CB_TYPE_F16, &bb, &sb, &err));
        }
        cb_kvfile *kb = bb ? open_buf("recode-coded-f16.kv", bb, sb) : NULL;
        CHECK(kb && sb == s16 && cb_kvfile_meta(kb)->type == CB_TYPE_F16);
        if (kb)
            CHECK_OK(cb_kvfile_verify(kb, &err));
        cb_kvfile_free(kb);
        cb_kvfile_free(kc);
        free(bc), free(bb);
    }
    cb_kvfile_free(k32);
    cb_kvfile_free(k16);
done:
    tcase("kv: cb_kv_type_parse names the types a KV file holds");
    CHECK(cb_kv_type_parse("q8_0", &t) == CB_OK && t == CB_TYPE_Q8_0);
    CHECK(cb_kv_type_parse("bf16", &t) == CB_OK && t == CB_TYPE_BF16);
    CHECK(cb_kv_type_parse("kivi4", &t) == CB_OK && t == CB_TYPE_KIVI4);
    CHECK(cb_kv_type_parse("coded", &t) == CB_OK && t == CB_TYPE_CODED);
    CHECK(cb_kv_type_parse("q4_0", &t) == CB_ERR_UNSUPPORTED);
    CHECK(cb_kv_type_parse(NULL, &t) == CB_ERR_UNSUPPORTED);
    free(b16), free(b32), free(b16b), free(b8);
    cb_fwd_free(f);
    cb_kvcache_free(kv);
    cb_tokens_free(&lead);
}

int main(void)
{
    TEST_BEGIN();
    cb_model *m = load("f32"), *other = load("q8_0");
    if (!m) {
        tcase("load fixture");
        CHECK(0);
        TEST_END();
    }
    /* gemma3 first (sliding-window layers, their own RoPE base): the llama
     * files written after it are the ones the corruption tests read */
    cb_model *g = load("gemma3");
    if (g) {
        test_roundtrip_and_move(g);
        test_recode(g);
    }
    cb_model_free(g);
    test_roundtrip_and_move(m);
    test_recode(m);
    test_corruption(m, other, "f16");
    test_corruption(m, other, "kivi4");
    test_source("f16");
    test_source("kivi4");
    test_corruption(m, other, "coded");
    test_source("coded");
    test_coded_file();
    test_version1(m);
    test_fuzz_findings();
    test_fingerprint(m, other);
    test_fingerprint_cache(m);
    cb_model_free(m);
    cb_model_free(other);
    TEST_END();
}
