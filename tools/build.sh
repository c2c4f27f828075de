#!/usr/bin/env bash
# Configures and builds dschat into build/ (Ninja, ccache, precompiled torch headers).
# Runs tools/setup.sh first, so it works on a fresh Debian machine. Extra args go to cmake.
# DSCHAT_BUILD_TARGETS="a b" builds only those targets (tools/demo.sh: just the CLI).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/setup.sh
# ccache must ignore the PCH's timestamps to hit on a rebuild.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Paths relative to the checkout, so a clone in another folder hits the same cache entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
build="${DSCHAT_BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ] || [ "$#" -gt 0 ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
fi
targets=()
for target in ${DSCHAT_BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
