#pragma once
// Rotary position embedding, rotate-half layout (Hugging Face's rotate_half), on q and k in one
// launch. With half = D / 2 and i < half, for each head of q and k at (b, t):
//   out[i]        = x[i] * cos[b, t, i]               - x[i + half] * sin[b, t, i]
//   out[i + half] = x[i + half] * cos[b, t, i + half] + x[i] * sin[b, t, i + half]
// each product rounded to T, then the sum, as ATen computes x * cos + rotate_half(x) * sin.
// Raw pointers, sizes and a stream; no allocation, no synchronisation.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dschat {
namespace kernels {

template <typename T>
struct RotaryParams {
  const T* q;          // [B, H_q, T, D] at q_stride_*, last dim contiguous
  const T* k;          // [B, H_k, T, D] at k_stride_*, last dim contiguous
  const T* cos;        // [B, T, D] contiguous
  const T* sin;        // [B, T, D] contiguous
  T* q_out;            // [B, H_q, T, D] contiguous, not aliasing any input
  T* k_out;            // [B, H_k, T, D] contiguous, not aliasing any input
  int64_t batch, q_heads, k_heads, tokens, head_dim;  // head_dim even
  int64_t q_stride_b, q_stride_h, q_stride_t;
  int64_t k_stride_b, k_stride_h, k_stride_t;
};

/// T = float, __half, __nv_bfloat16. Returns the launch status (cudaErrorInvalidValue for an
/// odd head_dim).
template <typename T>
cudaError_t rotary_embedding(const RotaryParams<T>& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace dschat
