#pragma once
// Multi-head self-attention with grouped-query heads, optional rotary embeddings and an external
// KV cache. Projection names follow the checkpoint: q_proj, k_proj, v_proj and out_proj (OPT) or
// o_proj (LLaMA).
//   Attention attn(AttentionOptions(768, 12).output_name("out_proj").scale_query(true));

#include <torch/torch.h>

#include <string>

#include "dschat/nn/kv_cache.h"
#include "dschat/nn/linear.h"

namespace dschat {
namespace nn {

struct AttentionOptions {
  AttentionOptions(int64_t hidden_size, int64_t num_heads)
      : hidden_size_(hidden_size), num_heads_(num_heads), num_kv_heads_(num_heads), head_dim_(hidden_size / num_heads) {}
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(int64_t, num_kv_heads);
  TORCH_ARG(int64_t, head_dim);
  TORCH_ARG(bool, bias) = true;                      // bias on all four projections
  TORCH_ARG(std::string, output_name) = "out_proj";  // "o_proj" for LLaMA
  TORCH_ARG(bool, scale_query) = false;              // OPT scales q after projection, before q.k
  TORCH_ARG(double, dropout) = 0.0;                  // on attention probabilities, training only
};

/// Per-forward inputs shared by every layer.
struct AttentionInputs {
  torch::Tensor bias;      // [B, 1, T, S] additive mask (0 or dtype-min), S = cached + T; undefined
                           // when no token is padded (then `is_causal` or full attention applies)
  bool is_causal = false;  // no padding and no cache: SDPA's causal fast path
  torch::Tensor cos;       // [B, T, D] rotary, or undefined (OPT)
  torch::Tensor sin;       // [B, T, D]
};

/// The masking part of AttentionInputs for attention_mask [B, S] and T new tokens: an explicit
/// bias only when some token is padded, otherwise SDPA's causal path (T == S) or no mask (T == 1).
AttentionInputs attention_masking(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype);

/// attention_mask: [B, S] (1 = real token) -> additive bias [B, 1, T, S] in `dtype` that also
/// enforces causality for the last T positions. Fully masked rows (left padding) stay finite.
torch::Tensor causal_attention_bias(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype);

/// Position ids from the mask, so left padding does not shift positions: [B, S] -> [B, T]
/// (the last T columns of cumsum(mask) - 1; padded slots get `pad_position`).
torch::Tensor positions_from_mask(const torch::Tensor& attention_mask, int64_t new_tokens, int64_t pad_position);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);
  /// x: [B, T, hidden] -> [B, T, hidden]. `layer` indexes the cache when one is given.
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& inputs, int64_t layer, KvCache* cache);
  void pretty_print(std::ostream& stream) const override;

  AttentionOptions options;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(Attention);

}  // namespace nn
}  // namespace dschat
