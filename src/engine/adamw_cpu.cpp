#include "adamw_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "dschat/core/error.h"

// The library is built for baseline x86-64, so the wider loops are compiled per instruction set
// with `#pragma GCC target` and chosen at run time. Intrinsics are needed for sqrt only: GCC will
// not auto-vectorise sqrtf while it may set errno (-fmath-errno, the default), and per-function
// optimize("no-math-errno") does not reach builtins.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSCHAT_ADAM_X86 1
#include <immintrin.h>
#else
#define DSCHAT_ADAM_X86 0
#endif

namespace dschat {
namespace engine {
namespace detail {
namespace {

// Elements per unit of parallel work (4096 fp32 x 4 streams = 64 KiB, L2-resident). Every element
// takes the same instructions wherever a split falls (the vector loops pad their tail), so the
// result does not depend on the thread count.
constexpr int64_t kBlockElements = 4096;
// Blocks per thread at least, so small tensors (biases, norms) run inline without a fork.
constexpr int64_t kGrainBlocks = 8;
// bf16/fp16 parameters are widened into fp32 tiles of this many elements (8 KiB of stack each).
constexpr int64_t kTileElements = 1024;

// The portable update (CpuIsa::kScalar), the same arithmetic as adamw_cpu_vector.inc.
template <bool kDecoupledDecay>
void adam_scalar_loop(float* __restrict param, const float* __restrict grad, float* __restrict exp_avg,
                      float* __restrict exp_avg_sq, int64_t count, const AdamStepScalars& s) {
  for (int64_t i = 0; i < count; ++i) {
    float g = grad[i];
    float p = param[i];
    if constexpr (!kDecoupledDecay) g = g + s.l2 * p;
    const float m = exp_avg[i] * s.beta1 + g * s.one_minus_beta1;
    const float v = exp_avg_sq[i] * s.beta2 + (g * g) * s.one_minus_beta2;
    const float denom = std::sqrt(v) * s.inv_sqrt_bias_correction2 + s.eps;
    if constexpr (kDecoupledDecay) p = p * s.decay_factor;
    p = p - s.step_size * (m / denom);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p;
  }
}

#if DSCHAT_ADAM_X86
namespace isa_sse {  // baseline x86-64: no pragma needed
using FloatVec = __m128;
constexpr int64_t kWidth = 4;
inline FloatVec load(const float* from) { return _mm_loadu_ps(from); }
inline void store(float* to, FloatVec value) { _mm_storeu_ps(to, value); }
inline FloatVec vector_sqrt(FloatVec x) { return _mm_sqrt_ps(x); }
#include "adamw_cpu_vector.inc"
void adamw_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepScalars& s) {
  adam_vector_loop<true>(p, g, m, v, n, s);
}
void adam_l2_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepScalars& s) {
  adam_vector_loop<false>(p, g, m, v, n, s);
}
}  // namespace isa_sse

#pragma GCC push_options
#pragma GCC target("avx")
namespace isa_avx {
using FloatVec = __m256;
constexpr int64_t kWidth = 8;
inline FloatVec load(const float* from) { return _mm256_loadu_ps(from); }
inline void store(float* to, FloatVec value) { _mm256_storeu_ps(to, value); }
inline FloatVec vector_sqrt(FloatVec x) { return _mm256_sqrt_ps(x); }
#include "adamw_cpu_vector.inc"
void adamw_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepScalars& s) {
  adam_vector_loop<true>(p, g, m, v, n, s);
}
void adam_l2_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepScalars& s) {
  adam_vector_loop<false>(p, g, m, v, n, s);
}
}  // namespace isa_avx
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace isa_avx512 {
using FloatVec = __m512;
constexpr int64_t kWidth = 16;
inline FloatVec load(const float* from) { return _mm512_loadu_ps(from); }
inline void store(float* to, FloatVec value) { _mm512_storeu_ps(to, value); }
// The zero-masked form: the plain one trips -Wmaybe-uninitialized inside GCC 12's header.
inline FloatVec vector_sqrt(FloatVec x) { return _mm512_maskz_sqrt_ps(static_cast<__mmask16>(0xFFFF), x); }
#include "adamw_cpu_vector.inc"
void adamw_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepScalars& s) {
  adam_vector_loop<true>(p, g, m, v, n, s);
}
void adam_l2_loop(float* p, const float* g, float* m, float* v, int64_t n, const AdamStepScalars& s) {
  adam_vector_loop<false>(p, g, m, v, n, s);
}
}  // namespace isa_avx512
#pragma GCC pop_options
#endif  // DSCHAT_ADAM_X86

CpuIsa detect_cpu_isa() {
#if DSCHAT_ADAM_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx")) return CpuIsa::kAvx;
  return CpuIsa::kSse;
#else
  return CpuIsa::kScalar;
#endif
}

// fp32 elements [0, count) with the chosen instruction set.
template <bool kDecoupledDecay>
void adam_span_f32(float* p, const float* g, float* m, float* v, int64_t count, const AdamStepScalars& s, CpuIsa isa) {
#if DSCHAT_ADAM_X86
  switch (isa) {
    case CpuIsa::kAvx512:
      return kDecoupledDecay ? isa_avx512::adamw_loop(p, g, m, v, count, s)
                             : isa_avx512::adam_l2_loop(p, g, m, v, count, s);
    case CpuIsa::kAvx:
      return kDecoupledDecay ? isa_avx::adamw_loop(p, g, m, v, count, s) : isa_avx::adam_l2_loop(p, g, m, v, count, s);
    case CpuIsa::kSse:
      return kDecoupledDecay ? isa_sse::adamw_loop(p, g, m, v, count, s) : isa_sse::adam_l2_loop(p, g, m, v, count, s);
    case CpuIsa::kScalar:
      break;
  }
#else
  (void)isa;
#endif
  adam_scalar_loop<kDecoupledDecay>(p, g, m, v, count, s);
}

// bf16/fp16 elements [0, count): widened to fp32 tile by tile, written back rounded to nearest even.
template <typename scalar_t, bool kDecoupledDecay>
void adam_span_reduced(scalar_t* p, const scalar_t* g, float* m, float* v, int64_t count, const AdamStepScalars& s,
                       CpuIsa isa) {
  float param_tile[kTileElements];
  float grad_tile[kTileElements];
  for (int64_t start = 0; start < count; start += kTileElements) {
    const int64_t length = std::min(kTileElements, count - start);
    for (int64_t i = 0; i < length; ++i) {
      param_tile[i] = static_cast<float>(p[start + i]);
      grad_tile[i] = static_cast<float>(g[start + i]);
    }
    adam_span_f32<kDecoupledDecay>(param_tile, grad_tile, m + start, v + start, length, s, isa);
    for (int64_t i = 0; i < length; ++i) p[start + i] = static_cast<scalar_t>(param_tile[i]);
  }
}

template <typename scalar_t, bool kDecoupledDecay>
void adam_span(scalar_t* p, const scalar_t* g, float* m, float* v, int64_t count, const AdamStepScalars& s,
               CpuIsa isa) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    adam_span_f32<kDecoupledDecay>(p, g, m, v, count, s, isa);
  } else {
    adam_span_reduced<scalar_t, kDecoupledDecay>(p, g, m, v, count, s, isa);
  }
}

template <typename scalar_t, bool kDecoupledDecay>
void run_blocks(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                const torch::Tensor& exp_avg_sq, const AdamStepScalars& scalars, CpuIsa isa) {
  auto* p = param.data_ptr<scalar_t>();
  const auto* g = grad.data_ptr<scalar_t>();
  auto* m = exp_avg.data_ptr<float>();
  auto* v = exp_avg_sq.data_ptr<float>();
  const int64_t numel = param.numel();
  const int64_t blocks = (numel + kBlockElements - 1) / kBlockElements;
  at::parallel_for(0, blocks, kGrainBlocks, [&](int64_t first_block, int64_t end_block) {
    const int64_t begin = first_block * kBlockElements;
    const int64_t end = std::min(end_block * kBlockElements, numel);
    adam_span<scalar_t, kDecoupledDecay>(p + begin, g + begin, m + begin, v + begin, end - begin, scalars, isa);
  });
}

template <typename scalar_t>
void run_blocks(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                const torch::Tensor& exp_avg_sq, const AdamStepScalars& scalars, CpuIsa isa) {
  if (scalars.adam_w_mode) {
    run_blocks<scalar_t, true>(param, grad, exp_avg, exp_avg_sq, scalars, isa);
  } else {
    run_blocks<scalar_t, false>(param, grad, exp_avg, exp_avg_sq, scalars, isa);
  }
}

}  // namespace

CpuIsa best_cpu_isa() {
  static const CpuIsa best = detect_cpu_isa();
  return best;
}

bool cpu_isa_supported(CpuIsa isa) { return static_cast<int>(isa) <= static_cast<int>(best_cpu_isa()); }

AdamStepScalars adam_step_scalars(double lr, double weight_decay, double beta1, double beta2, double eps, int64_t step,
                                  bool bias_correction, bool adam_w_mode) {
  DSCHAT_INTERNAL_ASSERT(step >= 1, "step ", step);
  const double bias_correction1 = bias_correction ? 1.0 - std::pow(beta1, static_cast<double>(step)) : 1.0;
  const double bias_correction2 = bias_correction ? 1.0 - std::pow(beta2, static_cast<double>(step)) : 1.0;
  AdamStepScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.step_size = static_cast<float>(lr / bias_correction1);
  s.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.decay_factor = adam_w_mode ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  s.l2 = adam_w_mode ? 0.0f : static_cast<float>(weight_decay);
  s.adam_w_mode = adam_w_mode;
  return s;
}

void adam_step_cpu(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                   const torch::Tensor& exp_avg_sq, const AdamStepScalars& scalars, CpuIsa isa) {
  DSCHAT_CHECK(cpu_isa_supported(isa), Unsupported, "AdamW on CPU: instruction set ", static_cast<int>(isa),
               " is not available on this CPU");
  switch (param.scalar_type()) {
    case torch::kFloat32:
      return run_blocks<float>(param, grad, exp_avg, exp_avg_sq, scalars, isa);
    case torch::kBFloat16:
      return run_blocks<c10::BFloat16>(param, grad, exp_avg, exp_avg_sq, scalars, isa);
    case torch::kFloat16:
      return run_blocks<c10::Half>(param, grad, exp_avg, exp_avg_sq, scalars, isa);
    default:
      DSCHAT_THROW(Unsupported, "AdamW on CPU: parameter dtype ", param.scalar_type(),
                   " is not supported (float32, bfloat16 or float16)");
  }
}

}  // namespace detail
}  // namespace engine
}  // namespace dschat
