#!/usr/bin/env python3
"""Writes tests/fixtures/rl/critic_free.json: inputs and the outputs of Python transcriptions of the
reference implementations of GRPO, RLOO and REINFORCE++ (advantages, losses, gradients), which
tests/rlhf/critic_free_test.cpp compares dschat's rlhf/math/critic_free.h against.

Transcribed from (see shared/reference/rl-algorithms.md for the line ranges):
  GRPO   huggingface/trl f2cd5771 (1.10.0.dev0): trl/trainer/grpo_trainer.py
         _generate_and_score_completions (advantages), _compute_loss; trl/trainer/utils.py nanstd
  RLOO   the same trl commit: trl/trainer/rloo_trainer.py (advantages, LOO baseline, _compute_loss)
  REINFORCE++  OpenRLHF/OpenRLHF 3c3be623 (0.11.0): openrlhf/models/utils.py compute_approx_kl,
         compute_reward; openrlhf/trainer/ppo_utils/experience_maker.py
         compute_advantages_and_returns, get_cumulative_returns
Everything in float64 (upstream runs float32; the formulas are the same). Deterministic.

Usage: tools/make_rl_fixtures.py [OUT_FILE]   (default tests/fixtures/rl/critic_free.json)
"""
import json
import pathlib
import sys

import torch

torch.manual_seed(20261202)
D = torch.float64


def t(x):
    """A tensor as nested lists, NaN as null (JSON has no NaN)."""
    def clean(v):
        if isinstance(v, list):
            return [clean(e) for e in v]
        return None if v != v else v
    return clean(x.detach().tolist())


# ---- trl utils.py: nanstd (Bessel-corrected, NaN-aware)
def nanstd(tensor):
    variance = torch.nanmean((tensor - torch.nanmean(tensor, keepdim=True)) ** 2)
    count = torch.sum(~torch.isnan(tensor))
    variance *= count / (count - 1)
    return torch.sqrt(variance)


# ---- trl grpo_trainer.py: advantages from rewards_per_func
def grpo_advantages(rewards_per_func, weights, G, scale_rewards, aggregation):
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        grouped = rewards.view(-1, G)
        mean_grouped_rewards = torch.nanmean(grouped, dim=1).repeat_interleave(G, dim=0)
        if scale_rewards in ["group", "none"]:
            std_rewards = torch.stack([nanstd(row) for row in grouped]).repeat_interleave(G, dim=0)
        else:  # batch
            std_rewards = nanstd(rewards).expand_as(rewards)
        advantages = rewards - mean_grouped_rewards
        if scale_rewards != "none":
            advantages = advantages / (std_rewards + 1e-4)
    else:  # normalize_then_sum
        N, F = rewards_per_func.shape
        grouped = rewards_per_func.view(-1, G, F)
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = torch.stack([torch.stack([nanstd(grouped[g, :, f]) for f in range(F)]) for g in range(N // G)])
        normalized = ((grouped - mean_k) / (std_k.unsqueeze(1) + 1e-4)).view(N, F)
        rewards = (normalized * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


# ---- trl grpo_trainer.py: _compute_loss (the policy part)
def grpo_loss(lp, old, ref, mask, adv, o):
    old = lp.detach() if old is None else old
    log_ratio = lp - old
    if o["sequence_level"]:
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_importance_weights = log_ratio
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - o["epsilon_low"], 1 + o["epsilon_high"])
    a = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    if o["beta"] != 0.0:
        per_token_kl = torch.exp(ref - lp) - (ref - lp) - 1
        per_token_loss = per_token_loss + o["beta"] * per_token_kl
    ga = o["gradient_accumulation_steps"]
    if o["type"] == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / ga
    elif o["type"] == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / ga
    elif o["type"] == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * o["max_completion_length"]) / ga
    else:  # dapo
        normalizer = max(o["num_items_in_batch"], 1.0) / o["num_processes"]
        loss = (per_token_loss * mask).sum() / normalizer
    is_low = (coef_1 < 1 - o["epsilon_low"]) & (a < 0)
    is_high = (coef_1 > 1 + o["epsilon_high"]) & (a > 0)
    clipped = (is_low | is_high).expand_as(mask).to(D)
    clip_fraction = (clipped * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, clip_fraction


# ---- trl rloo_trainer.py: advantages and _compute_loss
def rloo_advantages(rewards_per_func, weights, G, beta, kl_sums, normalize, clip):
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    if clip is not None:
        rewards = rewards.clamp(clip[0], clip[1])
    if beta != 0.0:
        rewards = rewards - beta * kl_sums
    grouped = rewards.view(-1, G)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baseline = (grouped.nansum(dim=1, keepdim=True) - grouped) / (counts - 1)
    advantages = (grouped - baseline).view(-1)
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def rloo_loss(lp, old, mask, adv, eps_lo, eps_hi):
    seq = (lp * mask).sum(-1)
    seq_old = (old * mask).sum(-1)
    coef_1 = torch.exp(seq - seq_old)
    coef_2 = torch.clamp(coef_1, 1 - eps_lo, 1 + eps_hi)
    loss = (-torch.min(coef_1 * adv, coef_2 * adv)).mean()
    clipped = ((coef_1 < 1 - eps_lo) & (adv < 0)) | ((coef_1 > 1 + eps_hi) & (adv > 0))
    return loss, clipped.to(D).mean()


# ---- OpenRLHF models/utils.py: compute_approx_kl
def compute_approx_kl(log_probs, log_probs_base, kl_estimator):
    log_ratio = log_probs.double() - log_probs_base.double()
    if kl_estimator == "k2":
        log_ratio = log_ratio ** 2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio.clamp(min=-10, max=10)


# ---- OpenRLHF experience_maker.py: compute_advantages_and_returns (the REINFORCE family)
def get_cumulative_returns(rewards, action_mask, gamma):
    returns = torch.zeros_like(rewards)
    cumulative_return = torch.zeros(rewards.size(0), dtype=D)
    rewards = action_mask * rewards
    for t_ in reversed(range(rewards.size(1))):
        cumulative_return = rewards[:, t_] + gamma * cumulative_return
        returns[:, t_] = cumulative_return
    return returns


def reinforce(r, kl, mask, o):
    n = o["samples_per_prompt"]
    est = o["estimator"]
    rewards = r.reshape(-1, n)
    if est == "rloo":
        baseline = (rewards.sum(-1, keepdim=True) - rewards) / (n - 1)
        rewards = rewards - baseline
    elif est in ["reinforce_baseline", "dr_grpo"]:
        rewards = rewards - rewards.mean(-1, keepdim=True)
    elif est == "group_norm":
        rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)
    rewards = rewards.reshape(-1)
    # compute_reward
    r_clipped = rewards.clamp(min=o["clip_low"], max=o["clip_high"])
    kl_coef = o["kl_coef"] if o["kl_coef"] > 0 else 0.0
    kl_reward = -kl_coef * kl
    eos_indices = mask.size(1) - 1 - mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r_clipped.unsqueeze(1).to(kl.dtype))
    reward = last_reward + kl_reward
    gamma = o["gamma"] if est == "reinforce" else 1.0
    returns = get_cumulative_returns(reward, mask, gamma)
    advantages = returns
    if est in ["reinforce", "reinforce_baseline"]:
        num_actions = mask.sum()
        mean = (advantages * mask).sum() / num_actions
        if not o["no_std_norm"]:
            var = ((advantages - mean).pow(2) * mask).sum() / num_actions
            rstd = var.clamp(min=1e-8).rsqrt()
        else:
            rstd = 1
        advantages = (advantages - mean) * rstd
    return advantages, returns


def main():
    out_file = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/rl/critic_free.json")
    fixture = {"about": __doc__.strip().splitlines()[0]}

    # GRPO advantages: 4 groups of 4, 2 reward functions. Group 1 has equal rewards, group 2 one
    # unscorable row, group 3 only one scorable row.
    rpf = torch.randn(16, 2, dtype=D)
    rpf[4:8] = torch.tensor([0.5, 1.0], dtype=D)
    rpf[9, :] = torch.nan
    rpf[10, 1] = torch.nan
    rpf[12:15, :] = torch.nan
    weights = torch.tensor([1.0, 0.5], dtype=D)
    fixture["grpo_advantages"] = {"rewards_per_func": t(rpf), "weights": t(weights), "group_size": 4, "cases": []}
    for scale, agg in [("group", "sum_then_normalize"), ("batch", "sum_then_normalize"),
                       ("none", "sum_then_normalize"), ("group", "normalize_then_sum")]:
        fixture["grpo_advantages"]["cases"].append(
            {"scale_rewards": scale, "aggregation": agg,
             "advantages": t(grpo_advantages(rpf, weights, 4, scale, agg))})

    # GRPO losses: B 4 rows of T 6 completion tokens, one row fully masked.
    B, T = 4, 6
    lp = (torch.randn(B, T, dtype=D) * 0.3 - 1.0)
    old = lp + torch.randn(B, T, dtype=D) * 0.25
    ref = lp + torch.randn(B, T, dtype=D) * 0.2
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=D)
    adv = torch.tensor([1.2, -0.7, 0.4, 0.9], dtype=D)
    base = {"epsilon_low": 0.2, "epsilon_high": 0.2, "beta": 0.0, "type": "dapo", "sequence_level": False,
            "max_completion_length": 8, "num_items_in_batch": 24.0, "num_processes": 2,
            "gradient_accumulation_steps": 1, "use_old": True}
    variants = [{}, {"type": "grpo", "beta": 0.04, "epsilon_high": 0.28}, {"type": "bnpo", "beta": 0.1},
                {"type": "dr_grpo", "gradient_accumulation_steps": 2}, {"type": "grpo", "sequence_level": True},
                {"type": "grpo", "use_old": False, "beta": 0.04}]
    fixture["grpo_loss"] = {"logps": t(lp), "old_logps": t(old), "ref_logps": t(ref), "mask": t(mask),
                            "advantages": t(adv), "cases": []}
    for v in variants:
        o = dict(base, **v)
        x = lp.clone().requires_grad_(True)
        loss, clip_fraction = grpo_loss(x, old if o["use_old"] else None, ref, mask, adv, o)
        loss.backward()
        fixture["grpo_loss"]["cases"].append({"options": o, "loss": loss.item(), "clip_fraction": clip_fraction.item(),
                                              "grad": t(x.grad)})

    # RLOO: 3 groups of 3 rollouts, one unscorable row, one group with a single scorable row.
    rpf3 = torch.randn(9, 2, dtype=D)
    rpf3[2, :] = torch.nan
    rpf3[6:8, :] = torch.nan
    kl_sums = torch.randn(9, dtype=D).abs() * 0.5
    fixture["rloo_advantages"] = {"rewards_per_func": t(rpf3), "weights": t(weights), "group_size": 3,
                                  "kl_sums": t(kl_sums), "cases": []}
    for beta, normalize, clip in [(0.0, False, None), (0.05, False, None), (0.05, True, None), (0.0, False, [-0.5, 0.5])]:
        fixture["rloo_advantages"]["cases"].append(
            {"beta": beta, "normalize": normalize, "clip": clip,
             "advantages": t(rloo_advantages(rpf3, weights, 3, beta, kl_sums, normalize, clip))})
    x = lp.clone().requires_grad_(True)
    loss, clip_fraction = rloo_loss(x, old, mask, adv, 0.2, 0.2)
    loss.backward()
    fixture["rloo_loss"] = {"epsilon": 0.2, "loss": loss.item(), "clip_fraction": clip_fraction.item(),
                            "grad": t(x.grad)}

    # REINFORCE++: 3 prompts x 2 samples, 5 action tokens, right padded, one row without actions.
    N, A = 6, 5
    r = torch.randn(N, dtype=D) * 2.0
    lp_a = torch.randn(N, A, dtype=D) * 0.5 - 1.0
    lb_a = lp_a + torch.randn(N, A, dtype=D) * 0.3
    amask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0],
                          [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=D)
    fixture["approx_kl"] = {"logps": t(lp_a), "ref_logps": t(lb_a),
                            "k1": t(compute_approx_kl(lp_a, lb_a, "k1")), "k2": t(compute_approx_kl(lp_a, lb_a, "k2")),
                            "k3": t(compute_approx_kl(lp_a, lb_a, "k3"))}
    kl = compute_approx_kl(lp_a, lb_a, "k1")
    fixture["reinforce"] = {"rewards": t(r), "kl": t(kl), "mask": t(amask), "cases": []}
    for est, gamma, kl_coef, no_std, clip in [("reinforce", 0.9, 0.01, False, (-10.0, 10.0)),
                                              ("reinforce_baseline", 1.0, 0.01, False, (-10.0, 10.0)),
                                              ("reinforce_baseline", 1.0, 0.0, True, (-10.0, 10.0)),
                                              ("rloo", 1.0, 0.05, False, (-1.0, 1.0)),
                                              ("group_norm", 1.0, 0.01, False, (-10.0, 10.0)),
                                              ("dr_grpo", 1.0, 0.01, False, (-10.0, 10.0))]:
        o = {"estimator": est, "samples_per_prompt": 2, "kl_coef": kl_coef, "gamma": gamma, "no_std_norm": no_std,
             "clip_low": clip[0], "clip_high": clip[1]}
        advantages, returns = reinforce(r, kl, amask, o)
        fixture["reinforce"]["cases"].append({"options": o, "advantages": t(advantages), "returns": t(returns)})

    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {out_file}")


if __name__ == "__main__":
    main()
