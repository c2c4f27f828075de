#pragma once
// The CPU Adam/AdamW update of one parameter tensor (DeepSpeedCPUAdam's Step for one tensor):
// an fp32 loop over 16/8/4-float vectors (AVX-512 / AVX / SSE, picked at run time, as DeepSpeed's
// simd.h does), split across threads with at::parallel_for.

#include <torch/torch.h>

#include <cstdint>

namespace dschat {
namespace engine {
namespace detail {

/// Vector instruction sets of the update loop. kScalar is the portable fallback (non-x86, clang).
enum class CpuIsa { kScalar, kSse, kAvx, kAvx512 };

/// The widest one this CPU and this build support.
CpuIsa best_cpu_isa();
/// Whether this CPU and build can run `isa`.
bool cpu_isa_supported(CpuIsa isa);

/// The per-step scalars, computed once per parameter in double and rounded to float for the loop.
struct AdamStepScalars {
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float one_minus_beta1 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float step_size = 0.0f;                  // lr / (1 - b1^t), or lr without bias correction
  float inv_sqrt_bias_correction2 = 0.0f;  // 1 / sqrt(1 - b2^t), or 1 without bias correction
  float eps = 0.0f;
  float decay_factor = 1.0f;  // AdamW mode: 1 - lr wd
  float l2 = 0.0f;            // Adam mode: wd (g += wd p)
  bool adam_w_mode = true;
};

/// `step` is the parameter's step count after incrementing (t >= 1).
AdamStepScalars adam_step_scalars(double lr, double weight_decay, double beta1, double beta2, double eps, int64_t step,
                                  bool bias_correction, bool adam_w_mode);

/// One update in place. param, grad: same shape, same dtype (fp32, bf16 or fp16), CPU, contiguous;
/// exp_avg, exp_avg_sq: fp32, CPU, contiguous, param's numel. The caller has checked all of this.
/// The result is bit-identical for every thread count. Instruction sets may differ in the last
/// bit (the AVX-512 loop contracts multiply-adds into FMA).
/// bf16/fp16 parameters are widened to fp32 tile by tile, updated, and written back rounded.
void adam_step_cpu(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                   const torch::Tensor& exp_avg_sq, const AdamStepScalars& scalars, CpuIsa isa = best_cpu_isa());

}  // namespace detail
}  // namespace engine
}  // namespace dschat
