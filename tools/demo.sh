#!/usr/bin/env bash
# The quick start's first command: set up, build, then `dschat info` and a greedy generation from
# the tiny bundled checkpoint (random weights, GPT-2 tokenizer; the text is noise by design).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/build.sh
./build/dschat info
./build/dschat generate --model assets/tiny-opt --tokenizer assets/gpt2-bpe \
  --prompt "Human: Please tell me about Microsoft in a few sentence? Assistant:" --max-new-tokens 16
