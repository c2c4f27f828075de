#pragma once
// The closing table of the embedded demo (`dschat train` with no arguments): what each step
// achieved, measured on held-out data the steps never trained on. The ground truth is the demo
// task's checker (data/demo_task.h): 1 for exactly the right answer, 0 otherwise.
#include <cstdint>
#include <filesystem>
#include <string>

#include "dschat/rlhf/trainers/pipeline.h"

namespace dschat {
namespace app {

struct DemoReport {
  double sft_eval_loss_before = 0.0, sft_eval_loss_after = 0.0;
  double rm_accuracy_before = 0.0, rm_accuracy_after = 0.0;
  std::string policy = "PPO";  // the RL step: PPO, or GRPO / RLOO / REINFORCE++ (critic-free pipelines)
  bool reward_model = true;    // false for the critic-free pipelines: no step-2 reward model
  double sft_mean_reward = 0.0, ppo_mean_reward = 0.0;  // reward model's score of greedy answers
  double sft_task_score = 0.0, ppo_task_score = 0.0;    // ground truth: share of correct greedy answers
  // The same over answers sampled with step 3's experience_sampling settings (the policy PPO
  // optimises), samples_per_prompt per prompt from step 3's seed.
  double sft_sampled_task_score = 0.0, ppo_sampled_task_score = 0.0;
  int64_t samples_per_prompt = 0;
  int64_t prompts = 0;
  std::string sample_prompt, sample_answer;
};

/// Greedy and sampled answers of the SFT model (<out>/actor) and the RL model (<out>/step3/actor,
/// or <out>/grpo/actor for the critic-free pipelines)
/// to every distinct prompt of `eval_file` (demo JSON Lines), scored by the task's checker (and
/// the greedy ones by the reward model, <out>/reward); the loss and accuracy figures come from the
/// steps' summaries.
DemoReport evaluate_demo(const rlhf::PipelineConfig& config, const rlhf::PipelineResult& result,
                         const std::filesystem::path& eval_file);

/// The table printed at the end of the demo.
std::string format_demo_report(const DemoReport& report);

}  // namespace app
}  // namespace dschat
