#pragma once
// DeepSpeed-Chat's DPO math (training/step2_dpo_finetuning/main.py): the label mask it builds per
// pair, the per-sequence log-probability sums (get_batch_logps) and the sigmoid loss with label
// smoothing, over a batch whose rows 0..B-1 are the chosen sequences and rows B..2B-1 the
// rejected ones (DataCollatorReward's order, right padding). docs/trainers.md has the rules.
//
//   torch::Tensor mask = rlhf::dpo_label_mask(ids, pad);                       // [2B, T]
//   torch::Tensor logps = rlhf::dpo_sequence_log_probs(policy_logits, ids, mask);  // [2B]
//   rlhf::DpoLossOutput out = rlhf::dpo_loss(logps, reference_logps, 0.1, 0.0);

#include <torch/torch.h>

#include <cstdint>

namespace dschat {
namespace rlhf {

struct DpoLossOutput {
  torch::Tensor loss;              // [] differentiable: mean over pairs
  torch::Tensor chosen_rewards;    // [B] beta * (policy - reference) log-prob of the chosen rows, detached
  torch::Tensor rejected_rewards;  // [B] the same for the rejected rows
};

/// [2B, T] int64: 1 where the token is not `pad_id`, except the positions before the first one
/// where a pair's two rows differ (both rows; the whole row when they are identical, as DS-Chat's
/// "divergence 0"). input_ids: [2B, T] integer ids. Throws core::InvalidArgument for an odd or
/// empty batch.
torch::Tensor dpo_label_mask(const torch::Tensor& input_ids, int64_t pad_id);

/// [2B]: Σ_{t>=1} mask[t] · log_softmax(logits[t-1])[ids[t] · mask[t]], computed in the logits'
/// dtype (DS-Chat: the model dtype) and returned in fp32. logits: [2B, T, V].
torch::Tensor dpo_sequence_log_probs(const torch::Tensor& logits, const torch::Tensor& input_ids,
                                     const torch::Tensor& label_mask);

/// loss = mean_i [-(1-ε)·logσ(β·h_i) - ε·logσ(-β·h_i)], h_i = (π_c - π_r) - (ref_c - ref_r).
/// policy_logps, reference_logps: [2B] (chosen rows first). Throws core::InvalidArgument for a
/// negative beta or a label_smoothing outside [0, 0.5].
DpoLossOutput dpo_loss(const torch::Tensor& policy_logps, const torch::Tensor& reference_logps, double beta,
                       double label_smoothing);

}  // namespace rlhf
}  // namespace dschat
