#!/usr/bin/env bash
# Run HERE, as root, after tools/gpu_deps.sh: checks that build-gpu-deps/ carries every Debian
# package the GPU build needs, before device minutes are spent finding out. The GPU machine has
# none of them, so this machine's own copies are hidden (an overlay on /usr, in a private mount
# namespace, whose whiteouts remove every file of the carried packages); tools/gpu_env.sh then
# sets up the prefix exactly as tools/gpu_check.sh does there, and the targets gpu_check.sh builds
# (CPU flavour: no nvcc here that a CUDA LibTorch could pair with) are configured, built and run
# against it. libssl3 and zlib1g stay visible: the GPU image's Python needs them, and so do this
# machine's tools before the prefix is on the loader's path.
#   bash tools/gpu_deps_check.sh [BUILD_DIR]   (default build-gpu-deps-check; ~30 min cold on 2 cores, seconds after)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work=/tmp/dschat-gpu-deps-check
if [ "${1:-}" != "--inside" ]; then
  [ "$(id -u)" = 0 ] || { echo "gpu_deps_check: needs root (a mount namespace and an overlay)" >&2; exit 1; }
  [ -d "$root/build-gpu-deps" ] || { echo "gpu_deps_check: run tools/gpu_deps.sh first" >&2; exit 1; }
  rm -rf "$work"
  mkdir -p "$work/upper" "$work/work"
  for pkg in $(bash "$root/tools/gpu_deps.sh" --list); do
    case "$pkg" in libssl3 | zlib1g) continue ;; esac
    dpkg-query -L "$pkg" 2> /dev/null || true
  done | while read -r path; do
    path="/usr${path#/usr}"  # merged /usr: /lib/x86_64-linux-gnu/... is /usr/lib/x86_64-linux-gnu/...
    { [ -e "$path" ] || [ -L "$path" ]; } || continue
    { [ -d "$path" ] && [ ! -L "$path" ]; } && continue  # folders stay, emptied
    mkdir -p "$(dirname "$work/upper${path#/usr}")"
    mknod "$work/upper${path#/usr}" c 0 0  # an overlay whiteout: the file does not exist above
  done
  echo "gpu_deps_check: hiding $(find "$work/upper" -type c | wc -l) files of the carried packages"
  exec unshare -m --propagation private bash -c \
    'mount -t overlay overlay -o "lowerdir=/usr,upperdir=$1/upper,workdir=$1/work" /usr && exec bash "$2" --inside "$3"' \
    _ "$work" "$0" "${1:-build-gpu-deps-check}"
fi

build="$root/${2:-build-gpu-deps-check}"
for hidden_file in /usr/include/httplib.h /usr/include/spdlog/spdlog.h /usr/include/unicode/uchar.h /usr/include/oniguruma.h \
                   /usr/lib/x86_64-linux-gnu/libcpp-httplib.so.0.11 /usr/bin/pkgconf; do
  [ ! -e "$hidden_file" ] || { echo "gpu_deps_check: $hidden_file is still visible" >&2; exit 1; }
done
export DSCHAT_GPU_DEPS_PREFIX="$work/prefix"
cd "$root"
source "$root/tools/gpu_env.sh"
echo "gpu_deps_check: prefix $gpu_deps_prefix; pkg-config: $(command -v pkg-config)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSCHAT_WITH_CUDA=OFF \
  -DDSCHAT_PYTHON="$root/.venv/bin/python" -DDSCHAT_BUILD_BENCHMARKS=ON > "$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log"; echo "gpu_deps_check: configure FAILED ($work/configure.log)" >&2; exit 1; }
echo "gpu_deps_check: configure ok"
cmake --build "$build" --target dschat_cli dschat_tests dschat_step3_bench dschat_checkpoint_bench
# Every library the binaries load resolves, and each one the prefix carries comes from it.
failed=0
for binary in "$build/dschat" "$build/libdschat.so" "$build/tests/dschat_tests" \
              "$build/benchmarks/dschat_step3_bench" "$build/benchmarks/dschat_checkpoint_bench"; do
  if ldd "$binary" | grep -q "not found"; then
    echo "gpu_deps_check: $binary: $(ldd "$binary" | grep "not found" | tr -s ' \t' ' ')" >&2; failed=1
  fi
done
for lib in libcpp-httplib.so.0.11 libspdlog.so.1.10 libfmt.so.9 libicuuc.so.72 libonig.so.5 libpng16.so.16 libbrotlidec.so.1; do
  ldd "$build/libdschat.so" | grep -q "$lib => $gpu_deps_prefix/" ||
    { echo "gpu_deps_check: $lib not loaded from the prefix" >&2; failed=1; }
done
"$build/dschat" --help > /dev/null && echo "gpu_deps_check: dschat runs"
"$build/tests/dschat_tests" --gtest_filter='TextStream*:ChatTemplate*:OpenAiProtocol*:BatchScheduler*:StepHooks*:TokenizerGpt2*:LoggingTest*:TrainingPlot*:ParquetRows*' --gtest_brief=1
if [ "$failed" = 0 ]; then echo "gpu_deps_check: ok"; else echo "gpu_deps_check: FAILED" >&2; fi
exit $failed
