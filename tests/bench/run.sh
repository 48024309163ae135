#!/bin/sh
# tests/bench/run.sh - `make bench`: our figures and llama.cpp's, measured in
# one run on the same inputs, and their ratios.
set -eu
BUILD=${BUILD:-build/rel}
BINDIR_B=${BINDIR_B:-bin}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
# bench programs live in $BUILD/bench: point them at the CUDA module when built
[ -f lib/libcbcore-cuda.so ] && { CB_CUDA_MODULE=$top/lib/libcbcore-cuda.so; export CB_CUDA_MODULE; }
M=${CB_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# A 1 MB text: the MuSiQue passages when ../shared is there, else repeated prose.
if [ -f ../shared/data/musique_s.json ]; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.stdout.write("\n\n".join(c["title"]+"\n"+c["text"] for q in d for c in q["ctxs"])[:1000000])' \
        ../shared/data/musique_s.json > "$tmp/text.txt"
else
    i=0; : > "$tmp/text.txt"
    while [ $i -lt 4000 ]; do
        printf 'The quick brown fox (no. %d) jumps over the lazy dog; café, naïve, 東京, 🦙.\n' $i >> "$tmp/text.txt"; i=$((i + 1))
    done
fi
echo "== bench_core (ours) on $(basename "$M"), $(wc -c < "$tmp/text.txt") bytes of text"
"$BUILD/bench/bench_core" "$M" "$tmp/text.txt" | tee "$tmp/ours"
VENV=$(sh scripts/venv.sh)
echo "== llama.cpp (llama-cpp-python $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)'))"
"$VENV/bin/python" tests/bench/llamacpp_tok.py "$M" "$tmp/text.txt" | tee "$tmp/theirs"
get() { awk -v k="$2" '$1 == k {print $2}' "$1"; }
echo "== ratios (ours / llama.cpp)"
[ "$(get "$tmp/ours" tok_tokens)" = "$(get "$tmp/theirs" tok_tokens)" ] && echo "token count identical: $(get "$tmp/ours" tok_tokens)" \
    || echo "token count DIFFERS: ours $(get "$tmp/ours" tok_tokens), llama.cpp $(get "$tmp/theirs" tok_tokens)"
awk -v a="$(get "$tmp/ours" tok_mb_s)" -v b="$(get "$tmp/theirs" tok_mb_s)" 'BEGIN { printf "tokenize throughput: %.2f MB/s vs %.2f MB/s = %.2fx\n", a, b, a / b }'
awk -v a="$(get "$tmp/ours" open_vocab_ms)" -v b="$(get "$tmp/theirs" open_vocab_ms)" 'BEGIN { printf "open + vocab load:   %.1f ms vs %.1f ms = %.2fx faster\n", a, b, b / a }'
# The engine: prefill at 512..4096 tokens and decode, ours and llama.cpp's,
# same GGUF, same threads, same ids, in this run.
T=${CB_BENCH_THREADS:-$(nproc)}
LENS=${CB_BENCH_LENGTHS:-512 1024 2048 4096}
echo "== bench_engine (ours), $T threads"
"$BUILD/bench/bench_engine" "$M" "$T" $LENS | tee "$tmp/eng_ours"
echo "== llama.cpp, $T threads"
"$VENV/bin/python" tests/bench/llamacpp_engine.py "$M" "$T" $LENS | tee "$tmp/eng_theirs"
echo "== prefill and decode, ours vs llama.cpp"
printf '| %-10s | %12s | %12s | %7s | %9s |\n' "tokens" "ours tok/s" "llama tok/s" "ratio" "our GFLOP/s"
printf '|%s|\n' "------------|--------------|--------------|---------|-----------"
for L in $LENS; do
    a=$(get "$tmp/eng_ours" "prefill_${L}_tok_s"); b=$(get "$tmp/eng_theirs" "prefill_${L}_tok_s"); g=$(get "$tmp/eng_ours" "prefill_${L}_gflops")
    awk -v L="$L" -v a="$a" -v b="$b" -v g="$g" 'BEGIN { printf "| prefill %-4s | %12.1f | %12.1f | %6.2fx | %9.1f |\n", L, a, b, a / b, g }'
done
a=$(get "$tmp/eng_ours" decode_tok_s); b=$(get "$tmp/eng_theirs" decode_tok_s)
awk -v a="$a" -v b="$b" 'BEGIN { printf "| decode       | %12.1f | %12.1f | %6.2fx |           |\n", a, b, a / b }'
echo "machine sgemm (OpenBLAS, 1024^3, $T threads): $(get "$tmp/eng_ours" sgemm_gflops) GFLOP/s"
# The same engine on the GPU, when this machine has one and the CUDA module runs.
if "$BINDIR_B/cb-run" -m "$M" --device cuda -p x -n 1 >/dev/null 2>"$tmp/cuda.err"; then
    echo "== bench_engine (ours) on CUDA"
    CB_BENCH_DEVICE=cuda "$BUILD/bench/bench_engine" "$M" "$T" $LENS | tee "$tmp/eng_cuda"
    printf '| %-10s | %12s | %12s | %7s |\n' "tokens" "cuda tok/s" "cpu tok/s" "ratio"
    for L in $LENS; do
        a=$(get "$tmp/eng_cuda" "prefill_${L}_tok_s"); b=$(get "$tmp/eng_ours" "prefill_${L}_tok_s")
        awk -v L="$L" -v a="$a" -v b="$b" 'BEGIN { printf "| prefill %-4s | %12.1f | %12.1f | %6.2fx |\n", L, a, b, a / b }'
    done
    a=$(get "$tmp/eng_cuda" decode_tok_s); b=$(get "$tmp/eng_ours" decode_tok_s)
    awk -v a="$a" -v b="$b" 'BEGIN { printf "| decode       | %12.1f | %12.1f | %6.2fx |\n", a, b, a / b }'
else
    echo "== no CUDA run: $(head -c 200 "$tmp/cuda.err")"
fi
# A model with sliding-window layers (Gemma 3): what the window changes for blending.
if "$BUILD/bench/bench_swa" "$M" "$tmp/text.txt" 1024 "$T" > "$tmp/swa" 2> "$tmp/swa.err"; then
    echo "== bench_swa: sliding windows and blending"; cat "$tmp/swa"
fi
echo "== bench_store: the tiered store, put/get per tier (RAM tier in ${CB_BENCH_RAM:-/dev/shm}, disk tier in ${CB_BENCH_DISK:-/var/tmp})"
# The shared tier on a Redis server of our own, on a unix socket in $tmp.
rpid=""
if [ -z "${CB_BENCH_REDIS:-}" ] && command -v redis-server > /dev/null 2>&1; then
    redis-server --port 0 --unixsocket "$tmp/redis.sock" --save "" --appendonly no --dir "$tmp" \
        --daemonize yes --pidfile "$tmp/redis.pid" --logfile "$tmp/redis.log" > /dev/null 2>&1
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -S "$tmp/redis.sock" ] && break; sleep 0.2; done
    if [ -S "$tmp/redis.sock" ]; then CB_BENCH_REDIS="unix://$tmp/redis.sock"; export CB_BENCH_REDIS; rpid=$(cat "$tmp/redis.pid"); fi
fi
[ -n "${CB_BENCH_REDIS:-}" ] && echo "== the shared tier: $CB_BENCH_REDIS" || echo "== no redis-server: the shared tier is not measured"
"$BUILD/bench/bench_store" "$M" 512,32 16 2>&1
if [ -n "$rpid" ]; then kill "$rpid" 2>/dev/null; fi
