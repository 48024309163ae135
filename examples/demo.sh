#!/bin/sh
# examples/demo.sh - what `make demo` runs: the default model's facts, then
# the pipeline on the example corpus (cb-chunk | cb-precompute), then
# questions that need two chunks answered with full prefill, full KV reuse
# and CacheBlend, with their times to first token.
# Everything it stores goes into its own store, $CB_DEMO_STORE (default
# ${XDG_CACHE_HOME:-~/.cache}/cacheblend/demo-store), kept so that a second
# run loads the chunks instead of computing them; the user's default store
# is never touched.  rm -rf it to start over.
set -eu
cd "$(dirname "$0")/.."
M=${CB_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
S=${CB_DEMO_STORE:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/demo-store}
NQ=${CB_DEMO_QUESTIONS:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

echo "== model: $M"
bin/cb-run --tokenize -v -m "$M" -p "" 2>&1 >/dev/null | sed 's/^cb-run: /   /'
echo
echo "== cb-chunk examples/corpus"
bin/cb-chunk -m "$M" examples/corpus > "$tmp/chunks.jsonl"
echo "   $(wc -l < "$tmp/chunks.jsonl") chunks from $(ls -R examples/corpus | grep -c '\.md$') documents"

# the chunks of the documents the first questions need
python3 - "$tmp" "$NQ" <<'PY'
import json, sys
tmp, nq = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for l in open(f"{tmp}/chunks.jsonl", encoding="utf-8")]
qs = [json.loads(l) for l in open("examples/questions.jsonl", encoding="utf-8")][:nq]
with open(f"{tmp}/needed.jsonl", "w", encoding="utf-8") as all_:
    for i, q in enumerate(qs):
        sel = [r for n in q["needs"] for r in recs if r["doc"].endswith("/" + n)]
        with open(f"{tmp}/q{i}.jsonl", "w", encoding="utf-8") as f:
            for r in sel:
                line = json.dumps(r, ensure_ascii=False) + "\n"
                f.write(line)
                all_.write(line)
        open(f"{tmp}/q{i}.txt", "w", encoding="utf-8").write(q["question"] + "\n" + " / ".join(q["answers"]))
PY
echo
echo "== cb-precompute --store $S  (chunks already stored are skipped)"
bin/cb-precompute -m "$M" --store "$S" "$tmp/needed.jsonl" > "$tmp/pre.jsonl"
echo "   $(grep -c '"cached":false' "$tmp/pre.jsonl") computed now, $(grep -c '"cached":true' "$tmp/pre.jsonl") already stored"
# A model without a chat template (Gemma-3-270M is a base model) is asked
# completion-style; an instruction-tuned one in its own chat format.
bin/cb-run -m "$M" --store "$S" -p x -n 1 --stats "$tmp/probe.json" >/dev/null
tmpl=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chat_template"])' "$tmp/probe.json")
i=0
while [ $i -lt "$NQ" ]; do
    q=$(head -n 1 "$tmp/q$i.txt"); gold=$(tail -n 1 "$tmp/q$i.txt")
    echo
    echo "== Q: $q   (gold: $gold; $(wc -l < "$tmp/q$i.jsonl") chunks from two documents)"
    if [ "$tmpl" = none ]; then prompt="Question: $q
Answer:"; else prompt="$q Answer in a few words."; fi
    for mode in full reuse blend; do
        ans=$(bin/cb-run -m "$M" --store "$S" --chunks "$tmp/q$i.jsonl" --mode $mode -n 32 --stop "
" --stats "$tmp/s.json" -p "$prompt")
        python3 - "$tmp/s.json" "$mode" "$ans" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"   {sys.argv[2]:6s} TTFT {s['ttft_ms']:7.0f} ms  ({s['n_prompt_tokens']} tokens, {s['n_cached_tokens']} cached, "
      f"{s['n_recomputed_tokens']} recomputed)  {sys.argv[3].strip()}")
PY
    done
    i=$((i + 1))
done
echo
echo "== the demo's store: $S (rm -rf it to start over)"
