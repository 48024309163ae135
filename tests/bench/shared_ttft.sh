#!/bin/sh
# tests/bench/shared_ttft.sh - cb-run's TTFT when a host with an empty local
# store answers from chunks that only the shared tier (Redis) holds: the
# entries fetched whole into the local tier before the prefill
# ($CB_STORE_STREAM=0, as before streaming) vs streamed layer by layer
# while the prefill runs.  Each round uses a fresh host store, the two
# modes alternated back to back; medians of ROUNDS rounds.
# usage: shared_ttft.sh MODEL TEXT [CHUNKS] [TOKENS] [ROUNDS] [MODE] [KVTYPE]
#   MODE: cb-run's --mode (default blend, at its default ratio; reuse
#   recomputes nothing, so loading is most of the TTFT)
#   KVTYPE: the stored element type, cb-precompute's --kv-type (default
#   f16; the smaller types trade decoding in the loader for bytes fetched)
#   with $CB_BENCH_REDIS (redis://... or unix://...), else a redis-server
#   of its own on a unix socket.  Programs from $BINDIR_B (default bin).
set -eu
M=$1; TEXT=$2; NC=${3:-6}; TOK=${4:-512}; ROUNDS=${5:-3}; MODE=${6:-blend}; KT=${7:-f16}
B=${BINDIR_B:-bin}
tmp=$(mktemp -d); rpid=""
stop_redis() {   # and wait until it is gone, so that nothing writes into $tmp any more
    [ -n "$rpid" ] || return 0
    kill "$rpid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$rpid" 2>/dev/null || break; sleep 0.1; done
}
trap 'stop_redis; rm -rf "$tmp"' EXIT
if [ -z "${CB_BENCH_REDIS:-}" ]; then
    command -v redis-server > /dev/null 2>&1 || { echo "== no redis-server: shared-tier TTFT not measured"; exit 0; }
    redis-server --port 0 --unixsocket "$tmp/r.sock" --save "" --appendonly no --dir "$tmp" \
        --daemonize yes --pidfile "$tmp/r.pid" --logfile "$tmp/r.log" > /dev/null 2>&1
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -S "$tmp/r.sock" ] && break; sleep 0.2; done
    rpid=$(cat "$tmp/r.pid"); CB_BENCH_REDIS="unix://$tmp/r.sock"
fi
"$B/cb-chunk" -m "$M" --tokens "$TOK" "$TEXT" | head -n "$NC" > "$tmp/chunks.jsonl"
"$B/cb-store" --store "$tmp/src" init --tier "main=$tmp/src/t" --tier "bench=$CB_BENCH_REDIS" > /dev/null
"$B/cb-precompute" -m "$M" --store "$tmp/src" --kv-type "$KT" -q < "$tmp/chunks.jsonl" > /dev/null
Q="Summarize the passages above in one sentence."
: > "$tmp/whole"; : > "$tmp/stream"
r=0
while [ $r -lt "$ROUNDS" ]; do
    for mode in whole stream; do
        rm -rf "$tmp/host"
        "$B/cb-store" --store "$tmp/host" init --tier "main=$tmp/host/t" --tier "bench=$CB_BENCH_REDIS" > /dev/null
        CB_STORE_STREAM=$([ $mode = stream ] && echo 1 || echo 0) "$B/cb-run" -m "$M" --store "$tmp/host" \
            --chunks "$tmp/chunks.jsonl" --mode "$MODE" -n 1 -p "$Q" --stats "$tmp/s.json" > /dev/null 2> "$tmp/err"
        python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["n_chunks_missing"] == 0, s; print(s["ttft_ms"], s["prefill_ms"], s["load_ms"], s["stall_ms"], s["n_cached_tokens"])' \
            "$tmp/s.json" >> "$tmp/$mode"
    done
    r=$((r + 1))
done
python3 - "$tmp/whole" "$tmp/stream" "$NC" "$TOK" "$(basename "$M")" "$MODE" "$KT" <<'PY'
import statistics, sys
def med(path, i): return statistics.median(float(l.split()[i]) for l in open(path))
w, s = sys.argv[1], sys.argv[2]
n = sum(1 for _ in open(w))
print("== cb-run TTFT, %s chunks of %s tokens only in the shared tier, %s, mode %s, stored as %s (median of %d)" % (sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], n))
# TTFT - prefill: prompt assembly and opening the caches (the whole fetch, or the headers)
def pre(path): return statistics.median(float(l.split()[0]) - float(l.split()[1]) for l in open(path))
print("| %-24s | %10s | %14s | %10s | %10s | %10s |" % ("shared tier, host empty", "TTFT ms", "before prefill", "prefill ms", "load ms", "stall ms"))
print("|%s|" % "--------------------------|------------|----------------|------------|------------|------------")
for name, p in (("fetched whole, then read", w), ("streamed by layer", s)):
    print("| %-24s | %10.1f | %14.1f | %10.1f | %10.1f | %10.1f |" % (name, med(p, 0), pre(p), med(p, 1), med(p, 2), med(p, 3)))
m = sys.argv[6] if sys.argv[7] == "f16" else sys.argv[6] + "_" + sys.argv[7]
print("shared_ttft_%s_whole_ms %.1f\nshared_ttft_%s_stream_ms %.1f\nshared_ttft_%s_speedup %.2f" % (m, med(w, 0), m, med(s, 0), m, med(w, 0) / med(s, 0)))
PY
