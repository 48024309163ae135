#!/bin/sh
# The blend's bits: cb-run --mode blend's first-token logits (--logits-out)
# over its configurations (the defaults, --speedup, --ratio, every
# --strategy, the --tune keys) on tiny fixtures of each architecture's
# blend defaults (llama; qwen2: a stale scale; gemma3: a key temperature
# and sliding windows) and on SmolLM2 when present, each from a store that
# has no profile.  Their sha256 are compared with
#   BLEND_BITS_REF=DIR   the same runs of another build's programs (DIR
#                        holds its cb-chunk, cb-precompute and cb-run), or
#   tests/cli/blend-bits.sha256  the hashes recorded on this machine
#                        (its CPU and its -march=native build), when it has
#                        them; else the cases are skipped.
# sh tests/cli/blend-bits.sh --record writes the hashes of $BINDIR_B's
# programs for this machine into that file (the others' lines kept).
# A refactoring of the blend's policy must leave them all as they were.
. "$(dirname "$0")/lib.sh"
BUILD=${BUILD:-build/rel}
GEN=$BUILD/tests/cb-gen-fixture
REC=$(dirname "$0")/blend-bits.sha256
[ -x "$GEN" ] || { skip "the blend's bits" "no $GEN (make $GEN)"; done_testing; exit; }
# This machine: its CPU and its instruction sets (the build is -march=native).
MACHINE=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) 2>/dev/null |
    sha256sum | cut -c1-12)

"$GEN" --arch qwen2 --layers 4 "$T/qwen2.gguf" &&
    "$GEN" --arch gemma3 --type q8_0 --layers 6 "$T/gemma3.gguf" &&
    "$GEN" --layers 4 --type q8_0 "$T/llama.gguf" || { not_ok "fixtures"; done_testing; exit; }
MODELS="qwen2=$T/qwen2.gguf gemma3=$T/gemma3.gguf llama=$T/llama.gguf"
SMOL=$(smol_model) && MODELS="$MODELS smollm2=$SMOL"

# name|options: the configurations
cat > "$T/configs" <<'EOF'
default|
speedup2|--speedup 2
speedup1.5-min0.3|--speedup 1.5 --tune min-ratio=0.3
min-ratio|--tune min-ratio=0.05
ratio0.3|--ratio 0.3
ratio0|--ratio 0
ratio1|--ratio 1
ratio-auto|--ratio auto
auto|--strategy auto
hkvd|--strategy hkvd
sink|--strategy sink
query|--strategy query
probe|--strategy probe
runs|--strategy runs
random|--strategy random
auto-r|--strategy auto --ratio 0.3
hkvd-r|--strategy hkvd --ratio 0.3
sink-r|--strategy sink --ratio 0.3 --tune sink-tokens=2
query-r|--strategy query --ratio 0.3
probe-r|--strategy probe --ratio 0.3
runs-r|--strategy runs --ratio 0.3
random-r|--strategy random --ratio 0.3
ratios|--strategy hkvd --tune ratios=0.4,0.2
mass|--strategy probe --tune mass=0.5 --tune max-ratio=0.4
mass-auto|--tune mass=0.3
check-layer|--strategy hkvd --tune check-layer=2
deviation-k|--strategy hkvd --tune deviation=k
probe-rows|--strategy probe --tune probe-rows=4
probe-weight|--tune probe-weight=none
probe-depth|--tune probe-depth=0.5
passages|--strategy probe --tune passages=1
key-temp|--tune key-temp=1.2
stale-scale|--tune stale-scale=0.5
stale-hkvd|--strategy hkvd --tune stale-scale=0.5
load-threads|--tune load-threads=2
no-context|--tune no-context
reuse|--mode reuse
EOF

# hashes BINDIR OUT: "model config sha256" (or "exit N") of every run
hashes() {
    : > "$2"
    for mm in $MODELS; do
        name=${mm%%=*} m=${mm#*=} s="$T/store-$name-$3"
        vale_chunks "$m" "$T/c-$name.jsonl" 2>/dev/null
        # the store, with --context (the caches after the chunk before them)
        "$1/cb-precompute" -m "$m" --store "$s" --context -q -t 2 "$T/c-$name.jsonl" > /dev/null 2>&1 ||
            { echo "$name precompute failed" >> "$2"; continue; }
        while IFS='|' read -r cfg opts; do
            rm -f "$T/l.bin"
            # shellcheck disable=SC2086
            "$1/cb-run" -m "$m" --store "$s" --chunks "$T/c-$name.jsonl" -p "$Q" -n 1 --temp 0 -t 2 \
                --no-store-write -q --logits-out "$T/l.bin" $opts > /dev/null 2>&1
            rc=$?
            if [ $rc -eq 0 ]; then h=$(sha256sum < "$T/l.bin" | cut -c1-64); else h="exit-$rc"; fi
            echo "$name $cfg $h" >> "$2"
        done < "$T/configs"
    done
}

hashes "$BINDIR_B" "$T/mine" mine
if [ "${1:-}" = --record ]; then
    { [ -f "$REC" ] && grep -v "^$MACHINE " "$REC"; sed "s/^/$MACHINE /" "$T/mine"; } > "$T/rec"
    cp "$T/rec" "$REC" && ok "recorded $(wc -l < "$T/mine") hashes for machine $MACHINE in $REC"
    done_testing; exit
fi
if [ -n "${BLEND_BITS_REF:-}" ]; then
    hashes "$BLEND_BITS_REF" "$T/ref" ref
    from="$BLEND_BITS_REF's programs"
elif [ -f "$REC" ] && grep -q "^$MACHINE " "$REC"; then
    grep "^$MACHINE " "$REC" | cut -d' ' -f2- > "$T/ref"
    from="the hashes recorded for machine $MACHINE"
else
    skip "the blend's bits" "no hashes recorded for this machine ($MACHINE) and no BLEND_BITS_REF"
    done_testing; exit
fi
n_exit=$(grep -c ' exit-' "$T/mine")
while read -r name cfg h; do
    want=$(awk -v a="$name" -v b="$cfg" '$1 == a && $2 == b { print $3 }' "$T/ref")
    if [ -z "$want" ]; then skip "$name $cfg" "not in $from"
    elif [ "$h" = "$want" ]; then ok "$name $cfg: the logits' bits as $from ($(echo "$h" | cut -c1-12))"
    else not_ok "$name $cfg: $h, $from: $want"; fi
done < "$T/mine"
[ "$n_exit" -lt 20 ] && ok "most configurations run ($n_exit end in an error, as the reference's do)" ||
    not_ok "$n_exit configurations end in an error"
done_testing
