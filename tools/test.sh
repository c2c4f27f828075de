#!/usr/bin/env bash
# The quick start's second command: set up, build, run every test (ctest; labels cpu, cuda,
# slow, multiproc; the cuda tests skip without a GPU). Extra args go to ctest (e.g. -L cpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/build.sh
ctest --test-dir "${DSCHAT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
