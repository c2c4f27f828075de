#pragma once
// The check of step 2's reward model before step 3 optimises against it. PPO maximises whatever
// the reward model rewards; a model that barely separates the pairs, or that pays for length or
// filler, is cheaper to catch here than after a PPO run has learned to exploit it. run_pipeline
// runs the gate before every step 3 (also `dschat ppo`, and again on a resumed step 3: the scores
// are deterministic, so a rerun decides the same): reward_diagnostics.h on the phase-2 eval split
// of step 2's data, then by step3.reward_gate.action:
//   refuse  any failing check throws core::ConfigError naming each number, its limit and its key
//   warn    each failing check is logged as a warning and step 3 runs
//   off     nothing runs
// The checks: accuracy >= min_accuracy, length bias (Pearson r, signed: only "longer scores
// higher" fails) <= max_length_bias, padding win rate <= max_padding_win_rate. A check without
// data (no pairs, no answer that could be padded) passes. The report goes to
// <step3 output_dir>_logs/reward_gate.json (rank 0), the table to the log.
#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/rewards/reward_diagnostics.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct RewardGateCheck {
  std::string metric;  // "accuracy", "length bias", "padding win rate"
  double value = 0.0, limit = 0.0;
  bool at_least = false;  // true: value must be >= limit (accuracy); false: <= limit
  std::string key;        // what overrides the limit: "step3.reward_gate.min_accuracy"
  bool passed = true;
};

/// The gate's three checks of `d` against `gate`, in the order above.
std::vector<RewardGateCheck> reward_gate_checks(const RewardGateConfig& gate, const RewardDiagnostics& d);

/// Where the gate looks and how it scores (run_pipeline fills it from the pipeline config).
struct RewardGateInputs {
  std::string reward_model;  // step 3's critic_model_name_or_path: step 2's output
  DataConfig data;           // step 2's data: the pairs' phase-2 eval split
  std::optional<int64_t> num_padding_at_beginning;  // step 2's (nullopt: from the tokenizer)
  RewardDiagnosticsOptions options;  // step 2's max_seq_len, eval batch and seed; step 3's clip_reward_value
  std::filesystem::path report_file;  // reward_gate.json
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
};

struct RewardGateOutcome {
  bool ran = false;     // false: action "off", or an empty eval split
  bool passed = true;   // every check passed (or the gate did not run)
  std::vector<RewardGateCheck> checks;
  RewardDiagnostics diagnostics;
  nlohmann::json to_json() const;  // what reward_gate.json holds
};

/// Collective (the diagnostics all-reduce their sums, so every rank decides alike). Throws
/// core::ConfigError when gate.action is "refuse" and a check fails, after writing the report.
RewardGateOutcome run_reward_gate(const RewardGateConfig& gate, const RewardGateInputs& inputs,
                                  const StepContext& context);

/// What run_pipeline checks before step 3: config.step3.reward_gate on step 3's reward model,
/// with step 2's data, max_seq_len, eval batch size, seed and num_padding_at_beginning, step 3's
/// clip_reward_value, device and dtype; the report in <config.step3.output_dir>_logs.
RewardGateOutcome run_reward_gate(const PipelineConfig& config, const StepContext& context);

}  // namespace rlhf
}  // namespace dschat
