#include "dschat/rlhf/math/sft_loss.h"

#include <string>

#include "core/tensor_util.h"
#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {
using core::shape_of;

torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  DSCHAT_CHECK(logits.defined() && logits.dim() == 3, InvalidArgument,
               "causal_lm_loss: expected logits [B, T, V], got ",
               logits.defined() ? shape_of(logits) : "undefined");
  DSCHAT_CHECK(labels.defined() && labels.dim() == 2 && labels.size(0) == logits.size(0) &&
                   labels.size(1) == logits.size(1),
               InvalidArgument, "causal_lm_loss: labels ", labels.defined() ? shape_of(labels) : "undefined",
               " must be [B, T] of logits ", shape_of(logits));
  const int64_t vocab = logits.size(2);
  // transformers' shift: pad the labels with one ignored column and drop the first, so position t
  // is scored against token t + 1 over the whole [B, T] logits (no copy of a [B, T-1, V] slice).
  torch::Tensor ignored =
      torch::full({labels.size(0), 1}, kIgnoreIndex, labels.options().dtype(torch::kLong));  // [B, 1]
  torch::Tensor shift_labels = torch::cat({labels.to(torch::kLong).slice(1, 1), ignored}, 1);  // [B, T]
  torch::Tensor flat_logits = logits.to(torch::kFloat).reshape({-1, vocab});                     // [B*T, V]
  return torch::nn::functional::cross_entropy(
      flat_logits, shift_labels.reshape({-1}).to(flat_logits.device()),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kMean));
}

torch::Tensor sft_loss(const torch::Tensor& logits, const torch::Tensor& input_ids,
                       const torch::Tensor& attention_mask) {
  DSCHAT_CHECK(input_ids.defined() && attention_mask.defined() && input_ids.sizes() == attention_mask.sizes(),
               InvalidArgument, "sft_loss: attention_mask ",
               attention_mask.defined() ? shape_of(attention_mask) : "undefined", " must have the shape of input_ids ",
               input_ids.defined() ? shape_of(input_ids) : "undefined");
  torch::Tensor labels = input_ids.to(torch::kLong).masked_fill(attention_mask.eq(0), kIgnoreIndex);  // [B, T]
  return causal_lm_loss(logits, labels);
}

float perplexity(float mean_loss) {
  // Through a float32 tensor, as DS-Chat, so the overflow point and the rounding are torch's.
  return torch::exp(torch::tensor(mean_loss, torch::kFloat)).item<float>();
}

}  // namespace rlhf
}  // namespace dschat
