#!/bin/sh
# deps.sh - install the Debian packages that building and testing cacheblend
# need.  Idempotent: prints nothing and changes nothing when all are present.
set -e
pkgs="build-essential pkg-config libpcre2-dev libxxhash-dev libarchive-dev libopenblas-dev
      libjansson-dev libsqlite3-dev libhiredis-dev libsimde-dev libssl-dev libzstd-dev redis-server stunnel4 zstd unzip gnuplot-nox python3
      python3-venv python3-pip python3-cryptography ca-certificates"
# libzstd-dev: the coded KV element type's entropy coder (zstd's literal stage).
# libssl-dev: libcrypto (AES-256-GCM, HKDF, random bytes) for the shared tier's
# sealed entries; python3-cryptography: tests/cli/redis-seal.sh decrypts an
# entry on its own; stunnel4: tests/cli/redis-auth.sh's TLS tunnel.
# make fuzz: clang 15 or later (x86 _Float16) and its libFuzzer runtime;
# make fuzz-cov: llvm-N (llvm-profdata, llvm-cov); make memcheck: valgrind.
# The first clang-N installed, else one apt has.
fz=""
for v in 16 17 18 19 15; do
    if dpkg-query -W -f='${Status}' "clang-$v" 2>/dev/null | grep -q "install ok installed"; then
        fz="clang-$v libclang-rt-$v-dev llvm-$v"; break
    fi
done
if [ -z "$fz" ]; then
    for v in 16 17 18 19 15; do
        apt-cache show "clang-$v" >/dev/null 2>&1 && { fz="clang-$v libclang-rt-$v-dev llvm-$v"; break; }
    done
fi
# make format and its check in make test: clang-format 14 exactly (other
# versions format differently; the check is skipped without it).
cf=""
apt-cache show clang-format-14 >/dev/null 2>&1 && cf=clang-format-14
pkgs="$pkgs $fz $cf valgrind"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
# python3/pip may come from elsewhere (pyenv): only insist on them when absent.
if command -v python3 >/dev/null 2>&1; then
    missing=$(echo "$missing" | tr ' ' '\n' | grep -vE '^(python3|python3-venv|python3-pip)$' | tr '\n' ' ')
    missing=$(echo $missing)
    [ -z "$missing" ] && exit 0
fi
echo "deps: installing:$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
