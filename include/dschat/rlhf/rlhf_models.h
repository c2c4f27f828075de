#pragma once
// The four (five with EMA) models of step 3, as DeepSpeed-Chat's DeepSpeedRLHFEngine builds them:
//   actor   step-1 model, trained, inside a HybridEngine (train <-> generate), LoRA optional
//   ref     step-1 model, frozen (eval mode, no grad)
//   critic  step-2 model (value head), trained by its own TrainingEngine, LoRA optional
//   reward  step-2 model, frozen
//   ema     step-1 model updated only by the moving average of the actor (enable_ema)
// Critic and reward start as identical copies of the reward model, v_head included.
// Placement (rlhf_placement): everything on the step's device in the step's dtype, except the
// reference with offload_reference_model and the reward model with offload_reward_model, which
// stay on the CPU (DS-Chat keeps their weights in host memory; here they also compute there), so
// experience generation moves their inputs and outputs (experience.h).
#include <torch/torch.h>

#include <memory>

#include "dschat/engine/training_engine.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/value_head.h"
#include "dschat/rlhf/pipeline_config.h"
#include "dschat/rlhf/step_context.h"

namespace dschat {
namespace rlhf {

/// Where a model of step 3 lives and in which dtype.
struct ModelPlacement {
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat32;
};

struct RlhfPlacement {
  ModelPlacement trained;    // actor, critic and the EMA: the step's device and dtype
  ModelPlacement reference;  // the CPU with offload_reference_model, else as trained
  ModelPlacement reward;     // the CPU with offload_reward_model, else as trained
};

/// The placement of step 3's models for a step running on `step_device` in `step_dtype`. An
/// offloaded model keeps the step's dtype: offloading is about memory, and the scores it gives
/// are compared with the actor's, which are in that dtype. The EMA is not offloaded (DS-Chat
/// offloads it with the reference): it is updated every micro-step.
RlhfPlacement rlhf_placement(const PpoConfig& config, const torch::Device& step_device, torch::ScalarType step_dtype);

/// The device of a module's parameters (the first one's; the CPU for a module without any).
torch::Device parameter_device(const torch::nn::Module& module);

struct RlhfModels {
  RlhfPlacement placement;  // where build_rlhf_models put each model
  std::unique_ptr<hybrid::HybridEngine> actor;
  models::CausalLM ref{nullptr};
  models::ValueHeadModel critic{nullptr};
  std::unique_ptr<engine::TrainingEngine> critic_engine;
  models::ValueHeadModel reward{nullptr};
  models::CausalLM ema{nullptr};  // null without enable_ema
};

/// Collective. `total_iters` is DS-Chat's num_total_iters (the LR schedules' length);
/// `actor_gas` the actor's gradient accumulation (doubled with mixture training). The models
/// are placed by rlhf_placement on the step's device (step_device of config.common).
RlhfModels build_rlhf_models(const PpoConfig& config, int64_t total_iters, int64_t actor_gas,
                             const StepContext& context);

/// ema <- lerp(actor, ema, beta) for every parameter (ZeRO-3 partitions gathered first).
void update_ema(RlhfModels& models, double beta);

}  // namespace rlhf
}  // namespace dschat
