#!/bin/sh
# tests/cli/install.sh - make install into a scratch DESTDIR: the release,
# written once (CB_VERSION_STRING in lib/include/cbcore.h), reaches
# libcbcore.pc, every installed man page's footer and every program's
# --version; cacheblend(7) is installed; cbcore.h is the one header
# installed, and a client builds against it alone (C, and C++ for the header).
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
# A client of the library sees the installed header alone: cbcore.h and
# nothing else is installed, and a program using it (as the man page's
# example does) compiles against it and links with libcbcore.a.
inc=$(cd "$d/usr/include" 2>/dev/null && ls)
check "the one installed header is cbcore.h ($inc)" [ "$inc" = cbcore.h ]
cat >"$T/client.c" <<'EOC'
#include <cbcore.h>
#include <stdio.h>
int main(int argc, char **argv)
{
    cb_gguf *g;
    cb_vocab *v;
    cb_error err;
    cb_tokens ids = {0};
    if (cb_gguf_open(&g, argv[1], &err) != CB_OK || cb_vocab_load(&v, g, &err) != CB_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (cb_tok_encode(v, "Hello world", 11, 0, &ids) != CB_OK)
        return 1;
    printf("%s %zu\n", CB_VERSION_STRING, ids.n);
    cb_tokens_free(&ids);
    cb_vocab_free(v);
    cb_gguf_free(g);
    return argc > 2;
}
EOC
libs=$(sed -n 's/^Libs.private: //p' "$d/usr/lib/pkgconfig/libcbcore.pc")
# shellcheck disable=SC2086
if ${CC:-cc} -std=c11 -Wall -Werror -I"$d/usr/include" -o "$T/client" "$T/client.c" \
    "$d/usr/lib/libcbcore.a" $libs >"$T/cc.log" 2>&1; then
    ok "a client builds against the installed cbcore.h and libcbcore.a"
else
    not_ok "a client builds against the installed cbcore.h and libcbcore.a"; sed 's/^/#   /' "$T/cc.log" | tail -5
fi
fix=${CB_TEST_TMP:-}/tiny-vocab.gguf
if [ -x "$T/client" ] && [ -f "$fix" ]; then
    out=$("$T/client" "$fix" 2>&1)
    check "the client runs: $out" sh -c 'case $1 in "$2 "[1-9]*) exit 0 ;; esac; exit 1' sh "$out" "$ver"
else
    skip "the client runs" "no client or no tiny-vocab.gguf fixture (tests/run.sh makes it)"
fi
if command -v "${CXX:-c++}" >/dev/null 2>&1; then
    check "cbcore.h compiles as C++" sh -c 'echo "#include <cbcore.h>" | "$1" -fsyntax-only -Wall -Werror -I"$2" -x c++ -' sh "${CXX:-c++}" "$d/usr/include"
fi
for p in cb-chunk cb-precompute cb-store cb-profile cb-run; do
    out=$("$BINDIR_B/$p" --version 2>&1)
    check "$p --version: $out" [ "$out" = "$p (cacheblend) $ver" ]
done
done_testing
