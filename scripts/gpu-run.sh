#!/bin/sh
# gpu-run.sh [STEP...] - on the device machine: the libraries
# scripts/gpu-pack.sh packed (.gpu/libs.tar.xz), then scripts/gpu-check.sh
# on the NATIVE=0 build it made, each step's log collected into
# $OUT/gpu-check-logs.tar.gz where the device tool gives an $OUT (its files
# come back; the steps' lines and the end of the output come back anyway).
# Exit status: gpu-check.sh's, or 70 when the package is missing.
set -u
cd "$(dirname "$0")/.." || exit 70
[ -f .gpu/libs.tar.xz ] && [ -x build/rel-generic/tests/test_backend_ops ] ||
    { echo "gpu-run: carry .gpu and build/rel-generic (sh scripts/gpu-pack.sh makes them)" >&2; exit 70; }
L=${TMPDIR:-/tmp}/cb-gpu-libs
mkdir -p "$L" && tar -xJf .gpu/libs.tar.xz -C "$L" || exit 70
LD_LIBRARY_PATH="$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GPU_LOG=${GPU_LOG:-gpu-check-logs}
export LD_LIBRARY_PATH GPU_LOG
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "gpu-run: no nvidia-smi"
BUILD=build/rel-generic sh scripts/gpu-check.sh "$@"
rc=$?
[ -n "${OUT:-}" ] && [ -d "$GPU_LOG" ] && tar -czf "$OUT/gpu-check-logs.tar.gz" "$GPU_LOG"
exit $rc
