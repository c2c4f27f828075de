#!/usr/bin/env python3
"""transformers peer of dschat_rollout_bench: the same calls with model.generate().

Run by the bench binary with --job (JSON: model_dir, prompt, samples, threads, seed, prompts and
the calls as [first prompt, prompt count, steps]). The prompts are torch.randint(3, vocab,
(prompts, prompt)) from a CPU generator seeded with seed, as on the C++ side. Each call:
model.generate(ids, attention_mask=ones, do_sample=True, top_k=0, top_p=1, num_return_sequences=
samples, min_new_tokens = max_new_tokens = steps) under torch.inference_mode(), timed with
perf_counter, after one untimed 2-token call of the first call's prompts. Writes JSON
{"seconds": [...]}.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.job) as f:
        job = json.load(f)
    torch.set_num_threads(job["threads"])
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    generator = torch.Generator().manual_seed(job["seed"])
    prompts = torch.randint(3, model.config.vocab_size, (job["prompts"], job["prompt"]), generator=generator,
                            dtype=torch.int64)  # [P, T]
    torch.manual_seed(job["seed"])
    seconds = []
    with torch.inference_mode():
        first, count, _ = job["calls"][0]
        ids = prompts[first:first + count]
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                       num_return_sequences=job["samples"], max_new_tokens=2, min_new_tokens=2,
                       eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)  # warm-up
        for first, count, steps in job["calls"]:
            ids = prompts[first:first + count]
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
                                 num_return_sequences=job["samples"], max_new_tokens=steps, min_new_tokens=steps,
                                 eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
            seconds.append(time.perf_counter() - start)
            assert out.shape == (count * job["samples"], job["prompt"] + steps), out.shape
    print(f"  transformers: {sum(seconds):.2f}s over {len(seconds)} calls (torch {torch.__version__})", flush=True)
    with open(args.out, "w") as f:
        json.dump({"seconds": seconds}, f)


if __name__ == "__main__":
    main()
