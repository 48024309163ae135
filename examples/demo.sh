#!/bin/sh
# examples/demo.sh - what `make demo` runs: the default model's facts and a
# tokenized sample, through the real programs.
set -eu
cd "$(dirname "$0")/.."
M=${CB_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf}
echo "== model: $M"
bin/cb-run --tokenize -v -m "$M" -p "" 2>&1 >/dev/null | sed 's/^cb-run: /   /'
text='CacheBlend reuses the KV caches of retrieved chunks, wherever they appear in the prompt.'
echo "== text:      $text"
ids=$(bin/cb-run --tokenize -m "$M" -p "$text")
echo "== token ids: $ids"
echo "== count:     $(echo "$ids" | wc -w) tokens for $(printf %s "$text" | wc -c) bytes"
printf '== pieces:    '
for id in $ids; do printf '[%s]' "$(bin/cb-run --detokenize -m "$M" -p "$id")"; done; echo
printf '== decoded:   '; echo "$ids" | bin/cb-run --detokenize -m "$M"; echo
echo "== chat markup with --special:"
bin/cb-run --tokenize --special -m "$M" -p '<|im_start|>user
Hi<|im_end|>'
