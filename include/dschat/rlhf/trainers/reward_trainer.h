#pragma once
// Step 2 of DeepSpeed-Chat (training/step2_reward_model_finetuning/main.py): a value-head model
// trained with the token-wise pairwise loss over the span where chosen and rejected differ
// (reward_loss.h), evaluated by accuracy (chosen end score > rejected end score) and mean end
// scores before training, every eval_interval optimizer steps and after every epoch; saved in
// DeepSpeed-Chat's layout (rwtransformer.*, v_head.weight) with the tokenizer files.
//
// Differs from DS-Chat on purpose (docs/rlhf.md): the pairs end with the tokenizer's eos text,
// the token step-3 answers end with, not the literal "<|endoftext|>" (the same text for GPT-2
// tokenizers; for OPT's "</s>" DS-Chat's RM scores a token it never sees in step 3), and
// num_padding_at_beginning is derived from the tokenizer unless the config sets it.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "dschat/data/tokenized_dataset.h"
#include "dschat/models/value_head.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

struct RewardEvaluation {
  double accuracy = 0.0;         // share of pairs whose chosen end score beats the rejected one
  double chosen_score = 0.0;     // mean chosen end score
  double rejected_score = 0.0;   // mean rejected end score
  int64_t pairs = 0;             // pairs evaluated on this rank
};

struct RewardResult {
  RewardEvaluation before, after;
  double mean_train_loss = 0.0;  // last epoch
  int64_t optimizer_steps = 0;
  int64_t num_padding_at_beginning = 0;
  double seconds = 0.0;
  bool resumed = false;
  nlohmann::json to_json() const;
};

/// Collective. Errors as run_sft.
RewardResult run_reward(const RewardConfig& config, const StepContext& context);

/// Accuracy and mean end scores of `model` over (at most max_batches) batches of reward pairs,
/// all-reduced over the context's ranks (`dschat eval-rm`). The batches go to the model's
/// device; the scores are read to the host once, after the last batch.
RewardEvaluation evaluate_reward_model(models::ValueHeadModel& model, const data::TokenizedDataset& pairs,
                                       int64_t batch_size, int64_t max_batches, int64_t pad_token_id,
                                       int64_t num_padding_at_beginning, const StepContext& context);

/// evaluate_reward_model over the phase-2 eval split of `data` (all of it), the model loaded
/// from `model_dir` onto `device` (`dschat eval-rm`). pairs is the number of pairs over all ranks.
RewardEvaluation evaluate_reward_model_on_data(const std::string& model_dir, const DataConfig& data,
                                               int64_t max_seq_len, int64_t batch_size,
                                               std::optional<int64_t> num_padding_at_beginning,
                                               const StepContext& context,
                                               const torch::Device& device = torch::kCPU);

}  // namespace rlhf
}  // namespace dschat
