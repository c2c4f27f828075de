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
/// softmax(logits) with `generator`. A generator of the logits' device (make_sampling_generator)
/// draws there, with no copy and no host sync; one of another device (a CPU generator for CUDA
/// logits) draws on its own device, the probabilities copied there and the ids back.
torch::Tensor select_next_tokens(const torch::Tensor& logits, const core::GenerationConfig& config,
                                 at::Generator& generator);

/// The sampling generator of one generate call on `device`, seeded with `seed`: a CPU generator
/// on the CPU (the same ids as ever), a CUDA generator on a CUDA device (its own Philox stream, not
/// the device's default one), a CPU generator elsewhere. The same seed gives the same ids on a
/// given device; a CPU and a GPU draw differ. Per rank: the caller picks the seed (PPO's trainer
/// derives one per rank and step); nothing is added here.
at::Generator make_sampling_generator(const torch::Device& device, uint64_t seed);

}  // namespace inference
}  // namespace dschat
