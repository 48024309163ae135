#!/bin/sh
# cb-store stat's figures per model and KV element type (checked against the
# files' own headers and sizes), --project's arithmetic, and cb-store
# recode: f16 -> q8_0 -> f16 verified, f16 <-> f32 lossless (the same
# files byte for byte, the same cb-run --mode reuse answer and logits),
# the index's access history kept, a run killed with SIGKILL at random
# points and resumed, the shared tier refused, and the exit statuses.
. "$(dirname "$0")/lib.sh"
STORE=$BINDIR_B/cb-store PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run
GEN=${BUILD:-build/rel}/tests/test_store
TINY=$CB_TEST_TMP/tiny-f32.gguf
M=$CB_TEST_TMP/tiny-q8_0.gguf
if [ ! -x "$GEN" ]; then
    skip "cb-store recode" "no $GEN (make check-tools)"
    done_testing; exit 0
fi
need_fixture "$TINY" "cb-store recode"
need_fixture "$M" "cb-store recode"
S="$STORE --store $T/st"

# kv_check DIR [TYPE]: every file under DIR a KV file (of TYPE); prints "model type entries
# tokens bytes" per model and type, from the headers and the files' sizes
kv_check() {
    python3 - "$@" <<'PY'
import os, struct, sys
names = {0: "f32", 1: "f16", 8: "q8_0", 30: "bf16"}
groups = {}
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        if not f.endswith(".kv"):
            continue
        b = open(os.path.join(root, f), "rb").read()
        assert b[:8] == b"CBKV\r\n\x1a\n", f
        typ, ntok = struct.unpack_from("<II", b, 72)
        total = struct.unpack_from("<Q", b, 112)[0]
        assert total == len(b), (f, total, len(b))
        if len(sys.argv) > 2:
            assert names.get(typ) == sys.argv[2], (f, typ)
        g = groups.setdefault((f[:32], names.get(typ, str(typ))), [0, 0, 0])
        g[0] += 1; g[1] += ntok; g[2] += len(b)
for (m, t), (n, tok, by) in sorted(groups.items()):
    print(m, t, n, tok, by)
PY
}

# -- a store of f16 entries of two lengths (8 and 64 tokens)
mkdir -p "$T/kv8" "$T/kv64"
"$GEN" --make-kv "$TINY" "$T/kv8" 6 8 > /dev/null && "$GEN" --make-kv "$TINY" "$T/kv64" 4 64 > /dev/null \
    || { not_ok "make KV fixtures"; done_testing; exit 1; }
expect_exit "init" 0 $S init
expect_exit "put ten entries" 0 $S put "$T"/kv8/*.kv "$T"/kv64/*.kv

# -- stat: per model and type, as the files say
kv_check "$T/st/tiers" f16 > "$T/want" && [ "$(wc -l < "$T/want")" -eq 1 ] \
    && ok "the entries are f16 files" || not_ok "the entries are f16 files"
$S stat --json > "$T/stat.json" && python3 - "$T/stat.json" "$T/want" <<'PY' && ok "stat --json: entries, tokens, bytes and bytes per token as the files say" || not_ok "stat --json kv figures"
import json, sys
kv = json.load(open(sys.argv[1]))["kv"]
want = [l.split() for l in open(sys.argv[2])]
assert len(kv) == len(want), (kv, want)
for k, (m, t, n, tok, by) in zip(kv, want):
    assert (k["model"], k["type"], k["entries"], k["tokens"], k["bytes"]) == (m, t, int(n), int(tok), int(by)), (k, m, t, n, tok, by)
    assert abs(k["bytes_per_token"] - int(by) / int(tok)) < 1e-9, k
    assert "projected_bytes" not in k, k
PY
$S stat > "$T/stat.txt"
read -r km kt kn ktok kby < "$T/want"
grep -Eq "^$km +$kt +$kn +$ktok .* $(python3 -c "print('%.1f' % ($kby / $ktok))")\$" "$T/stat.txt" \
    && ok "stat: a line per model and type with bytes per token" || { not_ok "stat's table"; sed 's/^/#   /' "$T/stat.txt"; }

# -- --project N: N tokens at each measured bytes per token
for p in 10M:10000000 1.5k:1500 2G:2000000000 7:7 3T:3000000000000; do
    arg=${p%%:*} want=${p#*:}
    $S stat --json --project "$arg" > "$T/proj.json" && python3 - "$T/proj.json" "$want" <<'PY' && ok "--project $arg: $want tokens at bytes per token" || not_ok "--project $arg"
import json, sys
j = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert j["project_tokens"] == n, j["project_tokens"]
for k in j["kv"]:
    assert k["projected_bytes"] == round(n * k["bytes"] / k["tokens"]), k
PY
done
$S stat --project 10M > "$T/proj.txt" && grep -q "FOR 10M TOKENS" "$T/proj.txt" && ok "--project: its column in the table" || not_ok "--project column"
for bad in 0 -5 10X 1.5MM "" k; do
    expect_exit "--project '$bad'" 64 $S stat --project "$bad"
done
expect_exit "--project is stat's" 64 $S ls --project 1M

# -- recode: the exit statuses of the contract
expect_exit "recode without --kv-type" 64 $S recode
expect_exit "recode to an unknown type" 64 $S recode --kv-type f8
grep -q "f8" "$T/err" && ok "the unknown type is named" || not_ok "the unknown type is named"
expect_exit "recode to a type KV files do not hold" 64 $S recode --kv-type q4_0
expect_exit "recode of an unknown tier" 64 $S recode --kv-type f16 --tier nvme
expect_exit "recode of a missing store" 66 $STORE --store "$T/none" recode --kv-type f16
expect_exit "recode takes no argument" 64 $S recode --kv-type f16 extra
expect_exit "--kv-type is recode's" 64 $S ls --kv-type f16

# -- f16 -> q8_0 -> f16, with the access history kept
K0=$($S ls | head -n 1 | cut -c1-65)
$S get "$K0" > /dev/null && $S get "$K0" > /dev/null && $S pin "$K0"
$S ls --json | python3 -c '
import json, sys
for r in map(json.loads, sys.stdin):
    print(r["key"], r["tier"], r["hits"], r["last_access"], r["created"], r["pinned"], r["n_tokens"])' | sort > "$T/hist0"
expect_exit "recode --kv-type q8_0" 0 $S recode --kv-type q8_0
grep -q "10 rewritten as q8_0" "$T/err" && ok "a summary on stderr" || { not_ok "the summary"; sed 's/^/#   /' "$T/err"; }
kv_check "$T/st/tiers" q8_0 > "$T/got" && ok "every entry is q8_0" || not_ok "every entry is q8_0"
expect_exit "verify after recode" 0 $S verify
$S stat --json | python3 -c '
import json, sys
kv = json.load(sys.stdin)["kv"]
assert [k["type"] for k in kv] == ["q8_0"] and kv[0]["entries"] == 10, kv' && ok "stat: ten q8_0 entries" || not_ok "stat after recode"
$S ls --json | python3 -c '
import json, sys
for r in map(json.loads, sys.stdin):
    print(r["key"], r["tier"], r["hits"], r["last_access"], r["created"], r["pinned"], r["n_tokens"])' | sort > "$T/hist1"
cmp -s "$T/hist0" "$T/hist1" && ok "keys, tiers, hits, last use, pins kept" || { not_ok "history kept"; diff "$T/hist0" "$T/hist1" | head -5 | sed 's/^/#   /'; }
expect_exit "recode again: nothing to do" 0 $S recode --kv-type q8_0
grep -q "0 rewritten as q8_0.*10 already q8_0" "$T/err" && ok "entries of the type are skipped" || not_ok "skipped entries"
expect_exit "recode --kv-type f16 --tier main" 0 $S recode --kv-type f16 --tier main
kv_check "$T/st/tiers" f16 > /dev/null && ok "every entry is f16 again" || not_ok "f16 again"
expect_exit "verify after q8_0 -> f16" 0 $S verify

# -- lossless: f16 -> f32 -> f16 gives the same files; cb-run answers alike
mkdir -p "$T/docs"
vale_chunks "$M" "$T/chunks.jsonl" || not_ok "cb-chunk"
"$PRE" -m "$M" --store "$T/sp" -q < "$T/chunks.jsonl" > /dev/null || not_ok "cb-precompute"
SP="$STORE --store $T/sp"
mkdir -p "$T/orig" && cp "$T"/sp/tiers/main/*.kv "$T/orig/"
answer() { "$RUN" -m "$M" --store "$T/sp" --chunks "$T/chunks.jsonl" --mode reuse -n 8 -p "$Q" \
    --no-store-write --logits-out "$T/logits-$1" > "$T/ans-$1" 2> "$T/run-err-$1"; }
answer f16 || not_ok "cb-run --mode reuse (f16)"
expect_exit "recode the precomputed store to f32" 0 $SP recode --kv-type f32
kv_check "$T/sp/tiers" f32 > /dev/null && ok "its entries are f32" || not_ok "its entries are f32"
answer f32 || not_ok "cb-run --mode reuse (f32)"
[ -s "$T/ans-f16" ] && cmp -s "$T/ans-f16" "$T/ans-f32" && cmp -s "$T/logits-f16" "$T/logits-f32" \
    && ok "f32 entries of an f16 origin: the same answer and logits" || not_ok "f32 answer differs"
expect_exit "recode back to f16" 0 $SP recode --kv-type f16
same=1; for f in "$T"/orig/*.kv; do cmp -s "$f" "$T/sp/tiers/main/$(basename "$f")" || same=0; done
[ $same -eq 1 ] && ok "f16 -> f32 -> f16: every file as it was, byte for byte" || not_ok "f16 round trip changed files"
answer f16b || not_ok "cb-run --mode reuse (f16 again)"
cmp -s "$T/ans-f16" "$T/ans-f16b" && cmp -s "$T/logits-f16" "$T/logits-f16b" \
    && ok "the same answer after the round trip" || not_ok "answer after the round trip"
expect_exit "verify after the round trip" 0 $SP verify
expect_exit "recode bf16" 0 $SP recode --kv-type bf16
answer bf16 && [ -s "$T/ans-bf16" ] && ok "cb-run answers from bf16 entries" || not_ok "cb-run on bf16 entries"
expect_exit "verify after bf16" 0 $SP verify

# -- killed with SIGKILL at random points, then resumed
mkdir -p "$T/kvk"
"$GEN" --make-kv "$TINY" "$T/kvk" 200 8 > /dev/null || not_ok "make 200 KV files"
SK="$STORE --store $T/sk"
$SK init > /dev/null 2>&1 && $SK put "$T"/kvk/*.kv > /dev/null || not_ok "put 200 entries"
$SK ls | cut -c1-65 | sort > "$T/keys0"
i=0 killed=0
while [ $i -lt 6 ]; do
    i=$((i + 1))
    delay=$(awk -v s="$$$i" 'BEGIN { srand(s); printf "%.2f", 0.05 + rand() * 0.8 }')
    $SK -q recode --kv-type q8_0 > /dev/null 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 $pid 2>/dev/null && killed=$((killed + 1))
    wait $pid 2>/dev/null
    # whatever the point: no entry lost or corrupt (only the killed run's leftovers)
    $SK verify > "$T/v$i" 2>&1
    left=$(grep -c -e "a temporary file of a process that is gone" -e "an interrupted recode" "$T/v$i")
    if grep -v -e "a temporary file of a process that is gone" -e "an interrupted recode" -e "^cb-store: verify: " "$T/v$i" | grep -q .; then
        not_ok "killed run $i: verify finds only its leftovers"; sed 's/^/#   /' "$T/v$i" | head -5
    else
        ok "killed run $i: verify finds only its leftovers ($left)"
    fi
    kv_check "$T/sk/tiers" > /dev/null || not_ok "killed run $i: a file that is not a whole KV file"
    # what a killed run left, settled by gc (round 2) or verify --repair (round 4)
    if [ $i -eq 2 ] || [ $i -eq 4 ]; then
        if [ $i -eq 2 ]; then $SK gc > /dev/null 2>&1; how=gc; else $SK verify --repair > /dev/null 2>&1; how="verify --repair"; fi
        $SK verify > "$T/v$i.after" 2>&1 && kv_check "$T/sk/tiers" > /dev/null \
            && ok "killed run $i: $how settles its $left leftovers" \
            || { not_ok "killed run $i: $how settles its leftovers"; sed 's/^/#   /' "$T/v$i.after" | head -5; }
    fi
done
[ $killed -ge 1 ] && ok "recode was killed $killed times" || skip "recode killed" "it finished before every kill"
pre=$(kv_check "$T/sk/tiers" | awk '$2 == "q8_0" { print $3 }')
expect_exit "the rerun finishes it" 0 $SK recode --kv-type q8_0
if [ -n "$pre" ]; then
    grep -q " $pre already q8_0" "$T/err" && ok "the rerun skips the $pre entries the killed runs rewrote" \
        || { not_ok "the rerun resumes ($pre q8_0 before it)"; sed 's/^/#   /' "$T/err"; }
else
    skip "the rerun resumes" "the killed runs rewrote no entry before their kill"
fi
expect_exit "verify: no entry lost or corrupt" 0 $SK verify
kv_check "$T/sk/tiers" q8_0 > "$T/kgot" && [ "$(cut -d' ' -f3 "$T/kgot")" = 200 ] \
    && ok "all 200 entries are q8_0" || { not_ok "all entries q8_0"; cat "$T/kgot"; }
$SK ls | cut -c1-65 | sort | cmp -s - "$T/keys0" && ok "the same 200 keys" || not_ok "keys changed"
[ -z "$(find "$T/sk" -name '*.tmp*' -type f)" ] && ok "no temporary file left" || not_ok "temporary files left"
$SK stat --json | python3 -c '
import json, sys
t = json.load(sys.stdin)["tiers"][0]
print(t["entries"], t["bytes"])' > "$T/tier"
[ "$(cat "$T/tier")" = "200 $(cat "$T"/sk/tiers/main/*.kv | wc -c | tr -d ' ')" ] \
    && ok "the index's bytes are the files'" || not_ok "index bytes ($(cat "$T/tier"))"

# -- SIGINT: stops after the entry in hand, 130, and a rerun goes on
$SK -q recode --kv-type f32 > /dev/null 2> "$T/int-err" &
pid=$!
sleep 0.5; kill -INT $pid; wait $pid; rc=$?
if [ $rc -eq 0 ]; then
    skip "SIGINT: exit 130" "it finished before the signal"
else
    [ $rc -eq 130 ] && ok "SIGINT: exit 130" || not_ok "SIGINT: exit $rc"
fi
expect_exit "verify after SIGINT" 0 $SK verify
expect_exit "the rerun after SIGINT" 0 $SK recode --kv-type f32

# -- an entry that grows takes only room its tier has: nothing is moved or evicted
mkdir -p "$T/kvc"
"$GEN" --make-kv "$TINY" "$T/kvc" 4 64 > /dev/null || not_ok "make KV files"
SC="$STORE --store $T/sc"
$SC init --tier small="$T/small:$(($(cat "$T"/kvc/*.kv | wc -c) + 4096))" > /dev/null 2>&1 && $SC put "$T"/kvc/*.kv > /dev/null \
    || not_ok "a store with a small tier"
expect_exit "recode to f32 in a full tier: left, 73" 73 $SC recode --kv-type f32
grep -q "4 without room" "$T/err" && grep -q "has no room" "$T/err" && ok "the entries without room are named" \
    || { not_ok "entries without room"; sed 's/^/#   /' "$T/err" | head -5; }
[ "$($SC ls | wc -l)" -eq 4 ] && kv_check "$T/small" f16 > /dev/null && ok "nothing evicted, every entry still f16" \
    || not_ok "entries after a recode without room"
expect_exit "verify after a recode without room" 0 $SC verify
expect_exit "recode to q8_0 (no larger) in the full tier" 0 $SC recode --kv-type q8_0

# -- a read-only store is not recoded
if [ "$(id -u)" -ne 0 ]; then
    chmod -R a-w "$T/st"
    expect_exit "recode of a read-only store" 73 $S recode --kv-type q8_0
    chmod -R u+w "$T/st"
else
    skip "recode of a read-only store" "root writes everywhere"
fi

# -- the shared tier is not recoded
RS=$(command -v redis-server); RC=$(command -v redis-cli)
if [ -n "$RS" ] && [ -n "$RC" ]; then
    redis_start
    SR="$STORE --store $T/sr"
    if $SR init --tier disk="$T/srdisk" --tier shared="unix://$SOCK" > /dev/null 2>&1; then
        $SR put "$T"/kv8/*.kv > /dev/null 2>&1
        expect_exit "recode --tier of the shared tier is refused" 64 $SR recode --kv-type q8_0 --tier shared
        grep -q "shared tier" "$T/err" && ok "the refusal says why" || not_ok "the refusal says why"
        expect_exit "recode of the local tiers beside a shared one" 0 $SR recode --kv-type q8_0
        grep -q "shared tier shared is left as it is" "$T/err" && ok "it says the shared tier is left" \
            || not_ok "the shared tier note"
        kv_check "$T/srdisk" q8_0 > /dev/null && ok "the local tier is q8_0" || not_ok "the local tier is q8_0"
    else
        skip "recode beside a shared tier" "init with redis-server on $SOCK failed"
    fi
    redis_stop
else
    skip "recode beside a shared tier" "no redis-server (make deps)"
fi

# -- help and man page
$STORE --help | grep -q "recode --kv-type T" && ok "--help lists recode" || not_ok "--help lists recode"
$STORE --help | grep -q "stat \[--json\] \[--project N\]" && ok "--help lists stat --project" || not_ok "--help stat --project"
done_testing
