#include "dschat/nn/rotary.h"

#include <cmath>

#include "dschat/core/host_sync.h"
#include "dschat/ops/rotary.h"

namespace dschat {
namespace nn {

torch::Tensor rotary_inverse_frequencies(const core::ModelConfig& config, int64_t sequence_length) {
  const auto& rope = config.rope_scaling;
  const int64_t dim = config.rotary_dims();
  double base = config.rope_theta;
  if (rope.type == "dynamic" && sequence_length > config.max_position_embeddings) {
    double ratio = rope.factor * static_cast<double>(sequence_length) / config.max_position_embeddings - (rope.factor - 1);
    base = base * std::pow(ratio, static_cast<double>(dim) / (dim - 2));
  }
  // Same op order as transformers: int64 arange -> float, / dim, base ** that, reciprocal.
  torch::Tensor exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(dim);  // [D/2]
  torch::Tensor inv_freq = 1.0 / torch::pow(torch::scalar_tensor(base, torch::kFloat32), exponents);  // [D/2]
  if (rope.type == "linear") return inv_freq / rope.factor;
  if (rope.type == "llama3") {
    double old_context = rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings
                                                                     : config.max_position_embeddings;
    double low_wavelen = old_context / rope.low_freq_factor;
    double high_wavelen = old_context / rope.high_freq_factor;
    torch::Tensor wavelen = 2 * M_PI / inv_freq;  // [D/2]
    torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq);  // [D/2]
    torch::Tensor smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;  // [D/2]
    torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);  // [D/2]
    return torch::where(medium, smoothed, scaled);
  }
  return inv_freq;
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const torch::Tensor& inv_freq, const torch::Tensor& positions,
                                                       torch::ScalarType dtype) {
  torch::Tensor freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq;  // [B, T, D/2]
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);                            // [B, T, D]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

namespace {

// Only dynamic NTK needs the longest position, and reading it is a device sync: 0 otherwise.
int64_t longest_position_for(const core::ModelConfig& config, const torch::Tensor& positions) {
  if (config.rope_scaling.type != "dynamic" || positions.numel() == 0) return 0;
  core::HostSync sync("rotary positions (dynamic NTK rope only)");
  return positions.max().item<int64_t>() + 1;
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const core::ModelConfig& config, const torch::Tensor& positions,
                                                       torch::ScalarType dtype) {
  const int64_t longest = longest_position_for(config, positions);
  torch::Tensor inv_freq = rotary_inverse_frequencies(config, longest).to(positions.device());  // [D/2]
  return rotary_cos_sin(inv_freq, positions, dtype);
}

RotaryFrequencies::RotaryFrequencies(core::ModelConfig config) : config_(std::move(config)) {}

torch::Tensor RotaryFrequencies::on_device(const torch::Device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [where, inv_freq] : by_device_) {
    if (where == device) return inv_freq;
  }
  // Lengths up to max_position_embeddings leave every scaling type at its base frequencies.
  torch::Tensor inv_freq = rotary_inverse_frequencies(config_, 0).to(device);  // [D/2]
  by_device_.emplace_back(device, inv_freq);
  return inv_freq;
}

std::pair<torch::Tensor, torch::Tensor> RotaryFrequencies::cos_sin(const torch::Tensor& positions,
                                                                   torch::ScalarType dtype) {
  const int64_t longest = longest_position_for(config_, positions);
  if (longest > config_.max_position_embeddings) {  // dynamic NTK past max positions: this batch's own
    torch::Tensor grown = rotary_inverse_frequencies(config_, longest).to(positions.device());  // [D/2]
    return rotary_cos_sin(grown, positions, dtype);
  }
  return rotary_cos_sin(on_device(positions.device()), positions, dtype);
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return ops::rotary_embedding_reference(x, cos, sin);  // one definition of the arithmetic, also the ops' oracle
}

}  // namespace nn
}  // namespace dschat
