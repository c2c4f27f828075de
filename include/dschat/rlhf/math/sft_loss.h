#pragma once
// Step 1's loss and perplexity: transformers' causal-LM loss (loss_utils.ForCausalLMLoss) over
// DeepSpeed-Chat's SFT labels, and the evaluation's perplexity. DS-Chat's labels are the ids
// wherever attention_mask is 1 and -100 on padding (data_utils, since #819), so the prompt, the
// answer and the appended EOS all count; only padding is ignored. data::collate_sft builds the
// same labels (and optionally masks the prompt, which DS-Chat does not).

#include <torch/torch.h>

#include <cstdint>

namespace dschat {
namespace rlhf {

/// The label value cross entropy skips (torch's and transformers' default ignore_index).
constexpr int64_t kIgnoreIndex = -100;

/// Mean token cross entropy of logits[:, t] against labels[:, t + 1] over the labels that are not
/// kIgnoreIndex, computed in float32 (transformers upcasts the logits; DS-Chat's
/// --compute_fp32_loss does the same). logits: [B, T, V] any float dtype; labels: [B, T] int64.
/// Returns [] float32, differentiable; NaN when no label counts (0 / 0, as transformers).
torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);

/// causal_lm_loss with DS-Chat's step-1 labels: input_ids where attention_mask != 0, else -100.
/// input_ids, attention_mask: [B, T].
torch::Tensor sft_loss(const torch::Tensor& logits, const torch::Tensor& input_ids,
                       const torch::Tensor& attention_mask);

/// exp(mean_loss) in float32, as step 1's evaluation (`torch.exp(losses)` on a float32 tensor):
/// +inf once the loss passes ~88.72 (float32's exp overflow), never an error.
float perplexity(float mean_loss);

}  // namespace rlhf
}  // namespace dschat
