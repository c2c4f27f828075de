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

int64_t rows_of(const torch::Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

}  // namespace

bool skinny_linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat32 || x.dim() < 1) return false;
  if (!weight.device().is_cpu() || weight.scalar_type() != torch::kFloat32 || weight.dim() != 2 ||
      !weight.is_contiguous() || weight.size(1) != x.size(-1)) {
    return false;
  }
  if (bias.defined() && (!bias.device().is_cpu() || bias.scalar_type() != torch::kFloat32 || bias.dim() != 1 ||
                         bias.size(0) != weight.size(0))) {
    return false;
  }
  if (detail::autograd_records({x, weight, bias})) return false;
  const int64_t rows = rows_of(x);
  return rows >= 1 && rows <= kSkinnyLinearMaxRows && weight.size(1) > 0;
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
  DSCHAT_CHECK(skinny_linear_applies(x, weight, bias), InvalidArgument, "skinny_linear: x ", x.sizes(), " ",
               x.scalar_type(), " on ", x.device(), ", weight ", weight.sizes(), ": needs CPU float32, a contiguous "
               "[N, K] weight, 1..", kSkinnyLinearMaxRows, " rows of K and no autograd");
  return run_skinny_linear(x, weight, bias);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (skinny_linear_applies(x, weight, bias)) return run_skinny_linear(x, weight, bias);
  return at::linear(x, weight, bias);  // [..., N]
}

}  // namespace ops
}  // namespace dschat
