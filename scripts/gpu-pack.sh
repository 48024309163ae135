#!/bin/sh
# gpu-pack.sh - what a session with a GPU carries to the device machine
# (issue 34).  That machine has CUDA, cuBLAS and Python but no network and
# not every library our programs link, and its CPU may differ from this
# one.  So: a NATIVE=0 CUDA=1 build (build/rel-generic), and the shared
# libraries its programs load beyond the C and C++ runtimes and CUDA's own
# (OpenBLAS, loaded on first use, and its Fortran runtime included), packed
# into .gpu/libs.tar.xz, which scripts/gpu-run.sh unpacks there.
#
#   sh scripts/gpu-pack.sh                     (here, once per change)
#   device run, carry: .gpu build/rel-generic/bin build/rel-generic/tests
#                      build/rel-generic/bench build/rel-generic/lib/libcbcore-cuda.so
#                      (about 45 MB with the working tree; the limit is 64 MiB)
#   commands (a session's device time is short: the figures first):
#            STEP_TIMEOUT=120 sh scripts/gpu-run.sh ops ops-cublas device
#            STEP_TIMEOUT=400 sh scripts/gpu-run.sh quick
#            STEP_TIMEOUT=150 sh scripts/gpu-run.sh memcheck initcheck synccheck
#            then, as time allows, bench blend racecheck
#
# Exit status: 0, or the build's or tar's.
set -eu
cd "$(dirname "$0")/.."
make -j"$(nproc 2>/dev/null || echo 2)" NATIVE=0 CUDA=1 check-tools
B=build/rel-generic
mkdir -p .gpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
blas=$(ldconfig -p | awk '$1 == "libopenblas.so.0" { print $NF; exit }')
for f in "$B"/bin/* "$B"/tests/* "$B"/bench/* "$B"/lib/*.so ${blas:+"$blas"}; do
    [ -f "$f" ] && ldd "$f" 2>/dev/null | awk '$3 ~ /^\// { print $3 }'
    [ "$f" = "$blas" ] && echo "$f"
done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnvrtc)\.so' |
    while read -r lib; do
        cp -L "$lib" "$tmp/$(basename "$lib")"
    done
tar -cJf .gpu/libs.tar.xz -C "$tmp" .
echo "gpu-pack: .gpu/libs.tar.xz ($(du -k .gpu/libs.tar.xz | cut -f1) KB: $(ls "$tmp" | tr '\n' ' '))"
set -- .gpu "$B/bin" "$B/tests" "$B/bench" "$B/lib/libcbcore-cuda.so"
echo "gpu-pack: carry $* ($(du -csk "$@" | tail -1 | cut -f1) KB); run sh scripts/gpu-run.sh STEP..."
