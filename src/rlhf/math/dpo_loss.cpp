#include "dschat/rlhf/math/dpo_loss.h"

#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {

torch::Tensor dpo_label_mask(const torch::Tensor& input_ids, int64_t pad_id) {
  DSCHAT_CHECK(input_ids.dim() == 2 && input_ids.size(0) > 0 && input_ids.size(0) % 2 == 0, InvalidArgument,
               "dpo_label_mask: expects [2B, T] ids (chosen rows, then rejected rows), got ", input_ids.sizes());
  const int64_t pairs = input_ids.size(0) / 2, length = input_ids.size(1);
  torch::Tensor mask = input_ids.ne(pad_id).to(torch::kInt64);  // [2B, T]
  torch::Tensor chosen = input_ids.narrow(0, 0, pairs), rejected = input_ids.narrow(0, pairs, pairs);  // [B, T]
  torch::Tensor differs = chosen.ne(rejected);  // [B, T]
  // First differing position per pair (the count of equal leading positions); DS-Chat's "no
  // difference" case masks nothing (index 0).
  torch::Tensor leading = differs.to(torch::kInt64).cumsum(1).eq(0).sum(1);  // [B]
  torch::Tensor first = torch::where(leading.eq(length), torch::zeros_like(leading), leading);  // [B]
  torch::Tensor positions = torch::arange(length, input_ids.options().dtype(torch::kInt64)).unsqueeze(0);  // [1, T]
  torch::Tensor keep = positions.ge(first.unsqueeze(1)).to(torch::kInt64);  // [B, T]
  return mask * torch::cat({keep, keep}, 0);
}

torch::Tensor dpo_sequence_log_probs(const torch::Tensor& logits, const torch::Tensor& input_ids,
                                     const torch::Tensor& label_mask) {
  DSCHAT_CHECK(logits.dim() == 3 && logits.sizes().slice(0, 2) == input_ids.sizes() &&
                   label_mask.sizes() == input_ids.sizes(),
               InvalidArgument, "dpo_sequence_log_probs: logits ", logits.sizes(), ", ids ", input_ids.sizes(),
               " and mask ", label_mask.sizes(), " do not agree");
  const int64_t length = input_ids.size(1);
  torch::Tensor labels = (input_ids * label_mask).narrow(1, 1, length - 1);  // [2B, T-1]: masked labels are token 0
  torch::Tensor log_probs = logits.narrow(1, 0, length - 1).log_softmax(-1);   // [2B, T-1, V]
  torch::Tensor per_token = log_probs.gather(2, labels.unsqueeze(2)).squeeze(2);  // [2B, T-1]
  return (per_token * label_mask.narrow(1, 1, length - 1).to(per_token.scalar_type())).sum(-1).to(torch::kFloat32);
}

DpoLossOutput dpo_loss(const torch::Tensor& policy_logps, const torch::Tensor& reference_logps, double beta,
                       double label_smoothing) {
  DSCHAT_CHECK(beta >= 0.0, InvalidArgument, "dpo_loss: beta must be >= 0, got ", beta);
  DSCHAT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 0.5, InvalidArgument,
               "dpo_loss: label_smoothing must be in [0, 0.5], got ", label_smoothing);
  DSCHAT_CHECK(policy_logps.dim() == 1 && policy_logps.size(0) % 2 == 0 && policy_logps.size(0) > 0 &&
                   reference_logps.sizes() == policy_logps.sizes(),
               InvalidArgument, "dpo_loss: expects [2B] log-probs for policy and reference, got ", policy_logps.sizes(),
               " and ", reference_logps.sizes());
  const int64_t pairs = policy_logps.size(0) / 2;
  torch::Tensor reference = reference_logps.detach().to(policy_logps.scalar_type());  // [2B]
  torch::Tensor chosen = policy_logps.narrow(0, 0, pairs), rejected = policy_logps.narrow(0, pairs, pairs);  // [B]
  torch::Tensor ref_chosen = reference.narrow(0, 0, pairs), ref_rejected = reference.narrow(0, pairs, pairs);  // [B]
  torch::Tensor h = (chosen - rejected) - (ref_chosen - ref_rejected);  // [B]
  torch::Tensor loss = (-torch::log_sigmoid(beta * h) * (1.0 - label_smoothing) -
                        torch::log_sigmoid(-beta * h) * label_smoothing)
                           .mean(0);  // []
  return {loss, (beta * (chosen - ref_chosen)).detach(), (beta * (rejected - ref_rejected)).detach()};
}

}  // namespace rlhf
}  // namespace dschat
