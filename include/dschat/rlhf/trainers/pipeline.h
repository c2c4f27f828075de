#pragma once
// `dschat train`: the three steps in sequence, each step's output feeding the next
// (<out>/actor -> step 3's actor, <out>/reward -> step 3's critic and reward), or with
// "pipeline": "sft-dpo" step 1 then DPO as step 2 (<out>/actor -> <out>/dpo), or with
// "sft-grpo" | "sft-rloo" | "sft-reinforce_pp" step 1 then the critic-free step (<out>/grpo), with
// DeepSpeed-Chat's e2e_rlhf.py banners and durations. A finished step (its output directory holds
// training_summary.json) is skipped; an interrupted one resumes from its checkpoints. Before step 3
// the reward gate (reward_gate.h: step3.reward_gate) checks step 2's reward model, and may refuse.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct PipelineResult {
  /// Per step that ran or had finished before: its training_summary.json ("step1", "step2",
  /// "step3"); "skipped": the steps found finished and not rerun.
  nlohmann::json summaries = nlohmann::json::object();
  std::vector<int> skipped;
  double seconds = 0.0;
};

/// Collective. Throws what the steps throw (Interrupted after a stop request has saved).
PipelineResult run_pipeline(const PipelineConfig& config, const StepContext& context);

/// "H:MM:SS", as e2e_rlhf.py prints durations.
std::string format_hms(double seconds);

}  // namespace rlhf
}  // namespace dschat
