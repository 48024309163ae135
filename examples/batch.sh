#!/bin/sh
# examples/batch.sh - a nightly-report style pipeline on the example corpus:
#   1. chunk the corpus (cb-chunk);
#   2. retrieve: for each question, the chunks that share the most rare
#      words with it (a small TF-IDF retriever in Python, standing in for
#      the user's own);
#   3. precompute the retrieved chunks into the store (cb-precompute: the
#      ones already stored are skipped, as a cron job would);
#   4. answer every question in one process (cb-run --batch: the model and
#      store opened once, the answers decoded together), the chunks given by
#      their store keys;
#   5. print each answer beside the gold one.
# Environment: CB_MODEL (default: the default model), CB_EXAMPLE_DIR (where
# the files and the store go; default a temporary directory, removed at the
# end), CB_EXAMPLE_QUESTIONS (how many of examples/questions.jsonl; 8),
# CB_EXAMPLE_TOP (chunks per question; 4).
set -eu
cd "$(dirname "$0")/.."
M=${CB_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf}
NQ=${CB_EXAMPLE_QUESTIONS:-8}
TOP=${CB_EXAMPLE_TOP:-4}
if [ -n "${CB_EXAMPLE_DIR:-}" ]; then
    D=$CB_EXAMPLE_DIR; mkdir -p "$D"
else
    D=$(mktemp -d); trap 'rm -rf "$D"' EXIT
fi

echo "== 1. cb-chunk examples/corpus (128-token chunks)"
bin/cb-chunk -m "$M" --tokens 128 examples/corpus > "$D/chunks.jsonl"
echo "   $(wc -l < "$D/chunks.jsonl") chunks"

echo "== 2. retrieve the $TOP best chunks for each of $NQ questions"
python3 - "$D" "$NQ" "$TOP" <<'PY'
import json, math, re, sys
from collections import Counter
d, nq, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = lambda s: re.findall(r"\w+", s.lower())
chunks = [json.loads(l) for l in open(f"{d}/chunks.jsonl", encoding="utf-8")]
df = Counter(w for c in chunks for w in set(words(c["text"])))
idf = {w: math.log(len(chunks) / n) for w, n in df.items()}
questions = [json.loads(l) for l in open("examples/questions.jsonl", encoding="utf-8")][:nq]
picked = {}
with open(f"{d}/retrieved.jsonl", "w", encoding="utf-8") as f:
    for i, q in enumerate(questions):
        qw = set(words(q["question"]))
        score = lambda c: sum(idf.get(w, 0) for w in qw & set(words(c["text"])))
        best = sorted(range(len(chunks)), key=lambda j: -score(chunks[j]))[:top]
        for j in best:
            picked[chunks[j]["id"]] = chunks[j]
        f.write(json.dumps({"id": i, "question": q["question"] + " Answer in a few words.",
                            "answers": q["answers"], "chunk_ids": [chunks[j]["id"] for j in best]}) + "\n")
with open(f"{d}/picked.jsonl", "w", encoding="utf-8") as f:
    for c in picked.values():
        f.write(json.dumps(c, ensure_ascii=False) + "\n")
print(f"   {len(picked)} distinct chunks for {len(questions)} questions")
PY

echo "== 3. cb-precompute the retrieved chunks into $D/store"
bin/cb-precompute -q -m "$M" --store "$D/store" "$D/picked.jsonl" > "$D/cached.jsonl"
echo "   $(grep -c '"cached":false' "$D/cached.jsonl") computed now, $(grep -c '"cached":true' "$D/cached.jsonl") already stored"

echo "== 4. cb-run --batch: every question in one process"
python3 - "$D" <<'PY'
import json, sys
d = sys.argv[1]
key = {}
for l in open(f"{d}/cached.jsonl", encoding="utf-8"):
    r = json.loads(l)
    key[r["id"]] = r["kv"]
with open(f"{d}/questions.jsonl", "w", encoding="utf-8") as f:
    for l in open(f"{d}/retrieved.jsonl", encoding="utf-8"):
        q = json.loads(l)
        q["chunks"] = [key[c] for c in q.pop("chunk_ids")]  # the chunks by their store keys
        f.write(json.dumps(q) + "\n")
PY
start=$(date +%s.%N)
bin/cb-run -m "$M" --store "$D/store" -n 32 --stop "
" --batch "$D/questions.jsonl" > "$D/answers.jsonl"
end=$(date +%s.%N)

echo "== 5. the answers"
python3 - "$D/answers.jsonl" "$start" "$end" <<'PY'
import json, sys
out = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
hit = 0
for o in out:
    ok = any(a.lower() in o.get("answer", "").lower() for a in o["answers"])
    hit += ok
    print(f"   [{'x' if ok else ' '}] {o['id']}: {o.get('answer', o.get('error', '')).strip()[:70]!r}  (gold: {o['answers'][0]})")
tokens = sum(o["stats"]["n_gen_tokens"] for o in out if "stats" in o)
s = float(sys.argv[3]) - float(sys.argv[2])
print(f"   {len(out)} questions answered in {s:.1f} s ({len(out) / s:.2f} questions/s, {tokens / s:.1f} tokens/s); "
      f"{hit} contain the gold answer")
PY
