#pragma once
// Attention of one new token per row over a KV cache (the decode step of generation), with
// grouped-query heads and a key-padding mask; scores, softmax and the weighted sum in fp32.
// Masked keys score the dtype's lowest finite value (torch.finfo(dtype).min), as nn::Attention
// does, so a row whose keys are all masked averages v uniformly instead of giving NaN.
// CUDA tensors (float32, float16, bfloat16; head_dim <= 256) run the split-K kernel
// (kernels/decode_attention.cu) unless autograd records the call; everything else runs
// decode_attention_reference, which is also the test oracle. docs/ops.md has the tolerances.

#include <torch/torch.h>

namespace dschat {
namespace ops {

/// q: [B, H, 1, D]; k_cache, v_cache: [B, H_kv, S_max, D], of which positions [0, length) are
/// read; attention_mask: [B, length] (nonzero = real token, left padding 0; any integer, bool or
/// float dtype) or undefined (all real). H must be a multiple of H_kv: query head h reads kv head
/// h / (H / H_kv), as repeat_interleave does. `scale` multiplies q . k. Views with any strides are
/// taken (a KV cache narrowed to its filled length, a transposed q); the kernel copies an input
/// whose last dimension is not contiguous. Returns [B, H, 1, D] in q's dtype.
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& attention_mask, int64_t length, double scale);

/// The ATen composition: fp32 (fp64 for fp64 inputs) scores q k^T * scale, masked_fill(lowest),
/// softmax, @ v, cast to q's dtype. Same argument checks as decode_attention.
torch::Tensor decode_attention_reference(const torch::Tensor& q, const torch::Tensor& k_cache,
                                         const torch::Tensor& v_cache, const torch::Tensor& attention_mask,
                                         int64_t length, double scale);

}  // namespace ops
}  // namespace dschat
