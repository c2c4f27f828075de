#pragma once
// The four (five with EMA) models of step 3, as DeepSpeed-Chat's DeepSpeedRLHFEngine builds them:
//   actor   step-1 model, trained, inside a HybridEngine (train <-> generate), LoRA optional
//   ref     step-1 model, frozen (eval mode, no grad)
//   critic  step-2 model (value head), trained by its own TrainingEngine, LoRA optional
//   reward  step-2 model, frozen
//   ema     step-1 model updated only by the moving average of the actor (enable_ema)
// Critic and reward start as identical copies of the reward model, v_head included.
#include <memory>

#include "dschat/engine/training_engine.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/value_head.h"
#include "dschat/rlhf/pipeline_config.h"
#include "dschat/rlhf/step_context.h"

namespace dschat {
namespace rlhf {

struct RlhfModels {
  std::unique_ptr<hybrid::HybridEngine> actor;
  models::CausalLM ref{nullptr};
  models::ValueHeadModel critic{nullptr};
  std::unique_ptr<engine::TrainingEngine> critic_engine;
  models::ValueHeadModel reward{nullptr};
  models::CausalLM ema{nullptr};  // null without enable_ema
};

/// Collective. `total_iters` is DS-Chat's num_total_iters (the LR schedules' length);
/// `actor_gas` the actor's gradient accumulation (doubled with mixture training).
RlhfModels build_rlhf_models(const PpoConfig& config, int64_t total_iters, int64_t actor_gas,
                             const StepContext& context);

/// ema <- lerp(actor, ema, beta) for every parameter (ZeRO-3 partitions gathered first).
void update_ema(RlhfModels& models, double beta);

}  // namespace rlhf
}  // namespace dschat
