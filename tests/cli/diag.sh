#!/bin/sh
# make diag's tool (tests/bench/blend_diag) on a tiny qwen2 fixture: full
# prefill against itself is exact, a moved chunk's layer-0 keys equal those
# computed in place, recomputing every cached row (probe at ratio 1) gives
# full prefill back, reuse does not; the attention shares add up; bad
# modes and missing caches are refused; each chunk's share of the question's
# attention adds up to the chunks' and ranks the gold one; the oracle
# modes (and oiter, probe in two rounds) pick as many rows as probe,
# probe's own score (oprobe) picks its rows, and every row recomputed gives
# full prefill back; late:R:K (probe's rows from layer K on) is oprobe at
# K 0 and reuse at K past every layer.
. "$(dirname "$0")/lib.sh"
DIAG=${BUILD:-build/rel}/bench/blend_diag
M=$CB_TEST_TMP/tiny4-qwen2.gguf
S=$T/store
if [ ! -x "$DIAG" ] || [ ! -f "$M" ]; then
    skip "blend_diag" "no $DIAG or no fixture $M (make check-tools builds them)"
    done_testing
    exit
fi
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
chunks = ["The river Vale runs past the town of Kelby, north of the hills.",
          "Its bridge was built in 1910 by the Norden company of Kelby.",
          "The town holds a market every Tuesday by the old mill."]
with open(f"{t}/chunks.jsonl", "w") as f:
    for c in chunks:
        f.write(json.dumps({"text": c}) + "\n")
with open(f"{t}/q.jsonl", "w") as f:
    f.write(json.dumps({"question": "Who built the bridge?", "chunks": chunks, "gold": [1]}) + "\n")
    f.write(json.dumps({"question": "Which river?", "chunks": chunks[:1], "gold": [0]}) + "\n")
PY
"$BINDIR_B/cb-precompute" -m "$M" --store "$S" -q "$T/chunks.jsonl" > /dev/null \
    && ok "chunks precomputed" || not_ok "cb-precompute"
"$DIAG" "$M" "$S" 1 "$T/q.jsonl" reuse probe:1 probe:0.3 probe:0.3:1 oprobe:0.3 oatt:1 oatt:0.3 \
    odev:0.3 ostale:0.3 ovdev:0.3 oiter:0.3 > "$T/d.jsonl" 2> "$T/err"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l < "$T/d.jsonl")" -eq 24 ] && ok "a line per question and mode" \
    || { not_ok "blend_diag (rc $rc)"; sed 's/^/#   /' "$T/err" | head -5; }
python3 - "$T/d.jsonl" <<'PY' && ok "full exact, moved chunks exact at layer 0, ratio 1 = full, reuse not, shares add up" || not_ok "diagnosis values"
import json, sys
ls = [json.loads(x) for x in open(sys.argv[1])]
parts = ["prefix", "heads", "gold", "other", "sep", "self"]
for x in ls:
    for l in range(len(x["tv"])):
        s = sum(x[p][l] for p in parts)
        assert abs(s - 1) < 1e-3, (x["mode"], l, s)
full = [x for x in ls if x["mode"] == "full"]
assert len(full) == 2 and all(max(x["tv"]) == 0 and min(x["cos"]) > 0.99999 and max(x["kdev"]) == 0
                              for x in full), full
q0 = {x["mode"]: x for x in ls if x["q"] == 0}
r, p1, p3 = q0["reuse"], q0["probe:1"], q0["probe:0.3"]
assert r["kdev0"] < 3e-3, r["kdev0"]  # f16 rounding of the rotated keys
assert max(r["kdev"]) > 1e-3 and r["kl"] > 1e-6 and max(r["tv"]) > 1e-4, r
assert p1["kl"] < 1e-4 and max(p1["tv"]) < 2e-3 and max(p1["kdev"]) < 3e-3, p1
assert p3["n_recomputed"] > 0 and p1["n_recomputed"] > p3["n_recomputed"], (p1, p3)
# one chunk right after the prompt's head is a true prefix: reuse is full prefill
q1 = {x["mode"]: x for x in ls if x["q"] == 1}
assert q1["reuse"]["kl"] < 1e-4 and max(q1["reuse"]["kdev"]) < 3e-3, q1["reuse"]
PY
python3 - "$T/d.jsonl" <<'PY' && ok "each chunk's attention adds up to the chunks' share; the gold chunk's rank" || not_ok "chunk attention values"
import json, sys
ls = [json.loads(x) for x in open(sys.argv[1])]
for x in ls:
    L, n = len(x["tv"]), x["n_chunks"]
    assert len(x["chunk_mass"]) == n and len(x["chunk_mass_half"]) == n, x
    want = sum(x["heads"][l] + x["gold"][l] + x["other"][l] for l in range(L)) / L
    assert abs(sum(x["chunk_mass"]) - want) < 1e-3, (x["mode"], sum(x["chunk_mass"]), want)
    h = (L + 1) // 2
    want = sum(x["heads"][l] + x["gold"][l] + x["other"][l] for l in range(h)) / h
    assert abs(sum(x["chunk_mass_half"]) - want) < 1e-3, (x["mode"], sum(x["chunk_mass_half"]), want)
    for key in ("", "_half"):  # gold chunk 1 of 3 (question 0), 0 of 1 (question 1)
        m, r = x["chunk_mass" + key], x["gold_rank" + key]
        g = 1 if x["q"] == 0 else 0
        assert r == sum(m[e] > m[g] or (m[e] == m[g] and e < g) for e in range(n)), (x["mode"], key, r, m)
        assert 0 <= r < n, r
PY
python3 - "$T/d.jsonl" <<'PY' && ok "oracle modes: probe's own score picks probe's rows, every row recomputed is full prefill, each recomputes the ratio's rows; staleness by place" || not_ok "oracle values"
import json, sys
ls = [json.loads(x) for x in open(sys.argv[1])]
q0 = {x["mode"]: x for x in ls if x["q"] == 0}
p3 = q0["probe:0.3:1"]  # probe scoring at every layer, as the oracles do
assert abs(q0["oprobe:0.3"]["kl"] - p3["kl"]) <= 1e-3 * p3["kl"] + 1e-9, (q0["oprobe:0.3"], p3)
assert q0["oatt:1"]["kl"] < 1e-4 and q0["oatt:1"]["n_recomputed"] == q0["probe:1"]["n_recomputed"], q0["oatt:1"]
for m in ("oprobe", "oatt", "odev", "ostale", "ovdev", "oiter"):
    o = q0[m + ":0.3"]
    assert o["n_recomputed"] == p3["n_recomputed"], (m, o["n_recomputed"], p3["n_recomputed"])
    assert 0 < o["kl"] < 10, (m, o["kl"])  # random weights: no ranking of the scores here
r = q0["reuse"]
vc = r["vdev_chunk"]
assert len(r["vdev_pos"]) == 11 and len(vc) == r["n_chunks"], r
assert vc[0] < 3e-3 and min(vc[1:]) > 1e-3, vc  # the first chunk is a true prefix
assert max(r["vdev_pos"]) > 1e-3, r["vdev_pos"]
q1 = {x["mode"]: x for x in ls if x["q"] == 1}
assert len(q1["reuse"]["vdev_chunk"]) == 1 and q1["reuse"]["vdev_chunk"][0] < 3e-3, q1["reuse"]
assert max(q1["reuse"]["vdev_pos"]) == 0, q1["reuse"]["vdev_pos"]  # a true prefix's rows: not by place
PY
# late:R:K, probe's rows recomputed from layer K on, from their chunks' own
# hidden state there: at K 0 it is oprobe, at K = every layer (4) reuse
"$DIAG" "$M" "$S" 1 "$T/q.jsonl" reuse oprobe:0.3 late:0.3:0 late:0.3:2 late:0.3:4 > "$T/l.jsonl" 2> "$T/err" \
    && python3 - "$T/l.jsonl" <<'PY' && ok "late:R:K: K 0 is oprobe, K 2 between, K all layers reuse" || not_ok "late start values"
import json, sys
q0 = {x["mode"]: x for x in map(json.loads, open(sys.argv[1])) if x["q"] == 0}
o, r = q0["oprobe:0.3"], q0["reuse"]
assert q0["late:0.3:0"]["kl"] == o["kl"], (q0["late:0.3:0"], o)
assert all(q0[m]["n_recomputed"] == o["n_recomputed"] for m in ("late:0.3:0", "late:0.3:2", "late:0.3:4"))
assert abs(q0["late:0.3:4"]["kl"] - r["kl"]) <= 1e-3 * r["kl"], (q0["late:0.3:4"], r)
assert q0["late:0.3:2"]["kl"] not in (o["kl"], r["kl"]), (q0["late:0.3:2"], o, r)
PY
expect_exit "a late start past the last layer is refused" 65 "$DIAG" "$M" "$S" 1 "$T/q.jsonl" late:0.3:5
grep -q "late:0.3:5 starts past the model's 4 layers" "$T/err" && ok "and why" || not_ok "the late start's message"
# a cached head (a system message's, stored by cb-precompute --system) is none of the chunks
SYS="You answer questions about the town archive of Kelby, briefly."
python3 -c 'import json, sys; q = json.loads(open(sys.argv[1]).readline()); q["system"] = sys.argv[2]; print(json.dumps(q))' \
    "$T/q.jsonl" "$SYS" > "$T/qs.jsonl"
"$BINDIR_B/cb-precompute" -m "$M" --store "$S" --system "$SYS" -q "$T/chunks.jsonl" > /dev/null \
    && "$DIAG" "$M" "$S" 1 "$T/qs.jsonl" reuse oprobe:0.3 > "$T/h.jsonl" 2> "$T/err" \
    && python3 - "$T/h.jsonl" <<'PY' && ok "a cached head: not a chunk (3 chunks, their attention, a gold rank), its rows the prompt's head" || not_ok "with a cached head"
import json, sys
ls = [json.loads(x) for x in open(sys.argv[1])]
assert len(ls) == 3, ls
for x in ls:
    assert len(x["chunk_mass"]) == 3 and len(x["vdev_chunk"]) == 3 and x["gold_rank"] >= 0, x
    assert max(x["prefix"]) > 0, x  # the head's rows are the prompt's head, as before
r = [x for x in ls if x["mode"] == "reuse"][0]
assert min(r["vdev_chunk"]) > 1e-3, r["vdev_chunk"]  # computed after another lead-in: none exact
assert max(r["vdev_pos"]) > 1e-3, r["vdev_pos"]
PY
expect_exit "a bad mode is refused" 64 "$DIAG" "$M" "$S" 1 "$T/q.jsonl" probe:2
grep -q "bad mode 'probe:2'" "$T/err" && ok "and named" || not_ok "the bad mode's message"
echo '{"text": "Another text altogether."}' | "$BINDIR_B/cb-precompute" -m "$M" --store "$T/other" -q > /dev/null
expect_exit "chunks missing from the store" 65 "$DIAG" "$M" "$T/other" 1 "$T/q.jsonl" reuse
grep -q "not in the store" "$T/err" && ok "said so" || not_ok "the missing chunks' message"
done_testing
