#!/bin/sh
# A device fault is an error, not a crash: with $CB_BACKEND_FAIL_AT=N the
# N-th backend operation fails as a faulting GPU's would (the CPU backend,
# wrapped: no GPU needed), and every program that computes exits 69 with a
# message naming the fault, wherever it strikes: loading the weights, the
# prefill, a blend's cache loads, the decoding, precomputing, profiling.
# Past the last operation the run is the uninjected one.
. "$(dirname "$0")/lib.sh"
CHUNK=$BINDIR_B/cb-chunk PRE=$BINDIR_B/cb-precompute RUN=$BINDIR_B/cb-run PROF=$BINDIR_B/cb-profile
M=$CB_TEST_TMP/tiny-q8_0.gguf
S=$T/store

expect_exit "a fault in the first operation (a weight's upload)" 69 env CB_BACKEND_FAIL_AT=1 "$RUN" -m "$M" -p "abc" -n 4
grep -q "^cb-run: .*cpu: weight_new: injected device fault at backend operation 1" "$T/err" &&
    ok "the message names the operation and the fault" || not_ok "the message names the operation and the fault"
expect_exit "CB_BACKEND_FAIL_AT=x is a usage error" 64 env CB_BACKEND_FAIL_AT=x "$RUN" -m "$M" -p "abc" -n 4
grep -q "CB_BACKEND_FAIL_AT" "$T/err" && ok "... naming the variable" || not_ok "... naming the variable"

# sweep N over a plain run: every N ends in 0 or 69 with the message, some in
# the prefill, some while generating, and the first N past the run's last
# operation gives the uninjected answer
"$RUN" -m "$M" -p "abc" -n 6 > "$T/ref.txt" 2>/dev/null
sweep() { # label, step, max, command...: sets $first (the first N that succeeded), $n69
    label=$1 step=$2 max=$3; shift 3
    first=0 n69=0 bad=""
    i=1
    while [ "$i" -le "$max" ]; do
        CB_BACKEND_FAIL_AT=$i "$@" >"$T/o" 2>"$T/e" </dev/null; rc=$?
        if [ "$rc" -eq 69 ] && grep -q "injected device fault at backend operation" "$T/e"; then
            n69=$((n69 + 1)); cat "$T/e" >> "$T/msgs"
        elif [ "$rc" -eq 0 ]; then
            [ "$first" -gt 0 ] || first=$i
        else
            bad="$bad $i:$rc"
        fi
        [ "$first" -gt 0 ] && break
        i=$((i + step))
    done
    [ -z "$bad" ] && [ "$n69" -gt 0 ] && ok "$label: each fault exits 69 with its message ($n69 runs)" ||
        { not_ok "$label: each fault exits 69 with its message (bad N:status$bad)"; sed 's/^/#   /' "$T/e" | head -3; }
}
: > "$T/msgs"
sweep "cb-run" 2 2000 "$RUN" -m "$M" -p "abc" -n 6
[ "$first" -gt 0 ] && cmp -s "$T/o" "$T/ref.txt" && ok "past the last operation (N=$first): the uninjected answer" ||
    not_ok "past the last operation (N=$first): the uninjected answer"
grep -q "^cb-run: .*: cpu: weight_new: injected" "$T/msgs" && ok "... faults met while loading" || not_ok "... faults met while loading"
grep -q "^cb-run: blend: layer computation failed: cpu: [a-z_]*: injected" "$T/msgs" && ok "... in the prefill" || not_ok "... in the prefill"
grep -q "^cb-run: generation failed: cpu: [a-z_]*: injected" "$T/msgs" && ok "... while generating" || not_ok "... while generating"

# blend from a store: the loader thread's cache loads, the selection's top-k
mkdir -p "$T/docs"
for i in 1 2; do
    printf 'Document %s. The river Vale runs past the town of Kelby %s. Its bridge was built in 19%s0.\n' $i $i $i > "$T/docs/d$i.txt"
done
"$CHUNK" -m "$M" --tokens 24 "$T/docs" > "$T/chunks.jsonl" && "$PRE" -m "$M" --store "$S" -q < "$T/chunks.jsonl" > /dev/null &&
    ok "a store to blend from" || not_ok "a store to blend from"
: > "$T/msgs"
sweep "cb-run --mode blend" 5 3000 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -p "Who built the bridge?" -n 2
grep -q "cannot place layer [0-9]* of the caches: cpu: [a-z_]*: injected" "$T/msgs" && ok "... faults met placing the caches" ||
    not_ok "... faults met placing the caches"
printf '{"id": 0, "question": "Who built the bridge?"}\n{"id": 1, "question": "Where is Kelby?", "mode": "full"}\n' > "$T/q.jsonl"
: > "$T/msgs"
sweep "cb-run --batch" 9 3000 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -n 2 --batch "$T/q.jsonl"
CB_BACKEND_FAIL_AT=40 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -n 2 --batch "$T/q.jsonl" > "$T/b.jsonl" 2>/dev/null
grep -q '"error":".*injected device fault' "$T/b.jsonl" && ok "... each answer's record names the fault" ||
    not_ok "... each answer's record names the fault"

sweep "cb-precompute" 2 2000 "$PRE" -m "$M" --store "$T/store2" -q "$T/chunks.jsonl"
sweep "cb-profile" 11 4000 "$PROF" -m "$M" --store "$T/store3" --no-write --lengths 32 --ratios 0.5 --repeat 1

# The same wrapping table's other use: $CB_BACKEND_PROFILE=1 times every
# operation and prints a table on stderr as the backend closes; the answer
# is the unprofiled one
CB_BACKEND_PROFILE=1 "$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -p "Who built the bridge?" -n 6 \
    > "$T/p.txt" 2> "$T/p.err"; rc=$?
"$RUN" -m "$M" --store "$S" --chunks "$T/chunks.jsonl" -p "Who built the bridge?" -n 6 > "$T/p0.txt" 2>/dev/null
[ "$rc" = 0 ] && cmp -s "$T/p.txt" "$T/p0.txt" && ok "CB_BACKEND_PROFILE=1: the same answer" ||
    not_ok "CB_BACKEND_PROFILE=1: the same answer (exit $rc)"
# a table: the header, the products and attention with their calls, a total
# equal to the sum of the rows' calls
python3 - "$T/p.err" <<'PY' && ok "CB_BACKEND_PROFILE=1: each operation's calls and time on stderr" ||
import re, sys
t = open(sys.argv[1]).read()
rows = {m[1]: (int(m[2]), float(m[3])) for m in re.finditer(r"^# (\w+) +(\d+) +([\d.]+)", t, re.M)}
ok = "# backend profile (CB_BACKEND_PROFILE): cpu" in t and "all" in rows
ok = ok and rows.get("matmul", rows.get("matmul_multi", (0, 0)))[0] > 0 and rows.get("attention", (0, 0))[0] > 0
ok = ok and rows["all"][0] == sum(c for k, (c, _) in rows.items() if k != "all")
sys.exit(0 if ok else 1)
PY
    { not_ok "CB_BACKEND_PROFILE=1: each operation's calls and time on stderr"; head -c 600 "$T/p.err" | sed 's/^/#   /'; }
# with the fault injection too: the fault as before, and the profile of what ran
CB_BACKEND_PROFILE=1 CB_BACKEND_FAIL_AT=30 "$RUN" -m "$M" -p "abc" -n 4 > /dev/null 2> "$T/pf.err"; rc=$?
[ "$rc" = 69 ] && grep -q "injected device fault at backend operation 30" "$T/pf.err" &&
    grep -q "^# backend profile" "$T/pf.err" && ok "CB_BACKEND_PROFILE=1 with CB_BACKEND_FAIL_AT: both" ||
    not_ok "CB_BACKEND_PROFILE=1 with CB_BACKEND_FAIL_AT: both (exit $rc)"
done_testing
