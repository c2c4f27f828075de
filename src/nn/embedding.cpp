#include "dschat/nn/embedding.h"

#include "dschat/core/error.h"
#include "dschat/nn/linear.h"

namespace dschat {
namespace nn {

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding)
    : padding_idx(padding) {
  DSCHAT_CHECK(!padding_idx || (*padding_idx >= 0 && *padding_idx < num_embeddings), InvalidArgument,
               "Embedding: padding_idx ", padding_idx.value_or(-1), " is not a row of ", num_embeddings);
  weight = register_parameter("weight", torch::empty({num_embeddings, embedding_dim}, parameter_options()));
  reset_parameters();
}

void EmbeddingImpl::reset_parameters() {
  // torch.nn.Embedding's N(0, 1): the same draws as LibTorch's Embedding, so seeded models match.
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(weight);
  if (padding_idx) weight[*padding_idx].zero_();
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  return at::embedding(weight, ids, padding_idx.value_or(-1));
}

void EmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "dschat::nn::Embedding(" << weight.size(0) << ", " << weight.size(1);
  if (padding_idx) stream << ", padding_idx=" << *padding_idx;
  stream << ")";
}

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : options(options_) {
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", torch::ones({options.hidden()}, parameter_options()));
    bias = register_parameter("bias", torch::zeros({options.hidden()}, parameter_options()));
  }
}

torch::Tensor LayerNormImpl::forward(const torch::Tensor& x) {
  return at::layer_norm(x, {options.hidden()}, weight, bias, options.eps());
}

void LayerNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dschat::nn::LayerNorm(" << options.hidden() << ", eps=" << options.eps()
         << ", elementwise_affine=" << (options.elementwise_affine() ? "true" : "false") << ")";
}

}  // namespace nn
}  // namespace dschat
