#!/bin/sh
# gpu-check.sh [STEP...] - what a session with a GPU runs first (issue 34):
#   build     nvidia-smi, then the CUDA module and every test program (CUDA=1)
#   ops       test_backend_ops: every CUDA operation against the CPU
#   memcheck racecheck synccheck initcheck
#             test_backend_ops under compute-sanitizer's four tools
#   device    tests/cli/device.sh: CPU vs CUDA end to end, on fixtures
#   suites    every unit and CLI suite (tests/run.sh, no apt-get, no fuzzing)
#   bench     bench_engine on CUDA and on the CPU, warm, on a random-weight
#             model of SmolLM2-135M's shape and of Qwen2.5-1.5B's (the
#             engine's time does not depend on the weights' values; the
#             device machine cannot be sent the models: 64 MB at most):
#             prefill 512/2048/4096, decode after 512/4096, 16..512-row
#             batches
# No STEP: all of them, in that order.  Each step's output goes to
# $GPU_LOG (default gpu-check-logs/STEP.log) and a line "STEP: ok|FAILED
# (N s)" to standard output; the exit status is 1 when a step failed.  The
# device machine has no network and a 10-minute limit a command: run the
# steps one or two at a time there (sh scripts/gpu-check.sh build ops).
set -u
cd "$(dirname "$0")/.." || exit 70
LOG=${GPU_LOG:-gpu-check-logs}
mkdir -p "$LOG"
S=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
J=$(nproc 2>/dev/null || echo 2)
CB_CUDA_MODULE=$PWD/lib/libcbcore-cuda.so
export CB_CUDA_MODULE
OPS=build/rel/tests/test_backend_ops
SAN_ARGS="--target-processes application-only"
failed=0

step() { # NAME CMD...: run CMD, log it, say how it went
    name=$1; shift
    t0=$(date +%s)
    if "$@" > "$LOG/$name.log" 2>&1; then
        echo "$name: ok ($(($(date +%s) - t0)) s)"
    else
        echo "$name: FAILED ($(($(date +%s) - t0)) s; $LOG/$name.log)"; tail -5 "$LOG/$name.log" | sed 's/^/    /'
        failed=1
    fi
}

build() { nvidia-smi && make -j"$J" CUDA=1 check-tools; }
ops() { "$OPS"; }
memcheck() { "$S" --tool memcheck --leak-check full $SAN_ARGS --error-exitcode 1 "$OPS"; }
racecheck() { "$S" --tool racecheck --racecheck-report all $SAN_ARGS --error-exitcode 1 "$OPS"; }
synccheck() { "$S" --tool synccheck $SAN_ARGS --error-exitcode 1 "$OPS"; }
initcheck() { "$S" --tool initcheck $SAN_ARGS --error-exitcode 1 "$OPS"; }
device() { BUILD=build/rel BINDIR_B=bin CB_TEST_TMP=$PWD/tests/tmp sh tests/cli/device.sh; }
suites() { BUILD=build/rel BINDIR_B=bin CB_CUDA_MOD=lib/libcbcore-cuda.so sh tests/run.sh; }
bench() {
    d=$(mktemp -d) || return 1
    # shapes: SmolLM2-135M (30 layers, 576 wide, 9/3 heads; q8_0, as 576 is no multiple of 256) and
    # Qwen2.5-1.5B (28 layers, 1536 wide, 12/2 heads, 8960 ff; q4_K)
    build/rel/tests/cb-gen-fixture --type q8_0 --layers 30 --embd 576 --ff 1536 --heads 9 --kv-heads 3 \
        --vocab 49152 --ctx 8192 "$d/smol.gguf" &&
        build/rel/tests/cb-gen-fixture --arch qwen2 --type q4_K --layers 28 --embd 1536 --ff 8960 --heads 12 \
            --kv-heads 2 --vocab 151936 --untied --ctx 8192 "$d/qwen15.gguf" || { rm -rf "$d"; return 1; }
    for m in smol qwen15; do
        for dev in cuda cpu; do
            echo "== $m-shaped, random weights, on $dev ($J threads beside it); each scenario twice, the second kept"
            for sc in prefill:512 prefill:2048 prefill:4096 decode:512:64 decode:4096:64 batch:16:2048 \
                batch:64:2048 batch:512:2048; do
                CB_BENCH_DEVICE=$dev build/rel/bench/bench_engine "$d/$m.gguf" "$J" "$sc" "$sc" |
                    awk -v sc="$sc" '$1 != "device" && $1 != "load_s" && $1 != "rss_kb" { v[$1] = $2 }
                        END { for (k in v) print "  " sc ": " k " " v[k] }'
            done
        done
    done
    rm -rf "$d"
}

steps=${*:-build ops memcheck racecheck synccheck initcheck device suites bench}
for s in $steps; do
    case $s in
    build | ops | memcheck | racecheck | synccheck | initcheck | device | suites | bench) step "$s" "$s" ;;
    *) echo "gpu-check: unknown step '$s'" >&2; exit 64 ;;
    esac
done
exit $failed
