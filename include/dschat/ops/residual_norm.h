#pragma once
// bias + residual + normalisation in one pass, the epilogue of an attention or MLP block:
//   residual' = (x + bias) + residual      (each add rounded to the dtype, as ATen)
//   output    = LayerNorm(residual')       (OPT; torch.layer_norm's arithmetic)
//             = RMSNorm(residual')         (LLaMA; ops::rms_norm_reference's arithmetic)
// CUDA tensors (float32, float16, bfloat16) run one kernel (kernels/residual_norm.cu) unless
// autograd records the call; everything else runs the *_reference composition, which is also
// the test oracle. docs/ops.md has the tolerances.

#include <torch/torch.h>

namespace dschat {
namespace ops {

struct ResidualNormOutput {
  torch::Tensor output;    // [..., H] the normalised sum
  torch::Tensor residual;  // [..., H] x + bias + residual, the next block's residual
};

/// x, residual: [..., H] (same shape); bias: [H] or undefined; weight (gamma), beta: [H] or
/// undefined (a LayerNorm without elementwise affine). All in one dtype, on one device; any
/// strides (the kernel copies non-contiguous inputs). Results are new tensors in x's dtype.
ResidualNormOutput bias_residual_layer_norm(const torch::Tensor& x, const torch::Tensor& bias,
                                            const torch::Tensor& residual, const torch::Tensor& weight,
                                            const torch::Tensor& beta, double eps);

/// torch::layer_norm((x + bias) + residual, {H}, weight, beta, eps).
ResidualNormOutput bias_residual_layer_norm_reference(const torch::Tensor& x, const torch::Tensor& bias,
                                                      const torch::Tensor& residual, const torch::Tensor& weight,
                                                      const torch::Tensor& beta, double eps);

/// As bias_residual_layer_norm with RMSNorm; weight: [H], required.
ResidualNormOutput bias_residual_rms_norm(const torch::Tensor& x, const torch::Tensor& bias,
                                          const torch::Tensor& residual, const torch::Tensor& weight, double eps);

/// rms_norm_reference((x + bias) + residual, weight, eps).
ResidualNormOutput bias_residual_rms_norm_reference(const torch::Tensor& x, const torch::Tensor& bias,
                                                    const torch::Tensor& residual, const torch::Tensor& weight,
                                                    double eps);

}  // namespace ops
}  // namespace dschat
