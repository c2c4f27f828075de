#!/usr/bin/env bash
# Run HERE (the development machine) before a GPU check: downloads the Debian packages the build
# needs beyond what the GPU machine has (it has torch with its CUDA LibTorch, nvcc, cmake, ninja,
# and no package registry) into build-gpu-deps/, which the device tool then carries:
#   bash tools/gpu_deps.sh   # then: run(command="bash tools/gpu_check.sh", carry=["build-gpu-deps"])
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/build-gpu-deps"
mkdir -p "$out"
cd "$out"
packages=(nlohmann-json3-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev libgtest-dev
          libgmock-dev libgloo-dev)
apt-get download "${packages[@]}" >/dev/null
ls -1 "$out"/*.deb | wc -l | xargs echo "gpu_deps: .deb files in $out:"
