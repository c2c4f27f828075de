#pragma once
// Critic-free policy optimisation as the reference implementations compute it
// (shared/reference/rl-algorithms.md has the formulas, upstream files and commits): GRPO's
// advantages and policy loss (TRL GRPOTrainer), RLOO's (TRL RLOOTrainer) and REINFORCE++'s
// token-level returns and advantages (OpenRLHF). Plain tensor functions over the rewards and the
// completion tokens' log-probs; critic_free_trainer.h samples, scores and steps with them.
//
// Shapes: N rollouts in groups of `group_size` contiguous rows (the samples of one prompt),
// F reward functions, B rows of completion tokens of length T, `mask` 1 on completion tokens.
//   torch::Tensor adv = rlhf::grpo_advantages(rewards, weights, 8, rlhf::RewardScaling::kGroup);  // [N]
//   rlhf::PolicyLossOutput out = rlhf::grpo_policy_loss(logps, old, ref, mask, adv, options);

#include <torch/torch.h>

#include <cstdint>

namespace dschat {
namespace rlhf {

/// GRPO's scale_rewards: by the group's std ("group", TRL's default), the whole batch's ("batch",
/// the mean stays the group's) or not at all ("none", Dr. GRPO).
enum class RewardScaling { kNone, kGroup, kBatch };
/// TRL's multi_objective_aggregation: weighted sum then group normalisation (default), or each
/// function normalised in its group, then summed and normalised over the batch.
enum class RewardAggregation { kSumThenNormalize, kNormalizeThenSum };

/// [N] GRPO advantages. rewards_per_func: [N, F], NaN where a function gave no reward (a row with
/// none is unscorable: advantage 0); weights: [F]. Standard deviations are Bessel-corrected and
/// NaN below two values (advantage 0), 1e-4 is added to them.
torch::Tensor grpo_advantages(const torch::Tensor& rewards_per_func, const torch::Tensor& weights, int64_t group_size,
                              RewardScaling scaling, RewardAggregation aggregation = RewardAggregation::kSumThenNormalize);

/// TRL's loss_type: how the masked per-token losses are reduced.
enum class GrpoLossType {
  kGrpo,    // per row: Σ_t / Σ_t mask, then the mean over rows; / GA
  kBnpo,    // Σ / Σ mask over the micro-batch; / GA
  kDrGrpo,  // Σ / (B · max_completion_length); / GA
  kDapo,    // Σ / (num_items_in_batch / num_processes): tokens of the whole generation batch
};

/// OpenRLHF's compute_approx_kl: δ = logps - ref_logps; k1 δ, k2 δ²/2, k3 exp(-δ) - 1 + δ; clamped
/// to [-10, 10]. [N, A] in fp32.
enum class KlEstimator { kK1, kK2, kK3 };
torch::Tensor approx_kl(const torch::Tensor& logps, const torch::Tensor& ref_logps, KlEstimator estimator);

struct GrpoLossOptions {
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;  // DAPO's asymmetric clip: larger than epsilon_low
  double beta = 0.0;          // the KL to the reference, per token; 0: no reference needed
  KlEstimator kl_estimator = KlEstimator::kK3;  // k3: TRL's exp(ref - lp) - (ref - lp) - 1, unclamped
  GrpoLossType type = GrpoLossType::kDapo;
  bool sequence_level = false;  // GSPO: one importance weight per row, the mean of its log-ratios
  int64_t max_completion_length = 512;  // kDrGrpo's divisor
  double num_items_in_batch = 1.0;      // kDapo: completion tokens of the generation batch, all ranks
  int64_t num_processes = 1;            // kDapo
  int64_t gradient_accumulation_steps = 1;
};

struct PolicyLossOutput {
  torch::Tensor loss;           // [] differentiable in the current log-probs
  torch::Tensor clip_fraction;  // [] share of masked tokens (rows for RLOO) whose ratio was clipped
  torch::Tensor mean_kl;        // [] masked mean of the per-token KL (0 without a reference)
};

/// GRPO's clipped surrogate. logps, ref_logps, old_logps, mask: [B, T]; advantages: [B], or [B, T]
/// per token (REINFORCE++, whose loss is this one with OpenRLHF's PolicyLoss reductions: kBnpo for
/// its token-level mean, kGrpo for its per-sequence mean).
/// old_logps undefined: the current ones, detached (one update per generation); ref_logps may be
/// undefined when beta is 0.
PolicyLossOutput grpo_policy_loss(const torch::Tensor& logps, const torch::Tensor& old_logps,
                                  const torch::Tensor& ref_logps, const torch::Tensor& mask,
                                  const torch::Tensor& advantages, const GrpoLossOptions& options);

/// [N] RLOO advantages: the weighted reward (NaN if unscorable; clipped to [clip_low, clip_high]
/// when clip_low < clip_high) minus beta · kl_sums (Σ_t mask·(old - ref) per row; undefined when
/// beta is 0), minus the mean of the other scorable rewards of its group; optionally normalised
/// over the batch (Bessel std + 1e-4). NaN becomes 0.
torch::Tensor rloo_advantages(const torch::Tensor& rewards_per_func, const torch::Tensor& weights, int64_t group_size,
                              double beta, const torch::Tensor& kl_sums, bool normalize, double clip_low = 0.0,
                              double clip_high = 0.0);

/// RLOO's loss: one ratio per row from the summed log-probs, clipped, averaged over rows.
PolicyLossOutput rloo_policy_loss(const torch::Tensor& logps, const torch::Tensor& old_logps, const torch::Tensor& mask,
                                  const torch::Tensor& advantages, double epsilon_low, double epsilon_high);

/// OpenRLHF's advantage_estimator values of the REINFORCE family.
enum class ReinforceEstimator { kReinforce, kRloo, kReinforceBaseline, kGroupNorm, kDrGrpo };

struct ReinforceOptions {
  ReinforceEstimator estimator = ReinforceEstimator::kReinforceBaseline;
  int64_t samples_per_prompt = 1;
  double kl_coef = 0.0;  // β of the per-token KL penalty in the reward (≤ 0: none)
  double clip_low = -10.0, clip_high = 10.0;  // the shaped reward's clip (after the baseline)
  double gamma = 1.0;     // kReinforce only; the others use 1
  bool no_std_norm = false;
};

struct ReinforceOutput {
  torch::Tensor advantages;  // [N, A]
  torch::Tensor returns;     // [N, A]
};

/// REINFORCE++ advantages: the group baseline on the scalar rewards [N], the clip, the reward on
/// each row's last action token and -β·kl [N, A] (undefined: none) on every token, discounted
/// returns over the masked tokens (mask [N, A], right padded), then for kReinforce and
/// kReinforceBaseline the token-weighted global normalisation (biased variance, 1e-8 floor),
/// applied at every position, padding included, as upstream.
ReinforceOutput reinforce_advantages(const torch::Tensor& rewards, const torch::Tensor& kl, const torch::Tensor& mask,
                                     const ReinforceOptions& options);

}  // namespace rlhf
}  // namespace dschat
