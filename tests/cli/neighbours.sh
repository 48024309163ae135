#!/bin/sh
# cb-precompute --neighbours K: each chunk also stored as computed after its
# K most similar chunks of the input (BM25, tests/unit/test_prompt.c checks
# the ranking), that cache's key written as the record's "kv"; cb-run tries
# a record's "kv" first and falls back on the chunk's own cache.  With K 1
# the cache after a chunk's neighbour is the one a prompt with the
# neighbour right before it needs, so reuse there is full prefill: the
# cache is checked against full prefill itself.  On the tiny qwen2 fixture.
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny4-qwen2.gguf
need_fixture "$M" "cb-precompute --neighbours"
PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run
cat > "$T/c.jsonl" <<'EOF'
{"doc":"a","text":"The river Vale runs past the town of Kelby, north of the hills."}
{"doc":"b","text":"Its bridge was built in 1910 by the Norden company of Kelby."}
{"doc":"c","text":"The Norden company of Kelby built the bridge over the Vale in 1910."}

{"doc":"d","text":"The old mill ground wheat until 1950."}
{"doc":"e","text":"It is now a museum of the valley's trades."}
{"doc":"f","text":"A market is held every Tuesday by the old mill."}
EOF
keys() { "$BINDIR_B/cb-store" --store "$1" ls 2>/dev/null | grep -c -- '-'; }
"$PRE" -m "$M" --store "$T/plain" -q "$T/c.jsonl" > "$T/plain.out"
"$PRE" -m "$M" --store "$T/nb" --neighbours 1 -vv "$T/c.jsonl" > "$T/nb.out" 2> "$T/err"
rc=$?
[ $rc -eq 0 ] && [ "$(keys "$T/nb")" -eq $(($(keys "$T/plain") + 6)) ] \
    && grep -q '6 chunks also after their neighbours' "$T/err" \
    && ok "--neighbours 1 stores each chunk's own cache and one after its neighbour (6 more)" \
    || { not_ok "--neighbours stores (rc $rc, $(keys "$T/nb") keys)"; sed 's/^/#   /' "$T/err" | head -5; }
python3 - "$T" <<'PY' && ok "the records as without it but for \"kv\": the cache after the neighbour" || not_ok "records"
import json, sys
t = sys.argv[1]
p = [json.loads(l) for l in open(f"{t}/plain.out")]
n = [json.loads(l) for l in open(f"{t}/nb.out")]
assert len(p) == len(n) == 6
for a, b in zip(p, n):
    assert a["kv"] != b["kv"] and a["kv"][:32] == b["kv"][:32], (a, b)
    a.pop("kv"), b.pop("kv")
    assert a == b, (a, b)
PY
grep -q 'c.jsonl:3: after line 2 (the nearest last)' "$T/err" \
    && ok "-v names the neighbour by its line (the bridge's two records, each other's)" \
    || { not_ok "line 3's neighbour"; grep 'after line' "$T/err" | sed 's/^/#   /'; }
"$PRE" -m "$M" --store "$T/nb" --neighbours 1 -q "$T/c.jsonl" > "$T/nb2.out" \
    && [ "$(keys "$T/nb")" -eq $(($(keys "$T/plain") + 6)) ] \
    && [ "$(sed 's/"cached":true/"cached":false/' "$T/nb2.out")" = "$(cat "$T/nb.out")" ] \
    && ok "a second run stores nothing new, the same keys, cached" || not_ok "second run"

{ sed -n 2p "$T/c.jsonl"; sed -n 3p "$T/nb.out"; } > "$T/exact.jsonl"  # line 3 after its neighbour
{ sed -n 1p "$T/c.jsonl"; sed -n 3p "$T/nb.out"; } > "$T/named.jsonl"  # ... after another chunk
{ sed -n 1p "$T/c.jsonl"; sed -n 3p "$T/c.jsonl"; } > "$T/own.jsonl"
verify_stats exact reuse "$T/nb" "$T/exact.jsonl" && verify_stats named reuse "$T/nb" "$T/named.jsonl" \
    && verify_stats own reuse "$T/nb" "$T/own.jsonl" && verify_stats fallback blend "$T/plain" "$T/nb.out" \
    || { not_ok "cb-run"; sed 's/^/#   /' "$T"/*.err | head -5; }
python3 - "$T" <<'PY' && ok "after its neighbour, right before it in the prompt: reuse is full prefill" || not_ok "the cache after the neighbour"
import json, sys
e = json.load(open(f"{sys.argv[1]}/exact.json"))
assert e["n_chunks_after"] == 1 and e["n_exact_tokens"] == e["n_cached_tokens"], e
assert e["verify"]["kl"] < 1e-4, e["verify"]
PY
python3 - "$T" <<'PY' && ok "elsewhere the record's cache is taken (named), not the chunk's own; missing, the own one" || not_ok "named lookups"
import json, sys
t = sys.argv[1]
n, o, f = (json.load(open(f"{t}/{x}.json")) for x in ("named", "own", "fallback"))
assert n["n_chunks_named"] == 1 and n["n_chunks_missing"] == 0 and n["n_exact_tokens"] < n["n_cached_tokens"], n
assert o["n_chunks_named"] == 0 and o["n_chunks_missing"] == 0, o
assert n["verify"]["kl"] != o["verify"]["kl"], (n["verify"], o["verify"])
assert f["n_chunks_named"] == 0 and f["n_chunks_missing"] == 0 and f["n_chunks"] == 6, f
PY
# the same through --batch: a chunk given by text and "kv"
python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
print(json.dumps({"id": 1, "question": "Who built the bridge?", "chunks": [{"text": recs[0]["text"]}, recs[2]], "mode": "reuse"}))
print(json.dumps({"id": 2, "question": "Who built the bridge?", "chunks": [r["kv"] for r in recs[3:]], "mode": "blend"}))' \
    "$T/nb.out" > "$T/q.jsonl"
"$RUN" -m "$M" --store "$T/nb" --batch "$T/q.jsonl" -n 1 --temp 0 --no-store-write > "$T/b.jsonl" 2> "$T/b.err" \
    && python3 - "$T" <<'PY' && ok "--batch: a chunk with text and \"kv\", or given by that key alone, takes the named cache" || { not_ok "--batch named"; sed 's/^/#   /' "$T/b.err" | head -3; }
import json, sys
b = {a["id"]: a for a in map(json.loads, open(f"{sys.argv[1]}/b.jsonl"))}
assert b[1]["stats"]["n_chunks_named"] == 1 and b[1]["stats"]["n_chunks_missing"] == 0, b[1]
assert b[2]["stats"]["n_chunks_named"] == 3 and b[2]["stats"]["n_chunks_missing"] == 0, b[2]
PY
# computed after another prompt head (--for-system): a warning, the text's own cache
"$PRE" -m "$M" --store "$T/sys" --neighbours 2 --for-system "Be brief." -q "$T/c.jsonl" > "$T/sys.out" \
    && verify_stats wrong blend "$T/sys" "$T/sys.out" \
    && grep -q 'computed after another prompt head' "$T/wrong.err" \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["n_chunks_named"] == 0, s' "$T/wrong.json" \
    && verify_stats right blend "$T/sys" "$T/sys.out" --system "Be brief." \
    && python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["n_chunks_named"] == 6 and s["n_chunks_missing"] == 0, s' "$T/right.json" \
    && ok "--for-system: named caches only for prompts with that system message (a warning otherwise)" \
    || { not_ok "--for-system with --neighbours"; sed 's/^/#   /' "$T/wrong.err" | head -3; }
for bad in 0 17 x; do
    "$PRE" -m "$M" --store "$T/nb" --neighbours $bad "$T/c.jsonl" > /dev/null 2> "$T/e"
    rc=$?
    [ $rc -eq 64 ] && grep -q "^cb-precompute: --neighbours: '$bad' is not a number of chunks from 1 to 16" "$T/e" \
        && ok "--neighbours $bad: usage error 64, named" || not_ok "--neighbours $bad: rc $rc, $(cat "$T/e")"
done
printf '{"text":"Only one chunk here."}\n' > "$T/one.jsonl"
"$PRE" -m "$M" --store "$T/one" --neighbours 3 "$T/one.jsonl" > "$T/one.out" 2> "$T/e" \
    && [ "$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read())["kv"])' "$T/one.out")" = \
         "$("$PRE" -m "$M" --store "$T/one" -q "$T/one.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["kv"])')" ] \
    && ok "a chunk without neighbours keeps its own cache as its \"kv\"" || not_ok "one chunk: $(cat "$T/e")"
done_testing
