/* fuzz_tok.h - the tokenizer harness, built twice: fuzz_tok_bpe (the byte-
 * level BPE vocabulary cb-gen-fixture writes, SmolLM2's pre-tokenizer) and
 * fuzz_tok_spm (a SentencePiece vocabulary with byte fallback, written here
 * with the GGUF writer).  CB_FUZZ_VOCAB=FILE.gguf fuzzes another vocabulary
 * (a real model's) with the same properties.
 *
 * Input: one flag byte, then arbitrary bytes.  The bytes are tokenized with
 * the flag's CB_TOK_* bits, and also read as token ids (little-endian u16,
 * some out of range) and detokenized with the flag's CB_DETOK_* bits.
 * Properties: ids are in range; without special tokens, valid UTF-8 decodes
 * from its encoding back to the same bytes (for SPM: unless it holds U+2581,
 * the space marker itself, or a user-defined token, after which llama.cpp
 * puts the space prefix again; for either: unless a vocab's clean-up rule
 * rewrites it, as llama.cpp's gpt-2 vocabs do " ?"; checked for the
 * built-in vocabularies only: a real one may lack a byte's token, and then
 * drops the byte as llama.cpp does, e.g. SmolLM2's 0x13); decoding an out-of-range id is CB_ERR_RANGE. */
#include "../../lib/infer/infer.h"
#include "fuzz.h"

static cb_vocab *V;
static int builtin; /* the harness's own vocabulary, which has every byte */

#ifdef FUZZ_SPM
/* <unk> <s> </s>, the 256 byte tokens, pieces with scores (a few merges
 * deep), and user-defined and control tokens. */
static cb_gguf *spm_vocab(void **bytes)
{
    static const char *pieces[] = {"\xe2\x96\x81",
                                   "\xe2\x96\x81t",
                                   "he",
                                   "\xe2\x96\x81the",
                                   "in",
                                   "er",
                                   "an",
                                   "\xe2\x96\x81"
                                   "a",
                                   "on",
                                   "re",
                                   "\xe2\x96\x81"
                                   "c",
                                   "ch",
                                   "\xe2\x96\x81"
                                   "ca",
                                   "\xe2\x96\x81"
                                   "cache",
                                   "at",
                                   "en",
                                   "es",
                                   "\xe2\x96\x81\xe2\x96\x81",
                                   "\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81\xe2\x96\x81",
                                   "\n",
                                   "\n\n",
                                   "\xc3\xa9",
                                   "\xe6\x97\xa5",
                                   "\xe6\x97\xa5\xe6\x9c\xac",
                                   "h",
                                   "e",
                                   "t",
                                   "a",
                                   "c",
                                   "o",
                                   "n",
                                   "r",
                                   "<start_of_turn>",
                                   "<end_of_turn>",
                                   "<mask>",
                                   "[multi]",
                                   "\xe2\x96\x81world",
                                   "wor",
                                   "ld"};
    static char hex[256][8];
    const char *toks[512];
    float scores[512];
    int32_t types[512];
    int n = 0;
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
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        toks[n] = pieces[i];
        scores[n] = -(float)(i + 1);
        types[n++] = pieces[i][0] == '<' ? 3 : pieces[i][0] == '[' ? 4 : 1;
    }
    cb_gguf_writer *w = cb_gguf_writer_new(0);
    size_t size;
    cb_gguf *g = NULL;
    cb_gguf_writer_set_str(w, "general.architecture", "llama");
    cb_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    cb_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    cb_gguf_writer_set_arr(w, "tokenizer.ggml.scores", CB_GGUF_FLOAT32, scores, (uint64_t)n);
    cb_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", CB_GGUF_INT32, types, (uint64_t)n);
    cb_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    cb_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    cb_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    cb_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", 1);
    if (cb_gguf_writer_bytes(w, bytes, &size) != CB_OK ||
        cb_gguf_open_memory(&g, *bytes, size, "spm", NULL) != CB_OK)
        abort();
    cb_gguf_writer_free(w);
    return g;
}
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    cb_gguf *g = NULL;
    cb_error err = {0};
    const char *file = getenv("CB_FUZZ_VOCAB");
    char *own = NULL;
    builtin = !file || !*file;
    void *bytes = NULL;
#ifdef FUZZ_SPM
    if (!file || !*file)
        g = spm_vocab(&bytes);
#else
    if (!file || !*file)
        file = own = fuzz_data_path("vocab-bpe.gguf");
#endif
    if (!g && cb_gguf_open(&g, file, &err) != CB_OK) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        exit(1);
    }
    if (cb_vocab_load(&V, g, &err) != CB_OK) {
        fprintf(stderr, "fuzz: vocabulary: %s\n", err.msg);
        exit(1);
    }
    cb_gguf_free(g);
    free(bytes);
    free(own);
    return 0;
}

static int has(const uint8_t *p, size_t n, const char *s)
{
    return memmem(p, n, s, strlen(s)) != NULL;
}

/* Text a detokenizer's clean_spaces rule rewrites (" ?" " !" " ." " ,"
 * " '"), which llama.cpp's gpt-2 style vocabs do on purpose. */
static int cleanable(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == ' ' && strchr("?!.,'", p[i + 1]) && p[i + 1])
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned flags = data[0] & 3, dflags = (data[0] >> 2) & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t nv = cb_vocab_n_tokens(V);
    cb_tokens t = {0};
    char *out = NULL;
    size_t olen = 0;

    FUZZ_CHECK(cb_tok_encode(V, text, len, flags, &t) == CB_OK);
    for (size_t i = 0; i < t.n; i++)
        FUZZ_CHECK(t.ids[i] >= 0 && t.ids[i] < nv);
    FUZZ_CHECK(cb_tok_decode(V, t.ids, t.n, dflags, &out, &olen) == CB_OK);
    FUZZ_CHECK(out && out[olen] == 0);
    if (flags == 0 && dflags == 0) {
        int exact = builtin && !cleanable(data + 1, len) && cb_utf8_check(text, len) == len &&
                    (cb_vocab_kind_of(V) == CB_VOCAB_BPE || !has(data + 1, len, "\xe2\x96\x81"));
        /* SPM, as llama.cpp: text after a user-defined token gets the space
         * prefix again, so "[multi]n" comes back as "[multi] n" */
        for (size_t i = 0; i < t.n && cb_vocab_kind_of(V) == CB_VOCAB_SPM; i++)
            if (cb_vocab_token_attr(V, t.ids[i]) & (CB_TOKEN_USER_DEFINED | CB_TOKEN_CONTROL))
                exact = 0;
        if (exact && (olen != len || memcmp(out, text, len) != 0)) {
            fprintf(stderr, "round trip: %zu bytes in, %zu out\n", len, olen);
            FUZZ_CHECK(!"decode(encode(text)) == text");
        }
    }
    free(out);
    out = NULL;
    cb_tokens_free(&t);

    /* The bytes as token ids; 1/16 of the range lies past the vocabulary. */
    size_t n = len / 2;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    int bad = 0;
    if (!ids)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t u;
        memcpy(&u, text + 2 * i, 2);
        ids[i] = (int32_t)((uint64_t)u * (uint64_t)(nv + nv / 16 + 1) / 65536u);
        bad |= ids[i] >= nv;
    }
    cb_status st = cb_tok_decode(V, ids, n, dflags, &out, &olen);
    FUZZ_CHECK(bad ? st == CB_ERR_RANGE : st == CB_OK);
    if (st == CB_OK)
        FUZZ_CHECK(out && out[olen] == 0);
    free(out);
    char *pb = NULL;
    size_t pl = 0, pc = 0;
    for (size_t i = 0; i < n && i < 64; i++) {
        st = cb_tok_piece(V, ids[i], dflags, &pb, &pl, &pc);
        FUZZ_CHECK(ids[i] >= nv ? st == CB_ERR_RANGE : st == CB_OK);
        FUZZ_CHECK(pl <= pc);
    }
    FUZZ_CHECK(cb_tok_piece(V, -1, 0, &pb, &pl, &pc) == CB_ERR_RANGE);
    free(pb);
    free(ids);
    return 0;
}
