/* fuzz_gguf - the GGUF reader over arbitrary bytes (cb_gguf_open_memory),
 * then everything a model load reads from an accepted file: every metadata
 * accessor on every entry, every tensor's description, the fingerprint, the
 * chat template's detection, and the tokenizer (cb_vocab_load, then a short
 * encode and decode).
 *
 * Properties of an accepted file: each tensor's bytes lie inside the data
 * section and equal its row bytes times its rows; keys and strings lie
 * inside the file; accessors agree with the entry's type. */
#include "../../lib/infer/infer.h"
#include "fuzz.h"

static void check_tensor(const cb_gguf *g, int64_t i)
{
    cb_tensor_info ti;
    size_t dsize = 0;
    const uint8_t *data = cb_gguf_data(g, &dsize);
    FUZZ_CHECK(cb_gguf_tensor(g, i, &ti) == CB_OK);
    FUZZ_CHECK(ti.n_dims >= 1 && ti.n_dims <= CB_GGUF_MAX_DIMS);
    uint64_t rows = 1;
    for (int d = 0; d < CB_GGUF_MAX_DIMS; d++) {
        FUZZ_CHECK(ti.ne[d] >= 0);
        if (d > 0) {
            /* rows may exceed 2^64 only where some dimension is 0 */
            if (ti.ne[d] == 0)
                rows = 0;
            else if (rows > UINT64_MAX / (uint64_t)ti.ne[d])
                rows = UINT64_MAX;
            else
                rows *= (uint64_t)ti.ne[d];
        }
    }
    size_t row = cb_type_row_bytes(ti.type, ti.ne[0]);
    /* a row that does not fit in size_t must have been rejected */
    FUZZ_CHECK(ti.ne[0] == 0 || row > 0);
    if (ti.ne[0] > 0 && rows > 0)
        FUZZ_CHECK(rows <= UINT64_MAX / row && (uint64_t)ti.nbytes == (uint64_t)row * rows);
    else
        FUZZ_CHECK(ti.nbytes == 0);
    FUZZ_CHECK((const uint8_t *)ti.data >= data && ti.offset <= dsize &&
               ti.nbytes <= dsize - ti.offset);
    FUZZ_CHECK((const uint8_t *)ti.data == data + ti.offset);
    FUZZ_CHECK(ti.name.len < 64);
    FUZZ_CHECK(cb_gguf_find_tensor(g, "") >= -1);
    /* touch the first and last byte, so ASan sees any escape from the buffer */
    if (ti.nbytes) {
        volatile uint8_t a = ((const uint8_t *)ti.data)[0],
                         b = ((const uint8_t *)ti.data)[ti.nbytes - 1];
        (void)a, (void)b;
    }
}

static void check_kv(const cb_gguf *g, int64_t i, const uint8_t *base, size_t size)
{
    cb_strview k = cb_gguf_key(g, i), s;
    int64_t iv;
    uint64_t uv;
    double fv;
    int bv;
    FUZZ_CHECK((const uint8_t *)k.data >= base && k.len <= size &&
               (const uint8_t *)k.data + k.len <= base + size);
    cb_gguf_type t = cb_gguf_kv_type(g, i);
    FUZZ_CHECK(t < CB_GGUF_TYPE_COUNT_);
    cb_gguf_get_int(g, i, &iv);
    cb_gguf_get_uint(g, i, &uv);
    cb_gguf_get_float(g, i, &fv);
    FUZZ_CHECK((cb_gguf_get_bool(g, i, &bv) == CB_OK) == (t == CB_GGUF_BOOL));
    FUZZ_CHECK((cb_gguf_get_str(g, i, &s) == CB_OK) == (t == CB_GGUF_STRING));
    if (t == CB_GGUF_STRING)
        FUZZ_CHECK((const uint8_t *)s.data >= base && s.len <= size &&
                   (const uint8_t *)s.data + s.len <= base + size);
    if (t != CB_GGUF_ARRAY) {
        FUZZ_CHECK(cb_gguf_arr_len(g, i) == 0 && cb_gguf_arr_data(g, i) == NULL);
        return;
    }
    uint64_t n = cb_gguf_arr_len(g, i);
    cb_gguf_type et = cb_gguf_arr_type(g, i);
    FUZZ_CHECK(et < CB_GGUF_TYPE_COUNT_ && et != CB_GGUF_ARRAY);
    /* every element, bounded so a long array does not dominate the run */
    uint64_t lim = n < 4096 ? n : 4096;
    for (uint64_t j = 0; j < lim; j++) {
        cb_gguf_arr_get_int(g, i, j, &iv);
        cb_gguf_arr_get_float(g, i, j, &fv);
        if (cb_gguf_arr_get_str(g, i, j, &s) == CB_OK) {
            FUZZ_CHECK(et == CB_GGUF_STRING);
            FUZZ_CHECK((const uint8_t *)s.data >= base && s.len <= size &&
                       (const uint8_t *)s.data + s.len <= base + size);
        }
    }
    if (n > 0)
        cb_gguf_arr_get_str(g, i, n - 1, &s);
    FUZZ_CHECK(cb_gguf_arr_get_int(g, i, n, &iv) == CB_ERR_RANGE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cb_gguf *g = NULL;
    cb_error err = {0};
    /* A copy of exactly `size` bytes: ASan then flags any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    cb_status st = cb_gguf_open_memory(&g, buf, size, "fuzz.gguf", &err);
    if (st != CB_OK) {
        FUZZ_CHECK(g == NULL && err.status == st && err.msg[0]);
        free(buf);
        return 0;
    }
    FUZZ_CHECK(cb_gguf_version(g) == 2 || cb_gguf_version(g) == 3);
    size_t a = cb_gguf_alignment(g);
    FUZZ_CHECK(a > 0 && (a & (a - 1)) == 0);
    for (int64_t i = 0; i < cb_gguf_n_kv(g); i++)
        check_kv(g, i, buf, size);
    for (int64_t i = 0; i < cb_gguf_n_tensors(g); i++)
        check_tensor(g, i);
    cb_gguf_int_or(g, "general.alignment", 0);
    cb_gguf_float_or(g, "llama.rope.freq_base", 0);
    cb_gguf_str(g, "general.architecture");
    cb_hash128 fp;
    cb_gguf_fingerprint(g, &fp);
    cb_chat_kind ck = cb_chat_detect(cb_gguf_str(g, "tokenizer.chat_template"));
    FUZZ_CHECK(cb_chat_name(ck) != NULL);
    if (ck != CB_CHAT_NONE) {
        cb_chat_parts parts = {0};
        FUZZ_CHECK(cb_chat_render(ck, "You are brief.", &parts) == CB_OK && parts.prefix &&
                   parts.suffix);
        cb_chat_parts_free(&parts);
    }

    cb_vocab *v = NULL;
    if (cb_vocab_load(&v, g, &err) == CB_OK) {
        static const char text[] = "Hello world, the cache! <|im_start|>user\n \xc3\xa9\xff 42";
        cb_tokens t = {0};
        int32_t n = cb_vocab_n_tokens(v);
        FUZZ_CHECK(n > 0);
        if (cb_tok_encode(v, text, sizeof text - 1, CB_TOK_ADD_SPECIAL | CB_TOK_PARSE_SPECIAL,
                          &t) == CB_OK) {
            char *out = NULL;
            size_t len = 0;
            for (size_t j = 0; j < t.n; j++)
                FUZZ_CHECK(t.ids[j] >= 0 && t.ids[j] < n);
            if (cb_tok_decode(v, t.ids, t.n, CB_DETOK_UNPARSE_SPECIAL, &out, &len) == CB_OK)
                FUZZ_CHECK(out && strlen(out) <= len);
            free(out);
        }
        cb_tokens_free(&t);
        cb_vocab_free(v);
    }
    cb_gguf_free(g);
    free(buf);
    return 0;
}
