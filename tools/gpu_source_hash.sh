#!/usr/bin/env bash
# Prints one SHA-256 over every file a dschat build compiles from (paths and contents), computed
# the same way here and on the GPU machine (which gets the working tree without .git): a carried
# build-gpu-bin/ is used there only when this matches the SOURCE_HASH it was built with.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
find CMakeLists.txt src include kernels tests benchmarks cmake configs tools/cli -type f \
     ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
