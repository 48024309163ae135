#!/bin/sh
# tests/run.sh - run every unit test program and CLI test script, count the
# TAP lines they print, and end with "N passed, N failed, N skipped".
# Environment: BUILD (object dir, default build/rel), BINDIR_B (programs, default bin),
# CB_CUDA_MOD (the CUDA module's path, when the build made one), CB_FUZZ_DIR
# (the libFuzzer harnesses, when clang built them), CB_FUZZ_S (their seconds).
BUILD=${BUILD:-build/rel}
BINDIR_B=${BINDIR_B:-bin}
export BUILD BINDIR_B
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 70
# ../shared beside the repository holds the tokenizer suites and evaluation data.
if [ -z "${CB_SHARED_DATA:-}" ] && [ -d "$top/../shared/data" ]; then
    CB_SHARED_DATA=$(cd "$top/../shared/data" && pwd); export CB_SHARED_DATA
fi
if [ -z "${CB_SHARED_DATA:-}" ]; then
    echo "# note: ../shared/data not found: the tokenizer conformance suites and evaluation data are skipped"
fi
# The CUDA module, when the build made one (make passes its path): the
# unit tests find it through CB_CUDA_MODULE, the programs next to bin/.
if [ -n "${CB_CUDA_MOD:-}" ]; then
    CB_CUDA_MODULE="$top/$CB_CUDA_MOD"; export CB_CUDA_MODULE CB_CUDA_MOD
    echo "# CUDA module: $CB_CUDA_MOD ($(python3 scripts/fatbin-archs.py "$CB_CUDA_MOD" 2>&1))"
else
    echo "# note: no CUDA module in this build (nvcc not found, or CUDA=0): its build checks are skipped"
fi
export CB_TEST_TMP="$top/tests/tmp"
rm -rf "$CB_TEST_TMP"; mkdir -p "$CB_TEST_TMP"

# Fixtures: tiny random-weight models in several tensor types, written by
# our own GGUF writer (nothing binary is committed).
gen="$BUILD/tests/cb-gen-fixture"
for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_K q5_K q6_K; do
    "$gen" --type "$t" "$CB_TEST_TMP/tiny-$t.gguf" || { echo "# fixture generator failed for $t"; exit 70; }
done
"$gen" --vocab-only "$CB_TEST_TMP/tiny-vocab.gguf" || exit 70
"$gen" --layers 4 "$CB_TEST_TMP/tiny4-f32.gguf" || exit 70
"$gen" --arch qwen2 --type q8_0 "$CB_TEST_TMP/tiny-qwen2.gguf" || exit 70
"$gen" --arch qwen2 --layers 4 "$CB_TEST_TMP/tiny4-qwen2.gguf" || exit 70 # blend: biases, f32
# The other architectures and RoPE scalings: qwen3 (Q/K norms), gemma3
# (sliding windows, post-norms, GELU, embedding scale, BOS), Llama 3.1's
# rope_freqs, linear scaling (of the global layers only, in gemma3).
"$gen" --arch qwen3 --type q8_0 --layers 4 "$CB_TEST_TMP/tiny-qwen3.gguf" || exit 70
"$gen" --arch gemma3 --type q8_0 "$CB_TEST_TMP/tiny-gemma3.gguf" || exit 70
"$gen" --arch gemma3 --rope-scaling linear "$CB_TEST_TMP/tiny-gemma3-linear.gguf" || exit 70
"$gen" --rope-scaling llama3 --type q8_0 --layers 4 "$CB_TEST_TMP/tiny-llama3.gguf" || exit 70
"$gen" --rope-scaling linear "$CB_TEST_TMP/tiny-llama-linear.gguf" || exit 70
"$gen" --rope-scaling yarn "$CB_TEST_TMP/tiny-yarn.gguf" || exit 70

passed=0; failed=0; skipped=0; broken=""
run_one() {   # name, command...
    name=$1; shift
    out="$CB_TEST_TMP/$(echo "$name" | tr '/' '_').log"
    start=$(date +%s)
    "$@" >"$out" 2>&1
    rc=$?
    p=$(grep -cE '^ok [0-9]+' "$out" | tr -d ' ')
    s=$(grep -cE '^ok [0-9]+.*# SKIP' "$out" | tr -d ' ')
    f=$(grep -cE '^not ok [0-9]+' "$out" | tr -d ' ')
    p=$((p - s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1; echo "# $name exited with status $rc without a failing case"
    fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    printf '%-34s %4d passed %3d failed %3d skipped  (%ss)\n' "$name" "$p" "$f" "$s" $(( $(date +%s) - start ))
    grep -E '^(not ok|#)' "$out" | head -40
    grep -E '# SKIP' "$out" | head -4
    [ "$s" -le 4 ] || echo "# ... and $((s - 4)) more skipped, for the same reason (in $out)"
    [ "$f" -eq 0 ] || broken="$broken $name"
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "unit/$(basename "$t")" "$t"
done
# The same programs built with AddressSanitizer and UBSan (make test builds them);
# an allocation that cannot succeed returns NULL, as it does without ASan.
for t in ${SAN_TESTS:-}; do
    [ -x "build/san/tests/$t" ] || continue
    run_one "san/$t" env ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 "build/san/tests/$t"
done
# The suites check the CPU engine against its references; on a machine
# with a GPU the programs would default to it, so they are pinned to the
# CPU here.  cli/device compares CUDA with the CPU explicitly.
CB_DEVICE=cpu; export CB_DEVICE
unset CB_ACT8 # exact activations: the suites compare with exact references
for t in tests/cli/*.sh; do
    [ -f "$t" ] && [ "$(basename "$t")" != lib.sh ] || continue
    run_one "cli/$(basename "$t" .sh)" sh "$t"
done

# The libFuzzer harnesses, a short pass from their seeds (CB_FUZZ_S
# seconds each, default 2; make fuzz runs them longer).
if [ -n "${CB_FUZZ_DIR:-}" ] && [ -x "$CB_FUZZ_DIR/fuzz_gguf" ]; then
    run_one "fuzz/short" env FUZZ_FRESH=1 sh tests/fuzz/run.sh "$CB_FUZZ_DIR" "${CB_FUZZ_S:-2}"
else
    run_one "fuzz/short" echo "ok 1 - fuzz harnesses # SKIP no clang >= 15 with libFuzzer (make deps installs clang-16 and libclang-rt-16-dev)"
fi

# The headers' shape: the public one's size, no include of a layer above
# (scripts/layers.sh, also make layers).
run_one "style/layers" sh scripts/layers.sh

# The code's format: make format would change nothing (.clang-format, as
# clang-format 14 applies it), one test.
if command -v "${CLANG_FORMAT:-clang-format-14}" >/dev/null 2>&1; then
    run_one "style/format" sh -c 'if make -s --no-print-directory format-check >"$1" 2>&1; then
            echo "ok 1 - make format changes nothing"
        else
            grep -E "error:" "$1" | head -20 | sed "s/^/# /"
            echo "not ok 1 - make format would change files (run make format; details in $1)"
        fi' sh "$CB_TEST_TMP/format-check.out"
else
    run_one "style/format" echo "ok 1 - format # SKIP ${CLANG_FORMAT:-clang-format-14} not installed (make deps installs it)"
fi

[ -z "$broken" ] || echo "failing suites:$broken (logs in tests/tmp/)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
