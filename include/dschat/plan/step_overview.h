#pragma once
// The table a step's log starts with (what DeepSpeed prints as each engine starts, for all of the
// step's models at once): per model its role, source, parameters, dtype, ZeRO stage, offload,
// LoRA, gradient checkpointing, device and the memory the plan gives it on one rank, then the
// step's planned per-rank peak. The same facts as JSON go into the step's training_summary.json
// ("run_overview").
#include <string>

#include <nlohmann/json.hpp>

#include "dschat/plan/step_plan.h"

namespace dschat {
namespace plan {

struct StepOverview {
  std::string text;   // the table, one line per row, ending in a newline
  nlohmann::json json;
};

/// The overview of `step` (one step of plan_pipeline's result) on `device` ("cpu", "cuda:0").
StepOverview step_overview(const StepPlan& step, const Hardware& hardware, const std::string& device);

}  // namespace plan
}  // namespace dschat
