#!/bin/sh
# cb-precompute --context: each chunk also stored as computed after the chunk
# before it in its document (same "doc", "seq" one more, read in a row);
# cb-run uses that cache where the two chunks come in that order, which makes
# the second one a true prefix after the first (reuse then equals full
# prefill), and falls back on the chunk's own cache elsewhere.  On the tiny
# qwen2 fixture (a chat template: the lead-in is its prompt head).
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny4-qwen2.gguf
need_fixture "$M" "cb-precompute --context"
cat > "$T/c.jsonl" <<'EOF'
{"doc":"vale","seq":0,"text":"The river Vale runs past the town of Kelby, north of the hills."}
{"doc":"vale","seq":1,"text":"Its bridge was built in 1910 by the Norden company of Kelby."}
{"doc":"vale","seq":2,"text":"The town holds a market every Tuesday by the old mill."}
{"doc":"mill","seq":0,"text":"The old mill ground wheat until 1950."}
{"doc":"mill","seq":2,"text":"It is now a museum of the valley's trades."}
{"text":"A record without a document."}
EOF
keys() { "$BINDIR_B/cb-store" --store "$1" ls 2>/dev/null | grep -c -- '-'; }
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/plain" -q "$T/c.jsonl" > /dev/null
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/ctx" --context -vv "$T/c.jsonl" > "$T/out" 2> "$T/err"
rc=$?
[ $rc -eq 0 ] && [ "$(keys "$T/plain")" -eq 6 ] && [ "$(keys "$T/ctx")" -eq 8 ] \
    && grep -q '2 chunks also after the chunk before them' "$T/err" \
    && ok "--context stores two more caches: vale 1 after 0, vale 2 after 1 (mill 2 does not follow 0)" \
    || { not_ok "--context stores (rc $rc, $(keys "$T/ctx") keys)"; sed 's/^/#   /' "$T/err" | head -5; }
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/plain" -q "$T/c.jsonl" | sed 's/"cached":true/"cached":false/' > "$T/out.plain"
cmp -s "$T/out" "$T/out.plain" && ok "the records written are the same as without it (the chunks' own keys)" \
    || not_ok "records differ with --context"
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/ctx" --context -q "$T/c.jsonl" > /dev/null \
    && [ "$(keys "$T/ctx")" -eq 8 ] && ok "a second run stores nothing new" \
    || not_ok "second run: $(keys "$T/ctx") keys"

# run MODE STORE CHUNKS: cb-run's stats, with --verify against full prefill
run() {
    "$BINDIR_B/cb-run" -m "$M" --store "$2" --chunks "$3" --mode "$1" --verify -n 1 --temp 0 \
        --no-store-write --stats "$T/st.json" -p "Who built the bridge?" > /dev/null 2> "$T/err" \
        && cat "$T/st.json"
}
head -2 "$T/c.jsonl" > "$T/two.jsonl"
{ sed -n 2p "$T/c.jsonl"; sed -n 1p "$T/c.jsonl"; } > "$T/swapped.jsonl"
run reuse "$T/ctx" "$T/two.jsonl" > "$T/a.json" && run reuse "$T/plain" "$T/two.jsonl" > "$T/b.json" \
    && run reuse "$T/ctx" "$T/swapped.jsonl" > "$T/s.json" && run blend "$T/ctx" "$T/c.jsonl" > "$T/c.json" \
    && run prefix "$T/ctx" "$T/two.jsonl" > "$T/p.json" \
    || { not_ok "cb-run"; sed 's/^/#   /' "$T/err" | head -5; }
python3 - "$T" <<'PY' && ok "reuse with the pair in order is full prefill (a true prefix), with its own cache it is not" || not_ok "contextual reuse"
import json, sys
t = sys.argv[1]
a, b = (json.load(open(f"{t}/{x}.json")) for x in "ab")
assert a["n_chunks_after"] == 1 and b["n_chunks_after"] == 0, (a["n_chunks_after"], b["n_chunks_after"])
assert a["n_exact_tokens"] == a["n_cached_tokens"] > b["n_exact_tokens"] > 0, (a, b)
assert a["verify"]["kl"] < 1e-4 and b["verify"]["kl"] > 1e-3, (a["verify"], b["verify"])
PY
python3 - "$T" <<'PY' && ok "swapped, the chunks' own caches; a blend of all six uses the two; prefix caching reuses the pair" || not_ok "contextual lookups"
import json, sys
t = sys.argv[1]
s, c, p = (json.load(open(f"{t}/{x}.json")) for x in "scp")
assert s["n_chunks_after"] == 0 and s["n_chunks_missing"] == 0, s
assert c["n_chunks_after"] == 2 and c["n_chunks"] == 6 and c["n_chunks_missing"] == 0, c
assert p["n_cached_tokens"] == json.load(open(f"{t}/a.json"))["n_cached_tokens"] and p["verify"]["kl"] < 1e-4, p
PY
# the same pair given by store keys (a --batch line), and --tune no-context
python3 -c '
import json, sys
ks = [json.loads(l)["kv"] for l in list(open(sys.argv[1]))[:2]]
print(json.dumps({"question": "Who built the bridge?", "chunks": ks, "mode": "reuse"}))' "$T/out" > "$T/keys.jsonl"
"$BINDIR_B/cb-run" -m "$M" --store "$T/ctx" --batch "$T/keys.jsonl" -n 1 --temp 0 --no-store-write \
        > "$T/k.jsonl" 2> "$T/err" \
    && "$BINDIR_B/cb-run" -m "$M" --store "$T/ctx" --chunks "$T/two.jsonl" --mode reuse --tune no-context \
        -n 1 --temp 0 --no-store-write --stats "$T/n.json" -p "Who built the bridge?" > /dev/null 2>&1 \
    && python3 - "$T" <<'PY' && ok "chunks given by key use it too; --tune no-context keeps each chunk's own" || not_ok "keys, --tune no-context"
import json, sys
t = sys.argv[1]
k = json.loads(open(f"{t}/k.jsonl").readline())["stats"]
n, a, b = (json.load(open(f"{t}/{x}.json")) for x in "nab")
assert k["n_chunks_after"] == 1 and k["n_exact_tokens"] == a["n_exact_tokens"] == k["n_cached_tokens"], k
assert n["n_chunks_after"] == 0 and n["n_exact_tokens"] == b["n_exact_tokens"], n
PY
done_testing
