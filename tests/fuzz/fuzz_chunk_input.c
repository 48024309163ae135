/* fuzz_chunk_input - what cb-chunk reads: a document or an archive (every
 * format and compression libarchive reads, nested up to cb-chunk's depth
 * limit), through cb-chunk's own code (do_buffer, compiled from
 * src/cb-chunk.c with its main renamed), and the chunker's contract on
 * every document cb-chunk chunks (a plain input, or each archive member).
 *
 * Input: one flag byte (bit 0: count tokens with the BPE fixture vocabulary,
 * else characters; bit 1: --repair-utf8; bit 2: a separator regex), then
 * the bytes.  The records cb-chunk prints go to /dev/null.
 *
 * Properties, checked on the chunks cb-chunk's own cb_chunker_split call
 * returned (the call is wrapped, so nothing is split twice): chunks are in
 * document order, inside the document, non-empty, start and end on UTF-8
 * boundaries and not on whitespace, hold at most max tokens or characters
 * unless they are a single character, n_tokens is the token count of the
 * chunk's text alone, and their id is the hash of their bytes. */
#include "../../lib/core/core.h"

cb_status fuzz_chunker_split(cb_chunker *c, const char *text, size_t len, cb_chunks *out);
#define main cb_chunk_main
#define cb_chunker_split fuzz_chunker_split
#include "../../src/cb-chunk.c"
#undef cb_chunker_split
#undef main

#include "fuzz.h"

#define FUZZ_MAX 48
#define FUZZ_OVERLAP 8

static cb_vocab *V;
static cb_chunker *ck[2][2]; /* [tokens][separator] */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    cb_gguf *g;
    cb_error err;
    char *vocab = fuzz_data_path("vocab-bpe.gguf");
    if (cb_gguf_open(&g, vocab, &err) != CB_OK || cb_vocab_load(&V, g, &err) != CB_OK) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        exit(1);
    }
    cb_gguf_free(g);
    free(vocab);
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < 2; s++) {
            cb_chunker_params p = {t ? V : NULL, FUZZ_MAX, FUZZ_OVERLAP,
                                   s ? "^#+ |\\n---\\n" : NULL};
            if (cb_chunker_new(&ck[t][s], &p, &err) != CB_OK) {
                fprintf(stderr, "fuzz: %s\n", err.msg);
                exit(1);
            }
        }
    /* the records are cb-chunk's output, not ours to keep */
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || dup2(fd, 1) < 0)
        abort();
    close(fd);
    cli_verbosity = 0;
    return 0;
}

static int is_space_at(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    (void)n;
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static size_t n_chars(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static int cur_tokens; /* this input's chunker counts tokens */

/* The chunker's contract on the chunks out->v[n0..) of text[0..len). */
static void check_chunks(const cb_chunks *out, size_t n0, int tokens, const char *text, size_t len)
{
    size_t prev_start = 0, prev_end = 0;
    for (size_t i = n0; i < out->n; i++) {
        const cb_chunk *k = &out->v[i];
        FUZZ_CHECK(k->start < k->end && k->end <= len);
        FUZZ_CHECK(i == n0 || (k->start > prev_start && k->end > prev_end));
        FUZZ_CHECK(((unsigned char)text[k->start] & 0xC0) != 0x80);
        FUZZ_CHECK(k->end == len || ((unsigned char)text[k->end] & 0xC0) != 0x80);
        FUZZ_CHECK(!is_space_at(text, len, k->start) && !is_space_at(text, len, k->end - 1));
        size_t chars = n_chars(text + k->start, k->end - k->start);
        if (tokens) {
            cb_tokens t = {0};
            FUZZ_CHECK(cb_tok_encode(V, text + k->start, k->end - k->start, 0, &t) == CB_OK);
            FUZZ_CHECK((int64_t)t.n == k->n_tokens);
            FUZZ_CHECK(k->n_tokens <= FUZZ_MAX || chars == 1);
            cb_tokens_free(&t);
        } else {
            FUZZ_CHECK(k->n_tokens == -1 && chars <= FUZZ_MAX);
        }
        char hex[33];
        cb_hash128_hex(cb_hash128_bytes(text + k->start, k->end - k->start), hex);
        FUZZ_CHECK(strcmp(hex, k->id) == 0);
        prev_start = k->start;
        prev_end = k->end;
    }
}

/* cb-chunk's call of the chunker, checked: every document cb-chunk chunks
 * (chunk_doc gives it valid UTF-8, repaired or refused before). */
#undef cb_chunker_split
cb_status fuzz_chunker_split(cb_chunker *c, const char *text, size_t len, cb_chunks *out)
{
    size_t n0 = out->n;
    cb_status st = cb_chunker_split(c, text, len, out);
    FUZZ_CHECK(cb_utf8_check(text, len) == len);
    if (st == CB_OK)
        check_chunks(out, n0, cur_tokens, text, len);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int tokens = data[0] & 1, sep = (data[0] >> 2) & 1;
    ctx x;
    memset(&x, 0, sizeof x);
    x.ck = ck[tokens][sep];
    x.tokens = tokens;
    x.repair = (data[0] >> 1) & 1;
    /* a copy of exactly the input, so that ASan sees reads past its end */
    size_t n = size - 1;
    char *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, n);
    cur_tokens = tokens;
    do_buffer(&x, "fuzz", buf, n, 0);
    FUZZ_CHECK(x.status == 0 || x.status == CLI_EX_DATAERR);
    cb_chunks_free(&x.chunks);
    free(buf);
    return 0;
}
