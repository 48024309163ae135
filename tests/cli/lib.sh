# tests/cli/lib.sh - TAP helpers for the CLI tests (sourced).
# Each test script runs the real programs from $BINDIR_B through real pipes.
BINDIR_B=${BINDIR_B:-bin}
T=${CB_TEST_TMP:-/tmp}/cli.$$
mkdir -p "$T"
trap 'redis_stop; rm -rf "$T"' EXIT
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
# vale_chunks MODEL OUT: three short documents about the river Vale in $T/docs, chunked by 24
# tokens into OUT; Q, a question they answer
vale_chunks() {
    mkdir -p "$T/docs"
    for i in 1 2 3; do
        printf 'Document %s. The river Vale runs past the town of Kelby %s.\n\nIts bridge was built in 19%s0 by the Norden company.\n' $i $i $i > "$T/docs/d$i.txt"
    done
    Q="Who built the bridge over the Vale?"
    "$BINDIR_B/cb-chunk" -m "$1" --tokens 24 "$T/docs" > "$2"
}
# verify_stats NAME MODE STORE CHUNKS [cb-run options]: $RUN on $M with --verify against full
# prefill, one greedy token, no store writes; its stats in $T/NAME.json, its stderr in
# $T/NAME.err; the question is $Q (default: "Who built the bridge?")
verify_stats() {
    r_name=$1 r_mode=$2 r_store=$3 r_chunks=$4
    shift 4
    "$RUN" -m "$M" --store "$r_store" --chunks "$r_chunks" --mode "$r_mode" --verify -n 1 --temp 0 \
        --no-store-write --stats "$T/$r_name.json" -p "${Q:-Who built the bridge?}" "$@" > /dev/null \
        2> "$T/$r_name.err"
}
done_testing() { echo "1..$n"; [ "$nfail" -eq 0 ]; }
# need_fixture PATH WHAT: go on when the fixture PATH exists, else skip WHAT and end the script
need_fixture() {
    [ -f "$1" ] && return 0
    skip "$2" "no fixture $1 (tests/run.sh writes it)"
    done_testing
    exit
}
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
# A redis-server of the test's own.  free_port: a loopback TCP port no one
# listens on now (the kernel's pick).  redis_start [ARG...]: redis-server on
# the unix socket $SOCK ($T/redis.sock, mode 700) and, when $PORT is set, on
# 127.0.0.1:$PORT; nothing saved, its pid in $T/redis.pid, its log in
# $T/redis.log; ARGs go to redis-server first (a config file, then options
# such as --requirepass PW).  0 once it answers on the socket (PONG, or the
# refusal of a server with a password), 1 when it does not within 5 s.  It
# is stopped at exit (lib.sh's trap, or redis_stop in a script's own trap).
# redis_stop: shut down, waited for up to 2 s (it logs into $T while it
# goes); redis_kill: killed at once, as by a crash, its socket removed, so
# that redis_start starts it again, empty, on the same $PORT and $SOCK.
SOCK=$T/redis.sock
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
redis_start() {
    _rs=$(command -v redis-server) && _rc=$(command -v redis-cli) || return 1
    if [ -n "${PORT:-}" ]; then set -- "$@" --bind 127.0.0.1 --port "$PORT"; else set -- "$@" --port 0; fi
    "$_rs" "$@" --unixsocket "$SOCK" --unixsocketperm 700 --save "" --appendonly no --dir "$T" \
        --daemonize yes --pidfile "$T/redis.pid" --logfile "$T/redis.log" > /dev/null 2>&1
    _i=0
    while [ $_i -lt 50 ]; do
        "$_rc" -s "$SOCK" ping 2>&1 | grep -qE 'PONG|NOAUTH' && return 0
        sleep 0.1; _i=$((_i + 1))
    done
    return 1
}
redis_stop() {
    _rp=$(cat "$T/redis.pid" 2>/dev/null) || return 0
    kill "$_rp" 2>/dev/null
    _i=0; while kill -0 "$_rp" 2>/dev/null && [ $_i -lt 40 ]; do sleep 0.05; _i=$((_i + 1)); done
    rm -f "$T/redis.pid"
}
redis_kill() {
    [ -f "$T/redis.pid" ] && kill -9 "$(cat "$T/redis.pid")" 2>/dev/null
    rm -f "$T/redis.pid" "$SOCK"; sleep 0.2
}
