#pragma once
// Multi-head self-attention with grouped-query heads, optional rotary embeddings (on all or the
// first rotary dims of each head), optional per-head q/k RMSNorm (Qwen3), sliding-window layers
// and an external KV cache. Projection names: q_proj, k_proj, v_proj and the output projection
// named as the family's checkpoint names it (out_proj, o_proj, c_proj, dense).
//   Attention attn(AttentionOptions(768, 12).output_name("out_proj").scale_query(true));

#include <torch/torch.h>

#include <string>

#include "dschat/nn/kv_cache.h"
#include "dschat/nn/linear.h"
#include "dschat/nn/rms_norm.h"

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
  TORCH_ARG(bool, bias) = true;                      // bias on q_proj, k_proj, v_proj
  TORCH_ARG(bool, output_bias) = true;               // bias on the output projection
  TORCH_ARG(std::string, output_name) = "out_proj";  // "o_proj" for LLaMA
  TORCH_ARG(bool, scale_query) = false;              // OPT scales q after projection, before q.k
  TORCH_ARG(bool, scaled) = true;                    // false: q.k is not scaled at all (GPT-Neo)
  TORCH_ARG(double, qk_norm_eps) = 0.0;              // > 0: q_norm, k_norm RMSNorm per head (Qwen3)
  TORCH_ARG(bool, sliding_window) = false;           // this layer masks with AttentionInputs::window_bias
  TORCH_ARG(double, dropout) = 0.0;                  // on attention probabilities, training only
};

/// What the caller knows about the padding of a forward's attention mask [B, S]. The masking is
/// chosen from it, never by reading the mask on the host (a device sync per forward), and
/// unpadded or right-padded batches take SDPA's causal path, which needs no dense [B, 1, T, S]
/// bias (flash attention takes none).
///   kUnknown     nothing stated. Without a KV cache: the explicit mask (right for any mask). With
///                a cache (incremental decoding): the mask is read on the host, as before the enum
///                existed (skipped while a CUDA graph is captured: then the explicit mask).
///   kUnpadded    every entry is 1 (no padding): SDPA's causal path (T == S), no mask at all for
///                one new token, a causal bias otherwise (cached chunk). An undefined mask is this.
///   kRightPadded every row is its real tokens followed by padding (SFT batches, data::collate_sft),
///                without a KV cache: SDPA's causal path, no mask tensors. Exact for every real
///                token (it only attends to earlier real tokens, and its position equals arange);
///                outputs at padded positions are unspecified (they attend to earlier pads too).
///                Over cached tokens (S > T) it takes the explicit mask, as kLeftPadded.
///   kLeftPadded  padding before the real tokens (generation prompts, PPO sequences: left-padded
///                prompt + answer padded after EOS) or anywhere else: the explicit mask (a
///                [B, 1, T, S] bias and the [B, S] key mask).
enum class MaskLayout { kUnknown, kUnpadded, kRightPadded, kLeftPadded };

/// Per-forward inputs shared by every layer.
struct AttentionInputs {
  torch::Tensor bias;      // [B, 1, T, S] additive mask (0 or dtype-min), S = cached + T; undefined
                           // on the unpadded/right-padded paths (then `is_causal` or full attention)
  bool is_causal = false;  // T == S without padding (or right padding): SDPA's causal fast path
  torch::Tensor cos;       // [B, T, R] rotary (R <= D: the first R dims of a head), or undefined
  torch::Tensor sin;       // [B, T, R]
  torch::Tensor window_bias;  // [B, 1, T, S] the sliding-window layers' mask, defined only when
                              // the window is shorter than S (else they mask as every layer does)
  bool bias_carries_scores = false;  // `bias` adds more than a mask (ALiBi, [B, H, T, S]): it is
                                     // always applied, never replaced by the decode-attention op
  torch::Tensor attention_mask;  // [B, S] int64 key mask (1 = real) on the explicit-mask path,
                                 // else undefined; read by the decode-attention op
  TensorParallelGroup* tensor_parallel = nullptr;  // set on a tensor-parallel shard (generation
                                                   // only): row-parallel outputs are all-reduced
};

/// The masking part of AttentionInputs for attention_mask [B, S] and T new tokens, as `layout`
/// says (see MaskLayout; kUnknown here means the explicit mask): for kUnpadded SDPA's causal path
/// (T == S), no mask (T == 1) or a causal bias; for kRightPadded without cached tokens (T == S)
/// the causal path; otherwise the explicit bias plus the key mask itself (int64), which the
/// decode-attention op reads. Never reads the mask on the host.
/// With `window` > 0 and S > window, window_bias is also set (sliding_window_bias).
AttentionInputs attention_masking(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype,
                                  MaskLayout layout, int64_t window = 0);

/// kUnpadded when every entry of attention_mask [B, S] is 1, else kLeftPadded (the explicit mask).
/// Reads the mask on the host (a device sync: callers mark it with core::HostSync); while a CUDA
/// graph is being captured, where that is forbidden, answers kLeftPadded without reading.
MaskLayout detect_mask_layout(const torch::Tensor& attention_mask);

/// attention_mask: [B, S] (1 = real token) -> additive bias [B, 1, T, S] in `dtype` that also
/// enforces causality for the last T positions. Fully masked rows (left padding) stay finite.
torch::Tensor causal_attention_bias(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype);

/// As causal_attention_bias, and a query at position p (cumsum of the mask - 1, so left padding
/// does not count) sees only keys at positions > p - window: transformers' sliding window
/// (q - k < window), which it measures in the padded frame; for rows whose real tokens are
/// contiguous both give the same mask at every real token.
torch::Tensor sliding_window_bias(const torch::Tensor& attention_mask, int64_t new_tokens, int64_t window,
                                  torch::ScalarType dtype);

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
  /// step as ops::decode_attention; grouped-query heads reach SDPA unrepeated (enable_gqa). With
  /// `deferred_bias`, the output projection's bias is left out of the result and returned there
  /// (see linear_deferring_bias). With inputs.tensor_parallel this module holds one rank's heads:
  /// o_proj's partial output is all-reduced before the bias (nn::row_parallel_linear); only the
  /// inference path is allowed.
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& inputs, int64_t layer, KvCache* cache,
                        torch::Tensor* deferred_bias = nullptr);
  void pretty_print(std::ostream& stream) const override;

  AttentionOptions options;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // [head_dim] each, with qk_norm_eps > 0 only
};
TORCH_MODULE(Attention);

}  // namespace nn
}  // namespace dschat
