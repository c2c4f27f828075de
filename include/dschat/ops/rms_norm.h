#pragma once
// RMSNorm (LLaMA): y = x / sqrt(mean(x^2, -1) + eps) * weight, statistics in fp32.
// CUDA tensors run the fused kernel (kernels/rms_norm.cu) when it is built; everything else runs
// rms_norm_reference, which is also the test oracle. Differentiable either way.

#include <torch/torch.h>

namespace dschat {
namespace ops {

/// input: [..., H]; weight: [H]; returns [..., H] in input's dtype.
torch::Tensor rms_norm(const torch::Tensor& input, const torch::Tensor& weight, double eps);

/// The ATen composition that HF's LlamaRMSNorm computes (fp32 statistics, cast back, * weight).
torch::Tensor rms_norm_reference(const torch::Tensor& input, const torch::Tensor& weight, double eps);

}  // namespace ops
}  // namespace dschat
