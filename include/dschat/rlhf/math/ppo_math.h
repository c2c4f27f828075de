#pragma once
// The tensor math of DeepSpeed-Chat's step 3 (dschat/rlhf/ppo_trainer.py, utils.moving_average) as
// plain functions, operation for operation, so a trainer can be checked against the Python one.
// Index conventions (docs/rlhf.md has the derivations):
//   seq            [B, L]    prompt (left-padded to P columns) followed by the answer
//   log_probs      [B, L-1]  column t = log p(seq[:, t+1] | seq[:, :t+1]): "action" t makes token t+1
//   action_mask    [B, L-1]  = (seq != pad)[:, 1:]
//   start          = P - 1   the first action that produces an answer token
//   ends           [B]       = start + action_mask[:, start:].sum(1) + 1 (one past the reward slot)
// Apart from ema_update, nothing here mutates its inputs (DeepSpeed-Chat zeroes the experience's
// values in place).

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace dschat {
namespace rlhf {

/// DeepSpeed-Chat's hard-coded PPO constants (DeepSpeedPPOTrainer.__init__).
struct PpoConstants {
  double kl_ctl = 0.1;             // KL penalty coefficient (0.02 before Jul 2023)
  double clip_reward_value = 5.0;  // the reward-model score is clamped to [-5, 5]
  double cliprange = 0.2;          // policy ratio clip: [1 - 0.2, 1 + 0.2]
  double cliprange_value = 0.2;    // value clip around the old values
  double gamma = 1.0;              // GAE discount
  double lam = 0.95;               // GAE lambda
};

/// moving_average's default decay: ema <- lerp(theta, ema, 0.992).
constexpr double kEmaBeta = 0.992;

/// DeepSpeed-Chat's drop rule: an answer with at most one non-pad token is discarded.
constexpr int64_t kMinAnswerTokens = 2;

/// start = prompt_length - 1 (train_rlhf: `prompts.size()[-1] - 1`); prompt_length must be >= 1.
int64_t action_start(int64_t prompt_length);

/// Non-pad tokens of each answer: (seq[:, prompt_length:] != pad).sum(-1) -> [B] int64.
/// seq: [B, L] integer ids.
torch::Tensor answer_lengths(const torch::Tensor& seq, int64_t prompt_length, int64_t pad_token_id);

/// The rows _generate_sequence keeps: answer_lengths >= min_answer_tokens (DS-Chat drops
/// `valid_ans_len <= 1`). Returns ascending row indices [K] int64 on seq's device; K == 0 when
/// every row is dropped (DS-Chat then falls back to the previous step's experience, and asserts on
/// the first step; the caller decides here).
torch::Tensor answer_keep_rows(const torch::Tensor& seq, int64_t prompt_length, int64_t pad_token_id,
                               int64_t min_answer_tokens = kMinAnswerTokens);

/// ends = start + action_mask[:, start:].sum(1) + 1 -> [B] int64. action_mask: [B, L-1].
torch::Tensor reward_end_indices(int64_t start, const torch::Tensor& action_mask);

/// DeepSpeed-Chat's compute_rewards. Returns rewards [B, L-1] (dtype of log_probs):
///   rewards = -kl_ctl * (log_probs - ref_log_probs)
///   rewards[i, min(ends_i, L-1) - 1] += clamp(reward_score_i, -clip, clip)
/// (Python's `rewards[j, start:ends[j]][-1]`: the slice stops at L-1 when the answer fills the row.)
/// log_probs, ref_log_probs, action_mask: [B, L-1]; reward_score: [B]. Requires 0 <= start < L-1.
torch::Tensor compute_rewards(int64_t start, const torch::Tensor& log_probs, const torch::Tensor& ref_log_probs,
                              const torch::Tensor& reward_score, const torch::Tensor& action_mask,
                              const PpoConstants& constants = {});

/// A copy of x [B, N] with x[i, ends_i:] = 0 (train_rlhf's loop over old_rewards and old_values).
torch::Tensor zero_after_end(const torch::Tensor& x, const torch::Tensor& ends);

struct AdvantagesAndReturns {
  torch::Tensor advantages;  // [B, L-1-start], detached
  torch::Tensor returns;     // [B, L-1-start] = advantages + values[:, start:]
};

/// get_advantages_and_returns: GAE over columns [start, L-1), walked backwards with
///   delta_t = r_t + gamma * V_{t+1} - V_t,  A_t = delta_t + gamma * lam * A_{t+1},
/// V_{L-1} = A_{L-1} = 0. values, rewards: [B, L-1] (already zeroed past `ends`).
AdvantagesAndReturns get_advantages_and_returns(const torch::Tensor& values, const torch::Tensor& rewards,
                                                int64_t start, const PpoConstants& constants = {});

/// Everything train_rlhf computes under no_grad before the forwards, from one experience.
struct PpoTargets {
  torch::Tensor rewards;     // [B, L-1] compute_rewards, zeroed from ends on
  torch::Tensor old_values;  // [B, L-1] the critic's values, zeroed from ends on
  torch::Tensor advantages;  // [B, L-1-start]
  torch::Tensor returns;     // [B, L-1-start]
};

/// compute_rewards + zero_after_end (rewards and values) + get_advantages_and_returns, no grad.
/// values: [B, L-1] (forward_value(...)[:, :-1]); other shapes as compute_rewards.
PpoTargets compute_ppo_targets(int64_t start, const torch::Tensor& log_probs, const torch::Tensor& ref_log_probs,
                               const torch::Tensor& reward_score, const torch::Tensor& values,
                               const torch::Tensor& action_mask, const PpoConstants& constants = {});

/// sum(x * mask) / sum(mask) over all elements (DS-Chat's reduction: one mean over the whole
/// micro-batch, not per row). x, mask: same shape; mask of any dtype (0/1). Returns a scalar of
/// x's dtype; an all-zero mask gives NaN, as in DS-Chat (its answer filter guarantees a token).
torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask);

struct PpoLoss {
  torch::Tensor loss;           // [] differentiable
  torch::Tensor clip_fraction;  // [] detached: masked share of tokens where the clipped term won
};

/// actor_loss_fn: ratio = exp((logprobs - old_logprobs) * mask),
///   loss = masked_mean(max(-A * ratio, -A * clamp(ratio, 1 - cliprange, 1 + cliprange)), mask).
/// clip_fraction = masked_mean(clipped term > unclipped term) (our addition, as trl's pg_clipfrac).
/// All inputs: [B, L-1-start] (the `[:, start:]` slices).
PpoLoss actor_loss(const torch::Tensor& logprobs, const torch::Tensor& old_logprobs, const torch::Tensor& advantages,
                   const torch::Tensor& mask, const PpoConstants& constants = {});

/// critic_loss_fn: V_clip = clamp(V, old - cliprange_value, old + cliprange_value),
///   loss = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2), mask).
/// compute_fp32 casts V and V_clip to float32 before the squares (--compute_fp32_loss).
/// clip_fraction = masked_mean((V_clip - R)^2 > (V - R)^2) (trl's vf_clipfrac).
/// All inputs: [B, L-1-start].
PpoLoss critic_loss(const torch::Tensor& values, const torch::Tensor& old_values, const torch::Tensor& returns,
                    const torch::Tensor& mask, const PpoConstants& constants = {}, bool compute_fp32 = false);

/// moving_average without ZeRO-3: for every parameter of `model`, the parameter of the same name in
/// `ema` becomes torch.lerp(theta, ema, beta) = ema + (1 - beta) * (theta - ema) (theta cast to
/// ema's dtype and device first), in place, without autograd. DS-Chat zips parameters() by
/// position; this matches names and throws core::InvalidArgument when the two modules' names or
/// shapes differ, listing the first mismatch.
void ema_update(const torch::nn::Module& model, torch::nn::Module& ema, double beta = kEmaBeta);

}  // namespace rlhf
}  // namespace dschat
