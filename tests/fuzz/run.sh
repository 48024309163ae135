#!/bin/sh
# tests/fuzz/run.sh DIR SECONDS [NAME...] - run each libFuzzer harness
# DIR/fuzz_NAME for SECONDS seconds, one after another, and print per
# harness: executions, coverage (cov: edges, ft: features, as libFuzzer
# counts them), corpus size and findings, as TAP (ok / not ok).
#
# Corpora: DIR/seeds/NAME (made at build time, read only) and
# DIR/corpus/NAME (what the fuzzer found, kept between runs).  Findings
# (crash-*, leak-*, timeout-*, oom-*) land in DIR/findings/NAME/; a
# harness with a finding fails.  Reproduce one with DIR/fuzz_NAME FILE.
# Environment: FUZZ_RUNS (stop a harness after this many executions, or
# at SECONDS, whichever comes first; SECONDS 0 = no time limit), FUZZ_ARGS
# (extra libFuzzer flags), CB_FUZZ_TMP (where harnesses make their
# temporary directories; default /dev/shm when it is a writable tmpfs, as
# the store and archive harnesses write and fsync files on every input,
# else DIR/tmp), FUZZ_FRESH (set: start from the seeds alone, in a corpus
# removed afterwards; make test's short pass).
dir=$1 secs=$2
shift 2 || { echo "usage: run.sh DIR SECONDS [NAME...]" >&2; exit 64; }
[ -n "$*" ] || set -- $(cd "$dir" && ls fuzz_* | sed 's/^fuzz_//')
if [ -z "${CB_FUZZ_TMP:-}" ]; then
    if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
        CB_FUZZ_TMP=/dev/shm/cbfuzz-$(id -u)
    else
        CB_FUZZ_TMP=$(cd "$dir" && pwd)/tmp
    fi
fi
export CB_FUZZ_TMP
runs=
[ -z "${FUZZ_RUNS:-}" ] || runs=-runs=$FUZZ_RUNS
mkdir -p "$CB_FUZZ_TMP"
# clang-N's runtime looks for llvm-symbolizer beside clang-N only
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && command -v llvm-symbolizer >/dev/null 2>&1; then
    ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer); export ASAN_SYMBOLIZER_PATH
fi
. "$(dirname "$0")/maxlen.sh"
n=0 bad=0 total_execs=0
echo "1..$#"
for h in "$@"; do
    n=$((n + 1))
    bin=$dir/fuzz_$h
    if [ ! -x "$bin" ]; then
        echo "not ok $n - fuzz_$h: not built"; bad=$((bad + 1)); continue
    fi
    corpus=$dir/corpus/$h
    [ -z "${FUZZ_FRESH:-}" ] || corpus=$CB_FUZZ_TMP/corpus-$h.$$
    mkdir -p "$corpus" "$dir/findings/$h"
    log=$dir/findings/$h/last.log
    before=$(ls "$dir/findings/$h" | grep -cE '^(crash|leak|timeout|oom|slow-unit)-')
    # -close_fd_mask=1: the programs' own stdout (cb-chunk's records) is not wanted
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" -max_total_time="$secs" $runs -max_len="$(max_len "$h")" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=1024 -print_final_stats=1 -close_fd_mask=1 \
        -artifact_prefix="$dir/findings/$h/" ${FUZZ_ARGS:-} "$corpus" "$dir/seeds/$h" >"$log" 2>&1
    rc=$?
    [ -z "${FUZZ_FRESH:-}" ] || rm -rf "$corpus"
    after=$(ls "$dir/findings/$h" | grep -cE '^(crash|leak|timeout|oom|slow-unit)-')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p')
    new=$((after - before))
    total_execs=$((total_execs + ${execs:-0}))
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    line="fuzz_$h: ${execs:-0} execs in ${took:-$secs}s (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, $new findings"
    if [ "$rc" -eq 0 ] && [ "$new" -eq 0 ]; then
        echo "ok $n - $line"
    else
        bad=$((bad + 1))
        echo "not ok $n - $line (exit $rc; log $log)"
        grep -E 'ERROR: |SUMMARY: |property failed|runtime error' "$log" | head -5 | sed 's/^/# /'
        ls -t "$dir/findings/$h" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | head -3 | sed "s|^|# reproduce: $bin $dir/findings/$h/|"
    fi
done
echo "# fuzz: $# harnesses, $total_execs executions, $bad with findings"
[ "$bad" -eq 0 ]
