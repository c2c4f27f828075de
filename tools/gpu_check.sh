#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool) from the repository root. Prepare here first:
#   bash tools/gpu_deps.sh --runtime  # the libraries the carried binaries load -> build-gpu-deps/
#                                     # (without --runtime: the -dev packages a build there needs too,
#                                     #  68 MiB with the bundle: over the device tool's 64)
#   bash tools/gpu_bundle.sh        # the CUDA build, compiled here -> build-gpu-bin/ (~20 MB)
# then one call:
#   run(command="bash tools/gpu_check.sh", carry=["build-gpu-deps", "build-gpu-bin"], timeout_s=590)
# With a build-gpu-bin/ of these very sources (SOURCE_HASH) the machine compiles nothing
# (tools/gpu_paths.sh makes its paths resolve there); otherwise it builds (sm_90, its own torch:
# ~25 CPU-minutes, a few minutes on 16 cores). Every part runs under its own timeout and inside
# one overall budget (DSCHAT_GPU_BUDGET seconds, default 470: the issue's 8 minutes less the
# start), most important first, so one hang or a slow part still leaves the rest's results:
#   1. cuda_tests: kernels vs ATen, CUDA-graph decode vs eager (static and continuous engines), the sync-debug
#      run of SFT, RM and PPO (fails on any unmarked host sync), HybridEngine's 100 switches;
#   2. on_device_tests: dschat_tests' per-device cases on cuda (fp32 steps vs the CPU, bf16/fp16
#      learning, greedy ids vs transformers, HybridEngine, async checkpoints);
#   3. step3: DeepSpeed-Chat's benchmark setting (single_gpu preset: actor OPT-1.3B, critic and
#      reward OPT-350M, prompt 256 + answer 256, batch 16, LoRA 128, actor gradient checkpointing,
#      hybrid engine) in bf16, dschat vs transformers + PyTorch on this GPU, and one more dschat
#      iteration under LibTorch's profiler (kernels by name per phase, the GPU's idle fraction);
#   4. decode: decode-step bandwidth of OPT-1.3B at batch 1, 32, 128, eager and CUDA-graph;
#      decode_continuous: the same through the continuous engine at batch 1, 32, eager and graphs;
#   5. demo_on_gpu: the embedded demo end to end (`dschat train --device cuda`);
#   6. step3_graph: row 3's dschat side with CUDA-graph decode (before/after in one run);
#   7. step3_large: dschat at the largest batch that fits (128, else 64);
#   8. checkpoint: the checkpoint stall (async snapshot into pinned memory vs a sync save);
#   9. actor_6.7b, actor_13b: the largest actor, single_node presets (ZeRO-3, LoRA on 13b),
#      inference_tp_size 1 on one GPU, dschat alone, with its peak memory.
# A second, corrected run takes only some parts: DSCHAT_GPU_PARTS=step3,decode (names as below;
# step3_large64 and the actor tries are parts of their own).
# Writes under $OUT (or ./out): summary.txt (one line per part: ok/FAILED/skipped, its time and
# figures, also printed) and results.tgz (each part's log, gtest XML and JSON under parts/: the
# device tool brings back at most 8 files). Exit status non-zero when any part failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
results="${OUT:-$root/out}"
out="$results/parts"
mkdir -p "$out"
summary="$results/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
pack() { tar -czf "$results/results.tgz" -C "$results" parts && rm -rf "$out"; }
trap pack EXIT
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
check_start=$(date +%s)
deadline=$(( check_start + ${DSCHAT_GPU_BUDGET:-470} ))

# The carried .debs (tools/gpu_deps.sh), unpacked into a private prefix (no root, no registry).
source "$root/tools/gpu_env.sh"
python="${DSCHAT_PYTHON:-$(command -v python3)}"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
  > "$out/torch.txt" 2>&1
note "machine: $(cat "$out/torch.txt")"

source "$root/tools/gpu_paths.sh"
if [ "$gpu_bundle_ok" = 1 ]; then
  note "build: carried build-gpu-bin/ ($(cat build-gpu-bin/BUILT_AT)), nothing compiled here"
else
  note "build: building here ($gpu_bundle_reason)"
  start=$(date +%s)
  if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCHAT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
       -DDSCHAT_WITH_PARQUET=OFF -DDSCHAT_PYTHON="$python" -DDSCHAT_BUILD_BENCHMARKS=ON > "$out/build.log" 2>&1 &&
     cmake --build build-gpu -j "$(nproc)" --target dschat_cli dschat_tests dschat_cuda_tests dschat_tp_worker \
       dschat_generate_worker dschat_dist_worker dschat_step3_bench dschat_checkpoint_bench dschat_decode_bench \
       >> "$out/build.log" 2>&1; then
    note "build: ok ($(( $(date +%s) - start )) s)"
  else
    note "build: FAILED (build.log)"; tail -40 "$out/build.log"; exit 1
  fi
fi

status=0
# part NAME LIMIT COMMAND...: runs one part under min(LIMIT, what is left of the budget), logs to
# NAME.log, records ok/FAILED/skipped and the time. try NAME LIMIT COMMAND...: the same for a
# part whose failure is a finding (a batch or a model that does not fit), not a failed check.
try() { probing=1 part "$@"; }
part() {
  local name="$1" limit="$2"; shift 2
  if [ -n "${DSCHAT_GPU_PARTS:-}" ] && [[ ",$DSCHAT_GPU_PARTS," != *",$name,"* ]]; then return 1; fi
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 30 ]; then note "$name: skipped (budget spent)"; return 1; fi
  [ "$limit" -le "$left" ] || limit="$left"
  local t0=$(date +%s) rc=0
  timeout "$limit" "$@" > "$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    note "$name: ok ($(( $(date +%s) - t0 )) s)"
  elif [ "${probing:-0}" = 1 ]; then
    note "$name: did not run through, rc=$rc ($(( $(date +%s) - t0 )) s of $limit): $(grep -v '^frame #' "$out/$name.log" | tail -n 1)"
  else
    note "$name: FAILED rc=$rc ($(( $(date +%s) - t0 )) s of $limit; $name.log)"; status=1
    tail -15 "$out/$name.log"
  fi
  return "$rc"
}
table() { grep -E "^\| |sequences/s|^actor " "$out/$1.log" | tee -a "$summary"; }
gtest_summary() {
  [ -f "$out/$1.log" ] || return 0
  grep -E "^\[  PASSED  \] [0-9]+ test|^\[  SKIPPED \] [0-9]+ test|^\[  FAILED  \]" "$out/$1.log" | sort -u | tee -a "$summary"
}

bench="build-gpu/benchmarks"
work="$root/build-gpu-work"  # the random 1.3B/350M checkpoints (written once for the step3 rows), the demo's output
mkdir -p "$work"
threads="$(nproc)"  # host threads of both sides (random init of the large models is on the host)
step3=("$bench/dschat_step3_bench" --device cuda --dtype bf16 --deployment single_gpu --actor opt-1.3b
       --critic opt-350m --rounds 1 --warmup 1 --threads "$threads" --work-dir "$work" --python "$python"
       --peer "$root/benchmarks/step3_bench_peer.py")

part cuda_tests 100 build-gpu/tests/dschat_cuda_tests --gtest_output="xml:$out/cuda_tests.xml"
gtest_summary cuda_tests
part on_device_tests 100 build-gpu/tests/dschat_tests --gtest_filter='*OnDevice*/cuda:*Cuda*:*AsyncCheckpointOn*/cuda' \
  --gtest_output="xml:$out/on_device_tests.xml"
gtest_summary on_device_tests
part step3 170 "${step3[@]}" --iters 2 --profile --out "$out/step3.json" && table step3
part decode 60 "$bench/dschat_decode_bench" --preset opt-1.3b --dtype bf16 --device cuda --batches 1,32,128 \
  --prompt 256 --new-tokens 256 --iters 2 --warmup 1 --out "$out/decode.json" && table decode
part decode_continuous 60 "$bench/dschat_decode_bench" --preset opt-1.3b --dtype bf16 --device cuda --batches 1,32 \
  --prompt 256 --new-tokens 256 --iters 2 --warmup 1 --modes continuous,continuous-graph \
  --out "$out/decode_continuous.json" && table decode_continuous
part demo_on_gpu 90 build-gpu/dschat train --device cuda --no-progress --output-dir "$work/demo"
[ -f "$out/demo_on_gpu.log" ] && grep -E "Finished Step|held-out|device:" "$out/demo_on_gpu.log" | tee -a "$summary"
part step3_graph 60 "${step3[@]}" --iters 2 --no-peer --cuda-graph --out "$out/step3_graph.json" && table step3_graph
try step3_large 80 "${step3[@]}" --no-peer --batch 128 --iters 1 --out "$out/step3_large.json" && table step3_large ||
  { try step3_large64 60 "${step3[@]}" --no-peer --batch 64 --iters 1 --out "$out/step3_large.json" && table step3_large64; }
part checkpoint 45 "$bench/dschat_checkpoint_bench" --device cuda --model opt-350m --steps 8 --save-every 4 --batch 4 \
  --seq 256 --rounds 1 --dir "$work/checkpoint_bench" --out "$out/checkpoint.json" &&
  grep -E "^\| |stall per save" "$out/checkpoint.log" | tee -a "$summary"
largest=("$bench/dschat_step3_bench" --device cuda --dtype bf16 --deployment single_node --critic opt-350m --no-peer
         --rounds 1 --iters 1 --warmup 0 --threads "$threads" --set inference_tp_size=1)
try actor_6.7b 90 "${largest[@]}" --actor opt-6.7b --out "$out/actor_6.7b.json" && table actor_6.7b
try actor_13b 120 "${largest[@]}" --actor opt-13b --out "$out/actor_13b.json" && table actor_13b
note "total: $(( $(date +%s) - check_start )) s"
rm -rf "$work"  # checkpoints and demo models: too large to bring back
exit $status
