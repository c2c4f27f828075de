#include "dschat/ops/skinny_linear.h"

#include <ATen/Parallel.h>

#include "dschat/core/error.h"
#include "ops/kernel_dispatch.h"
#include "ops/skinny_linear_kernel.h"

namespace dschat {
namespace ops {
namespace {

// Outputs per unit of parallel work: 64 weight rows of K floats (192 KiB at K = 768), so a small
// layer (a tiny test model's 64 outputs) runs inline without forking the thread pool.
constexpr int64_t kGrainOutputs = 64;

// linear()'s skinny row limit on CPUs other than AMD's with AVX-512 (skinny_linear_auto_rows).
constexpr int64_t kSkinnyRowsWhereFmaWins = 8;

thread_local int at_linear_guards = 0;  // AtLinearGuards alive on this thread

int64_t rows_of(const torch::Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

// CPU float32, a contiguous [N, K] weight, a bias of N or none, no autograd: the kernel's own
// conditions apart from the row count.
bool skinny_kernel_takes(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat32 || x.dim() < 1) return false;
  if (!weight.device().is_cpu() || weight.scalar_type() != torch::kFloat32 || weight.dim() != 2 ||
      !weight.is_contiguous() || weight.size(1) != x.size(-1) || weight.size(1) == 0) {
    return false;
  }
  if (bias.defined() && (!bias.device().is_cpu() || bias.scalar_type() != torch::kFloat32 || bias.dim() != 1 ||
                         bias.size(0) != weight.size(0))) {
    return false;
  }
  return !detail::autograd_records({x, weight, bias});
}

}  // namespace

int64_t skinny_linear_auto_rows() {
  static const int64_t rows = detail::skinny_isa_supported(detail::SkinnyIsa::kAvx512) && detail::cpu_is_amd()
                                  ? kSkinnyLinearMaxRows
                                  : kSkinnyRowsWhereFmaWins;
  return rows;
}

AtLinearGuard::AtLinearGuard() { ++at_linear_guards; }
AtLinearGuard::~AtLinearGuard() { --at_linear_guards; }
bool AtLinearGuard::active() { return at_linear_guards > 0; }

bool skinny_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (AtLinearGuard::active()) return false;
  const int64_t rows = rows_of(x);
  return rows >= 1 && rows <= skinny_linear_auto_rows() && skinny_kernel_takes(x, weight, bias);
}

namespace {

// The kernel on arguments skinny_linear_applies accepted (checked once per call by the caller).
torch::Tensor run_skinny_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const int64_t rows = rows_of(x), k = weight.size(1), n = weight.size(0);
  const torch::Tensor input = x.contiguous();                      // [..., K]
  const torch::Tensor b = bias.defined() ? bias.contiguous() : bias;  // [N] or undefined
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = n;
  torch::Tensor y = torch::empty(out_shape, x.options());  // [..., N]
  const float* x_data = input.data_ptr<float>();
  const float* w_data = weight.data_ptr<float>();
  const float* b_data = b.defined() ? b.data_ptr<float>() : nullptr;
  float* y_data = y.data_ptr<float>();
  const detail::SkinnyIsa isa = detail::best_skinny_isa();
  // Each output is computed whole by one thread, so the split does not change any result.
  at::parallel_for(0, n, kGrainOutputs, [&](int64_t begin, int64_t end) {
    detail::skinny_linear_range(isa, x_data, w_data, b_data, y_data, rows, k, n, begin, end);
  });
  return y;
}

}  // namespace

torch::Tensor skinny_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const int64_t rows = rows_of(x);
  DSCHAT_CHECK(rows >= 1 && rows <= kSkinnyLinearMaxRows && skinny_kernel_takes(x, weight, bias), InvalidArgument,
               "skinny_linear: x ", x.sizes(), " ", x.scalar_type(), " on ", x.device(), ", weight ", weight.sizes(),
               ": needs CPU float32, a contiguous [N, K] weight, 1..", kSkinnyLinearMaxRows,
               " rows of K and no autograd");
  return run_skinny_linear(x, weight, bias);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (skinny_linear_applies(x, weight, bias)) return run_skinny_linear(x, weight, bias);
  return at::linear(x, weight, bias);  // [..., N]
}

}  // namespace ops
}  // namespace dschat
