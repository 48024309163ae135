#!/bin/sh
# The blend's plan in cb-run --stats: the policy resolved before any layer
# ran (ratio, why, strategy, the cost model's figures and their source);
# a store's profile (cb-profile) feeds its figures to --speedup and to
# --ratio auto, and a profile that prices loading very slowly keeps
# --speedup's ratio at its minimum and raises --ratio auto's, and one that
# prices probe's scoring dear lowers probe's --speedup ratio, as the cost
# model predicts.  On the tiny qwen2 fixture.
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny4-qwen2.gguf
need_fixture "$M" "the blend's plan"
RUN=$BINDIR_B/cb-run S=$T/store
vale_chunks "$M" "$T/c.jsonl"
"$BINDIR_B/cb-precompute" -m "$M" --store "$S" -q "$T/c.jsonl" > /dev/null || not_ok "precompute"
# blend ARGS...: cb-run's stats into $T/st.json
blend() {
    "$RUN" -m "$M" --store "$S" --chunks "$T/c.jsonl" -p "$Q" -n 1 -t 2 --no-store-write \
        --stats "$T/st.json" "$@" > /dev/null 2> "$T/err"
}
blend --strategy hkvd --speedup 1.1 && cp "$T/st.json" "$T/built.json" &&
    blend --ratio 0.3 && cp "$T/st.json" "$T/given.json" &&
    blend --mode reuse && cp "$T/st.json" "$T/reuse.json" &&
    python3 - "$T" <<'PY' && ok "--stats plan: the ratio, its source and bound, the strategy, the built-in figures" ||
import json, sys
t = sys.argv[1]
b, g, r = (json.load(open(f"{t}/{n}.json")) for n in ("built", "given", "reuse"))
p = b["plan"]
assert p["ratio_source"] == "speedup" and abs(p["speedup"] - 1.1) < 1e-6 and p["bound"] in ("speedup", "min"), p
assert abs(p["ratio"] - b["ratio"]) < 1e-6 and p["strategy"] == "hkvd" == b["strategy_used"], (p, b)
assert abs(p["stale_scale"] - 1) < 1e-6 and abs(p["key_temp"] - 1) < 1e-6, p  # hkvd: no stale scale
for k in ("load", "attn", "score"):
    assert p["costs"][k]["source"] == "built-in" and p["costs"][k]["value"] > 0, p
q = g["plan"]
assert q["ratio_source"] == "given" and q["bound"] == "given" and abs(q["ratio"] - 0.3) < 1e-6, q
assert q["strategy"] in ("probe", "hkvd") and "speedup" not in q, q
assert q["strategy"] != "probe" or abs(q["stale_scale"] - 0.35) < 1e-6, q  # qwen2's, on probe
assert r["plan"]["ratio_source"] == "mode" and r["plan"]["strategy"] is None, r["plan"]
PY
    { not_ok "--stats plan"; sed 's/^/#   /' "$T/err" | head -5; }

# cb-profile writes the figures into the store's profile; cb-run uses them
"$BINDIR_B/cb-profile" -m "$M" --store "$S" --lengths 64,128,256 --ratios 0.5 --repeat 1 -t 2 -q \
    > "$T/prof.md" 2> "$T/err" || not_ok "cb-profile: $(head -3 "$T/err")"
PROF=$(ls "$S"/profile-*-cpu.json 2>/dev/null | head -1)
blend --strategy hkvd --speedup 1.1 && cp "$T/st.json" "$T/prof.json" &&
    python3 - "$PROF" "$T/prof.json" <<'PY' && ok "cb-profile's figures reach the plan (source: profile; unmeasured ones built in)" ||
import json, math, sys
d = json.load(open(sys.argv[1]))
c = d["costs"]
p = json.load(open(sys.argv[2]))["plan"]["costs"]
assert all(c[k] >= 0 and math.isfinite(c[k]) for k in c), c  # (a tiny model's timings are noise)
# probe's scoring timed at each length: the last 32 rows, each seeing its position + 1 keys
sc = {e["length"]: e for e in d["scoring"]}
assert sorted(sc) == [64, 128, 256], d["scoring"]
for L, e in sc.items():
    assert e["rows"] == 32 and e["keys"] == sum(range(L - 32 + 1, L + 1)), e
    assert e["ms_per_layer"] > 0 and math.isfinite(e["ms_per_layer"]), e
for k in ("load", "attn", "score"):
    if c[k] > 0:
        assert p[k]["source"] == "profile" and abs(p[k]["value"] - c[k]) <= 1e-4 * c[k], (k, p, c)
    else:
        assert p[k]["source"] == "built-in" and p[k]["value"] > 0, (k, p, c)
PY
    { not_ok "the profile's figures in the plan"; head -c 600 "$PROF" | sed 's/^/#   /'; }
python3 - "$PROF" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["costs"] = {"load": 123.0, "attn": 4.5, "score": 0.75}
json.dump(d, open(sys.argv[1], "w"))
PY
blend --strategy hkvd --speedup 1.1 &&
    python3 - "$T/st.json" <<'PY' && ok "a profile's three figures, each in the plan as the profile's" ||
import json, sys
p = json.load(open(sys.argv[1]))["plan"]["costs"]
assert {k: (v["value"], v["source"]) for k, v in p.items()} == {
    "load": (123.0, "profile"), "attn": (4.5, "profile"), "score": (0.75, "profile")}, p
PY
    not_ok "a profile's figures in the plan"
grep -q "cost figures" "$T/prof.md" && grep -q "scoring ms/layer" "$T/prof.md" &&
    ok "cb-profile prints the figures and the scoring times" || not_ok "cb-profile's table has no cost figures or scoring"
# scoring's figure from cb-profile's own measurement: at one length the
# attention is the built-in figure, so the fit always has its units
"$BINDIR_B/cb-profile" -m "$M" --store "$T/store1" --lengths 128 --ratios 0.5 --repeat 2 -t 2 -q \
    > /dev/null 2> "$T/err" || not_ok "cb-profile, one length: $(head -3 "$T/err")"
python3 - "$T"/store1/profile-*-cpu.json <<'PY' && ok "cb-profile writes a finite positive scoring figure" ||
import json, math, sys
d = json.load(open(sys.argv[1]))
s = d["costs"]["score"]
assert s > 0 and math.isfinite(s) and len(d["scoring"]) == 1, (d["costs"], d["scoring"])
PY
    { not_ok "cb-profile's scoring figure"; sed 's/^/#   /' "$T/err" | head -5; }

# a profile that prices loading very slowly: every blend costs more than
# full prefill / 1.1, so the ratio is the least (--tune min-ratio, 0.15)
python3 - "$PROF" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["costs"]["load"] = 1e7
json.dump(d, open(sys.argv[1], "w"))
PY
blend --strategy hkvd --speedup 1.1 && cp "$T/st.json" "$T/slow.json" &&
    python3 - "$T/built.json" "$T/slow.json" <<'PY' && ok "slow loading in the profile: the least ratio (bound min), below the built-in figures' ratio" ||
import json, math, sys
b, s = (json.load(open(f)) for f in sys.argv[1:])
p = s["plan"]
assert p["costs"]["load"]["source"] == "profile" and p["costs"]["load"]["value"] == 1e7, p
assert p["bound"] == "min" and s["n_recomputed_tokens"] == math.ceil(0.15 * s["n_cached_tokens"] - 1e-3), (p, s)
assert b["plan"]["bound"] == "speedup" and b["plan"]["ratio"] > p["ratio"], (b["plan"], p)
PY
    { not_ok "slow loading's plan"; sed 's/^/#   /' "$T/err" | head -5; }
# a profile from before the figures (no "costs"): the built-in ones
python3 - "$PROF" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
del d["costs"]
json.dump(d, open(sys.argv[1], "w"))
PY
blend --strategy hkvd --speedup 1.1 &&
    python3 - "$T/built.json" "$T/st.json" <<'PY' && ok "a profile without figures: the built-in ones, the same plan" ||
import json, sys
b, s = (json.load(open(f))["plan"] for f in sys.argv[1:])
assert b == s, (b, s)
PY
    not_ok "a profile without figures"

# --ratio auto: the loading controller on the same cost model.  Without a
# profile, the built-in figures, and the plan says so; with one, loading
# priced dear recomputes more than loading priced cheap (--tune min-ratio
# the least), and the same figure moves --speedup the other way.
cp "$PROF" "$T/prof.keep" && rm -f "$PROF"
blend --ratio auto && cp "$T/st.json" "$T/auto-built.json" &&
    python3 - "$T/auto-built.json" <<'PY' && ok "--ratio auto without a profile: the built-in figures, the predictions, in the plan" ||
import json, sys
s = json.load(open(sys.argv[1]))
p = s["plan"]
assert p["ratio_source"] == "controller" == s["ratio_source"] and p["bound"] in ("load", "min"), p
assert all(p["costs"][k]["source"] == "built-in" for k in p["costs"]), p
pr = p["predicted"]
assert pr["load"] > 0 and pr["recompute"] > 0 and abs(p["ratio"] - s["ratio"]) < 1e-6, p
assert (pr["recompute"] <= pr["load"]) == (p["bound"] == "load") and s["ratio"] >= 0.15 - 1e-6, p
PY
    { not_ok "--ratio auto without a profile"; sed 's/^/#   /' "$T/err" | head -5; }
grep -q "no profile" "$T/err" && ok "--ratio auto without a profile says so" || not_ok "no note without a profile"
# price LOAD: the kept profile with that loading figure
price() {
    python3 - "$T/prof.keep" "$PROF" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["costs"] = {"load": float(sys.argv[3]), "attn": 2.0, "score": 0}
json.dump(d, open(sys.argv[2], "w"))
PY
}
price 0.001 && blend --ratio auto --tune min-ratio=0.05 && cp "$T/st.json" "$T/auto-cheap.json" &&
    blend --strategy hkvd --speedup 1.1 && cp "$T/st.json" "$T/sp-cheap.json" &&
    price 1e7 && blend --ratio auto --tune min-ratio=0.05 && cp "$T/st.json" "$T/auto-dear.json" &&
    blend --strategy hkvd --speedup 1.1 && cp "$T/st.json" "$T/sp-dear.json" &&
    python3 - "$T" <<'PY' && ok "--ratio auto and --speedup read the profile's loading figure: dear loading, more recomputed by auto, less by --speedup" ||
import json, sys
t = sys.argv[1]
ac, sc, ad, sd = (json.load(open(f"{t}/{n}.json")) for n in ("auto-cheap", "sp-cheap", "auto-dear", "sp-dear"))
tiers = {x["name"]: x for x in json.load(open(f"{t}/prof.keep"))["tiers"]}
first = json.load(open(f"{t}/prof.keep"))["tiers"][0]
for s, load in ((ac, 0.001), (sc, 0.001), (ad, 1e7), (sd, 1e7)):
    c = s["plan"]["costs"]
    if s["plan"]["ratio_source"] == "controller":  # the figure of the tier holding the chunks
        load *= first["warm_mbs"] / tiers[s["tier"]]["cold_mbs"]
    assert abs(c["load"]["value"] - load) <= 1e-6 * load and c["load"]["source"] == "profile", c
    assert c["attn"] == {"value": 2.0, "source": "profile"}, c
assert ac["plan"]["bound"] == "min" and ad["plan"]["bound"] == "load", (ac["plan"], ad["plan"])
assert ad["ratio"] > ac["ratio"] and ad["n_recomputed_tokens"] > ac["n_recomputed_tokens"], (ac, ad)
assert ad["plan"]["predicted"]["recompute"] <= ad["plan"]["predicted"]["load"], ad["plan"]
assert ac["plan"]["predicted"]["recompute"] > ac["plan"]["predicted"]["load"], ac["plan"]
assert sd["ratio"] < sc["ratio"] and sd["plan"]["bound"] == "min", (sc["plan"], sd["plan"])
PY
    { not_ok "--ratio auto and --speedup on the profile's figure"; sed 's/^/#   /' "$T/err" | head -5; }
# price_score SCORE: the kept profile with that scoring figure
price_score() {
    python3 - "$T/prof.keep" "$PROF" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["costs"] = {"load": 0, "attn": 0, "score": float(sys.argv[3])}
json.dump(d, open(sys.argv[2], "w"))
PY
}
price_score 0.001 && blend --strategy probe --speedup 1.1 && cp "$T/st.json" "$T/ps-cheap.json" &&
    price_score 50 && blend --strategy probe --speedup 1.1 && cp "$T/st.json" "$T/ps-dear.json" &&
    python3 - "$T" <<'PY' && ok "--speedup reads the profile's scoring figure: dear scoring, a lower ratio for probe" ||
import json, sys
t = sys.argv[1]
c, d = (json.load(open(f"{t}/ps-{n}.json")) for n in ("cheap", "dear"))
for s, score in ((c, 0.001), (d, 50.0)):
    sc = s["plan"]["costs"]["score"]
    assert sc["source"] == "profile" and abs(sc["value"] - score) <= 1e-6 * score, s["plan"]
    assert s["strategy_used"] == "probe" and s["probe_layers"] > 0, s
assert d["plan"]["ratio"] < c["plan"]["ratio"] and d["ratio"] < c["ratio"], (c["plan"], d["plan"])
assert d["predicted_speedup"] >= 1.1 * (1 - 1e-5) or d["plan"]["bound"] == "min", d
PY
    { not_ok "--speedup on the profile's scoring figure"; sed 's/^/#   /' "$T/err" | head -5; }
done_testing
