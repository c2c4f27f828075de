#pragma once
// Embedding and LayerNorm with torch.nn's parameter names and initialisation ("weight" [V, E] drawn
// from N(0, 1); LayerNorm "weight" ones and "bias" zeros, both absent without
// elementwise_affine), allocated where nn::ParameterPlacementScope says, like Linear and RmsNorm.
// LibTorch's own modules always allocate on the CPU in float32, so a model built from them would
// hold a host copy of its embeddings on the way to the GPU (or, loading deferred, on the way to
// the meta device).
// With a padding index (transformers passes the pad token id for OPT and LLaMA), that row gets no
// gradient from the lookup (it still gets one through a tied LM head) and starts at zero.
//   Embedding embed(50272, 768, /*padding_idx=*/1);  // [V, E]
//   LayerNorm norm(LayerNormOptions(768).eps(1e-5));

#include <torch/torch.h>

#include <optional>

namespace dschat {
namespace nn {

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt);
  /// ids: [...] int64 -> [..., E]
  torch::Tensor forward(const torch::Tensor& ids);
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  torch::Tensor weight;  // [V, E]
  std::optional<int64_t> padding_idx;
};
TORCH_MODULE(Embedding);

/// The padding index transformers gives a token embedding (its pad_token_id) when it is a row of
/// the `vocab_size` rows; none otherwise.
inline std::optional<int64_t> padding_row(std::optional<int64_t> pad_token_id, int64_t vocab_size) {
  return pad_token_id && *pad_token_id >= 0 && *pad_token_id < vocab_size ? pad_token_id : std::nullopt;
}

struct LayerNormOptions {
  explicit LayerNormOptions(int64_t hidden) : hidden_(hidden) {}
  TORCH_ARG(int64_t, hidden);
  TORCH_ARG(double, eps) = 1e-5;
  TORCH_ARG(bool, elementwise_affine) = true;
};

class LayerNormImpl : public torch::nn::Module {
 public:
  explicit LayerNormImpl(const LayerNormOptions& options);
  /// x: [..., hidden] -> [..., hidden]
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  LayerNormOptions options;
  torch::Tensor weight;  // [hidden]; undefined without elementwise_affine
  torch::Tensor bias;    // [hidden]; undefined without elementwise_affine
};
TORCH_MODULE(LayerNorm);

}  // namespace nn
}  // namespace dschat
