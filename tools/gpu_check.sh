#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool) from the repository root, with build-gpu-deps/ carried
# (tools/gpu_deps.sh). Builds dschat with CUDA against that machine's torch (2.11+cu130), runs the
# `cuda` tests and the GPU generation benchmark, and writes everything under $OUT (or ./out):
#   build.log, cuda_tests.xml, cuda_tests.log, cpu_smoke.log, generate_bench_gpu.log, nvidia-smi.txt
# Exit status: non-zero when the build or a CUDA test failed (the logs say which).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true

# The carried .debs, unpacked into a private prefix (no root, no registry needed).
prefix="$root/build-gpu-deps/root"
if [ -d build-gpu-deps ] && [ ! -d "$prefix" ]; then
  for deb in build-gpu-deps/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
fi
export CMAKE_PREFIX_PATH="$prefix/usr:${CMAKE_PREFIX_PATH:-}"
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export CPATH="$prefix/usr/include:${CPATH:-}"

python="${DSCHAT_PYTHON:-$(command -v python3)}"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
  > "$out/torch.txt" 2>&1

status=0
{
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCHAT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DDSCHAT_PYTHON="$python" -DDSCHAT_BUILD_BENCHMARKS=ON &&
  cmake --build build-gpu -j "$(nproc)" --target dschat dschat_cli dschat_cuda_tests dschat_generate_bench
} > "$out/build.log" 2>&1 || { echo "gpu_check: build failed (build.log)"; tail -40 "$out/build.log"; exit 1; }

build-gpu/tests/dschat_cuda_tests --gtest_output="xml:$out/cuda_tests.xml" > "$out/cuda_tests.log" 2>&1 || status=1
tail -5 "$out/cuda_tests.log"

# The CLI end to end on the GPU: greedy generation from the bundled checkpoint.
build-gpu/dschat generate --model assets/tiny-opt --prompt "Human: hello Assistant:" --max-new-tokens 8 \
  --device cuda > "$out/cpu_smoke.log" 2>&1 || echo "gpu_check: dschat generate --device cuda failed (cpu_smoke.log)"

# The issue's GPU benchmark: OPT-1.3B shape, bf16, prompt 256 + 256 new tokens, batch 32 and 128,
# dschat vs transformers.generate side by side, and decode's share of the H200's bandwidth.
if [ -x build-gpu/benchmarks/dschat_generate_bench ]; then
  for batch in 32 128; do
    timeout 900 build-gpu/benchmarks/dschat_generate_bench --device cuda --dtype bf16 --model-preset opt-1.3b \
      --batch "$batch" --prompt 256 --new-tokens 256 --peer "$python" >> "$out/generate_bench_gpu.log" 2>&1 ||
      echo "gpu_check: generate benchmark batch $batch failed (generate_bench_gpu.log)"
  done
fi
exit $status
