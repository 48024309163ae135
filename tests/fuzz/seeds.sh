#!/bin/sh
# tests/fuzz/seeds.sh OUT BINDIR GEN - make the fuzzers' fixtures and seed
# corpora from our own fixtures and programs (nothing binary is committed):
#   OUT/data/vocab-bpe.gguf   the byte-level BPE vocabulary of cb-gen-fixture
#   OUT/data/model.gguf       a tiny llama model (1 layer, 8 wide)
#   OUT/seeds/<harness>/      starting inputs, one file each
# BINDIR holds cb-chunk, cb-precompute, cb-store, cb-profile; GEN is
# cb-gen-fixture.  Harness inputs that start with a flag byte (see each
# fuzz_*.c) get it here.
set -e
out=$1 bin=$2 gen=$3
[ -n "$out" ] && [ -x "$bin/cb-store" ] && [ -x "$gen" ] || { echo "usage: seeds.sh OUT BINDIR GEN" >&2; exit 64; }
top=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$out" && cd "$out" && pwd)
case $bin in /*) ;; *) bin=$top/$bin ;; esac
case $gen in /*) ;; *) gen=$top/$gen ;; esac
rm -rf "$out/data" "$out/seeds" "$out/work"
mkdir -p "$out/data" "$out/work"
w=$out/work
S=$out/seeds
for h in gguf model kvfile tok_bpe tok_spm records profile store_conf import chunk_input; do mkdir -p "$S/$h"; done
# flag byte + file
flag() { printf "\\$(printf '%03o' "$1")" | cat - "$2" > "$3"; }

# --- models and vocabularies
small="--layers 1 --embd 8 --ff 16 --heads 2 --kv-heads 1 --merges 40 --ctx 64"
"$gen" --vocab-only --merges 200 "$out/data/vocab-bpe.gguf"
"$gen" $small "$out/data/model.gguf"
"$gen" --vocab-only --merges 20 "$S/gguf/vocab.gguf"
"$gen" $small "$S/gguf/llama-f32.gguf"
"$gen" --layers 1 --embd 32 --ff 32 --heads 2 --kv-heads 1 --merges 10 --ctx 64 --type q8_0 "$S/gguf/llama-q8_0.gguf"
"$gen" --layers 1 --embd 32 --ff 32 --heads 2 --kv-heads 2 --merges 10 --ctx 64 --type q4_1 --arch qwen2 "$S/gguf/qwen2-q4_1.gguf"
"$gen" --layers 1 --embd 8 --ff 16 --heads 2 --kv-heads 1 --merges 10 --ctx 64 --type f16 "$S/gguf/llama-f16.gguf"
cp "$S/gguf/"*.gguf "$S/model/"

# --- KV files: the tiny model precomputes two chunks into a store
st=$w/store
"$bin/cb-store" --store "$st" -q init
printf '%s\n' '{"text":"The capital of France is Paris."}' '{"text":"A cache keeps the keys."}' \
    | "$bin/cb-precompute" -q -t 1 --device cpu -m "$out/data/model.gguf" --store "$st" > "$w/pre.jsonl"
for t in f32 bf16 coded; do
    echo "{\"text\":\"Stored as $t.\"}" \
        | "$bin/cb-precompute" -q -t 1 --device cpu -m "$out/data/model.gguf" --store "$st" --kv-type $t > /dev/null
done
i=0
for k in $("$bin/cb-store" --store "$st" ls --json | python3 -c 'import json,sys; [print(json.loads(l)["key"]) for l in sys.stdin if l.strip()]' 2>/dev/null \
          || "$bin/cb-store" --store "$st" ls | awk 'NR>1{print $1}'); do
    i=$((i + 1))
    "$bin/cb-store" --store "$st" get "$k" -o "$w/$i.kv"
    flag 0 "$w/$i.kv" "$S/kvfile/raw-$i"
    flag 1 "$w/$i.kv" "$S/kvfile/fix-$i"
done
[ "$i" -gt 0 ] || { echo "seeds.sh: no KV file was made" >&2; exit 70; }

# --- archives for cb-store import
"$bin/cb-store" --store "$st" -q export "$S/import/all.tar"
"$bin/cb-store" --store "$st" -q export "$S/import/all.tar.gz"
"$bin/cb-store" --store "$st" -q export "$S/import/all.tar.xz"
"$bin/cb-store" --store "$st" -q export "$S/import/all.tar.zst"
python3 - "$w" "$S/import" <<'PY'
import glob, io, os, sys, tarfile, zipfile
w, dst = sys.argv[1], sys.argv[2]
kvs = sorted(glob.glob(os.path.join(w, "*.kv")))
with zipfile.ZipFile(os.path.join(dst, "plain.zip"), "w", zipfile.ZIP_DEFLATED) as z:
    for p in kvs:
        z.write(p, os.path.basename(p))
# members an import must refuse: a link, '..', a directory, a wrong name
with tarfile.open(os.path.join(dst, "hostile.tar"), "w", format=tarfile.GNU_FORMAT) as t:
    d = open(kvs[0], "rb").read()
    for name in ["../evil.kv", "dir/ok.kv", "0" * 65 + ".kv"]:
        ti = tarfile.TarInfo(name); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
    ti = tarfile.TarInfo("link.kv"); ti.type = tarfile.SYMTYPE; ti.linkname = "/etc/passwd"; t.addfile(ti)
    ti = tarfile.TarInfo("sub"); ti.type = tarfile.DIRTYPE; t.addfile(ti)
PY

# --- store configurations (tier paths made relative to the store, so the
# harness's sandbox, which skips absolute paths, keeps them)
i=0
for spec in "" "--tier fast=@/ram:1M --tier slow=@/disk" "--tier a=@/t/a:4K --tier b=@/t/b:1G --tier c=@/t/c --cost a=3 --promote 0"; do
    i=$((i + 1))
    rm -rf "$w/conf"
    # shellcheck disable=SC2086
    "$bin/cb-store" --store "$w/conf" -q init $(echo "$spec" | sed "s|@|$w/conf|g")
    sed "s|$w/conf/||" "$w/conf/store.json" > "$S/store_conf/conf-$i.json"
done
# a shared tier's section, as cb-store init writes it with a redis:// or
# unix:// tier (init itself needs a server; the harness never connects)
python3 - "$S/store_conf" <<'PY'
import json, sys
d = sys.argv[1]
c = json.load(open(d + "/conf-2.json"))
for i, url in enumerate(["redis://127.0.0.1:6379/2", "unix:///run/redis.sock"]):
    c["shared"] = {"name": "team", "url": url, "id": "0123456789abcdef" * 2, "capacity": 1 << 30, "timeout_ms": 500}
    json.dump(c, open("%s/conf-shared-%d.json" % (d, i), "w"), indent=2)
PY

# --- profile JSON (a real measurement of the tiny model, kept short)
if "$bin/cb-profile" -q -t 1 --device cpu -m "$out/data/model.gguf" --store "$st" --lengths 16,32 \
        --ratios 0.1,0.5 --repeat 1 -o json > "$S/profile/measured.json" 2>"$w/profile.err"; then :; else
    echo "seeds.sh: cb-profile failed: $(cat "$w/profile.err")" >&2; exit 70
fi
cp "$st"/profile-*.json "$S/profile/" 2>/dev/null || true

# --- texts: tokenizer, chunker and records
texts="$w/texts"; mkdir -p "$texts"
cp "$top/README.md" "$texts/readme.md"
sed -n 1,40p "$top/tests/gen/cb-gen-fixture.c" > "$texts/code.c"
printf 'Hello world! <|im_start|>user\nWhat is   the cache?<|im_end|>\n' > "$texts/chat.txt"
printf 'caf\303\251 na\303\257ve \346\227\245\346\234\254\350\252\236 \360\237\230\200 \342\226\201x  \t\r\n' > "$texts/unicode.txt"
printf 'bad \377\376 utf8 \300\200 \355\240\200 end' > "$texts/invalid.txt"
printf "It's 3.14, isn't it? Yes ! 'quoted' 1234567 don't\n\n\n" > "$texts/punct.txt"
for f in "$texts"/*; do
    b=$(basename "$f")
    for fl in 0 1 2 3 4 8 12; do flag $fl "$f" "$S/tok_bpe/$fl-$b"; flag $fl "$f" "$S/tok_spm/$fl-$b"; done
done
# cb-chunk inputs: documents, archives of them, a compressed document
for fl in 0 1 2 5; do
    for f in "$texts"/*; do flag $fl "$f" "$S/chunk_input/$fl-$(basename "$f")"; done
done
( cd "$texts" && tar cf "$w/docs.tar" readme.md chat.txt unicode.txt && gzip -9 -n -c punct.txt > "$w/punct.txt.gz" )
python3 - "$texts" "$w/docs.zip" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as z:
    for n in ["chat.txt", "unicode.txt", "invalid.txt"]:
        z.write(os.path.join(sys.argv[1], n), "docs/" + n)
PY
( cd "$w" && tar czf docs-nested.tar.gz docs.zip punct.txt.gz )
for a in docs.tar punct.txt.gz docs.zip docs-nested.tar.gz; do
    flag 0 "$w/$a" "$S/chunk_input/0-$a"; flag 3 "$w/$a" "$S/chunk_input/3-$a"
done
# chunk records: cb-chunk's output and cb-precompute's, for each reader
"$bin/cb-chunk" -q --chars 200 "$texts/readme.md" "$texts/chat.txt" | head -20 > "$w/chunks.jsonl"
"$bin/cb-chunk" -q --chars 60 "$texts/unicode.txt" "$texts/punct.txt" >> "$w/chunks.jsonl"
for f in chunks.jsonl pre.jsonl; do
    flag 0 "$w/$f" "$S/records/pre-$f"; flag 1 "$w/$f" "$S/records/run-$f"
done
printf '{"text":"a","kv":"x"}\n  \n{"text":"b"}  \r\n{"doc":{"x":[1,2]},"text":"\\u00e9\\n"}\n' > "$w/edge.jsonl"
flag 0 "$w/edge.jsonl" "$S/records/pre-edge"; flag 1 "$w/edge.jsonl" "$S/records/run-edge"
# cb-run --batch question lines: every field, records, keys, bad values
cat > "$w/batch.jsonl" <<'EOF'
{"id": 1, "question": "Who built the bridge?", "gold": ["x"], "n_predict": 9, "stop": ["\n", "."]}
{"id": "b", "prompt": "Where?", "chunks": [{"text": "The river Vale.", "kv": "k"}, {"kv": "0123456789abcdef0123456789abcdef-0123456789abcdef0123456789abcdef"}], "mode": "reuse"}

{"question": "q", "chunks": ["0123456789abcdef0123456789abcdef-0123456789abcdef0123456789abcdef"], "strategy": "hkvd", "ratio": 0.5}
{"question": "q", "system": null, "score": "Paris.", "ratio": "auto", "chunks": null}
{"question": "q", "system": "Be brief.", "mode": "warp", "ratio": 2, "n_predict": -1, "stop": ""}
[1, 2]
not json
EOF
flag 2 "$w/batch.jsonl" "$S/records/batch-lines"

rm -rf "$w"
for h in "$S"/*; do
    [ -n "$(ls "$h")" ] || { echo "seeds.sh: no seed for $(basename "$h")" >&2; exit 70; }
done
