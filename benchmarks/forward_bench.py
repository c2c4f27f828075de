#!/usr/bin/env python3
"""Forward-pass tokens/s, dschat vs transformers, same model shape, batch, dtype and thread count,
run alternately (`--rounds` times each) in one invocation; each side's figure is its best run
(the least disturbed on a shared machine); prints both and the ratio as JSON.

    .venv/bin/python benchmarks/forward_bench.py [--model opt-125m] [--batch 4] [--seq 128]
        [--iters 5] [--rounds 2] [--threads 2] [--bench build/benchmarks/dschat_forward_bench]

Both sides use random weights at the preset's real shape (dschat: --init random; transformers:
OPTForCausalLM(OPTConfig of the same size)), eval mode, no grad, fp32 on the CPU.
"""
import argparse
import json
import subprocess
import time

import torch
from transformers import OPTConfig, OPTForCausalLM

SHAPES = {  # (hidden, layers, heads, ffn, word_embed_proj_dim) as in facebook/opt-* configs
    "opt-125m": (768, 12, 12, 3072, 768), "opt-350m": (1024, 24, 16, 4096, 512), "opt-1.3b": (2048, 24, 32, 8192, 2048),
}


def transformers_model(name):
    hidden, layers, heads, ffn, proj = SHAPES[name]
    config = OPTConfig(vocab_size=50272, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       ffn_dim=ffn, word_embed_proj_dim=proj, do_layer_norm_before=name != "opt-350m",
                       max_position_embeddings=2048)
    return OPTForCausalLM(config).eval()


def bench_transformers(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    model = transformers_model(args.model)
    ids = torch.randint(3, 50272, (args.batch, args.seq))
    with torch.no_grad():
        for _ in range(2):
            model(input_ids=ids)
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            model(input_ids=ids)
            times.append(time.perf_counter() - start)
    return {"impl": "transformers", "attn": model.config._attn_implementation, "best_seconds": min(times),
            "mean_seconds": sum(times) / len(times), "tokens_per_s": args.batch * args.seq / min(times)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="opt-125m", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bench", default="build/benchmarks/dschat_forward_bench")
    args = parser.parse_args()
    runs = {"dschat": [], "transformers": []}
    for _ in range(args.rounds):
        out = subprocess.run([args.bench, "--model", args.model, "--init", "random", "--batch", str(args.batch),
                              "--seq", str(args.seq), "--iters", str(args.iters), "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True).stdout
        runs["dschat"].append(json.loads(out.strip().splitlines()[-1]))
        runs["transformers"].append(bench_transformers(args))
    dschat = max(runs["dschat"], key=lambda r: r["tokens_per_s"])
    peer = max(runs["transformers"], key=lambda r: r["tokens_per_s"])
    print(json.dumps({"model": args.model, "batch": args.batch, "seq": args.seq, "threads": args.threads,
                      "torch": torch.__version__, "dschat": dschat, "transformers": peer,
                      "ratio_dschat_over_transformers": dschat["tokens_per_s"] / peer["tokens_per_s"]}, indent=2))


if __name__ == "__main__":
    main()
