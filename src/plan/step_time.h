#pragma once
// The time model of `dschat plan` (internal): FLOPs from the model shapes, divided by the
// hardware's peak times a stated efficiency; decode steps bounded by memory bandwidth.
#include <cstdint>
#include <vector>

#include "dschat/plan/step_plan.h"

namespace dschat {
namespace plan {

struct TimeContext {
  const Hardware& hardware;
  Efficiency efficiency;
};

struct StepTime {
  double flops_per_step = 0;     // per rank and optimizer step (RL: per generation batch)
  double seconds_per_step = 0;
  int64_t steps = -1;            // for the whole step (all epochs); -1: data not counted
  double total_seconds = -1;
};

/// Forward FLOPs of one pass: 2 × matmul parameters × tokens, plus causal attention
/// (2 × L × B × T² × hidden: QK^T and AV, each half of the square).
double forward_flops(const ModelSetup& setup, const PassShape& shape);
/// Forward + backward: 3 forwards, 2 when only LoRA adapters train (no weight gradients of the
/// frozen GEMMs), plus the recomputed forward under gradient checkpointing or ZeRO-3.
double training_flops(const ModelSetup& setup, const PassShape& shape);

/// Steps 1, 2 and DPO: ceil(ceil(rows / world) / rows_per_micro_batch) micro-batches per epoch
/// (a reward or DPO micro-batch of B pairs is a pass of 2B sequences), GAS per optimizer step;
/// `extra_forward_flops` per micro-batch (DPO's reference).
StepTime supervised_time(const ModelSetup& model, const PassShape& micro_batch, const rlhf::CommonStepConfig& common,
                         int64_t rows, int64_t rows_per_micro_batch, double extra_forward_flops,
                         const TimeContext& context);

struct RlShape {
  int64_t generation_rows = 1;  // answers per rank and generation batch
  int64_t prompt_tokens = 1;
  int64_t answer_tokens = 1;
  int64_t training_batch = 1;
  int64_t ppo_epochs = 1;
  int64_t tp = 1;
  int64_t epochs = 1;  // num_train_epochs over the prompts
};

/// PPO and the critic-free step, per generation batch: prefill and bandwidth-bound decode of the
/// actor, a no-grad forward of the actor and every scorer over the answers, then ppo_epochs of
/// training the actor and `trained` (the critic). rows: prompts in the phase; the batch holds
/// generation_rows / answers-per-prompt of them.
StepTime rl_time(const ModelSetup& actor, const std::vector<engine::ParameterSpec>& actor_specs,
                 const std::vector<const ModelSetup*>& scorers, const std::vector<const ModelSetup*>& trained,
                 const RlShape& shape, int64_t rows, const TimeContext& context, int64_t answers_per_prompt = 1);

void apply_time(StepPlan& plan, const StepTime& time);

}  // namespace plan
}  // namespace dschat
