#!/bin/sh
# tests/cli/install.sh - make install into a scratch DESTDIR: the release,
# written once (CB_VERSION_STRING in lib/include/cbcore.h), reaches
# libcbcore.pc, every installed man page's footer and every program's
# --version; cacheblend(7) is installed.
. "$(dirname "$0")/lib.sh"
top=$(cd "$(dirname "$0")/../.." && pwd)
ver=$(sed -n 's/^#define CB_VERSION_STRING "\(.*\)"$/\1/p' "$top/lib/include/cbcore.h")
n_def=$(grep -c 'define CB_VERSION_STRING' "$top/lib/include/cbcore.h")
if [ -n "$ver" ] && [ "$n_def" -eq 1 ]; then ok "CB_VERSION_STRING is defined once ($ver)"
else not_ok "CB_VERSION_STRING is defined $n_def times"; fi
if grep -rn "^\.Os cacheblend [0-9]" "$top/man" >"$T/typed"; then
    not_ok "no man page types the release"; sed 's/^/#   /' "$T/typed"
else
    ok "no man page types the release"
fi
d=$T/root
if make -s --no-print-directory -C "$top" install DESTDIR="$d" PREFIX=/usr >"$T/log" 2>&1; then
    ok "make install DESTDIR=..."
else
    not_ok "make install DESTDIR=..."; sed 's/^/#   /' "$T/log" | tail -5
fi
check "libcbcore.pc: Version: $ver" grep -qx "Version: $ver" "$d/usr/lib/pkgconfig/libcbcore.pc"
pages=0 bad=""
for f in "$d"/usr/share/man/man*/*; do
    [ -f "$f" ] || continue
    pages=$((pages + 1))
    grep -qx "\.Os cacheblend $ver" "$f" || bad="$bad $(basename "$f")"
done
if [ "$pages" -gt 0 ] && [ -z "$bad" ]; then ok "$pages man pages installed, each with .Os cacheblend $ver"
else not_ok "$pages man pages installed; without .Os cacheblend $ver:$bad"; fi
check "cacheblend(7) is installed" [ -f "$d/usr/share/man/man7/cacheblend.7" ]
for p in cb-chunk cb-precompute cb-store cb-profile cb-run; do
    out=$("$BINDIR_B/$p" --version 2>&1)
    check "$p --version: $out" [ "$out" = "$p (cacheblend) $ver" ]
done
done_testing
