#!/usr/bin/env bash
# Run HERE (no GPU needed): compiles the CUDA build that tools/gpu_check.sh runs on the H200, so
# that the device minutes go to running, not compiling (its first build took about 25 minutes on
# 2 cores here, with ccache warm from build/; then seconds to minutes after small changes).
#   bash tools/gpu_bundle.sh        -> build-gpu/ (the CMake build) and build-gpu-bin/ (the carry)
# The .venv's torch is the GPU machine's (2.11.0+cu130), so the binaries link the same LibTorch.
# build-gpu-bin/ mirrors build-gpu/'s layout with stripped copies of what gpu_check.sh runs
# (22 MB), plus SOURCE_HASH (tools/gpu_source_hash.sh of the tree it was built from: gpu_check.sh
# uses the bundle only when its tree hashes the same, and builds on the machine otherwise).
# The binaries hold this checkout's absolute paths (/work/main/...: fixtures, the CLI, the peer
# scripts, the venv's python and torch/lib); gpu_check.sh recreates those paths on the machine
# (tools/gpu_paths.sh). Parquet is off: pyarrow's libarrow (60 MB) would not fit the carry, and no
# GPU check reads Parquet.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
python="$root/.venv/bin/python"
[ -x "$python" ] || { echo "gpu_bundle: no $python (run tools/setup.sh)" >&2; exit 1; }
"$python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" ||
  { echo "gpu_bundle: the .venv's torch has no CUDA; the GPU machine's is 2.11.0+cu130" >&2; exit 1; }

# The targets gpu_check.sh runs; the workers are what some dschat_tests cases start.
targets=(dschat_cli dschat_tests dschat_cuda_tests dschat_tp_worker dschat_generate_worker dschat_dist_worker
         dschat_step3_bench dschat_checkpoint_bench dschat_decode_bench)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCHAT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DDSCHAT_WITH_PARQUET=OFF -DDSCHAT_BUILD_BENCHMARKS=ON -DDSCHAT_PYTHON="$python" > /dev/null
cmake --build build-gpu -j "$(nproc)" $(printf -- '--target %s ' "${targets[@]}")

rm -rf build-gpu-bin
mkdir -p build-gpu-bin
files=(dschat libdschat.so.0.1.0 tests/dschat_tests tests/dschat_cuda_tests tests/dschat_tp_worker
       tests/dschat_generate_worker tests/dschat_dist_worker benchmarks/dschat_step3_bench
       benchmarks/dschat_checkpoint_bench benchmarks/dschat_decode_bench)
for file in "${files[@]}"; do
  [ -f "build-gpu/$file" ] || { echo "gpu_bundle: build-gpu/$file was not built" >&2; exit 1; }
  mkdir -p "build-gpu-bin/$(dirname "$file")"
  strip --strip-unneeded -o "build-gpu-bin/$file" "build-gpu/$file"
done
ln -sfn libdschat.so.0.1.0 build-gpu-bin/libdschat.so.0
ln -sfn libdschat.so.0 build-gpu-bin/libdschat.so
bash tools/gpu_source_hash.sh > build-gpu-bin/SOURCE_HASH
echo "built from: $root" > build-gpu-bin/BUILT_AT
# What a device call sends: the tree (tracked and untracked-not-ignored files) and the carry.
tree_bytes="$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)"
carry_bytes="$(du -scb build-gpu-bin build-gpu-deps 2>/dev/null | tail -n 1 | cut -f1)"
sent_mib=$(( (tree_bytes + carry_bytes) / 1048576 ))
echo "gpu_bundle: a call sends ${sent_mib} MiB (tree and build-gpu-bin, build-gpu-deps) of the device tool's 64"
[ "$sent_mib" -lt 64 ] || { echo "gpu_bundle: over the device tool's 64 MiB" >&2; exit 1; }
echo "gpu_bundle: ok (carry build-gpu-bin and build-gpu-deps)"
