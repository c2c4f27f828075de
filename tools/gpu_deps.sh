#!/usr/bin/env bash
# Run HERE (the development machine) before a GPU check: downloads the Debian packages the build
# needs beyond what the GPU machine has (it has torch with its CUDA LibTorch, nvcc, cmake, ninja,
# and no package registry) into build-gpu-deps/, which the device tool then carries:
#   bash tools/gpu_deps.sh   # then: run(command="bash tools/gpu_check.sh", carry=["build-gpu-deps"])
# tools/gpu_env.sh unpacks them there into a private prefix; tools/gpu_deps_check.sh checks here
# that the list is complete. `--list` prints the package names and downloads nothing.
# `--runtime`: only the shared libraries the binaries of tools/gpu_bundle.sh link (11 MB less:
# no headers, no libicu-dev), for a call that carries build-gpu-bin/ and compiles nothing there;
# the first H200 call (2026-12-04) needed it to stay under the device tool's 64 MiB. Without a
# usable bundle the machine builds, and then needs the full list. tools/gpu_runtime_check.sh
# checks here that the runtime list holds everything the binaries load.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Each -dev package with the runtime libraries it links (the GPU image is not Debian 12 and has
# none of them, apart from libssl3 and zlib1g, carried anyway so that every .so link resolves
# inside the prefix). pkgconf: `pkg-config`, in case the image has none (cpp-httplib is found
# through it).
packages=(
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libgloo-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libbenchmark-dev libbenchmark1debian
  libicu-dev libicu72
  libonig-dev libonig5
  libssl-dev libssl3 zlib1g-dev zlib1g
  libpng-dev libpng16-16
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1
  pkgconf pkgconf-bin libpkgconf3
)
# What build-gpu-bin/'s binaries load (readelf -d ... | grep NEEDED) beyond glibc, libstdc++ and torch.
runtime=(libspdlog1.10 libfmt9 libicu72 libonig5 libssl3 zlib1g libpng16-16 libcpp-httplib0.11 libbrotli1)
if [ "${1:-}" = "--list" ]; then printf '%s\n' "${packages[@]}"; exit 0; fi
if [ "${1:-}" = "--runtime" ]; then packages=("${runtime[@]}"); fi
out="$root/build-gpu-deps"
rm -rf "$out"
mkdir -p "$out"
cd "$out"
apt-get download "${packages[@]}" >/dev/null
du -sh "$out" | cut -f1 | xargs echo "gpu_deps: $(ls -1 "$out"/*.deb | wc -l) .deb files in $out, size"
