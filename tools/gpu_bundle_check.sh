#!/usr/bin/env bash
# Run HERE as root after tools/gpu_bundle.sh: checks that the carried binaries run from another
# checkout path with their build paths absent, as on the GPU machine. In a private mount namespace
# /work is an empty tmpfs (so /work/main, the venv and build-gpu/ are gone), the venv is reachable
# only at /opt/dschat-venv (standing in for the machine's own Python with torch), and a copy of
# the tracked files plus build-gpu-bin/ and build-gpu-deps/ sits in /tmp. There it sources what
# gpu_check.sh sources (gpu_env.sh, gpu_paths.sh), then runs the CLI, the CUDA test binary (its
# cases skip without a GPU), a few dschat_tests cases that read fixtures and start the CLI, and
# both GPU benchmarks on small shapes on the CPU.
#   bash tools/gpu_bundle_check.sh    -> "gpu_bundle_check: ok"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "gpu_bundle_check: run as root (mount namespace)" >&2; exit 1; }
[ -f "$root/build-gpu-bin/SOURCE_HASH" ] || { echo "gpu_bundle_check: run tools/gpu_bundle.sh first" >&2; exit 1; }
copy="$(mktemp -d /tmp/dschat_bundle_check_XXXXXX)/main"
mkdir -p "$copy"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy")
cp -a "$root/build-gpu-bin" "$root/build-gpu-deps" "$copy/"
mkdir -p /opt/dschat-venv
unshare -m bash ${DSCHAT_CHECK_TRACE:+-x} -euo pipefail -c '
  mount --bind "$1/.venv" /opt/dschat-venv
  mount -t tmpfs none /work
  root="$2"; cd "$root"
  python=/opt/dschat-venv/bin/python
  source tools/gpu_env.sh
  source tools/gpu_paths.sh
  [ "$gpu_bundle_ok" = 1 ] || { echo "bundle not usable: $gpu_bundle_reason"; exit 1; }
  ls -l /work/main build-gpu .venv/bin/python
  build-gpu/dschat --help > /dev/null
  build-gpu/tests/dschat_cuda_tests --gtest_brief=1 | tail -3
  build-gpu/tests/dschat_tests --gtest_brief=1 \
    --gtest_filter="PipelineConfig.*:CliTest.InfoReportsVersionsAndFeatures:CliTest.GenerateContinuesAPromptWithTheBundledModel" | tail -3
  build-gpu/benchmarks/dschat_decode_bench --preset opt-125m --dtype fp32 --device cpu --batches 1,2 \
    --prompt 8 --new-tokens 4 --iters 1 --warmup 0 | tail -5
  build-gpu/benchmarks/dschat_step3_bench --deployment single_gpu --preset-actor opt-1.3b --actor opt-125m \
    --critic opt-125m --batch 2 --prompt 8 --answer 8 --rounds 1 --iters 1 --warmup 0 \
    --python "$root/.venv/bin/python" --peer "$root/benchmarks/step3_bench_peer.py" | tail -4
' _ "$root" "$copy"
rm -rf "$(dirname "$copy")"
echo "gpu_bundle_check: ok"
