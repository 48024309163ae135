/* cb-gen-fixture - write a tiny random-weight GGUF model (llama, qwen2,
 * qwen3 or gemma3 architecture) with libcbcore's GGUF writer, for tests.
 *
 * The vocabulary is a real byte-level BPE: the 256 GPT-2 byte tokens plus
 * merges learnt here from an embedded English text (most frequent pair
 * first), and three control tokens in SmolLM2's places (<|endoftext|> 0,
 * <|im_start|> 1, <|im_end|> 2).  Weights come from a fixed-seed generator,
 * so the same flags always give the same bytes.
 *
 *   cb-gen-fixture [--type T] [--arch llama|qwen2|qwen3|gemma3] [--layers N]
 *                  [--embd N] [--ff N] [--heads N] [--kv-heads N] [--head-dim N]
 *                  [--window N] [--rope-scaling none|linear|llama3|yarn]
 *                  [--merges N] [--ctx N] [--vocab N] [--untied] [--seed N]
 *                  [--vocab-only] OUT.gguf
 * qwen2 adds Q/K/V biases; qwen3 and gemma3 per-head Q/K norms (and a head
 * dimension of their own, --head-dim, default 2 x embd/heads); gemma3 the
 * post-attention and post-MLP norms, a sliding window (--window, default 8)
 * on every layer but 5, 11, ..., (7 layers by default), a RoPE base of 1e6
 * for the global layers, and BOS added before every text.  --rope-scaling
 * llama3 writes rope_freqs.weight as Llama 3.1's converter computes it
 * (factor 8, low 1, high 4, original context 64); linear a scaling factor
 * of 4; yarn a type the engine refuses (for the refusal tests).
 * --vocab N pads the vocabulary to N tokens with unused filler tokens;
 * --untied adds an output matrix of its own (llama-7B's shape:
 * --layers 32 --embd 4096 --ff 11008 --heads 32 --kv-heads 32 --vocab 32000
 * --untied).
 *
 * Large tensors (over 4M elements) are streamed into the file as it is
 * written: their rows are drawn (by a fixed hash of tensor and row) from a
 * pool of 256 rows quantized once per row length, so a 4 GB model needs
 * some MB of memory and seconds of CPU; small tensors, the test fixtures,
 * are fully random as before.
 */
#include "../../lib/infer/infer.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char corpus[] =
    "The capital of France is Paris. Paris is a city on the river Seine, and the river runs to the sea.\n"
    "A cache keeps the keys and values of the tokens that the model has already seen, so that the\n"
    "next token can be computed without computing the whole prompt again. The store holds the caches\n"
    "of many chunks, and the chunks are blended with a small recompute of the tokens that deviate.\n"
    "In the morning the weather was cold, but in the afternoon the sun came out and the children\n"
    "played in the park near the station. They were there until the evening, when the lights came on.\n"
    "int main(void) { return 0; } for (int i = 0; i < n; i++) sum += x[i] * y[i];\n"
    "Numbers: 1, 2, 3, 10, 42, 100, 2024, 3.14159, 1e-5. Questions? Answers! The end.\n";

/* ---------------------------------------------------------------- BPE */

typedef struct tok {
    char *text; /* byte-level (GPT-2 unicode) text */
} tok;

static tok *vocab;
static int n_vocab;
static char **merges;
static int n_merges;

static void die(const char *msg)
{
    fprintf(stderr, "cb-gen-fixture: %s\n", msg);
    exit(70);
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n);
    if (!p)
        die("out of memory");
    return p;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        die("out of memory");
    return d;
}

static int add_token(const char *text)
{
    vocab = xrealloc(vocab, (size_t)(n_vocab + 1) * sizeof *vocab);
    vocab[n_vocab].text = xstrdup(text);
    return n_vocab++;
}

/* GPT-2's byte -> code point table: printable bytes map to themselves, the
 * rest to 256, 257, ... in byte order. */
static void byte_to_utf8(int b, char out[4])
{
    int cp, k = 0;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[k++] = (char)cp;
    } else {
        out[k++] = (char)(0xC0 | (cp >> 6));
        out[k++] = (char)(0x80 | (cp & 0x3F));
    }
    out[k] = 0;
}

typedef struct word {
    int *ids;
    int n;
    int count;
} word;

static void train_bpe(int want_merges, int byte_base)
{
    word *words = NULL;
    int n_words = 0;
    size_t len = strlen(corpus);

    /* Split into words: a run of letters/digits with the space before it, or a single other byte. */
    for (size_t i = 0; i < len;) {
        size_t j = i;
        if (corpus[j] == ' ')
            j++;
        while (j < len &&
               (((unsigned char)corpus[j] | 32) >= 'a' && ((unsigned char)corpus[j] | 32) <= 'z'))
            j++;
        if (j == i || (j == i + 1 && corpus[i] == ' '))
            j = i + 1;
        int found = -1;
        for (int w = 0; w < n_words; w++) {
            if (words[w].n == (int)(j - i)) {
                int same = 1;
                for (size_t k = 0; k < j - i; k++)
                    same &= words[w].ids[k] == byte_base + (unsigned char)corpus[i + k];
                if (same) {
                    found = w;
                    break;
                }
            }
        }
        if (found >= 0) {
            words[found].count++;
        } else {
            words = xrealloc(words, (size_t)(n_words + 1) * sizeof *words);
            words[n_words].ids = xrealloc(NULL, (j - i) * sizeof(int));
            words[n_words].n = (int)(j - i);
            words[n_words].count = 1;
            for (size_t k = 0; k < j - i; k++)
                words[n_words].ids[k] = byte_base + (unsigned char)corpus[i + k];
            n_words++;
        }
        i = j;
    }

    for (int m = 0; m < want_merges; m++) {
        int best_a = -1, best_b = -1, best_c = 0;
        /* Count every adjacent pair (quadratic, but the corpus is tiny). */
        for (int w = 0; w < n_words; w++) {
            for (int k = 0; k + 1 < words[w].n; k++) {
                int a = words[w].ids[k], b = words[w].ids[k + 1], c = 0;
                for (int w2 = 0; w2 < n_words; w2++)
                    for (int k2 = 0; k2 + 1 < words[w2].n; k2++)
                        if (words[w2].ids[k2] == a && words[w2].ids[k2 + 1] == b)
                            c += words[w2].count;
                if (c > best_c || (c == best_c && (a < best_a || (a == best_a && b < best_b)))) {
                    best_a = a;
                    best_b = b;
                    best_c = c;
                }
            }
        }
        if (best_c < 2)
            break;
        size_t la = strlen(vocab[best_a].text), lb = strlen(vocab[best_b].text);
        char *cat = xrealloc(NULL, la + lb + 1), *mg = xrealloc(NULL, la + lb + 2);
        memcpy(cat, vocab[best_a].text, la);
        memcpy(cat + la, vocab[best_b].text, lb + 1);
        snprintf(mg, la + lb + 2, "%s %s", vocab[best_a].text, vocab[best_b].text);
        int id = add_token(cat);
        free(cat);
        merges = xrealloc(merges, (size_t)(n_merges + 1) * sizeof *merges);
        merges[n_merges++] = mg;
        for (int w = 0; w < n_words; w++) {
            int o = 0;
            for (int k = 0; k < words[w].n; k++) {
                if (k + 1 < words[w].n && words[w].ids[k] == best_a &&
                    words[w].ids[k + 1] == best_b) {
                    words[w].ids[o++] = id;
                    k++;
                } else {
                    words[w].ids[o++] = words[w].ids[k];
                }
            }
            words[w].n = o;
        }
    }
    for (int w = 0; w < n_words; w++)
        free(words[w].ids);
    free(words);
}

/* ------------------------------------------------------------ weights */

static uint64_t rng_state;

static double rnd_uniform(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static float rnd_normal(void)
{
    double u1 = rnd_uniform(), u2 = rnd_uniform();
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static cb_gguf_writer *W;

enum { BIG_ELEMS = 4 << 20, POOL_ROWS = 256 };

/* A pool of quantized rows for one (type, row length, scale, offset). */
typedef struct row_pool {
    cb_type t;
    int64_t ne0;
    float scale, offset;
    size_t rb;
    uint8_t *rows; /* [POOL_ROWS, rb] */
} row_pool;

static row_pool pools[16];
static int n_pools;

typedef struct big_tensor {
    const row_pool *pool;
    uint64_t salt;
} big_tensor;

static const row_pool *get_pool(cb_type t, int64_t ne0, float scale, float offset)
{
    for (int i = 0; i < n_pools; i++)
        if (pools[i].t == t && pools[i].ne0 == ne0 && pools[i].scale == scale &&
            pools[i].offset == offset)
            return &pools[i];
    if (n_pools == (int)(sizeof pools / sizeof pools[0]))
        die("too many row pools");
    row_pool *p = &pools[n_pools++];
    float *f = xrealloc(NULL, (size_t)ne0 * sizeof *f);
    *p = (row_pool){t, ne0, scale, offset, cb_type_row_bytes(t, ne0), NULL};
    p->rows = xrealloc(NULL, p->rb * POOL_ROWS);
    for (int r = 0; r < POOL_ROWS; r++) {
        for (int64_t j = 0; j < ne0; j++)
            f[j] = offset + scale * rnd_normal();
        if (cb_quant_row(t, f, p->rows + (size_t)r * p->rb, ne0) != CB_OK)
            die("quantization failed");
    }
    free(f);
    return p;
}

static int fill_big(void *ctx, int64_t row0, int64_t n, void *dst)
{
    const big_tensor *b = ctx;
    uint8_t *d = dst;
    for (int64_t r = row0; r < row0 + n; r++, d += b->pool->rb) {
        uint64_t h = ((uint64_t)r + 1) * 0x9E3779B97F4A7C15ull ^ b->salt;
        h ^= h >> 29;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 32;
        memcpy(d, b->pool->rows + (size_t)(h % POOL_ROWS) * b->pool->rb, b->pool->rb);
    }
    return 0;
}

static big_tensor *bigs;
static int n_bigs, cap_bigs;

static void add_tensor(const char *name, cb_type t, int64_t ne0, int64_t ne1, float scale,
                       float offset)
{
    int64_t ne[2] = {ne0, ne1};
    size_t n = (size_t)(ne0 * ne1);
    float *f = xrealloc(NULL, n * sizeof *f);
    size_t rb = cb_type_row_bytes(t, ne0);
    uint8_t *q;

    if (rb == 0) {
        fprintf(stderr, "cb-gen-fixture: %s: row of %lld does not fit type %s\n", name,
                (long long)ne0, cb_type_name(t));
        exit(64);
    }
    if (ne0 * ne1 > BIG_ELEMS) {
        if (n_bigs == cap_bigs) /* the tensors keep pointers: allocate once, generously */
            die("too many large tensors");
        big_tensor *b = &bigs[n_bigs++];
        b->pool = get_pool(t, ne0, scale, offset);
        b->salt = (uint64_t)n_bigs * 0xD1B54A32D192ED03ull;
        if (cb_gguf_writer_add_tensor_fn(W, name, t, ne1 == 1 ? 1 : 2, ne, fill_big, b) != CB_OK)
            die("cannot add tensor");
        return;
    }
    for (size_t i = 0; i < n; i++)
        f[i] = offset + scale * rnd_normal();
    q = xrealloc(NULL, rb * (size_t)ne1);
    for (int64_t r = 0; r < ne1; r++)
        if (cb_quant_row(t, f + r * ne0, q + (size_t)r * rb, ne0) != CB_OK)
            die("quantization failed");
    if (cb_gguf_writer_add_tensor(W, name, t, ne1 == 1 ? 1 : 2, ne, q) != CB_OK)
        die("cannot add tensor");
    free(q);
    free(f);
}

static cb_type parse_type(const char *s)
{
    for (int t = 0; t < CB_TYPE_COUNT_; t++) {
        const char *n = cb_type_name((cb_type)t);
        if (n && strcasecmp(n, s) == 0 && cb_type_is_supported((cb_type)t))
            return (cb_type)t;
    }
    fprintf(stderr, "cb-gen-fixture: unsupported tensor type '%s'\n", s);
    exit(64);
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: cb-gen-fixture [--type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_K|q5_K|q6_K]\n"
        "         [--arch llama|qwen2|qwen3|gemma3] [--layers N] [--embd N] [--ff N] [--heads N]\n"
        "         [--kv-heads N] [--head-dim N] [--window N] [--rope-scaling none|linear|llama3|yarn]\n"
        "         [--merges N] [--ctx N] [--vocab N] [--untied] [--seed N] [--vocab-only] OUT.gguf\n"
        "Writes a tiny random-weight model with a real BPE vocabulary.\n"
        "K-quant types need --embd and --ff multiples of 256 (the default then).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"type", required_argument, 0, 'T'},   {"layers", required_argument, 0, 'l'},
        {"embd", required_argument, 0, 'e'},   {"ff", required_argument, 0, 'f'},
        {"heads", required_argument, 0, 'H'},  {"kv-heads", required_argument, 0, 'K'},
        {"merges", required_argument, 0, 'M'}, {"ctx", required_argument, 0, 'c'},
        {"seed", required_argument, 0, 's'},   {"vocab-only", no_argument, 0, 'V'},
        {"arch", required_argument, 0, 'A'},   {"head-dim", required_argument, 0, 'D'},
        {"window", required_argument, 0, 'W'}, {"rope-scaling", required_argument, 0, 'R'},
        {"vocab", required_argument, 0, 'v'},  {"untied", no_argument, 0, 'U'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    cb_type wt = CB_TYPE_F32;
    int layers = 0, embd = 0, ff = 0, heads = 4, kv_heads = 2, want_merges = 200, ctx = 512,
        vocab_only = 0;
    int head_dim = 0, window = 8;
    int want_vocab = 0, untied = 0;
    uint64_t seed = 42;
    const char *arch = "llama", *scaling = "none";
    int c;
    cb_error err;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'T': wt = parse_type(optarg); break;
        case 'l': layers = atoi(optarg); break;
        case 'e': embd = atoi(optarg); break;
        case 'f': ff = atoi(optarg); break;
        case 'H': heads = atoi(optarg); break;
        case 'K': kv_heads = atoi(optarg); break;
        case 'M': want_merges = atoi(optarg); break;
        case 'c': ctx = atoi(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'V': vocab_only = 1; break;
        case 'D': head_dim = atoi(optarg); break;
        case 'W': window = atoi(optarg); break;
        case 'v': want_vocab = atoi(optarg); break;
        case 'U': untied = 1; break;
        case 'A':
            if (strcmp(optarg, "llama") && strcmp(optarg, "qwen2") && strcmp(optarg, "qwen3") &&
                strcmp(optarg, "gemma3")) {
                fprintf(stderr, "cb-gen-fixture: --arch llama, qwen2, qwen3 or gemma3\n");
                return 64;
            }
            arch = optarg;
            break;
        case 'R':
            if (strcmp(optarg, "none") && strcmp(optarg, "linear") && strcmp(optarg, "llama3") &&
                strcmp(optarg, "yarn")) {
                fprintf(stderr, "cb-gen-fixture: --rope-scaling none, linear, llama3 or yarn\n");
                return 64;
            }
            scaling = optarg;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 64;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 64;
    }
    int kq = cb_type_block_elems(wt) == 256;
    if (!embd)
        embd = kq ? 256 : 64;
    if (!ff)
        ff = kq ? 256 : 128;
    int qk_norm = !strcmp(arch, "qwen3") || !strcmp(arch, "gemma3"),
        gemma = !strcmp(arch, "gemma3");
    if (!layers)
        layers = gemma ? 7 : 2;
    if (!head_dim && embd % heads == 0)
        head_dim = qk_norm ? 2 * embd / heads : embd / heads;
    if (layers < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 2 ||
        head_dim % 2 || want_merges < 0 || window < 1) {
        fprintf(stderr, "cb-gen-fixture: inconsistent dimensions\n");
        return 64;
    }
    rng_state = seed;

    add_token("<|endoftext|>");
    add_token("<|im_start|>");
    add_token("<|im_end|>");
    int byte_base = n_vocab;
    for (int b = 0; b < 256; b++) {
        char s[4];
        byte_to_utf8(b, s);
        add_token(s);
    }
    train_bpe(want_merges, byte_base);
    for (int i = 0; n_vocab < want_vocab; i++) {
        char filler[32];
        snprintf(filler, sizeof filler, "<unused%d>", i);
        add_token(filler);
    }

    W = cb_gguf_writer_new(32);
    if (!W)
        die("out of memory");
    const char **texts = xrealloc(NULL, (size_t)n_vocab * sizeof *texts);
    int32_t *types = xrealloc(NULL, (size_t)n_vocab * sizeof *types);
    for (int i = 0; i < n_vocab; i++) {
        texts[i] = vocab[i].text;
        types[i] = i < byte_base                          ? 3 /* control */
                   : strncmp(vocab[i].text, "<unused", 7) ? 1 /* normal */
                                                          : 5;
    }
    int hd = head_dim, dq = heads * hd;
    char k[96];
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, arch), k)
    cb_gguf_writer_set_str(W, "general.architecture", arch);
    cb_gguf_writer_set_str(W, "general.name", "cacheblend tiny test model");
    cb_gguf_writer_set_u32(W, "general.file_type", (uint32_t)wt);
    cb_gguf_writer_set_u32(W, KEY("context_length"), (uint32_t)ctx);
    cb_gguf_writer_set_u32(W, KEY("embedding_length"), (uint32_t)embd);
    cb_gguf_writer_set_u32(W, KEY("block_count"), (uint32_t)layers);
    cb_gguf_writer_set_u32(W, KEY("feed_forward_length"), (uint32_t)ff);
    cb_gguf_writer_set_u32(W, KEY("attention.head_count"), (uint32_t)heads);
    cb_gguf_writer_set_u32(W, KEY("attention.head_count_kv"), (uint32_t)kv_heads);
    cb_gguf_writer_set_u32(W, KEY("rope.dimension_count"), (uint32_t)hd);
    if (hd != embd / heads || embd % heads) {
        cb_gguf_writer_set_u32(W, KEY("attention.key_length"), (uint32_t)hd);
        cb_gguf_writer_set_u32(W, KEY("attention.value_length"), (uint32_t)hd);
    }
    cb_gguf_writer_set_f32(W, KEY("rope.freq_base"), gemma ? 1e6f : 10000.0f);
    if (gemma)
        cb_gguf_writer_set_u32(W, KEY("attention.sliding_window"), (uint32_t)window);
    if (!strcmp(scaling, "linear") || !strcmp(scaling, "yarn")) {
        cb_gguf_writer_set_str(W, KEY("rope.scaling.type"), scaling);
        cb_gguf_writer_set_f32(W, KEY("rope.scaling.factor"), 4.0f);
    }
    cb_gguf_writer_set_f32(W, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    cb_gguf_writer_set_u32(W, KEY("vocab_size"), (uint32_t)n_vocab);
    cb_gguf_writer_set_str(W, "tokenizer.ggml.model", "gpt2");
    cb_gguf_writer_set_str(W, "tokenizer.ggml.pre", "smollm");
    cb_gguf_writer_set_arr_str(W, "tokenizer.ggml.tokens", texts, (uint64_t)n_vocab);
    cb_gguf_writer_set_arr(W, "tokenizer.ggml.token_type", CB_GGUF_INT32, types, (uint64_t)n_vocab);
    cb_gguf_writer_set_arr_str(W, "tokenizer.ggml.merges", (const char *const *)merges,
                               (uint64_t)n_merges);
    cb_gguf_writer_set_u32(W, "tokenizer.ggml.bos_token_id", 1);
    cb_gguf_writer_set_u32(W, "tokenizer.ggml.eos_token_id", 2);
    cb_gguf_writer_set_u32(W, "tokenizer.ggml.unknown_token_id", 0);
    cb_gguf_writer_set_u32(W, "tokenizer.ggml.padding_token_id", 2);
    cb_gguf_writer_set_bool(W, "tokenizer.ggml.add_bos_token", gemma);
    cb_gguf_writer_set_str(
        W, "tokenizer.chat_template",
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}");
    cap_bigs = 8 * layers + 2;
    bigs = xrealloc(NULL, (size_t)cap_bigs * sizeof *bigs);
    if (!vocab_only) {
        char name[64];
        add_tensor("token_embd.weight", wt, embd, n_vocab, 0.5f, 0.0f);
        add_tensor("output_norm.weight", CB_TYPE_F32, embd, 1, 0.1f, 1.0f);
        if (!strcmp(scaling, "llama3")) {
            /* Llama 3.1's frequency factors, as its converter writes them:
             * 1 for wavelengths under orig/high, the factor over orig/low,
             * a smooth blend between */
            const double factor = 8, low = 1, high = 4, orig = 64;
            int64_t ne[1] = {hd / 2};
            float *rf = xrealloc(NULL, sizeof(float) * (size_t)(hd / 2));
            for (int i = 0; i < hd / 2; i++) {
                double freq = pow(10000.0, -2.0 * i / hd), wavelen = 2 * M_PI / freq;
                if (wavelen < orig / high)
                    rf[i] = 1.0f;
                else if (wavelen > orig / low)
                    rf[i] = (float)factor;
                else {
                    double smooth = (orig / wavelen - low) / (high - low);
                    rf[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
                }
            }
            if (cb_gguf_writer_add_tensor(W, "rope_freqs.weight", CB_TYPE_F32, 1, ne, rf) != CB_OK)
                die("cannot add tensor");
            free(rf);
        }
        if (untied)
            add_tensor("output.weight", wt, embd, n_vocab, 0.15f, 0.0f);
        for (int l = 0; l < layers; l++) {
#define T(suffix, t, a, b, scale, off)                \
    snprintf(name, sizeof name, "blk.%d." suffix, l); \
    add_tensor(name, t, a, b, scale, off)
            T("attn_norm.weight", CB_TYPE_F32, embd, 1, 0.1f, 1.0f);
            T("attn_q.weight", wt, embd, dq, 0.15f, 0.0f);
            T("attn_k.weight", wt, embd, kv_heads * hd, 0.15f, 0.0f);
            T("attn_v.weight", wt, embd, kv_heads * hd, 0.15f, 0.0f);
            T("attn_output.weight", wt, dq, embd, 0.15f, 0.0f);
            if (qk_norm) {
                T("attn_q_norm.weight", CB_TYPE_F32, hd, 1, 0.3f, 1.0f);
                T("attn_k_norm.weight", CB_TYPE_F32, hd, 1, 0.3f, 1.0f);
            }
            if (gemma) {
                T("post_attention_norm.weight", CB_TYPE_F32, embd, 1, 0.1f, 1.0f);
                T("post_ffw_norm.weight", CB_TYPE_F32, embd, 1, 0.1f, 1.0f);
            }
            if (!strcmp(arch, "qwen2")) {
                T("attn_q.bias", CB_TYPE_F32, dq, 1, 0.5f, 0.0f);
                T("attn_k.bias", CB_TYPE_F32, kv_heads * hd, 1, 0.5f, 0.0f);
                T("attn_v.bias", CB_TYPE_F32, kv_heads * hd, 1, 0.5f, 0.0f);
            }
            T("ffn_norm.weight", CB_TYPE_F32, embd, 1, 0.1f, 1.0f);
            T("ffn_gate.weight", wt, embd, ff, 0.15f, 0.0f);
            T("ffn_up.weight", wt, embd, ff, 0.15f, 0.0f);
            T("ffn_down.weight", wt, ff, embd, 0.15f, 0.0f);
#undef T
        }
    }
    if (cb_gguf_writer_save(W, argv[optind], &err) != CB_OK) {
        fprintf(stderr, "cb-gen-fixture: %s\n", err.msg);
        return 73;
    }
    cb_gguf_writer_free(W);
    for (int i = 0; i < n_vocab; i++)
        free(vocab[i].text);
    for (int i = 0; i < n_merges; i++)
        free(merges[i]);
    free(vocab);
    free(merges);
    free(texts);
    free(types);
    free(bigs);
    for (int i = 0; i < n_pools; i++)
        free(pools[i].rows);
    return 0;
}
