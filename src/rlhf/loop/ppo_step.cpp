#include "dschat/rlhf/loop/ppo_step.h"

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/rlhf/math/ppo_math.h"
#include "dschat/rlhf/math/sft_loss.h"

namespace dschat {
namespace rlhf {

namespace {

// DeepSpeed-Chat's align_overflow: when exactly one of actor and critic overflowed in this
// window, the other skips too, so the pair never steps out of step with each other.
void align_overflow_skips(engine::TrainingEngine& actor, engine::TrainingEngine& critic) {
  const bool actor_overflow = actor.check_overflow();
  const bool critic_overflow = critic.check_overflow();
  if (actor_overflow && !critic_overflow) {
    critic.skip_next_step();
    core::log_warn("OVERFLOW: actor overflow, skipping both actor and critic steps");
  } else if (!actor_overflow && critic_overflow) {
    actor.skip_next_step();
    core::log_warn("OVERFLOW: critic overflow, skipping both actor and critic steps");
  } else if (actor_overflow && critic_overflow) {
    core::log_warn("OVERFLOW: actor and critic overflow, skipping both actor and critic steps");
  }
}

}  // namespace

PpoStepStats train_rlhf(RlhfModels& models, const Experience& exp, const PpoConstants& constants,
                        bool compute_fp32_loss, bool align_overflow) {
  const int64_t start = action_start(exp.prompt_length);
  const torch::Tensor action_mask = exp.attention_mask.slice(1, 1);  // [B, L-1]
  const PpoTargets targets = compute_ppo_targets(start, exp.logprobs, exp.ref_logprobs, exp.reward_score, exp.values,
                                                 action_mask, constants);
  const torch::Tensor answer_mask = action_mask.slice(1, start);  // [B, L-1-start]
  PpoStepStats stats;  // left on the device: the trainer reads a print interval's at once
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor kl = (exp.logprobs - exp.ref_logprobs).slice(1, start);  // [B, L-1-start]
    stats.kl = masked_mean(kl, answer_mask);                                    // []
    stats.mean_reward = exp.reward_score.mean();                                // []
    stats.mean_answer_tokens = answer_mask.sum(1).to(torch::kFloat64).mean();   // []
  }

  // Actor: clipped policy loss over the answer actions.
  models::CausalLM& actor = models.actor->actor();
  torch::Tensor logits = actor->forward(exp.seq, exp.attention_mask, exp.mask_layout);                  // [B, L, V]
  torch::Tensor new_logprobs = gather_log_probs(logits, exp.seq).slice(1, start);     // [B, L-1-start]
  PpoLoss actor_out = actor_loss(new_logprobs, exp.logprobs.slice(1, start), targets.advantages, answer_mask,
                                 constants);
  {
    // The policy's entropy at the answer actions (the guardian's collapse signal), from the same
    // logits: H = logsumexp(z) - sum(softmax(z) z), in float32.
    // One row at a time: the float32 temporaries stay [L-1-start, V], not [B, L-1-start, V].
    torch::NoGradGuard no_grad;
    const torch::Tensor answer_logits = logits.detach().slice(1, start, -1);  // [B, L-1-start, V]
    std::vector<torch::Tensor> rows;                                           // each [L-1-start]
    for (int64_t b = 0; b < answer_logits.size(0); ++b) {
      const torch::Tensor z = answer_logits[b].to(torch::kFloat32);  // [L-1-start, V]
      rows.push_back(z.logsumexp(-1) - (z.softmax(-1) * z).sum(-1));
    }
    stats.entropy = masked_mean(torch::stack(rows), answer_mask);  // []
  }
  models.actor->backward(actor_out.loss);
  // Without alignment the actor steps before the critic's forward, as DeepSpeed-Chat does.
  if (!align_overflow) models.actor->step();
  stats.actor_loss = actor_out.loss.detach();
  stats.actor_clip_fraction = actor_out.clip_fraction;

  // Critic: clipped value loss against the GAE returns.
  torch::Tensor values = models.critic->forward(exp.seq, exp.attention_mask, exp.mask_layout).slice(1, 0, -1).slice(1, start);
  PpoLoss critic_out = critic_loss(values, targets.old_values.slice(1, start), targets.returns, answer_mask, constants,
                                   compute_fp32_loss);
  models.critic_engine->backward(critic_out.loss);
  if (align_overflow) align_overflow_skips(models.actor->training_engine(), *models.critic_engine);
  models.critic_engine->step();
  if (align_overflow) models.actor->step();
  stats.critic_loss = critic_out.loss.detach();
  stats.critic_clip_fraction = critic_out.clip_fraction;
  return stats;
}

torch::Tensor train_unsupervised(RlhfModels& models, const data::SftBatch& batch, double unsup_coef) {
  models::CausalLM& actor = models.actor->actor();
  const data::SftBatch on_device = batch.to(parameter_device(*actor), /*non_blocking=*/true);
  torch::Tensor logits = actor->forward(on_device.input_ids, on_device.attention_mask, nn::MaskLayout::kRightPadded);  // [B, T, V]
  torch::Tensor loss = causal_lm_loss(logits, on_device.labels);                       // []
  models.actor->backward(loss * unsup_coef);
  models.actor->step();
  return loss.detach();
}

namespace {
constexpr int kFields = 8;  // the PpoStepStats fields a micro-step adds, in order
}  // namespace

void PpoStatsQueue::begin_step() { steps_.emplace_back(); }

void PpoStatsQueue::add(const PpoStepStats& stats) {
  DSCHAT_CHECK(!steps_.empty(), InvalidArgument, "PpoStatsQueue::add before begin_step");
  const torch::Device device = stats.kl.device();
  std::vector<torch::Tensor> fields = {stats.actor_loss,  stats.critic_loss, stats.actor_clip_fraction,
                                       stats.critic_clip_fraction, stats.kl, stats.mean_reward,
                                       stats.mean_answer_tokens, stats.entropy};
  // Widened to float64 on the device: exact, as item<double>() would be.
  for (torch::Tensor& field : fields) field = field.detach().to(device, torch::kFloat64).reshape({1});  // [1]
  steps_.back().micro.push_back(torch::cat(fields));  // [kFields]
}

void PpoStatsQueue::add_unsupervised(const torch::Tensor& loss) {
  DSCHAT_CHECK(!steps_.empty(), InvalidArgument, "PpoStatsQueue::add_unsupervised before begin_step");
  steps_.back().unsup.push_back(loss.detach().to(torch::kFloat64).reshape({1}));  // [1]
}

std::vector<PpoStepMeans> PpoStatsQueue::read() {
  std::vector<torch::Tensor> parts;  // every pending value in step order, [kFields] and [1] pieces
  for (const Step& step : steps_) {
    parts.insert(parts.end(), step.micro.begin(), step.micro.end());
    parts.insert(parts.end(), step.unsup.begin(), step.unsup.end());
  }
  torch::Tensor host;  // [n] float64: the one copy to the host
  if (!parts.empty()) {
    const torch::Device device = parts.front().device();
    for (torch::Tensor& part : parts) part = part.to(device);
    host = torch::cat(parts).to(torch::kCPU).contiguous();
  }
  const double* value = host.defined() ? host.data_ptr<double>() : nullptr;
  std::vector<PpoStepMeans> out;
  for (const Step& step : steps_) {
    // Summed from 0.0 in micro-step order, as the host sums were before the reads were deferred.
    double sums[kFields] = {};
    for (size_t m = 0; m < step.micro.size(); ++m, value += kFields) {
      for (int f = 0; f < kFields; ++f) sums[f] += value[f];
    }
    double unsup_sum = 0.0;
    for (size_t u = 0; u < step.unsup.size(); ++u) unsup_sum += *value++;
    PpoStepMeans means;
    means.micro_steps = static_cast<int64_t>(step.micro.size());
    const auto mean = [&](double total) {
      return means.micro_steps > 0 ? total / static_cast<double>(means.micro_steps) : 0.0;
    };
    means.actor_loss = mean(sums[0]);
    means.critic_loss = mean(sums[1]);
    means.actor_clip_fraction = mean(sums[2]);
    means.critic_clip_fraction = mean(sums[3]);
    means.kl = mean(sums[4]);
    means.mean_reward = mean(sums[5]);
    means.mean_answer_tokens = mean(sums[6]);
    means.entropy = mean(sums[7]);
    means.unsup_loss = mean(unsup_sum);
    out.push_back(means);
  }
  steps_.clear();
  return out;
}

}  // namespace rlhf
}  // namespace dschat
