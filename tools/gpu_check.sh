#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool) from the repository root, with build-gpu-deps/ carried
# (tools/gpu_deps.sh here first, then tools/gpu_deps_check.sh to check it is complete):
#   run(command="bash tools/gpu_check.sh", carry=["build-gpu-deps"], timeout_s=590)
# One command, under 10 minutes on the H200: builds dschat with CUDA against that machine's torch
# (2.11+cu130, sm_90 only). Building there rather than carrying a build made here: the binaries
# would fit the 64 MiB carry (libdschat 6 MB, test binaries 25 MB), but they hold this checkout's
# absolute paths (fixtures, assets, the CLI), link this machine's venv and Debian's spdlog/fmt/ICU,
# and the build is ~25 min of CPU, a few minutes on 16 cores. Not yet measured on the machine.
# then runs, each step bounded by its own timeout so that one hang still leaves the rest's results:
#   1. dschat_cuda_tests: kernels vs ATen, CUDA-graph decode vs eager (OPT and LLaMA), the
#      sync-debug run of SFT, RM and PPO (fails on any unmarked host sync), HybridEngine's 100
#      switches with flat GPU memory;
#   2. dschat_tests' per-device cases on cuda (*OnDevice*/cuda): fp32 steps vs the CPU, bf16/fp16
#      learning, greedy ids vs transformers, HybridEngine;
#   3. the embedded demo end to end on the GPU (`dschat train --device cuda`);
#   4. the step-3 benchmark on the GPU against transformers + PyTorch on the same GPU;
#   5. the checkpoint stall benchmark on the GPU (async snapshot into pinned memory vs sync save).
# Writes under $OUT (or ./out): summary.txt (one line per part: ok/FAILED and its figures), and
# each part's log/XML/JSON. Exit status non-zero when any part failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/out}"
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true

# The carried .debs (tools/gpu_deps.sh), unpacked into a private prefix (no root, no registry).
source "$root/tools/gpu_env.sh"

python="${DSCHAT_PYTHON:-$(command -v python3)}"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
  > "$out/torch.txt" 2>&1
note "machine: $(cat "$out/torch.txt")"

status=0
start=$(date +%s)
if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCHAT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DDSCHAT_PYTHON="$python" -DDSCHAT_BUILD_BENCHMARKS=ON > "$out/build.log" 2>&1 &&
   cmake --build build-gpu -j "$(nproc)" --target dschat_cli dschat_tests dschat_cuda_tests dschat_step3_bench \
     dschat_checkpoint_bench \
     >> "$out/build.log" 2>&1; then
  note "build: ok ($(( $(date +%s) - start )) s)"
else
  note "build: FAILED (build.log)"; tail -40 "$out/build.log"; exit 1
fi

# part NAME TIMEOUT COMMAND...: runs one part, logs to NAME.log, records ok/FAILED and the time.
part() {
  local name="$1" limit="$2"; shift 2
  local t0=$(date +%s)
  if timeout "$limit" "$@" > "$out/$name.log" 2>&1; then
    note "$name: ok ($(( $(date +%s) - t0 )) s)"
  else
    note "$name: FAILED rc=$? ($(( $(date +%s) - t0 )) s; $name.log)"; status=1
    tail -15 "$out/$name.log"
  fi
}

part cuda_tests 240 build-gpu/tests/dschat_cuda_tests --gtest_output="xml:$out/cuda_tests.xml"
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/cuda_tests.log" | tee -a "$summary"
part on_device_tests 180 build-gpu/tests/dschat_tests --gtest_filter='*OnDevice*/cuda:*Cuda*:*AsyncCheckpointOn*/cuda' \
  --gtest_output="xml:$out/on_device_tests.xml"
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/on_device_tests.log" | tee -a "$summary"
part demo_on_gpu 300 build-gpu/dschat train --device cuda --no-progress --output-dir "$out/demo_output"
grep -E "Finished Step|held-out|device:" "$out/demo_on_gpu.log" | tee -a "$summary"
rm -rf "$out/demo_output"  # models and checkpoints: too large to bring back, the log says what ran
part step3_bench_gpu 240 build-gpu/benchmarks/dschat_step3_bench --device cuda --actor opt-350m --critic opt-125m \
  --batch 16 --prompt 128 --answer 128 --rounds 1 --iters 2 --warmup 1 --python "$python" \
  --out "$out/step3_bench_gpu.json"
grep -E "^\| |sequences/s" "$out/step3_bench_gpu.log" | tee -a "$summary"
part checkpoint_bench_gpu 120 build-gpu/benchmarks/dschat_checkpoint_bench --device cuda --model opt-350m --steps 8 \
  --save-every 4 --batch 4 --seq 256 --rounds 1 --dir "$root/build-gpu/checkpoint_bench" \
  --out "$out/checkpoint_bench_gpu.json"
grep -E "^\| |stall per save" "$out/checkpoint_bench_gpu.log" | tee -a "$summary"
exit $status
