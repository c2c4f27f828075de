#!/usr/bin/env bash
# Run HERE after tools/gpu_bundle.sh and `tools/gpu_deps.sh --runtime`: checks that the carried
# runtime packages hold every shared library the carried binaries load, directly or through one
# another, beyond what the GPU image has itself (glibc, libstdc++/libgcc, torch and CUDA's own).
# It reads the ELF NEEDED entries (readelf), so nothing of this machine's /usr can stand in for a
# missing package, which a plain ldd here would not show.
#   bash tools/gpu_runtime_check.sh    -> "gpu_runtime_check: ok (N libraries from M packages)"
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -f build-gpu-bin/SOURCE_HASH ] || { echo "gpu_runtime_check: run tools/gpu_bundle.sh first" >&2; exit 1; }
ls build-gpu-deps/*.deb > /dev/null 2>&1 || { echo "gpu_runtime_check: run tools/gpu_deps.sh --runtime first" >&2; exit 1; }
unpacked="$(mktemp -d /tmp/dschat_runtime_check_XXXXXX)"
trap 'rm -rf "$unpacked"' EXIT
for deb in build-gpu-deps/*.deb; do dpkg-deb -x "$deb" "$unpacked"; done
python3 - "$unpacked" build-gpu-bin <<'PY'
import os, re, subprocess, sys
prefix, bundle = sys.argv[1], sys.argv[2]
carried = {}
for folder, _, files in os.walk(prefix):
    for name in files:
        if ".so" in name:
            carried[name] = os.path.join(folder, name)
# What the GPU image provides: the C/C++ runtime, and torch's and CUDA's libraries (its torch).
image = re.compile(r"^(ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+|libgcc_s|libtorch|libc10|"
                   r"libcuda|libcudart|libcublas|libnvrtc|libcudnn|libnccl|libgomp|libdschat)")
def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", out)
todo = [os.path.join(folder, name) for folder, _, files in os.walk(bundle) for name in files
        if not os.path.islink(os.path.join(folder, name)) and open(os.path.join(folder, name), "rb").read(4) == b"\x7fELF"]
seen, missing, used = set(), {}, set()
while todo:
    path = todo.pop()
    for lib in needed(path):
        if lib in seen or image.match(lib):
            continue
        seen.add(lib)
        if lib in carried:
            used.add(lib)
            todo.append(carried[lib])
        else:
            missing[lib] = os.path.basename(path)
if missing:
    for lib, by in sorted(missing.items()):
        print(f"gpu_runtime_check: {lib} (needed by {by}) is in no carried package", file=sys.stderr)
    sys.exit(1)
packages = len([name for name in os.listdir("build-gpu-deps") if name.endswith(".deb")])
print(f"gpu_runtime_check: ok ({len(used)} libraries from {packages} packages)")
PY
