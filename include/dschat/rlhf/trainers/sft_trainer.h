#pragma once
// Step 1 of DeepSpeed-Chat (training/step1_supervised_finetuning/main.py): supervised fine-tuning
// of the actor on prompt + chosen answer. Evaluation perplexity before training and after every
// epoch (mean over batches, all-reduced), the per-step throughput line, metrics to
// <output_dir>/metrics.jsonl, resumable checkpoints (step_runner.h), and the final Hugging Face
// model with LoRA fused and the tokenizer files in output_dir.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct SftResult {
  double eval_loss_before = 0.0, eval_ppl_before = 0.0;
  double eval_loss_after = 0.0, eval_ppl_after = 0.0;
  int64_t optimizer_steps = 0;
  double seconds = 0.0;
  bool resumed = false;  // continued from a checkpoint of an interrupted run
  nlohmann::json to_json() const;
};

/// Collective over context.communicator. Throws core::ConfigError / NotFound / IoError for bad
/// settings or inputs (naming the key or file), Interrupted when stopped (after saving).
SftResult run_sft(const SftConfig& config, const StepContext& context);

}  // namespace rlhf
}  // namespace dschat
