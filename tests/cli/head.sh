#!/bin/sh
# The prompt's head (BOS, the chat template's system turn and the user
# turn's opener) cached alone: cb-run stores it after an answer when the
# store lacks it, like a missing chunk, and loads it as an exact prefix
# from then on (reuse of it alone equals full prefill); cb-precompute stores
# the default head with its first chunk, and with --system that message's
# head, for stores a run may not write to.  On the tiny qwen2 fixture, whose
# template has no default system turn (a head too short to cache: the
# system messages below make it long enough), and on SmolLM2 when present.
. "$(dirname "$0")/lib.sh"
M=$CB_TEST_TMP/tiny4-qwen2.gguf
need_fixture "$M" "the prompt's head cached"
SYS="You answer questions about the town archive of Kelby, briefly."
cat > "$T/c.jsonl" <<'EOF'
{"text":"The river Vale runs past the town of Kelby, north of the hills."}
{"text":"Its bridge was built in 1910 by the Norden company of Kelby."}
EOF
n_keys() { "$BINDIR_B/cb-store" --store "$1" ls 2>/dev/null | grep -c -- '-'; }
# run STORE MODE [ARGS...]: cb-run's stats, with --verify against full prefill
run() {
    st=$1 mode=$2; shift 2
    "$BINDIR_B/cb-run" -m "$M" --store "$st" --mode "$mode" --verify -n 1 --temp 0 \
        --stats "$T/st.json" -p "Who built the bridge?" "$@" > /dev/null 2> "$T/err" \
        && cat "$T/st.json"
}
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/s" -q "$T/c.jsonl" > /dev/null \
    && [ "$(n_keys "$T/s")" -eq 2 ] && ok "cb-precompute: a default head under 8 tokens is not stored" \
    || not_ok "precompute: $(n_keys "$T/s") keys"
cp -r "$T/s" "$T/ro"
run "$T/s" reuse --system "$SYS" --chunks "$T/c.jsonl" --no-store-write > "$T/a.json" \
    && [ "$(n_keys "$T/s")" -eq 2 ] && ok "--no-store-write: the head is not stored" \
    || { not_ok "--no-store-write (keys $(n_keys "$T/s"))"; sed 's/^/#   /' "$T/err" | head -5; }
run "$T/s" reuse --system "$SYS" --chunks "$T/c.jsonl" > "$T/b.json" && [ "$(n_keys "$T/s")" -eq 3 ] \
    && run "$T/s" reuse --system "$SYS" --chunks "$T/c.jsonl" > "$T/c.json" && [ "$(n_keys "$T/s")" -eq 3 ] \
    && ok "after an answer, the head of that system message is stored, once" \
    || { not_ok "head stored (keys $(n_keys "$T/s"))"; sed 's/^/#   /' "$T/err" | head -5; }
# no chunks at all: the head is the only cache; reuse of it is full prefill
run "$T/s" reuse --system "$SYS" --chunks /dev/null > "$T/d.json" \
    && run "$T/s" reuse --system "Another system message, not stored anywhere yet." --chunks /dev/null \
        --no-store-write > "$T/e.json" \
    || { not_ok "cb-run without chunks"; sed 's/^/#   /' "$T/err" | head -5; }
python3 - "$T" <<'PY' && ok "the stored head is loaded as an exact prefix: reuse equals full prefill, the next chunk's place unchanged" || not_ok "head reuse"
import json, sys
t = sys.argv[1]
a, b, c, d, e = (json.load(open(f"{t}/{x}.json")) for x in "abcde")
# before the head was stored, and after: the chunks' caches are the same
assert a["n_exact_tokens"] == b["n_exact_tokens"] == 0, (a["n_exact_tokens"], b["n_exact_tokens"])
head = c["n_exact_tokens"]
assert head >= 8 and c["n_cached_tokens"] == a["n_cached_tokens"] + head, (a, c)
assert c["n_chunks_missing"] == 0 and c["n_chunks"] == 2, c
assert d["n_exact_tokens"] == d["n_cached_tokens"] == head and d["verify"]["kl"] < 1e-6, d
assert e["n_cached_tokens"] == 0, e
PY
python3 - "$T" <<'PY' && ok "a blend with the head cached keeps to full prefill as before" || not_ok "blend with the head"
import json, sys
t = sys.argv[1]
a, c = (json.load(open(f"{t}/{x}.json")) for x in "ac")
assert c["verify"]["kl"] <= a["verify"]["kl"] + 1e-4, (a["verify"], c["verify"])
PY
# a head file that fails its checksum: dropped (a warning says so) and computed instead, the
# answer full prefill's; the run stores it again, so the store verifies clean after it
"$BINDIR_B/cb-store" --store "$T/ro" ls | cut -d' ' -f1 | sort > "$T/k0"
hk=$("$BINDIR_B/cb-store" --store "$T/s" ls | cut -d' ' -f1 | sort | comm -13 "$T/k0" -)
hp=$("$BINDIR_B/cb-store" --store "$T/s" ls --json | python3 -c '
import json, sys
print([e["path"] for e in map(json.loads, sys.stdin) if e["key"] == sys.argv[1]][0])' "$hk")
printf 'XXXXXXXX' | dd of="$hp" bs=1 seek=8200 conv=notrunc 2> /dev/null
run "$T/s" reuse --system "$SYS" --chunks /dev/null > "$T/f.json" \
    && grep -q "$hk.*checksum.*dropped" "$T/err" \
    && "$BINDIR_B/cb-store" --store "$T/s" verify > /dev/null 2>&1 \
    && "$BINDIR_B/cb-store" --store "$T/s" ls | grep -q "^$hk" \
    && python3 - "$T" <<'PY' && ok "a corrupt head file: dropped and computed, with a warning; stored again, verify clean" || { not_ok "corrupt head"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
f = json.load(open(f"{sys.argv[1]}/f.json"))
assert f["n_cached_tokens"] == 0 and f["verify"]["kl"] < 1e-6, f
PY
# cb-precompute --system: that message's head stored with the chunks (once), loaded by a run
# that may not write as the one above stored it; a system message too short to be worth an entry
# (none: '') is said so, and nothing more is stored
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/sys" --system "$SYS" --system '' "$T/c.jsonl" \
        > "$T/sys.out" 2> "$T/sys.err" \
    && [ "$(n_keys "$T/sys")" -eq 3 ] && grep -q "system \"\": .*too short.*not stored" "$T/sys.err" \
    && "$BINDIR_B/cb-precompute" -m "$M" --store "$T/sys" --system "$SYS" -q "$T/c.jsonl" > /dev/null \
    && [ "$(n_keys "$T/sys")" -eq 3 ] \
    && run "$T/sys" reuse --system "$SYS" --chunks "$T/c.jsonl" --no-store-write > "$T/g.json" \
    && python3 - "$T" <<'PY' && ok "cb-precompute --system: that prompt's head stored once, loaded exact by a run that does not write" || { not_ok "precompute --system (keys $(n_keys "$T/sys"))"; sed 's/^/#   /' "$T/sys.err" "$T/err" | head -5; }
import json, sys
t = sys.argv[1]
c, g = (json.load(open(f"{t}/{x}.json")) for x in "cg")
assert g["n_exact_tokens"] == c["n_exact_tokens"] >= 8, (c, g)
assert g["n_cached_tokens"] == c["n_cached_tokens"] and g["n_chunks_missing"] == 0, (c, g)
assert abs(g["verify"]["kl"] - c["verify"]["kl"]) < 1e-6, (c["verify"], g["verify"])
PY
# cb-precompute --for-system: the chunks computed after that message's head (the head stored
# too), taken first by prompts with that message: the first chunk is then a true prefix, exact
# (a one-chunk prompt's reuse is full prefill); prompts without it do not find them; with both
# caches in the store, each prompt takes its own
head -n 1 "$T/c.jsonl" > "$T/c1.jsonl"
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/fs" --for-system "$SYS" -q "$T/c.jsonl" > "$T/fs.out" \
    && [ "$(n_keys "$T/fs")" -eq 3 ] \
    && run "$T/fs" reuse --system "$SYS" --chunks "$T/c.jsonl" --no-store-write > "$T/h.json" \
    && run "$T/fs" reuse --system "$SYS" --chunks "$T/c1.jsonl" --no-store-write > "$T/i.json" \
    && run "$T/fs" reuse --chunks "$T/c.jsonl" --no-store-write > "$T/j.json" \
    && python3 - "$T" <<'PY' && ok "cb-precompute --for-system: that prompt's first chunk exact (reuse of it is full prefill), other prompts miss the chunks" || { not_ok "precompute --for-system (keys $(n_keys "$T/fs"))"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
t = sys.argv[1]
c, g, h, i, j = (json.load(open(f"{t}/{x}.json")) for x in "cghij")
head = g["n_exact_tokens"]
# the records name the keys after that head: cb-run's own keys for that prompt's chunks
keys = [json.loads(l)["kv"] for l in open(f"{t}/fs.out")]
assert len(keys) == 2 and all(not json.loads(l)["cached"] for l in open(f"{t}/fs.out")), keys
assert h["n_chunks_system"] == 2 and h["n_chunks_missing"] == 0, h
assert h["n_cached_tokens"] == g["n_cached_tokens"] and h["n_exact_tokens"] > head, (g, h)
assert g["n_chunks_system"] == 0, g
assert i["n_exact_tokens"] == i["n_cached_tokens"] > head and i["verify"]["kl"] < 1e-6, i
assert j["n_chunks_missing"] == 2 and j["n_chunks_system"] == 0, j
PY
# the same chunks given by the keys cb-precompute printed (cb-run --batch): taken by a question
# with that system message, exact as above; without it, an error that says why (not that the
# file holds other tokens)
python3 - "$T/fs.out" "$SYS" > "$T/fk.jsonl" <<'PY'
import json, sys
keys = [json.loads(l)["kv"] for l in open(sys.argv[1])]
q = {"question": "Who built the bridge?", "chunks": keys, "mode": "reuse", "n_predict": 1}
print(json.dumps(dict(q, id="own", system=sys.argv[2])))
print(json.dumps(dict(q, id="none")))
PY
"$BINDIR_B/cb-run" -m "$M" --store "$T/fs" --no-store-write --temp 0 --batch "$T/fk.jsonl" > "$T/fk.out" 2> "$T/err"
rc=$?
[ $rc -eq 65 ] && python3 - "$T" <<'PY' && ok "--for-system chunks given by key: taken by a question with that system message; without it, an error naming the cause" || { not_ok "keyed --for-system chunks (exit $rc)"; sed 's/^/#   /' "$T/err" "$T/fk.out" | head -5; }
import json, sys
t = sys.argv[1]
h = json.load(open(f"{t}/h.json"))
own, none = (json.loads(l) for l in open(f"{t}/fk.out"))
assert own["id"] == "own" and none["id"] == "none", (own, none)
s = own["stats"]
assert s["n_chunks_system"] == 2 and s["n_exact_tokens"] == h["n_exact_tokens"], (h, s)
assert "computed after another prompt head" in none["error"] and "--system" in none["error"], none
PY
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/fs" -q "$T/c.jsonl" > /dev/null \
    && [ "$(n_keys "$T/fs")" -eq 5 ] \
    && run "$T/fs" reuse --system "$SYS" --chunks "$T/c.jsonl" --no-store-write > "$T/k.json" \
    && run "$T/fs" reuse --system "Another system message, not stored anywhere yet." --chunks "$T/c.jsonl" \
        --no-store-write > "$T/l.json" \
    && run "$T/fs" reuse --chunks "$T/c.jsonl" --no-store-write > "$T/m.json" \
    && python3 - "$T" <<'PY' && ok "both caches stored: a prompt with that system message takes its own, any other the lead-in's" || { not_ok "both caches"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
t = sys.argv[1]
h, k, l, m = (json.load(open(f"{t}/{x}.json")) for x in "hklm")
assert k["n_chunks_system"] == 2 and k["n_exact_tokens"] == h["n_exact_tokens"], (h, k)
assert abs(k["verify"]["kl"] - h["verify"]["kl"]) < 1e-6, (h["verify"], k["verify"])
assert l["n_chunks_system"] == 0 and l["n_chunks_missing"] == 0 and l["n_exact_tokens"] == 0, l
assert m["n_chunks_system"] == 0 and m["n_chunks_missing"] == 0, m
PY
"$BINDIR_B/cb-precompute" -m "$M" --store "$T/fs" --for-system a --for-system b "$T/c.jsonl" \
        > /dev/null 2> "$T/fs2.err"
[ $? -eq 64 ] && grep -q "once only" "$T/fs2.err" \
    && ok "--for-system twice: a usage error (exit 64)" || not_ok "--for-system twice"
chmod -R a-w "$T/ro"
if [ "$(id -u)" -eq 0 ]; then
    skip "a read-only store: the head computed, nothing stored" "running as root (permissions do not bind)"
else
    run "$T/ro" reuse --system "$SYS" --chunks "$T/c.jsonl" > "$T/r.json" && [ "$(n_keys "$T/ro")" -eq 2 ] \
        && ok "a read-only store: the head computed, nothing stored" || not_ok "read-only store"
fi
chmod -R u+w "$T/ro"

S=$(smol_model)
if [ -z "$S" ]; then
    skip "SmolLM2: cb-precompute stores the default head, cb-run loads it" "SmolLM2 not fetched (make model MODEL=smollm2)"
else
    "$BINDIR_B/cb-precompute" -m "$S" --store "$T/smol" -q "$T/c.jsonl" > /dev/null \
        && "$BINDIR_B/cb-run" -m "$S" --store "$T/smol" --chunks "$T/c.jsonl" --mode reuse --exact --verify \
            -n 1 --temp 0 --no-store-write --stats "$T/p.json" -p "Who built the bridge?" > /dev/null 2> "$T/err" \
        && python3 - "$T" "$(n_keys "$T/smol")" <<'PY' && ok "SmolLM2: cb-precompute stores the default head with the chunks; reuse then loads it as an exact prefix" || { not_ok "SmolLM2 head"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
p = json.load(open(f"{sys.argv[1]}/p.json"))
assert int(sys.argv[2]) == 3, sys.argv[2]
# the head's rows exact (the first chunk's are not: SmolLM2's lead-in is BOS alone); the
# chunks' caches then take reuse off full prefill as before
assert p["n_exact_tokens"] >= 8 and p["n_cached_tokens"] > p["n_exact_tokens"], p
PY
    # the head alone: full prefill's to the order of its sums (a batch of 24 rows against 35;
    # measured 1.1e-4 on the exact path, 1.5e-3 with 8-bit activations)
    "$BINDIR_B/cb-run" -m "$S" --store "$T/smol" --chunks /dev/null --mode reuse --exact --verify -n 1 \
            --temp 0 --no-store-write --stats "$T/h.json" -p "Who built the bridge?" > /dev/null 2> "$T/err" \
        && python3 - "$T" <<'PY' && ok "SmolLM2: the head alone reused, first-token KL to full prefill < 1e-3" || { not_ok "SmolLM2 head alone"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
h = json.load(open(f"{sys.argv[1]}/h.json"))
assert h["n_exact_tokens"] == h["n_cached_tokens"] >= 8 and h["verify"]["kl"] < 1e-3, h
print(f"# head {h['n_exact_tokens']} tokens, KL {h['verify']['kl']:.2e}")
PY
    # a store of 8-bit chunks: the head still f16 (it is loaded as exact), as close as above
    "$BINDIR_B/cb-precompute" -m "$S" --store "$T/smol8" --kv-type q8_0 -q "$T/c.jsonl" > /dev/null \
        && "$BINDIR_B/cb-run" -m "$S" --store "$T/smol8" --chunks /dev/null --mode reuse --exact --verify \
            -n 1 --temp 0 --no-store-write --stats "$T/h8.json" -p "Who built the bridge?" > /dev/null 2> "$T/err" \
        && python3 - "$T" <<'PY' && ok "SmolLM2, --kv-type q8_0: the head stored in f16, reused as closely" || { not_ok "SmolLM2 q8_0 head"; sed 's/^/#   /' "$T/err" | head -5; }
import json, sys
t = sys.argv[1]
h, h8 = (json.load(open(f"{t}/{x}.json")) for x in ("h", "h8"))
assert h8["n_exact_tokens"] == h["n_exact_tokens"] and h8["load_bytes"] == h["load_bytes"], (h, h8)
assert abs(h8["verify"]["kl"] - h["verify"]["kl"]) < 1e-6, (h["verify"], h8["verify"])
PY
fi
done_testing
