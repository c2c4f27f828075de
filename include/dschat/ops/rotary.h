#pragma once
// Rotary position embedding in Hugging Face's rotate-half layout, on q and k together:
//   x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
// with cos/sin [B, T, D] as nn::rotary_cos_sin computes them. CUDA tensors (float32, float16,
// bfloat16) run one kernel for both (kernels/rotary.cu) unless autograd records the call;
// everything else runs rotary_embedding_reference, which is also nn::apply_rotary and the test
// oracle. docs/ops.md has the tolerances.

#include <torch/torch.h>

#include <utility>

namespace dschat {
namespace ops {

/// q: [B, H, T, D], k: [B, H_kv, T, D] (D even; any strides, e.g. the transposed views of a
/// projection); cos, sin: [B, T, D]; one dtype and device for all. Returns (q, k) rotated as
/// new tensors of the same shapes (contiguous from the kernel); the inputs are not modified.
std::pair<torch::Tensor, torch::Tensor> rotary_embedding(const torch::Tensor& q, const torch::Tensor& k,
                                                         const torch::Tensor& cos, const torch::Tensor& sin);

/// x: [B, H, T, D]; cos, sin: [B, T, D] -> x * cos + rotate_half(x) * sin, in x's dtype.
torch::Tensor rotary_embedding_reference(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace ops
}  // namespace dschat
