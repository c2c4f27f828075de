#!/usr/bin/env python3
"""transformers peer of dschat_generate_bench: the same greedy generation with model.generate().

The bench binary runs this script itself (one command produces both sides); it can also be run by
hand on a checkpoint the binary saved with --work-dir (config.json + model.safetensors):

  python benchmarks/generate_bench_peer.py --model-dir D --out F [--batch 4] [--prompt 32] [--new-tokens 32]

The job: AutoModelForCausalLM from D (fp32, SDPA attention, eval mode); prompts
torch.randint(3, vocab, (batch, prompt)) from a CPU generator seeded with --seed (the C++ side
draws the same rows and checks the checksum); model.generate(ids, attention_mask=ones,
max_new_tokens=N, min_new_tokens=N, do_sample=False, num_beams=1) under torch.inference_mode()
with the config's eos/pad ids, so every call generates exactly N tokens per row. After --warmup
calls, --iters calls are timed with perf_counter and process_time. Writes JSON: the wall and CPU
seconds of each timed call, the ids of the last one (flattened), the prompt checksum.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, vocab, (args.batch, args.prompt), generator=generator, dtype=torch.int64)  # [B, T]
    weights = torch.arange(1, ids.numel() + 1, dtype=torch.int64).view_as(ids)
    checksum = int((ids * weights).sum())
    mask = torch.ones_like(ids)
    kwargs = dict(attention_mask=mask, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                  do_sample=False, num_beams=1, eos_token_id=model.config.eos_token_id,
                  pad_token_id=model.config.pad_token_id)
    seconds, cpu_seconds = [], []
    with torch.inference_mode():
        for i in range(args.warmup + args.iters):
            cpu_start = time.process_time()  # CPU time of the process, all threads
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)  # [B, T + N]
            elapsed = time.perf_counter() - start
            if i >= args.warmup:
                seconds.append(elapsed)
                cpu_seconds.append(time.process_time() - cpu_start)
    assert out.shape == (args.batch, args.prompt + args.new_tokens), out.shape
    tokens = args.batch * args.new_tokens
    print(f"  transformers: median {sorted(seconds)[len(seconds) // 2]:.3f}s per call, "
          f"{tokens / sorted(seconds)[len(seconds) // 2]:.1f} tokens/s (torch {torch.__version__})", flush=True)
    with open(args.out, "w") as f:
        json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "ids": out.flatten().tolist(), "prompt_checksum": checksum,
                   "torch": torch.__version__, "attention": model.config._attn_implementation}, f)


if __name__ == "__main__":
    main()
