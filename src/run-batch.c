/* run-batch.c - cb-run --batch: JSON Lines questions through cb_batch,
 * answers written in input order. */
#include "run.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------- --batch
 *
 * JSON Lines in, one question a line; JSON Lines out, an answer a line in
 * input order.  The questions run through cb_batch (lib/prompt/batch.c):
 * here only the lines are read, turned into requests, and the answers
 * written.  A bad line gets a line with "error" and its line number, and the
 * rest go on. */

/* One line, from reading to writing. */
typedef struct qline {
    long lineno;
    size_t seq;       /* its place in the output */
    double submit_ms; /* when it was submitted, from the batch's start */
    cli_question q;   /* the parsed object and what its request points into */
} qline;

static void qline_free(qline *q)
{
    if (!q)
        return;
    cli_question_free(&q->q);
    free(q);
}

/* The answer line of q: its id, the answer (or score, or error) and the
 * fields the batch does not read; NULL when out of memory. */
static char *answer_line(const cb_model *m, const qline *q, const cb_answer *a, const char *error)
{
    json_t *obj = q->q.obj, *out = json_object(), *id = obj ? json_object_get(obj, "id") : NULL;
    const char *k;
    json_t *v;
    if (id)
        json_object_set(out, "id", id);
    if (error) {
        json_object_set_new(out, "line", json_integer(q->lineno));
        json_object_set_new(out, "error", json_string(error));
    } else if (a->scored) {
        json_object_set_new(out, "score",
                            json_pack("{s:f, s:I, s:f}", "nll", a->score.nll, "n_tokens",
                                      (json_int_t)a->score.n_tokens, "top1", a->score.top1));
    } else {
        size_t n = 0;
        char *clean = cli_utf8_clean(a->text ? a->text : "", a->len, &n);
        json_object_set_new(out, "answer", json_stringn(clean ? clean : "", n));
        free(clean);
    }
    json_object_foreach(obj, k, v)
        if (!cli_question_reads(k) && !json_object_get(out, k))
            json_object_set(out, k, v);
    if (!error) {
        json_t *st = gen_stats_json(a, m, NULL);
        json_object_set_new(st, "kv_bytes", json_integer((json_int_t)a->kv_bytes));
        /* A question's first token waits for the questions before it and
         * beside it, so a lone run's ttft_ms has no counterpart here: the
         * times count from the batch's start instead. */
        json_object_del(st, "ttft_ms");
        json_object_set_new(st, "submit_ms", json_real(q->submit_ms));
        json_object_set_new(st, "first_token_ms", json_real(q->submit_ms + a->gen.first_ms));
        json_object_set_new(out, "stats", st);
    }
    char *line = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    return line;
}

/* Answers written in input order: lines that are ready wait for the ones
 * before them. */
typedef struct outq {
    char **ready; /* [cap]: line seq = next + i, or NULL */
    size_t next, cap;
    int io_err;
} outq;

static int outq_put(outq *w, size_t seq, char *line)
{
    size_t i = seq - w->next;
    if (!line)
        return -1;
    if (i >= w->cap) {
        size_t nc = (i + 1) * 2;
        char **nr = realloc(w->ready, sizeof *nr * nc);
        if (!nr)
            return free(line), -1;
        memset(nr + w->cap, 0, sizeof *nr * (nc - w->cap));
        w->ready = nr, w->cap = nc;
    }
    w->ready[i] = line;
    while (w->cap > 0 && w->ready[0]) {
        if (puts(w->ready[0]) == EOF)
            w->io_err = 1;
        free(w->ready[0]);
        memmove(w->ready, w->ready + 1, sizeof *w->ready * (w->cap - 1));
        w->ready[w->cap - 1] = NULL;
        w->next++;
    }
    fflush(stdout);
    return 0;
}

/* The progress line on a terminal: questions, their rate, tokens/s, ETA. */
static void progress(const cb_batch_info *in, long total, double t0, int last)
{
    static double shown;
    double now = cb_now_ms(), s = (now - t0) / 1e3;
    int64_t done = in->n_answered + in->n_failed;
    if (!last && now - shown < 250)
        return;
    shown = now;
    fprintf(stderr, "\r%s: %lld", cli_prog, (long long)done);
    if (total > 0)
        fprintf(stderr, "/%ld", total);
    fprintf(stderr, " questions, %.2f/s, %.1f tok/s, %d in flight", s > 0 ? done / s : 0.0,
            s > 0 ? in->n_tokens / s : 0.0, in->in_flight);
    if (total > 0 && done > 0 && !last)
        fprintf(stderr, ", ETA %.0f s", (double)(total - done) * s / (double)done);
    fputs(last ? "\n" : "   ", stderr);
}

/* Non-blank lines of a regular file (for the ETA); 0 when not one. */
static long count_questions(const char *path)
{
    long n = 0;
    int c, blank = 1;
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    while ((c = getc(f)) != EOF) {
        if (c == '\n')
            n += !blank, blank = 1;
        else if (c != ' ' && c != '\t' && c != '\r')
            blank = 0;
    }
    fclose(f);
    return n + !blank;
}

/* The batch's model, store, default chunks, limits and output. */
typedef struct brun {
    const gen_opts *o;
    cb_model *m;
    cb_store *store;
    json_t *chunks;      /* --chunks' records, as a "chunks" array */
    cb_request defaults; /* the options' */
    cb_batch *b;
    outq w;
    double t_load, t0;   /* the model's loading; the batch's start (cb_now_ms) */
    const char *in_name; /* the input's name in messages */
    int worst;           /* the exit status so far */
} brun;

/* A line's failure: "FILE:LINE: message" on stderr, an error line, and the
 * exit status it makes (65 for bad data, else the failure's). */
static void line_failed(brun *r, qline *q, const char *msg, cb_status st)
{
    int code = cli_exit_code(st);
    if (code == CLI_EX_USAGE || code == CLI_EX_NOINPUT || code == CLI_EX_OK)
        code = CLI_EX_DATAERR; /* a bad parameter, a key the store lacks: the line's data */
    cli_err("%s:%ld: %s", r->in_name, q->lineno, msg);
    if (code != CLI_EX_DATAERR || r->worst == 0)
        r->worst = code;
    if (outq_put(&r->w, q->seq, answer_line(r->m, q, NULL, msg)) != 0)
        r->worst = CLI_EX_SOFTWARE;
}

/* Write the answers that ended. */
static void drain(brun *r)
{
    cb_answer *a;
    while ((a = cb_batch_next(r->b))) {
        qline *q = a->tag;
        if (a->status != CB_OK)
            line_failed(r, q, a->msg, a->status);
        else if (outq_put(&r->w, q->seq, answer_line(r->m, q, a, NULL)) != 0)
            r->worst = CLI_EX_SOFTWARE;
        qline_free(q);
        cb_answer_free(a);
    }
}

/* Read, parse and submit one line; 1 at the end of the input. */
static int feed(brun *r, FILE *in, long *lineno, size_t *seq)
{
    char *line = NULL, msg[256];
    size_t cap = 0;
    ssize_t len;
    cb_request rq;
    for (;;) {
        if ((len = getline(&line, &cap, in)) < 0) {
            free(line);
            return 1;
        }
        ++*lineno;
        if (strspn(line, " \t\r\n") != (size_t)len)
            break;
    }
    qline *q = calloc(1, sizeof *q);
    if (!q) {
        free(line);
        r->worst = CLI_EX_SOFTWARE;
        return 1;
    }
    q->lineno = *lineno, q->seq = (*seq)++;
    int bad = cli_question_parse(line, (size_t)len, &r->defaults, r->o->mode_given, r->chunks,
                                 &q->q, &rq, msg, sizeof msg);
    free(line);
    q->submit_ms = cb_now_ms() - r->t0;
    if (bad) {
        line_failed(r, q, msg, CB_ERR_FORMAT);
        qline_free(q);
    } else if (cb_batch_submit(r->b, &rq, q) != CB_OK) {
        line_failed(r, q, "out of memory", CB_ERR_NOMEM);
        qline_free(q);
    }
    return 0;
}

/* The model, the store, --chunks, and the batch with its limits; with -c,
 * one question's cache is to fit the memory available (on the CPU). */
static int batch_open(brun *r, int32_t size, uint64_t budget)
{
    const gen_opts *o = r->o;
    cb_status st;
    int code;

    if ((code = gen_open_model(o, &r->chunks, &r->m, &r->t_load)) != 0 ||
        (code = gen_open_store(o, &r->store)) != 0)
        return code;
    gen_profile_costs(r->store, r->m, &r->defaults.bp);
    if (o->n_ctx > 0 && strcmp(cb_model_backend(r->m), "cpu") == 0) {
        uint64_t kv = cb_kvcache_bytes(r->m, o->n_ctx, o->kv_type), avail = cli_mem_available();
        if (kv > avail) {
            cli_err("-c %d: a question's KV cache takes %.0f MiB; %.0f MiB of memory are available",
                    o->n_ctx, kv / 1048576.0, avail / 1048576.0);
            return cli_exit_code(CB_ERR_NOMEM);
        }
    }
    if (!budget)
        budget = cli_mem_available() / 2;
    int32_t dflt = cb_batch_default_size(r->m, o->kv_type, budget);
    cli_info(
        "batch: %d questions in flight (default %d: KV caches of %lld positions, the model's context, "
        "within %.0f MiB, at most %d), KV budget %.0f MiB",
        size ? size : dflt, dflt, (long long)cb_model_hparams(r->m)->n_ctx_train,
        (double)budget / 1048576.0, CB_BATCH_MAX, (double)budget / 1048576.0);
    if ((st = cb_batch_new(&r->b, r->m, r->store, size ? size : dflt, budget, gen_warn, NULL)) !=
        CB_OK) {
        cli_err("%s", cb_model_strerror(r->m, st));
        return cli_exit_code(st);
    }
    return 0;
}

/* --stats with --batch: the whole batch's figures. */
static int batch_stats(const brun *r, double ms)
{
    char *text = NULL;
    json_t *s = NULL;
    if (cb_batch_to_json(r->b, ms, &text) == CB_OK)
        s = json_loads(text, 0, NULL);
    free(text);
    int code = s ? cli_write_json(r->o->stats_path, s) : CLI_EX_SOFTWARE;
    json_decref(s);
    return code;
}

int run_batch(const gen_opts *o, const char *path, int32_t size, uint64_t budget)
{
    brun r = {.o = o, .in_name = strcmp(path, "-") ? path : "stdin"};
    FILE *in = strcmp(path, "-") ? fopen(path, "r") : stdin;
    long lineno = 0, total = 0;
    size_t seq = 0;
    int eof = 0, code, tty;

    if (!in) {
        cli_err("%s: %s", path, strerror(errno));
        return CLI_EX_NOINPUT;
    }
    tty = isatty(2) && cli_verbosity > 0;
    r.defaults = (cb_request){o->system,      o->raw,
                              NULL,           0,
                              {NULL, 0},      {NULL, 0},
                              o->bp,          o->ratio_auto,
                              o->min_ratio,   {o->sp, o->n_predict, o->stops, o->n_stops},
                              o->n_ctx,       o->kv_type,
                              o->store_write, o->no_context};
    if (o->score)
        r.defaults.score = (cb_strview){o->score, strlen(o->score)};
    if ((code = batch_open(&r, size, budget)) != 0)
        goto done;
    r.t0 = cb_now_ms();
    if (tty)
        total = count_questions(path);
    while (!eof || cb_batch_busy(r.b)) {
        while (!eof && !cb_batch_full(r.b))
            eof = feed(&r, in, &lineno, &seq);
        drain(&r);
        if (cb_batch_busy(r.b))
            cb_batch_step(r.b);
        if (tty)
            progress(cb_batch_get_info(r.b), total, r.t0, 0);
    }
    if (tty)
        progress(cb_batch_get_info(r.b), total, r.t0, 1);
    if (ferror(in)) {
        cli_err("%s: read error", path);
        r.worst = CLI_EX_IOERR;
    }
    code = r.w.io_err ? CLI_EX_IOERR : r.worst;
    if (o->stats_path) {
        int sc = batch_stats(&r, cb_now_ms() - r.t0);
        code = code ? code : sc;
    }
done:
    if (in != stdin)
        fclose(in);
    for (size_t i = 0; i < r.w.cap; i++)
        free(r.w.ready[i]);
    free(r.w.ready);
    cb_batch_free(r.b);
    cb_store_close(r.store);
    cb_model_free(r.m);
    json_decref(r.chunks);
    return code;
}
