#!/usr/bin/env python3
"""PyTorch peer of dschat_train_step_bench: the same training step in eager PyTorch.

The bench binary runs this script itself (one command produces both sides); it can also be run by
hand on a checkpoint the binary saved (config.json + model.safetensors):

  one process, N intra-op threads:
    python benchmarks/train_step_peer.py --model-dir D --out F [--batch 8] [--seq 128] [--threads 2]
  data parallel, DDP over Gloo, one thread per rank (the global batch is split over the ranks):
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/train_step_peer.py --ddp --model-dir D --out F

The job: transformers.OPTForCausalLM (SDPA attention, dropout 0, fp32, train mode) loaded from D;
the batch is torch.randint(3, vocab, (batch, seq)) from a CPU generator seeded with --seed (the
same rows as the C++ side, checked by a checksum); loss = cross entropy of logits[:, :-1] against
ids[:, 1:]; torch.optim.AdamW with DeepSpeed-Chat's two groups (no decay for biases and norms), lr
1e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.0, its default implementation unless
--adamw-impl says otherwise (on CPU tensors the default is the single-tensor for-loop). A step is
zero_grad(set_to_none) + forward + loss + backward + optimizer.step(); after --warmup steps, --steps
steps are timed one by one with perf_counter, per phase, and with process_time (CPU seconds of all
the process's threads). Writes JSON to --out (rank 0 under DDP).
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import OPTForCausalLM

NO_DECAY = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]  # DeepSpeed-Chat


def grouped_parameters(model, weight_decay):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if any(nd in name.lower() for nd in NO_DECAY) else decay).append(param)
    return [g for g in ({"params": decay, "weight_decay": weight_decay},
                        {"params": no_decay, "weight_decay": 0.0}) if g["params"]]


def batch_checksum(ids):
    """sum(ids * (1 + flat index)) as an exact integer: the C++ side prints the same figure."""
    weights = torch.arange(1, ids.numel() + 1, dtype=torch.int64).view_as(ids)
    return int((ids * weights).sum())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=8, help="global batch (split over the ranks under --ddp)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (per rank)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--adamw-impl", choices=["default", "foreach", "fused", "for-loop"], default="default")
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel over Gloo (run under torchrun)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    rank, world = 0, 1
    if args.ddp:
        torch.distributed.init_process_group("gloo")
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    assert args.batch % world == 0, "the global batch must split evenly over the ranks"

    model = OPTForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="sdpa",
                                           dropout=0.0, attention_dropout=0.0, layerdrop=0.0)
    model.train()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, vocab, (args.batch, args.seq), generator=generator, dtype=torch.int64)  # [B, T]
    checksum = batch_checksum(ids)
    per_rank = args.batch // world
    ids = ids[rank * per_rank:(rank + 1) * per_rank].contiguous()  # [B / world, T]

    impl = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True},
            "for-loop": {"foreach": False}}[args.adamw_impl]
    optimizer = torch.optim.AdamW(grouped_parameters(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95),
                                  eps=1e-8, **impl)
    net = torch.nn.parallel.DistributedDataParallel(model) if args.ddp else model

    times = {"step": [], "forward": [], "backward": [], "optimizer": [], "cpu": []}
    losses = []
    for i in range(args.warmup + args.steps):
        cpu_start = time.process_time()  # CPU time of the process, all threads
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = net(input_ids=ids).logits  # [b, T, V]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        after_forward = time.perf_counter()
        loss.backward()
        after_backward = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        cpu = time.process_time() - cpu_start
        losses.append(loss.item())
        if i >= args.warmup:
            times["step"].append(end - start)
            times["forward"].append(after_forward - start)
            times["backward"].append(after_backward - after_forward)
            times["optimizer"].append(end - after_backward)
            times["cpu"].append(cpu)

    if args.ddp:  # the loss of the whole global batch, as the C++ side reports it
        mean_losses = torch.tensor(losses, dtype=torch.float64)
        torch.distributed.all_reduce(mean_losses)
        losses = (mean_losses / world).tolist()
    if rank == 0:
        group = optimizer.param_groups[0]
        used = "fused" if group.get("fused") else "foreach" if group.get("foreach") else "for-loop"
        if args.adamw_impl == "default":
            used += " (default)"
        median_ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        report = {"impl": "pytorch-ddp" if args.ddp else "pytorch", "torch": torch.__version__,
                  "world_size": world, "threads_per_rank": torch.get_num_threads(), "batch": args.batch,
                  "seq": args.seq, "steps": args.steps, "warmup": args.warmup, "batch_checksum": checksum,
                  "num_params": sum(p.numel() for p in model.parameters()), "adamw": used,
                  "attention": model.config._attn_implementation, "median_ms": median_ms,
                  "tokens_per_s": args.batch * args.seq / (median_ms["step"] / 1e3),
                  "ms": {k: [1e3 * t for t in v] for k, v in times.items()}, "losses": losses}
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
