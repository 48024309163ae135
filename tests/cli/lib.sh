# tests/cli/lib.sh - TAP helpers for the CLI tests (sourced).
# Each test script runs the real programs from $BINDIR_B through real pipes.
BINDIR_B=${BINDIR_B:-bin}
T=${CB_TEST_TMP:-/tmp}/cli.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
n=0; nfail=0
ok()     { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); nfail=$((nfail + 1)); echo "not ok $n - $1"; }
skip()   { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
# check NAME CMD...: passes when CMD succeeds
check()  { name=$1; shift; if "$@"; then ok "$name"; else not_ok "$name"; fi; }
# expect_exit NAME CODE CMD...: passes when CMD exits with CODE; stderr kept in $T/err
expect_exit() {
    name=$1; want=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"; got=$?
    if [ "$got" -eq "$want" ]; then ok "$name (exit $want)"; else
        not_ok "$name (exit $got, want $want)"; sed 's/^/#   /' "$T/err" | head -5; fi
}
gemma_model() {
    m=${CB_GEMMA_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/gemma-3-270m-q4_k_m.gguf}
    [ -f "$m" ] && echo "$m"
}
done_testing() { echo "1..$n"; [ "$nfail" -eq 0 ]; }
# the tests' small real model (make model MODEL=smollm2), when present
smol_model() {
    m=${CB_SMOL_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    [ -f "$m" ] && echo "$m"
}
# the programs' default model (make model), when present
default_model() {
    m=${CB_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
    [ -f "$m" ] && echo "$m"
}
