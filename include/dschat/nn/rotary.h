#pragma once
// Rotary position embeddings as Hugging Face LLaMA computes them: inverse frequencies from
// rope_theta and the rope scaling type (default, linear, dynamic NTK, llama3), cos/sin of
// positions x frequencies in fp32, applied with the rotate-half convention.

#include <torch/torch.h>

#include <mutex>
#include <utility>
#include <vector>

#include "dschat/core/model_config.h"

namespace dschat {
namespace nn {

/// Inverse frequencies [head_dim / 2] (fp32) for `config`. For "dynamic", `sequence_length` is the
/// longest position + 1 in the batch: NTK scaling starts once it exceeds max_position_embeddings.
torch::Tensor rotary_inverse_frequencies(const core::ModelConfig& config, int64_t sequence_length);

/// positions: [B, T] int64 -> (cos, sin) each [B, T, head_dim] in `dtype`. Builds the frequencies
/// on the host and copies them to positions' device on every call (a model's forward uses
/// RotaryFrequencies instead).
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const core::ModelConfig& config, const torch::Tensor& positions,
                                                       torch::ScalarType dtype);

/// inv_freq: [head_dim / 2] fp32 on positions' device; positions: [B, T] int64 -> (cos, sin) each
/// [B, T, head_dim] in `dtype`. Device work only.
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& inv_freq, const torch::Tensor& positions,
                                                       torch::ScalarType dtype);

/// One model's inverse frequencies, copied to each device once and kept there, so that a forward
/// copies nothing from the host: the rotary tables of a decode step are then pure device work,
/// which a CUDA graph can capture. Values equal rotary_inverse_frequencies' (built by it).
/// "dynamic" rope scaling is the exception: its frequencies depend on the batch's longest
/// position, so cos_sin reads positions.max() on the host (a device sync) and, past
/// max_position_embeddings, builds and copies the grown frequencies for that call. Thread-safe.
class RotaryFrequencies {
 public:
  explicit RotaryFrequencies(core::ModelConfig config);

  /// positions: [B, T] int64 -> (cos, sin) each [B, T, head_dim] in `dtype`, equal to
  /// rotary_cos_sin(config, positions, dtype).
  std::pair<torch::Tensor, torch::Tensor> cos_sin(const torch::Tensor& positions, torch::ScalarType dtype);

  /// The frequencies [head_dim / 2] for sequences within max_position_embeddings, on `device`
  /// (built and copied there on first use; later calls return the same tensor).
  torch::Tensor on_device(const torch::Device& device);

 private:
  core::ModelConfig config_;
  std::mutex mutex_;  // guards by_device_
  std::vector<std::pair<torch::Device, torch::Tensor>> by_device_;  // each [head_dim / 2] fp32
};

/// x: [B, H, T, D]; cos, sin: [B, T, D] -> x rotated, [B, H, T, D].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace nn
}  // namespace dschat
