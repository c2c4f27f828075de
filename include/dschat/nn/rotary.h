#pragma once
// Rotary position embeddings as Hugging Face LLaMA computes them: inverse frequencies from
// rope_theta and the rope scaling type (default, linear, dynamic NTK, llama3), cos/sin of
// positions x frequencies in fp32, applied with the rotate-half convention.

#include <torch/torch.h>

#include "dschat/core/model_config.h"

namespace dschat {
namespace nn {

/// Inverse frequencies [head_dim / 2] (fp32) for `config`. For "dynamic", `sequence_length` is the
/// longest position + 1 in the batch: NTK scaling starts once it exceeds max_position_embeddings.
torch::Tensor rotary_inverse_frequencies(const core::ModelConfig& config, int64_t sequence_length);

/// positions: [B, T] int64 -> (cos, sin) each [B, T, head_dim] in `dtype`.
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const core::ModelConfig& config, const torch::Tensor& positions,
                                                       torch::ScalarType dtype);

/// x: [B, H, T, D]; cos, sin: [B, T, D] -> x rotated, [B, H, T, D].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace nn
}  // namespace dschat
