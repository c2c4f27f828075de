#include "dschat/rlhf/math/log_probs.h"

#include "core/tensor_util.h"
#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {
using core::shape_of;

torch::Tensor gather_log_probs(const torch::Tensor& logits, const torch::Tensor& labels) {
  DSCHAT_CHECK(logits.defined() && labels.defined() && logits.dim() == 3 && labels.dim() == 2 &&
                   logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
               InvalidArgument, "gather_log_probs: expected logits [B, L, V] and labels [B, L], got ",
               shape_of(logits), " and ", shape_of(labels));
  // Over every position, then sliced: the rows are the same rows (the same bits as DS-Chat's
  // log_softmax(logits[:, :-1])), without first copying the strided slice, a [B, L-1, V] buffer.
  torch::Tensor log_probs = torch::log_softmax(logits.to(torch::kFloat32), -1).slice(1, 0, -1);  // [B, L-1, V]
  return log_probs.gather(-1, labels.slice(1, 1).unsqueeze(-1)).squeeze(-1);                     // [B, L-1]
}

torch::Tensor sequence_log_probs(models::CausalLM& model, const torch::Tensor& seq, const torch::Tensor& attention_mask,
                                 nn::MaskLayout layout) {
  torch::Tensor logits = model->forward(seq, attention_mask, layout);  // [B, L, V]
  return gather_log_probs(logits, seq);                        // [B, L-1]
}

torch::Tensor action_mask(const torch::Tensor& attention_mask) {
  DSCHAT_CHECK(attention_mask.defined() && attention_mask.dim() == 2 && attention_mask.size(1) >= 2,
               InvalidArgument, "action_mask: expected attention_mask [B, L] with L >= 2, got ",
               shape_of(attention_mask));
  return attention_mask.slice(1, 1).to(torch::kFloat32);  // [B, L-1]
}

torch::Tensor answer_mask(const torch::Tensor& attention_mask, int64_t prompt_length) {
  torch::Tensor mask = action_mask(attention_mask);  // [B, L-1]
  DSCHAT_CHECK(prompt_length >= 1 && prompt_length < attention_mask.size(1), InvalidArgument,
               "answer_mask: prompt_length ", prompt_length, " must be in [1, ", attention_mask.size(1),
               ") for sequences of ", attention_mask.size(1), " tokens");
  mask.slice(1, 0, prompt_length - 1).zero_();
  return mask;
}

torch::Tensor answer_mask(const torch::Tensor& attention_mask, const torch::Tensor& prompt_lengths) {
  torch::Tensor mask = action_mask(attention_mask);  // [B, L-1]
  DSCHAT_CHECK(prompt_lengths.defined() && prompt_lengths.dim() == 1 && prompt_lengths.size(0) == mask.size(0),
               InvalidArgument, "answer_mask: expected prompt_lengths [", mask.size(0), "], got ",
               shape_of(prompt_lengths));
  torch::Tensor columns = torch::arange(mask.size(1), torch::dtype(torch::kInt64).device(mask.device()));  // [L-1]
  torch::Tensor first = (prompt_lengths.to(mask.device(), torch::kInt64) - 1).unsqueeze(1);             // [B, 1]
  return mask * (columns.unsqueeze(0) >= first).to(torch::kFloat32);                                    // [B, L-1]
}

torch::Tensor masked_sum(const torch::Tensor& token_log_probs, const torch::Tensor& mask) {
  DSCHAT_CHECK(token_log_probs.defined() && mask.defined() && token_log_probs.sizes() == mask.sizes(),
               InvalidArgument, "masked_sum: token_log_probs ", shape_of(token_log_probs), " and mask ",
               shape_of(mask), " must have one shape");
  return (token_log_probs.to(torch::kFloat32) * mask.to(torch::kFloat32)).sum(-1);  // [B]
}

}  // namespace rlhf
}  // namespace dschat
