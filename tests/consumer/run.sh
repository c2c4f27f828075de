#!/usr/bin/env bash
# ctest install_consumer_Slow: installs the build into a temporary prefix and checks that the
# install stands alone and works as a CMake package (docs/packaging.md).
#   (a) the installed files: no *.cmake file, no RUNPATH/RPATH and no DT_NEEDED of an installed ELF
#       file names the source dir, the build dir or the venv (DSCHAT_INSTALL_TORCH_RPATH's own
#       entries excepted); DT_NEEDED entries are bare sonames; dschatConfig.cmake does
#       find_dependency(Torch) and find_dependency(nlohmann_json); a CPU-only package names no
#       CUDA; libdschat's direct dependencies resolve with only LibTorch on LD_LIBRARY_PATH, none
#       of them into the build machine's wheel dirs other than LibTorch's; `bin/dschat info` runs.
#   (b) one translation unit that includes every installed public header (generated from the
#       installed include/dschat tree) compiles against find_package(dschat) with only
#       CMAKE_PREFIX_PATH=<prefix>;<torch cmake prefix> (no source-tree include path);
#   (c) every example project examples/<name>/ (standalone CMake projects that do
#       find_package(dschat)) builds, in one consumer build dir with (b), and its executable
#       <name> (convention: the target is named like its directory) runs with the arguments in
#       examples/<name>/ctest_args (whitespace-separated; @SOURCE_DIR@ = this source dir,
#       @WORK_DIR@ = an empty scratch dir of that example, @PREFIX@ = the install prefix) and, if
#       examples/<name>/ctest_expect exists, prints each of its non-empty lines.
# Usage: run.sh BUILD_DIR SOURCE_DIR        Keeps the work dir if DSCHAT_KEEP_INSTALL_CHECK=1.
set -euo pipefail
build="$(cd "$1" && pwd -P)"
source="$(cd "$2" && pwd -P)"
work="$(mktemp -d "${TMPDIR:-/tmp}/dschat-install-check.XXXXXX")"
if [[ "${DSCHAT_KEEP_INSTALL_CHECK:-0}" == 1 ]]; then
  echo "install_consumer: work dir $work"
else
  trap 'rm -rf "$work"' EXIT
fi
prefix="$work/prefix"
errors=0
fail() { echo "install_consumer: FAIL: $*" >&2; errors=$((errors + 1)); }
die() { echo "install_consumer: FAIL: $*" >&2; exit 1; }
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }

python="$(cache_value DSCHAT_PYTHON)"
[[ -x "$python" ]] || die "no DSCHAT_PYTHON in $build/CMakeCache.txt"
read -r torch_cmake_prefix torch_lib site_packages venv < <("$python" -c '
import os, sys, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
venv = sys.prefix if sys.prefix != sys.base_prefix else ""
print(torch.utils.cmake_prefix_path, lib, os.path.dirname(os.path.dirname(torch.__file__)), venv or "-")')
extra_rpath="$(cache_value DSCHAT_INSTALL_TORCH_RPATH)"

# Paths that nothing installed may name (as given and resolved).
forbidden=("$source" "$build" "$site_packages")
[[ "$venv" != - ]] && forbidden+=("$venv")
for p in "${forbidden[@]}"; do forbidden+=("$(realpath -m "$p")"); done
mapfile -t forbidden < <(printf '%s\n' "${forbidden[@]}" | LC_ALL=C sort -u)

cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; die "cmake --install"; }

# ---- (a) installed files ------------------------------------------------------------------------
config="$prefix/lib/cmake/dschat/dschatConfig.cmake"
[[ -f "$config" ]] || config="$(find "$prefix" -name dschatConfig.cmake | head -n 1)"
[[ -f "$config" ]] || die "no dschatConfig.cmake installed"
while IFS= read -r -d '' f; do
  for p in "${forbidden[@]}"; do
    if grep -qF -- "$p" "$f"; then fail "${f#"$prefix"/} names $p: $(grep -F -- "$p" "$f" | head -n 1)"; break; fi
  done
done < <(find "$prefix" -name '*.cmake' -print0)
grep -Eq '^[[:space:]]*find_dependency\(Torch[ )]' "$config" || fail "dschatConfig.cmake does no find_dependency(Torch)"
grep -Eq '^[[:space:]]*find_dependency\(nlohmann_json[ )]' "$config" || fail "dschatConfig.cmake does no find_dependency(nlohmann_json)"
if grep -Eq '^set\(DSCHAT_WITH_CUDA (OFF|FALSE|0)\)' "$config"; then
  if grep -il cuda "$(dirname "$config")"/dschatTargets*.cmake >/dev/null; then
    fail "CPU-only package names CUDA: $(grep -ih cuda "$(dirname "$config")"/dschatTargets*.cmake | head -n 3)"
  fi
fi

n_elf=0
while IFS= read -r -d '' f; do
  [[ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" == "177ELF" ]] || continue
  n_elf=$((n_elf + 1))
  dyn="$(readelf -d "$f")"
  paths="$(sed -n 's/.*(R\(UN\)\?PATH).*\[\(.*\)\]/\2/p' <<<"$dyn" | tr ':' '\n')"
  while IFS= read -r entry; do
    [[ -z "$entry" ]] && continue
    [[ ";$extra_rpath;" == *";$entry;"* ]] && continue  # asked for with DSCHAT_INSTALL_TORCH_RPATH
    for p in "${forbidden[@]}"; do
      if [[ "$entry" == *"$p"* ]]; then fail "${f#"$prefix"/}: RUNPATH entry $entry names $p"; break; fi
    done
  done <<<"$paths"
  while IFS= read -r needed; do
    [[ "$needed" == */* ]] && fail "${f#"$prefix"/}: DT_NEEDED is a path: $needed"
  done < <(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn")
done < <(find "$prefix" -type f -print0)
((n_elf >= 2)) || fail "found $n_elf installed ELF files, expected libdschat and bin/dschat at least"

lib="$(find "$prefix" -name 'libdschat.so.*' -type f | head -n 1)"
[[ -f "$lib" ]] || die "no libdschat.so.* installed"
runpath="$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')"
# shellcheck disable=SC2016  # a literal $ORIGIN
[[ ":$runpath:" == *':$ORIGIN:'* ]] || fail "libdschat's RUNPATH ($runpath) lacks \$ORIGIN"
# Direct dependencies resolve with only LibTorch supplied; none from the build machine's wheels but
# LibTorch's own (torch/lib and the nvidia/* libraries it brings).
ldd_out="$(env LD_LIBRARY_PATH="$torch_lib" ldd "$lib")"
while IFS= read -r needed; do
  [[ "$needed" == ld-linux* ]] && continue  # the loader itself: no "=>" line
  line="$(grep -F "	$needed =>" <<<"$ldd_out" | head -n 1 || true)"
  resolved="$(sed -n 's/.*=> \(.*\) (0x.*/\1/p' <<<"$line")"
  if [[ -z "$resolved" || "$line" == *"not found"* ]]; then fail "libdschat needs $needed: not found (${line:-no ldd line})"; continue; fi
  case "$resolved" in "$torch_lib"/* | "$site_packages"/nvidia/* | "$prefix"/*) continue ;; esac
  for p in "${forbidden[@]}"; do
    if [[ "$resolved" == "$p"/* ]]; then fail "libdschat needs $needed, found only in $resolved (not installed with it)"; break; fi
  done
done < <(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
if ! info="$(env LD_LIBRARY_PATH="$torch_lib" "$prefix/bin/dschat" info 2>&1)"; then
  fail "installed bin/dschat info failed: $(tail -n 5 <<<"$info")"
fi
((errors == 0)) || die "$errors problem(s) in the installed files (see above)"

# ---- (b) + (c): one consumer project: every header in one TU, plus every example --------------
consumer="$work/consumer"
mkdir -p "$consumer"
{
  echo "// Generated by tests/consumer/run.sh: every installed public header."
  while IFS= read -r h; do
    echo "#include <${h#"$prefix/include/"}>"
  done < <(find "$prefix/include/dschat" -type f \( -name '*.h' -o -name '*.hpp' \) | LC_ALL=C sort)
  echo "int dschat_all_headers_compiled = 1;"
} >"$consumer/all_headers.cpp"
headers="$(grep -c '^#include' "$consumer/all_headers.cpp")"
((headers > 0)) || die "no public headers installed under include/dschat"

examples=()
for d in "$source"/examples/*/; do
  [[ -f "$d/CMakeLists.txt" ]] && examples+=("$(basename "$d")")
done
{
  echo "cmake_minimum_required(VERSION 3.25)"
  echo "project(dschat_install_check LANGUAGES CXX)"
  echo "set(CMAKE_CXX_STANDARD 17)"
  echo "find_package(dschat REQUIRED)  # once here; the examples' own find_package(dschat) reuse it"
  echo "add_library(all_headers OBJECT all_headers.cpp)"
  echo "target_link_libraries(all_headers PRIVATE dschat::dschat)"
  for e in "${examples[@]}"; do echo "add_subdirectory(\"$source/examples/$e\" \"$e\")"; done
} >"$consumer/CMakeLists.txt"

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # The work dir is new each run: relative paths under it, and no mtime/ctime checks on the
  # freshly installed headers, let ccache hit across runs.
  export CCACHE_BASEDIR="$work"
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:+$CCACHE_SLOPPINESS,}include_file_mtime,include_file_ctime,time_macros"
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# Nothing from the environment or the user package registry: the prefix and LibTorch only.
if ! env -u CMAKE_PREFIX_PATH -u Torch_DIR -u dschat_DIR -u CPATH -u CPLUS_INCLUDE_PATH \
     TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" \
     cmake -S "$consumer" -B "$consumer/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_PREFIX_PATH="$prefix;$torch_cmake_prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
       -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
       "${launcher[@]}" >"$work/configure.log" 2>&1; then
  cat "$work/configure.log"; die "configuring the consumer project failed"
fi
grep -A3 'dschat was built with LibTorch' "$work/configure.log" || true
if ! env -u CPATH -u CPLUS_INCLUDE_PATH cmake --build "$consumer/build" -j "$(nproc)" >"$work/build.log" 2>&1; then
  tail -n 60 "$work/build.log"; die "building the consumer project failed"
fi
# The compile commands name the install, never the source tree's include dir.
if grep -F -- "$source/include" "$consumer/build/compile_commands.json"; then
  die "the consumer was compiled with the source tree's include dir"
fi
echo "install_consumer: $headers public headers compiled in one TU; examples: ${examples[*]:-none}"

# Examples run as a user runs them: no LD_LIBRARY_PATH; the executables' RUNPATH (CMake's build
# RPATH: the prefix and LibTorch's lib dir) and libdschat's $ORIGIN find everything.
for e in "${examples[@]}"; do
  exe="$consumer/build/$e/$e"
  [[ -x "$exe" ]] || { fail "example $e: no executable $e (the target must be named like its directory)"; continue; }
  scratch="$work/run/$e"
  mkdir -p "$scratch"
  args=()
  if [[ -f "$source/examples/$e/ctest_args" ]]; then
    text="$(grep -v '^[[:space:]]*#' "$source/examples/$e/ctest_args" || true)"
    text="${text//@SOURCE_DIR@/$source}"; text="${text//@WORK_DIR@/$scratch}"; text="${text//@PREFIX@/$prefix}"
    read -r -d '' -a args <<<"$text" || true
  fi
  start=$SECONDS
  if ! out="$(cd "$scratch" && env -u LD_LIBRARY_PATH "$exe" "${args[@]}" 2>&1)"; then
    fail "example $e ${args[*]} failed:"; tail -n 30 <<<"$out" >&2; continue
  fi
  if [[ -f "$source/examples/$e/ctest_expect" ]]; then
    while IFS= read -r want; do
      [[ -z "$want" ]] && continue
      [[ "$out" == *"$want"* ]] || { fail "example $e: output lacks '$want'"; tail -n 30 <<<"$out" >&2; }
    done <"$source/examples/$e/ctest_expect"
  fi
  echo "install_consumer: example $e ok ($((SECONDS - start)) s): $(tail -n 1 <<<"$out")"
done
((errors == 0)) || die "$errors problem(s)"
echo "install_consumer: ok"
