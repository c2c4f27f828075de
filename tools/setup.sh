#!/usr/bin/env bash
# Installs everything dschat needs to build and test on a fresh Debian 12 machine.
# Idempotent and quiet when already done: each step checks before it installs.
#   Debian packages : compiler, cmake, ninja, ccache, json, spdlog, CLI11, GoogleTest, ICU, Oniguruma, OpenSSL, libpng,
#                     Gloo headers (declarations for LibTorch's c10d ProcessGroupGloo; the code is libtorch's),
#                     cpp-httplib (`dschat serve`), chromium + chromium-driver (the chat page's browser test)
#   .venv/          : torch==2.11.0 (its LibTorch is what CMake links), plus the Python
#                     packages used only by tests and tools (transformers, safetensors, numpy;
#                     openai, selenium, lm-eval and jsonschema for `dschat serve`'s tests)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DSCHAT_VENV:-$root/.venv}"

apt_packages=(
  g++ cmake ninja-build ccache git pkg-config python3 python3-venv python3-pip
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev
  libbenchmark-dev libicu-dev libonig-dev libssl-dev libpng-dev libgloo-dev libcpp-httplib-dev chromium chromium-driver
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python pins: torch must match the GPU machine's (2.11.0+cu130); pyarrow supplies the Arrow/Parquet
# C++ libraries the build links; the rest are test oracles.
# selenium 4.50 is the newest whose certifi pin the registry serves.
# lm-eval (EleutherAI's harness, tests/serve/lm_eval_test.py) without its [api] extra, which would add
# tiktoken: its API models need aiohttp, requests and tqdm (which its requirements bring) and tenacity.
# jsonschema checks `dschat serve`'s schema-guided replies (tests/serve/chat_template_test.py).
pins=(torch==2.11.0 transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6 tokenizers==0.23.3 pyarrow==26.0.1
      openai==3.57.0 selenium==4.50.0 lm-eval==0.4.13 tenacity==9.2.1 jsonschema==4.26.0)
stamp="$venv/.dschat-pins"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${pins[*]}" ]; then
  echo "setup: creating $venv with ${pins[*]}"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}"
  # One mtime for every header the build includes from the wheels. GCC's #pragma once takes two
  # files of equal size, content and mtime (whole seconds) for one file, and torch ships hundreds
  # of identical empty ATen/ops/*_native.h headers: with the mtimes the unpacking happened to give
  # them, which of them a build skips differs per venv, so the preprocessed torch headers (the
  # precompiled header's ccache key) differed per clone, and a fresh clone missed the compiler
  # cache for every file (docs/benchmarks.md, "Build and test time").
  for include in "$venv"/lib/python3*/site-packages/{torch,pyarrow}/include; do
    [ -d "$include" ] && find "$include" -type f -exec touch -h -d '2000-01-01 00:00:00 UTC' {} +
  done
  echo "${pins[*]}" > "$stamp"
fi
