/* prompt.c - a RAG prompt as segments of token ids, with the chunks' KV
 * caches found in the store: what cb-run (or any client) blends.
 *
 * This layer sits on top: it uses the model (tokenizer, chat templates),
 * the KV files and the store, and nothing below calls it. */
#include "prompt.h"
#include "prompt_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One segment: its tokens and, for a chunk, where its cache is. */
typedef struct pseg {
    cb_tokens toks;
    int is_chunk;
    int missing; /* looked for in the store and found no usable cache */
    int after;   /* its cache is the one computed after the chunk before it (key_after) */
    int is_head; /* the head (BOS, the template's opening), keyed alone (pr_head_key) */
    int own;     /* its cache was computed after this prompt's own head (cb_prompt.own) */
    int named;   /* its cache is the one its record named (named_key) */
    int middle;  /* its cache is the one computed after pr_middle's passage */
    char key[66];
    char own_key[66];   /* its key after the prompt's own head, when it has one */
    char named_key[66]; /* the key its record named ("kv"), when neither of those: a cache
                         * computed after other chunks too (cb-precompute --neighbours) */
    cb_kvfile *kf;
    cb_store_ref *ref;
} pseg;

struct cb_prompt {
    const cb_model *m;
    pseg *s;
    cb_segment *segs; /* the view cb_prompt_segments returns */
    int32_t n, cap;
    int n_chunks;
    cb_chat_kind kind;
    cb_tokens lead;
    cb_tokens own; /* the prompt's head when a system message makes it differ from the lead-in
                     * (has_own; it may be empty): chunks precomputed after it
                     * (cb_precomputer_system) are taken first */
    int has_own;
    cb_tokens sep;  /* what goes between chunks (cb_kv_separator) */
    cb_tokens mid;  /* pr_middle's passage, once a chunk has looked for its cache after it */
    int no_context; /* cb_prompt_use_context(p, 0) */
};

static pseg *add_seg(cb_prompt *p)
{
    if (p->n == p->cap) {
        int32_t nc = p->cap ? 2 * p->cap : 16;
        pseg *ns = realloc(p->s, sizeof *ns * (size_t)nc);
        if (!ns)
            return NULL;
        p->s = ns;
        p->cap = nc;
    }
    memset(&p->s[p->n], 0, sizeof p->s[p->n]);
    return &p->s[p->n++];
}

static cb_status push_all(cb_tokens *t, const cb_tokens *from)
{
    cb_status st = CB_OK;
    for (size_t j = 0; j < from->n && st == CB_OK; j++)
        st = cb_tokens_push(t, from->ids[j]);
    return st;
}

/* BOS when the model adds one, and the template's prefix (kind NONE:
 * none), appended to out. */
static cb_status head_tokens(const cb_model *m, cb_chat_kind kind, const cb_chat_parts *parts,
                             cb_tokens *out)
{
    const cb_vocab *v = cb_model_vocab(m);
    cb_status st = CB_OK;
    if (cb_vocab_add_bos(v) && cb_vocab_bos(v) >= 0)
        st = cb_tokens_push(out, cb_vocab_bos(v));
    if (st == CB_OK && kind != CB_CHAT_NONE)
        st = cb_tok_encode(v, parts->prefix, strlen(parts->prefix), CB_TOK_PARSE_SPECIAL, out);
    return st;
}

/* The template's kind and parts for a prompt with this system message
 * (NULL: the template's default), as cb_prompt_build renders them. */
static cb_status render(const cb_model *m, const char *system, int raw, cb_chat_kind *kind,
                        cb_chat_parts *parts)
{
    cb_strview tmpl = cb_gguf_str(cb_model_gguf(m), "tokenizer.chat_template");
    cb_status st = CB_OK;
    *kind = raw ? CB_CHAT_NONE : cb_chat_detect(tmpl);
    if (*kind != CB_CHAT_NONE) {
        /* no system given: the template's own (""; none) */
        char *dsys = system ? NULL : cb_chat_default_system(tmpl);
        st = cb_chat_render(*kind, system ? system : dsys, parts);
        free(dsys);
    }
    return st;
}

void pr_head_key(const cb_model *m, const cb_tokens *head, char key[66])
{
    cb_kv_key(cb_model_fingerprint(m), cb_kv_tokens_hash(NULL, 0, head->ids, (int32_t)head->n),
              key);
}

cb_status pr_head(const cb_model *m, const char *system, cb_tokens *out)
{
    cb_chat_parts parts = {0};
    cb_chat_kind kind;
    cb_status st = render(m, system, 0, &kind, &parts);
    if (st == CB_OK)
        st = head_tokens(m, kind, &parts, out);
    cb_chat_parts_free(&parts);
    return st;
}

/* [BOS + template prefix], its cache keyed by its tokens alone */
static cb_status add_head(cb_prompt *p, const cb_chat_parts *parts)
{
    pseg *s = add_seg(p);
    cb_status st;
    if (!s)
        return CB_ERR_NOMEM;
    if ((st = head_tokens(p->m, p->kind, parts, &s->toks)) == CB_OK && s->toks.n >= PR_HEAD_MIN) {
        s->is_head = 1;
        pr_head_key(p->m, &s->toks, s->key);
    }
    return st;
}

/* The store key of a chunk's tokens computed after lead. */
static void chunk_key(const cb_prompt *p, const int32_t *lead, size_t n_lead, const int32_t *ids,
                      size_t n, char key[66])
{
    cb_kv_key(cb_model_fingerprint(p->m), cb_kv_tokens_hash(lead, (int32_t)n_lead, ids, (int32_t)n),
              key);
}

/* Was this file computed after this prompt's head (its own, else the
 * lead-in) and then chunks, each with its separator (cb-precompute
 * --neighbours' lead-in)?  Not after another head: that ends otherwise. */
static int after_head_and_chunks(const cb_prompt *p, const cb_kv_meta *mt)
{
    const cb_tokens *head = p->has_own ? &p->own : &p->lead;
    size_t nl = (size_t)mt->n_lead, ns = p->sep.n;
    return nl > head->n + ns &&
           (head->n == 0 || !memcmp(mt->lead, head->ids, sizeof(int32_t) * head->n)) &&
           (ns == 0 || !memcmp(mt->lead + nl - ns, p->sep.ids, sizeof(int32_t) * ns));
}

/* [sep] [chunk i], keyed by its tokens after the lead-in; named: the key
 * its record gives (NULL: none), tried first when it is another. */
static cb_status add_chunk(cb_prompt *p, cb_strview text, const char *named, const cb_tokens *sep,
                           int first)
{
    const cb_vocab *v = cb_model_vocab(p->m);
    cb_status st;
    pseg *s;
    if (!first) {
        if (!(s = add_seg(p)))
            return CB_ERR_NOMEM;
        if ((st = push_all(&s->toks, sep)) != CB_OK)
            return st;
    }
    if (!(s = add_seg(p)))
        return CB_ERR_NOMEM;
    s->is_chunk = 1;
    if ((st = cb_tok_encode(v, text.data, text.len, 0, &s->toks)) != CB_OK)
        return st;
    if (s->toks.n == 0) { /* an empty chunk adds nothing */
        cb_tokens_free(&s->toks);
        p->n--;
        return CB_OK;
    }
    chunk_key(p, p->lead.ids, p->lead.n, s->toks.ids, s->toks.n, s->key);
    if (p->has_own)
        chunk_key(p, p->own.ids, p->own.n, s->toks.ids, s->toks.n, s->own_key);
    if (named && strlen(named) == sizeof s->named_key - 1 && strcmp(named, s->key) != 0 &&
        strcmp(named, s->own_key) != 0)
        memcpy(s->named_key, named, sizeof s->named_key);
    p->n_chunks++;
    return CB_OK;
}

/* [sep] [chunk], the chunk given by the key of its stored KV file: its
 * tokens are the ones the file holds, and the file is attached now. */
static cb_status add_chunk_key(cb_prompt *p, cb_store *st, const char *key, const cb_tokens *sep,
                               int first, cb_error *err)
{
    cb_status rc;
    pseg *s;
    if (strlen(key) != sizeof s->key - 1)
        return cb_error_set(err, CB_ERR_FORMAT,
                            "'%.80s' is not a chunk key (65 characters: model-tokens)", key);
    if (!st)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "chunk %s: no store to find it in", key);
    if (!first) {
        if (!(s = add_seg(p)) || push_all(&s->toks, sep) != CB_OK)
            return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    }
    if (!(s = add_seg(p)))
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    s->is_chunk = 1;
    memcpy(s->key, key, sizeof s->key);
    if ((rc = cb_store_open_kv(st, key, &s->kf, &s->ref, err)) != CB_OK)
        return rc == CB_ERR_NOT_FOUND ? cb_error_set(err, rc, "chunk %s is not in the store", key)
                                      : rc;
    if ((rc = cb_kvfile_check_model(s->kf, p->m, err)) != CB_OK)
        return rc;
    const cb_kv_meta *mt = cb_kvfile_meta(s->kf);
    for (int32_t i = 0; i < mt->n_tokens; i++)
        if (cb_tokens_push(&s->toks, mt->ids[i]) != CB_OK)
            return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    char want[66], own[66] = "";
    chunk_key(p, p->lead.ids, p->lead.n, mt->ids, (size_t)mt->n_tokens, want);
    if (p->has_own) /* a key of the prompt's own head names a file computed after it */
        chunk_key(p, p->own.ids, p->own.n, mt->ids, (size_t)mt->n_tokens, own);
    s->own = strcmp(own, key) == 0;
    if (strcmp(want, key) != 0 && !s->own) {
        char its[66]; /* the file's key by its own lead-in: computed after another head, or
                       * after this prompt's head and other chunks (--neighbours) */
        chunk_key(p, mt->lead, (size_t)mt->n_lead, mt->ids, (size_t)mt->n_tokens, its);
        if (strcmp(its, key) == 0 && after_head_and_chunks(p, mt)) {
            s->named = 1, s->own = p->has_own; /* key stays the lead-in's, as below */
            memcpy(s->named_key, key, sizeof s->named_key), memcpy(s->key, want, sizeof s->key);
            p->n_chunks++;
            return CB_OK;
        }
        if (strcmp(its, key) == 0)
            return cb_error_set(err, CB_ERR_MISMATCH,
                                "chunk %s was computed after another prompt head (cb-precompute "
                                "--for-system): give cb-run the --system it was computed for",
                                key);
        return cb_error_set(err, CB_ERR_MISMATCH, "chunk %s: its file holds the tokens of %s", key,
                            want);
    }
    if (s->own) /* key stays the lead-in's: what a missing chunk is stored under */
        memcpy(s->own_key, key, sizeof s->own_key), memcpy(s->key, want, sizeof s->key);
    p->n_chunks++;
    return CB_OK;
}

/* [sep + question + template suffix] */
static cb_status add_tail(cb_prompt *p, const cb_chat_parts *parts, const cb_tokens *sep,
                          const char *q, size_t len)
{
    const cb_vocab *v = cb_model_vocab(p->m);
    pseg *s = add_seg(p);
    cb_status st = CB_OK;
    if (!s)
        return CB_ERR_NOMEM;
    if (sep)
        st = push_all(&s->toks, sep);
    if (st == CB_OK)
        st = cb_tok_encode(v, q, len, p->kind == CB_CHAT_NONE ? CB_TOK_PARSE_SPECIAL : 0, &s->toks);
    if (st == CB_OK && p->kind != CB_CHAT_NONE)
        st = cb_tok_encode(v, parts->suffix, strlen(parts->suffix), CB_TOK_PARSE_SPECIAL, &s->toks);
    return st;
}

/* Refuse, before tokenizing, a prompt whose bytes alone say it has more
 * tokens than the model's trained context: a huge input costs its reading
 * and no more (cb_vocab_max_token_bytes bounds the bytes a token covers). */
static cb_status check_bytes(const cb_model *m, const cb_chat_parts *parts, cb_chat_kind kind,
                             const cb_strview *texts, const cb_chunk_src *srcs, size_t n_chunks,
                             size_t len, cb_error *err)
{
    size_t per = cb_vocab_max_token_bytes(cb_model_vocab(m));
    int32_t n_ctx = cb_model_hparams(m)->n_ctx_train;
    uint64_t bytes = len;
    if (kind != CB_CHAT_NONE)
        bytes += strlen(parts->prefix) + strlen(parts->suffix);
    for (size_t i = 0; i < n_chunks; i++)
        bytes += srcs ? srcs[i].text.len : texts[i].len;
    if (per == 0 || n_ctx < 1 || bytes <= (uint64_t)n_ctx * per)
        return CB_OK;
    return cb_error_set(err, CB_ERR_RANGE,
                        "the prompt has %llu bytes, more tokens than the model's context holds "
                        "(%d tokens, as trained: %llu bytes at most)",
                        (unsigned long long)bytes, n_ctx, (unsigned long long)n_ctx * per);
}

/* cb_prompt_build and cb_prompt_build_from: the chunks as texts, or as
 * sources (texts or store keys); refused past the model's trained context
 * (a token to spare). */
static cb_status build(cb_prompt **out, const cb_model *m, cb_store *store, const char *system,
                       int raw, const cb_strview *texts, const cb_chunk_src *srcs, size_t n_chunks,
                       const char *question, size_t len, cb_error *err)
{
    cb_prompt *p = calloc(1, sizeof *p);
    cb_chat_parts parts = {0};
    cb_status st;

    if (!p)
        return cb_error_set(err, CB_ERR_NOMEM, "cannot build the prompt: %s",
                            cb_strerror(CB_ERR_NOMEM));
    p->m = m;
    if ((st = cb_kv_lead_in(m, &p->lead)) != CB_OK)
        goto fail;
    if ((st = render(m, system, raw, &p->kind, &parts)) != CB_OK)
        goto fail;
    if ((st = check_bytes(m, &parts, p->kind, texts, srcs, n_chunks, len, err)) != CB_OK)
        goto fail_said;
    if ((st = add_head(p, &parts)) != CB_OK)
        goto fail;
    p->has_own =
        system &&
        (p->s[0].toks.n != p->lead.n ||
         (p->lead.n && memcmp(p->s[0].toks.ids, p->lead.ids, sizeof(int32_t) * p->lead.n)));
    if (p->has_own && (st = push_all(&p->own, &p->s[0].toks)) != CB_OK)
        goto fail;
    if ((st = cb_kv_separator(m, &p->sep)) != CB_OK)
        goto fail;
    for (size_t i = 0; i < n_chunks; i++) {
        if (srcs && !srcs[i].text.data) {
            if ((st = add_chunk_key(p, store, srcs[i].key, &p->sep, i == 0, err)) != CB_OK)
                goto fail_said;
        } else if ((st = add_chunk(p, srcs ? srcs[i].text : texts[i], srcs ? srcs[i].key : NULL,
                                   &p->sep, i == 0)) != CB_OK) {
            goto fail;
        }
    }
    if ((st = add_tail(p, &parts, n_chunks > 0 ? &p->sep : NULL, question, len)) != CB_OK)
        goto fail;
    if (cb_prompt_n_tokens(p) >= cb_model_hparams(m)->n_ctx_train) {
        st = cb_error_set(err, CB_ERR_RANGE,
                          "the prompt has %lld tokens; the model's context holds %d (as trained)",
                          (long long)cb_prompt_n_tokens(p), cb_model_hparams(m)->n_ctx_train);
        goto fail_said;
    }
    if (!(p->segs = calloc((size_t)p->n, sizeof *p->segs))) {
        st = CB_ERR_NOMEM;
        goto fail;
    }
    cb_chat_parts_free(&parts);
    *out = p;
    return CB_OK;
fail:
    cb_error_set(err, st, "cannot build the prompt: %s", cb_strerror(st));
fail_said: /* err says why */
    cb_chat_parts_free(&parts);
    cb_prompt_free(p);
    return st;
}

cb_status cb_prompt_build(cb_prompt **out, const cb_model *m, const char *system, int raw,
                          const cb_strview *chunks, size_t n_chunks, const char *question,
                          size_t len, cb_error *err)
{
    return build(out, m, NULL, system, raw, chunks, NULL, n_chunks, question, len, err);
}

cb_status cb_prompt_build_from(cb_prompt **out, const cb_model *m, cb_store *s, const char *system,
                               int raw, const cb_chunk_src *chunks, size_t n_chunks,
                               const char *question, size_t len, cb_error *err)
{
    return build(out, m, s, system, raw, NULL, chunks, n_chunks, question, len, err);
}

void cb_prompt_free(cb_prompt *p)
{
    if (!p)
        return;
    for (int32_t i = 0; i < p->n; i++) {
        cb_tokens_free(&p->s[i].toks);
        cb_kvfile_free(p->s[i].kf);
        cb_store_release(p->s[i].ref);
    }
    free(p->s);
    free(p->segs);
    cb_tokens_free(&p->lead);
    cb_tokens_free(&p->own);
    cb_tokens_free(&p->sep);
    cb_tokens_free(&p->mid);
    free(p);
}

const cb_segment *cb_prompt_segments(const cb_prompt *p, int32_t *n)
{
    for (int32_t i = 0; i < p->n; i++)
        p->segs[i] = (cb_segment){p->s[i].toks.ids, (int32_t)p->s[i].toks.n, p->s[i].kf};
    *n = p->n;
    return p->segs;
}

int64_t cb_prompt_n_tokens(const cb_prompt *p)
{
    int64_t total = 0;
    for (int32_t i = 0; i < p->n; i++)
        total += (int64_t)p->s[i].toks.n;
    return total;
}

int cb_prompt_n_chunks(const cb_prompt *p) { return p->n_chunks; }
cb_chat_kind cb_prompt_chat(const cb_prompt *p) { return p->kind; }
const cb_tokens *cb_prompt_lead(const cb_prompt *p) { return &p->lead; }

int cb_prompt_n_missing(const cb_prompt *p)
{
    int n = 0;
    for (int32_t i = 0; i < p->n; i++)
        n += p->s[i].is_chunk && !p->s[i].kf;
    return n;
}

/* ------------------------------------------------------------- caches */

void pr_warnf(void (*warn)(void *, const char *), void *ctx, const char *fmt, ...)
{
    char msg[CB_ERROR_MSG_MAX + 128];
    va_list ap;
    if (!warn)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    warn(ctx, msg);
}

/* Forget a segment's cache: it is computed. */
static void detach(pseg *s)
{
    cb_kvfile_free(s->kf);
    s->kf = NULL;
    cb_store_release(s->ref);
    s->ref = NULL;
    s->missing = 1;
    s->after = 0;
    s->own = 0;
    s->named = 0;
    s->middle = 0;
}

/* Why a fixed passage: a chunk computed first after the head differs most
 * from what a prompt computes for it where other passages come before it.
 * Computed after any passage it differs less: on nq20's development half
 * one passage drawn at random did as well as the chunk's most similar
 * ones, and one fixed passage as well as either (EVAL.md), so one text
 * serves every chunk and cb-run finds its cache by the chunk's tokens.  It
 * has to read as a passage (a title line, then encyclopedic text): a note
 * about the passages did not help.  Changing it changes every such key:
 * the stored caches are then not found, and chunks take their own. */
static const char middle_text[] =
    "Lighthouse\nA lighthouse is a tower that carries a bright lamp at its top to guide ships at "
    "night and in poor weather. Most stand on headlands, islands or harbour walls, where they mark "
    "dangerous rocks, shallow water and the safe way into a port. Each light flashes in its own "
    "pattern, so that sailors can tell one from another. Since the twentieth century many have "
    "been automated, and radio and satellite navigation now do much of the work they once did.";

cb_status pr_middle(const cb_model *m, cb_tokens *out)
{
    out->n = 0;
    return cb_tok_encode(cb_model_vocab(m), middle_text, sizeof middle_text - 1, 0, out);
}

cb_status pr_lead_after(const cb_tokens *lead, const int32_t *prev, size_t n_prev,
                        const cb_tokens *sep, cb_tokens *out)
{
    cb_status st;
    out->n = 0;
    st = push_all(out, lead);
    for (size_t i = 0; i < n_prev && st == CB_OK; i++)
        st = cb_tokens_push(out, prev[i]);
    return st == CB_OK ? push_all(out, sep) : st;
}

/* The file stored under key for segment s, checked (its model, and its
 * tokens against the segment's): 1 with *kf and *ref set when usable, else
 * 0 (a file there that is not usable goes to warn). */
static int open_for(const cb_model *m, cb_store *store, const pseg *s, const char *key,
                    cb_kvfile **kf, cb_store_ref **ref, void (*warn)(void *, const char *),
                    void *ctx)
{
    /* what happens instead: a chunk's cache computed after the one before
     * it, or after the prompt's own head, gives way to its cache after the
     * lead-in */
    const char *then = s->is_head                 ? "the prompt's head is computed"
                       : strcmp(key, s->key) != 0 ? "another cache of it is tried"
                                                  : "the chunk is recomputed";
    cb_error err;
    cb_status st;
    *kf = NULL, *ref = NULL;
    if ((st = cb_store_open_kv(store, key, kf, ref, &err)) == CB_ERR_NOT_FOUND)
        return 0;
    if (st != CB_OK || cb_kvfile_check_model(*kf, m, &err) != CB_OK) {
        pr_warnf(warn, ctx, "%s: %s; %s", key, err.msg, then);
    } else {
        const cb_kv_meta *mt = cb_kvfile_meta(*kf);
        if (mt->n_tokens == (int32_t)s->toks.n &&
            !memcmp(mt->ids, s->toks.ids, sizeof(int32_t) * s->toks.n))
            return 1;
        pr_warnf(warn, ctx, "%s: its tokens differ from the chunk's; %s", key, then);
    }
    cb_kvfile_free(*kf);
    cb_store_release(*ref);
    *kf = NULL, *ref = NULL;
    return 0;
}

/* Segment g's cache computed after this prompt's head (its own first, else
 * the lead-in), then prev[0..n_prev) and the separator: 1 with *kf, *ref
 * and *own (after its own head) set when the store has a usable one. */
static int open_after(cb_prompt *p, cb_store *s, const pseg *g, const int32_t *prev, size_t n_prev,
                      cb_kvfile **kf, cb_store_ref **ref, int *own,
                      void (*warn)(void *, const char *), void *ctx)
{
    cb_tokens lead = {0};
    int ok = 0;
    for (int k = p->has_own ? 0 : 1; k < 2 && !ok; k++) {
        char key[66];
        int have = 0;
        if (pr_lead_after(k == 0 ? &p->own : &p->lead, prev, n_prev, &p->sep, &lead) != CB_OK)
            break;
        chunk_key(p, lead.ids, lead.n, g->toks.ids, g->toks.n, key);
        ok = cb_store_has(s, key, &have) == CB_OK && have &&
             open_for(p->m, s, g, key, kf, ref, warn, ctx);
        *own = k == 0;
    }
    cb_tokens_free(&lead);
    return ok;
}

/* Chunk i's cache computed after the chunk before it, when the prompt has
 * that chunk right before it (segments i-2 and i-1: the chunk and the
 * separator) and the store has the file (cb-precompute --context), the one
 * after the prompt's own head first: 1 when attached, in place of the
 * cache it had (a keyed chunk's). */
static int attach_after(cb_prompt *p, cb_store *s, int32_t i, void (*warn)(void *, const char *),
                        void *ctx)
{
    pseg *g = &p->s[i], *prev = i >= 2 ? &p->s[i - 2] : NULL;
    cb_kvfile *kf = NULL;
    cb_store_ref *ref = NULL;
    int own = 0;
    if (p->no_context || !prev || !prev->is_chunk || p->s[i - 1].is_chunk ||
        p->sep.n != p->s[i - 1].toks.n ||
        memcmp(p->sep.ids, p->s[i - 1].toks.ids, sizeof(int32_t) * p->sep.n) != 0 ||
        !open_after(p, s, g, prev->toks.ids, prev->toks.n, &kf, &ref, &own, warn, ctx))
        return 0;
    detach(g);
    g->kf = kf, g->ref = ref, g->missing = 0, g->after = 1, g->own = own;
    return 1;
}

/* The cache chunk i's record named, when the store has it and it was
 * computed after this prompt's head and then other chunks: 1 when
 * attached. */
static int attach_named(cb_prompt *p, cb_store *s, int32_t i, void (*warn)(void *, const char *),
                        void *ctx)
{
    pseg *g = &p->s[i];
    int have = 0;
    if (!g->named_key[0] || cb_store_has(s, g->named_key, &have) != CB_OK || !have ||
        !open_for(p->m, s, g, g->named_key, &g->kf, &g->ref, warn, ctx))
        return 0;
    if (!after_head_and_chunks(p, cb_kvfile_meta(g->kf))) {
        pr_warnf(warn, ctx,
                 "%s: computed after another prompt head (cb-precompute --for-system); another "
                 "cache of it is tried",
                 g->named_key);
        cb_kvfile_free(g->kf);
        cb_store_release(g->ref);
        g->kf = NULL, g->ref = NULL;
        return 0;
    }
    g->named = 1, g->own = p->has_own, g->missing = 0;
    return 1;
}

/* Chunk i's cache computed after the head (its own first) and
 * pr_middle's passage (cb-precompute --middle), for a chunk that is not
 * the prompt's first (first: it is; it keeps its own cache, exact there).
 * 1 when attached. */
static int attach_middle(cb_prompt *p, cb_store *s, int32_t i, int first,
                         void (*warn)(void *, const char *), void *ctx)
{
    pseg *g = &p->s[i];
    int own = 0;
    if (p->no_context || first || (p->mid.n == 0 && pr_middle(p->m, &p->mid) != CB_OK) ||
        !open_after(p, s, g, p->mid.ids, p->mid.n, &g->kf, &g->ref, &own, warn, ctx))
        return 0;
    g->middle = 1, g->own = own, g->missing = 0;
    return 1;
}

void cb_prompt_use_context(cb_prompt *p, int use) { p->no_context = !use; }

void cb_prompt_attach(cb_prompt *p, cb_store *s, void (*warn)(void *ctx, const char *msg),
                      void *ctx)
{
    int first = 1; /* no chunk before segment i */
    for (int32_t i = 0; i < p->n; i++) {
        pseg *g = &p->s[i];
        if (g->is_head && s && !g->kf) /* exact where found: the prompt starts with it */
            open_for(p->m, s, g, g->key, &g->kf, &g->ref, warn, ctx);
        int was_first = first;
        first = first && !g->is_chunk;
        if (!g->is_chunk || (s && attach_after(p, s, i, warn, ctx)) || g->kf ||
            (s && attach_named(p, s, i, warn, ctx)) ||
            (s && attach_middle(p, s, i, was_first, warn, ctx)))
            continue;
        /* the cache computed after the prompt's own head, else after the lead-in */
        if (s && p->has_own && open_for(p->m, s, g, g->own_key, &g->kf, &g->ref, warn, ctx)) {
            g->own = 1, g->missing = 0;
            continue;
        }
        g->missing = !s || !open_for(p->m, s, g, g->key, &g->kf, &g->ref, warn, ctx);
    }
}

int cb_prompt_n_own(const cb_prompt *p)
{
    int n = 0;
    for (int32_t i = 0; i < p->n; i++)
        n += p->s[i].is_chunk && p->s[i].kf && p->s[i].own;
    return n;
}

int cb_prompt_n_named(const cb_prompt *p)
{
    int n = 0;
    for (int32_t i = 0; i < p->n; i++)
        n += p->s[i].named;
    return n;
}

int cb_prompt_n_middle(const cb_prompt *p)
{
    int n = 0;
    for (int32_t i = 0; i < p->n; i++)
        n += p->s[i].middle;
    return n;
}

int cb_prompt_n_after(const cb_prompt *p)
{
    int n = 0;
    for (int32_t i = 0; i < p->n; i++)
        n += p->s[i].after;
    return n;
}

/* The slowest tier is the one whose loading the recompute must cover: the
 * loader reads every cache of a layer before that layer runs.  A chunk
 * streamed from the shared tier loads at that tier's measured speed. */
cb_status cb_prompt_auto_ratio(const cb_prompt *p, const cb_store *s, const cb_model *m,
                               double r_min, cb_blend_params *bp, cb_ratio_choice *out,
                               cb_error *err)
{
    cb_profile *prof;
    cb_status st;
    float worst = 0.0f;

    memset(out, 0, sizeof *out);
    bp->ratio_auto = 1;
    bp->speedup = 0.0f;
    bp->n_ratios = 1;
    bp->ratios[0] = (float)r_min;
    for (int32_t i = 0; i < p->n; i++)
        out->n_cached += p->s[i].kf ? (int64_t)p->s[i].toks.n : 0;
    if (!s)
        return cb_error_set(err, CB_ERR_NOT_FOUND, "no store, so no profile");
    if (!(prof = calloc(1, sizeof *prof)))
        return cb_error_set(err, CB_ERR_NOMEM, "out of memory");
    if ((st = cb_store_profile_load(s, cb_model_fingerprint(m), cb_model_backend(m), prof, err)) !=
        CB_OK)
        goto done;
    for (int32_t i = 0; i < p->n; i++) {
        const char *tier = p->s[i].kf ? cb_store_ref_tier_name(s, p->s[i].ref) : NULL;
        float c = tier ? cb_profile_load_cost(prof, tier) : 0.0f;
        if (c > worst) {
            worst = c;
            snprintf(out->tier, sizeof out->tier, "%s", tier);
        }
    }
    if (worst > 0.0f)
        bp->costs.load = worst;
    else
        st = cb_error_set(err, CB_ERR_NOT_FOUND,
                          "the profile has no loading figure for the tiers holding the chunks");
done:
    free(prof);
    return st;
}

cb_status cb_prompt_prefill(cb_prompt *p, cb_store *s, cb_fwd *f, cb_kvcache *kv,
                            const cb_blend_params *bp, float *logits, cb_blend_stats *stats,
                            void (*warn)(void *ctx, const char *msg), void *ctx, cb_error *err)
{
    for (;;) {
        int32_t n;
        const cb_segment *segs = cb_prompt_segments(p, &n);
        cb_status st = cb_blend_prefill(f, kv, segs, n, bp, logits, stats, err);
        int32_t bad = stats->failed_segment;
        if (st == CB_OK || bad < 0 || bad >= p->n || !p->s[bad].kf)
            return st;
        /* Layers of it may have been used already: the chunk is computed
         * and the prefill starts over, so the answer is the one it would
         * have been with the chunk missing. */
        int what = cb_store_ref_bad(s, p->s[bad].ref, err->msg);
        if (what == 0)
            pr_warnf(warn, ctx, "%s; the %s is computed", err->msg,
                     p->s[bad].is_head ? "prompt's head" : "chunk");
        detach(&p->s[bad]);
        for (int32_t i = 0; what == 2 && i < p->n;
             i++) /* the tier is down: its other streams fail too */
            if (p->s[i].kf && p->s[i].ref && cb_store_ref_tier(p->s[i].ref) == cb_store_n_tiers(s))
                detach(&p->s[i]);
    }
}

void cb_prompt_keep(cb_prompt *p, cb_store *s, void (*warn)(void *ctx, const char *msg), void *ctx)
{
    cb_error err;
    for (int32_t i = 0; s && i < p->n; i++)
        if (p->s[i].ref && cb_store_keep(s, p->s[i].ref, &err) != CB_OK &&
            err.status != CB_ERR_CHECKSUM)
            pr_warnf(warn, ctx, "%s: fetched from the shared tier but not kept here: %s",
                     p->s[i].key, err.msg);
}

cb_status cb_prompt_store_missing(cb_prompt *p, cb_store *s, cb_type type, int *n_stored,
                                  void (*warn)(void *ctx, const char *msg), void *ctx)
{
    cb_precomputer *pc = NULL;
    cb_error err;
    cb_status st = CB_OK;

    *n_stored = 0;
    for (int32_t i = 0; i < p->n && st == CB_OK; i++) {
        pseg *g = &p->s[i];
        int found = 0, want = g->is_head ? !g->kf : g->is_chunk && g->missing;
        if (!want || (cb_store_lookup(s, g->key, &found) == CB_OK && found))
            continue;
        /* made when first needed: a prompt whose caches were all found costs nothing */
        if (!pc && (st = cb_precomputer_new(&pc, p->m, s, type, NULL, &err)) != CB_OK)
            break;
        if (g->is_head) { /* the head alone (its own key), not counted among the chunks */
            if (pr_precompute_alone(pc, g->toks.ids, (int32_t)g->toks.n, g->key, &err) != CB_OK)
                pr_warnf(warn, ctx, "could not store the prompt's head %s: %s", g->key, err.msg);
        } else if (cb_precomputer_run(pc, g->toks.ids, (int32_t)g->toks.n, &err) == CB_OK &&
                   cb_precomputer_store(pc, g->key, &err) == CB_OK) {
            (*n_stored)++;
        } else {
            pr_warnf(warn, ctx, "could not store chunk %s: %s", g->key, err.msg);
        }
    }
    cb_precomputer_free(pc);
    return st;
}
