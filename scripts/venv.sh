#!/bin/sh
# venv.sh - make (once) the cached virtual environment with llama-cpp-python,
# which builds llama.cpp from source; prints its path.  Used by the golden
# token generator, `make bench` and `make parity`.
set -eu
VENV=${CB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/cacheblend/venv}
VERSION=0.3.36
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llama_cpp,sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
    echo "$VENV"; exit 0
fi
echo "venv: building llama-cpp-python $VERSION into $VENV (compiles llama.cpp: several minutes) ..." >&2
python3 -m venv "$VENV" >&2
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "llama-cpp-python==$VERSION" >&2
echo "$VENV"
