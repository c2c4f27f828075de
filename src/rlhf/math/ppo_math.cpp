#include "dschat/rlhf/math/ppo_math.h"

#include <string>
#include <vector>

#include "core/tensor_util.h"
#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {
using core::shape_of;
namespace {


void check_dim(const char* op, const char* name, const torch::Tensor& t, int64_t dim) {
  DSCHAT_CHECK(t.defined(), InvalidArgument, op, ": ", name, " is undefined");
  DSCHAT_CHECK(t.dim() == dim, InvalidArgument, op, ": expected ", name, " to have ", dim, " dims, got ",
               shape_of(t));
}

void check_same_shape(const char* op, const char* name, const torch::Tensor& t, const char* ref_name,
                      const torch::Tensor& ref) {
  DSCHAT_CHECK(t.defined(), InvalidArgument, op, ": ", name, " is undefined");
  DSCHAT_CHECK(t.sizes() == ref.sizes(), InvalidArgument, op, ": expected ", name, " ", shape_of(t),
               " to have the shape of ", ref_name, " ", shape_of(ref));
}

// DS-Chat slices every per-action tensor from `start`; a start outside [0, N) would make its
// `rewards[j, start:ends[j]][-1]` an IndexError and GAE an empty stack.
void check_start(const char* op, int64_t start, int64_t actions) {
  DSCHAT_CHECK(start >= 0 && start < actions, InvalidArgument, op, ": start ", start,
               " must index an action column in [0, ", actions, ")");
}

}  // namespace

int64_t action_start(int64_t prompt_length) {
  DSCHAT_CHECK(prompt_length >= 1, InvalidArgument, "action_start: prompt_length must be >= 1, got ",
               prompt_length);
  return prompt_length - 1;
}

torch::Tensor answer_lengths(const torch::Tensor& seq, int64_t prompt_length, int64_t pad_token_id) {
  check_dim("answer_lengths", "seq", seq, 2);
  DSCHAT_CHECK(prompt_length >= 0 && prompt_length <= seq.size(1), InvalidArgument,
               "answer_lengths: prompt_length ", prompt_length, " outside [0, ", seq.size(1), "]");
  torch::Tensor answers = seq.slice(1, prompt_length);  // [B, L - P]
  return answers.ne(pad_token_id).sum(-1);              // [B] int64
}

torch::Tensor answer_keep_rows(const torch::Tensor& seq, int64_t prompt_length, int64_t pad_token_id,
                               int64_t min_answer_tokens) {
  torch::Tensor lengths = answer_lengths(seq, prompt_length, pad_token_id);  // [B]
  // nonzero of an all-false mask is a [0, 1] tensor: an empty keep set, never an error.
  return torch::nonzero(lengths.ge(min_answer_tokens)).reshape({-1});  // [K]
}

torch::Tensor reward_end_indices(int64_t start, const torch::Tensor& action_mask) {
  check_dim("reward_end_indices", "action_mask", action_mask, 2);
  check_start("reward_end_indices", start, action_mask.size(1));
  // Counted in int64 whatever the mask dtype, as DS-Chat's `.long()` attention mask is.
  torch::Tensor answer_tokens = action_mask.slice(1, start).ne(0).sum(1);  // [B] int64
  return answer_tokens + (start + 1);                                      // [B]
}

torch::Tensor compute_rewards(int64_t start, const torch::Tensor& log_probs, const torch::Tensor& ref_log_probs,
                              const torch::Tensor& reward_score, const torch::Tensor& action_mask,
                              const PpoConstants& constants) {
  check_dim("compute_rewards", "log_probs", log_probs, 2);
  check_same_shape("compute_rewards", "ref_log_probs", ref_log_probs, "log_probs", log_probs);
  check_same_shape("compute_rewards", "action_mask", action_mask, "log_probs", log_probs);
  check_dim("compute_rewards", "reward_score", reward_score, 1);
  DSCHAT_CHECK(reward_score.size(0) == log_probs.size(0), InvalidArgument, "compute_rewards: reward_score ",
               shape_of(reward_score), " does not match the batch of log_probs ", shape_of(log_probs));
  const int64_t actions = log_probs.size(1);
  check_start("compute_rewards", start, actions);

  torch::Tensor rewards = (log_probs - ref_log_probs) * (-constants.kl_ctl);  // [B, L-1]
  torch::Tensor ends = reward_end_indices(start, action_mask);                // [B]
  // `rewards[j, start:ends[j]][-1]`: the slice end is clipped to the row length, so a full-length
  // answer (ends == L) gets its score on the last action, L-2, not past the end.
  torch::Tensor slot = ends.clamp_max(actions).sub(1).unsqueeze(1);  // [B, 1]
  torch::Tensor score = torch::clamp(reward_score, -constants.clip_reward_value, constants.clip_reward_value)
                            .to(rewards.scalar_type())
                            .unsqueeze(1);  // [B, 1]
  rewards.scatter_add_(1, slot.to(rewards.device()), score.to(rewards.device()));
  return rewards;
}

torch::Tensor zero_after_end(const torch::Tensor& x, const torch::Tensor& ends) {
  check_dim("zero_after_end", "x", x, 2);
  check_dim("zero_after_end", "ends", ends, 1);
  DSCHAT_CHECK(ends.size(0) == x.size(0), InvalidArgument, "zero_after_end: ends ", shape_of(ends),
               " does not match the batch of x ", shape_of(x));
  torch::Tensor columns = torch::arange(x.size(1), ends.options().dtype(torch::kLong));  // [N]
  torch::Tensor past_end = columns.unsqueeze(0).ge(ends.to(torch::kLong).unsqueeze(1));   // [B, N]
  // masked_fill, not a multiply: DS-Chat assigns 0, which also clears a non-finite value.
  return x.masked_fill(past_end.to(x.device()), 0);
}

AdvantagesAndReturns get_advantages_and_returns(const torch::Tensor& values, const torch::Tensor& rewards,
                                                int64_t start, const PpoConstants& constants) {
  check_dim("get_advantages_and_returns", "rewards", rewards, 2);
  check_same_shape("get_advantages_and_returns", "values", values, "rewards", rewards);
  const int64_t length = rewards.size(1);
  check_start("get_advantages_and_returns", start, length);

  // The reverse recursion of trl's GAE, one column at a time as in DS-Chat; the scalar products
  // keep Python's evaluation order (gamma * nextvalues, then (gamma * lam) * lastgaelam).
  const double gamma_lam = constants.gamma * constants.lam;
  std::vector<torch::Tensor> reversed;  // each [B], columns length-1 down to start
  reversed.reserve(static_cast<size_t>(length - start));
  torch::Tensor lastgaelam;  // [B] A_{t+1}; undefined means 0 (the Python int 0 before the first step)
  for (int64_t t = length - 1; t >= start; --t) {
    torch::Tensor value_t = values.select(1, t);  // [B]
    torch::Tensor delta = t < length - 1 ? rewards.select(1, t) + values.select(1, t + 1) * constants.gamma - value_t
                                         : rewards.select(1, t) - value_t;  // [B]; V_{length} = 0
    lastgaelam = lastgaelam.defined() ? delta + lastgaelam * gamma_lam : delta;
    reversed.push_back(lastgaelam);
  }
  std::vector<torch::Tensor> columns(reversed.rbegin(), reversed.rend());
  torch::Tensor advantages = torch::stack(columns, 1);             // [B, L-1-start]
  torch::Tensor returns = advantages + values.slice(1, start);     // [B, L-1-start]
  return {advantages.detach(), returns};
}

PpoTargets compute_ppo_targets(int64_t start, const torch::Tensor& log_probs, const torch::Tensor& ref_log_probs,
                               const torch::Tensor& reward_score, const torch::Tensor& values,
                               const torch::Tensor& action_mask, const PpoConstants& constants) {
  torch::NoGradGuard no_grad;
  check_same_shape("compute_ppo_targets", "values", values, "log_probs", log_probs);
  PpoTargets out;
  torch::Tensor rewards =
      compute_rewards(start, log_probs, ref_log_probs, reward_score, action_mask, constants);  // [B, L-1]
  torch::Tensor ends = reward_end_indices(start, action_mask);  // [B]
  // Past the reward slot nothing may leak into the GAE targets ("otherwise the advantage/return
  // will be wrong"); DS-Chat zeroes the stored experience's values in place, we return a copy.
  out.rewards = zero_after_end(rewards, ends);
  out.old_values = zero_after_end(values, ends);
  AdvantagesAndReturns gae = get_advantages_and_returns(out.old_values, out.rewards, start, constants);
  out.advantages = gae.advantages;
  out.returns = gae.returns;
  return out;
}

torch::Tensor masked_mean(const torch::Tensor& x, const torch::Tensor& mask) {
  DSCHAT_CHECK(x.defined(), InvalidArgument, "masked_mean: x is undefined");
  check_same_shape("masked_mean", "mask", mask, "x", x);
  // x * mask in x's dtype, the count in int64 and then promoted to x's dtype by the division:
  // DS-Chat's `torch.sum(x * mask) / mask.sum()` with its long mask.
  torch::Tensor count = mask.ne(0).sum();  // [] int64
  return (x * mask.to(x.scalar_type())).sum() / count;
}

PpoLoss actor_loss(const torch::Tensor& logprobs, const torch::Tensor& old_logprobs, const torch::Tensor& advantages,
                   const torch::Tensor& mask, const PpoConstants& constants) {
  check_dim("actor_loss", "logprobs", logprobs, 2);
  check_same_shape("actor_loss", "old_logprobs", old_logprobs, "logprobs", logprobs);
  check_same_shape("actor_loss", "advantages", advantages, "logprobs", logprobs);
  check_same_shape("actor_loss", "mask", mask, "logprobs", logprobs);
  torch::Tensor m = mask.to(logprobs.scalar_type());                 // [B, A]
  torch::Tensor ratio = torch::exp((logprobs - old_logprobs) * m);   // [B, A]; masked tokens give ratio 1
  torch::Tensor unclipped = -advantages * ratio;                     // [B, A]
  torch::Tensor clipped =
      -advantages * torch::clamp(ratio, 1.0 - constants.cliprange, 1.0 + constants.cliprange);  // [B, A]
  PpoLoss out;
  out.loss = masked_mean(torch::max(unclipped, clipped), mask);
  torch::NoGradGuard no_grad;
  out.clip_fraction = masked_mean(clipped.gt(unclipped).to(logprobs.scalar_type()), mask).detach();
  return out;
}

PpoLoss critic_loss(const torch::Tensor& values, const torch::Tensor& old_values, const torch::Tensor& returns,
                    const torch::Tensor& mask, const PpoConstants& constants, bool compute_fp32) {
  check_dim("critic_loss", "values", values, 2);
  check_same_shape("critic_loss", "old_values", old_values, "values", values);
  check_same_shape("critic_loss", "returns", returns, "values", values);
  check_same_shape("critic_loss", "mask", mask, "values", values);
  torch::Tensor v = values;  // [B, A]
  torch::Tensor v_clipped = torch::clamp(values, old_values - constants.cliprange_value,
                                         old_values + constants.cliprange_value);  // [B, A]
  if (compute_fp32) {
    v = v.to(torch::kFloat);
    v_clipped = v_clipped.to(torch::kFloat);
  }
  torch::Tensor loss_unclipped = (v - returns).pow(2);        // [B, A]
  torch::Tensor loss_clipped = (v_clipped - returns).pow(2);  // [B, A]
  PpoLoss out;
  out.loss = masked_mean(torch::max(loss_unclipped, loss_clipped), mask) * 0.5;
  torch::NoGradGuard no_grad;
  out.clip_fraction = masked_mean(loss_clipped.gt(loss_unclipped).to(loss_clipped.scalar_type()), mask).detach();
  return out;
}

void ema_update(const torch::nn::Module& model, torch::nn::Module& ema, double beta) {
  torch::NoGradGuard no_grad;
  auto source = model.named_parameters();  // name -> parameter
  auto target = ema.named_parameters();    // name -> parameter
  DSCHAT_CHECK(source.size() == target.size(), InvalidArgument, "ema_update: the model has ", source.size(),
               " parameters, the EMA model ", target.size());
  for (const auto& item : source) {
    const torch::Tensor* ema_param = target.find(item.key());
    DSCHAT_CHECK(ema_param != nullptr, InvalidArgument, "ema_update: parameter '", item.key(),
                 "' is missing from the EMA model");
    DSCHAT_CHECK(ema_param->sizes() == item.value().sizes(), InvalidArgument, "ema_update: parameter '",
                 item.key(), "' is ", shape_of(item.value()), " in the model but ", shape_of(*ema_param),
                 " in the EMA model");
    torch::Tensor theta = item.value().detach().to(ema_param->device(), ema_param->scalar_type());  // param shape
    // torch.lerp(theta, ema, beta), as moving_average, then copied into the EMA parameter.
    ema_param->detach().copy_(torch::lerp(theta, ema_param->detach(), beta));
  }
}

}  // namespace rlhf
}  // namespace dschat
