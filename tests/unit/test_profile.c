/* test_profile.c - a profile's predictions (placement's recompute and load
 * times, the cost model's loading figure by tier) on synthetic profiles,
 * worked out by hand, and the profile's JSON round trip (probe's scoring
 * steps with it). */
#include "../../lib/kv/kv.h"
#include "test.h"

static cb_profile synthetic(void)
{
    cb_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.model, sizeof p.model, "00112233445566778899aabbccddeeff");
    snprintf(p.backend, sizeof p.backend, "cpu");
    p.n_layer = 10;
    p.threads = 2;
    p.kv_bytes_per_token[1] = 1e4; /* f16 */
    p.kv_bytes_per_token[3] = 5e3; /* q8_0 */
    p.prefill[p.n_prefill++] = (cb_profile_point){512, 1.0, 10.0, 0.01};
    p.prefill[p.n_prefill++] = (cb_profile_point){1024, 1.0, 22.0, 0.01};
    p.recompute[p.n_recompute++] = (cb_profile_point){512, 0.1, 2.0, 0.02};
    p.recompute[p.n_recompute++] = (cb_profile_point){512, 0.5, 6.0, 0.02};
    p.recompute[p.n_recompute++] = (cb_profile_point){1024, 0.1, 4.4, 0.02};
    p.recompute[p.n_recompute++] = (cb_profile_point){1024, 0.5, 12.0, 0.02};
    p.tiers[p.n_tiers++] = (cb_profile_tier){"ram", 10000, 10000};
    p.tiers[p.n_tiers++] = (cb_profile_tier){"ssd", 100, 50};
    p.tiers[p.n_tiers++] = (cb_profile_tier){"tape", 1, 1};
    return p;
}

#define NEAR(a, b) (fabs((a) - (b)) < 1e-6 * (fabs(b) + 1))

int main(void)
{
    TEST_BEGIN();
    cb_profile p = synthetic();

    tcase("T_recompute interpolates in ratio and length");
    CHECK(NEAR(cb_profile_recompute_ms(&p, 0.1, 512), 20.0));
    CHECK(NEAR(cb_profile_recompute_ms(&p, 0.3, 512), 40.0));   /* halfway 2..6 per layer */
    CHECK(NEAR(cb_profile_recompute_ms(&p, 0.75, 512), 80.0));  /* halfway 6..10 */
    CHECK(NEAR(cb_profile_recompute_ms(&p, 0.05, 512), 10.0));  /* halfway 0..2 */
    CHECK(NEAR(cb_profile_recompute_ms(&p, 0.1, 768), 32.0));   /* halfway 2..4.4 */
    CHECK(NEAR(cb_profile_recompute_ms(&p, 1.0, 2048), 440.0)); /* in proportion past 1024 */
    CHECK(NEAR(cb_profile_recompute_ms(&p, 1.0, 256), 50.0));   /* and below 512 */

    tcase("T_load = bytes per token x L / throughput");
    CHECK(NEAR(cb_profile_load_ms(&p, "ssd", 512, CB_TYPE_F16, 0), 51.2));
    CHECK(NEAR(cb_profile_load_ms(&p, "ssd", 512, CB_TYPE_F16, 1), 102.4));
    CHECK(NEAR(cb_profile_load_ms(&p, "ssd", 512, CB_TYPE_Q8_0, 0), 25.6));
    CHECK(cb_profile_load_ms(&p, "nvme", 512, CB_TYPE_F16, 0) < 0);

    tcase("the loading figure by tier: the first tier's (warm) in proportion to its cold speed");
    CHECK(cb_profile_load_cost(&p, "ssd") == 0.0f); /* no figure: not measured */
    p.costs.load = 100.0f;
    CHECK(cb_profile_load_cost(&p, "ram") == 100.0f);
    CHECKF(NEAR(cb_profile_load_cost(&p, "ssd"), 100.0 * 10000 / 50), "ssd: %g",
           (double)cb_profile_load_cost(&p, "ssd"));
    CHECK(NEAR(cb_profile_load_cost(&p, "tape"), 1e6));
    CHECK(cb_profile_load_cost(&p, "nvme") == 0.0f);
    p.tiers[0].warm_mbs = 0; /* the figure's own tier unmeasured: no proportion */
    CHECK(cb_profile_load_cost(&p, "ssd") == 0.0f);
    p.tiers[0].warm_mbs = 10000;
    p.costs.load = 0.0f;

    tcase("profile JSON round trip");
    char *json = NULL;
    cb_profile q;
    cb_error err;
    CHECK_OK(cb_profile_to_json(&p, &json));
    CHECK_OK(cb_profile_from_json(&q, json, strlen(json), &err));
    CHECK(!strcmp(q.model, p.model) && !strcmp(q.backend, "cpu") && q.n_layer == 10 &&
          q.threads == 2);
    CHECK(q.n_prefill == 2 && q.n_recompute == 4 && q.n_tiers == 3);
    CHECK(NEAR(q.recompute[3].ms_per_layer, 12.0) && !strcmp(q.tiers[1].name, "ssd") &&
          NEAR(q.tiers[1].cold_mbs, 50.0));
    CHECK(NEAR(cb_profile_recompute_ms(&q, 0.3, 512), 40.0));
    CHECK(q.costs.load == 0 && q.costs.attn == 0 && q.costs.score == 0);
    free(json);
    p.costs = (cb_blend_costs){150.0f, 2.5f, 0.0f}; /* the cost model's figures, when measured */
    CHECK_OK(cb_profile_to_json(&p, &json));
    CHECK_OK(cb_profile_from_json(&q, json, strlen(json), &err));
    CHECK(q.costs.load == 150.0f && q.costs.attn == 2.5f && q.costs.score == 0.0f);
    CHECK(q.n_scoring == 0);
    free(json);
    p.costs = (cb_blend_costs){0};
    tcase("probe's scoring steps and their figure round trip");
    p.scoring[p.n_scoring++] = (cb_profile_scoring){512, 32, 15888, 0.25, 0.03};
    p.scoring[p.n_scoring++] = (cb_profile_scoring){1024, 32, 32272, 0.5, 0.01};
    p.costs.score = 1.25f;
    CHECK_OK(cb_profile_to_json(&p, &json));
    CHECK_OK(cb_profile_from_json(&q, json, strlen(json), &err));
    CHECK(q.n_scoring == 2 && q.scoring[1].length == 1024 && q.scoring[1].rows == 32 &&
          q.scoring[1].keys == 32272 && NEAR(q.scoring[0].ms_per_layer, 0.25) &&
          NEAR(q.scoring[0].spread, 0.03) && q.costs.score == 1.25f);
    free(json);
    p.n_scoring = 0;
    p.costs = (cb_blend_costs){0};
    tcase("scoring steps: absent (a profile from before them) none; impossible ones malformed");
    {
        static const char *sc[] = {
            "",
            ",\"scoring\":[{\"length\":64,\"rows\":32,\"keys\":1552,\"ms_per_layer\":0.1,"
            "\"spread\":0}]",
            ",\"scoring\":{}",
            ",\"scoring\":[{\"length\":64,\"rows\":65,\"keys\":1552,\"ms_per_layer\":0.1,"
            "\"spread\":0}]",
            ",\"scoring\":[{\"length\":64,\"rows\":32,\"keys\":4097,\"ms_per_layer\":0.1,"
            "\"spread\":0}]",
            ",\"scoring\":[{\"length\":64,\"rows\":32,\"keys\":1552,\"ms_per_layer\":-1,"
            "\"spread\":0}]",
            ",\"scoring\":[{\"length\":64,\"rows\":32,\"ms_per_layer\":0.1,\"spread\":0}]",
        };
        for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
            char text[512];
            snprintf(text, sizeof text,
                     "{\"version\":1,\"model\":\"m\",\"backend\":\"cpu\",\"n_layer\":1,"
                     "\"threads\":1,\"kv_bytes_per_token\":{},\"prefill\":[],\"recompute\":[],"
                     "\"tiers\":[]%s}",
                     sc[i]);
            cb_status st = cb_profile_from_json(&q, text, strlen(text), &err);
            CHECKF(i < 2 ? st == CB_OK && q.n_scoring == (int)i : st == CB_ERR_FORMAT,
                   "case %zu: %d", i, st);
        }
        CHECK(q.n_scoring == 0);
    }
    tcase("a profile without cost figures (written before them) loads with none; bad ones do not");
    {
        static const char *costs[] = {"", ",\"costs\":{\"load\":-1}", ",\"costs\":{\"attn\":\"x\"}",
                                      ",\"costs\":[]", ",\"costs\":{\"attn\":2}"};
        for (size_t i = 0; i < sizeof costs / sizeof costs[0]; i++) {
            char text[512];
            snprintf(text, sizeof text,
                     "{\"version\":1,\"model\":\"m\",\"backend\":\"cpu\",\"n_layer\":1,"
                     "\"threads\":1,\"kv_bytes_per_token\":{},\"prefill\":[],\"recompute\":[],"
                     "\"tiers\":[]%s}",
                     costs[i]);
            cb_status st = cb_profile_from_json(&q, text, strlen(text), &err);
            CHECKF(i == 0 || i == 4 ? st == CB_OK : st == CB_ERR_FORMAT, "case %zu: %d", i, st);
            if (i == 4)
                CHECK(q.costs.attn == 2.0f && q.costs.load == 0.0f);
        }
    }
    CHECK(cb_profile_from_json(&q, "{\"version\": 2}", 14, &err) == CB_ERR_FORMAT);
    CHECK(cb_profile_from_json(&q, "not json", 8, &err) == CB_ERR_FORMAT);

    /* fuzz_profile (UBSan) on a crafted profile: measured lengths of -9e18 and 9e18 were
     * accepted, and interpolating between them overflowed int64_t (UB). */
    tcase("profile JSON with impossible measurements is CB_ERR_FORMAT (fuzz finding)");
    static const char *bad[] = {
        "{\"length\":-9000000000000000000,\"ratio\":1.0,\"ms_per_layer\":1.0,\"spread\":0.0},"
        "{\"length\":9000000000000000000,\"ratio\":1.0,\"ms_per_layer\":2.0,\"spread\":0.0}",
        "{\"length\":0,\"ratio\":1.0,\"ms_per_layer\":1.0,\"spread\":0.0}",
        "{\"length\":512,\"ratio\":1.5,\"ms_per_layer\":1.0,\"spread\":0.0}",
        "{\"length\":512,\"ratio\":1.0,\"ms_per_layer\":-1.0,\"spread\":0.0}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"version\":1,\"model\":\"m\",\"backend\":\"cpu\",\"n_layer\":1,\"threads\":1,"
                 "\"kv_bytes_per_token\":{},\"prefill\":[%s],\"recompute\":[],\"tiers\":[]}",
                 bad[i]);
        CHECKF(cb_profile_from_json(&q, text, strlen(text), &err) == CB_ERR_FORMAT,
               "case %zu accepted", i);
    }
    char name[128];
    cb_hash128 h = {1, 2};
    cb_profile_name(h, "cpu", name, sizeof name);
    CHECK(!strcmp(name, "profile-00000000000000020000000000000001-cpu.json"));
    TEST_END();
}
