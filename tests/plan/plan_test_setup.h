#pragma once
// The model the planner's measurement tests train (fp32, every parameter trainable, or LoRA with
// only_optimize_lora), described for the planner.
#include "dschat/plan/model_memory.h"

namespace dschat {
namespace testing {

inline plan::ModelSetup trained_fp32_setup(const core::ModelConfig& config, int zero_stage, int64_t lora_dim) {
  plan::ModelSetup setup;
  setup.config = config;
  setup.dtype = torch::kFloat32;
  setup.trained = true;
  setup.zero_stage = zero_stage;
  setup.lora_dim = lora_dim;
  setup.only_optimize_lora = lora_dim > 0;
  return setup;
}

}  // namespace testing
}  // namespace dschat
