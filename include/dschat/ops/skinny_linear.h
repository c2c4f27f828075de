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

/// The most rows the skinny kernel itself takes (ops::skinny_linear, tests and benchmarks).
constexpr int64_t kSkinnyLinearMaxRows = 32;

/// Up to how many rows linear() picks the skinny kernel on this CPU, fixed per machine (read from
/// CPUID once; no timing, so every run on one machine computes the same bits): 32 on an AMD CPU
/// with AVX-512, whose separate add pipes run the kernel's multiply and add at the rate of an FMA
/// (on a 2-core Zen 4 it was 1.1-3.2x MKL's GEMM at 16 and 32 rows); 8 elsewhere, where adds and
/// FMAs share ports and MKL's FMA GEMM wins above 8 rows (1.2x at 16 rows on the LM head on an
/// AVX-512 Xeon). docs/benchmarks.md, "Decode at the memory-bandwidth limit" and "Up to 32 rows".
int64_t skinny_linear_auto_rows();

/// While alive on this thread, linear() runs at::linear whatever the row count: for a forward run
/// twice, once without autograd and once recomputed with it (nn::checkpoint's segments), which
/// must compute the same bits in both passes. Without it the first pass could take the skinny
/// kernel and the recompute MKL's GEMM, so the gradient would belong to slightly different
/// activations than the loss (Adam turns such noise on a parameter whose true gradient is 0, like
/// a key bias, into full-size steps). Nests.
class AtLinearGuard {
 public:
  AtLinearGuard();
  ~AtLinearGuard();
  AtLinearGuard(const AtLinearGuard&) = delete;
  AtLinearGuard& operator=(const AtLinearGuard&) = delete;

  /// Whether a guard is alive on this thread.
  static bool active();
};

/// True when linear() runs the skinny kernel: CPU float32 tensors, weight [N, K] contiguous,
/// 1..skinny_linear_auto_rows() rows of x, no autograd recording the call, no AtLinearGuard.
bool skinny_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

/// x: [..., K]; weight: [N, K]; bias: [N] or undefined. Returns [..., N]: the skinny kernel where
/// it applies, at::linear (one addmm with the bias fused) otherwise.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

/// The skinny kernel itself (tests and benchmarks) for 1..kSkinnyLinearMaxRows rows on any CPU: same
/// arguments; throws where it does not apply.
torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

}  // namespace ops
}  // namespace dschat
