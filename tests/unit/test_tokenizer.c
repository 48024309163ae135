/* test_tokenizer.c - the tokenizer against llama.cpp: the conformance suites
 * llama.cpp itself tests with (../shared/data/tokenizer/ggml-vocab-*.gguf and
 * their .inp/.out), golden ids that llama.cpp produced for SmolLM2's BPE and
 * Gemma 3's 262,144-token SentencePiece vocabularies
 * (tests/data/{smollm2,gemma3}-golden.txt, from scripts/gen-golden-tokens.py;
 * each skipped when its model is not fetched), and
 * unit cases on tiny vocabularies written with the GGUF writer. */
#include "../../lib/infer/infer.h"
#include "test.h"

#include <dirent.h>
#include <time.h>

/* ------------------------------------------------------------------ helpers */

static cb_vocab *vocab_from_file(const char *path)
{
    cb_gguf *g = NULL;
    cb_vocab *v = NULL;
    cb_error e = {0};
    if (cb_gguf_open(&g, path, &e) != CB_OK) {
        printf("#   %s: %s\n", path, e.msg);
        return NULL;
    }
    if (cb_vocab_load(&v, g, &e) != CB_OK)
        printf("#   %s: %s\n", path, e.msg);
    cb_gguf_free(g);
    return v;
}

/* Print s as a C-escaped string on a "# " line. */
static void put_escaped(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\\' || c == '"')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_ids(const int32_t *ids, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? " " : "", ids[i]);
    putchar(']');
}

static int ids_eq(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Parse " 1 2 3" into a malloc'd array. */
static size_t parse_ids(const char *s, const char *end, int32_t **ids)
{
    size_t n = 0, cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    while (v && s < end) {
        char *e;
        long x;
        while (s < end && *s == ' ')
            s++;
        if (s >= end)
            break;
        x = strtol(s, &e, 10);
        if (e == s)
            break;
        if (n == cap) {
            int32_t *p = realloc(v, (cap *= 2) * sizeof *v);
            if (!p)
                break;
            v = p;
        }
        v[n++] = (int32_t)x;
        s = e;
    }
    *ids = v;
    return n;
}

/* Concatenated cb_tok_piece of every id: the exact bytes the ids stand for. */
static char *pieces(const cb_vocab *v, const int32_t *ids, size_t n, unsigned flags, size_t *len)
{
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        if (cb_tok_piece(v, ids[i], flags, &buf, len, &cap) != CB_OK) {
            free(buf);
            return NULL;
        }
    return buf;
}

/* Whether llama.cpp's detokenizer clean-up (" ." -> ".", " 's" -> "'s", ...)
 * would change s: only then may decode(encode(s)) differ from s for a
 * vocabulary that cleans spaces (gpt-2, starcoder). */
static int cleanup_applies(const char *s, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        if (s[i - 1] != ' ')
            continue;
        if (s[i] == '?' || s[i] == '!' || s[i] == '.' || s[i] == ',')
            return 1;
        if (s[i] == '\'' && i + 1 < n)
            return 1;
    }
    return 0;
}

/* --------------------------------------------------------------- conformance */

static void conformance(const char *dir, const char *name)
{
    char path[1024], pin[1100], pout[1100];
    char *inp, *outp;
    size_t ninp, nout, n_cases = 0, n_pass = 0, n_rt = 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    const char *p, *q, *end, *oline;
    cb_vocab *v;

    snprintf(path, sizeof path, "%s/tokenizer/%s", dir, name);
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(pout, sizeof pout, "%s.out", path);
    tcase("conformance %s", name);
    inp = t_read_file(pin, &ninp);
    outp = t_read_file(pout, &nout);
    v = vocab_from_file(path);
    CHECKF(inp && outp, "%s: .inp or .out missing", name);
    CHECK(v != NULL);
    if (!inp || !outp || !v)
        goto done;

    p = inp;
    end = inp + ninp;
    oline = outp;
    while (p < end) {
        const char *oe;
        int32_t *want;
        size_t nwant, len;
        cb_tokens got = {0};
        char *txt = NULL, *cat;
        size_t tlen = 0;

        q = memmem(p, (size_t)(end - p), sep, strlen(sep));
        len = q ? (size_t)(q - p) : (size_t)(end - p);
        if (*oline == 0) {
            CHECKF(0, "%s: fewer .out lines than inputs", name);
            break;
        }
        oe = strchr(oline, '\n');
        if (!oe)
            oe = oline + strlen(oline);
        nwant = parse_ids(oline, oe, &want);
        oline = *oe ? oe + 1 : oe;
        n_cases++;

        CHECK_OK(cb_tok_encode(v, p, len, 0, &got));
        if (ids_eq(got.ids, got.n, want, nwant)) {
            n_pass++;
        } else {
            printf("# mismatch for ");
            put_escaped(p, len);
            printf("\n#   llama.cpp ");
            put_ids(want, nwant);
            printf("\n#   ours      ");
            put_ids(got.ids, got.n);
            printf("\n");
            t_case_fail = 1;
        }

        /* Round trip: the pieces give back the text byte for byte (after
         * the space SPM puts in front), and so does the detokenizer except
         * where llama.cpp's clean-up of spaces before punctuation applies. */
        cat = pieces(v, got.ids, got.n, 0, &tlen);
        if (cat && cb_vocab_kind_of(v) == CB_VOCAB_SPM && len > 0 && tlen == len + 1 &&
            cat[0] == ' ')
            memmove(cat, cat + 1, tlen--);
        CHECKF(tlen == len && (len == 0 || (cat && memcmp(cat, p, len) == 0)),
               "%s: pieces of case %zu do not give back its text", name, n_cases);
        free(cat);
        CHECK_OK(cb_tok_decode(v, got.ids, got.n, 0, &txt, &tlen));
        if (txt && tlen == len && memcmp(txt, p, len) == 0)
            n_rt++;
        else if (!(cb_vocab_kind_of(v) == CB_VOCAB_BPE && cleanup_applies(p, len))) {
            printf("# decode(encode(x)) != x for ");
            put_escaped(p, len);
            printf("\n#   decoded ");
            put_escaped(txt ? txt : "", txt ? tlen : 0);
            printf("\n");
            t_case_fail = 1;
        } else {
            n_rt++;
        }
        free(txt);
        free(want);
        cb_tokens_free(&got);
        if (!q)
            break;
        p = q + strlen(sep);
    }
    CHECKF(*oline == 0, "%s: more .out lines than inputs", name);
    CHECKF(n_pass == n_cases, "%s: %zu of %zu cases differ from llama.cpp", name, n_cases - n_pass,
           n_cases);
    snprintf(t_case_name, sizeof t_case_name, "conformance %s: %zu/%zu cases, %zu round trips",
             name, n_pass, n_cases, n_rt);
done:
    free(inp);
    free(outp);
    cb_vocab_free(v);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_conformance(void)
{
    const char *dir = t_shared_data();
    char path[1024];
    DIR *d;
    struct dirent *de;
    char *names[64];
    int n = 0;

    if (!dir) {
        tskip("tokenizer conformance suites", "../shared/data not found");
        return;
    }
    snprintf(path, sizeof path, "%s/tokenizer", dir);
    if (!(d = opendir(path))) {
        tskip("tokenizer conformance suites", "../shared/data/tokenizer not found");
        return;
    }
    while ((de = readdir(d)) != NULL && n < 64) {
        size_t l = strlen(de->d_name);
        if (strncmp(de->d_name, "ggml-vocab-", 11) == 0 && l > 5 &&
            strcmp(de->d_name + l - 5, ".gguf") == 0)
            names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        conformance(dir, names[i]);
        free(names[i]);
    }
    if (n == 0)
        tskip("tokenizer conformance suites", "no ggml-vocab-*.gguf files");
}

/* ------------------------------------------------------------ golden ids */

/* Undo the escaping of smollm2-golden.txt: \\ \t \n \r \xHH. */
static size_t unescape(const char *s, const char *end, char *out)
{
    size_t n = 0;
    while (s < end) {
        if (*s == '\\' && s + 1 < end) {
            s++;
            switch (*s) {
            case 'n': out[n++] = '\n'; break;
            case 't': out[n++] = '\t'; break;
            case 'r': out[n++] = '\r'; break;
            case 'x':
                if (s + 2 < end) {
                    char h[3] = {s[1], s[2], 0};
                    out[n++] = (char)strtol(h, NULL, 16);
                    s += 2;
                }
                break;
            default: out[n++] = *s; break;
            }
            s++;
        } else {
            out[n++] = *s++;
        }
    }
    return n;
}

/* name: "smollm2" or "gemma3" (tests/data/<name>-golden.txt); model: the
 * model file whose vocabulary the ids belong to, NULL when not fetched */
static void test_golden(const char *name, const char *model, const char *fetch)
{
    char *data, *line, *save = NULL, title[64], file[128];
    cb_vocab *v;
    size_t n_cases = 0, n_pass = 0, n_detok = 0;
    int vocab_ok = 0;

    snprintf(title, sizeof title, "%s golden ids", name);
    snprintf(file, sizeof file, "tests/data/%s-golden.txt", name);
    if (!model) {
        char why[128];
        snprintf(why, sizeof why, "model not found (%s)", fetch);
        tskip(title, why);
        return;
    }
    data = t_read_file(file, NULL);
    if (!data) {
        tskip(title, "golden file not found (run from the repository root)");
        return;
    }
    tcase("%s", title);
    v = vocab_from_file(model);
    CHECK(v != NULL);
    for (line = strtok_r(data, "\n", &save); v && line; line = strtok_r(NULL, "\n", &save)) {
        char *f[4], *txt, *dec, *got_dec = NULL;
        size_t nt, nd, nwant, glen = 0;
        int32_t *want;
        unsigned flags;
        cb_tokens got = {0};
        int k = 0;

        if (strncmp(line, "# vocab ", 8) == 0) {
            char pre[64] = "";
            int nv = 0;
            sscanf(line + 8, "n_tokens=%d pre=%63s", &nv, pre);
            vocab_ok = nv == cb_vocab_n_tokens(v) && strcmp(pre, cb_vocab_pre(v)) == 0;
            if (!vocab_ok)
                break;
            continue;
        }
        if (line[0] == '#' || line[0] == 0)
            continue;
        f[0] = line;
        for (char *c = line; *c && k < 3; c++)
            if (*c == '\t') {
                *c = 0;
                f[++k] = c + 1;
            }
        if (k != 3) {
            CHECKF(0, "malformed golden line: %s", line);
            continue;
        }
        flags = strcmp(f[0], "special") == 0 ? CB_TOK_PARSE_SPECIAL : 0;
        txt = malloc(strlen(f[1]) + 1);
        dec = malloc(strlen(f[3]) + 1);
        nt = unescape(f[1], f[1] + strlen(f[1]), txt);
        nd = unescape(f[3], f[3] + strlen(f[3]), dec);
        nwant = parse_ids(f[2], f[2] + strlen(f[2]), &want);
        n_cases++;
        CHECK_OK(cb_tok_encode(v, txt, nt, flags, &got));
        if (ids_eq(got.ids, got.n, want, nwant)) {
            n_pass++;
        } else {
            printf("# mismatch (%s) for ", f[0]);
            put_escaped(txt, nt);
            printf("\n#   llama.cpp ");
            put_ids(want, nwant);
            printf("\n#   ours      ");
            put_ids(got.ids, got.n);
            printf("\n");
            t_case_fail = 1;
        }
        /* llama_detokenize(want, remove_special=false, unparse_special=special) */
        CHECK_OK(
            cb_tok_decode(v, want, nwant, flags ? CB_DETOK_UNPARSE_SPECIAL : 0, &got_dec, &glen));
        if (got_dec && glen == nd && memcmp(got_dec, dec, nd) == 0) {
            n_detok++;
        } else {
            printf("# detokenized differently: ");
            put_escaped(got_dec ? got_dec : "", got_dec ? glen : 0);
            printf("\n#   llama.cpp             ");
            put_escaped(dec, nd);
            printf("\n");
            t_case_fail = 1;
        }
        free(got_dec);
        free(want);
        free(txt);
        free(dec);
        cb_tokens_free(&got);
    }
    if (v && !vocab_ok) {
        cb_vocab_free(v);
        free(data);
        tskip(title, "the model file has another vocabulary than the golden file's");
        return;
    }
    CHECK(n_cases > 0);
    snprintf(t_case_name, sizeof t_case_name, "%s: %zu/%zu cases, %zu detokenized", title, n_pass,
             n_cases, n_detok);
    cb_vocab_free(v);
    free(data);
}

/* Speed: 100 KB of mixed text must tokenize in milliseconds. */
static void test_speed(void)
{
    const char *model = t_smol_model();
    const char *dir = t_shared_data();
    char path[1024];
    cb_vocab *v;
    char *text;
    size_t n = 0, cap = 100 * 1024;
    cb_tokens got = {0};
    struct timespec t0, t1;
    double ms;
    static const char *parts[] = {"The quick brown fox jumps over the lazy dog. ",
                                  "int main(void) { return 0; }\n",
                                  "    indented\tcode\n\n",
                                  "1234567890 3.14159 ",
                                  "caf\xc3\xa9 na\xc3\xafve ",
                                  "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c ",
                                  "\xf0\x9f\x9a\x80 ",
                                  "                                ",
                                  "<|im_start|>user\n"};

    if (model) {
        snprintf(path, sizeof path, "%s", model);
    } else if (dir) {
        snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-gpt-2.gguf", dir);
    } else {
        tskip("tokenize 100 KB", "no vocabulary available");
        return;
    }
    tcase("tokenize 100 KB");
    v = vocab_from_file(path);
    text = malloc(cap + 64);
    CHECK(v && text);
    if (!v || !text)
        goto done;
    for (int i = 0; n < cap; i++) {
        const char *s = parts[(i * 7) % (int)(sizeof parts / sizeof parts[0])];
        memcpy(text + n, s, strlen(s));
        n += strlen(s);
    }
    /* And one long run of spaces and one of digits in the middle. */
    memset(text + n / 2, ' ', 4000);
    memset(text + n / 3, '7', 4000);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(cb_tok_encode(v, text, n, CB_TOK_PARSE_SPECIAL, &got));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    printf("# %zu bytes -> %zu tokens in %.1f ms\n", n, got.n, ms);
    CHECKF(ms < 2000, "%.0f ms", ms);
    {
        char *dec = NULL;
        size_t dl = 0;
        CHECK_OK(cb_tok_decode(v, got.ids, got.n, CB_DETOK_UNPARSE_SPECIAL, &dec, &dl));
        if (cb_vocab_kind_of(v) == CB_VOCAB_BPE && strcmp(cb_vocab_pre(v), "smollm") == 0)
            CHECK(dec && dl == n && memcmp(dec, text, n) == 0);
        free(dec);
    }
done:
    cb_tokens_free(&got);
    free(text);
    cb_vocab_free(v);
}

/* ---------------------------------------------------- tiny vocabularies */

/* A vocabulary in memory: the GGUF bytes must outlive the cb_gguf, which
 * must outlive nothing (cb_vocab copies what it needs). */
static cb_status vocab_from_writer(cb_gguf_writer *w, cb_vocab **v, cb_error *e)
{
    void *buf = NULL;
    size_t size = 0;
    cb_gguf *g = NULL;
    cb_status st = cb_gguf_writer_bytes(w, &buf, &size);
    if (st == CB_OK)
        st = cb_gguf_open_memory(&g, buf, size, "tiny", e);
    if (st == CB_OK)
        st = cb_vocab_load(v, g, e);
    cb_gguf_free(g);
    free(buf);
    return st;
}

/* GPT-2 byte-level text of the raw bytes s (for building token lists). */
static void byte_level(const char *s, char *out)
{
    size_t o = 0;
    for (; *s; s++) {
        unsigned b = (unsigned char)*s;
        unsigned cp;
        if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae) {
            cp = b;
        } else {
            unsigned k = 0;
            for (unsigned x = 0; x < b; x++)
                if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae))
                    k++;
            cp = 256 + k;
        }
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xc0 | (cp >> 6));
            out[o++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    out[o] = 0;
}

/* A byte-level BPE vocabulary: the 256 byte tokens, a few merges towards
 * "hello" and " world", a control and a user-defined token. */
static cb_gguf_writer *tiny_bpe(const char *pre)
{
    static char store[300][8];
    const char *toks[300];
    int32_t types[300];
    int n = 0;
    const char *merges[] = {"h e", "l l",          "he ll", "hell o",        "\xc4\xa0 w",
                            "o r", "\xc4\xa0w or", "l d",   "\xc4\xa0wor ld"};
    const char *extra[] = {"he",          "ll", "hell",          "hello",         "\xc4\xa0w", "or",
                           "\xc4\xa0wor", "ld", "\xc4\xa0world", "<|endoftext|>", "<tool>"};
    cb_gguf_writer *w = cb_gguf_writer_new(0);

    for (int b = 0; b < 256; b++) {
        char raw[2] = {(char)b, 0};
        if (b == 0) {
            store[n][0] = (char)0xc4; /* byte 0 is U+0100 */
            store[n][1] = (char)0x80;
            store[n][2] = 0;
        } else {
            byte_level(raw, store[n]);
        }
        toks[n] = store[n];
        types[n++] = 1;
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        toks[n] = extra[i];
        types[n++] = 1;
    }
    types[n - 2] = 3; /* <|endoftext|>: control */
    types[n - 1] = 4; /* <tool>: user-defined */
    cb_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre)
        cb_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    cb_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    cb_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", CB_GGUF_INT32, types, (uint64_t)n);
    cb_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges,
                               sizeof merges / sizeof merges[0]);
    cb_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)n - 2);
    cb_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)n - 2);
    return w;
}

static int32_t id_of(const cb_vocab *v, const char *text)
{
    for (int32_t i = 0; i < cb_vocab_n_tokens(v); i++) {
        cb_strview s = cb_vocab_token_text(v, i);
        if (cb_strview_eq(s, text))
            return i;
    }
    return -1;
}

static int encode_is(const cb_vocab *v, const char *text, unsigned flags, const int32_t *want,
                     size_t n)
{
    cb_tokens t = {0};
    int ok =
        cb_tok_encode(v, text, strlen(text), flags, &t) == CB_OK && ids_eq(t.ids, t.n, want, n);
    if (!ok) {
        printf("#   ");
        put_escaped(text, strlen(text));
        printf(" -> ");
        put_ids(t.ids, t.n);
        printf(", want ");
        put_ids(want, n);
        printf("\n");
    }
    cb_tokens_free(&t);
    return ok;
}

static void test_tiny_bpe(void)
{
    cb_gguf_writer *w;
    cb_vocab *v = NULL;
    cb_error e = {0};
    int32_t hello, world, eot, tool, lt;

    tcase("tiny BPE: unknown pre-tokenizer is unsupported");
    w = tiny_bpe("no-such-pre");
    CHECK(vocab_from_writer(w, &v, &e) == CB_ERR_UNSUPPORTED);
    CHECKF(strstr(e.msg, "no-such-pre") != NULL, "message: %s", e.msg);
    CHECK(v == NULL);
    cb_gguf_writer_free(w);

    tcase("tiny BPE: unknown tokenizer model is unsupported");
    w = tiny_bpe("gpt-2");
    cb_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert");
    CHECK(vocab_from_writer(w, &v, &e) == CB_ERR_UNSUPPORTED);
    CHECKF(strstr(e.msg, "bert") != NULL, "message: %s", e.msg);
    cb_gguf_writer_free(w);

    tcase("tiny BPE: missing merges is a format error");
    w = cb_gguf_writer_new(0);
    {
        const char *toks[] = {"a", "b"};
        cb_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
        cb_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 2);
    }
    CHECK(vocab_from_writer(w, &v, &e) == CB_ERR_FORMAT);
    cb_gguf_writer_free(w);

    tcase("tiny BPE: merges, special tokens, BOS");
    w = tiny_bpe("gpt-2");
    CHECK_OK(vocab_from_writer(w, &v, &e));
    cb_gguf_writer_free(w);
    if (!v)
        return;
    CHECK(strcmp(cb_vocab_pre(v), "gpt-2") == 0);
    CHECK(cb_vocab_kind_of(v) == CB_VOCAB_BPE);
    hello = id_of(v, "hello");
    world = id_of(v, "\xc4\xa0world");
    eot = id_of(v, "<|endoftext|>");
    tool = id_of(v, "<tool>");
    lt = id_of(v, "<");
    CHECK(hello >= 0 && world >= 0 && eot >= 0 && tool >= 0 && lt >= 0);
    CHECK(encode_is(v, "hello world", 0, (int32_t[]){hello, world}, 2));
    /* The control token is text unless special parsing is on ... */
    {
        cb_tokens t = {0};
        CHECK_OK(cb_tok_encode(v, "hello<|endoftext|>", 18, 0, &t));
        CHECK(t.n > 2 && t.ids[0] == hello && t.ids[1] == lt);
        cb_tokens_free(&t);
    }
    CHECK(encode_is(v, "hello<|endoftext|>", CB_TOK_PARSE_SPECIAL, (int32_t[]){hello, eot}, 2));
    /* ... the user-defined one always matches. */
    CHECK(encode_is(v, "<tool>hello", 0, (int32_t[]){tool, hello}, 2));
    CHECK(encode_is(v, "<tool>hello", CB_TOK_PARSE_SPECIAL, (int32_t[]){tool, hello}, 2));
    /* BOS only when the metadata asks for it. */
    CHECK(!cb_vocab_add_bos(v));
    CHECK(encode_is(v, "hello", CB_TOK_ADD_SPECIAL, (int32_t[]){hello}, 1));
    CHECK(cb_vocab_is_eog(v, eot));
    CHECK(!cb_vocab_is_eog(v, hello));
    CHECK(cb_vocab_token_attr(v, eot) == CB_TOKEN_CONTROL);
    CHECK(cb_vocab_token_attr(v, tool) == CB_TOKEN_USER_DEFINED);
    /* Control tokens render only on request. */
    {
        char *txt = NULL;
        size_t n = 0;
        int32_t ids[] = {hello, eot, world};
        CHECK_OK(cb_tok_decode(v, ids, 3, 0, &txt, &n));
        CHECK(txt && strcmp(txt, "hello world") == 0);
        free(txt);
        CHECK_OK(cb_tok_decode(v, ids, 3, CB_DETOK_UNPARSE_SPECIAL, &txt, &n));
        CHECK(txt && strcmp(txt, "hello<|endoftext|> world") == 0);
        free(txt);
        CHECK(cb_tok_decode(v, (int32_t[]){cb_vocab_n_tokens(v)}, 1, 0, &txt, &n) == CB_ERR_RANGE);
    }
    /* Every byte, valid UTF-8 or not, survives a round trip.  Invalid
     * sequences become U+FFFD as in llama.cpp, so only valid text is used
     * whole; each ASCII byte on its own is. */
    for (int b = 1; b < 128; b++) {
        char s[2] = {(char)b, 0};
        cb_tokens t = {0};
        char *txt = NULL;
        size_t n = 0;
        CHECK_OK(cb_tok_encode(v, s, 1, 0, &t));
        CHECK_OK(cb_tok_decode(v, t.ids, t.n, 0, &txt, &n));
        CHECKF(n == 1 && txt && txt[0] == s[0], "byte 0x%02x", b);
        free(txt);
        cb_tokens_free(&t);
    }
    {
        const char *s = "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x9a\x80";
        cb_tokens t = {0};
        char *txt = NULL;
        size_t n = 0;
        CHECK_OK(cb_tok_encode(v, s, strlen(s), 0, &t));
        CHECK_OK(cb_tok_decode(v, t.ids, t.n, 0, &txt, &n));
        CHECK(txt && n == strlen(s) && memcmp(txt, s, n) == 0);
        free(txt);
        cb_tokens_free(&t);
    }
    /* Invalid UTF-8: each bad byte is U+FFFD (EF BF BD) to llama.cpp. */
    {
        cb_tokens t = {0};
        char *txt = NULL;
        size_t n = 0;
        CHECK_OK(cb_tok_encode(v,
                               "a\xff"
                               "b",
                               3, 0, &t));
        CHECK_OK(cb_tok_decode(v, t.ids, t.n, 0, &txt, &n));
        CHECK(txt && strcmp(txt, "a\xef\xbf\xbd"
                                 "b") == 0);
        free(txt);
        cb_tokens_free(&t);
    }
    cb_vocab_free(v);

    tcase("tiny BPE: add_bos_token");
    w = tiny_bpe(NULL);
    cb_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    v = NULL;
    CHECK_OK(vocab_from_writer(w, &v, &e));
    cb_gguf_writer_free(w);
    if (!v)
        return;
    CHECK(strcmp(cb_vocab_pre(v), "default") == 0);
    CHECK(cb_vocab_add_bos(v) && !cb_vocab_add_eos(v));
    CHECK(encode_is(v, "hello", CB_TOK_ADD_SPECIAL, (int32_t[]){eot, hello}, 2));
    CHECK(encode_is(v, "hello", 0, (int32_t[]){hello}, 1));
    {
        char *txt = NULL;
        size_t n = 0;
        CHECK_OK(cb_tok_decode(v, (int32_t[]){eot, hello}, 2,
                               CB_DETOK_REMOVE_SPECIAL | CB_DETOK_UNPARSE_SPECIAL, &txt, &n));
        CHECK(txt && strcmp(txt, "hello") == 0);
        free(txt);
    }
    cb_vocab_free(v);
}

/* A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, and a few
 * pieces with scores. */
static cb_gguf_writer *tiny_spm(void)
{
    static char hex[256][8];
    const char *toks[300];
    float scores[300];
    int32_t types[300];
    int n = 0;
    const char *pieces_[] = {"\xe2\x96\x81",
                             "\xe2\x96\x81h",
                             "el",
                             "lo",
                             "\xe2\x96\x81hel",
                             "\xe2\x96\x81hello",
                             "h",
                             "e",
                             "l",
                             "o",
                             "w",
                             "\xe2\x96\x81w",
                             "<|im_end|>"};
    float piece_scores[] = {-1, -2, -3, -3, -4, -5, -6, -6, -6, -6, -6, -7, 0};
    cb_gguf_writer *w = cb_gguf_writer_new(0);

    toks[n] = "<unk>";
    scores[n] = 0;
    types[n++] = 2;
    toks[n] = "<s>";
    scores[n] = 0;
    types[n++] = 3;
    toks[n] = "</s>";
    scores[n] = 0;
    types[n++] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(hex[b], sizeof hex[b], "<0x%02X>", b);
        toks[n] = hex[b];
        scores[n] = 0;
        types[n++] = 6;
    }
    for (size_t i = 0; i < sizeof pieces_ / sizeof pieces_[0]; i++) {
        toks[n] = pieces_[i];
        scores[n] = piece_scores[i];
        types[n++] = 1;
    }
    types[n - 1] = 4; /* <|im_end|>: user-defined (becomes control: an EOG name) */
    cb_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    cb_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    cb_gguf_writer_set_arr(w, "tokenizer.ggml.scores", CB_GGUF_FLOAT32, scores, (uint64_t)n);
    cb_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", CB_GGUF_INT32, types, (uint64_t)n);
    return w;
}

static void test_tiny_spm(void)
{
    cb_gguf_writer *w = tiny_spm();
    cb_vocab *v = NULL;
    cb_error e = {0};
    int32_t hello, sp, imend, byte_c3, byte_a9;

    tcase("tiny SPM: merges, byte fallback, space prefix");
    CHECK_OK(vocab_from_writer(w, &v, &e));
    cb_gguf_writer_free(w);
    if (!v)
        return;
    CHECK(cb_vocab_kind_of(v) == CB_VOCAB_SPM);
    CHECK(cb_vocab_bos(v) == 1 && cb_vocab_eos(v) == 2 && cb_vocab_add_bos(v));
    hello = id_of(v, "\xe2\x96\x81hello");
    sp = id_of(v, "\xe2\x96\x81");
    imend = id_of(v, "<|im_end|>");
    byte_c3 = id_of(v, "<0xC3>");
    byte_a9 = id_of(v, "<0xA9>");
    CHECK(encode_is(v, "hello", 0, (int32_t[]){hello}, 1));
    CHECK(encode_is(v, "hello", CB_TOK_ADD_SPECIAL, (int32_t[]){1, hello}, 2));
    CHECK(encode_is(v, " \xc3\xa9", 0, (int32_t[]){sp, sp, byte_c3, byte_a9}, 4));
    /* <|im_end|> is an end-of-generation name, so it was made a control
     * token: text without special parsing, a token with it. */
    CHECK(cb_vocab_is_eog(v, imend));
    CHECK(cb_vocab_token_attr(v, imend) & CB_TOKEN_CONTROL);
    CHECK(encode_is(v, "hello<|im_end|>", CB_TOK_PARSE_SPECIAL, (int32_t[]){hello, imend}, 2));
    /* After a special token the space prefix comes back. */
    CHECK(encode_is(v, "<|im_end|>hello", CB_TOK_PARSE_SPECIAL, (int32_t[]){imend, hello}, 2));
    {
        char *txt = NULL;
        size_t n = 0;
        CHECK_OK(cb_tok_decode(v, (int32_t[]){hello, sp, byte_c3, byte_a9}, 4, 0, &txt, &n));
        CHECK(txt && strcmp(txt, "hello \xc3\xa9") == 0);
        free(txt);
    }
    /* Byte tokens round-trip any bytes, valid UTF-8 or not. */
    {
        char s[256];
        cb_tokens t = {0};
        char *txt = NULL;
        size_t n = 0;
        for (int b = 0; b < 256; b++)
            s[b] = (char)(b == ' ' ? 'x' : 255 - b);
        CHECK_OK(cb_tok_encode(v, s, sizeof s, 0, &t));
        CHECK_OK(cb_tok_decode(v, t.ids, t.n, 0, &txt, &n));
        CHECK(txt && n == sizeof s && memcmp(txt, s, n) == 0);
        free(txt);
        cb_tokens_free(&t);
    }
    cb_vocab_free(v);
}

int main(void)
{
    TEST_BEGIN();
    test_tiny_bpe();
    test_tiny_spm();
    test_conformance();
    test_golden("smollm2", t_smol_model(), "make model");
    test_golden("gemma3", t_gemma_model(), "make model MODEL=gemma");
    test_speed();
    TEST_END();
}
