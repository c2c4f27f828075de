# Sourced by tools/gpu_check.sh on the GPU machine, with $root and $python set: makes the binaries
# that tools/gpu_bundle.sh built here (build-gpu-bin/, carried) runnable there. They hold absolute
# paths of the checkout they were built in (BUILT_AT: /work/main/...): the fixtures, the CLI the
# tests start, the peer scripts, the venv's python and its torch/lib in their RUNPATH. So:
#   - that checkout path is made a link to this one (when it is not this one);
#   - build-gpu is a link to build-gpu-bin (the layout gpu_bundle.sh mirrored);
#   - .venv/bin/python runs this machine's python, and the venv's torch/lib path is a link to
#     this machine's torch/lib (the same torch 2.11.0+cu130, built for another Python only);
#   - LD_LIBRARY_PATH adds torch/lib, the CUDA runtime of torch's nvidia packages and the toolkit.
# Sets gpu_bundle_ok=1 when all of that holds and no library is missing (ldd), else 0 with the
# reason in gpu_bundle_reason; gpu_check.sh then builds on the machine instead.
gpu_bundle_ok=0
gpu_bundle_reason=""
gpu_bundle_setup() {
  local bin="$root/build-gpu-bin"
  [ -f "$bin/SOURCE_HASH" ] || { gpu_bundle_reason="no build-gpu-bin/ carried"; return; }
  local want have
  want="$(cat "$bin/SOURCE_HASH")"
  have="$(bash "$root/tools/gpu_source_hash.sh")"
  [ "$want" = "$have" ] || { gpu_bundle_reason="build-gpu-bin/ was built from other sources ($want, here $have)"; return; }
  local built_root
  built_root="$(sed -n 's/^built from: //p' "$bin/BUILT_AT")"
  if [ "$built_root" != "$root" ]; then
    if [ -e "$built_root" ] && [ ! "$built_root" -ef "$root" ]; then
      gpu_bundle_reason="$built_root exists here and is not this checkout"; return
    fi
    mkdir -p "$(dirname "$built_root")" && ln -sfn "$root" "$built_root" ||
      { gpu_bundle_reason="cannot link $built_root to $root"; return; }
  fi
  if [ -e "$root/build-gpu" ] && [ ! -L "$root/build-gpu" ]; then
    gpu_bundle_reason="build-gpu/ exists as a folder"; return
  fi
  ln -sfn build-gpu-bin "$root/build-gpu"
  local torch_lib venv_torch
  torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" ||
    { gpu_bundle_reason="$python cannot import torch"; return; }
  # The venv paths the binaries name (their RUNPATH, and DSCHAT_PYTHON for the tests' oracles).
  venv_torch="$(readelf -d "$bin/libdschat.so.0.1.0" | tr ':[]' '\n\n\n' | grep -m1 '/.venv/.*/torch/lib$')"
  if [ -n "$venv_torch" ] && [ ! -e "$venv_torch" ]; then
    mkdir -p "$(dirname "$venv_torch")" && ln -sfn "$torch_lib" "$venv_torch"
  fi
  if [ ! -e "$root/.venv/bin/python" ]; then
    mkdir -p "$root/.venv/bin"
    printf '#!/bin/sh\nexec "%s" "$@"\n' "$python" > "$root/.venv/bin/python"
    chmod +x "$root/.venv/bin/python"
  fi
  local nvidia_libs
  nvidia_libs="$(ls -d "$(dirname "$torch_lib")"/../nvidia/*/lib 2>/dev/null | tr '\n' ':')"
  export LD_LIBRARY_PATH="$torch_lib:${nvidia_libs}/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local missing
  missing="$(for f in dschat tests/dschat_tests tests/dschat_cuda_tests benchmarks/dschat_step3_bench; do
               ldd "$bin/$f" | grep 'not found' || true; done | sort -u | tr '\n' ' ')"
  [ -z "$missing" ] || { gpu_bundle_reason="libraries not found: $missing"; rm -f "$root/build-gpu"; return; }
  gpu_bundle_ok=1
}
gpu_bundle_setup
