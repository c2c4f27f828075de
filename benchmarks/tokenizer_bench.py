#!/usr/bin/env python3
"""Tokenizer throughput: dschat against Hugging Face `tokenizers` (Rust) on one corpus.

    tokenizer_bench.py --binary build/benchmarks/dschat_tokenizer_bench [--tokenizer assets/gpt2-bpe]
                       [--megabytes 8] [--repeat 3] [--threads N]

Makes a deterministic corpus of mixed text (Zipf-distributed English-like words, numbers,
punctuation and about 20% lines from the multilingual generator of the parity tests), then runs:
  dschat  encode() per line on 1 thread, and encode_batch on N threads;
  HF      encode_batch with TOKENIZERS_PARALLELISM=false (1 thread), and encode_batch in parallel
          (Rayon, N threads), each in its own process through GPT2Tokenizer's backend tokenizer.
Every run has one untimed warm-up pass. Prints a table, the dschat/HF ratios, and one JSON line.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tokenizer"))

import make_tokenizer_cases as cases  # noqa: E402  (the parity tests' string generator)

HF_RUNNER = r"""
import json, sys, time
from transformers import GPT2Tokenizer
tok_dir, corpus, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(corpus, encoding="utf-8") as f:
    lines = f.read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
nbytes = sum(len(line.encode("utf-8")) for line in lines)
tok = GPT2Tokenizer.from_pretrained(tok_dir).backend_tokenizer
tok.encode_batch(lines, add_special_tokens=False)
start = time.perf_counter()
for _ in range(repeat):
    tokens = sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
seconds = time.perf_counter() - start
print(json.dumps({"impl": "hf", "bytes": nbytes, "tokens": tokens, "seconds": seconds,
                  "mb_per_s": nbytes * repeat / seconds / 1e6}))
"""


def make_corpus(path, megabytes, seed=1234):
    rng = random.Random(seed)
    words = [w.strip(".,!?;:\"()") for s in cases.SENTENCES for w in s.split()]
    letters = "abcdefghijklmnopqrstuvwxyz"
    words += ["".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(20000)]
    target = megabytes * 1_000_000
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            if rng.random() < 0.2:
                line = " ".join(cases.fragment(rng) for _ in range(rng.randint(1, 12))).replace("\n", " ")
            else:
                parts = []
                for _ in range(rng.randint(5, 60)):
                    w = words[min(int(rng.paretovariate(1.1)) - 1, len(words) - 1) if rng.random() < 0.7
                              else rng.randrange(len(words))]
                    if rng.random() < 0.08:
                        w = w.capitalize()
                    if rng.random() < 0.05:
                        w = str(rng.randint(0, 100000))
                    parts.append(w + (rng.choice([",", ".", "'s", "!", ":"]) if rng.random() < 0.1 else ""))
                line = " ".join(parts)
            line = line.replace("\r", " ").replace("\u2028", " ").replace("\u2029", " ").replace("\x85", " ")
            f.write(line + "\n")
            size += len(line.encode("utf-8")) + 1
    return size


def run_json(command, env=None):
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True, help="dschat_tokenizer_bench executable")
    parser.add_argument("--tokenizer", default=os.path.join(HERE, "..", "assets", "gpt2-bpe"))
    parser.add_argument("--megabytes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        size = make_corpus(corpus, args.megabytes)
        dschat_cmd = [args.binary, "--tokenizer", args.tokenizer, "--corpus", corpus, "--repeat", str(args.repeat)]
        hf_cmd = [sys.executable, "-c", HF_RUNNER, args.tokenizer, corpus, str(args.repeat)]
        results = {
            "dschat_1_thread": run_json(dschat_cmd + ["--threads", "1"]),
            "dschat_batch": run_json(dschat_cmd + ["--threads", str(args.threads)]),
            "hf_1_thread": run_json(hf_cmd, dict(os.environ, TOKENIZERS_PARALLELISM="false")),
            "hf_batch": run_json(hf_cmd, dict(os.environ, TOKENIZERS_PARALLELISM="true",
                                              RAYON_NUM_THREADS=str(args.threads))),
        }
    tokens = {r["tokens"] for r in results.values()}
    print(f"corpus: {size / 1e6:.1f} MB, {args.repeat} timed passes, {args.threads} threads for batch runs")
    for name, r in results.items():
        print(f"  {name:16s} {r['mb_per_s']:8.2f} MB/s  ({r['tokens']} tokens per pass)")
    ratio_1 = results["dschat_1_thread"]["mb_per_s"] / results["hf_1_thread"]["mb_per_s"]
    ratio_n = results["dschat_batch"]["mb_per_s"] / results["hf_batch"]["mb_per_s"]
    print(f"  dschat / HF: {ratio_1:.2f}x on 1 thread, {ratio_n:.2f}x batched on {args.threads} threads")
    if len(tokens) != 1:
        print(f"  WARNING: token counts differ between runs: {sorted(tokens)}")
    print(json.dumps({"corpus_mb": size / 1e6, "threads": args.threads, "ratio_1_thread": ratio_1,
                      "ratio_batch": ratio_n, "same_token_count": len(tokens) == 1,
                      **{k: v["mb_per_s"] for k, v in results.items()}}))


if __name__ == "__main__":
    main()
