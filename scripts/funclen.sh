#!/bin/sh
# scripts/funclen.sh - the longest C functions in lib/ and src/ (lines from
# the opening line to the closing brace, by Universal Ctags' end: field).
#   sh scripts/funclen.sh [N] [LIMIT]   print the N longest (default 15);
#                                       exit 1 when one is over LIMIT lines
set -eu
n=${1:-15}
limit=${2:-0}
cd "$(dirname "$0")/.."
command -v ctags >/dev/null || { echo "funclen.sh: ctags (universal-ctags) is needed" >&2; exit 69; }
ctags -x --_xformat='%{end} %{line} %N %F' --kinds-C=f --languages=C,C++ --langmap=C++:+.cu \
    -R lib src 2>/dev/null |
    awk '{ print $1 - $2 + 1, $3, $4 ":" $2 }' | sort -rn > "${TMPDIR:-/tmp}/funclen.$$"
head -n "$n" "${TMPDIR:-/tmp}/funclen.$$"
over=0
[ "$limit" -gt 0 ] && over=$(awk -v l="$limit" '$1 > l' "${TMPDIR:-/tmp}/funclen.$$" | wc -l)
rm -f "${TMPDIR:-/tmp}/funclen.$$"
[ "$over" -eq 0 ] || { echo "funclen.sh: $over function(s) over $limit lines" >&2; exit 1; }
