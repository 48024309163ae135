/* test_gguf.c - the GGUF reader and writer: a round trip through every
 * metadata type, malformed files built by hand, and a fuzz-style sweep that
 * truncates and corrupts real files (run it under SAN=1 to catch any read
 * outside the buffer: every case works on an exact-size heap copy). */
#include "../../lib/infer/infer.h"
#include "test.h"

#include <stdint.h>

/* --------------------------------------------- hand-built byte streams */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}
static void pad(buf *b, size_t a)
{
    while (b->n % a)
        put(b, "", 1);
}

/* Open bytes from an exact-size heap copy; returns the status. */
static cb_status open_copy(const void *data, size_t n, cb_error *err)
{
    void *copy = malloc(n ? n : 1);
    cb_gguf *g = NULL;
    cb_status st;
    memcpy(copy, data, n);
    err->status = CB_OK;
    err->msg[0] = 0;
    st = cb_gguf_open_memory(&g, copy, n, "case.gguf", err);
    cb_gguf_free(g);
    free(copy);
    return st;
}

static void expect_error(const char *name, buf *b, cb_status want, const char *needle)
{
    cb_error err;
    cb_status st;
    tcase("rejects %s", name);
    st = open_copy(b->p, b->n, &err);
    CHECKF(st == want, "status %d (%s), want %d: %s", st, cb_strerror(st), want, err.msg);
    CHECKF(strstr(err.msg, "case.gguf") != NULL, "message does not name the file: %s", err.msg);
    if (needle)
        CHECKF(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void test_malformed(void)
{
    buf b = {0};

    put(&b, "GGML", 4);
    put_u32(&b, 3);
    expect_error("bad magic", &b, CB_ERR_FORMAT, "magic");

    header(&b, 1, 0, 0);
    expect_error("version 1", &b, CB_ERR_UNSUPPORTED, "version 1");

    header(&b, 0x03000000, 0, 0);
    expect_error("big-endian", &b, CB_ERR_UNSUPPORTED, "big-endian");

    header(&b, 3, 0, 1);
    put_str(&b, "a.key");
    put_u32(&b, 13);
    expect_error("unknown metadata type", &b, CB_ERR_FORMAT, "unknown type 13");

    header(&b, 3, 0, 1);
    put_str(&b, "a.key");
    put_u32(&b, CB_GGUF_ARRAY);
    put_u32(&b, CB_GGUF_ARRAY);
    put_u64(&b, 1);
    expect_error("nested array", &b, CB_ERR_FORMAT, "nested");

    header(&b, 3, 0, 2);
    put_str(&b, "a.key");
    put_u32(&b, CB_GGUF_UINT32);
    put_u32(&b, 1);
    put_str(&b, "a.key");
    put_u32(&b, CB_GGUF_UINT32);
    put_u32(&b, 2);
    expect_error("duplicate key", &b, CB_ERR_FORMAT, "duplicate");

    header(&b, 3, 0, 1);
    put_str(&b, "general.alignment");
    put_u32(&b, CB_GGUF_UINT32);
    put_u32(&b, 48);
    expect_error("alignment not a power of two", &b, CB_ERR_FORMAT, "power of two");

    header(&b, 3, 0, 1);
    put_str(&b, "s");
    put_u32(&b, CB_GGUF_STRING);
    put_u64(&b, 1000);
    put(&b, "abc", 3);
    expect_error("string longer than the file", &b, CB_ERR_FORMAT, "truncated");

    header(&b, 3, 0, 1);
    put_str(&b, "arr");
    put_u32(&b, CB_GGUF_ARRAY);
    put_u32(&b, CB_GGUF_STRING);
    put_u64(&b, UINT64_MAX / 2);
    expect_error("huge string array", &b, CB_ERR_FORMAT, "strings");

    header(&b, 3, 0, 1);
    put_str(&b, "arr");
    put_u32(&b, CB_GGUF_ARRAY);
    put_u32(&b, CB_GGUF_UINT64);
    put_u64(&b, UINT64_MAX / 4);
    expect_error("huge numeric array", &b, CB_ERR_FORMAT, "truncated");

    header(&b, 3, UINT64_MAX, 0);
    expect_error("huge tensor count", &b, CB_ERR_FORMAT, "cannot fit");

    header(&b, 3, 1, 0);
    put_str(&b, "t");
    put_u32(&b, 5);
    expect_error("five dimensions", &b, CB_ERR_FORMAT, "dimensions");

    header(&b, 3, 1, 0);
    put_str(&b, "t");
    put_u32(&b, 1);
    put_u64(&b, 32);
    put_u32(&b, 4); /* a removed ggml type */
    put_u64(&b, 0);
    expect_error("unknown tensor type", &b, CB_ERR_FORMAT, "unknown tensor type");

    header(&b, 3, 1, 0);
    put_str(&b, "t");
    put_u32(&b, 1);
    put_u64(&b, 20);
    put_u32(&b, CB_TYPE_Q8_0);
    put_u64(&b, 0);
    expect_error("row not a block multiple", &b, CB_ERR_FORMAT, "multiple");

    header(&b, 3, 1, 0);
    put_str(&b, "t");
    put_u32(&b, 2);
    put_u64(&b, 1ull << 40);
    put_u64(&b, 1ull << 40);
    put_u32(&b, CB_TYPE_F32);
    put_u64(&b, 0);
    expect_error("tensor larger than the file", &b, CB_ERR_FORMAT, "larger");

    header(&b, 3, 1, 0);
    put_str(&b, "t");
    put_u32(&b, 1);
    put_u64(&b, 8);
    put_u32(&b, CB_TYPE_F32);
    put_u64(&b, 4);
    pad(&b, 32);
    put(&b, "0123456789abcdef0123456789abcdef0123456789abcdef", 48);
    expect_error("unaligned tensor offset", &b, CB_ERR_FORMAT, "aligned");

    header(&b, 3, 1, 0);
    put_str(&b, "t");
    put_u32(&b, 1);
    put_u64(&b, 8);
    put_u32(&b, CB_TYPE_F32);
    put_u64(&b, 0);
    pad(&b, 32);
    put(&b, "0123456789abcdef", 16);
    expect_error("tensor past the end", &b, CB_ERR_FORMAT, "past the end");

    header(&b, 3, 2, 0);
    for (int i = 0; i < 2; i++) {
        put_str(&b, "same");
        put_u32(&b, 1);
        put_u64(&b, 8);
        put_u32(&b, CB_TYPE_F32);
        put_u64(&b, 0);
    }
    pad(&b, 32);
    put(&b, "0123456789abcdef0123456789abcdef", 32);
    expect_error("duplicate tensor", &b, CB_ERR_FORMAT, "duplicate tensor");

    header(&b, 3, 1, 0);
    put_str(&b, "a_tensor_name_that_is_much_longer_than_sixty_four_bytes_in_total_x");
    expect_error("tensor name too long", &b, CB_ERR_FORMAT, "name longer");

    {
        cb_gguf *g = NULL;
        cb_error err;
        tcase("missing file is CB_ERR_NOT_FOUND naming it");
        CHECK(cb_gguf_open(&g, "/nonexistent/x.gguf", &err) == CB_ERR_NOT_FOUND);
        CHECK(g == NULL);
        CHECK(strstr(err.msg, "/nonexistent/x.gguf") != NULL);
    }
}

/* Found by fuzzing (each case failed under ASan/UBSan or an invariant of
 * fuzz_gguf before its fix). */
static void test_fuzz_findings(void)
{
    cb_gguf *g = NULL;
    cb_error err;
    char path[1024];
    const char *tmp = getenv("CB_TEST_TMP");

    /* An empty file maps to NULL: the reader did pointer arithmetic on it
     * before looking at the size (UBSan: zero offset to null pointer). */
    tcase("empty file and empty buffer are CB_ERR_FORMAT (fuzz finding)");
    snprintf(path, sizeof path, "%s/empty.gguf", tmp && *tmp ? tmp : "/tmp");
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f)
        fclose(f);
    CHECK(cb_gguf_open(&g, path, &err) == CB_ERR_FORMAT && g == NULL);
    CHECK(cb_gguf_open_memory(&g, NULL, 0, "empty", &err) == CB_ERR_FORMAT && g == NULL);
    remove(path);

    /* A tensor of 2^62 f32 elements: its row bytes (2^64) wrap to 0, and
     * the reader took it with nbytes 0 (fuzz_gguf's invariant: nbytes is
     * row bytes times rows). */
    {
        buf b = {0};
        header(&b, 3, 1, 0);
        put_str(&b, "big");
        put_u32(&b, 1);
        put_u64(&b, 1ull << 62);
        put_u32(&b, CB_TYPE_F32);
        put_u64(&b, 0);
        pad(&b, 32);
        put(&b, "0123456789abcdef0123456789abcdef", 32);
        expect_error("tensor whose size wraps (fuzz finding)", &b, CB_ERR_FORMAT,
                     "larger than the file");
    }
}

/* ------------------------------------------------- writer round trip */

static void test_roundtrip(void)
{
    cb_gguf_writer *w = cb_gguf_writer_new(64);
    uint8_t u8s[3] = {1, 2, 255};
    int8_t i8s[2] = {-128, 127};
    uint16_t u16s[2] = {0, 65535};
    int16_t i16s[2] = {-32768, 5};
    uint32_t u32s[2] = {7, 4000000000u};
    int32_t i32s[3] = {-1, 0, 1};
    float f32s[2] = {1.5f, -0.25f};
    uint8_t bools[2] = {1, 0};
    uint64_t u64s[1] = {UINT64_MAX};
    int64_t i64s[1] = {INT64_MIN};
    double f64s[1] = {3.25};
    const char *strs[3] = {"alpha", "", "gamma \xe2\x96\x81"};
    float tdata[2 * 32];
    void *bytes = NULL;
    size_t size = 0;
    cb_gguf *g = NULL;
    cb_error err;

    tcase("writer: every metadata type round-trips");
    for (int i = 0; i < 64; i++)
        tdata[i] = (float)i * 0.5f - 3.0f;
    CHECK_OK(cb_gguf_writer_set_u32(w, "k.u32", 123));
    CHECK_OK(cb_gguf_writer_set_i32(w, "k.i32", -5));
    CHECK_OK(cb_gguf_writer_set_u64(w, "k.u64", 1ull << 40));
    CHECK_OK(cb_gguf_writer_set_f32(w, "k.f32", 0.125f));
    CHECK_OK(cb_gguf_writer_set_bool(w, "k.bool", 1));
    CHECK_OK(cb_gguf_writer_set_str(w, "k.str", "hello"));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.u8", CB_GGUF_UINT8, u8s, 3));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.i8", CB_GGUF_INT8, i8s, 2));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.u16", CB_GGUF_UINT16, u16s, 2));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.i16", CB_GGUF_INT16, i16s, 2));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.u32", CB_GGUF_UINT32, u32s, 2));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.i32", CB_GGUF_INT32, i32s, 3));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.f32", CB_GGUF_FLOAT32, f32s, 2));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.bool", CB_GGUF_BOOL, bools, 2));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.u64", CB_GGUF_UINT64, u64s, 1));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.i64", CB_GGUF_INT64, i64s, 1));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.f64", CB_GGUF_FLOAT64, f64s, 1));
    CHECK_OK(cb_gguf_writer_set_arr(w, "a.empty", CB_GGUF_INT32, NULL, 0));
    CHECK_OK(cb_gguf_writer_set_arr_str(w, "a.str", strs, 3));
    CHECK_OK(cb_gguf_writer_set_u32(w, "k.u32", 124)); /* replaces, keeps position */
    CHECK(cb_gguf_writer_set_arr(w, "a.bad", CB_GGUF_STRING, strs, 1) == CB_ERR_INVALID);
    {
        int64_t ne[2] = {32, 2};
        int64_t ne1[1] = {32};
        CHECK_OK(cb_gguf_writer_add_tensor(w, "t.f32", CB_TYPE_F32, 2, ne, tdata));
        CHECK_OK(cb_gguf_writer_add_tensor(w, "t.one", CB_TYPE_F32, 1, ne1, tdata));
        int64_t bad[1] = {33};
        CHECK(cb_gguf_writer_add_tensor(w, "t.bad", CB_TYPE_Q8_0, 1, bad, tdata) == CB_ERR_INVALID);
    }
    CHECK_OK(cb_gguf_writer_bytes(w, &bytes, &size));
    cb_gguf_writer_free(w);
    CHECK_OK(cb_gguf_open_memory(&g, bytes, size, "rt.gguf", &err));
    if (!g) {
        printf("# %s\n", err.msg);
        free(bytes);
        return;
    }
    int64_t iv;
    uint64_t uv;
    double fv;
    int bv;
    cb_strview sv;
    CHECK(cb_gguf_version(g) == 3);
    CHECK(cb_gguf_alignment(g) == 64);
    CHECK(cb_gguf_n_kv(g) == 20); /* 19 set + general.alignment added */
    CHECK(cb_gguf_find_key(g, "k.u32") == 0);
    CHECK(cb_gguf_find_key(g, "nope") == -1);
    CHECK(cb_gguf_int_or(g, "k.u32", 0) == 124);
    CHECK(cb_gguf_int_or(g, "k.i32", 0) == -5);
    CHECK(cb_gguf_int_or(g, "k.u64", 0) == (1ll << 40));
    CHECK(cb_gguf_int_or(g, "k.str", 77) == 77);
    CHECK(cb_gguf_float_or(g, "k.f32", 0) == 0.125);
    CHECK(cb_gguf_float_or(g, "k.u32", 0) == 124.0);
    CHECK(cb_gguf_bool_or(g, "k.bool", 0) == 1);
    CHECK(cb_gguf_bool_or(g, "k.u32", 5) == 5);
    CHECK(cb_strview_eq(cb_gguf_str(g, "k.str"), "hello"));
    CHECK(cb_gguf_str(g, "k.u32").data == NULL);
    CHECK(cb_gguf_get_uint(g, cb_gguf_find_key(g, "k.i32"), &uv) == CB_ERR_INVALID);
    CHECK(cb_gguf_get_bool(g, cb_gguf_find_key(g, "k.str"), &bv) == CB_ERR_INVALID);
    CHECK(cb_gguf_get_str(g, cb_gguf_find_key(g, "k.u32"), &sv) == CB_ERR_INVALID);
    CHECK(cb_gguf_get_int(g, 999, &iv) == CB_ERR_INVALID);

    int64_t a = cb_gguf_find_key(g, "a.u8");
    CHECK(cb_gguf_kv_type(g, a) == CB_GGUF_ARRAY && cb_gguf_arr_type(g, a) == CB_GGUF_UINT8);
    CHECK(cb_gguf_arr_len(g, a) == 3);
    CHECK(cb_gguf_arr_get_int(g, a, 2, &iv) == CB_OK && iv == 255);
    CHECK(cb_gguf_arr_get_int(g, a, 3, &iv) == CB_ERR_RANGE);
    a = cb_gguf_find_key(g, "a.i8");
    CHECK(cb_gguf_arr_get_int(g, a, 0, &iv) == CB_OK && iv == -128);
    a = cb_gguf_find_key(g, "a.u16");
    CHECK(cb_gguf_arr_get_int(g, a, 1, &iv) == CB_OK && iv == 65535);
    a = cb_gguf_find_key(g, "a.i16");
    CHECK(cb_gguf_arr_get_int(g, a, 0, &iv) == CB_OK && iv == -32768);
    a = cb_gguf_find_key(g, "a.u32");
    CHECK(cb_gguf_arr_get_int(g, a, 1, &iv) == CB_OK && iv == 4000000000ll);
    a = cb_gguf_find_key(g, "a.i32");
    CHECK(cb_gguf_arr_get_int(g, a, 0, &iv) == CB_OK && iv == -1);
    CHECK(cb_gguf_arr_data(g, a) != NULL);
    a = cb_gguf_find_key(g, "a.f32");
    CHECK(cb_gguf_arr_get_float(g, a, 1, &fv) == CB_OK && fv == -0.25);
    a = cb_gguf_find_key(g, "a.bool");
    CHECK(cb_gguf_arr_get_int(g, a, 0, &iv) == CB_OK && iv == 1);
    a = cb_gguf_find_key(g, "a.u64");
    CHECK(cb_gguf_arr_get_int(g, a, 0, &iv) == CB_ERR_INVALID); /* does not fit int64 */
    a = cb_gguf_find_key(g, "a.i64");
    CHECK(cb_gguf_arr_get_int(g, a, 0, &iv) == CB_OK && iv == INT64_MIN);
    a = cb_gguf_find_key(g, "a.f64");
    CHECK(cb_gguf_arr_get_float(g, a, 0, &fv) == CB_OK && fv == 3.25);
    a = cb_gguf_find_key(g, "a.empty");
    CHECK(cb_gguf_arr_len(g, a) == 0);
    a = cb_gguf_find_key(g, "a.str");
    CHECK(cb_gguf_arr_type(g, a) == CB_GGUF_STRING && cb_gguf_arr_len(g, a) == 3);
    CHECK(cb_gguf_arr_data(g, a) == NULL);
    CHECK(cb_gguf_arr_get_str(g, a, 0, &sv) == CB_OK && cb_strview_eq(sv, "alpha"));
    CHECK(cb_gguf_arr_get_str(g, a, 1, &sv) == CB_OK && sv.len == 0);
    CHECK(cb_gguf_arr_get_str(g, a, 2, &sv) == CB_OK && cb_strview_eq(sv, strs[2]));
    CHECK(cb_gguf_arr_get_str(g, a, 3, &sv) == CB_ERR_RANGE);

    tcase("writer: tensors round-trip, aligned");
    cb_tensor_info ti;
    CHECK(cb_gguf_n_tensors(g) == 2);
    CHECK(cb_gguf_find_tensor(g, "t.one") == 1);
    CHECK(cb_gguf_find_tensor(g, "t.none") == -1);
    CHECK_OK(cb_gguf_tensor(g, 0, &ti));
    CHECK(cb_strview_eq(ti.name, "t.f32") && ti.n_dims == 2 && ti.ne[0] == 32 && ti.ne[1] == 2 &&
          ti.ne[2] == 1);
    CHECK(ti.type == CB_TYPE_F32 && ti.nbytes == 256);
    CHECK(((uintptr_t)ti.data - (uintptr_t)bytes) % 64 == 0);
    CHECK(memcmp(ti.data, tdata, 256) == 0);
    CHECK_OK(cb_gguf_tensor(g, 1, &ti));
    CHECK(ti.offset % 64 == 0 && memcmp(ti.data, tdata, 128) == 0);
    CHECK(cb_gguf_tensor(g, 2, &ti) == CB_ERR_RANGE);
    cb_gguf_free(g);

    /* Every proper prefix of this file must fail cleanly. */
    tcase("writer output: every truncation is an error");
    size_t min_ok = size - 64 + 32; /* trailing padding after the last tensor may go */
    int bad = 0;
    for (size_t n = 0; n < min_ok; n++) {
        if (open_copy(bytes, n, &err) == CB_OK) {
            if (!bad)
                printf("# truncation at %zu bytes opened\n", n);
            bad++;
        } else if (err.msg[0] == 0) {
            bad++;
        }
    }
    CHECKF(bad == 0, "%d truncations were accepted or had no message", bad);
    free(bytes);
}

/* ------------------------------------------------ fuzz over real files */

static uint64_t rng = 0x1234567;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Truncate `path` at n_points places before the end of its last tensor (each
 * on an exact-size copy) and flip n_flips random bytes of the metadata and
 * tensor-info region; count crashes (there are none if we get to report),
 * accepted truncations and flips that gave errors. */
static void fuzz_file(const char *label, const char *path, int n_points, int n_flips)
{
    cb_mmap m;
    cb_error err;
    cb_gguf *g = NULL;

    tcase("fuzz %s: truncations all fail, flips never crash", label);
    if (cb_mmap_open(&m, path, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    if (cb_gguf_open_memory(&g, m.data, m.size, path, &err) != CB_OK) {
        CHECKF(0, "%s", err.msg);
        cb_mmap_close(&m);
        return;
    }
    size_t data_size, hdr_end, need = 0;
    const uint8_t *data = cb_gguf_data(g, &data_size);
    hdr_end = (size_t)(data - m.data);
    for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++) {
        cb_tensor_info ti;
        cb_gguf_tensor(g, i, &ti);
        if (ti.offset + ti.nbytes > need)
            need = ti.offset + ti.nbytes;
    }
    need += hdr_end;
    if (cb_gguf_n_tensors(g) == 0)
        need = hdr_end - (hdr_end % cb_gguf_alignment(g) ? 0 : 0);
    cb_gguf_free(g);

    /* The header's metadata is where parsing happens: truncate there densely
     * (exact-size copies, so a sanitizer sees any over-read), then at a few
     * places inside the tensor data (no copy needed: the reader only checks
     * bounds there). */
    int accepted = 0, no_msg = 0, total = 0;
    size_t meta_end = hdr_end;
    for (int k = 0; k < n_points; k++) {
        size_t n = (size_t)((double)meta_end * k / n_points);
        if (k < 64)
            n = (size_t)k; /* every byte of the fixed header */
        total++;
        if (open_copy(m.data, n, &err) == CB_OK)
            accepted++;
        else if (!err.msg[0])
            no_msg++;
    }
    for (int k = 1; k <= 16 && need > hdr_end; k++) {
        size_t n = need - 1 - (size_t)((double)(need - 1 - hdr_end) * (k - 1) / 16);
        total++;
        err.msg[0] = 0;
        if (cb_gguf_open_memory(&g, m.data, n, "trunc", &err) == CB_OK) {
            accepted++;
            cb_gguf_free(g);
            g = NULL;
        } else if (!err.msg[0]) {
            no_msg++;
        }
    }
    CHECKF(accepted == 0 && no_msg == 0, "%d of %d truncations accepted, %d without message",
           accepted, total, no_msg);
    printf("# %s: %d truncation points, all rejected with a message\n", label, total);

    /* Flips: one heap copy of the header region plus a little data; each
     * flip is applied, parsed, and undone.  Flipped files may still be valid
     * (a byte inside a token's text); they must never crash. */
    size_t span = hdr_end;
    uint8_t *copy = malloc(m.size);
    memcpy(copy, m.data, m.size);
    int errors = 0;
    for (int k = 0; k < n_flips; k++) {
        size_t at = (size_t)(next_rand() % span);
        uint8_t old = copy[at], x = (uint8_t)(1u << (next_rand() % 8));
        if (k % 3 == 0)
            x = (uint8_t)(next_rand() | 1);
        copy[at] ^= x;
        err.msg[0] = 0;
        if (cb_gguf_open_memory(&g, copy, m.size, "flip", &err) == CB_OK) {
            /* A valid-looking result must still be self-consistent. */
            for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++) {
                cb_tensor_info ti;
                cb_gguf_tensor(g, i, &ti);
                CHECK((const uint8_t *)ti.data + ti.nbytes <= copy + m.size);
            }
            cb_gguf_free(g);
            g = NULL;
        } else {
            errors++;
            if (!err.msg[0])
                no_msg++;
        }
        copy[at] = old;
    }
    CHECKF(no_msg == 0, "%d errors without message", no_msg);
    printf("# %s: %d byte flips in the first %zu bytes: %d rejected, %d still valid, no crash\n",
           label, n_flips, span, errors, n_flips - errors);
    free(copy);
    cb_mmap_close(&m);
}

static void test_real_files(void)
{
    const char *model = t_smol_model();
    const char *shared = t_shared_data();
    const char *tmp = getenv("CB_TEST_TMP");
    char path[1024];

    if (tmp) {
        snprintf(path, sizeof path, "%s/tiny-f32.gguf", tmp);
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            fuzz_file("tiny fixture", path, 400, 2000);
        } else {
            tskip("fuzz tiny fixture",
                  "tests/tmp/tiny-f32.gguf not generated (run through make test)");
        }
    } else {
        tskip("fuzz tiny fixture", "CB_TEST_TMP not set (run through make test)");
    }

    if (shared) {
        snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-llama-spm.gguf", shared);
        fuzz_file("ggml-vocab-llama-spm.gguf", path, 200, 500);
    } else {
        tskip("fuzz vocab-only GGUF", "../shared/data not found");
    }

    if (!model) {
        tskip("default model metadata", "default model not fetched (make model)");
        tskip("fuzz default model", "default model not fetched (make model)");
        return;
    }
    cb_gguf *g = NULL;
    cb_error err;
    tcase("default model: metadata and tensors as expected");
    CHECK_OK(cb_gguf_open(&g, model, &err));
    if (!g)
        return;
    CHECK(cb_gguf_version(g) == 3);
    CHECK(cb_strview_eq(cb_gguf_str(g, "general.architecture"), "llama"));
    CHECK(cb_gguf_int_or(g, "llama.block_count", 0) == 30);
    CHECK(cb_gguf_int_or(g, "llama.embedding_length", 0) == 576);
    CHECK(cb_gguf_int_or(g, "llama.attention.head_count_kv", 0) == 3);
    CHECK(cb_strview_eq(cb_gguf_str(g, "tokenizer.ggml.pre"), "smollm"));
    CHECK(cb_gguf_arr_len(g, cb_gguf_find_key(g, "tokenizer.ggml.tokens")) == 49152);
    int64_t ti_idx = cb_gguf_find_tensor(g, "blk.0.attn_q.weight");
    cb_tensor_info ti;
    CHECK(ti_idx >= 0 && cb_gguf_tensor(g, ti_idx, &ti) == CB_OK && ti.type == CB_TYPE_Q4_1 &&
          ti.ne[0] == 576 && ti.ne[1] == 576);
    int n_q41 = 0;
    for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++) {
        cb_gguf_tensor(g, i, &ti);
        n_q41 += ti.type == CB_TYPE_Q4_1;
    }
    CHECKF(cb_gguf_n_tensors(g) == 272, "%lld tensors", (long long)cb_gguf_n_tensors(g));
    printf("# default model: %lld tensors (%d q4_1), %lld metadata entries\n",
           (long long)cb_gguf_n_tensors(g), n_q41, (long long)cb_gguf_n_kv(g));
    cb_gguf_free(g);
    fuzz_file("default model", model, 300, 300);
}

int main(void)
{
    TEST_BEGIN();
    test_malformed();
    test_fuzz_findings();
    test_roundtrip();
    test_real_files();
    TEST_END();
}
