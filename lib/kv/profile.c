/* profile.c - profiles: the speeds cb-profile measures on one machine
 * (prefill and recompute a layer, the tiers' KV reads), their JSON, the
 * cost model's figures fitted from them, and the predictions made from
 * them for placement (cb_store_place): T_recompute(r, L) interpolated from
 * the measurements, T_load(L, tier) = KV bytes per token x L / the tier's
 * throughput.  The loading controller that chooses --ratio auto's ratio is
 * the blend's cost model (blend.c, plan_auto), fed the figures fitted here. */
#include "kv.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cb_profile_type_index(cb_type t)
{
    switch (t) {
    case CB_TYPE_F32: return 0;
    case CB_TYPE_F16: return 1;
    case CB_TYPE_BF16: return 2;
    case CB_TYPE_Q8_0: return 3;
    default: return -1;
    }
}

static const char *const type_keys[4] = {"f32", "f16", "bf16", "q8_0"};

void cb_profile_name(cb_hash128 model, const char *backend, char *buf, size_t n)
{
    char hex[33];
    cb_hash128_hex(model, hex);
    snprintf(buf, n, "profile-%s-%s.json", hex, backend);
}

static json_t *points(const cb_profile_point *pt, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            a, json_pack("{s:I, s:f, s:f, s:f}", "length", (json_int_t)pt[i].length, "ratio",
                         pt[i].ratio, "ms_per_layer", pt[i].ms_per_layer, "spread", pt[i].spread));
    return a;
}

cb_status cb_profile_to_json(const cb_profile *p, char **json)
{
    json_t *kvb = json_object(), *tiers = json_array();
    for (int i = 0; i < 4; i++)
        json_object_set_new(kvb, type_keys[i], json_real(p->kv_bytes_per_token[i]));
    for (int i = 0; i < p->n_tiers; i++)
        json_array_append_new(tiers,
                              json_pack("{s:s, s:f, s:f}", "name", p->tiers[i].name, "warm_mbs",
                                        p->tiers[i].warm_mbs, "cold_mbs", p->tiers[i].cold_mbs));
    json_t *o =
        json_pack("{s:i, s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:o}", "version", 1, "model", p->model,
                  "backend", p->backend, "n_layer", p->n_layer, "threads", p->threads,
                  "kv_bytes_per_token", kvb, "prefill", points(p->prefill, p->n_prefill),
                  "recompute", points(p->recompute, p->n_recompute), "tiers", tiers);
    json_t *sc = json_array();
    for (int i = 0; i < p->n_scoring; i++) {
        const cb_profile_scoring *e = &p->scoring[i];
        json_array_append_new(sc, json_pack("{s:I, s:I, s:I, s:f, s:f}", "length",
                                            (json_int_t)e->length, "rows", (json_int_t)e->rows,
                                            "keys", (json_int_t)e->keys, "ms_per_layer",
                                            e->ms_per_layer, "spread", e->spread));
    }
    if (o)
        json_object_set_new(o, "scoring", sc);
    else
        json_decref(sc);
    if (o)
        json_object_set_new(o, "costs",
                            json_pack("{s:f, s:f, s:f}", "load", (double)p->costs.load, "attn",
                                      (double)p->costs.attn, "score", (double)p->costs.score));
    if (!o)
        return CB_ERR_NOMEM;
    *json = json_dumps(o, JSON_INDENT(1));
    json_decref(o);
    return *json ? CB_OK : CB_ERR_NOMEM;
}

static int read_points(json_t *a, cb_profile_point *pt, int max)
{
    size_t i;
    json_t *e;
    int n = 0;
    if (!json_is_array(a))
        return -1;
    json_array_foreach(a, i, e) {
        if (n == max)
            return -1;
        json_int_t len;
        double r, ms, sp;
        if (json_unpack(e, "{s:I, s:F, s:F, s:F}", "length", &len, "ratio", &r, "ms_per_layer", &ms,
                        "spread", &sp))
            return -1;
        /* what a measurement can be; interpolation assumes it */
        if (len < 1 || len > (1 << 30) || !(r >= 0 && r <= 1) || !(ms >= 0) || !(sp >= 0))
            return -1;
        pt[n++] = (cb_profile_point){len, r, ms, sp};
    }
    return n;
}

/* "scoring" (optional: profiles from before it have none, n 0); -1: malformed */
static int read_scoring(json_t *a, cb_profile_scoring *sc, int max)
{
    size_t i;
    json_t *e;
    int n = 0;
    if (!a)
        return 0;
    if (!json_is_array(a))
        return -1;
    json_array_foreach(a, i, e) {
        json_int_t len, rows, keys;
        double ms, sp;
        if (n == max || json_unpack(e, "{s:I, s:I, s:I, s:F, s:F}", "length", &len, "rows", &rows,
                                    "keys", &keys, "ms_per_layer", &ms, "spread", &sp))
            return -1;
        /* what a measurement can be: the rows' keys at most each row's position + 1 */
        if (len < 1 || len > (1 << 30) || rows < 1 || rows > len || keys < 1 || keys > rows * len ||
            !(ms >= 0 && ms < 1e30) || !(sp >= 0))
            return -1;
        sc[n++] = (cb_profile_scoring){len, rows, keys, ms, sp};
    }
    return n;
}

cb_status cb_profile_from_json(cb_profile *p, const char *text, size_t len, cb_error *err)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je), *kvb = NULL, *pre = NULL, *rec = NULL, *tiers = NULL;
    const char *model, *backend;
    int version, n_layer, threads;

    memset(p, 0, sizeof *p);
    if (!o)
        return cb_error_set(err, CB_ERR_FORMAT, "profile: %s (line %d)", je.text, je.line);
    if (json_unpack_ex(o, &je, 0, "{s:i, s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:o}", "version",
                       &version, "model", &model, "backend", &backend, "n_layer", &n_layer,
                       "threads", &threads, "kv_bytes_per_token", &kvb, "prefill", &pre,
                       "recompute", &rec, "tiers", &tiers) ||
        version != 1) {
        json_decref(o);
        return cb_error_set(err, CB_ERR_FORMAT, "profile: %s",
                            version != 1 ? "unknown version" : je.text);
    }
    snprintf(p->model, sizeof p->model, "%s", model);
    snprintf(p->backend, sizeof p->backend, "%s", backend);
    p->n_layer = n_layer;
    p->threads = threads;
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(kvb, type_keys[i]);
        p->kv_bytes_per_token[i] = json_is_number(v) ? json_number_value(v) : 0;
    }
    p->n_prefill = read_points(pre, p->prefill, CB_PROFILE_MAX);
    p->n_recompute = read_points(rec, p->recompute, CB_PROFILE_MAX * 8);
    size_t i;
    json_t *t;
    p->n_tiers = 0;
    json_array_foreach(tiers, i, t) {
        const char *name;
        double w, c;
        if (p->n_tiers == 16 ||
            json_unpack(t, "{s:s, s:F, s:F}", "name", &name, "warm_mbs", &w, "cold_mbs", &c)) {
            p->n_prefill = -1;
            break;
        }
        cb_profile_tier *pt = &p->tiers[p->n_tiers++];
        snprintf(pt->name, sizeof pt->name, "%s", name);
        pt->warm_mbs = w;
        pt->cold_mbs = c;
    }
    if ((p->n_scoring = read_scoring(json_object_get(o, "scoring"), p->scoring, CB_PROFILE_MAX)) <
        0)
        p->n_prefill = -1, p->n_scoring = 0;
    json_t *costs = json_object_get(o, "costs"); /* optional: profiles from before it */
    float *fig[3] = {&p->costs.load, &p->costs.attn, &p->costs.score};
    const char *const fig_keys[3] = {"load", "attn", "score"};
    for (int k = 0; costs && k < 3; k++) {
        json_t *v = json_object_get(costs, fig_keys[k]);
        double d = json_is_number(v) ? json_number_value(v) : 0;
        if (!json_is_object(costs) || (v && !json_is_number(v)) || !(d >= 0 && d < 1e30))
            p->n_prefill = -1;
        else
            *fig[k] = (float)d;
    }
    json_decref(o);
    if (p->n_prefill < 0 || p->n_recompute < 0 || n_layer < 1)
        return cb_error_set(err, CB_ERR_FORMAT, "profile: malformed measurements");
    return CB_OK;
}

/* Full prefill's time a layer, fitted over the measured lengths as
 * a L + c L^2 / 2 (least squares on t / L = a + c L / 2): a is a row's
 * products with the layer's weights, c a (row, key)'s attention (its
 * 2 n_head head_dim multiply-adds), which gives attn; the first tier's
 * warm speed (a byte read, checked and placed as cb-run's loader does)
 * over a multiply-add gives load, the loader's time a byte (which the
 * cost model adds to the computing on the CPU only, where the loader
 * takes the cores the layers need).  Measurements at one length cannot
 * tell a from c: there the attention is taken at the built-in figure (attn
 * stays 0) and a follows, so that loading still has its figure.
 * Probe's scoring steps give score, so that the model's predicted step
 * equals the measured one: the model prices a scoring row at a layer as
 * its attention again times score (blend.c, plan_costs: (cost - 1) x
 * score, cost - 1 = key_cost x its keys, in a row's products), which is
 * x = keys x attn x 2 q multiply-adds of mac_ms each, attn the figure the
 * model will use (this profile's, else the built-in); a step of t ms is
 * predicted as score x, and score is the least squares fit through the
 * origin over the lengths, sum t x / sum x^2.  A figure that cannot be
 * fitted stays 0: the built-in. */
void cb_profile_fit_costs(cb_profile *p, const cb_model *m)
{
    const cb_hparams *hp = cb_model_hparams(m);
    double q = (double)hp->n_head * hp->head_dim, kv = (double)hp->n_head_kv * hp->head_dim;
    double weights = (double)hp->n_embd * (2 * q + 2 * kv) + 3.0 * hp->n_embd * hp->n_ff;
    double sx = 0, sy = 0, sxx = 0, sxy = 0, one = 0;
    int n = 0;
    memset(&p->costs, 0, sizeof p->costs);
    for (int i = 0; i < p->n_prefill; i++, n++) {
        double L = (double)p->prefill[i].length, x = L / 2, y = p->prefill[i].ms_per_layer / L;
        sx += x, sy += y, sxx += x * x, sxy += x * y;
        one += y / (weights + cb_model_attn_cost(m) * q * L) / p->n_prefill;
    }
    double d = n * sxx - sx * sx;
    double c = n > 1 && d > 0 ? (n * sxy - sx * sy) / d : 0, a = (sy - c * sx) / (n ? n : 1);
    double mac_ms = n > 1 && d > 0 ? a / weights : one;
    if (!(a > 0) || !(mac_ms > 0))
        return;
    if (c > 0)
        p->costs.attn = (float)(c / (2 * q) / mac_ms);
    if (p->n_tiers > 0 && p->tiers[0].warm_mbs > 0)
        p->costs.load = (float)(1.0 / (p->tiers[0].warm_mbs * 1e3) / mac_ms);
    double key_ms = (p->costs.attn > 0 ? p->costs.attn : cb_model_attn_cost(m)) * 2 * q * mac_ms;
    double sxt = 0, sxx2 = 0;
    for (int i = 0; i < p->n_scoring; i++) {
        double x = key_ms * (double)p->scoring[i].keys;
        sxt += x * p->scoring[i].ms_per_layer, sxx2 += x * x;
    }
    double score = sxx2 > 0 ? sxt / sxx2 : 0;
    if (score > 0 && score < 1e29) /* beyond what a figure can be: none */
        p->costs.score = (float)score;
}

/* Probe's scoring step timed on f and kv after a full prefill of L tokens
 * (every layer's K and V in kv, f holding the L rows): the last n rows run
 * through `layer`, as probe's first pass runs the question's, then their
 * attention mass over the L keys (cb_fwd_mass_add, the blend's default
 * weighting by the value rows' norms), timed to the device's end: repeat
 * samples into ms[repeat], each the mean of as many back-to-back steps as
 * take about 20 ms (1 to 256), so that a short step is timed above the
 * clock's and the scheduler's noise; *keys: the (row, key) pairs they
 * score there (a sliding window's at most).  The rows' K and V at the
 * layer are written again.  Errors: CB_ERR_RANGE (n not in 1..L, no such
 * layer, repeat < 1), CB_ERR_NOMEM, the forward pass's and the device's;
 * no mass sum is left open on f. */
cb_status cb_profile_time_score(cb_fwd *f, cb_kvcache *kv, int32_t layer, int32_t L, int32_t n,
                                int repeat, double *ms, int64_t *keys)
{
    const cb_model *m = cb_fwd_model(f);
    if (n < 1 || n > L || layer < 0 || layer >= cb_model_hparams(m)->n_layer || repeat < 1)
        return CB_ERR_RANGE;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n), w = cb_model_layer_window(m, layer);
    cb_status st, est;
    if (!rows)
        return CB_ERR_NOMEM;
    *keys = 0;
    for (int32_t i = 0; i < n; i++) { /* the prompt's last rows, as a question's */
        rows[i] = L - n + i;
        *keys += w > 0 && rows[i] + 1 > w ? w : rows[i] + 1;
    }
    /* their queries at the layer, as probe's first pass computes them */
    st = cb_fwd_layer(f, kv, layer, rows, n);
    free(rows);
    if (st != CB_OK || (st = cb_fwd_mass_begin(f, L, cb_blend_defaults().probe_values)) != CB_OK)
        return st;
    double t0 = cb_now_ms();
    if ((st = cb_fwd_mass_add(f, kv, layer, 0, n)) == CB_OK && (st = cb_model_sync(m)) == CB_OK) {
        double one = cb_now_ms() - t0; /* the calls a sample: about 20 ms of them, 1 to 256 */
        int calls = one > 20.0 / 256 ? (int)ceil(20.0 / one) : 256;
        for (int r = 0; r < repeat && st == CB_OK; r++) {
            t0 = cb_now_ms();
            for (int k = 0; k < calls && st == CB_OK; k++)
                st = cb_fwd_mass_add(f, kv, layer, 0, n);
            if (st == CB_OK && (st = cb_model_sync(m)) == CB_OK)
                ms[r] = (cb_now_ms() - t0) / calls;
        }
    }
    est = cb_fwd_mass_end(f, NULL);
    return st != CB_OK ? st : est;
}

/* costs.load is a byte of the first tier, warm (cb_profile_fit_costs):
 * another tier's, cold, in proportion to their measured speeds. */
float cb_profile_load_cost(const cb_profile *p, const char *tier)
{
    if (!(p->costs.load > 0) || p->n_tiers < 1 || !(p->tiers[0].warm_mbs > 0))
        return 0.0f;
    for (int i = 0; i < p->n_tiers; i++)
        if (!strcmp(p->tiers[i].name, tier) && p->tiers[i].cold_mbs > 0) {
            double c = p->costs.load * (p->tiers[0].warm_mbs / p->tiers[i].cold_mbs);
            return c < 1e29 ? (float)c : 0.0f; /* beyond what a figure can be: none */
        }
    return 0.0f;
}

/* Per-layer ms at ratio r for one measured length: linear between the
 * measured ratios, with full prefill (ratio 1) as the top point. */
static double at_length(const cb_profile *p, int64_t len, double r, int *ok)
{
    double xs[CB_PROFILE_MAX * 8 + 2], ys[CB_PROFILE_MAX * 8 + 2];
    int n = 0;
    xs[n] = 0, ys[n] = 0, n++; /* recomputing nothing costs nothing */
    for (int i = 0; i < p->n_recompute; i++)
        if (p->recompute[i].length == len)
            xs[n] = p->recompute[i].ratio, ys[n] = p->recompute[i].ms_per_layer, n++;
    for (int i = 0; i < p->n_prefill; i++)
        if (p->prefill[i].length == len)
            xs[n] = 1.0, ys[n] = p->prefill[i].ms_per_layer, n++;
    *ok = n > 1;
    /* insertion sort by ratio */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && xs[j] < xs[j - 1]; j--) {
            double t = xs[j];
            xs[j] = xs[j - 1], xs[j - 1] = t;
            t = ys[j];
            ys[j] = ys[j - 1], ys[j - 1] = t;
        }
    if (r <= xs[0])
        return ys[0];
    for (int i = 1; i < n; i++)
        if (r <= xs[i])
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (r - xs[i - 1]) /
                                   (xs[i] - xs[i - 1] > 0 ? xs[i] - xs[i - 1] : 1);
    /* beyond the last point: in proportion */
    return xs[n - 1] > 0 ? ys[n - 1] * r / xs[n - 1] : ys[n - 1];
}

double cb_profile_recompute_ms(const cb_profile *p, double ratio, int64_t L)
{
    /* the measured lengths, sorted */
    int64_t lens[CB_PROFILE_MAX];
    int nl = 0;
    for (int i = 0; i < p->n_prefill; i++) {
        int seen = 0;
        for (int j = 0; j < nl; j++)
            seen |= lens[j] == p->prefill[i].length;
        if (!seen && nl < CB_PROFILE_MAX)
            lens[nl++] = p->prefill[i].length;
    }
    for (int i = 1; i < nl; i++)
        for (int j = i; j > 0 && lens[j] < lens[j - 1]; j--) {
            int64_t t = lens[j];
            lens[j] = lens[j - 1], lens[j - 1] = t;
        }
    if (nl == 0)
        return -1;
    int ok;
    double per_layer;
    if (L <= lens[0]) {
        per_layer = at_length(p, lens[0], ratio, &ok) * (double)L / (double)lens[0];
    } else if (L >= lens[nl - 1]) {
        per_layer = at_length(p, lens[nl - 1], ratio, &ok) * (double)L / (double)lens[nl - 1];
    } else {
        int i = 1;
        while (lens[i] < L)
            i++;
        double a = at_length(p, lens[i - 1], ratio, &ok), b = at_length(p, lens[i], ratio, &ok);
        per_layer = a + (b - a) * (double)(L - lens[i - 1]) / (double)(lens[i] - lens[i - 1]);
    }
    return per_layer * p->n_layer;
}

/* A coded type's bytes per token from f16's: kivi4 keeps 20 bytes of 32
 * elements (a group's f16 scale and minimum with it) for f16's 64.  Its keys'
 * last group of a chunk is often partial, so this is slightly low. */
#define KIVI4_PER_F16 (20.0 / 64.0)
/* coded's is at most a quarter of f16's (kvcoded.c, CB_CODED_SHARE) */
#define CODED_PER_F16 (1.0 / CB_CODED_SHARE)

double cb_profile_load_ms(const cb_profile *p, const char *tier, int64_t L, cb_type t, int cold)
{
    int ti = cb_profile_type_index(t == CB_TYPE_KIVI4 || t == CB_TYPE_CODED ? CB_TYPE_F16 : t);
    double per = t == CB_TYPE_KIVI4 ? KIVI4_PER_F16 : t == CB_TYPE_CODED ? CODED_PER_F16 : 1.0;
    for (int i = 0; ti >= 0 && i < p->n_tiers; i++)
        if (!strcmp(p->tiers[i].name, tier)) {
            double mbs = cold ? p->tiers[i].cold_mbs : p->tiers[i].warm_mbs;
            if (mbs <= 0)
                return -1;
            return p->kv_bytes_per_token[ti] * per * (double)L / (mbs * 1e6) * 1e3;
        }
    return -1;
}
