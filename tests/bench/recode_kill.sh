#!/bin/sh
# tests/bench/recode_kill.sh - cb-store recode of a large store, killed with
# SIGKILL at random points and resumed: every entry there, of the new type,
# whole (cb-store verify), the same keys, no temporary file left; prints the
# entries converted per second of the uninterrupted rate and the kills.
# usage: recode_kill.sh MODEL [ENTRIES] [KILLS] [TYPE] [NTOK]
#   MODEL: a GGUF file (the tests' tiny fixtures do: the entries' contents
#   do not matter here, their number does); ENTRIES default 10000, KILLS 8,
#   TYPE the target type (default coded), NTOK tokens an entry (default 16).
#   Programs from $BINDIR_B (default bin), the KV maker from
#   $BUILD/tests/test_store (default build/rel).
set -eu
M=$1; N=${2:-10000}; K=${3:-8}; TYPE=${4:-coded}; NTOK=${5:-16}
B=${BINDIR_B:-bin}; GEN=${BUILD:-build/rel}/tests/test_store
[ -x "$GEN" ] || { echo "recode_kill: no $GEN (make check-tools)" >&2; exit 69; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/recode-kill.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
S="$B/cb-store --store $tmp/st"
# by_type: the store's entries per element type, "TYPE:N ..." (cb-store stat --json)
by_type() {
    $S stat --json | python3 -c '
import json, sys
print(" ".join("%s:%d" % (k["type"], k["entries"]) for k in json.load(sys.stdin)["kv"]))'
}
mkdir "$tmp/kv" && "$GEN" --make-kv "$M" "$tmp/kv" "$N" "$NTOK" > /dev/null
$S init > /dev/null
# put in batches: one command line holds a few thousand paths
find "$tmp/kv" -name '*.kv' | xargs -n 1000 $S -q put > /dev/null
rm -rf "$tmp/kv"
$S ls | cut -d' ' -f1 | sort > "$tmp/keys0"
n0=$(wc -l < "$tmp/keys0")
[ "$n0" -eq "$N" ] || { echo "recode_kill: $n0 entries put, not $N" >&2; exit 70; }
echo "== recode of $N entries ($NTOK tokens each) to $TYPE, SIGKILLed $K times at random points, then resumed"
start=$(date +%s.%N); i=0; killed=0
while [ $i -lt "$K" ]; do
    i=$((i + 1))
    delay=$(awk -v s="$$$i" 'BEGIN { srand(s); printf "%.2f", 1 + rand() * 20 }')
    $S -q recode --kv-type "$TYPE" > /dev/null 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 $pid 2>/dev/null && killed=$((killed + 1))
    wait $pid 2>/dev/null || true
    done_n=$(by_type | tr ' ' '\n' | awk -F: -v t="$TYPE" '$1 == t { n += $2 } END { print n + 0 }')
    echo "kill $i after ${delay} s: $done_n of $N entries $TYPE"
done
$S recode --kv-type "$TYPE" 2> "$tmp/err" > /dev/null
end=$(date +%s.%N)
tail -n 1 "$tmp/err"
fail=0
$S verify > "$tmp/v" 2>&1 || { echo "verify after the resume:"; head -5 "$tmp/v"; fail=1; }
$S ls | cut -d' ' -f1 | sort | cmp -s - "$tmp/keys0" || { echo "the keys changed"; fail=1; }
got=$(by_type)
[ "$got" = "$TYPE:$N" ] || { echo "entries by type: $got"; fail=1; }
left=$(find "$tmp/st" -name '*.tmp*' -type f | wc -l)
[ "$left" -eq 0 ] || { echo "$left temporary files left"; fail=1; }
awk -v n="$N" -v k="$killed" -v t0="$start" -v t1="$end" -v f="$fail" -v ty="$TYPE" 'BEGIN {
    printf "recode_kill: %d entries, %d kills, %s in %.0f s (%.1f entries/s with the kills), %s\n",
        n, k, ty, t1 - t0, n / (t1 - t0), f ? "ENTRIES LOST OR CORRUPT" : "0 lost, 0 corrupt, the same keys, no temporary file" }'
exit $fail
