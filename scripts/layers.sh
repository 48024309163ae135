#!/bin/sh
# scripts/layers.sh - the headers' shape, as TAP (tests/run.sh runs it as
# style/layers; make layers too):
#   - the public header, lib/include/cbcore.h, holds what a client needs:
#     every function it declares is called from src/ or examples/ (one
#     that only tests or diagnostics use goes to its layer's header, as
#     lib/infer/diag.h), and it stays within MAX lines (default 720), a backstop
#     rather than the rule, so no declaration is packed to fit it;
#   - no file of lib/ includes a header of a layer above its own, the
#     layers being, lowest first, core < backend (and cuda, the module
#     behind it) < infer < kv < store < prompt;
#   - no file of lib/ includes cbcore.h itself but lib/core/core.h: each
#     includes its layer's header (core.h, backend.h, infer.h, kv.h,
#     store.h, prompt.h) or a private one that does, which brings it;
#   - src/ includes no header of lib/ but cbcore.h (through -Ilib/include).
#   sh scripts/layers.sh [MAX]
cd "$(dirname "$0")/.." || exit 70
max=${1:-720}
rank() {
    case $1 in
    core) echo 0 ;; backend | cuda) echo 1 ;; infer) echo 2 ;; kv) echo 3 ;;
    store) echo 4 ;; prompt) echo 5 ;; include) echo -1 ;; *) echo 99 ;;
    esac
}
n=0 bad=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); bad=$((bad + 1)); echo "not ok $n - $1"; }

lines=$(wc -l < lib/include/cbcore.h)
if [ "$lines" -le "$max" ]; then ok "lib/include/cbcore.h: $lines lines (at most $max)"
else not_ok "lib/include/cbcore.h: $lines lines, more than $max (internal declarations go to their layer's header)"; fi
unused=""
for fn in $(grep -oE '\bcb_[a-z0-9_]+[[:space:]]*\(' lib/include/cbcore.h | sed 's/[[:space:]]*($//' | sort -u); do
    grep -rqw -- "$fn" src examples || unused="$unused $fn"
done
if [ -z "$unused" ]; then ok "every function lib/include/cbcore.h declares has a caller in src/ or examples/"
else not_ok "lib/include/cbcore.h declares functions no program calls (move them to their layer's header):$unused"; fi

# file, included name -> "layer" of what it includes ("include" for cbcore.h)
up="" direct=""
for f in lib/*/*.c lib/*/*.h lib/*/*.cu lib/*/*.cuh; do
    [ -f "$f" ] || continue
    dir=$(dirname "$f") layer=$(basename "$(dirname "$f")")
    [ "$layer" = include ] && continue
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
        if [ "$inc" = cbcore.h ]; then
            [ "$f" = lib/core/core.h ] || direct="$direct $f"
            continue
        fi
        target=$(cd "$dir" && cd "$(dirname "$inc")" 2>/dev/null && basename "$(pwd)")
        [ -n "$target" ] || continue
        if [ "$(rank "$target")" -gt "$(rank "$layer")" ]; then up="$up $f($inc)"; fi
    done
done
if [ -z "$up" ]; then ok "no lib/ file includes a header of a layer above its own"
else not_ok "lib/ files include headers of layers above their own:$up"; fi
if [ -z "$direct" ]; then ok "lib/ files include their layer's header, not cbcore.h"
else not_ok "lib/ files include cbcore.h instead of their layer's header:$direct"; fi

src=$(grep -ln '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./' src/*.c src/*.h 2>/dev/null | tr '\n' ' ')
if [ -z "$src" ]; then ok "src/ includes no internal header of lib/"
else not_ok "src/ includes internal headers of lib/: $src"; fi

echo "1..$n"
[ "$bad" -eq 0 ]
