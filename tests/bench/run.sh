#!/bin/sh
# tests/bench/run.sh - `make bench`: our figures and llama.cpp's, measured in
# one run on the same inputs, and their ratios.
set -eu
BUILD=${BUILD:-build/rel}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
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
echo "== bench_store: the tiered store, put/get per tier (RAM tier in ${CB_BENCH_RAM:-/dev/shm}, disk tier in ${CB_BENCH_DISK:-/var/tmp})"
"$BUILD/bench/bench_store" "$M" 512,32 16 2>&1
