#!/bin/sh
# The pipeline through real pipes: cb-chunk | cb-precompute into a store,
# incrementality, bad records, interruption, then cb-run in every mode on
# the stored chunks (tiny fixture model; the default model when present).
. "$(dirname "$0")/lib.sh"
CHUNK=$BINDIR_B/cb-chunk PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run STORE=$BINDIR_B/cb-store
M=$CB_TEST_TMP/tiny-q8_0.gguf
S=$T/store
mkdir -p "$T/docs"
for i in 1 2 3; do
    printf 'Document %s. The river Vale runs past the town of Kelby %s.\n\nIts bridge was built in 19%s0 by the Norden company.\n' $i $i $i > "$T/docs/d$i.txt"
done

"$CHUNK" -m "$M" --tokens 24 "$T/docs" > "$T/chunks.jsonl" && [ -s "$T/chunks.jsonl" ] && ok "cb-chunk writes records" || not_ok "cb-chunk"
nrec=$(wc -l < "$T/chunks.jsonl")
"$PRE" -m "$M" --store "$S" -q < "$T/chunks.jsonl" > "$T/pre1.jsonl"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l < "$T/pre1.jsonl")" -eq "$nrec" ] && ok "cb-precompute passes every record on ($nrec)" || not_ok "cb-precompute (rc $rc)"
python3 - "$T/chunks.jsonl" "$T/pre1.jsonl" <<'PY' && ok "records keep every field byte for byte, add kv and cached" || not_ok "record fields"
import json, sys
a = open(sys.argv[1], encoding="utf-8").read().splitlines()
b = open(sys.argv[2], encoding="utf-8").read().splitlines()
seen = set()
for x, y in zip(a, b):
    assert y.startswith(x[:-1] + ","), (x, y)
    o = json.loads(y)
    assert len(o["kv"]) == 65 and o["kv"][32] == "-", o
    assert o["cached"] is (o["kv"] in seen), o  # repeated texts are cached from their first time
    seen.add(o["kv"])
PY
entries=$("$STORE" --store "$S" ls --json | grep -c '"key"')
[ "$entries" -le "$nrec" ] && [ "$entries" -gt 0 ] && ok "the store holds the chunks ($entries entries)" || not_ok "store entries $entries"
before=$(find "$S" -type f -name '*.cbkv' -newer "$T/pre1.jsonl" | wc -l)
"$PRE" -m "$M" --store "$S" "$T/chunks.jsonl" > "$T/pre2.jsonl" 2>"$T/err"
after=$(find "$S" -type f -name '*.cbkv' -newer "$T/pre1.jsonl" | wc -l)
grep -q '"cached":false' "$T/pre2.jsonl" && not_ok "second run: all cached" || ok "second run: every record cached"
[ "$before" -eq 0 ] && [ "$after" -eq 0 ] && ok "second run writes nothing" || not_ok "second run wrote $after files"
cut -d, -f1 "$T/pre1.jsonl" | cmp -s - "$(cut -d, -f1 "$T/pre2.jsonl" > "$T/c2"; echo "$T/c2")" && ok "same keys" || not_ok "same keys"
! grep -q "made a store" "$T/err" && ok "a run into an existing store does not say it made one" || not_ok "said it made a store that was there"
# a store cb-precompute has to make is made whole (cb-store sees it) and said so on stderr
echo '{"text": "a store made here"}' | "$PRE" -m "$M" --store "$T/new" > /dev/null 2> "$T/err2"
grep -q "made a store at $T/new (one tier without a limit; cb-store init makes others)" "$T/err2" &&
    "$STORE" --store "$T/new" ls > /dev/null && ok "cb-precompute says when it makes the store, and makes a whole one" \
    || not_ok "making a store: $(cat "$T/err2")"

printf '{"text": "fine"}\nnot json\n{"id": 1}\n{"text": "also fine"}\n' > "$T/bad.jsonl"
"$PRE" -m "$M" --store "$S" "$T/bad.jsonl" > "$T/o" 2> "$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l < "$T/o")" -eq 2 ] && grep -q "bad.jsonl:2" "$T/err" && grep -q "bad.jsonl:3" "$T/err" \
    && ok "bad records are reported with their line and skipped" || not_ok "bad records (rc $rc)"
expect_exit "--strict stops at a bad record" 65 "$PRE" -m "$M" --store "$S" --strict "$T/bad.jsonl"
expect_exit "missing input" 66 "$PRE" -m "$M" --store "$S" "$T/none.jsonl"
expect_exit "bad --kv-type" 64 "$PRE" -m "$M" --store "$S" --kv-type f8 "$T/bad.jsonl"
"$PRE" -m "$M" --store "$S" --kv-type q8_0 -q "$T/chunks.jsonl" > /dev/null && ok "--kv-type q8_0" || not_ok "--kv-type q8_0"

# Interrupted: a long input, SIGINT after a moment; nothing partial may remain.
python3 -c '
import sys
for i in range(30000):
    print("{\"text\": \"chunk number %d about the bridge of Kelby and the river Vale, long enough to take a moment\"}" % i)' > "$T/long.jsonl"
"$PRE" -m "$M" --store "$T/s2" -q "$T/long.jsonl" > "$T/o" 2>"$T/err" &
pid=$!
# interrupt it mid-way: once it has passed a few records on
w=0; while [ "$(wc -l < "$T/o")" -lt 5 ] && [ $w -lt 100 ]; do sleep 0.1; w=$((w + 1)); done
kill -INT $pid; wait $pid; rc=$?
[ $rc -eq 130 ] && ok "SIGINT: exit 130" || not_ok "SIGINT: exit $rc"
"$STORE" --store "$T/s2" verify > "$T/v" 2>&1 && ok "after SIGINT the store verifies" || { not_ok "store verify after SIGINT"; sed 's/^/#   /' "$T/v" | head; }
[ -z "$(find "$T/s2" -name '*.tmp*' -type f)" ] && ok "no temporary file left" || not_ok "temporary files left"
done_n=$(wc -l < "$T/o")
head -n $((done_n + 20)) "$T/long.jsonl" | "$PRE" -m "$M" --store "$T/s2" -q > "$T/o2" \
    && [ "$(head -n "$done_n" "$T/o2" | grep -c '"cached":true')" -eq "$done_n" ] \
    && ok "a rerun continues where it stopped ($done_n done before the signal)" || not_ok "rerun after SIGINT"

# cb-run on the stored chunks, every mode
Q="Who built the bridge over the Vale?"
for mode in full prefix reuse blend; do
    "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --mode $mode -n 6 -p "$Q" --stats "$T/st-$mode.json" > "$T/a-$mode" \
        && ok "cb-run --mode $mode" || not_ok "cb-run --mode $mode"
done
python3 - "$T" <<'PY' && ok "stats: cached and recomputed tokens per mode" || not_ok "stats per mode"
import json, sys
t = sys.argv[1]
s = {m: json.load(open(f"{t}/st-{m}.json")) for m in ["full", "prefix", "reuse", "blend"]}
for m, v in s.items():
    for k in ["mode", "n_prompt_tokens", "n_cached_tokens", "n_recomputed_tokens", "ratio", "ttft_ms", "prefill_ms",
              "load_ms", "n_gen_tokens", "gen_ms", "recompute_ms", "n_selected", "overlapped_ms", "stall_ms"]:
        assert k in v, (m, k)
    assert v["mode"] == m
assert s["full"]["n_cached_tokens"] == 0
assert s["reuse"]["n_cached_tokens"] > 0 and s["reuse"]["n_recomputed_tokens"] == 0
assert s["blend"]["n_cached_tokens"] == s["reuse"]["n_cached_tokens"]
assert 0 < s["blend"]["n_recomputed_tokens"] < s["blend"]["n_cached_tokens"]
# the first chunk sits right after its lead-in (no --system): a true prefix, exact
assert 0 < s["blend"]["n_exact_tokens"] < s["blend"]["n_cached_tokens"], s["blend"]
assert abs(s["blend"]["n_recomputed_tokens"] - 0.15 * s["blend"]["n_cached_tokens"]) < 1  # chosen among the others
assert s["blend"]["n_chunks_missing"] == 0, s["blend"]
assert len(set(v["n_prompt_tokens"] for v in s.values())) == 1
PY
# the loader's readers: two read every layer's files together, one reads
# them in turn: the same logits; a count past 64 is a usage error
for lt in 1 2; do
    "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -n 1 -p "$Q" --tune load-threads=$lt --stats "$T/lt$lt.json" \
        --logits-out "$T/lt$lt.bin" > /dev/null 2>&1
done
lt=$(python3 -c 'import json,sys; print(*[json.load(open(f))["load_threads"] for f in sys.argv[1:]])' "$T/lt1.json" "$T/lt2.json" 2>/dev/null)
[ "$lt" = "1 2" ] && [ -s "$T/lt1.bin" ] && cmp -s "$T/lt1.bin" "$T/lt2.bin" &&
    ok "--tune load-threads=2: the caches' files read by two threads, the same logits (stats: $lt)" ||
    not_ok "--tune load-threads=2: the caches' files read by two threads, the same logits (stats: ${lt:-none})"
expect_exit "--tune load-threads=65" 64 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -n 1 -p "$Q" --tune load-threads=65
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -n 4 -p "$Q" --verify --stats "$T/v.json" > /dev/null
python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["verify"]; assert v["kl"] >= 0 and "same_answer" in v and "top1_agree" in v' "$T/v.json" \
    && ok "--verify adds KL, top-1 agreement and answer identity" || not_ok "--verify"
# --score: the continuation's NLL in every mode, no generation; ratio 1 and
# --verify's full prefill score like full; prefix scores like full too.
# These equalities hold to float rounding on the exact path (--exact, a
# store precomputed with it); on the default path an 8-bit rounding that a
# 1e-7 difference of the attention's summation order flips can move this
# random-weight model's NLL by ~1e-2.
A="The Norden company built it."
SX=$T/store-exact
"$PRE" -m "$M" --store "$SX" --exact -q < "$T/chunks.jsonl" > /dev/null
for mode in full prefix reuse blend; do
    "$RUN" -m "$M" --exact --store "$SX" --chunks "$T/chunks.jsonl" --mode $mode -p "$Q" --score "$A" --verify \
        --stats "$T/sc-$mode.json" > "$T/sc-$mode" && ok "--score in mode $mode" || not_ok "--score in mode $mode"
done
"$RUN" -m "$M" --exact --store "$SX" --chunks "$T/chunks.jsonl" --ratio 1 -p "$Q" --score "$A" --stats "$T/sc-r1.json" > /dev/null
printf '%s' "$A" > "$T/ans.txt"
"$RUN" -m "$M" --exact --store "$SX" --chunks "$T/chunks.jsonl" --mode reuse -p "$Q" --score-file "$T/ans.txt" > "$T/sc-file"
"$RUN" -m "$M" --exact -p "$Q" --score "$A" > "$T/sc-plain"
python3 - "$T" <<'PY' && ok "--score: NLL on stdout and in the stats, full's in verify, equal where the prefill is" \
    || not_ok "--score stats"
import json, sys
t = sys.argv[1]
s = {m: json.load(open(f"{t}/sc-{m}.json")) for m in ["full", "prefix", "reuse", "blend", "r1"]}
full = s["full"]["score"]
assert full["n_tokens"] > 3 and full["nll"] > 0 and 0 <= full["top1"] <= 1, full
for m in ["full", "prefix", "reuse", "blend"]:
    v = s[m]
    assert v["n_gen_tokens"] == 0 and v["stop"] == "score", v
    assert v["score"]["n_tokens"] == full["n_tokens"], (m, v["score"])
    assert abs(v["verify"]["score_nll"] - full["nll"]) < 1e-4, (m, v["verify"])
    assert abs(float(open(f"{t}/sc-{m}").read()) - v["score"]["nll"]) < 1e-5, m
for m in ["prefix", "r1"]:
    assert abs(s[m]["score"]["nll"] - full["nll"]) < 1e-3, (m, s[m]["score"], full)
assert abs(s["reuse"]["score"]["nll"] - full["nll"]) > 1e-4, (s["reuse"]["score"], full)
assert abs(float(open(f"{t}/sc-file").read()) - s["reuse"]["score"]["nll"]) < 1e-5
assert abs(float(open(f"{t}/sc-plain").read()) - full["nll"]) > 1e-4  # no chunks: another prompt
PY
for sg in probe runs; do
    "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --strategy $sg -n 2 -p "$Q" --stats "$T/sg-$sg.json" > /dev/null \
        && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["strategy"] == sys.argv[2] and 0 < s["n_recomputed_tokens"] < s["n_cached_tokens"], s' "$T/sg-$sg.json" $sg \
        && ok "--strategy $sg" || not_ok "--strategy $sg"
done
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --speedup 0 -n 2 -p "$Q" --stats "$T/sg-auto.json" > /dev/null \
    && python3 -c '
import json, math, sys
s = json.load(open(sys.argv[1]))
want, unc = math.ceil(0.15 * s["n_cached_tokens"]), s["n_prompt_tokens"] - s["n_cached_tokens"]
assert s["strategy"] == "auto" and s["strategy_used"] == ("hkvd" if 0 < want < 3 * unc else "probe"), s' "$T/sg-auto.json" \
    && ok "--strategy auto (the default): hkvd where fewer tokens are recomputed than 3x those without a cache, in the stats" \
    || not_ok "--strategy auto"
for sp in "" 1.01 1000; do  # the default (4), one that buys every row, one that buys none past --min-ratio
    "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" ${sp:+--speedup $sp} --tune min-ratio=0.05 -n 2 -p "$Q" \
        --stats "$T/sp$sp.json" > /dev/null || not_ok "--speedup ${sp:-default}: exit $?"
done
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --ratio 0.3 -n 2 -p "$Q" --stats "$T/sp-r.json" > /dev/null
python3 - "$T" <<'PY' && ok "--speedup (default 4): the ratio, its floor (--tune min-ratio) and the prediction in the stats; --ratio fixes it" \
    || not_ok "--speedup stats"
import json, math, sys
t = sys.argv[1]
d, lo, hi, r = (json.load(open(f"{t}/{n}.json")) for n in ("sp", "sp1000", "sp1.01", "sp-r"))
for s, target in ((d, 4), (lo, 1000), (hi, 1.01)):
    sp = s["speedup"]
    assert s["ratio_source"] == "speedup" and abs(sp["target"] - target) < 1e-4 and abs(sp["min_ratio"] - 0.05) < 1e-6, s
    assert s["ratio"] >= 0.05 - 1e-6 and s["predicted_speedup"] > 0, s
    assert sp["bound"] == ("speedup" if s["predicted_speedup"] >= target * (1 - 1e-5) else "min"), s
assert lo["speedup"]["bound"] == "min" and lo["n_recomputed_tokens"] == math.ceil(0.05 * lo["n_cached_tokens"] - 1e-3), lo
assert hi["speedup"]["bound"] == "speedup" and hi["n_recomputed_tokens"] > d["n_recomputed_tokens"] > 0, (hi, d)
assert d["n_recomputed_tokens"] >= lo["n_recomputed_tokens"], (d, lo)
assert "speedup" not in r and abs(r["ratio"] - 0.3) < 1e-6 and r["predicted_speedup"] > 0, r
PY
expect_exit "--ratio with --speedup" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --ratio 0.3 --speedup 4 -p q
expect_exit "--speedup negative" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --speedup -1 -p q
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --strategy probe --tune mass=0.5 --tune max-ratio=0.4 -n 2 -p "$Q" \
    --stats "$T/ad.json" > /dev/null
python3 - "$T/ad.json" <<'PY' && ok "--tune mass: the adaptive ratio and why, in the stats" || not_ok "--tune mass stats"
import json, sys
s = json.load(open(sys.argv[1]))
a = s["adaptive"]
near = lambda x, y: abs(x - y) < 1e-6
assert s["ratio_source"] == "adaptive" and near(a["mass"], 0.5) and near(a["max_ratio"], 0.4), s
assert near(a["min_ratio"], 0.05) and a["bound"] in ("mass", "min", "max"), s
assert 0.05 <= s["ratio"] <= 0.4 + 1 / s["n_cached_tokens"], s  # ceil(ratio x cached) tokens
assert s["n_recomputed_tokens"] == round(s["ratio"] * s["n_cached_tokens"]), s
assert (a["selected_mass"] >= 0.5) == (a["bound"] != "max"), s
PY
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --strategy probe --tune probe-rows=1 -n 2 -p "$Q" --stats "$T/pr1.json" > /dev/null \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["strategy"] == "probe" and s["probe_rows"] == 1 and 0 < s["n_recomputed_tokens"] < s["n_cached_tokens"], s' "$T/pr1.json" \
    && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["probe_rows"] == 0' "$T/sg-probe.json" \
    && ok "--tune probe-rows, in the stats (default 0: all)" || not_ok "--tune probe-rows"
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --tune key-temp=1.1 -n 2 -p "$Q" --stats "$T/kt.json" > /dev/null \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert abs(s["key_temp"] - 1.1) < 1e-6 and s["n_recomputed_tokens"] > 0, s' "$T/kt.json" \
    && ok "--tune key-temp, in the stats" || not_ok "--tune key-temp"
expect_exit "bad --tune key-temp" 64 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --tune key-temp=0 -n 1 -p "$Q"
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --tune stale-scale=0.5 -n 2 -p "$Q" --stats "$T/ss.json" > /dev/null \
    && "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --tune stale-scale=0.5 --mode reuse -n 2 -p "$Q" --stats "$T/ss-reuse.json" > /dev/null \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); r=json.load(open(sys.argv[2])); assert abs(s["stale_scale"] - 0.5) < 1e-6 and s["n_recomputed_tokens"] > 0 and r["stale_scale"] == 1, (s, r)' "$T/ss.json" "$T/ss-reuse.json" \
    && ok "--tune stale-scale, in the stats (blend only)" || not_ok "--tune stale-scale"
expect_exit "bad --tune stale-scale" 64 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --tune stale-scale=0 -n 1 -p "$Q"
expect_exit "--tune probe-rows negative" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --tune probe-rows=-1 -p q
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --strategy probe --tune probe-weight=none -n 2 -p "$Q" --stats "$T/pw0.json" > /dev/null \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["probe_weight"] == "none" and 0 < s["n_recomputed_tokens"] < s["n_cached_tokens"], s' "$T/pw0.json" \
    && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["probe_weight"] == "value"' "$T/sg-probe.json" \
    && ok "--tune probe-weight=none, in the stats (default value)" || not_ok "--tune probe-weight"
expect_exit "--tune probe-weight unknown" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --tune probe-weight=v2 -p q
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --tune probe-depth=1 -n 2 -p "$Q" --stats "$T/pd1.json" > /dev/null \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["probe_depth"] == 1 and s["probe_layers"] > 0 and s["n_recomputed_tokens"] > 0, s' "$T/pd1.json" \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["probe_depth"] == 0 and s["probe_layers"] > 0, s' "$T/sg-probe.json" \
    && ok "--tune probe-depth, in the stats (default 0: by cost; the layers used)" || not_ok "--tune probe-depth"
for bad in -0.5 1.5 x; do
    expect_exit "--tune probe-depth=$bad" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --tune probe-depth="$bad" -p q
done
expect_exit "--tune mass with another strategy" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --strategy hkvd --tune mass=0.5 -p q
expect_exit "--tune min-ratio above max-ratio" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --strategy probe --tune mass=0.5 --tune min-ratio=0.6 -p q
expect_exit "--score and --score-file together" 64 "$RUN" -m "$M" -p q --score a --score-file "$T/ans.txt"
expect_exit "--score with no tokens" 65 "$RUN" -m "$M" -p q --score ""
expect_exit "--score-file missing" 66 "$RUN" -m "$M" -p q --score-file "$T/nope.txt"
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" --ratio 1 -n 6 -p "$Q" > "$T/r1"
cmp -s "$T/r1" "$T/a-full" && ok "--ratio 1 answers like full" || not_ok "--ratio 1 vs full"

# a chunk without cache is computed in place and stored for next time
printf '{"text": "A brand new chunk about the Kelby ferry, never precomputed."}\n' > "$T/new.jsonl"
cat "$T/chunks.jsonl" >> "$T/new.jsonl"
"$RUN" -m "$M" --store "$S" --chunks "$T/new.jsonl" -n 2 -p "$Q" --no-store-write --stats "$T/n1.json" > /dev/null
"$RUN" -m "$M" --store "$S" --chunks "$T/new.jsonl" -n 2 -p "$Q" --stats "$T/n2.json" > /dev/null
"$RUN" -m "$M" --store "$S" --chunks "$T/new.jsonl" -n 2 -p "$Q" --stats "$T/n3.json" > /dev/null
python3 - "$T" <<'PY' && ok "a missing chunk is computed, then stored (unless --no-store-write)" || not_ok "missing chunk"
import json, sys
t = sys.argv[1]
n1, n2, n3 = (json.load(open(f"{t}/n{i}.json")) for i in (1, 2, 3))
assert n1["n_chunks_missing"] == 1 and n1["n_chunks_stored"] == 0, n1
assert n2["n_chunks_missing"] == 1 and n2["n_chunks_stored"] == 1, n2
assert n3["n_chunks_missing"] == 0, n3
PY
expect_exit "bad --chunks record" 65 sh -c "echo 'nope' | '$RUN' -m '$M' --store '$S' --chunks - -p q"
expect_exit "--chunks - needs the question elsewhere" 64 "$RUN" -m "$M" --store "$S" --chunks -
# fuzz_records: records after a NUL byte were dropped without a word (the
# reader stopped at the NUL); the file is refused, naming the line.
printf '{"text":"a"}\n{"text":"b"}\000\n{"text":"c"}\n' > "$T/nul.jsonl"
expect_exit "a NUL byte in --chunks" 65 "$RUN" -m "$M" --store "$S" --chunks "$T/nul.jsonl" -n 1 -p q
grep -q "nul.jsonl:2: " "$T/err" && ok "the NUL byte's line is named" || not_ok "NUL byte: $(cat "$T/err")"
expect_exit "bad --strategy" 64 "$RUN" -m "$M" --chunks "$T/chunks.jsonl" --strategy magic -p q
# a KV file of another model is refused and recomputed
M2=$CB_TEST_TMP/tiny-f32.gguf
"$RUN" -m "$M2" --store "$S" --chunks "$T/chunks.jsonl" --no-store-write -n 2 -p "$Q" --stats "$T/o.json" > /dev/null \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["n_cached_tokens"] == 0' "$T/o.json" \
    && ok "another model's caches are not used" || not_ok "another model's caches"
done_testing
