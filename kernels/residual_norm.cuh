#pragma once
// bias + residual + norm in one pass over each row (OPT's LayerNorm, LLaMA's RMSNorm):
//   sum[r, :] = (x[r, :] + bias) + residual[r, :]          rounded to T after each add, as ATen
//   out[r, :] = LayerNorm(sum[r, :]; gamma, beta, eps)     fp32 two-pass mean/variance, or
//             = RMSNorm(sum[r, :]; weight, eps)            fp32 mean square, normalised value
//                                                          rounded to T, then * weight
// Both `sum` (the new residual) and `out` are written. Raw pointers, sizes and a stream;
// no allocation, no synchronisation.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dschat {
namespace kernels {

template <typename T>
struct ResidualNormParams {
  const T* x;         // [rows, cols] contiguous
  const T* bias;      // [cols] or null
  const T* residual;  // [rows, cols] contiguous
  const T* weight;    // [cols]: gamma (LayerNorm; null = 1) or weight (RMSNorm; required)
  const T* beta;      // [cols] or null = 0 (LayerNorm only)
  T* out;             // [rows, cols] normalised
  T* residual_out;    // [rows, cols] the sum; must not alias x or residual
  int64_t rows, cols;
  float eps;
};

/// T = float, __half, __nv_bfloat16. Returns the launch status.
template <typename T>
cudaError_t bias_residual_layer_norm(const ResidualNormParams<T>& params, cudaStream_t stream);

/// As above with RMSNorm (params.beta is ignored).
template <typename T>
cudaError_t bias_residual_rms_norm(const ResidualNormParams<T>& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace dschat
