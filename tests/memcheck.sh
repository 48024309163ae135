#!/bin/sh
# tests/memcheck.sh - run every unit test program under Valgrind's memcheck
# (make memcheck).  A test passes when Valgrind reports no error (invalid
# reads or writes, uses of uninitialised values, bad frees) and no leak
# definitely lost, whatever its own checks say (its speed checks fail under
# Valgrind's slowdown: those are listed); its log is in build/memcheck/NAME.log (outside tests/tmp,
# which make test empties).  The store's multi-process stress runs 1 s and
# 5 kill rounds here (CB_STORE_STRESS_S, CB_STORE_ROUNDS).
# test_blend runs on the tiny fixtures.  The real models (those fetched)
# run as "cb-run:smollm2" and "cb-run:gemma": cb-run continuing a short raw
# prompt by 3 tokens (real weights, vocabulary, sizes and
# kernels; 2-4 minutes each).  Valgrind runs a real model at tens of
# MFLOP/s, so test_blend's real-model cases are on request only:
# "test_blend:smollm2", "test_blend:gemma" or "test_blend:real" in
# MEMCHECK_TESTS run them in test_blend's short mode (CB_BLEND_MODELS,
# CB_BLEND_SHORT: half-length chunks; full, ratio 1, ratio 0, reuse, blend
# at 0.15 and a score) without --track-origins; that is still over an hour
# per model on a shared core.
# Environment: BUILD (default build/rel), MEMCHECK_TESTS (names to run,
# default every tests/unit program, cb-run:smollm2 and cb-run:gemma), VALGRIND_ARGS
# (extra options).
BUILD=${BUILD:-build/rel}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 70
if ! command -v valgrind >/dev/null 2>&1; then
    echo "1..0 # SKIP valgrind not installed (apt-get install valgrind)"
    exit 0
fi
if [ -z "${CB_SHARED_DATA:-}" ] && [ -d "$top/../shared/data" ]; then
    CB_SHARED_DATA=$(cd "$top/../shared/data" && pwd); export CB_SHARED_DATA
fi
export CB_TEST_TMP="$top/build/memcheck"
rm -rf "$CB_TEST_TMP"; mkdir -p "$CB_TEST_TMP"
gen="$BUILD/tests/cb-gen-fixture"
for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K; do
    "$gen" --type "$t" "$CB_TEST_TMP/tiny-$t.gguf" || exit 70
done
"$gen" --vocab-only "$CB_TEST_TMP/tiny-vocab.gguf" || exit 70
"$gen" --layers 4 "$CB_TEST_TMP/tiny4-f32.gguf" || exit 70
"$gen" --arch qwen2 --type q8_0 "$CB_TEST_TMP/tiny-qwen2.gguf" || exit 70
"$gen" --arch qwen2 --layers 4 "$CB_TEST_TMP/tiny4-qwen2.gguf" || exit 70
"$gen" --arch qwen3 --type q8_0 --layers 4 "$CB_TEST_TMP/tiny-qwen3.gguf" || exit 70
"$gen" --arch gemma3 --type q8_0 "$CB_TEST_TMP/tiny-gemma3.gguf" || exit 70
"$gen" --rope-scaling llama3 --type q8_0 --layers 4 "$CB_TEST_TMP/tiny-llama3.gguf" || exit 70

tests=${MEMCHECK_TESTS:-$(cd "$BUILD/tests" && ls test_* 2>/dev/null) cb-run:smollm2 cb-run:gemma}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/models
real_model() {
    case $1 in
    smollm2) echo "${CB_MODEL:-$cache/SmolLM2-135M-Instruct.Q4_1.gguf}" ;;
    gemma) echo "${CB_GEMMA_MODEL:-$cache/gemma-3-270m-q4_k_m.gguf}" ;;
    esac
}
n=0; bad=0
echo "1..$(echo $tests | wc -w)"
for t in $tests; do
    n=$((n + 1))
    log="$CB_TEST_TMP/$t.log"
    start=$(date +%s)
    cmd="$BUILD/tests/${t%%:*}"
    case $t in
    test_blend) models=tiny short= origins=yes ;;
    test_blend:*) models=${t#*:} short=1 origins=no ;; # errors are still found, at half the cost
    cb-run:*)
        models= short= origins=yes m=$(real_model "${t#*:}")
        if [ ! -f "$m" ]; then
            echo "ok $n - memcheck $t # SKIP model not fetched (make model; make model MODEL=gemma)"; continue
        fi
        cmd="${BINDIR_B:-bin}/cb-run -m $m --raw -p The_capital_of_France_is -n 3 -t 1" ;;
    *) models= short= origins=yes ;;
    esac
    # 99 marks a memcheck error; the test's own failures give 1.
    CB_DEVICE=cpu CB_STORE_STRESS_S=${CB_STORE_STRESS_S:-1} CB_STORE_ROUNDS=${CB_STORE_ROUNDS:-5} \
    CB_BLEND_MODELS=$models CB_BLEND_SHORT=$short valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
        --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-origins=$origins \
        --num-callers=30 ${VALGRIND_ARGS:-} $cmd >"$log" 2>&1
    rc=$?
    errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$log" | tail -1)
    # The test's own failures (rc 1) are not memory errors: under Valgrind's
    # 20-50x slowdown its speed checks fail.  They are named, not counted.
    if [ "$rc" -ne 99 ] && [ "${errs:-1}" -eq 0 ]; then
        echo "ok $n - memcheck $t: 0 errors ($(( $(date +%s) - start ))s)"
        [ "$rc" -eq 0 ] || grep -E '^not ok' "$log" | sed 's/^/#   under Valgrind the test itself failed: /' | head -5
    else
        bad=$((bad + 1))
        echo "not ok $n - memcheck $t: exit $rc, ${errs:-?} errors (log: $log)"
        grep -E '^==[0-9]+== (Invalid|Conditional|Use of|Mismatched|.*definitely lost)' "$log" | sort | uniq -c | head -10 | sed 's/^/# /'
    fi
done
[ "$bad" -eq 0 ]
