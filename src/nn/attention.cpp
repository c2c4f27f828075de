#include "dschat/nn/attention.h"

#include <cmath>

#include "core/tensor_util.h"
#include "dschat/core/error.h"
#include "dschat/nn/rotary.h"
#include "dschat/nn/tensor_parallel.h"
#include "dschat/ops/decode_attention.h"
#include "dschat/ops/rotary.h"
#include "dschat/ops/skinny_linear.h"

#ifdef DSCHAT_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace dschat {
namespace nn {

using core::lowest_value;

namespace {

bool capturing_cuda_graph(const torch::Tensor& tensor) {
#ifdef DSCHAT_WITH_CUDA
  return tensor.is_cuda() && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  (void)tensor;
  return false;
#endif
}

}  // namespace

torch::Tensor causal_attention_bias(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype) {
  const int64_t total = attention_mask.size(1), cached = total - new_tokens;
  auto device = attention_mask.device();
  torch::Tensor query_pos = torch::arange(cached, total, torch::dtype(torch::kInt64).device(device)).unsqueeze(1);  // [T, 1]
  torch::Tensor key_pos = torch::arange(total, torch::dtype(torch::kInt64).device(device)).unsqueeze(0);            // [1, S]
  torch::Tensor allowed = (key_pos <= query_pos).unsqueeze(0) & attention_mask.to(torch::kBool).unsqueeze(1);       // [B, T, S]
  double min_value = lowest_value(dtype);
  torch::Tensor bias = torch::zeros(allowed.sizes(), torch::dtype(dtype).device(device));  // [B, T, S]
  return bias.masked_fill(allowed.logical_not(), min_value).unsqueeze(1);
}

torch::Tensor sliding_window_bias(const torch::Tensor& attention_mask, int64_t new_tokens, int64_t window,
                                  torch::ScalarType dtype) {
  const int64_t total = attention_mask.size(1), cached = total - new_tokens;
  auto device = attention_mask.device();
  torch::Tensor mask = attention_mask.to(torch::kInt64);                                    // [B, S]
  torch::Tensor position = mask.cumsum(1) - 1;                                              // [B, S]
  torch::Tensor query_index = torch::arange(cached, total, torch::dtype(torch::kInt64).device(device)).unsqueeze(1);  // [T, 1]
  torch::Tensor key_index = torch::arange(total, torch::dtype(torch::kInt64).device(device)).unsqueeze(0);            // [1, S]
  torch::Tensor query_position = position.narrow(1, cached, new_tokens).unsqueeze(2);       // [B, T, 1]
  torch::Tensor in_window = (query_position - position.unsqueeze(1)) < window;              // [B, T, S]
  torch::Tensor allowed = (key_index <= query_index).unsqueeze(0) & mask.to(torch::kBool).unsqueeze(1) & in_window;
  torch::Tensor bias = torch::zeros(allowed.sizes(), torch::dtype(dtype).device(device));  // [B, T, S]
  return bias.masked_fill(allowed.logical_not(), lowest_value(dtype)).unsqueeze(1);         // [B, 1, T, S]
}

AttentionInputs attention_masking(const torch::Tensor& attention_mask, int64_t new_tokens, torch::ScalarType dtype,
                                  MaskLayout layout, int64_t window) {
  AttentionInputs inputs;
  if (window > 0 && attention_mask.size(1) > window) {
    inputs.window_bias = sliding_window_bias(attention_mask, new_tokens, window, dtype);  // [B, 1, T, S]
  }
  const int64_t total = attention_mask.size(1);
  const bool unpadded = layout == MaskLayout::kUnpadded || attention_mask.numel() == 0;
  // Right padding without cached tokens: a real token's causal window holds only real tokens.
  const bool causal_suffices = unpadded || (layout == MaskLayout::kRightPadded && new_tokens == total);
  if (causal_suffices && new_tokens == total) {
    inputs.is_causal = true;
  } else if (!(unpadded && new_tokens == 1)) {
    inputs.bias = causal_attention_bias(attention_mask, new_tokens, dtype);  // [B, 1, T, S]
  }
  if (!causal_suffices) inputs.attention_mask = attention_mask.to(torch::kInt64);  // [B, S]
  return inputs;
}

MaskLayout detect_mask_layout(const torch::Tensor& attention_mask) {
  // Reading the mask on the host would synchronise a CUDA stream, which a CUDA-graph capture
  // forbids; there the mask is taken as padded (the explicit-mask path is right for any mask).
  if (attention_mask.numel() == 0) return MaskLayout::kUnpadded;
  if (capturing_cuda_graph(attention_mask)) return MaskLayout::kLeftPadded;
  return attention_mask.all().item<bool>() ? MaskLayout::kUnpadded : MaskLayout::kLeftPadded;
}

torch::Tensor positions_from_mask(const torch::Tensor& attention_mask, int64_t new_tokens, int64_t pad_position) {
  torch::Tensor mask = attention_mask.to(torch::kInt64);  // [B, S]
  torch::Tensor positions = mask.cumsum(1) - 1;           // [B, S]
  positions = positions.masked_fill(mask == 0, pad_position);
  return positions.narrow(1, mask.size(1) - new_tokens, new_tokens);
}

AttentionImpl::AttentionImpl(const AttentionOptions& options_) : options(options_) {
  const int64_t h = options.hidden_size(), d = options.head_dim();
  DSCHAT_CHECK(options.num_heads() % options.num_kv_heads() == 0, InvalidArgument, "attention: num_heads (",
               options.num_heads(), ") must be a multiple of num_kv_heads (", options.num_kv_heads(), ")");
  q_proj = register_module("q_proj", Linear(LinearOptions(h, options.num_heads() * d).bias(options.bias())));
  k_proj = register_module("k_proj", Linear(LinearOptions(h, options.num_kv_heads() * d).bias(options.bias())));
  v_proj = register_module("v_proj", Linear(LinearOptions(h, options.num_kv_heads() * d).bias(options.bias())));
  o_proj = register_module(options.output_name(),
                           Linear(LinearOptions(options.num_heads() * d, h).bias(options.output_bias())));
  if (options.qk_norm_eps() > 0.0) {
    q_norm = register_module("q_norm", RmsNorm(RmsNormOptions(d).eps(options.qk_norm_eps())));
    k_norm = register_module("k_norm", RmsNorm(RmsNormOptions(d).eps(options.qk_norm_eps())));
  }
}

namespace {

// Rotary on the first R = cos.size(-1) dims of each head of q [B, H, T, D] and k [B, Hkv, T, D]
// (R == D: all of them); the fused op on the inference path.
std::pair<torch::Tensor, torch::Tensor> rotate(const torch::Tensor& q, const torch::Tensor& k,
                                               const AttentionInputs& inputs, bool inference) {
  const int64_t rotary = inputs.cos.size(-1), d = q.size(-1);
  torch::Tensor q_rot = rotary == d ? q : q.narrow(-1, 0, rotary);  // [B, H, T, R]
  torch::Tensor k_rot = rotary == d ? k : k.narrow(-1, 0, rotary);  // [B, Hkv, T, R]
  if (inference) {
    std::tie(q_rot, k_rot) = ops::rotary_embedding(q_rot, k_rot, inputs.cos, inputs.sin);
  } else {
    q_rot = apply_rotary(q_rot, inputs.cos, inputs.sin);
    k_rot = apply_rotary(k_rot, inputs.cos, inputs.sin);
  }
  if (rotary == d) return {q_rot, k_rot};
  return {torch::cat({q_rot, q.narrow(-1, rotary, d - rotary)}, -1),   // [B, H, T, D]
          torch::cat({k_rot, k.narrow(-1, rotary, d - rotary)}, -1)};  // [B, Hkv, T, D]
}

}  // namespace

bool use_inference_ops(const KvCache* cache, bool dropout_active) {
  return cache != nullptr && !torch::GradMode::is_enabled() && !dropout_active;
}

torch::Tensor linear_deferring_bias(LinearImpl& linear, const torch::Tensor& x, torch::Tensor* bias) {
  if (linear.has_lora() && !linear.lora_fused()) {
    *bias = torch::Tensor();
    return linear.forward(x);
  }
  *bias = linear.bias;
  return ops::linear(x, linear.weight, torch::Tensor());  // [..., out]
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const AttentionInputs& inputs, int64_t layer,
                                     KvCache* cache, torch::Tensor* deferred_bias) {
  const int64_t batch = x.size(0), steps = x.size(1), d = options.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const bool inference = use_inference_ops(cache, is_training() && options.dropout() > 0.0);
  require_tensor_parallel_inference(inputs.tensor_parallel, inference, "attention");
  torch::Tensor q = q_proj(x);  // [B, T, H * D]
  if (options.scale_query()) q = q * scale;
  q = q.view({batch, steps, options.num_heads(), d});                        // [B, T, H, D]
  torch::Tensor k = k_proj(x).view({batch, steps, options.num_kv_heads(), d});  // [B, T, Hkv, D]
  if (!q_norm.is_empty()) {  // Qwen3: each head normalised before rotary
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.transpose(1, 2);                                                                        // [B, H, T, D]
  k = k.transpose(1, 2);                                                                        // [B, Hkv, T, D]
  torch::Tensor v = v_proj(x).view({batch, steps, options.num_kv_heads(), d}).transpose(1, 2);  // [B, Hkv, T, D]
  if (inputs.cos.defined()) std::tie(q, k) = rotate(q, k, inputs, inference);
  const double score_scale = options.scale_query() || !options.scaled() ? 1.0 : scale;
  // A sliding-window layer whose window is shorter than the keys masks with its own bias.
  const bool windowed = options.sliding_window() && inputs.window_bias.defined();
  const torch::Tensor& mask_bias = windowed ? inputs.window_bias : inputs.bias;
  const bool decode_op_fits = !windowed && !inputs.bias_carries_scores;
  torch::Tensor out;  // [B, T, H * D]
  if (cache != nullptr && inference && steps == 1 && decode_op_fits) {
    out = cache->attend_decode_step(layer, q, k, v, score_scale);  // [B, H, 1, D] or undefined
  }
  if (out.defined()) {  // the cache attended in place (the paged cache: no gathered copy)
    out = out.reshape({batch, 1, options.num_heads() * d});
  } else {
    if (cache != nullptr) std::tie(k, v) = cache->append(layer, k, v);  // [B, Hkv, S, D] each
    // A padded batch needs the key mask: one built by hand with only `bias` takes the SDPA path.
    if (inference && steps == 1 && decode_op_fits && (inputs.attention_mask.defined() || !inputs.bias.defined())) {
      out = ops::decode_attention(q, k, v, inputs.attention_mask, k.size(2), score_scale)  // [B, H, 1, D]
                .reshape({batch, 1, options.num_heads() * d});
    } else {
      // Grouped-query attention: each KV head serves H / H_kv query heads. SDPA groups them itself
      // (enable_gqa; the same head h -> h / (H / H_kv) mapping as repeat_interleave, with forward
      // outputs bitwise equal on the CPU), so k and v are not materialised H / H_kv times.
      const bool grouped = options.num_heads() != options.num_kv_heads();
      double dropout = is_training() ? options.dropout() : 0.0;
      std::optional<torch::Tensor> bias;
      if (mask_bias.defined()) bias = mask_bias.to(q.scalar_type());
      out = at::scaled_dot_product_attention(q, k, v, bias, dropout, !windowed && inputs.is_causal, score_scale,
                                             /*enable_gqa=*/grouped);  // [B, H, T, D]
      out = out.transpose(1, 2).reshape({batch, steps, options.num_heads() * d});  // [B, T, H * D]
    }
  }
  if (inputs.tensor_parallel != nullptr) {
    return row_parallel_linear(*o_proj, out, *inputs.tensor_parallel, deferred_bias);  // [B, T, hidden]
  }
  if (deferred_bias != nullptr) return linear_deferring_bias(*o_proj, out, deferred_bias);
  return o_proj(out);
}

void AttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "dschat::nn::Attention(hidden=" << options.hidden_size() << ", heads=" << options.num_heads()
         << ", kv_heads=" << options.num_kv_heads() << ", head_dim=" << options.head_dim() << ")";
}

}  // namespace nn
}  // namespace dschat
