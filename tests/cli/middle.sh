#!/bin/sh
# cb-precompute --middle: each chunk also stored as computed after a fixed
# passage (lib/prompt/prompt.c's middle_text) and the separator, as it
# stands in the middle of a prompt; cb-run takes that cache for every chunk
# but a prompt's first, by the chunk's tokens alone.  Where the prompt's
# first chunk is that passage itself, the second chunk's cache is what full
# prefill computes there, so reuse is checked against full prefill.  On the
# tiny qwen2 fixture.
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny4-qwen2.gguf
need_fixture "$M" "cb-precompute --middle"
PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run
cat > "$T/c.jsonl" <<'EOF'
{"doc":"a","text":"The river Vale runs past the town of Kelby, north of the hills."}
{"doc":"b","text":"Its bridge was built in 1910 by the Norden company of Kelby."}
{"doc":"c","text":"The old mill ground wheat until 1950."}
EOF
# the passage, as the source spells it (adjacent C literals, \n escapes)
python3 - > "$T/mid.txt" <<'PY' || { not_ok "middle_text not found in lib/prompt/prompt.c"; done_testing; exit; }
import re, sys
src = open("lib/prompt/prompt.c").read()
m = re.search(r'static const char middle_text\[\] =\s*((?:"(?:[^"\\]|\\.)*"\s*)+);', src)
text = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))).replace("\\n", "\n").replace('\\"', '"')
assert "\\" not in text, text
sys.stdout.write(text)
PY
keys() { "$BINDIR_B/cb-store" --store "$1" ls 2>/dev/null | grep -c -- '-'; }
"$PRE" -m "$M" --store "$T/plain" -q "$T/c.jsonl" > "$T/plain.out"
"$PRE" -m "$M" --store "$T/mid" --middle -vv "$T/c.jsonl" > "$T/mid.out" 2> "$T/err"
rc=$?
[ $rc -eq 0 ] && [ "$(keys "$T/mid")" -eq $(($(keys "$T/plain") + 3)) ] \
    && grep -q '3 chunks also after the middle passage' "$T/err" \
    && [ "$(grep -c 'after the middle passage, stored' "$T/err")" -eq 3 ] \
    && ok "--middle stores each chunk's own cache and one after the passage (3 more), -v says so" \
    || { not_ok "--middle stores (rc $rc, $(keys "$T/mid") keys)"; sed 's/^/#   /' "$T/err" | head -5; }
cmp -s "$T/plain.out" "$T/mid.out" \
    && ok "the records are as without it (\"kv\": the chunk's own key)" || not_ok "records differ"
"$PRE" -m "$M" --store "$T/mid" --middle -q "$T/c.jsonl" > "$T/mid2.out" \
    && [ "$(keys "$T/mid")" -eq $(($(keys "$T/plain") + 3)) ] \
    && ok "a second run stores nothing new" || not_ok "second run"

python3 -c 'import json,sys; print(json.dumps({"text": open(sys.argv[1]).read()}))' "$T/mid.txt" > "$T/exact.jsonl"
sed -n 2p "$T/c.jsonl" >> "$T/exact.jsonl"  # the passage itself first, then a chunk
verify_stats exact reuse "$T/mid" "$T/exact.jsonl" && verify_stats two reuse "$T/mid" "$T/mid.out" \
    && verify_stats none reuse "$T/mid" "$T/mid.out" --tune no-context \
    && verify_stats plain reuse "$T/plain" "$T/mid.out" \
    && verify_stats blend blend "$T/mid" "$T/mid.out" \
    || { not_ok "cb-run"; sed 's/^/#   /' "$T"/*.err | head -5; }
python3 - "$T" <<'PY' && ok "after the passage, with the passage right before it in the prompt: the pair's file, reuse is full prefill" || not_ok "the cache after the passage"
import json, sys
e = json.load(open(f"{sys.argv[1]}/exact.json"))
# the same tokens before the same chunk: the file --context stores for the pair, found as such
assert e["n_chunks_after"] == 1 and e["n_chunks_missing"] == 1, e  # the passage: not stored
assert e["n_exact_tokens"] == e["n_cached_tokens"], e
assert e["verify"]["kl"] < 1e-4 and e["verify"]["top1_agree"], e["verify"]
PY
python3 - "$T" <<'PY' && ok "every chunk but the first takes it; not with --tune no-context, nor from a store without it" || not_ok "middle lookups"
import json, sys
t = sys.argv[1]
two, none, plain, blend = (json.load(open(f"{t}/{x}.json")) for x in ("two", "none", "plain", "blend"))
assert two["n_chunks"] == 3 and two["n_chunks_middle"] == 2 and two["n_chunks_missing"] == 0, two
assert blend["n_chunks_middle"] == 2 and blend["n_chunks_missing"] == 0, blend
assert none["n_chunks_middle"] == 0 and none["n_chunks_missing"] == 0, none
assert plain["n_chunks_middle"] == 0 and plain["n_chunks_missing"] == 0, plain
# the first chunk's cache is its own either way: the same first-chunk rows, other caches after it
assert none["verify"]["kl"] == plain["verify"]["kl"], (none["verify"], plain["verify"])
assert two["verify"]["kl"] != none["verify"]["kl"], (two["verify"], none["verify"])
PY
# --batch takes it too
python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
print(json.dumps({"id": 1, "question": "Who built the bridge?", "chunks": [{"text": r["text"]} for r in recs], "mode": "reuse"}))
print(json.dumps({"id": 2, "question": "Who built the bridge?", "chunks": [r["kv"] for r in recs[1:]], "mode": "blend"}))' \
    "$T/mid.out" > "$T/q.jsonl"
"$RUN" -m "$M" --store "$T/mid" --batch "$T/q.jsonl" -n 1 --temp 0 --no-store-write > "$T/b.jsonl" 2> "$T/b.err" \
    && python3 - "$T" <<'PY' && ok "--batch: chunks by text take it after the first; chunks given by key keep the file named" || { not_ok "--batch middle"; sed 's/^/#   /' "$T/b.err" | head -3; }
import json, sys
b = {a["id"]: a for a in map(json.loads, open(f"{sys.argv[1]}/b.jsonl"))}
assert b[1]["stats"]["n_chunks_middle"] == 2 and b[1]["stats"]["n_chunks_missing"] == 0, b[1]
assert b[2]["stats"]["n_chunks_middle"] == 0 and b[2]["stats"]["n_chunks_missing"] == 0, b[2]
PY
# --for-system: after that head and the passage, found by prompts with that system message
"$PRE" -m "$M" --store "$T/sys" --middle --for-system "Be brief." -q "$T/c.jsonl" > "$T/sys.out" \
    && verify_stats other blend "$T/sys" "$T/sys.out" \
    && verify_stats right blend "$T/sys" "$T/sys.out" --system "Be brief." \
    && python3 - "$T" <<'PY' && ok "--for-system: found only by prompts with that system message" || { not_ok "--for-system with --middle"; sed 's/^/#   /' "$T/right.err" | head -3; }
import json, sys
t = sys.argv[1]
o, r = (json.load(open(f"{t}/{x}.json")) for x in ("other", "right"))
assert o["n_chunks_middle"] == 0 and o["n_chunks_missing"] == 3, o
assert r["n_chunks_middle"] == 2 and r["n_chunks_system"] == 3 and r["n_chunks_missing"] == 0, r
PY
"$PRE" -m "$M" --store "$T/mid" --middle --neighbours 1 -q "$T/c.jsonl" > /dev/null 2> "$T/e" \
    && ok "--middle with --neighbours runs" || { not_ok "--middle --neighbours"; sed 's/^/#   /' "$T/e" | head -3; }
done_testing
