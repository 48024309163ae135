/* fuzz_profile - the profile JSON a store holds (cb_profile_from_json), and
 * the predictions made over whatever numbers it accepted
 * (cb_profile_recompute_ms, cb_profile_load_ms, cb_profile_load_cost).
 * Properties: an accepted profile serializes (cb_profile_to_json) to text
 * that parses back to the same serialization; a tier's loading figure is
 * a number >= 0 (0: not measured). */
#include "../../lib/kv/kv.h"
#include "fuzz.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cb_profile p, q; /* large: keep them off the stack */
    cb_error err = {0};
    char *a = NULL, *b = NULL;

    if (cb_profile_from_json(&p, (const char *)data, size, &err) != CB_OK) {
        FUZZ_CHECK(err.msg[0]);
        return 0;
    }
    FUZZ_CHECK(p.n_layer >= 1 && p.n_prefill >= 0 && p.n_prefill <= CB_PROFILE_MAX &&
               p.n_recompute >= 0 && p.n_recompute <= CB_PROFILE_MAX * 8 && p.n_tiers >= 0 &&
               p.n_tiers <= 16 && p.n_scoring >= 0 && p.n_scoring <= CB_PROFILE_MAX);
    FUZZ_CHECK(cb_profile_to_json(&p, &a) == CB_OK && a);
    FUZZ_CHECK(cb_profile_from_json(&q, a, strlen(a), &err) == CB_OK);
    FUZZ_CHECK(cb_profile_to_json(&q, &b) == CB_OK && b);
    FUZZ_CHECK(strcmp(a, b) == 0);
    free(a);
    free(b);

    static const int64_t lens[] = {INT64_MIN, -1, 0, 1, 7, 512, 4096, 1 << 20, INT64_MAX};
    static const double ratios[] = {-1, 0, 0.15, 0.5, 1, 2};
    static const cb_type types[] = {CB_TYPE_F32, CB_TYPE_F16, CB_TYPE_BF16, CB_TYPE_Q8_0,
                                    CB_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (size_t j = 0; j < sizeof ratios / sizeof ratios[0]; j++)
            cb_profile_recompute_ms(&p, ratios[j], lens[i]);
        for (int t = 0; t <= p.n_tiers; t++) {
            const char *name = t < p.n_tiers ? p.tiers[t].name : "no-such-tier";
            for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
                cb_profile_load_ms(&p, name, lens[i], types[k], (int)(i & 1));
            }
            float c = cb_profile_load_cost(&p, name);
            FUZZ_CHECK(c >= 0.0f || isnan(c));
        }
    }
    return 0;
}
