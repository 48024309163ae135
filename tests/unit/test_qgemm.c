/* test_qgemm.c - every blocked 8-bit kernel of this build gives the
 * portable kernel's bits (qgemm.h's contract), on every block type, with
 * row counts that are not a multiple of the kernels' 4 and panels cut
 * short:
 *   - the native kernels this CPU runs (AVX2, AVX-VNNI, AVX-512BW,
 *     AVX-512 VNNI: whichever qg_cpu_isas reports), through the same
 *     packing and dispatch the CPU backend uses;
 *   - the AVX-VNNI and AVX-512 kernels compiled on SIMDe's portable
 *     intrinsics (QG_EMULATE; built when libsimde-dev is installed), so
 *     that a machine without those instructions still tests their logic;
 *   - the one-row kernels (decode) against the blocked ones, row by row;
 *   - the panels' interleave, 8 and 16 rows, against the portable one.
 * And the portable kernel against a plain double loop of the same math
 * (activations quantized, weights decoded by cb_dequant_row): 1e-10. */
#include "../../lib/backend/qgemm.h"
#include "cbcore.h"
#include "test.h"

#include <math.h>

#ifdef QG_HAVE_EMU
void qg_gemm_avxvnni_emu(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq,
                         size_t ldxq, int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_avx512_emu(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq,
                        size_t ldxq, int64_t n, int np, float *y, int64_t ldy);
void qg_gemm_avx512vnni_emu(cb_type t, const uint8_t *panel, int64_t n_in, const uint8_t *xq,
                            size_t ldxq, int64_t n, int np, float *y, int64_t ldy);
void qg_rows_avxvnni_emu(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                         const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1, float *y,
                         int64_t ldy);
void qg_rows_avx512vnni_emu(cb_type t, const uint8_t *w, size_t row_bytes, int64_t n_in,
                            const uint8_t *xq, size_t ldxq, int nr, int64_t o0, int64_t o1,
                            float *y, int64_t ldy);
#endif

static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1103515245u + 12345u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef struct problem {
    cb_type t;
    int64_t n, n_in, n_out;
    uint8_t *w; /* [n_out] rows in t */
    size_t rb;
    float *x;    /* [n, n_in] */
    uint8_t *xq; /* [n] quantized rows */
    size_t ab;
    float *ref; /* [n, n_out]: the portable kernel's */
} problem;

static void problem_make(problem *p, cb_type t, int64_t n, int64_t n_in, int64_t n_out)
{
    qg_kernels c;
    qg_select_isa(QG_ISA_C, &c);
    p->t = t, p->n = n, p->n_in = n_in, p->n_out = n_out;
    p->rb = cb_type_row_bytes(t, n_in);
    p->w = malloc(p->rb * (size_t)n_out);
    p->x = malloc(sizeof(float) * (size_t)(n * n_in));
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t j = 0; j < n_in; j++)
            row[j] = 0.05f * frand();
        cb_quant_row(t, row, p->w + (size_t)o * p->rb, n_in);
    }
    /* outliers every 37th value: the K form's one scale a block meets them */
    for (int64_t j = 0; j < n * n_in; j++)
        p->x[j] = frand() * (j % 37 == 0 ? 6.0f : 1.0f);
    p->ab = qg_act_bytes(t, n_in);
    p->xq = malloc(p->ab * (size_t)n);
    for (int64_t r = 0; r < n; r++) {
        if (qg_is_k(t))
            c.quant_k(p->x + r * n_in, n_in, (qg_q8k *)(void *)(p->xq + (size_t)r * p->ab));
        else
            c.quant_0(p->x + r * n_in, n_in, (qmm_q8 *)(void *)(p->xq + (size_t)r * p->ab));
    }
    p->ref = malloc(sizeof(float) * (size_t)(n * n_out));
    free(row);
}

static void problem_free(problem *p) { free(p->w), free(p->x), free(p->xq), free(p->ref); }

/* y = the product through k's packer and kernel, panel by panel */
static void run_gemm(const problem *p, const qg_kernels *k, float *y)
{
    int pr = k->layout.p;
    uint8_t *panel = malloc(qg_panel_bytes(p->t, p->n_in, pr));
    for (int64_t o0 = 0; o0 < p->n_out; o0 += pr) {
        int np = p->n_out - o0 < pr ? (int)(p->n_out - o0) : pr;
        qg_pack(p->t, p->w, p->rb, p->n_in, o0, np, panel, k);
        k->gemm(p->t, panel, p->n_in, p->xq, p->ab, p->n, np, y + o0, p->n_out);
    }
    free(panel);
}

/* the plain double loop: dequantized weights times d * q */
static double same_math_nmse(const problem *p, const float *y)
{
    float *w = malloc(sizeof(float) * (size_t)p->n_in),
          *xd = malloc(sizeof(float) * (size_t)p->n_in);
    double e = 0, s = 0;
    int g = qg_is_k(p->t) ? 256 : 32;
    for (int64_t r = 0; r < p->n; r++) {
        const uint8_t *xr = p->xq + (size_t)r * p->ab;
        for (int64_t b = 0; b < p->n_in / g; b++) {
            float d;
            const int8_t *q;
            if (g == 256) {
                const qg_q8k *k = (const qg_q8k *)(const void *)xr + b;
                d = k->d, q = k->q;
            } else {
                const qmm_q8 *k = (const qmm_q8 *)(const void *)xr + b;
                d = k->d, q = k->q;
            }
            for (int j = 0; j < g; j++)
                xd[b * g + j] = d * (float)q[j];
        }
        for (int64_t o = 0; o < p->n_out; o++) {
            cb_dequant_row(p->t, p->w + (size_t)o * p->rb, w, p->n_in);
            double acc = 0;
            for (int64_t j = 0; j < p->n_in; j++)
                acc += (double)w[j] * xd[j];
            double dy = y[r * p->n_out + o] - acc;
            e += dy * dy, s += acc * acc;
        }
    }
    free(w), free(xd);
    return s > 0 ? e / s : e;
}

static const char *isa_names[] = {"c", "avx2", "avxvnni", "avx512", "avx512vnni"};

int main(void)
{
    static const cb_type types[] = {CB_TYPE_Q4_0, CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1,
                                    CB_TYPE_Q8_0, CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K};
    /* rows, inputs, outputs: 1..4 rows a step and their remainders, panels cut short (8 and 16) */
    static const int64_t shapes[][3] = {{1, 256, 8},    {3, 512, 21},  {6, 768, 16},
                                        {13, 1280, 37}, {5, 16896, 9}, /* rows past the one-row
                                         kernels' chunks (whole rows up to 16384) */
                                        {8, 2560, 300}, /* the few-row kernel's chunks of
                                         blocks and tiles of weight rows, both cut short */
                                        {11, 512, 263}};
    unsigned isas = qg_cpu_isas();
    TEST_BEGIN();
    printf("# this CPU runs:");
    for (int i = 0; i <= QG_ISA_AVX512VNNI; i++)
        if (isas & 1u << i)
            printf(" %s", isa_names[i]);
    printf("\n");
#ifndef QG_HAVE_EMU
    printf(
        "# the AVX-VNNI and AVX-512 kernels are not emulated in this build (no SIMDe: make deps installs "
        "libsimde-dev)\n");
#endif
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        cb_type t = types[ti];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t n = shapes[si][0], n_in = shapes[si][1], n_out = shapes[si][2];
            if (n_in % cb_type_block_elems(t))
                continue;
            problem p;
            problem_make(&p, t, n, n_in, n_out);
            qg_kernels c;
            qg_select_isa(QG_ISA_C, &c);
            run_gemm(&p, &c, p.ref);
            double e = same_math_nmse(&p, p.ref);
            tcase(
                "qgemm %s %lldx%lldx%lld: portable kernel vs same-math double loop (nmse %.1e, bound 1e-10)",
                cb_type_name(t), (long long)n, (long long)n_in, (long long)n_out, e);
            CHECKF(e <= 1e-10, "nmse %.3e", e);
            float *y = malloc(sizeof(float) * (size_t)(n * n_out));
            for (int isa = QG_ISA_AVX2; isa <= QG_ISA_AVX512VNNI; isa++) {
                char name[160];
                snprintf(name, sizeof name,
                         "qgemm %s %lldx%lldx%lld: %s kernel = portable, bit for bit",
                         cb_type_name(t), (long long)n, (long long)n_in, (long long)n_out,
                         isa_names[isa]);
                if (!(isas & 1u << isa)) {
                    tskip(
                        name,
                        "this CPU has not the instructions (the SIMDe case below runs the kernel)");
                    continue;
                }
                tcase("%s", name);
                qg_kernels k;
                qg_select_isa(isa, &k);
                memset(y, 0xff, sizeof(float) * (size_t)(n * n_out));
                run_gemm(&p, &k, y);
                CHECK(memcmp(y, p.ref, sizeof(float) * (size_t)(n * n_out)) == 0);
            }
#ifdef QG_HAVE_EMU
            static const struct {
                qg_gemm_fn f;
                qg_layout l;
                const char *name;
            } emu[] = {{qg_gemm_avxvnni_emu, {QG_P, 1}, "avxvnni"},
                       {qg_gemm_avx512_emu, {QG_PMAX, 0}, "avx512"},
                       {qg_gemm_avx512vnni_emu, {QG_PMAX, 1}, "avx512vnni"}};
            for (size_t i = 0; i < sizeof emu / sizeof emu[0]; i++) {
                tcase("qgemm %s %lldx%lldx%lld: %s kernel on SIMDe = portable, bit for bit",
                      cb_type_name(t), (long long)n, (long long)n_in, (long long)n_out,
                      emu[i].name);
                qg_kernels ek = c; /* the portable packer, in the emulated kernel's layout */
                ek.gemm = emu[i].f, ek.layout = emu[i].l;
                memset(y, 0xff, sizeof(float) * (size_t)(n * n_out));
                run_gemm(&p, &ek, y);
                CHECK(memcmp(y, p.ref, sizeof(float) * (size_t)(n * n_out)) == 0);
            }
#endif
            /* the one-row and few-row kernels (qg_gemv's choice), row by
             * row and all rows together: the blocked kernels' bits */
            for (int isa = QG_ISA_C; isa <= QG_ISA_AVX512VNNI; isa++) {
                qg_kernels k;
                qg_select_isa(isa, &k);
                int few = k.rows && (unsigned)t < 32 && (k.rows_types >> t & 1);
                if (isa > QG_ISA_AVX2 && !((isas & 1u << isa) && k.rows))
                    continue; /* the same one-row kernel as AVX2's */
                char name[160];
                snprintf(
                    name, sizeof name,
                    "qgemm %s %lldx%lldx%lld: %s one-row%s kernel = blocked, bit for bit (a row, and rows together)",
                    cb_type_name(t), (long long)n, (long long)n_in, (long long)n_out,
                    isa_names[isa],
                    few      ? " and few-row"
                    : k.rows ? " (and few-row, called)"
                             : "");
                if (!(isas & 1u << isa)) {
                    tskip(name, "this CPU has no AVX2");
                    continue;
                }
                tcase("%s", name);
                for (int64_t r = 0; r < n; r++) /* row by row */
                    qg_gemv(&k, t, p.w, p.rb, n_in, p.xq + (size_t)r * p.ab, p.ab, 1, 0, n_out,
                            y + r * n_out, n_out);
                int rows1 = memcmp(y, p.ref, sizeof(float) * (size_t)(n * n_out)) == 0;
                int mins[2] = {k.rows_min, 1};
                for (int m = 0; m < (k.rows ? 2 : 1); m++) {
                    /* all rows in one call: the few-row kernel from its
                     * default count, and for every row (a lone one too) */
                    int lo = k.rows_min = mins[m];
                    memset(y, 0xff, sizeof(float) * (size_t)(n * n_out));
                    qg_gemv(&k, t, p.w, p.rb, n_in, p.xq, p.ab, (int)n, 0, n_out, y, n_out);
                    CHECKF(rows1 && memcmp(y, p.ref, sizeof(float) * (size_t)(n * n_out)) == 0,
                           "rows from %d", lo);
                }
                if (k.rows) { /* the few-row kernel itself, on every type it has */
                    memset(y, 0xff, sizeof(float) * (size_t)(n * n_out));
                    for (int64_t r = 0; r < n; r += QG_ROWS)
                        k.rows(t, p.w, p.rb, n_in, p.xq + (size_t)r * p.ab, p.ab,
                               n - r < QG_ROWS ? (int)(n - r) : QG_ROWS, 0, n_out, y + r * n_out,
                               n_out);
                    CHECKF(memcmp(y, p.ref, sizeof(float) * (size_t)(n * n_out)) == 0,
                           "few-row kernel called");
                }
            }
#ifdef QG_HAVE_EMU
            {
                /* every type it has, qg_gemv's choice or not, QG_ROWS rows a call */
                static const struct {
                    qg_gemv_fn f;
                    const char *name;
                } er[] = {{qg_rows_avxvnni_emu, "avxvnni"}, {qg_rows_avx512vnni_emu, "avx512vnni"}};
                for (size_t i = 0; i < sizeof er / sizeof er[0]; i++) {
                    tcase(
                        "qgemm %s %lldx%lldx%lld: %s few-row kernel on SIMDe = blocked, bit for bit",
                        cb_type_name(t), (long long)n, (long long)n_in, (long long)n_out,
                        er[i].name);
                    memset(y, 0xff, sizeof(float) * (size_t)(n * n_out));
                    for (int64_t r = 0; r < n; r += QG_ROWS)
                        er[i].f(t, p.w, p.rb, n_in, p.xq + (size_t)r * p.ab, p.ab,
                                n - r < QG_ROWS ? (int)(n - r) : QG_ROWS, 0, n_out, y + r * n_out,
                                n_out);
                    CHECK(memcmp(y, p.ref, sizeof(float) * (size_t)(n * n_out)) == 0);
                }
            }
#endif
            free(y);
            problem_free(&p);
        }
    }
    /* the AVX2 packer = the portable one, byte for byte, every type and
     * layout (8 and 16 rows, scales as pairs and as int32), a full panel
     * and one cut short */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char name[96];
        snprintf(name, sizeof name, "qgemm: AVX2 packer of %s panels = portable, every layout",
                 cb_type_name(types[ti]));
        if (!(isas & 1u << QG_ISA_AVX2)) {
            tskip(name, "this CPU has no AVX2");
            continue;
        }
        tcase("%s", name);
        cb_type t = types[ti];
        int64_t n_in = 2560 / cb_type_block_elems(t) * cb_type_block_elems(t), n_out = 29;
        problem p;
        problem_make(&p, t, 1, n_in, n_out);
        qg_kernels c, a;
        qg_select_isa(QG_ISA_C, &c);
        qg_select_isa(QG_ISA_AVX2, &a);
        for (int pr = 8; pr <= 16; pr += 8)
            for (int s32 = 0; s32 <= 1; s32++)
                for (int nr = pr; nr >= pr - 3; nr -= 3) {
                    size_t pb = qg_panel_bytes(t, n_in, pr);
                    uint8_t *x = malloc(pb), *y = malloc(pb);
                    memset(x, 0x5a, pb), memset(y, 0xa5, pb);
                    c.layout = a.layout = (qg_layout){pr, s32};
                    qg_pack(t, p.w, p.rb, n_in, 5, nr, x, &c);
                    qg_pack(t, p.w, p.rb, n_in, 5, nr, y, &a);
                    CHECKF(memcmp(x, y, pb) == 0, "%d rows of %d, sc32 %d", nr, pr, s32);
                    free(x), free(y);
                }
        problem_free(&p);
    }
    /* the AVX2 decoder = the portable one, every type */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char name[96];
        snprintf(name, sizeof name, "qgemm: AVX2 decoder of %s blocks = portable",
                 cb_type_name(types[ti]));
        if (!(isas & 1u << QG_ISA_AVX2)) {
            tskip(name, "this CPU has no AVX2");
            continue;
        }
        tcase("%s", name);
        cb_type t = types[ti];
        size_t rb = cb_type_row_bytes(t, 1024);
        uint8_t *w = malloc(rb);
        float row[1024];
        for (int j = 0; j < 1024; j++)
            row[j] = frand() * (j % 9 == 0 ? 3.0f : 1.0f);
        cb_quant_row(t, row, w, 1024);
        int g = qg_is_k(t) ? 256 : 32;
        for (int b = 0; b < 1024 / g; b++) {
            int8_t qa[256], qc[256];
            qg_scales sa, sc;
            memset(&sa, 0, sizeof sa), memset(&sc, 0, sizeof sc);
            qg_decode_avx2(t, w + (size_t)b * cb_type_row_bytes(t, g), qa, &sa);
            qg_decode_c(t, w + (size_t)b * cb_type_row_bytes(t, g), qc, &sc);
            CHECK(memcmp(qa, qc, (size_t)g) == 0 && memcmp(&sa, &sc, sizeof sa) == 0);
        }
        free(w);
    }
    /* the interleave, 8 and 16 rows */
    for (int pr = 8; pr <= 16; pr += 8) {
        if (!(isas & 1u << QG_ISA_AVX2)) {
            tskip("qgemm: AVX2 interleave = portable", "this CPU has no AVX2");
            continue;
        }
        tcase("qgemm: AVX2 interleave of %d rows = portable", pr);
        int8_t q[16 * 256];
        uint8_t a[16 * 256], b[16 * 256];
        for (int i = 0; i < 16 * 256; i++)
            q[i] = (int8_t)(i * 7 + i / 256);
        qg_interleave_c(q, 256, pr, a);
        qg_interleave_avx2(q, 256, pr, b);
        CHECK(memcmp(a, b, (size_t)pr * 256) == 0);
    }
    TEST_END();
}
