#!/usr/bin/env bash
# The quick start's first command: set up, build, then `dschat train` on its embedded default
# (configs/demo.json): SFT, reward model and PPO on a tiny random-weight OPT and the bundled demo
# data, on the CPU, ending with a table of what each step achieved on held-out prompts.
# A finished run is kept in ./output; rerunning skips its finished steps (delete ./output to redo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Only what the demo runs: libdschat and the CLI (not the tests or the benchmarks).
DSCHAT_BUILD_TARGETS=dschat_cli bash tools/build.sh
./build/dschat train "$@"
