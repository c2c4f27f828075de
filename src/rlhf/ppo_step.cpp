#include "dschat/rlhf/ppo_step.h"

#include "core/log.h"
#include "dschat/rlhf/ppo_math.h"
#include "dschat/rlhf/sft_loss.h"

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
  PpoStepStats stats;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor kl = (exp.logprobs - exp.ref_logprobs).slice(1, start);  // [B, L-1-start]
    stats.kl = masked_mean(kl, answer_mask).item<double>();
    stats.mean_reward = exp.reward_score.mean().item<double>();
    stats.mean_answer_tokens = answer_mask.sum(1).to(torch::kFloat64).mean().item<double>();
  }

  // Actor: clipped policy loss over the answer actions.
  models::CausalLM& actor = models.actor->actor();
  torch::Tensor logits = actor->forward(exp.seq, exp.attention_mask);                  // [B, L, V]
  torch::Tensor new_logprobs = gather_log_probs(logits, exp.seq).slice(1, start);     // [B, L-1-start]
  PpoLoss actor_out = actor_loss(new_logprobs, exp.logprobs.slice(1, start), targets.advantages, answer_mask,
                                 constants);
  models.actor->backward(actor_out.loss);
  // Without alignment the actor steps before the critic's forward, as DeepSpeed-Chat does.
  if (!align_overflow) models.actor->step();
  stats.actor_loss = actor_out.loss.item<double>();
  stats.actor_clip_fraction = actor_out.clip_fraction.item<double>();

  // Critic: clipped value loss against the GAE returns.
  torch::Tensor values = models.critic->forward(exp.seq, exp.attention_mask).slice(1, 0, -1).slice(1, start);
  PpoLoss critic_out = critic_loss(values, targets.old_values.slice(1, start), targets.returns, answer_mask, constants,
                                   compute_fp32_loss);
  models.critic_engine->backward(critic_out.loss);
  if (align_overflow) align_overflow_skips(models.actor->training_engine(), *models.critic_engine);
  models.critic_engine->step();
  if (align_overflow) models.actor->step();
  stats.critic_loss = critic_out.loss.item<double>();
  stats.critic_clip_fraction = critic_out.clip_fraction.item<double>();
  return stats;
}

double train_unsupervised(RlhfModels& models, const data::SftBatch& batch, double unsup_coef) {
  torch::Tensor logits = models.actor->actor()->forward(batch.input_ids, batch.attention_mask);  // [B, T, V]
  torch::Tensor loss = causal_lm_loss(logits, batch.labels);
  models.actor->backward(loss * unsup_coef);
  models.actor->step();
  return loss.item<double>();
}

}  // namespace rlhf
}  // namespace dschat
