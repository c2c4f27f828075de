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

class TensorParallelGroup;  // nn/tensor_parallel.h

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
  torch::Tensor attention_mask;  // [B, S] int64 key mask (1 = real) when some token is padded,
                                 // else undefined; read by the decode-attention op
  TensorParallelGroup* tensor_parallel = nullptr;  // set on a tensor-parallel shard (generation
                                                   // only): row-parallel outputs are all-reduced
};

/// The masking part of AttentionInputs for attention_mask [B, S] and T new tokens: an explicit
/// bias only when some token is padded, otherwise SDPA's causal path (T == S) or no mask (T == 1);
/// with padding also the key mask itself (int64), which the decode-attention op reads.
AttentionInputs attention_masking(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype);

/// attention_mask: [B, S] (1 = real token) -> additive bias [B, 1, T, S] in `dtype` that also
/// enforces causality for the last T positions. Fully masked rows (left padding) stay finite.
torch::Tensor causal_attention_bias(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype);

/// Position ids from the mask, so left padding does not shift positions: [B, S] -> [B, T]
/// (the last T columns of cumsum(mask) - 1; padded slots get `pad_position`).
torch::Tensor positions_from_mask(const torch::Tensor& attention_mask, int64_t new_tokens, int64_t pad_position);

/// True when a forward runs the fused inference ops (dschat/ops): with a KV cache, without
/// autograd, and with no dropout to apply (`dropout_active`: training with p > 0). Training and
/// uncached forwards keep the autograd path.
bool use_inference_ops(const KvCache* cache, bool dropout_active);

/// linear(x) for a caller that adds the bias in a fused epilogue (ops::bias_residual_*_norm,
/// ops::bias_activation): returns x W^T and sets *bias to linear.bias (undefined without one).
/// With unfused LoRA adapters it returns the full forward (bias included) and leaves *bias
/// undefined, so the adapters' output is still added after the bias, as in Linear::forward.
torch::Tensor linear_deferring_bias(LinearImpl& linear, const torch::Tensor& x, torch::Tensor* bias);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const AttentionOptions& options);
  /// x: [B, T, hidden] -> [B, T, hidden]. `layer` indexes the cache when one is given. On the
  /// inference path (use_inference_ops) rotary runs as ops::rotary_embedding and a single-token
  /// step as ops::decode_attention. With `deferred_bias`, the output projection's bias is left
  /// out of the result and returned there (see linear_deferring_bias). With
  /// inputs.tensor_parallel this module holds one rank's heads: o_proj's partial output is
  /// all-reduced before the bias (nn::row_parallel_linear); only the inference path is allowed.
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& inputs, int64_t layer, KvCache* cache,
                        torch::Tensor* deferred_bias = nullptr);
  void pretty_print(std::ostream& stream) const override;

  AttentionOptions options;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};
TORCH_MODULE(Attention);

}  // namespace nn
}  // namespace dschat
