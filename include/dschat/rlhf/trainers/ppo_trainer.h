#pragma once
// Step 3 of DeepSpeed-Chat (training/step3_rlhf_finetuning/main.py, dschat/rlhf/ppo_trainer.py):
// PPO over the four models of rlhf_models.h. Per prompt batch: experience (generate, drop
// too-short answers, score), buffered for `generation_batches` batches, then `ppo_epochs` passes
// over training micro-batches of per_device_training_batch_size: KL-penalised rewards, GAE,
// clipped actor loss (actor step), clipped value loss (critic step), optionally the mixture LM
// loss times unsup_coef (actor step) and the EMA update. Logged per step: reward (mean and EMA),
// KL to the reference, losses, clip fractions, answer lengths, generation vs training time; with
// warnings for the signs of collapse; the statistics stay on the device and are read every
// print_interval steps, before each checkpoint and at the end (the figures are those a read per
// micro-step would give). Saves <output_dir>/{actor, critic, actor_ema}.
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct PpoResult {
  std::vector<double> step_rewards;  // mean reward score of each PPO step (all ranks)
  double reward_ema = 0.0;
  double mean_kl = 0.0;              // last step
  int64_t steps = 0;
  int64_t skipped_batches = 0;       // prompt batches whose answers were all too short
  double generate_seconds = 0.0, train_seconds = 0.0, seconds = 0.0;
  double sequences_per_second = 0.0;
  bool resumed = false;
  nlohmann::json to_json() const;
};

/// Collective. Errors as run_sft.
PpoResult run_ppo(const PpoConfig& config, const StepContext& context);

}  // namespace rlhf
}  // namespace dschat
