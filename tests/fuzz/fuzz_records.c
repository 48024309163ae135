/* fuzz_records - the chunk records (JSON Lines) cb-precompute and cb-run
 * read, and cb-run --batch's question lines, through the programs' own code
 * (records_pre.c, records_run.c, records_batch.c).
 *
 * Input: one byte choosing the reader (its value mod 3: 0 cb-precompute,
 * 1 cb-run --chunks, 2 cb-run --batch), then the JSON Lines.  Texts are tokenized with the tiny fixture model's
 * vocabulary (data/model.gguf).
 *
 * Properties.  cb-precompute: every record comes out as one line that
 * parses to the same object with "kv" (the key) and "cached" added, and
 * when the record had neither, its bytes up to the closing brace are passed
 * through unchanged.  cb-run: every line that is not blank is a record (an
 * object with a "text" string), and the prompt built from them holds
 * in-range ids.  cb-run --batch: see records_batch.c. */
#include "../../lib/core/core.h"
#include "fuzz.h"

#include <jansson.h>

int fuzz_run_records(const cb_model *m, const char *path);
int fuzz_precompute_record(const char *line, size_t len, const char *key, int cached);
int fuzz_batch_line(const cb_model *m, const char *line, size_t len);

static cb_model *M;
static char *in_path, *out_path;
static int out_fd;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    cb_model_params mp = {1, "cpu", 0, NULL};
    cb_error err;
    char *model = fuzz_data_path("model.gguf");
    if (cb_model_load(&M, model, &mp, &err) != CB_OK) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        exit(1);
    }
    free(model);
    if (asprintf(&in_path, "%s/chunks.jsonl", fuzz_tmpdir()) < 0 ||
        asprintf(&out_path, "%s/stdout", fuzz_tmpdir()) < 0)
        abort();
    /* stdout (the programs' data) goes to a file the harness reads back;
     * a stream of its own, as libFuzzer may close descriptor 1 */
    FILE *f = fopen(out_path, "w+");
    if (!f)
        abort();
    stdout = f;
    out_fd = fileno(f);
    return 0;
}

/* What emit() wrote since the last call, NUL-terminated (malloc'd). */
static char *take_stdout(size_t *n)
{
    fflush(stdout);
    off_t end = ftello(stdout);
    char *buf = malloc((size_t)end + 1);
    FUZZ_CHECK(buf && pread(out_fd, buf, (size_t)end, 0) == end);
    buf[end] = 0;
    *n = (size_t)end;
    rewind(stdout);
    FUZZ_CHECK(ftruncate(out_fd, 0) == 0);
    return buf;
}

static void precompute(const char *data, size_t size)
{
    char *copy = malloc(size + 1);
    if (!copy)
        return;
    memcpy(copy, data, size);
    copy[size] = 0;
    for (size_t pos = 0; pos < size;) {
        /* getline's split, then main's trimming of \n and \r */
        char *line = copy + pos, *nl = memchr(line, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - line) : size - pos;
        pos += len + (nl != NULL);
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (len == 0)
            continue;
        char saved = line[len];
        line[len] = 0;
        /* emit() passes the key through as it is: a well-formed key that
         * differs per line will do (tokenizing the line for it, as main
         * does, cost most of this harness's time and tested nothing here) */
        char key[66];
        cb_kv_key(cb_model_fingerprint(M), cb_hash128_bytes(line, len), key);
        int cached = (int)(len & 1);
        if (fuzz_precompute_record(line, len, key, cached)) {
            size_t n;
            char *out = take_stdout(&n);
            json_error_t je;
            FUZZ_CHECK(n > 0 && out[n - 1] == '\n' && memchr(out, '\n', n) == out + n - 1);
            json_t *got = json_loadb(out, n - 1, 0, &je), *in = json_loadb(line, len, 0, &je);
            FUZZ_CHECK(got && json_is_object(got) && in);
            FUZZ_CHECK(json_is_string(json_object_get(got, "kv")) &&
                       strcmp(json_string_value(json_object_get(got, "kv")), key) == 0);
            FUZZ_CHECK(json_is_boolean(json_object_get(got, "cached")) &&
                       json_is_true(json_object_get(got, "cached")) == cached);
            int had = json_object_get(in, "kv") || json_object_get(in, "cached");
            json_object_del(got, "kv");
            json_object_del(got, "cached");
            json_object_del(in, "kv");
            json_object_del(in, "cached");
            FUZZ_CHECK(json_equal(got, in));
            if (!had) {
                size_t end = len;
                while (end > 0 && strchr(" \t\r", line[end - 1]))
                    end--;
                FUZZ_CHECK(end > 0 && line[end - 1] == '}' && memcmp(out, line, end - 1) == 0);
            }
            json_decref(got);
            json_decref(in);
            free(out);
        }
        line[len] = saved;
    }
    free(copy);
}

/* cb-run --batch: each line that is not blank, as getline hands it over */
static void batch(const char *data, size_t size)
{
    for (size_t pos = 0; pos < size;) {
        const char *line = data + pos, *nl = memchr(line, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - line) + 1 : size - pos, k = 0;
        pos += len;
        while (k < len && line[k] && strchr(" \t\r\n", line[k]))
            k++;
        if (k < len)
            fuzz_batch_line(M, line, len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] % 3 == 1) {
        fuzz_write_file(in_path, data + 1, size - 1);
        fuzz_run_records(M, in_path);
    } else if (data[0] % 3 == 2) {
        batch((const char *)data + 1, size - 1);
    } else {
        precompute((const char *)data + 1, size - 1);
    }
    return 0;
}
