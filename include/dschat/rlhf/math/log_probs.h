#pragma once
// Per-token log-probabilities and the masks that select answer tokens: what every policy-gradient
// or preference loop computes before its loss (PPO, DPO, GRPO, RLOO, REINFORCE).
//
// Shapes, for sequences seq [B, L] = prompt (P columns, left padded) + answer (padded after EOS):
//   logits           [B, L, V]   the model's output over seq
//   token log-probs  [B, L-1]    column t = log p(seq[:, t+1] | seq[:, :t+1])  ("action" t)
//   action mask      [B, L-1]    = attention_mask[:, 1:]  (DeepSpeed-Chat's action_mask)
//   answer mask      [B, L-1]    the action mask restricted to actions that produce answer tokens,
//                                i.e. columns t >= prompt_length - 1
#include <torch/torch.h>

#include <cstdint>

#include "dschat/models/causal_lm.h"

namespace dschat {
namespace rlhf {

/// log_softmax(logits[:, :-1]) gathered at labels[:, 1:] -> [B, L-1] float32 (DS-Chat's
/// gather_log_probs over the shifted logits). logits: [B, L, V]; labels: [B, L] int64.
torch::Tensor gather_log_probs(const torch::Tensor& logits, const torch::Tensor& labels);

/// The model's token log-probs of its own input: gather_log_probs(model(seq, mask), seq) -> [B, L-1].
/// Grad flows when grad mode is on (the caller's NoGradGuard decides). `layout` states the mask's
/// padding (nn::MaskLayout; kUnknown: the explicit mask, exact for any mask).
torch::Tensor sequence_log_probs(models::CausalLM& model, const torch::Tensor& seq, const torch::Tensor& attention_mask,
                                 nn::MaskLayout layout = nn::MaskLayout::kUnknown);

/// attention_mask[:, 1:] as float32 -> [B, L-1]: 1 for every action that produces a real token.
torch::Tensor action_mask(const torch::Tensor& attention_mask);

/// The action mask of the answer tokens only, for prompts of one length P (left-padded batches, as
/// step 3): columns t >= P - 1 of action_mask -> [B, L-1] float32. Requires 1 <= P < L.
torch::Tensor answer_mask(const torch::Tensor& attention_mask, int64_t prompt_length);

/// The same with one prompt length per row (right-padded pairs, as phase-2 data keeps them):
/// prompt_lengths [B] int64, row b counts actions t >= prompt_lengths[b] - 1 -> [B, L-1] float32.
torch::Tensor answer_mask(const torch::Tensor& attention_mask, const torch::Tensor& prompt_lengths);

/// Sum over the masked tokens of each row -> [B] float32 (a sequence's log-likelihood of its answer:
/// the quantity DPO compares between policy and reference). token_log_probs, mask: [B, L-1].
torch::Tensor masked_sum(const torch::Tensor& token_log_probs, const torch::Tensor& mask);

}  // namespace rlhf
}  // namespace dschat
