#!/bin/sh
# What a user meets first, for every program: a bad option said in one
# line (exit 64), not the whole help; and man pages that groff renders
# without a warning.
. "$(dirname "$0")/lib.sh"

# PROG ARGS... -> exit 64 and exactly the line WANT on stderr
one_line() {
    want=$1; shift
    "$BINDIR_B/$@" > "$T/out" 2> "$T/err"; rc=$?
    if [ "$rc" = 64 ] && [ "$(cat "$T/err")" = "$want" ] && [ ! -s "$T/out" ]; then ok "$* (exit 64): $want"
    else not_ok "$* (exit $rc): $(head -c 200 "$T/err")"; fi
}
# every help fits an 80-column terminal
for p in cb-chunk cb-precompute cb-store cb-profile cb-run; do
    "$BINDIR_B/$p" --help > "$T/help" 2>&1
    wide=$(awk 'length > 80 { n++ } END { print n + 0 }' "$T/help")
    if [ "$wide" = 0 ] && [ -s "$T/help" ]; then ok "$p --help: every line within 80 columns"
    else not_ok "$p --help: $wide lines wider than 80 columns: $(awk 'length > 80' "$T/help" | head -2)"; fi
done
for p in cb-chunk cb-precompute cb-store cb-profile cb-run; do
    one_line "$p: unknown option '--bogus' (see --help)" $p --bogus
    one_line "$p: unknown option '-Y' (see --help)" $p -Y
    one_line "$p: option '--model' needs an argument (see --help)" $p --model
    one_line "$p: option '-m' needs an argument (see --help)" $p -m
    one_line "$p: option '--verbose' takes no argument (see --help)" $p --verbose=2
done
one_line "cb-run: unknown option '--no-such' (see --help)" cb-run --no-such=3 -p hi
one_line "cb-run: option '--st' is ambiguous (see --help)" cb-run --st x -p hi
one_line "cb-store: unknown option '--bogus' (see --help)" cb-store ls --bogus

# the man pages, with every warning on: as groff checks them, and as man(1)
# formats them for a terminal of 80 columns (a line of 78 or 80)
if command -v groff >/dev/null 2>&1; then
    for f in man/man*/*.[1-9]; do
        w=$(groff -ww -mandoc -z "$f" 2>&1
            for ll in 78n 80n; do LC_ALL=C.UTF-8 groff -ww -mandoc -Tutf8 -rLL=$ll "$f" 2>&1 >/dev/null; done)
        [ -z "$w" ] && ok "$f: no troff warning" || not_ok "$f: $(echo "$w" | head -3)"
    done
else
    skip "the man pages' troff warnings" "no groff"
fi
done_testing
