#!/usr/bin/env python3
"""transformers + PyTorch peer of dschat_step3_bench: one DeepSpeed-Chat step-3 iteration written
plainly, on the checkpoints the binary saved in --work-dir (actor/: an OPT causal LM; critic/: a
DeepSpeed-Chat reward model, rwtransformer.* + v_head.weight).

Models: actor (OPTForCausalLM, trained, AdamW betas 0.9/0.95 lr 9.65e-6), reference (a frozen copy),
critic (OPTModel + v_head, trained, lr 5e-6) and reward (a frozen copy). Per iteration, timed in
three parts like the C++ side:
  generate    actor.generate(prompts, min_new_tokens = max_new_tokens = answer, greedy)
  experience  under no_grad: actor and reference log-probs of the taken tokens, reward end scores,
              critic values
  train       KL-penalised rewards (kl_ctl 0.1, clip 5), GAE (gamma 1, lambda 0.95), clipped actor
              loss -> backward -> clip 1.0 -> step; clipped value loss -> backward -> clip -> step
Prompts: torch.randint(3, vocab, (batch, prompt)) seeded with --seed (the C++ side draws the same).
Mirrors the C++ side's options: --dtype (the models' parameters in that dtype), LoRA as DeepSpeed-
Chat's convert_linear_layer_to_lora (the nn.Linear layers whose names contain the module name get a
frozen base weight plus right [in, r] @ left [r, out] at scaling 1/r), gradient checkpointing
(transformers' own), and torch's fused AdamW on a GPU.
Writes JSON: the seconds of each timed iteration per part.
"""
import argparse
import json
import os
import time

import math

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, OPTForCausalLM, OPTModel


class LoraLinear(torch.nn.Module):
    """DeepSpeed-Chat's LinearLayer_LoRA (lora_scaling 1, no dropout): the base weight frozen."""

    def __init__(self, linear, dim):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.weight.requires_grad_(False)
        self.right = torch.nn.Parameter(torch.empty(linear.in_features, dim, dtype=linear.weight.dtype))  # [in, r]
        self.left = torch.nn.Parameter(torch.zeros(dim, linear.out_features, dtype=linear.weight.dtype))  # [r, out]
        torch.nn.init.kaiming_uniform_(self.right, a=math.sqrt(5))
        self.scaling = 1.0 / dim

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight, self.bias) + (x @ self.right @ self.left) * self.scaling


def convert_to_lora(model, module_name, dim):
    if dim <= 0:
        return
    names = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and module_name in name]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoraLinear(getattr(parent, child), dim))


class RewardModel(torch.nn.Module):
    def __init__(self, directory):
        super().__init__()
        config = AutoConfig.from_pretrained(directory)
        self.rwtransformer = OPTModel(config)
        self.v_head = torch.nn.Linear(config.word_embed_proj_dim, 1, bias=False)
        self.load_state_dict(load_file(os.path.join(directory, "model.safetensors")), strict=False)

    def forward(self, ids, mask):  # -> [B, T]
        return self.v_head(self.rwtransformer(input_ids=ids, attention_mask=mask).last_hidden_state).squeeze(-1)


def log_probs(logits, ids):  # [B, T, V], [B, T] -> [B, T-1]
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def train_step(actor, critic, opt_a, opt_c, seq, mask, old_lp, ref_lp, values, score, start):
    action_mask = mask[:, 1:]
    rewards = -0.1 * (old_lp - ref_lp)
    ends = start + action_mask[:, start:].sum(1) + 1
    for j in range(seq.size(0)):
        rewards[j, min(int(ends[j]), rewards.size(1)) - 1] += score[j].clamp(-5, 5)
        rewards[j, int(ends[j]):] = 0
        values[j, int(ends[j]):] = 0
    length = rewards.size(1)
    advantages, last = [], 0.0
    for t in reversed(range(start, length)):
        next_v = values[:, t + 1] if t < length - 1 else 0.0
        delta = rewards[:, t] + next_v - values[:, t]
        last = delta + 0.95 * last
        advantages.append(last)
    adv = torch.stack(advantages[::-1], 1)
    returns = adv + values[:, start:]
    m = action_mask[:, start:].float()
    new_lp = log_probs(actor(input_ids=seq, attention_mask=mask, use_cache=False).logits, seq)[:, start:]
    ratio = torch.exp((new_lp - old_lp[:, start:]) * m)
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    (pg * m).sum().div(m.sum()).backward()
    torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
    opt_a.step()
    opt_a.zero_grad()
    v = critic(seq, mask)[:, :-1][:, start:]
    old_v = values[:, start:]
    v_clip = torch.max(torch.min(v, old_v + 0.2), old_v - 0.2)
    vf = torch.max((v - returns) ** 2, (v_clip - returns) ** 2)
    (0.5 * (vf * m).sum() / m.sum()).backward()
    torch.nn.utils.clip_grad_norm_(critic.parameters(), 1.0)
    opt_c.step()
    opt_c.zero_grad()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work-dir", required=True)
    p.add_argument("--out", required=True)
    for name, default in [("batch", 4), ("prompt", 32), ("answer", 32), ("threads", 2), ("iters", 2),
                          ("warmup", 1), ("seed", 1234)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    for side in ("actor", "critic"):
        p.add_argument("--%s-lora-dim" % side, type=int, default=0)
        p.add_argument("--%s-lora-module-name" % side, default="decoder.layers.")
        p.add_argument("--%s-gradient-checkpointing" % side, type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    actor_dir = os.path.join(args.work_dir, "actor")
    critic_dir = os.path.join(args.work_dir, "critic")
    actor = OPTForCausalLM.from_pretrained(actor_dir, attn_implementation="sdpa")
    ref = OPTForCausalLM.from_pretrained(actor_dir, attn_implementation="sdpa").eval().requires_grad_(False)
    critic = RewardModel(critic_dir)
    reward = RewardModel(critic_dir).eval().requires_grad_(False)
    convert_to_lora(actor, args.actor_lora_module_name, args.actor_lora_dim)
    convert_to_lora(critic, args.critic_lora_module_name, args.critic_lora_dim)
    for model, on in ((actor, args.actor_gradient_checkpointing), (critic.rwtransformer, args.critic_gradient_checkpointing)):
        if on:  # renamed in transformers 5.x; the older name still works there
            getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    device = torch.device(args.device)
    for model in (actor, ref, critic, reward):
        model.to(device=device, dtype=dtype)
    fused = device.type == "cuda"  # torch's fused AdamW kernels are GPU-only

    def adamw(model, lr):
        trained = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.95), fused=fused)

    opt_a = adamw(actor, 9.65e-6)
    opt_c = adamw(critic, 5e-6)
    pad = actor.config.pad_token_id
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(3, actor.config.vocab_size, (args.batch, args.prompt), generator=gen,
                            dtype=torch.int64).to(device)
    prompt_mask = torch.ones_like(prompts)
    start = args.prompt - 1
    times = {"generate": [], "experience": [], "train": []}
    def now():  # a GPU runs ahead of the host: time only finished work
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    for i in range(args.warmup + args.iters):
        t0 = now()
        actor.eval()
        with torch.no_grad():
            seq = actor.generate(prompts, attention_mask=prompt_mask, max_new_tokens=args.answer,
                                 min_new_tokens=args.answer, do_sample=False, pad_token_id=pad,
                                 eos_token_id=actor.config.eos_token_id)
        actor.train()
        t1 = now()
        with torch.no_grad():
            mask = (seq != pad).long()
            old_lp = log_probs(actor(input_ids=seq, attention_mask=mask).logits, seq)
            ref_lp = log_probs(ref(input_ids=seq, attention_mask=mask).logits, seq)
            r = reward(seq, mask)
            score = r[:, -1]  # every answer fills its row: the end score is the last position
            values = critic(seq, mask)[:, :-1].clone()
        t2 = now()
        train_step(actor, critic, opt_a, opt_c, seq, mask, old_lp, ref_lp, values, score, start)
        t3 = now()
        if i >= args.warmup:
            times["generate"].append(t1 - t0)
            times["experience"].append(t2 - t1)
            times["train"].append(t3 - t2)
    print("  transformers: generate %.3fs, experience %.3fs, train %.3fs (last iteration)"
          % (times["generate"][-1], times["experience"][-1], times["train"][-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(times, f)


if __name__ == "__main__":
    main()
