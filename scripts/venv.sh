#!/bin/sh
# venv.sh - make (once) the cached virtual environment with llama-cpp-python,
# which builds llama.cpp from source; prints its path.  Used by the golden
# token generator, `make bench` and `make parity`.
#
# llama.cpp's AMX matrix kernels crash (SIGSEGV in ggml_backend_amx_mul_mat)
# on this project's VMs, whose CPUs report AMX: there llama.cpp is built for
# the CPU's AVX/AVX-512 features one by one instead of -march=native, which
# would select them.
set -eu
VENV=${CB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/venv}
VERSION=0.3.36
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp,numpy,sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
    echo "$VENV"; exit 0
fi
args=""
if grep -q amx_tile /proc/cpuinfo 2>/dev/null; then
    args="-DGGML_NATIVE=OFF"
    has() { grep -qw "$1" /proc/cpuinfo; }
    has avx && args="$args -DGGML_AVX=ON"
    has avx2 && args="$args -DGGML_AVX2=ON"
    has fma && args="$args -DGGML_FMA=ON"
    has f16c && args="$args -DGGML_F16C=ON"
    has avx512f && args="$args -DGGML_AVX512=ON"
    has avx512vbmi && args="$args -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && args="$args -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args="$args -DGGML_AVX512_BF16=ON"
    has avx_vnni && args="$args -DGGML_AVX_VNNI=ON"
fi
echo "venv: building llama-cpp-python $VERSION into $VENV (compiles llama.cpp: several minutes) ..." >&2
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check numpy >&2
CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$VERSION" >&2
"$VENV/bin/pip" install --quiet --disable-pip-version-check "llama-cpp-python==$VERSION" >&2
echo "$VENV"
