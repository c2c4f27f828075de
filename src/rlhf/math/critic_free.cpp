#include "dschat/rlhf/math/critic_free.h"

#include <limits>

#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// TRL's nanstd along `dim`: sqrt(nanmean((x - nanmean x)²) · c / (c - 1)), c the non-NaN count;
// NaN when c <= 1.
torch::Tensor nanstd(const torch::Tensor& x, int64_t dim) {
  const torch::Tensor count = x.isnan().logical_not().sum(dim).to(x.scalar_type());
  const torch::Tensor variance = (x - x.nanmean(dim, /*keepdim=*/true)).pow(2).nanmean(dim) * count / (count - 1);
  return torch::where(count > 1, variance.sqrt(), torch::full_like(variance, kNaN));
}

// Σ_f w_f r[n, f] over the scored functions; NaN for a row no function scored. [N]
torch::Tensor weighted_rewards(const torch::Tensor& rewards_per_func, const torch::Tensor& weights, int64_t group_size,
                               const char* who) {
  DSCHAT_CHECK(rewards_per_func.dim() == 2 && weights.dim() == 1 && weights.size(0) == rewards_per_func.size(1),
               InvalidArgument, who, ": expects rewards [N, F] and weights [F], got ", rewards_per_func.sizes(),
               " and ", weights.sizes());
  DSCHAT_CHECK(group_size >= 1 && rewards_per_func.size(0) % group_size == 0, InvalidArgument, who, ": ",
               rewards_per_func.size(0), " rollouts are not whole groups of ", group_size);
  const torch::Tensor unscorable = rewards_per_func.isnan().all(1);                             // [N]
  const torch::Tensor sum = (rewards_per_func * weights.to(rewards_per_func.dtype())).nansum(1);  // [N]
  return torch::where(unscorable, torch::full_like(sum, kNaN), sum);
}

// -min(c1·A, c2·A), c2 = clip(c1, 1-ε_lo, 1+ε_hi); and which entries the clip bound.
std::pair<torch::Tensor, torch::Tensor> clipped_surrogate(const torch::Tensor& ratio, const torch::Tensor& advantages,
                                                          double epsilon_low, double epsilon_high) {
  const torch::Tensor clipped_ratio = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high);
  const torch::Tensor loss = -torch::min(ratio * advantages, clipped_ratio * advantages);
  const torch::Tensor bound = ((ratio < 1.0 - epsilon_low) & (advantages < 0)) |
                              ((ratio > 1.0 + epsilon_high) & (advantages > 0));
  return {loss, bound};
}

void check_tokens(const torch::Tensor& logps, const torch::Tensor& mask, const torch::Tensor& advantages,
                  const char* who, bool token_advantages = false) {
  const bool advantages_fit = (advantages.dim() == 1 && advantages.size(0) == logps.size(0)) ||
                              (token_advantages && advantages.sizes() == logps.sizes());
  DSCHAT_CHECK(logps.dim() == 2 && mask.sizes() == logps.sizes() && advantages_fit, InvalidArgument, who,
               ": expects log-probs and mask [B, T] and advantages [B]", token_advantages ? " or [B, T]" : "",
               ", got ", logps.sizes(), ", ", mask.sizes(), " and ", advantages.sizes());
}

}  // namespace

torch::Tensor grpo_advantages(const torch::Tensor& rewards_per_func, const torch::Tensor& weights, int64_t group_size,
                              RewardScaling scaling, RewardAggregation aggregation) {
  const torch::Tensor rewards = weighted_rewards(rewards_per_func, weights, group_size, "grpo_advantages");  // [N]
  const int64_t n = rewards.size(0);
  torch::Tensor advantages;  // [N]
  if (aggregation == RewardAggregation::kSumThenNormalize) {
    const torch::Tensor grouped = rewards.view({-1, group_size});  // [N/G, G]
    advantages = (grouped - grouped.nanmean(1, /*keepdim=*/true)).reshape({n});
    if (scaling == RewardScaling::kGroup) {
      advantages = advantages / (nanstd(grouped, 1).repeat_interleave(group_size) + 1e-4);
    } else if (scaling == RewardScaling::kBatch) {
      advantages = advantages / (nanstd(rewards, 0) + 1e-4);
    }
  } else {
    const int64_t f = rewards_per_func.size(1);
    const torch::Tensor grouped = rewards_per_func.view({-1, group_size, f});  // [N/G, G, F]
    const torch::Tensor z = ((grouped - grouped.nanmean(1, true)) / (nanstd(grouped, 1).unsqueeze(1) + 1e-4))
                                .reshape({n, f});  // [N, F]
    // A z that is NaN only because its group's std is (one scored value) counts as 0 in the sum;
    // the rows no function scored stay NaN.
    const torch::Tensor summed = (z * weights.to(z.dtype())).nansum(1);  // [N]
    const torch::Tensor scored = torch::where(rewards.isnan(), rewards, summed);
    advantages = (scored - scored.nanmean()) / (nanstd(scored, 0) + 1e-4);
  }
  return torch::nan_to_num(advantages, 0.0);
}

PolicyLossOutput grpo_policy_loss(const torch::Tensor& logps, const torch::Tensor& old_logps,
                                  const torch::Tensor& ref_logps, const torch::Tensor& mask,
                                  const torch::Tensor& advantages, const GrpoLossOptions& options) {
  check_tokens(logps, mask, advantages, "grpo_policy_loss", /*token_advantages=*/true);
  DSCHAT_CHECK(options.beta == 0.0 || (ref_logps.defined() && ref_logps.sizes() == logps.sizes()), InvalidArgument,
               "grpo_policy_loss: beta ", options.beta, " needs reference log-probs shaped as the policy's ",
               logps.sizes());
  const torch::Tensor m = mask.to(logps.scalar_type());                              // [B, T]
  const torch::Tensor old = old_logps.defined() ? old_logps : logps.detach();         // [B, T]
  torch::Tensor log_ratio = logps - old;                                              // [B, T]
  if (options.sequence_level) {  // GSPO: [B, 1]
    log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp_min(1.0)).unsqueeze(-1);
  }
  const torch::Tensor ratio = log_ratio.exp();
  auto [per_token, bound] =
      clipped_surrogate(ratio, (advantages.dim() == 1 ? advantages.unsqueeze(1) : advantages).to(ratio.scalar_type()),
                        options.epsilon_low,
                        options.epsilon_high);  // [B, T] or [B, 1]
  torch::Tensor mean_kl = torch::zeros({}, logps.options().requires_grad(false));
  const torch::Tensor tokens = m.sum().clamp_min(1.0);  // []
  if (options.beta != 0.0) {
    const torch::Tensor d = ref_logps - logps;  // [B, T]
    // k3 with ref - logps and no clamp, as TRL; k1/k2 as OpenRLHF's compute_approx_kl.
    const torch::Tensor kl = options.kl_estimator == KlEstimator::kK3 ? d.exp() - d - 1.0
                                                                      : approx_kl(logps, ref_logps, options.kl_estimator);
    per_token = per_token + options.beta * kl;  // added after the min, per token
    mean_kl = ((kl * m).sum() / tokens).detach();
  }
  const torch::Tensor masked = per_token * m;  // [B, T]
  const double ga = static_cast<double>(options.gradient_accumulation_steps);
  torch::Tensor loss;
  switch (options.type) {
    case GrpoLossType::kGrpo: loss = (masked.sum(-1) / m.sum(-1).clamp_min(1.0)).mean() / ga; break;
    case GrpoLossType::kBnpo: loss = masked.sum() / tokens / ga; break;
    case GrpoLossType::kDrGrpo:
      loss = masked.sum() / static_cast<double>(logps.size(0) * options.max_completion_length) / ga;
      break;
    case GrpoLossType::kDapo:
      loss = masked.sum() / (std::max(options.num_items_in_batch, 1.0) / static_cast<double>(options.num_processes));
      break;
  }
  const torch::Tensor clip_fraction = ((bound.to(m.scalar_type()) * m).sum() / tokens).detach();
  return {loss, clip_fraction, mean_kl};
}

torch::Tensor rloo_advantages(const torch::Tensor& rewards_per_func, const torch::Tensor& weights, int64_t group_size,
                              double beta, const torch::Tensor& kl_sums, bool normalize, double clip_low,
                              double clip_high) {
  torch::Tensor rewards = weighted_rewards(rewards_per_func, weights, group_size, "rloo_advantages");  // [N]
  if (clip_low < clip_high) rewards = rewards.clamp(clip_low, clip_high);
  if (beta != 0.0) {
    DSCHAT_CHECK(kl_sums.defined() && kl_sums.sizes() == rewards.sizes(), InvalidArgument, "rloo_advantages: beta ",
                 beta, " needs per-row KL sums [", rewards.size(0), "]");
    rewards = rewards - beta * kl_sums.to(rewards.scalar_type());
  }
  const torch::Tensor grouped = rewards.view({-1, group_size});  // [N/G, G]
  const torch::Tensor count = grouped.isnan().logical_not().sum(1, true).to(grouped.scalar_type());  // [N/G, 1]
  const torch::Tensor baseline = (grouped.nansum(1, true) - grouped) / (count - 1);  // the others' mean
  torch::Tensor advantages = (grouped - baseline).reshape({-1});  // [N]
  if (normalize) advantages = (advantages - advantages.nanmean()) / (nanstd(advantages, 0) + 1e-4);
  return torch::nan_to_num(advantages, 0.0);
}

PolicyLossOutput rloo_policy_loss(const torch::Tensor& logps, const torch::Tensor& old_logps, const torch::Tensor& mask,
                                  const torch::Tensor& advantages, double epsilon_low, double epsilon_high) {
  check_tokens(logps, mask, advantages, "rloo_policy_loss");
  DSCHAT_CHECK(old_logps.defined() && old_logps.sizes() == logps.sizes(), InvalidArgument,
               "rloo_policy_loss: needs the sampling-time log-probs shaped as ", logps.sizes());
  const torch::Tensor m = mask.to(logps.scalar_type());  // [B, T]
  const torch::Tensor ratio = ((logps * m).sum(-1) - (old_logps.detach() * m).sum(-1)).exp();  // [B]
  auto [per_row, bound] = clipped_surrogate(ratio, advantages.to(ratio.scalar_type()), epsilon_low, epsilon_high);
  return {per_row.mean(), bound.to(ratio.scalar_type()).mean().detach(), torch::zeros({}, logps.options())};
}

torch::Tensor approx_kl(const torch::Tensor& logps, const torch::Tensor& ref_logps, KlEstimator estimator) {
  DSCHAT_CHECK(logps.sizes() == ref_logps.sizes(), InvalidArgument, "approx_kl: log-probs ", logps.sizes(),
               " and reference ", ref_logps.sizes(), " differ in shape");
  const torch::Tensor delta = logps.to(torch::kFloat32) - ref_logps.to(torch::kFloat32);
  torch::Tensor kl;
  switch (estimator) {
    case KlEstimator::kK1: kl = delta; break;
    case KlEstimator::kK2: kl = delta.pow(2) / 2.0; break;
    case KlEstimator::kK3: kl = (-delta).exp() - 1.0 + delta; break;
  }
  return kl.clamp(-10.0, 10.0);
}

ReinforceOutput reinforce_advantages(const torch::Tensor& rewards, const torch::Tensor& kl, const torch::Tensor& mask,
                                     const ReinforceOptions& options) {
  const int64_t n = options.samples_per_prompt;
  DSCHAT_CHECK(rewards.dim() == 1 && mask.dim() == 2 && mask.size(0) == rewards.size(0) && n >= 1 &&
                   rewards.size(0) % n == 0 && (!kl.defined() || kl.sizes() == mask.sizes()),
               InvalidArgument, "reinforce_advantages: expects rewards [N], mask and kl [N, A] and N a multiple of ",
               "samples_per_prompt ", n, "; got ", rewards.sizes(), ", ", mask.sizes());
  const torch::Tensor r = rewards.to(torch::kFloat32);
  const torch::Tensor g = r.view({-1, n});  // [N/n, n]
  torch::Tensor shaped = r;                 // [N]
  switch (options.estimator) {
    case ReinforceEstimator::kReinforce: break;
    case ReinforceEstimator::kRloo:
      DSCHAT_CHECK(n > 1, InvalidArgument, "reinforce_advantages: rloo needs samples_per_prompt > 1");
      shaped = (g - (g.sum(1, true) - g) / static_cast<double>(n - 1)).reshape({-1});
      break;
    case ReinforceEstimator::kReinforceBaseline:
    case ReinforceEstimator::kDrGrpo: shaped = (g - g.mean(1, true)).reshape({-1}); break;
    case ReinforceEstimator::kGroupNorm:
      shaped = ((g - g.mean(1, true)) / (g.std(1, /*unbiased=*/true, /*keepdim=*/true) + 1e-9)).reshape({-1});
      break;
  }
  shaped = shaped.clamp(options.clip_low, options.clip_high);
  const torch::Tensor m = mask.to(torch::kFloat32);  // [N, A]
  const int64_t length = m.size(1);
  // The last action token of each row (the last position when a row has none).
  const torch::Tensor from_end = m.fliplr().argmax(1, /*keepdim=*/true);  // [N, 1]
  const torch::Tensor last = (length - 1) - from_end;
  const double beta = options.kl_coef > 0.0 ? options.kl_coef : 0.0;
  torch::Tensor per_token = kl.defined() && beta > 0.0 ? -beta * kl.to(torch::kFloat32) : torch::zeros_like(m);
  per_token = per_token.scatter_add(1, last, shaped.unsqueeze(1));  // [N, A]
  const bool discounted = options.estimator == ReinforceEstimator::kReinforce;
  const double gamma = discounted ? options.gamma : 1.0;
  torch::Tensor returns = torch::zeros_like(m);   // [N, A]
  torch::Tensor running = torch::zeros({m.size(0)}, m.options());  // [N]
  const torch::Tensor masked = per_token * m;
  for (int64_t t = length - 1; t >= 0; --t) {
    running = masked.select(1, t) + gamma * running;
    returns.select(1, t).copy_(running);
  }
  torch::Tensor advantages = returns;
  if (options.estimator == ReinforceEstimator::kReinforce || options.estimator == ReinforceEstimator::kReinforceBaseline) {
    const torch::Tensor tokens = m.sum();
    const torch::Tensor mean = (m * returns).sum() / tokens;
    const torch::Tensor centred = returns - mean;
    advantages = options.no_std_norm ? centred
                                     : centred * ((m * centred.pow(2)).sum() / tokens).clamp_min(1e-8).rsqrt();
  }
  return {advantages, returns};
}

}  // namespace rlhf
}  // namespace dschat
