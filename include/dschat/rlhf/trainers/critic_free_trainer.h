#pragma once
// The critic-free policy-optimisation step: GRPO, RLOO or REINFORCE++ (GrpoConfig's
// advantage_estimator) with rewards from reward models, rule-based verifiers, external programs
// or C++ callbacks (reward_sources.h). Per step, on every rank:
//   1. n_samples_per_prompt answers to each of per_device_generation_batch_size prompts, sampled
//      by the actor's HybridEngine (each prompt prefilled once, its KV cache shared by its n
//      answers), with the sampling-time and (kl_coef > 0) reference log-probs;
//   2. every reward source scores every answer; the weighted sum is the answer's reward;
//   3. with dynamic_sampling, groups whose rewards are all equal are dropped and more prompt
//      batches are drawn until the step is full (at most dynamic_sampling_max_batches; then the
//      dropped groups fill the rest: their advantage is 0);
//   4. the estimator's advantages (critic_free.h), then ppo_epochs passes over the answers in
//      micro-batches of per_device_training_batch_size: clipped policy loss, the KL term with
//      kl_mode "loss", backward, step; the EMA follows every micro-step (enable_ema).
// Logged per step: the reward's mean and its mean standard deviation within groups, each source's
// mean, the KL to the reference, the clip fraction, the answer length, the entropy, the share of
// groups kept, the loss and the times; resumable from its checkpoints like PPO; saves
// <output_dir>/actor (and actor_ema) with training_summary.json.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct GrpoResult {
  std::vector<double> step_rewards;  // mean reward of each step's answers (all ranks)
  std::vector<double> step_group_std;  // mean standard deviation of the rewards within a group
  std::map<std::string, double> last_source_means;  // each reward source's mean score, last step
  double mean_kl = 0.0;              // last step
  double mean_entropy = 0.0;         // last step
  int64_t steps = 0;
  int64_t dropped_groups = 0;        // dynamic sampling: groups without signal, all steps (this rank)
  double generate_seconds = 0.0, train_seconds = 0.0, seconds = 0.0;
  bool resumed = false;
  nlohmann::json to_json() const;
};

/// Collective. Errors as run_ppo; a reward source's failure stops the step before the update of
/// the batch it scored, naming the source.
GrpoResult run_grpo(const GrpoConfig& config, const StepContext& context);

}  // namespace rlhf
}  // namespace dschat
