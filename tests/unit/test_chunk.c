/* test_chunk.c - the chunker (lib/infer/chunk.c): limits in characters and
 * tokens, the preferred cut points, UTF-8 boundaries, overlap, separators,
 * determinism and linear cost; UTF-8 validation and repair against
 * Python's errors="replace"; ids against libxxhash directly. */
#include "cbcore.h"
#include "test.h"

#include <time.h>
#include <xxhash.h>

/* ------------------------------------------------------------ helpers */

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int is_cont(unsigned char c) { return (c & 0xc0) == 0x80; }

static size_t n_chars(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += !is_cont((unsigned char)s[i]);
    return k;
}

static int32_t n_tokens_of(const cb_vocab *v, const char *s, size_t n)
{
    cb_tokens t = {0};
    int32_t r;
    if (cb_tok_encode(v, s, n, 0, &t) != CB_OK)
        return -2;
    r = (int32_t)t.n;
    cb_tokens_free(&t);
    return r;
}

/* Independent id: XXH3-128 in canonical (big-endian) form, as hex. */
static void ref_id(const char *s, size_t n, char hex[33])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(s, n));
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
}

static cb_chunker *mk(const cb_vocab *v, int32_t max, int32_t overlap, const char *sep)
{
    cb_chunker_params p = {v, max, overlap, sep};
    cb_chunker *c = NULL;
    cb_error err;
    if (cb_chunker_new(&c, &p, &err) != CB_OK) {
        printf("#   cb_chunker_new: %s\n", err.msg);
        return NULL;
    }
    return c;
}

static size_t split(cb_chunker *c, const char *text, cb_chunks *out)
{
    out->n = 0;
    if (!c || cb_chunker_split(c, text, strlen(text), out) != CB_OK)
        return (size_t)-1;
    return out->n;
}

/* The text of chunk i as a NUL-terminated static string (for comparisons). */
static const char *ctext(const char *text, const cb_chunks *cs, size_t i)
{
    static char buf[4096];
    size_t n;
    if (i >= cs->n)
        return "(none)";
    n = cs->v[i].end - cs->v[i].start;
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    memcpy(buf, text + cs->v[i].start, n);
    buf[n] = 0;
    return buf;
}

/* Every rule that holds for any text: spans inside the text, on character
 * boundaries, without whitespace at the edges, ids right, limits kept,
 * in order; without overlap, what lies between chunks is whitespace or a
 * separator match (when sep_ok). */
static void check_invariants(const char *what, const char *t, size_t len, const cb_chunks *cs,
                             const cb_vocab *v, int32_t max, int overlap, int sep_ok)
{
    size_t prev_end = 0, prev_start = 0;
    int bad = 0;
    for (size_t i = 0; i < cs->n && bad < 5; i++) {
        const cb_chunk *c = &cs->v[i];
        size_t n = c->end - c->start;
        char id[33];
        int b0 = bad;
        if (!(c->start < c->end && c->end <= len)) {
            printf("#   %s: chunk %zu span [%zu, %zu) of %zu\n", what, i, c->start, c->end, len);
            bad++;
            continue;
        }
        if (is_cont((unsigned char)t[c->start]) ||
            (c->end < len && is_cont((unsigned char)t[c->end])))
            printf("#   %s: chunk %zu cut inside a UTF-8 sequence\n", what, i), bad++;
        if (is_ws((unsigned char)t[c->start]) || is_ws((unsigned char)t[c->end - 1]))
            printf("#   %s: chunk %zu has whitespace at an edge\n", what, i), bad++;
        ref_id(t + c->start, n, id);
        if (strcmp(id, c->id) != 0)
            printf("#   %s: chunk %zu id %s, want %s\n", what, i, c->id, id), bad++;
        if (v) {
            int32_t nt = n_tokens_of(v, t + c->start, n);
            if (nt != c->n_tokens)
                printf("#   %s: chunk %zu n_tokens %d, alone it has %d\n", what, i, c->n_tokens,
                       nt),
                    bad++;
            if (max && nt > max && n_chars(t + c->start, n) > 1)
                printf("#   %s: chunk %zu has %d tokens > %d\n", what, i, nt, max), bad++;
        } else {
            if (c->n_tokens != -1)
                printf("#   %s: chunk %zu n_tokens %d in character mode\n", what, i, c->n_tokens),
                    bad++;
            if (max && n_chars(t + c->start, n) > (size_t)max)
                printf("#   %s: chunk %zu has %zu characters > %d\n", what, i,
                       n_chars(t + c->start, n), max),
                    bad++;
        }
        if (i > 0 && c->start <= prev_start)
            printf("#   %s: chunk %zu does not start after chunk %zu\n", what, i, i - 1), bad++;
        if (i > 0 && c->end <= prev_end)
            printf("#   %s: chunk %zu ends inside chunk %zu (nothing new)\n", what, i, i - 1),
                bad++;
        if (!overlap) {
            if (c->start < prev_end)
                printf("#   %s: chunk %zu overlaps the previous one\n", what, i), bad++;
            for (size_t k = prev_end; k < c->start && !sep_ok; k++)
                if (!is_ws((unsigned char)t[k]) && !(k < 3 && (unsigned char)t[0] == 0xef)) {
                    printf("#   %s: text between chunks %zu and %zu is lost (byte %zu)\n", what,
                           i - 1, i, k);
                    bad++;
                    break;
                }
        } else if (i > 0 && c->start > prev_end && !sep_ok) {
            for (size_t k = prev_end; k < c->start; k++)
                if (!is_ws((unsigned char)t[k])) {
                    printf("#   %s: text before chunk %zu is lost\n", what, i), bad++;
                    break;
                }
        }
        prev_end = c->end > prev_end ? c->end : prev_end;
        prev_start = c->start;
        if (bad > b0)
            printf("#     chunk %zu: '%.60s'\n", i, t + c->start);
    }
    for (size_t k = prev_end; k < len && !sep_ok && !bad; k++)
        if (!is_ws((unsigned char)t[k])) {
            printf("#   %s: text after the last chunk is lost (byte %zu)\n", what, k);
            bad++;
            break;
        }
    CHECKF(bad == 0, "%s", what);
}

/* Deterministic text: words (some multi-byte), sentences, lines, paragraphs. */
static char *gen_text(size_t target, uint32_t seed)
{
    static const char *words[] = {"the",    "river", "Ostrava", "café",    "naïve",  "東京",
                                  "😀",      "data",  "ledger",  "of",      "and",    "1984",
                                  "Zürich", "a",     "north",   "quarter", "résumé", "x",
                                  "ß",      "—",     "invoice"};
    size_t nw = sizeof words / sizeof *words, n = 0;
    char *s = malloc(target + 64);
    uint32_t r = seed;
    int in_sent = 0;
    while (n < target) {
        const char *w;
        r = r * 1103515245u + 12345u;
        w = words[(r >> 8) % nw];
        if (in_sent)
            s[n++] = ' ';
        memcpy(s + n, w, strlen(w));
        n += strlen(w);
        in_sent++;
        if ((r >> 20) % 9 == 0 && in_sent > 3) {
            const char *end = (r >> 4) % 3 == 0 ? "!" : (r >> 4) % 3 == 1 ? "?" : ".";
            s[n++] = end[0];
            r = r * 1103515245u + 12345u;
            int k = (int)((r >> 16) % 10);
            if (k == 0) {
                memcpy(s + n, "\n\n", 2);
                n += 2;
            } else if (k == 1) {
                s[n++] = '\n';
            } else {
                s[n++] = ' ';
            }
            in_sent = 0;
        }
    }
    s[n] = 0;
    return s;
}

static int same_chunks(const cb_chunks *a, const cb_chunks *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i].start != b->v[i].start || a->v[i].end != b->v[i].end ||
            a->v[i].n_tokens != b->v[i].n_tokens || strcmp(a->v[i].id, b->v[i].id) != 0)
            return 0;
    return 1;
}

static cb_vocab *load_vocab(const char *path)
{
    cb_gguf *g = NULL;
    cb_vocab *v = NULL;
    cb_error err;
    if (!path || cb_gguf_open(&g, path, &err) != CB_OK)
        return NULL;
    if (cb_vocab_load(&v, g, &err) != CB_OK)
        v = NULL;
    cb_gguf_free(g);
    return v;
}

static double cpu_s(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* ------------------------------------------------------------ UTF-8 */

static void test_utf8(void)
{
    static const struct {
        const char *in, *out;
        size_t first_bad, n_bad;
    } cases[] = {
        {"plain ascii", "plain ascii", 11, 0},
        {"caf\xc3\xa9 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xf0\x9f\x98\x80", 10, 0},
        {"a\xe2\x82"
         "b",
         "a\xef\xbf\xbd"
         "b",
         1, 1},
        {"\xf0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0, 3},   /* overlong lead */
        {"\xed\xa0\x80x", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx", 0, 3}, /* surrogate */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd", 0, 2},                   /* overlong '/' */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0,
         4},                                /* > U+10FFFF */
        {"\xe2\x82", "\xef\xbf\xbd", 0, 1}, /* cut by the end */
        {"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd", 0, 2},
        {"ok\xf0\x9f\x98", "ok\xef\xbf\xbd", 2, 1},
        {"12345678901234567\x80", "12345678901234567\xef\xbf\xbd", 17,
         1}, /* after the 8-byte fast path */
    };
    tcase("UTF-8: check finds the first bad byte, repair matches Python's errors=\"replace\"");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = strlen(cases[i].in), m = 0, nb = 99;
        char *out = NULL;
        size_t at = cb_utf8_check(cases[i].in, n);
        CHECKF(at == (cases[i].n_bad ? cases[i].first_bad : n), "case %zu: first bad %zu", i, at);
        CHECK_OK(cb_utf8_repair(cases[i].in, n, &out, &m, &nb));
        CHECKF(out && m == strlen(cases[i].out) && memcmp(out, cases[i].out, m) == 0,
               "case %zu repaired", i);
        CHECKF(nb == cases[i].n_bad, "case %zu: %zu replacements", i, nb);
        CHECKF(out && cb_utf8_check(out, m) == m, "case %zu: repaired text is valid", i);
        free(out);
    }
}

/* --------------------------------------------------------- cut points */

static void test_cut_points(void)
{
    cb_chunks cs = {0};
    cb_chunker *c;
    const char *t;

    tcase("cuts: a paragraph break in the second half of the window wins");
    c = mk(NULL, 50, 0, NULL);
    t = "One two three four five six seven.\n\nEight nine ten. Eleven twelve thirteen";
    CHECK(split(c, t, &cs) == 2);
    CHECK(strcmp(ctext(t, &cs, 0), "One two three four five six seven.") == 0);
    CHECK(strcmp(ctext(t, &cs, 1), "Eight nine ten. Eleven twelve thirteen") == 0);
    CHECK(cs.v[1].start == 36 && cs.v[0].end == 34);

    tcase("cuts: else a sentence end in the second half");
    t = "Alpha beta gamma delta. Epsilon zeta eta theta iota kappa";
    cb_chunker_free(c);
    c = mk(NULL, 40, 0, NULL);
    CHECK(split(c, t, &cs) == 2);
    CHECK(strcmp(ctext(t, &cs, 0), "Alpha beta gamma delta.") == 0);
    t = "She told them all: \"Stop now.\" Then they left and walked on";
    CHECK(split(c, t, &cs) == 2);
    CHECKF(strcmp(ctext(t, &cs, 0), "She told them all: \"Stop now.\"") == 0, "closing quote: '%s'",
           ctext(t, &cs, 0));

    tcase("cuts: a sentence end beats a later line break");
    t = "Alpha beta gamma. delta\nepsilon zeta eta";
    cb_chunker_free(c);
    c = mk(NULL, 30, 0, NULL);
    CHECK(split(c, t, &cs) == 2);
    CHECK(strcmp(ctext(t, &cs, 0), "Alpha beta gamma.") == 0);

    tcase("cuts: else a line break in the second half");
    t = "item one\nitem two\nitem three\nitem four";
    cb_chunker_free(c);
    c = mk(NULL, 25, 0, NULL);
    CHECK(split(c, t, &cs) >= 2);
    CHECK(strcmp(ctext(t, &cs, 0), "item one\nitem two") == 0);

    tcase("cuts: a sentence end in the first half loses to the last word boundary");
    t = "Alpha. Beta gamma delta epsilon zeta eta theta";
    cb_chunker_free(c);
    c = mk(NULL, 38, 0, NULL);
    CHECK(split(c, t, &cs) == 2);
    CHECKF(strcmp(ctext(t, &cs, 0), "Alpha. Beta gamma delta epsilon zeta") == 0, "got '%s'",
           ctext(t, &cs, 0));
    CHECK(strcmp(ctext(t, &cs, 1), "eta theta") == 0);

    tcase("cuts: else anywhere, at a character boundary");
    t = "abcdefghijklmnopqrstuvwxyz";
    cb_chunker_free(c);
    c = mk(NULL, 10, 0, NULL);
    CHECK(split(c, t, &cs) == 3);
    CHECK(strcmp(ctext(t, &cs, 0), "abcdefghij") == 0 && strcmp(ctext(t, &cs, 2), "uvwxyz") == 0);
    t = "\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80"
        "\xf0\x9f\x98\x80"; /* seven 4-byte characters */
    cb_chunker_free(c);
    c = mk(NULL, 3, 0, NULL);
    CHECK(split(c, t, &cs) == 3);
    CHECK(cs.n == 3 && cs.v[0].end == 12 && cs.v[1].start == 12 && cs.v[1].end == 24 &&
          cs.v[2].end == 28);

    tcase("cuts: CJK full stops end sentences without a space");
    t = "東京は日本の首都です。人口は多い。大阪も大きい。";
    cb_chunker_free(c);
    c = mk(NULL, 12, 0, NULL);
    CHECK(split(c, t, &cs) >= 2);
    CHECKF(strcmp(ctext(t, &cs, 0), "東京は日本の首都です。") == 0, "got '%s'", ctext(t, &cs, 0));
    CHECKF(strcmp(ctext(t, &cs, 1), "人口は多い。") == 0, "got '%s'", ctext(t, &cs, 1));
    CHECKF(strcmp(ctext(t, &cs, 2), "大阪も大きい。") == 0, "got '%s'", ctext(t, &cs, 2));

    tcase("whitespace: edges trimmed, blank documents give nothing, a BOM is skipped");
    cb_chunker_free(c);
    c = mk(NULL, 100, 0, NULL);
    CHECK(split(c, "", &cs) == 0);
    CHECK(split(c, " \n\t\r\n  ", &cs) == 0);
    t = "\n\n  Hello there.  \n";
    CHECK(split(c, t, &cs) == 1 && cs.v[0].start == 4 &&
          strcmp(ctext(t, &cs, 0), "Hello there.") == 0);
    t = "\xef\xbb\xbfHello";
    CHECK(split(c, t, &cs) == 1 && cs.v[0].start == 3);
    t = "\xe3\x80\x80\xc2\xa0 Hi \xe2\x80\x83"; /* ideographic space, NBSP, em space */
    CHECK(split(c, t, &cs) == 1 && strcmp(ctext(t, &cs, 0), "Hi") == 0);
    CHECK(split(c, "\xe3\x80\x80\xe3\x80\x80", &cs) == 0);

    tcase("no limit: max 0 gives the whole trimmed document");
    cb_chunker_free(c);
    c = mk(NULL, 0, 0, NULL);
    t = " one.\n\ntwo. ";
    CHECK(split(c, t, &cs) == 1 && strcmp(ctext(t, &cs, 0), "one.\n\ntwo.") == 0);
    cb_chunker_free(c);
    cb_chunks_free(&cs);
}

static void test_params(void)
{
    cb_chunker_params p = {NULL, 10, 10, NULL};
    cb_chunker *c = NULL;
    cb_chunks cs = {0};
    cb_error err;

    tcase("parameters: overlap >= max, negative sizes and bad regexes are refused");
    CHECK(cb_chunker_new(&c, &p, &err) == CB_ERR_INVALID && c == NULL);
    p.overlap = -1;
    CHECK(cb_chunker_new(&c, &p, &err) == CB_ERR_INVALID);
    p.overlap = 0;
    p.max = -5;
    CHECK(cb_chunker_new(&c, &p, &err) == CB_ERR_INVALID);
    p.max = 0;
    p.overlap = 1;
    CHECK(cb_chunker_new(&c, &p, &err) == CB_ERR_INVALID);
    p.overlap = 0;
    p.separator = "a(b";
    CHECK(cb_chunker_new(&c, &p, &err) == CB_ERR_INVALID);
    CHECKF(strstr(err.msg, "offset") && strstr(err.msg, "a(b"), "message: %s", err.msg);
    cb_chunker_free(NULL);
    cb_chunks_free(NULL);

    tcase("split refuses invalid UTF-8 and leaves the list as it was");
    c = mk(NULL, 10, 0, NULL);
    CHECK(cb_chunker_split(c, "good", 4, &cs) == CB_OK && cs.n == 1);
    CHECK(cb_chunker_split(c, "bad \xff text", 10, &cs) == CB_ERR_INVALID && cs.n == 1);
    cb_chunker_free(c);
    cb_chunks_free(&cs);
}

/* --------------------------------------------------------- separators */

static void test_separator(void)
{
    cb_chunks cs = {0};
    cb_chunker *c;
    const char *t;

    tcase("separator: cuts at every match, drops the match and empty pieces");
    c = mk(NULL, 100, 0, "^---$");
    t = "part one\n---\npart two\n---\n\n---\npart three\n---";
    CHECK(split(c, t, &cs) == 3);
    CHECK(strcmp(ctext(t, &cs, 0), "part one") == 0 && strcmp(ctext(t, &cs, 1), "part two") == 0 &&
          strcmp(ctext(t, &cs, 2), "part three") == 0);
    check_invariants("separator", t, strlen(t), &cs, NULL, 100, 0, 1);

    tcase("separator: a lookahead cuts before the match and keeps it");
    cb_chunker_free(c);
    c = mk(NULL, 100, 0, "(?=^# )");
    t = "# A\ntext a\n# B\ntext b\n";
    CHECK(split(c, t, &cs) == 2);
    CHECK(strcmp(ctext(t, &cs, 0), "# A\ntext a") == 0 &&
          strcmp(ctext(t, &cs, 1), "# B\ntext b") == 0);

    tcase("separator: pieces over the limit are split further, no overlap across pieces");
    cb_chunker_free(c);
    c = mk(NULL, 12, 4, "<hr>");
    t = "one two three four<hr>five six";
    CHECK(split(c, t, &cs) >= 3);
    CHECK(strcmp(ctext(t, &cs, cs.n - 1), "five six") == 0);
    CHECK(cs.v[cs.n - 2].end <= 18);
    check_invariants("separator+limit", t, strlen(t), &cs, NULL, 12, 1, 1);

    tcase("separator: Unicode-aware (\\s matches U+3000, . a whole character)");
    cb_chunker_free(c);
    c = mk(NULL, 0, 0, "\\s*。\\s*");
    t = "一。二\xe3\x80\x80。三";
    CHECK(split(c, t, &cs) == 3 && strcmp(ctext(t, &cs, 2), "三") == 0);
    cb_chunker_free(c);
    cb_chunks_free(&cs);
}

/* ------------------------------------------------------------ overlap */

static void test_overlap_chars(void)
{
    char t[512];
    size_t n = 0;
    cb_chunks cs = {0};
    cb_chunker *c = mk(NULL, 40, 10, NULL);
    int ok = 1;

    for (int i = 0; i < 60; i++)
        n += (size_t)snprintf(t + n, sizeof t - n, "w%02d ", i);
    t[--n] = 0;
    tcase("overlap (characters): each chunk starts at a word within the last N of the previous");
    CHECK(split(c, t, &cs) > 5);
    check_invariants("overlap chars", t, n, &cs, NULL, 40, 1, 0);
    for (size_t i = 1; i < cs.n; i++) {
        size_t s = cs.v[i].start, pe = cs.v[i - 1].end;
        if (!(s > cs.v[i - 1].start && s < pe && pe - s <= 10 && t[s - 1] == ' '))
            ok = 0;
    }
    CHECK(ok);
    CHECK(cs.v[cs.n - 1].end == n);
    cb_chunker_free(c);
    cb_chunks_free(&cs);
}

/* Found by fuzz_chunk_input: with overlap, the chunk after a C comment's
 * opening (a word whose only cut is the end of the previous chunk) started
 * at that word and ended where the previous one did: a second chunk holding
 * nothing new. */
static void test_overlap_inside(void)
{
    static const char t[] = ".\\n\";\n\n/* ---------------------------------------------------";
    cb_chunks cs = {0};
    cb_chunker *c = mk(NULL, 48, 8, NULL);
    tcase("overlap (characters): no chunk lies inside the previous one (fuzz finding)");
    CHECK(split(c, t, &cs) >= 2);
    check_invariants("overlap inside", t, strlen(t), &cs, NULL, 48, 1, 0);
    cb_chunker_free(c);
    cb_chunks_free(&cs);
}

/* ------------------------------------------------ invariants, at scale */

static void test_random_chars(void)
{
    static const int32_t maxes[] = {1, 7, 64, 300, 2048};
    char *t = gen_text(200000, 7);
    size_t len = strlen(t);
    cb_chunks cs = {0};
    for (size_t k = 0; k < sizeof maxes / sizeof *maxes; k++) {
        for (int ov = 0; ov < 2; ov++) {
            int32_t o = ov && maxes[k] > 4 ? maxes[k] / 4 : 0;
            cb_chunker *c = mk(NULL, maxes[k], o, NULL);
            char what[64];
            tcase("characters: %d per chunk, overlap %d: limits and coverage on 200 KB",
                  (int)maxes[k], (int)o);
            snprintf(what, sizeof what, "chars %d/%d", (int)maxes[k], (int)o);
            CHECK(c && cb_chunker_split(c, t, len, &cs) == CB_OK && cs.n > 0);
            check_invariants(what, t, len, &cs, NULL, maxes[k], o > 0, 0);
            cs.n = 0;
            cb_chunker_free(c);
        }
    }
    free(t);
    cb_chunks_free(&cs);
}

static void test_tokens(const cb_vocab *v, const char *vname, const char *text, size_t len)
{
    static const int32_t maxes[] = {16, 128, 512};
    cb_chunks a = {0}, b = {0};

    for (size_t k = 0; k < sizeof maxes / sizeof *maxes; k++) {
        for (int ov = 0; ov < 2; ov++) {
            int32_t o = ov ? maxes[k] / 8 : 0;
            cb_chunker *c = mk(v, maxes[k], o, NULL);
            char what[96];
            double fill = 0;
            tcase("tokens (%s): %d per chunk, overlap %d: n_tokens exact, limit kept, nothing lost",
                  vname, (int)maxes[k], (int)o);
            snprintf(what, sizeof what, "%s %d/%d", vname, (int)maxes[k], (int)o);
            a.n = 0;
            CHECK(c && cb_chunker_split(c, text, len, &a) == CB_OK && a.n > 1);
            check_invariants(what, text, len, &a, v, maxes[k], o > 0, 0);
            for (size_t i = 0; i + 1 < a.n; i++)
                fill += (double)a.v[i].n_tokens / maxes[k];
            fill = a.n > 1 ? fill / (double)(a.n - 1) : 1;
            CHECKF(fill > 0.6, "chunks are %.0f%% full on average", fill * 100);
            if (o > 0) {
                int worst = 0;
                for (size_t i = 1; i < a.n; i++) {
                    if (a.v[i].start < a.v[i - 1].end) {
                        /* measured as in the document: with the space before it, which
                         * BPE vocabs merge into the first word's token */
                        int32_t r = n_tokens_of(v, text + a.v[i].start - 1,
                                                a.v[i - 1].end - a.v[i].start + 1);
                        worst = r > worst ? r : worst;
                    }
                }
                CHECKF(worst <= o + 1, "overlap of %d tokens, asked for %d", worst, (int)o);
            }
            tcase("tokens (%s): %d per chunk, overlap %d: a second chunker gives identical chunks",
                  vname, (int)maxes[k], (int)o);
            {
                cb_chunker *c2 = mk(v, maxes[k], o, NULL);
                b.n = 0;
                CHECK(c2 && cb_chunker_split(c2, text, len, &b) == CB_OK);
                CHECK(same_chunks(&a, &b));
                /* and the same chunker again, with its scratch already used */
                b.n = 0;
                CHECK(cb_chunker_split(c, text, len, &b) == CB_OK);
                CHECK(same_chunks(&a, &b));
                cb_chunker_free(c2);
            }
            cb_chunker_free(c);
        }
    }
    cb_chunks_free(&a);
    cb_chunks_free(&b);
}

/* Limits smaller than a character, and separators, in token mode. */
static void test_tokens_edges(const cb_vocab *v)
{
    cb_chunks cs = {0};
    cb_chunker *c = mk(v, 1, 0, NULL);
    const char *t = "\xf0\x9f\x98\x80\xf0\x9f\x98\x80 ab";
    int ok = 1;

    tcase("tokens: a character that alone exceeds the limit is a chunk of its own");
    CHECK(split(c, t, &cs) >= 3);
    for (size_t i = 0; i < cs.n; i++)
        if (cs.v[i].n_tokens > 1 && n_chars(t + cs.v[i].start, cs.v[i].end - cs.v[i].start) != 1)
            ok = 0;
    CHECK(ok);
    CHECK(cs.n >= 2 && cs.v[0].end == 4 && cs.v[1].start == 4 && cs.v[1].end == 8);
    check_invariants("max 1 token", t, strlen(t), &cs, v, 1, 0, 0);

    tcase("tokens: separator pieces counted alone, no limit with max 0");
    cb_chunker_free(c);
    c = mk(v, 0, 0, "^---$");
    t = "first part, with words\n---\nsecond part\n";
    CHECK(split(c, t, &cs) == 2);
    CHECK(cs.n == 2 && cs.v[0].n_tokens == n_tokens_of(v, "first part, with words", 22) &&
          cs.v[1].n_tokens == n_tokens_of(v, "second part", 11));
    cb_chunker_free(c);
    cb_chunks_free(&cs);
}

/* Chunking 4x the text costs about 4x, not 16x. */
static void test_linear(const cb_vocab *v, const char *vname)
{
    char *small = gen_text(250000, 3), *big = gen_text(1000000, 3);
    cb_chunker *c = mk(v, 512, 0, NULL);
    cb_chunks cs = {0};
    double t0, t_small = 1e9, t_big = 1e9;

    tcase("tokens (%s): chunking a 1 MB document is linear, not quadratic", vname);
    for (int r = 0; r < 2; r++) {
        cs.n = 0;
        t0 = cpu_s();
        CHECK(cb_chunker_split(c, small, strlen(small), &cs) == CB_OK);
        t_small = fmin(t_small, cpu_s() - t0);
        cs.n = 0;
        t0 = cpu_s();
        CHECK(cb_chunker_split(c, big, strlen(big), &cs) == CB_OK);
        t_big = fmin(t_big, cpu_s() - t0);
    }
    printf("#   %s: 250 KB in %.3f s, 1 MB in %.3f s (%.1f MB/s)\n", vname, t_small, t_big,
           t_big > 0 ? 1.0 / t_big : 0.0);
    CHECKF(t_big < 8 * t_small + 0.05, "1 MB took %.3f s, 250 KB %.3f s", t_big, t_small);
    cb_chunker_free(c);
    cb_chunks_free(&cs);
    free(small);
    free(big);
}

/* The text of MuSiQue's passages (first `max` bytes), or NULL. */
static char *musique_text(size_t max, size_t *len)
{
    const char *dir = t_shared_data();
    char path[1024], *raw, *out;
    size_t n, o = 0;
    if (!dir)
        return NULL;
    snprintf(path, sizeof path, "%s/musique_s.json", dir);
    if (!(raw = t_read_file(path, &n)))
        return NULL;
    /* crude: take every "text": "..." value, unescape \n and \", join with blank lines */
    out = malloc(max + 1);
    for (char *p = raw; out && (p = strstr(p, "\"text\": \"")) != NULL && o + 4096 < max;) {
        p += 9;
        while (*p && *p != '"' && o + 8 < max) {
            if (*p == '\\' && p[1]) {
                p++;
                if (*p == 'n')
                    out[o++] = '\n';
                else if (*p == 'u') { /* \uXXXX: keep as is, it stays valid UTF-8 */
                    out[o++] = '\\';
                    out[o++] = 'u';
                } else
                    out[o++] = *p;
                p++;
            } else {
                out[o++] = *p++;
            }
        }
        out[o++] = '\n';
        out[o++] = '\n';
    }
    free(raw);
    if (!out)
        return NULL;
    out[o] = 0;
    *len = o;
    return out;
}

int main(void)
{
    char tiny_path[1024];
    const char *tmp = getenv("CB_TEST_TMP");
    cb_vocab *tiny, *smol;

    TEST_BEGIN();
    test_utf8();
    test_params();
    test_cut_points();
    test_separator();
    test_overlap_chars();
    test_overlap_inside();
    test_random_chars();

    snprintf(tiny_path, sizeof tiny_path, "%s/tiny-vocab.gguf", tmp && *tmp ? tmp : "tests/tmp");
    tiny = load_vocab(tiny_path);
    if (tiny) {
        char *t = gen_text(60000, 11);
        test_tokens(tiny, "tiny BPE", t, strlen(t));
        test_tokens_edges(tiny);
        test_linear(tiny, "tiny BPE");
        free(t);
        cb_vocab_free(tiny);
    } else {
        tskip("tokens (tiny BPE)", "tests/tmp/tiny-vocab.gguf missing: run tests/run.sh");
    }
    smol = load_vocab(t_smol_model());
    if (smol) {
        size_t len = 0;
        char *t = musique_text(300000, &len);
        if (!t) {
            t = gen_text(200000, 5);
            len = strlen(t);
        }
        test_tokens(smol, "SmolLM2", t, len);
        test_linear(smol, "SmolLM2");
        free(t);
        cb_vocab_free(smol);
    } else {
        tskip("tokens (SmolLM2)", "default model not fetched");
    }
    TEST_END();
}
