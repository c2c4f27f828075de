#pragma once
// y = x W^T + b for a few rows (the decode step: one token per sequence) on the CPU, at the
// memory-bandwidth limit of reading W once.
//
// BLAS GEMMs are tuned for many rows: with 2-8 rows MKL's sgemm reads the weights at 4-11 GB/s
// on a machine that copies memory at ~23 GB/s (docs/benchmarks.md, "GEMM orientation"). This
// kernel streams each weight row once, computing its dot product with every input row from
// cache, each output on one thread.
//
// Its arithmetic is fixed per output element: sixteen fp32 partial sums over k (two 8-lane
// accumulators), a fixed-order reduction, then the k % 16 tail and the bias in order, with no FMA.
// So a row's result depends neither on the thread count nor on the other rows in the batch (a
// sequence decodes to the same ids whatever it is batched with), and is the same on every x86-64
// CPU (the AVX-512, AVX and baseline SSE loops do the same lane operations).

#include <torch/torch.h>

namespace dschat {
namespace ops {

/// The most rows the skinny kernel takes; above it the product is compute-bound and MKL's GEMM,
/// which reuses each weight from registers across rows, is faster (at 16 rows it was 1.2x faster
/// on the LM head: docs/benchmarks.md, "Decode at the memory-bandwidth limit").
constexpr int64_t kSkinnyLinearMaxRows = 8;

/// True when linear() runs the skinny kernel: CPU float32 tensors, weight [N, K] contiguous,
/// 1..kSkinnyLinearMaxRows rows of x, no autograd recording the call.
bool skinny_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

/// x: [..., K]; weight: [N, K]; bias: [N] or undefined. Returns [..., N]: the skinny kernel where
/// it applies, at::linear (one addmm with the bias fused) otherwise.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

/// The skinny kernel itself (tests and benchmarks): same arguments; throws where it does not apply.
torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace ops
}  // namespace dschat
