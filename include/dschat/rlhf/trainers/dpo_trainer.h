#pragma once
// DeepSpeed-Chat's step2_dpo_finetuning (the alternative to steps 2 and 3): the SFT model is
// trained on the phase-2 preference pairs with the DPO loss (dpo_loss.h) against a frozen copy of
// itself, the reference (replicated, on the CPU with offload_reference_model, or partitioned by a
// ZeRO-3 inference engine when the policy trains at stage 3, as DS-Chat's eval config), and
// evaluated before training, every eval_interval optimizer steps and after every epoch; saved as
// a Hugging Face causal LM with the tokenizer files, like step 1.
//
// Differs from DS-Chat on purpose: the evaluation averages the implicit rewards over every eval
// pair (DS-Chat reports the last eval batch's), adds their accuracy (chosen reward above
// rejected) and margin, and all-reduces every figure over the ranks.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct DpoEvaluation {
  double loss = 0.0;             // mean DPO loss over the eval batches
  double chosen_reward = 0.0;    // mean beta * (policy - reference) log-prob of the chosen answers
  double rejected_reward = 0.0;  // the same for the rejected answers
  double accuracy = 0.0;         // share of pairs whose chosen reward beats the rejected one
  double margin() const { return chosen_reward - rejected_reward; }
};

struct DpoResult {
  DpoEvaluation before, after;
  double mean_train_loss = 0.0;  // last epoch
  int64_t optimizer_steps = 0;
  double seconds = 0.0;
  bool resumed = false;
  nlohmann::json to_json() const;
};

/// Collective. Errors as run_sft.
DpoResult run_dpo(const DpoConfig& config, const StepContext& context);

}  // namespace rlhf
}  // namespace dschat
