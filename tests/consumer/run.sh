#!/usr/bin/env bash
# Installs the build into a temp prefix, builds tests/consumer against it with find_package(dschat)
# and runs it on a fixture model. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"; source="$2"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/tests/consumer" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$work/build" >/dev/null
out="$("$work/build/consumer" "$source/tests/fixtures/opt-preln")"
echo "$out"
[[ "$out" == *"logits [1, 4, 512]"* ]]
