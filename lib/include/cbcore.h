/* cbcore.h - the public interface of libcbcore, the library behind the cacheblend tools: what a
 * client needs, a line or two each; libcbcore(3) tells the details, the errors and the conventions
 * (opaque handles, cb_<object>_free(NULL) a no-op, a cb_status from what can fail, a cb_error from
 * what creates an object, nothing touched or leaked after an error, never a print or an exit,
 * cb_strview views borrowed).  CB_VERSION_STRING: the release, written once (Makefile reads it). */
#ifndef CBCORE_H
#define CBCORE_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#define CB_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------ core */
typedef enum cb_status {
    CB_OK = 0,
    CB_ERR_NOMEM = -1,       /* out of memory */
    CB_ERR_IO = -2,          /* read or write failed */
    CB_ERR_NOT_FOUND = -3,   /* file (or key, tensor, token) missing */
    CB_ERR_FORMAT = -4,      /* malformed input data: GGUF, JSON, KV file */
    CB_ERR_UNSUPPORTED = -5, /* well-formed but not supported (type, arch) */
    CB_ERR_INVALID = -6,     /* invalid argument from the caller */
    CB_ERR_RANGE = -7,       /* value out of range (token id, index) */
    CB_ERR_CREATE = -8,      /* cannot create an output file */
    CB_ERR_INTERNAL = -9,    /* a bug: an invariant did not hold */
    CB_ERR_CHECKSUM = -10,   /* stored data does not match its checksum */
    CB_ERR_MISMATCH = -11,   /* data made for another model */
    CB_ERR_DEVICE = -12      /* the compute device is not available, or failed (a fault) */
} cb_status;
#define CB_ERROR_MSG_MAX 512
typedef struct cb_error { /* error detail for functions that create objects */
    cb_status status;
    char msg[CB_ERROR_MSG_MAX];
} cb_error;
typedef struct cb_strview { /* a borrowed string, not NUL-terminated */
    const char *data;
    size_t len;
} cb_strview;
const char *cb_strerror(cb_status st); /* "malformed input data", ...; never NULL */
/* Set *err (when not NULL) to st and a printf-formatted message; returns st. */
cb_status cb_error_set(cb_error *err, cb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
double cb_now_ms(void); /* milliseconds on a monotonic clock, for durations */
/* A read-only mapping of a whole file (empty: data NULL).  Errors: _NOT_FOUND, _IO. */
typedef struct cb_mmap {
    const uint8_t *data;
    size_t size;
} cb_mmap;
cb_status cb_mmap_open(cb_mmap *m, const char *path, cb_error *err);
void cb_mmap_close(cb_mmap *m); /* accepts a zeroed or already-closed mapping */
/* size bytes to path atomically (on error as it was; a device, a FIFO: in place). _CREATE, _IO */
cb_status cb_file_write_atomic(const char *path, const void *data, size_t size, cb_error *err);

/* ---------------------------------------------------------- tensor types */
/* clang-format off */
typedef enum cb_type { /* tensor element types, numbered as in GGUF (ggml_type) */
    CB_TYPE_F32 = 0, CB_TYPE_F16 = 1, CB_TYPE_Q4_0 = 2, CB_TYPE_Q4_1 = 3, CB_TYPE_Q5_0 = 6,
    CB_TYPE_Q5_1 = 7, CB_TYPE_Q8_0 = 8, CB_TYPE_Q8_1 = 9, CB_TYPE_Q2_K = 10, CB_TYPE_Q3_K = 11,
    CB_TYPE_Q4_K = 12, CB_TYPE_Q5_K = 13, CB_TYPE_Q6_K = 14, CB_TYPE_Q8_K = 15,
    CB_TYPE_IQ2_XXS = 16, CB_TYPE_IQ2_XS = 17, CB_TYPE_IQ3_XXS = 18, CB_TYPE_IQ1_S = 19,
    CB_TYPE_IQ4_NL = 20, CB_TYPE_IQ3_S = 21, CB_TYPE_IQ2_S = 22, CB_TYPE_IQ4_XS = 23,
    CB_TYPE_I8 = 24, CB_TYPE_I16 = 25, CB_TYPE_I32 = 26, CB_TYPE_I64 = 27, CB_TYPE_F64 = 28,
    CB_TYPE_IQ1_M = 29, CB_TYPE_BF16 = 30, CB_TYPE_TQ1_0 = 34, CB_TYPE_TQ2_0 = 35,
    CB_TYPE_COUNT_ = 40,
    CB_TYPE_KIVI4 = 1024, CB_TYPE_CODED = 1025 /* KV files' coded types (cbkv(5)), not tensors */
} cb_type;
/* clang-format on */
const char *cb_type_name(cb_type t);            /* as GGUF tools print it ("q4_K"); NULL: unknown */
size_t cb_type_row_bytes(cb_type t, int64_t n); /* 0: unknown, or n not whole blocks */

/* ------------------------------------------------------- GGUF, tokenizer */
typedef struct cb_gguf cb_gguf;
/* Map a GGUF file (version 2 or 3) and validate all of it; nothing outside it is read. */
cb_status cb_gguf_open(cb_gguf **out, const char *path, cb_error *err);
void cb_gguf_free(cb_gguf *g);
typedef struct cb_vocab cb_vocab;
typedef enum cb_vocab_kind {
    CB_VOCAB_BPE = 1, /* tokenizer.ggml.model "gpt2": byte-level BPE */
    CB_VOCAB_SPM = 2  /* "llama": SentencePiece-style BPE with byte fallback */
} cb_vocab_kind;
/* The tokenizer a GGUF's tokenizer.ggml.* metadata describes (g may be freed after). */
cb_status cb_vocab_load(cb_vocab **out, const cb_gguf *g, cb_error *err);
void cb_vocab_free(cb_vocab *v);
cb_vocab_kind cb_vocab_kind_of(const cb_vocab *v);
int32_t cb_vocab_n_tokens(const cb_vocab *v);
const char *cb_vocab_pre(const cb_vocab *v); /* tokenizer.ggml.pre, or "default" */
typedef struct cb_tokens {
    int32_t *ids;
    size_t n, cap;
} cb_tokens;
void cb_tokens_free(cb_tokens *t); /* frees ids and zeroes the struct */
cb_status cb_tokens_push(cb_tokens *t, int32_t id);
enum { CB_TOK_ADD_SPECIAL = 1 << 0, CB_TOK_PARSE_SPECIAL = 1 << 1 }; /* BOS/EOS, control tokens */
/* Tokenize len bytes of text, appending to *out, exactly as llama.cpp's llama_tokenize. */
cb_status cb_tok_encode(const cb_vocab *v, const char *text, size_t len, unsigned flags,
                        cb_tokens *out);
enum { CB_DETOK_REMOVE_SPECIAL = 1 << 0, CB_DETOK_UNPARSE_SPECIAL = 1 << 1 }; /* libcbcore(3) */
/* Detokenize n ids into a malloc'd NUL-terminated *text (*len bytes), as llama_detokenize. */
cb_status cb_tok_decode(const cb_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                        char **text, size_t *len);

/* ------------------------------------------------------------- hashing */
/* 128-bit digest (XXH3-128), printed as 32 lowercase hex digits. */
typedef struct cb_hash128 {
    uint64_t lo, hi;
} cb_hash128;
/* hex[33]: 32 hex digits (hi then lo, as XXH128_canonical) and a NUL, and back. */
void cb_hash128_hex(cb_hash128 h, char hex[33]);
cb_status cb_hash128_parse(const char *hex, cb_hash128 *out);
cb_status cb_gguf_fingerprint(const cb_gguf *g, cb_hash128 *out); /* model, tokenizer, tensors */

/* ----------------------------------------------------------------- model */
typedef struct cb_model cb_model;
/* Architecture parameters read from GGUF metadata. */
typedef struct cb_hparams {
    char arch[32]; /* "llama", "qwen2", "qwen3", "gemma3" */
    int32_t n_layer, n_embd, n_head, n_head_kv;
    int32_t head_dim; /* per head, for Q, K and V */
    int32_t n_ff, n_vocab, n_ctx_train;
    int32_t n_rot; /* RoPE dimensions per head */
    float rope_base, norm_eps;
    int rope_neox;    /* 0: pairs (2i, 2i+1) (llama); 1: (i, i+n_rot/2) (qwen2, qwen3, gemma3) */
    int tied_output;  /* output projection is token_embd */
    float rope_scale; /* linear RoPE scaling factor of the global layers (1: none) */
    int rope_freqs;   /* 1: per-pair RoPE frequency factors (Llama 3's rope_freqs) */
    int32_t n_swa, n_swa_layers; /* gemma3's sliding window (0: none), the layers using it */
    float rope_base_swa;         /* RoPE base of the sliding-window layers */
} cb_hparams;
typedef struct cb_model_params {
    int n_threads;        /* <= 0: every core */
    const char *device;   /* "cpu" (also NULL, ""), "cuda", "cuda:N", or "auto" */
    int exact;            /* 1: f32 activations in every product (libcbcore(3)) */
    const char *fp_cache; /* a directory remembering fingerprints; NULL: none */
} cb_model_params;
/* Load a model (llama, qwen2, qwen3, gemma3) onto p->device (p may be NULL). */
cb_status cb_model_load(cb_model **out, const char *path, const cb_model_params *p, cb_error *err);
void cb_model_free(cb_model *m);
const cb_hparams *cb_model_hparams(const cb_model *m);
const cb_vocab *cb_model_vocab(const cb_model *m);
cb_hash128 cb_model_fingerprint(const cb_model *m);
const char *cb_model_backend(const cb_model *m);  /* "cpu", "cuda" */
const char *cb_model_device(const cb_model *m);   /* described: "cpu (2 threads)" */
const char *cb_model_features(const cb_model *m); /* the CUDA features on, off (cb-run(1)) */
cb_status cb_model_sync(const cb_model *m); /* wait for this thread's device work: its fault */
const char *cb_model_strerror(const cb_model *m, cb_status st); /* st's text; a fault's own */

/* ------------------------------------------------- KV cache, forward pass */
typedef struct cb_kvcache cb_kvcache; /* per layer, K and V rows by position, f16 or f32 */
cb_status cb_kvcache_new(cb_kvcache **out, const cb_model *m, int32_t n_ctx, cb_type type);
uint64_t cb_kvcache_bytes(const cb_model *m, int32_t n_ctx, cb_type type); /* its K and V */
void cb_kvcache_free(cb_kvcache *kv);
typedef struct cb_fwd cb_fwd; /* the activations of up to n_max tokens, layer by layer */
cb_status cb_fwd_new(cb_fwd **out, const cb_model *m, int32_t n_max);
uint64_t cb_fwd_bytes(const cb_model *m, int32_t n_max); /* what cb_fwd_new allocates */
void cb_fwd_free(cb_fwd *f);
/* Tokens -> hidden rows 0..n-1 at positions pos. */
cb_status cb_fwd_embed(cb_fwd *f, const int32_t *tokens, const int32_t *pos, int32_t n);
/* One layer for rows (NULL: all): K/V into the cache, causal attention, MLP. */
cb_status cb_fwd_layer(cb_fwd *f, cb_kvcache *kv, int32_t layer, const int32_t *rows,
                       int32_t n_rows);

/* ------------------------------------------------------------- KV files */
/* A KV file's header (cbkv(5)): the model, shape, RoPE and how K was placed. */
typedef struct cb_kv_meta {
    cb_hash128 model;  /* fingerprint */
    cb_hash128 tokens; /* hash of the lead-in and the token ids */
    int32_t n_layer, n_head_kv, head_dim, n_rot, rope_neox;
    float rope_base;
    cb_type type;                   /* F16, F32, BF16, Q8_0, KIVI4 or CODED */
    int32_t n_tokens, pos0, n_lead; /* K of token i is at position pos0 + i, after n_lead */
    uint32_t flags;                 /* bit 0: global layers' RoPE frequencies divided */
    const int32_t *ids, *lead;      /* [n_tokens], [n_lead] (borrowed from the file handle) */
    const int32_t *window;          /* [n_layer] each layer's sliding window, 0: global */
    const float *layer_rope_base;   /* [n_layer] the RoPE base each layer's K was rotated with */
} cb_kv_meta;
void cb_kv_key(cb_hash128 model, cb_hash128 tokens, char key[66]); /* "<model>-<tokens>" */
cb_status cb_kv_lead_in(const cb_model *m, cb_tokens *out);        /* appends a chunk's lead-in */
/* Prefill lead + ids alone; the chunk's rows as a KV file in a malloc'd *buf. */
cb_status cb_kv_precompute(cb_fwd *f, cb_kvcache *kv, const int32_t *lead, int32_t n_lead,
                           const int32_t *ids, int32_t n, cb_type type, void **buf, size_t *size);
typedef struct cb_kvfile cb_kvfile;
/* Open a KV file and verify its header (layers are verified when read). */
cb_status cb_kvfile_open(cb_kvfile **out, const char *path, cb_error *err);
void cb_kvfile_free(cb_kvfile *f);
const cb_kv_meta *cb_kvfile_meta(const cb_kvfile *f);
/* Place layer l, verified, in rows pos.. of kv as cb-run's loader does (rows of the cache's
 * type sent as they are, K moved there). */
cb_status cb_kvfile_load_layer(cb_kvfile *f, int32_t l, cb_kvcache *kv, int32_t pos, cb_error *err);
uint64_t cb_kvfile_size(const cb_kvfile *f);
cb_status cb_kv_type_parse(const char *name, cb_type *out); /* "q8_0": one a KV file holds */

/* ------------------------------------------------------------- blending */
/* A run of prompt tokens at consecutive positions; with a KV file, its cache. */
typedef struct cb_segment {
    const int32_t *ids;
    int32_t n;
    cb_kvfile *kv; /* NULL: no cache, always computed */
} cb_segment;
typedef enum cb_blend_mode {
    CB_MODE_FULL = 0, /* ordinary prefill, caches ignored */
    CB_MODE_PREFIX,   /* reuse the leading cached segment only (after its lead-in) */
    CB_MODE_REUSE,    /* full KV reuse: every cache moved to its position, no recompute */
    CB_MODE_BLEND     /* CacheBlend: reuse + selective recompute */
} cb_blend_mode;
/* Which cached tokens blending recomputes (libcbcore(3)). */
typedef enum cb_blend_strategy {
    CB_STRATEGY_HKVD = 0, /* those whose KV deviates most at the check layer */
    CB_STRATEGY_SINK,     /* HKVD plus the first tokens of every cached segment */
    CB_STRATEGY_QUERY,    /* those the last segment attends to most */
    CB_STRATEGY_PROBE,    /* after ProphetKV: attention summed over the first layers */
    CB_STRATEGY_RUNS,     /* after CacheClip: HKVD anchors and the token after each */
    CB_STRATEGY_AUTO,     /* PROBE, or HKVD where the budget is under 3x the uncached rows */
    CB_STRATEGY_RANDOM    /* a control: the ratio's share drawn at random, computed as PROBE's */
} cb_blend_strategy;
#define CB_BLEND_MAX_STEPS 8
/* The --speedup cost model's figures against a multiply-add of the products with the weights:
 * placing a cached KV byte, an attention multiply-add; scoring a key against attending it. */
typedef struct cb_blend_costs {
    float load, attn, score;
} cb_blend_costs;
/* Blending's parameters; libcbcore(3) tells each field. */
typedef struct cb_blend_params {
    cb_blend_mode mode;
    cb_blend_strategy strategy;
    int32_t check_layer;               /* first check layer (default 1) */
    int32_t n_ratios;                  /* 1: one check layer; more: gradual filtering */
    float ratios[CB_BLEND_MAX_STEPS];  /* share of cached tokens kept at check layer + i */
    int deviation_v;                   /* 0: deviation of K (after RoPE), 1: of V */
    int32_t sink_tokens;               /* CB_STRATEGY_SINK: tokens per segment (default 4) */
    int sequential_load, load_threads; /* 1: load every layer before computing; readers, 0: auto */
    double load_limit_mbs;             /* > 0: throttle KV reads to this many MB/s */
    float adapt_mass, adapt_min, adapt_max; /* probe, mass > 0: the ratio holding that share */
    int32_t probe_rows, probe_values;       /* probe: the question's last rows (0: all); 1: x |V| */
    int32_t probe_passages;                 /* probe: the top segments recomputed whole first */
    float probe_depth, stale_scale;         /* probe layers, 0: by cost; stale x, 0: the model's */
    float key_temp, speedup; /* keys / key_temp, 0: the model's; > 0: the ratio by cost, 0: given */
    int ratio_auto;       /* 1: the loading controller's ratio, ratios[0] the least (no speedup) */
    cb_blend_costs costs; /* the cost model's figures (a profile's); 0 each: the built-in */
} cb_blend_params;
cb_blend_params cb_blend_defaults(void); /* blend, auto, speedup 4, ratio >= 0.15, V */
typedef struct cb_blend_stats {
    int32_t n_prompt_tokens;
    int32_t n_cached_tokens, n_exact_tokens; /* KV from a cache; of those, a true prefix's */
    int32_t n_recomputed_tokens;             /* cached tokens recomputed at the last check layer */
    int32_t n_selected[CB_BLEND_MAX_STEPS];  /* cached tokens kept at each check layer */
    float ratio, selected_mass;              /* the ratio used; probe: the attention share kept */
    int32_t probe_layers, strategy;          /* probe's first-pass layers; the strategy run */
    const char *ratio_bound; /* "given"; mass: "mass", "min", "max"; speedup: "speedup", "min" */
    float key_temp, pred_speedup, stale_scale; /* used (else 1); blend: blend_cost's; used */
    double load_ms, recompute_ms;              /* loading cached KV; computing (stalls excluded) */
    double overlapped_ms, stall_ms;            /* loading hidden; computing waiting for a layer */
    uint64_t load_bytes;                       /* KV bytes read from files */
    double prefill_ms;                         /* all of it, to the logits */
    int32_t failed_segment, load_threads; /* the segment whose cache failed, else -1; readers */
    const char *stall_clock; /* stall_ms: "device" (the device's events), "host" (its clock) */
    float plan_ratio;        /* the plan, before any layer: its ratio, and why (as ratio_bound) */
    const char *plan_bound;
    cb_blend_costs costs; /* its figures; costs_given bit i: figure i was p's, else built-in */
    int costs_given;
    float pred_load, pred_recompute; /* ratio_auto (bound "load" or "min"): of full prefill's */
} cb_blend_stats;
/* Build a prompt's KV cache from segments in p's mode; the last position's logits. */
cb_status cb_blend_prefill(cb_fwd *f, cb_kvcache *kv, const cb_segment *segs, int32_t n_segs,
                           const cb_blend_params *p, float *logits, cb_blend_stats *stats,
                           cb_error *err);

/* ------------------------------------------------- profile and controller */
typedef struct cb_profile cb_profile; /* one model's speeds on one backend (cb-profile(1)) */
#define CB_PROFILE_MAX 64
typedef struct cb_profile_point {
    int64_t length;              /* prompt tokens */
    double ratio;                /* recompute ratio; 1 for full prefill */
    double ms_per_layer, spread; /* median, (max - min) / median of the repeats */
} cb_profile_point;
typedef struct cb_profile_tier {
    char name[64];
    double warm_mbs, cold_mbs; /* KV read throughput, page cache warm / dropped */
} cb_profile_tier;
typedef struct cb_profile_scoring { /* probe's scoring: the last rows' mass over the prompt */
    int64_t length, rows, keys;     /* prompt tokens; its last rows; the (row, key) pairs seen */
    double ms_per_layer, spread;    /* median, (max - min) / median of the repeats */
} cb_profile_scoring;
struct cb_profile {
    char model[33], backend[32];
    int32_t n_layer, threads;
    double kv_bytes_per_token[4]; /* f32, f16, bf16, q8_0 files */
    int n_prefill, n_recompute, n_tiers;
    int n_scoring; /* probe's scoring steps measured; 0: none (the built-in score) */
    cb_profile_point prefill[CB_PROFILE_MAX];
    cb_profile_point recompute[CB_PROFILE_MAX * 8];
    cb_profile_tier tiers[16];
    cb_blend_costs costs; /* derived (cb_profile_fit_costs); 0 each: not measured */
    cb_profile_scoring scoring[CB_PROFILE_MAX];
};
cb_status cb_profile_to_json(const cb_profile *p, char **json); /* malloc'd */
/* The cost model's figures from p's prefill, first tier and scoring on model m, into p->costs. */
void cb_profile_fit_costs(cb_profile *p, const cb_model *m);
/* Probe's scoring step timed after a full prefill of L tokens: ms[repeat], *keys (profile.c). */
cb_status cb_profile_time_score(cb_fwd *f, cb_kvcache *kv, int32_t layer, int32_t L, int32_t n,
                                int repeat, double *ms, int64_t *keys);
/* Predicted ms to load L tokens of KV from a tier (cold: page cache dropped); -1: unmeasured. */
double cb_profile_load_ms(const cb_profile *p, const char *tier, int64_t L, cb_type t, int cold);

/* ---------------------------------------------------------------- store */
/* A tiered store of KV files (cb-store(5)) for many processes; a handle for one thread. */
typedef struct cb_store cb_store;
#define CB_STORE_MAX_TIERS 8
#define CB_STORE_KEY_LEN 65                            /* strlen of a key */
const char *cb_store_default_dir(char *buf, size_t n); /* $CB_STORE, or under the cache */
/* One tier as given to cb_store_init and reported by cb_store_tier_info. */
typedef struct cb_store_tier {
    const char *name;      /* 1..32 of [A-Za-z0-9_.-], unique in the store */
    const char *path;      /* directory; relative paths are relative to the store */
    uint64_t capacity;     /* bytes; 0 = unlimited */
    double cost;           /* relative cost of a byte (placement); 0: n_tiers - index */
    const char *url;       /* the shared tier: redis://HOST[:PORT][/DB] or unix:///PATH */
    int timeout_ms;        /* the shared tier's time-out (0: 1000; $CB_STORE_TIMEOUT_MS) */
    const char *auth_file; /* the shared tier's Redis password file ($CB_REDIS_AUTH_FILE) */
    const char *key_file;  /* the shared tier's key (cb_store_keygen; $CB_TIER_KEY_FILE) */
} cb_store_tier;
cb_status cb_store_keygen(const char *path, cb_error *err); /* a new tier key file, 0600 */
/* Create a store, tiers fastest first (NULL, 0: one "main"); promote_hits < 0: 2. */
cb_status cb_store_init(const char *dir, const cb_store_tier *tiers, int n_tiers, int promote_hits,
                        cb_error *err);
/* Open a store (create: make a missing one); read-only by itself where it cannot write. */
cb_status cb_store_open(cb_store **out, const char *dir, int create, cb_error *err);
int cb_store_readonly(const cb_store *s); /* 1: nothing is written; writes fail */
void cb_store_close(cb_store *s);         /* acquired references stay valid */
/* The directory, the tiers (0 = fastest) and the promotion threshold, borrowed. */
const char *cb_store_dir(const cb_store *s);
int cb_store_n_tiers(const cb_store *s);
cb_status cb_store_tier_info(const cb_store *s, int i, cb_store_tier *out);
int cb_store_promote_hits(const cb_store *s);
cb_status cb_store_lookup(cb_store *s, const char *key, int *found); /* records no access */
/* Add a KV file's bytes under key (NULL: the file's), verified; an existing key stays. */
cb_status cb_store_put(cb_store *s, const char *key, const void *data, size_t size, cb_error *err);
/* Verify and put the KV file at path; its key, and *existed (both may be NULL). */
cb_status cb_store_put_file(cb_store *s, const char *path, char key[66], int *existed,
                            cb_error *err);
/* Open an entry for reading (an access): its file stays until cb_store_release. */
typedef struct cb_store_ref cb_store_ref;
cb_status cb_store_acquire(cb_store *s, const char *key, cb_store_ref **ref, const char **path,
                           cb_error *err);
void cb_store_release(cb_store_ref *ref); /* independent of its store handle */
/* cb_store_acquire then cb_kvfile_open; streams an entry only the shared tier holds. */
cb_status cb_store_open_kv(cb_store *s, const char *key, cb_kvfile **kf, cb_store_ref **ref,
                           cb_error *err);
/* Remove an entry (a file in use goes when released); pin one: never moved or evicted. */
cb_status cb_store_remove(cb_store *s, const char *key, cb_error *err);
cb_status cb_store_pin(cb_store *s, const char *key, int pinned, cb_error *err);
/* One entry as cb_store_list reports it; strings borrowed for the call. */
typedef struct cb_store_entry {
    const char *key, *model, *tier, *path; /* model: its fingerprint; path: the file */
    const char *checksum;                  /* XXH3-128 of the whole file */
    uint64_t bytes;
    int64_t n_tokens;
    int64_t created_us, last_access_us; /* Unix time in microseconds */
    uint64_t hits;
    int pinned;
} cb_store_entry;
/* fn for every entry (of model, tier when not NULL), by tier, recent first; nonzero stops. */
cb_status cb_store_list(cb_store *s, const char *model, const char *tier,
                        int (*fn)(void *ctx, const cb_store_entry *e), void *ctx, cb_error *err);
typedef struct cb_store_tier_stat {
    const char *name, *path; /* borrowed from the handle */
    uint64_t capacity;       /* 0 = unlimited */
    uint64_t entries, bytes; /* stored entries and their bytes */
    uint64_t reserved;       /* bytes being written, or removed but still read */
    uint64_t pinned, hits;   /* pinned entries; accesses served since the store was made */
    uint64_t healed, full;   /* by this handle: bad entries dropped when read; puts sent on */
} cb_store_tier_stat;
/* Fill stats[0..cb_store_n_tiers) and *misses (may be NULL). */
cb_status cb_store_stat(cb_store *s, cb_store_tier_stat *stats, uint64_t *misses, cb_error *err);
typedef struct cb_store_kv_stat { /* the local tiers' entries of one model and element type */
    char model[33];               /* its fingerprint, as the index has it */
    int type;                     /* a cb_type; -1: entries whose header cannot be read */
    uint64_t entries, tokens, bytes;
} cb_store_kv_stat;
/* Per model and KV element type (from each entry's header): *out malloc'd, *n of them. */
cb_status cb_store_stat_kv(cb_store *s, cb_store_kv_stat **out, size_t *n, cb_error *err);
typedef struct cb_store_recode_report {
    uint64_t total, done, recoded,
        already;                        /* entries to look at, looked at, rewritten, of type t */
    uint64_t busy, no_room, bad;        /* left: in use or changed; no room to grow; unreadable */
    uint64_t bytes_before, bytes_after; /* of those rewritten */
} cb_store_recode_report;
/* Called after each entry (msg: why it was left, else NULL); nonzero stops the recode. */
typedef int (*cb_store_recode_fn)(void *ctx, const cb_store_recode_report *r, const char *key,
                                  const char *msg);
/* Rewrite the entries of tier (NULL: every local one) in type t, each atomically; a rerun resumes. */
cb_status cb_store_recode(cb_store *s, const char *tier, cb_type t, cb_store_recode_fn fn,
                          void *ctx, cb_store_recode_report *rep, cb_error *err);
/* The shared tier (Redis, behind the local ones): its warnings, figures, name (NULL: none). */
void cb_store_set_warn(cb_store *s, void (*warn)(void *ctx, const char *msg), void *ctx);
cb_status cb_store_shared_stat(cb_store *s, cb_store_tier_stat *out, cb_error *err);
const char *cb_store_shared_name(const cb_store *s);
/* How the shared tier is secured, as this handle uses it. */
typedef struct cb_store_shared_auth {
    int authenticated;           /* 1: a tier key (every entry sealed), the login not refused */
    char key_id[17];             /* the tier key's id (16 hex digits), "" without one */
    char user[128];              /* the Redis ACL user, "" for none */
    int password, login_refused; /* 1: it logs in with a password; 1: refused (tier unused) */
    int read_only;               /* 1: the server refused this user a write (NOPERM) */
    uint64_t n_refused;          /* entries refused: no MAC, another key's, or a bad one */
    uint64_t n_resealed;         /* older entries (parts in clear) read and rewritten sealed */
} cb_store_shared_auth;
cb_status cb_store_shared_auth_info(cb_store *s, cb_store_shared_auth *out, cb_error *err);
/* Drop an entry from the shared tier (for every store using it). */
cb_status cb_store_shared_drop(cb_store *s, const char *key, cb_error *err);
typedef struct cb_store_gc_report {
    uint64_t demoted, evicted; /* entries moved down a tier; deleted from the last */
    uint64_t orphans, temps;   /* files of removed or unindexed entries; dead processes' temps */
    uint64_t stale, busy;      /* index entries without a file; entries kept over capacity */
} cb_store_gc_report;
/* Enforce capacities, delete what dead processes and removals left (rep may be NULL). */
cb_status cb_store_gc(cb_store *s, cb_store_gc_report *rep, cb_error *err);
typedef struct cb_store_verify_report {
    uint64_t entries, files, bytes;         /* index entries, files and bytes checked */
    uint64_t problems, repaired, remaining; /* inconsistencies found, fixed, left */
} cb_store_verify_report;
/* Check every entry and file (problems to problem); repair rebuilds the index.  CB_OK only
 * when the store is (now) consistent, else CB_ERR_FORMAT. */
cb_status cb_store_verify(cb_store *s, int repair,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          cb_store_verify_report *rep, cb_error *err);
cb_status cb_store_reset_index(const char *dir, cb_error *err); /* a new, empty index */
/* clang-format off */
typedef enum cb_store_compress { /* AUTO: from the archive's name, else zstd */
    CB_STORE_COMPRESS_AUTO = 0, CB_STORE_COMPRESS_NONE, CB_STORE_COMPRESS_GZIP,
    CB_STORE_COMPRESS_XZ, CB_STORE_COMPRESS_ZSTD
} cb_store_compress;
/* clang-format on */
/* keys[0..n_keys) (0: all) as a tar of "<key>.kv" files to path (NULL: to fd). */
cb_status cb_store_export(cb_store *s, const char *path, int fd, const char *const *keys,
                          size_t n_keys, cb_store_compress compress, uint64_t *n_out,
                          cb_error *err);
typedef struct cb_store_import_report {
    uint64_t imported, existed; /* new entries; those already stored */
    uint64_t rejected, skipped; /* entries refused (passed to problem); directories */
} cb_store_import_report;
/* Import an archive from path (NULL: fd), each entry verified, those refused to problem. */
cb_status cb_store_import(cb_store *s, const char *path, int fd,
                          void (*problem)(void *ctx, const char *what, const char *msg), void *ctx,
                          cb_store_import_report *rep, cb_error *err);
/* The profile of (model, backend) kept in the store, and p saved as its own. */
cb_status cb_store_profile_load(const cb_store *s, cb_hash128 model, const char *backend,
                                cb_profile *p, cb_error *err);
cb_status cb_store_profile_save(const cb_store *s, const cb_profile *p, char *path, size_t path_n,
                                cb_error *err);
/* The cheapest tier loading L tokens no slower than recomputing ratio (-1: none measured). */
int cb_store_place(const cb_store *s, const cb_profile *p, double ratio, int64_t L, cb_type t,
                   double *pred_load, double *pred_recompute);

/* --------------------------------------------------------------- chunker */
typedef struct cb_chunker cb_chunker; /* splits documents (the rules: cb-chunk(1)) */
#define CB_CHUNK_DEFAULT_TOKENS 512
#define CB_CHUNK_DEFAULT_CHARS 2048
typedef struct cb_chunker_params {
    const cb_vocab *vocab; /* borrowed, must outlive the chunker; NULL: characters */
    int32_t max;           /* tokens or characters per chunk; 0: no limit */
    int32_t overlap;       /* tokens or characters repeated; 0 <= overlap < max */
    const char *separator; /* PCRE2 pattern (UTF, multi-line); NULL or "": none */
} cb_chunker_params;
typedef struct cb_chunk {
    size_t start, end; /* byte span in the document */
    int32_t n_tokens;  /* tokens of the text alone; -1 without a vocabulary */
    char id[33];       /* XXH3-128 of the chunk's bytes, in hex */
} cb_chunk;
/* A growable array of chunks; cb_chunks_free frees v and zeroes the struct. */
typedef struct cb_chunks {
    cb_chunk *v;
    size_t n, cap;
} cb_chunks;
void cb_chunks_free(cb_chunks *c);
cb_status cb_chunker_new(cb_chunker **out, const cb_chunker_params *p, cb_error *err);
void cb_chunker_free(cb_chunker *c);
/* Split len bytes of valid UTF-8, appending to *out; one chunker per thread. */
cb_status cb_chunker_split(cb_chunker *c, const char *text, size_t len, cb_chunks *out);
size_t cb_utf8_check(const char *s, size_t n); /* offset of the first invalid byte, or n */
/* s[0..n) copied to a malloc'd *out, each bad subsequence U+FFFD (counted in *n_bad). */
cb_status cb_utf8_repair(const char *s, size_t n, char **out, size_t *out_len, size_t *n_bad);

/* ------------------------------------------------------------ generation */
typedef struct cb_sampler_params {
    float temp;         /* <= 0: greedy (argmax, lowest id on ties) */
    int32_t top_k;      /* <= 0: off */
    float top_p, min_p; /* >= 1: off; <= 0: off */
    uint64_t seed;
} cb_sampler_params;
cb_sampler_params cb_sampler_defaults(void); /* temp 0.8, top_k 40, top_p 0.95, min_p 0.05 */
typedef enum cb_chat_kind {
    CB_CHAT_NONE = 0, /* no template: the text is used as is */
    CB_CHAT_CHATML,   /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen2) */
    CB_CHAT_LLAMA3,   /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CB_CHAT_MISTRAL,  /* [INST] ... [/INST] (Mistral, Llama 2) */
    CB_CHAT_GEMMA     /* <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n */
} cb_chat_kind;
const char *cb_chat_name(cb_chat_kind k);
typedef struct cb_gen_params {
    cb_sampler_params sp;
    int32_t n_predict;        /* at most this many tokens */
    const char *const *stops; /* stop strings (not emitted): n_stops of them */
    int n_stops;
} cb_gen_params;
typedef struct cb_gen_result {
    int32_t n_gen;    /* tokens generated, the end-of-generation token not counted */
    double first_ms;  /* from t0 to the first sampled token (cb_now_ms) */
    const char *stop; /* why it ended: "eog", "stop", "length" or "context" */
} cb_gen_result;
/* Generate after a prefill of pos tokens (last logits in logits), text handed to emit. */
cb_status cb_generate(cb_fwd *f, cb_kvcache *kv, float *logits, int32_t pos, const cb_gen_params *p,
                      cb_status (*emit)(void *ctx, const char *text, size_t n), void *ctx,
                      double t0, cb_gen_result *res);
/* The teacher-forced score of a continuation after a prefill. */
typedef struct cb_score_result {
    double nll;       /* mean negative log-likelihood per token (nats) */
    int32_t n_tokens; /* tokens scored */
    double top1;      /* fraction of them that were the argmax */
} cb_score_result;
/* Score cont[0..n) after a prefill of pos tokens (f: n - 1 rows; kv: pos + n - 1). */
cb_status cb_score(cb_fwd *f, cb_kvcache *kv, const float *logits, int32_t pos, const int32_t *cont,
                   int32_t n, cb_score_result *res);
/* KL(p || q) of the softmaxes of two logit vectors; *top1: argmaxes agree. */
double cb_logits_kl(const float *lp, const float *lq, int32_t n, int *top1);

/* --------------------------------------------------------------- prompts */
typedef struct cb_prompt cb_prompt; /* a RAG prompt of token ids, one segment a chunk */
/* system (NULL: the template's default; "": none) and question templated unless raw. */
cb_status cb_prompt_build(cb_prompt **out, const cb_model *m, const char *system, int raw,
                          const cb_strview *chunks, size_t n_chunks, const char *question,
                          size_t len, cb_error *err);
/* A chunk of a prompt: its text, or (text.data NULL) the key of its KV file; both: the key names
 * the cache tried first (cb-precompute --neighbours' "kv").  Keys need s (prompt.h has the rest). */
typedef struct cb_chunk_src {
    cb_strview text;
    const char *key;
} cb_chunk_src;
cb_status cb_prompt_build_from(cb_prompt **out, const cb_model *m, cb_store *s, const char *system,
                               int raw, const cb_chunk_src *chunks, size_t n_chunks,
                               const char *question, size_t len, cb_error *err);
void cb_prompt_free(cb_prompt *p);
/* Its segments (for cb_blend_prefill), tokens, chunks, chunks without a cache, template. */
const cb_segment *cb_prompt_segments(const cb_prompt *p, int32_t *n);
int64_t cb_prompt_n_tokens(const cb_prompt *p);
int cb_prompt_n_chunks(const cb_prompt *p);
int cb_prompt_n_missing(const cb_prompt *p);
int cb_prompt_n_after(const cb_prompt *p);  /* chunks cached after the chunk before them */
int cb_prompt_n_own(const cb_prompt *p);    /* ... after its own head (cb_precomputer_system) */
int cb_prompt_n_named(const cb_prompt *p);  /* ... as their record's "kv" named (--neighbours) */
int cb_prompt_n_middle(const cb_prompt *p); /* ... after a passage, not first (--middle) */
cb_chat_kind cb_prompt_chat(const cb_prompt *p);
void cb_prompt_use_context(cb_prompt *p, int use); /* 0: attach takes chunks' own caches only */
/* Find and check each chunk's cache in s (unusable ones to warn), acquired until freed. */
void cb_prompt_attach(cb_prompt *p, cb_store *s, void (*warn)(void *, const char *), void *ctx);
/* bp set to the loading controller's ratio (>= r_min), loading priced by the profile for the
 * slowest tier holding a cache of p; CB_ERR_NOT_FOUND: no such figure, bp's own kept. */
typedef struct cb_ratio_choice {
    int64_t n_cached; /* tokens whose KV comes from the caches */
    char tier[64];    /* the slowest tier holding one, as the profile measured it; "": none */
} cb_ratio_choice;
cb_status cb_prompt_auto_ratio(const cb_prompt *p, const cb_store *s, const cb_model *m,
                               double r_min, cb_blend_params *bp, cb_ratio_choice *out,
                               cb_error *err);
/* cb_blend_prefill of the prompt; a cache failing while read is computed instead. */
cb_status cb_prompt_prefill(cb_prompt *p, cb_store *s, cb_fwd *f, cb_kvcache *kv,
                            const cb_blend_params *bp, float *logits, cb_blend_stats *stats,
                            void (*warn)(void *ctx, const char *msg), void *ctx, cb_error *err);
/* Keep the caches streamed from the shared tier; compute and store the missing ones, head too. */
void cb_prompt_keep(cb_prompt *p, cb_store *s, void (*warn)(void *ctx, const char *msg), void *ctx);
cb_status cb_prompt_store_missing(cb_prompt *p, cb_store *s, cb_type type, int *n_stored,
                                  void (*warn)(void *ctx, const char *msg), void *ctx);

/* ------------------------------------------------------ batches of questions */
/* Many questions in one process, decoded together, each answered as alone (one thread). */
typedef struct cb_batch cb_batch;
/* One question; what it points to need live only during cb_batch_submit. */
typedef struct cb_request {
    const char *system;         /* system text; NULL: the template's default, "": none */
    int raw;                    /* no chat template (as cb_prompt_build's raw) */
    const cb_chunk_src *chunks; /* texts or store keys, in order */
    size_t n_chunks;
    cb_strview question;
    cb_strview score;   /* .data not NULL: score this continuation instead */
    cb_blend_params bp; /* the mode and blending parameters */
    int ratio_auto;     /* blend: cb_prompt_auto_ratio's ratio, at least min_ratio */
    double min_ratio;
    cb_gen_params gp;            /* sampling, n_predict, stop strings */
    int32_t n_ctx;               /* cache positions; 0: prompt + n_predict (or the continuation) */
    cb_type kv_type;             /* F16 or F32 */
    int store_write, no_context; /* afterwards store chunks that had none; own caches only */
} cb_request;
/* A question's outcome, the caller's once cb_batch_next returns it. */
typedef struct cb_answer {
    void *tag; /* cb_batch_submit's */
    cb_status status;
    char msg[CB_ERROR_MSG_MAX];
    char *text; /* the generated text, NUL-terminated (NULL when none), len bytes */
    size_t len;
    int scored; /* score holds the continuation's score; no text */
    cb_score_result score;
    cb_gen_result gen;        /* first_ms from submission: waits for the prefills in flight */
    double gen_ms;            /* from the first token to the last */
    cb_blend_params bp;       /* the parameters used (the ratio --ratio auto chose) */
    const char *ratio_source; /* "given", or "controller" (--ratio auto) */
    cb_ratio_choice rc;       /* the loading controller's tier, with ratio_auto */
    cb_blend_stats bs;
    int64_t n_prompt_tokens;
    int n_chunks, n_missing, n_stored, n_after, n_own, n_named, n_middle; /* cb_prompt_n_... */
    cb_chat_kind chat;
    uint64_t kv_bytes; /* its cache's */
    cb_type kv_type;
} cb_answer;
void cb_answer_free(cb_answer *a);
/* --stats' object (cb-run(1)) as malloc'd JSON: an answer's on m (s's counters too unless NULL) */
cb_status cb_answer_to_json(const cb_answer *a, const cb_model *m, cb_store *s, char **json);
typedef struct cb_batch_info {
    int32_t cap; /* questions in flight at most */
    uint64_t kv_budget;
    int32_t in_flight, in_flight_peak;
    uint64_t kv_in_flight, kv_peak; /* bytes of the caches in flight, and the most */
    int64_t n_submitted, n_answered, n_failed;
    int64_t n_tokens, n_steps; /* tokens generated by the questions that ended; steps */
} cb_batch_info;
#define CB_BATCH_MAX 16 /* the most questions in flight by default */
/* As many questions as fit kv_budget with whole-context caches, 1..CB_BATCH_MAX. */
int32_t cb_batch_default_size(const cb_model *m, cb_type kv_type, uint64_t kv_budget);
/* A batch on m and s (may be NULL), cap in flight within kv_budget bytes. */
cb_status cb_batch_new(cb_batch **out, cb_model *m, cb_store *s, int32_t cap, uint64_t kv_budget,
                       void (*warn)(void *ctx, const char *msg), void *ctx);
void cb_batch_free(cb_batch *b);
int cb_batch_full(const cb_batch *b); /* 1: nothing can be submitted now (step until 0) */
int cb_batch_busy(const cb_batch *b); /* 1 while anything is pending */
/* Start a question (one that fails becomes an answer); CB_ERR_RANGE when full. */
cb_status cb_batch_submit(cb_batch *b, const cb_request *rq, void *tag);
cb_status cb_batch_step(cb_batch *b);  /* the parked question if it fits; a decode step */
cb_answer *cb_batch_next(cb_batch *b); /* in the order the questions ended; NULL: none */
const cb_batch_info *cb_batch_get_info(const cb_batch *b);
cb_status cb_batch_to_json(const cb_batch *b, double wall_ms, char **json); /* a batch's */
/* ------------------------------------------------------------ precomputing */
/* Chunks' KV prefilled after a lead-in and stored as cb-precompute does: the model's lead-in
 * (cb_kv_lead_in) until cb_precomputer_system sets a prompt head; _after extends it. */
typedef struct cb_precomputer cb_precomputer;
/* Stores into tier of s (NULL: the fastest with room), elements of type. */
cb_status cb_precomputer_new(cb_precomputer **out, const cb_model *m, cb_store *s, cb_type type,
                             const char *tier, cb_error *err);
void cb_precomputer_free(cb_precomputer *pc);
const cb_tokens *cb_precomputer_lead(const cb_precomputer *pc);
/* The store key of chunk ids[0..n) after the current lead-in. */
void cb_precomputer_key(const cb_precomputer *pc, const int32_t *ids, int32_t n, char key[66]);
/* Prefill ids[0..n) after the lead-in; then _store writes the result under key. */
cb_status cb_precomputer_run(cb_precomputer *pc, const int32_t *ids, int32_t n, cb_error *err);
cb_status cb_precomputer_store(cb_precomputer *pc, const char *key, cb_error *err);
/* The next chunks computed after the lead-in, then prev[0..n) each followed by the separator
 * (n 0: after the lead-in alone again). */
cb_status cb_precomputer_after(cb_precomputer *pc, const cb_tokens *prev, int n);
/* The next chunks computed after the lead-in and the fixed passage cb-run looks for them
 * after, for every chunk of a prompt but its first (cb_precomputer_after(pc, NULL, 0) undoes). */
cb_status cb_precomputer_middle(cb_precomputer *pc);
/* The lead-in from now on: the head of prompts with system (NULL: the default), stored too. */
cb_status cb_precomputer_system(cb_precomputer *pc, const char *system, cb_error *err);
/* That head as an entry of its own unless stored (its length to n; 0: too short for one). */
cb_status cb_precomputer_head(cb_precomputer *pc, const char *system, size_t *n, cb_error *err);
/* Each of docs[0..n)'s k most similar others by BM25 over token ids, best first, in
 * out[i*k..i*k+k) (-1 past the last); a doc with the same tokens is never its own neighbour. */
cb_status cb_neighbours(const cb_tokens *docs, size_t n, int k, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif /* CBCORE_H */
