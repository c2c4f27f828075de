#pragma once
// From the last position's logits to the next token, as Hugging Face's generate does it: the
// logits processors (repetition penalty, min_new_tokens' EOS suppression), then for sampling the
// warpers (temperature, top-k, top-p) and one multinomial draw per row.

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include "dschat/core/generation_config.h"

namespace dschat {
namespace inference {

/// logits: [B, V] float32, seen: [B, S] the ids so far (prompt and generated), `generated`: tokens
/// generated before this one -> the adjusted logits [B, V] (masked entries are -inf).
torch::Tensor process_logits(torch::Tensor logits, const torch::Tensor& seen, const core::GenerationConfig& config,
                             int64_t generated);

/// The next token of every row [B] (on the logits' device): argmax when greedy, else a draw from
/// softmax(logits) with `generator` (a CPU generator: the same seed gives the same tokens on any
/// device).
torch::Tensor select_next_tokens(const torch::Tensor& logits, const core::GenerationConfig& config,
                                 at::Generator& generator);

}  // namespace inference
}  // namespace dschat
