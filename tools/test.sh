#!/usr/bin/env bash
# The quick start's second command: set up, build, run every test (ctest; labels cpu, cuda,
# slow, multiproc; the cuda tests skip without a GPU). Extra args go to ctest (e.g. -L cpu).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Benchmarks are not built here: no test runs them, and CI's 2 cores have 30 minutes for all of
# this (build them with `bash tools/build.sh -DDSCHAT_BUILD_BENCHMARKS=ON`).
bash tools/build.sh -DDSCHAT_BUILD_BENCHMARKS=OFF
ctest --test-dir "${DSCHAT_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" "$@"
