#!/bin/sh
# Placement and the loading controller through the programs: cb-profile
# writes a profile into the store; cb-store place and cb-precompute
# --place auto pick the cheapest tier fast enough, from a profile whose
# numbers are set here; cb-run --ratio auto prices loading for the slowest
# tier holding a chunk, and without a profile at the built-in figure.
. "$(dirname "$0")/lib.sh"
PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store PROF=$BINDIR_B/cb-profile
M=$CB_TEST_TMP/tiny-q8_0.gguf
S=$T/store
"$STORE" --store "$S" init --tier fast="$T/fast" --tier slow="$T/slow" --cost fast=10 --cost slow=1 \
    && ok "init with tier costs" || not_ok "init with costs"
expect_exit "--cost for an unknown tier" 64 "$STORE" --store "$T/s9" init --tier a="$T/a" --cost b=2
printf '{"text": "The Norden bridge spans the river Vale."}\n{"text": "Kelby lies on the Vale."}\n' > "$T/c.jsonl"
fp=$("$PRE" -m "$M" --store "$T/probe" -q "$T/c.jsonl" | head -1 | sed 's/.*"kv":"\([0-9a-f]*\)-.*/\1/')
[ ${#fp} -eq 32 ] && ok "model fingerprint from a key" || not_ok "fingerprint '$fp'"

expect_exit "place without a profile" 66 "$STORE" --store "$S" place -m "$M"
grep -q "cb-profile" "$T/err" && ok "it says to run cb-profile" || not_ok "place message"

# A profile: recompute 10 ms per layer at r 0.15 for 3072 tokens (2 layers:
# 20 ms); loading 3072 tokens takes 3072 x 1000 B / (fast 1000 MB/s) = 3 ms,
# or / (slow 100 MB/s) = 30.7 ms.  slow is too slow at 0.15: fast is chosen;
# at ratio 0.5 (50 ms of recompute) the cheap slow tier suffices.
write_profile() {
cat > "$S/profile-$fp-cpu.json" <<JSON
{"version": 1, "model": "$fp", "backend": "cpu", "n_layer": 2, "threads": 2,
 "kv_bytes_per_token": {"f32": 2000, "f16": 1000, "bf16": 1000, "q8_0": 530},
 "prefill": [{"length": 3072, "ratio": 1, "ms_per_layer": 60, "spread": 0}],
 "recompute": [{"length": 3072, "ratio": 0.15, "ms_per_layer": 10, "spread": 0},
               {"length": 3072, "ratio": 0.5, "ms_per_layer": 25, "spread": 0}],
 "tiers": [{"name": "fast", "warm_mbs": $1, "cold_mbs": $1}, {"name": "slow", "warm_mbs": $2, "cold_mbs": $2}]}
JSON
}
write_profile 1000 100
[ "$("$STORE" --store "$S" place -m "$M")" = fast ] && ok "place at 0.15: the fast tier (slow would stall)" || not_ok "place at 0.15"
[ "$("$STORE" --store "$S" place -m "$fp" --ratio 0.5)" = slow ] && ok "place at 0.5: the cheap tier suffices" || not_ok "place at 0.5"
[ "$("$STORE" --store "$S" place -m "$M" --device cpu)" = fast ] && ok "place --device cpu reads the cpu profile" || not_ok "place --device cpu"
expect_exit "place --device cuda without a cuda profile" 66 "$STORE" --store "$S" place -m "$M" --device cuda
grep -q -- "-cuda.json" "$T/err" && ok "it names the missing profile" || not_ok "it names the missing profile"
"$STORE" --store "$S" place -m "$M" --json | python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["tier"]=="fast" and abs(r["recompute_ms"]-20)<1e-6 and abs(r["load_ms"]-3.072)<1e-6, r' \
    && ok "place --json: the predicted times" || not_ok "place --json"
"$PRE" -m "$M" --store "$S" --place auto -q "$T/c.jsonl" > /dev/null
[ "$("$STORE" --store "$S" ls --tier fast | wc -l)" -eq 2 ] && ok "precompute --place auto writes into the placed tier" || not_ok "--place auto"
"$PRE" -m "$M" --store "$S" --place slow -q - > /dev/null <<'J'
{"text": "A third chunk, placed by name."}
J
[ "$("$STORE" --store "$S" ls --tier slow | wc -l)" -eq 1 ] && ok "--place TIER" || not_ok "--place TIER"
expect_exit "--place into an unknown tier" 66 sh -c "echo '{\"text\":\"x y\"}' | '$PRE' -m '$M' --store '$S' --place nowhere"

# cb-run --ratio auto: the loading figure for the slowest tier holding a
# chunk (slow: 10 x fast's, the figure's own tier), --tune min-ratio the least
write_profile 1000 100
python3 - "$S/profile-$fp-cpu.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["costs"] = {"load": 50.0, "attn": 0, "score": 0}
json.dump(d, open(sys.argv[1], "w"))
PY
printf '{"text": "The Norden bridge spans the river Vale."}\n{"text": "A third chunk, placed by name."}\n' > "$T/q.jsonl"
"$RUN" -m "$M" --store "$S" --chunks "$T/q.jsonl" --ratio auto --tune min-ratio=0.05 -n 2 -p "Which river?" --stats "$T/st.json" > /dev/null
python3 - "$T/st.json" <<'PY' && ok "--ratio auto: the slowest tier's loading figure, the predictions in the plan" || not_ok "--ratio auto"
import json, sys
s = json.load(open(sys.argv[1]))
p = s["plan"]
assert s["ratio_source"] == p["ratio_source"] == "controller" and s["tier"] == "slow", s
assert p["costs"]["load"] == {"value": 500.0, "source": "profile"}, p
assert p["bound"] in ("load", "min") and s["ratio"] >= 0.05 - 1e-6, p
pr = p["predicted"]
assert pr["load"] > 0 and (pr["recompute"] <= pr["load"]) == (p["bound"] == "load"), p
PY
rm -f "$S"/profile-*.json
"$RUN" -m "$M" --store "$S" --chunks "$T/q.jsonl" --ratio auto --tune min-ratio=0.3 -n 2 -p "Which river?" --stats "$T/st2.json" > /dev/null 2> "$T/err"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); p=s["plan"]; assert s["ratio_source"]=="controller" and p["costs"]["load"]["source"]=="built-in" and s["ratio"]>=0.3-1e-6 and "tier" not in s, s' "$T/st2.json" \
    && grep -q "no profile" "$T/err" && ok "--ratio auto without a profile: the built-in figures, at least --min-ratio, and it says so" || not_ok "--ratio auto without a profile"

# cb-profile itself, small: it writes a profile the controller reads
"$PROF" -m "$M" --store "$S" --lengths 64,128 --ratios 0.25,0.5 --repeat 1 -o json > "$T/p.json" \
    && [ -f "$S/profile-$fp-cpu.json" ] && ok "cb-profile writes the profile into the store" || not_ok "cb-profile"
python3 - "$T/p.json" <<'PY' && ok "cb-profile: every length, ratio and tier measured" || not_ok "cb-profile contents"
import json, sys
p = json.load(open(sys.argv[1]))
assert [x["length"] for x in p["prefill"]] == [64, 128], p["prefill"]
assert len(p["recompute"]) == 4 and all(x["ms_per_layer"] > 0 for x in p["recompute"])
assert [t["name"] for t in p["tiers"]] == ["fast", "slow"] and all(t["cold_mbs"] > 0 and t["warm_mbs"] > 0 for t in p["tiers"])
PY
[ -n "$("$STORE" --store "$S" place -m "$M")" ] && ok "place from a measured profile" || not_ok "place from a measured profile"
if command -v gnuplot >/dev/null 2>&1; then
    "$PROF" -m "$M" --store "$S" --lengths 64 --ratios 0.5 --repeat 1 --no-write --plot "$T/p.png" > /dev/null \
        && [ -s "$T/p.png" ] && ok "cb-profile --plot writes a PNG" || not_ok "cb-profile --plot"
else
    skip "cb-profile --plot" "gnuplot not installed"
fi
"$STORE" --store "$S" verify > /dev/null 2>&1 && ok "the store verifies (the profile is not an entry)" || not_ok "store verify"
done_testing
