#include "dschat/ops/residual_norm.h"

#include "dschat/core/error.h"
#include "dschat/ops/rms_norm.h"
#include "ops/kernel_dispatch.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dschat/core/status_check.h"
#include "kernels/residual_norm.cuh"
#endif

namespace dschat {
namespace ops {
namespace {

// `vector` (undefined allowed unless `required`) must be [H] in x's dtype, on x's device.
void check_vector(const char* op, const char* name, const torch::Tensor& vector, const torch::Tensor& x,
                  bool required) {
  if (!vector.defined()) {
    DSCHAT_CHECK(!required, InvalidArgument, op, ": ", name, " is required");
    return;
  }
  const int64_t hidden = x.size(-1);
  DSCHAT_CHECK(vector.dim() == 1 && vector.size(0) == hidden, InvalidArgument, op, ": expected ", name,
               " of shape [", hidden, "], got ", vector.sizes());
  DSCHAT_CHECK(vector.scalar_type() == x.scalar_type(), InvalidArgument, op, ": ", name, " dtype ",
               vector.scalar_type(), " differs from x dtype ", x.scalar_type());
  DSCHAT_CHECK(vector.device() == x.device(), InvalidArgument, op, ": ", name, " is on ", vector.device(),
               ", x on ", x.device());
}

void check_residual_norm_arguments(const char* op, const torch::Tensor& x, const torch::Tensor& bias, const torch::Tensor& residual,
                     const torch::Tensor& weight, const torch::Tensor& beta, bool rms) {
  DSCHAT_CHECK(x.defined() && x.dim() >= 1, InvalidArgument, op, ": expected x of shape [..., H], got ",
               detail::shape_of(x));
  DSCHAT_CHECK(x.is_floating_point(), InvalidArgument, op, ": x must be floating point, got ", x.scalar_type());
  DSCHAT_CHECK(residual.defined() && residual.sizes() == x.sizes(), InvalidArgument, op, ": residual shape ",
               detail::shape_of(residual), " differs from x shape ", x.sizes());
  DSCHAT_CHECK(residual.scalar_type() == x.scalar_type(), InvalidArgument, op, ": residual dtype ",
               residual.scalar_type(), " differs from x dtype ", x.scalar_type());
  DSCHAT_CHECK(residual.device() == x.device(), InvalidArgument, op, ": residual is on ", residual.device(),
               ", x on ", x.device());
  check_vector(op, "bias", bias, x, false);
  check_vector(op, "weight", weight, x, rms);
  check_vector(op, "beta", beta, x, false);
}

torch::Tensor residual_sum(const torch::Tensor& x, const torch::Tensor& bias, const torch::Tensor& residual) {
  return bias.defined() ? (x + bias) + residual : x + residual;  // [..., H]
}

#ifdef DSCHAT_WITH_CUDA
ResidualNormOutput run_residual_norm_kernel(const char* op, const torch::Tensor& x, const torch::Tensor& bias,
                              const torch::Tensor& residual, const torch::Tensor& weight, const torch::Tensor& beta,
                              double eps, bool rms) {
  c10::cuda::CUDAGuard guard(x.device());
  auto contiguous = [](const torch::Tensor& t) { return t.defined() ? t.contiguous() : t; };
  torch::Tensor xs = x.contiguous(), rs = residual.contiguous();                               // [..., H]
  torch::Tensor b = contiguous(bias), w = contiguous(weight), bt = contiguous(beta);           // [H]
  ResidualNormOutput result{torch::empty_like(xs), torch::empty_like(xs)};                     // [..., H] each
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : xs.numel() / cols;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  detail::dispatch_kernel_dtype(op, x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    kernels::ResidualNormParams<T> p{};
    p.x = detail::data_as<T>(xs);
    p.bias = detail::data_as<T>(b);
    p.residual = detail::data_as<T>(rs);
    p.weight = detail::data_as<T>(w);
    p.beta = detail::data_as<T>(bt);
    p.out = detail::mutable_data_as<T>(result.output);
    p.residual_out = detail::mutable_data_as<T>(result.residual);
    p.rows = rows;
    p.cols = cols;
    p.eps = static_cast<float>(eps);
    DSCHAT_CUDA_CHECK(rms ? kernels::bias_residual_rms_norm(p, stream) : kernels::bias_residual_layer_norm(p, stream));
  });
  return result;
}
#endif

}  // namespace

ResidualNormOutput bias_residual_layer_norm_reference(const torch::Tensor& x, const torch::Tensor& bias,
                                                      const torch::Tensor& residual, const torch::Tensor& weight,
                                                      const torch::Tensor& beta, double eps) {
  check_residual_norm_arguments("bias_residual_layer_norm", x, bias, residual, weight, beta, false);
  torch::Tensor sum = residual_sum(x, bias, residual);  // [..., H]
  return {torch::layer_norm(sum, {x.size(-1)}, weight, beta, eps), sum};
}

ResidualNormOutput bias_residual_layer_norm(const torch::Tensor& x, const torch::Tensor& bias,
                                            const torch::Tensor& residual, const torch::Tensor& weight,
                                            const torch::Tensor& beta, double eps) {
#ifdef DSCHAT_WITH_CUDA
  check_residual_norm_arguments("bias_residual_layer_norm", x, bias, residual, weight, beta, false);
  if (detail::kernel_applies(x, {x, bias, residual, weight, beta})) {
    return run_residual_norm_kernel("bias_residual_layer_norm", x, bias, residual, weight, beta, eps, false);
  }
#endif
  return bias_residual_layer_norm_reference(x, bias, residual, weight, beta, eps);
}

ResidualNormOutput bias_residual_rms_norm_reference(const torch::Tensor& x, const torch::Tensor& bias,
                                                    const torch::Tensor& residual, const torch::Tensor& weight,
                                                    double eps) {
  check_residual_norm_arguments("bias_residual_rms_norm", x, bias, residual, weight, torch::Tensor(), true);
  torch::Tensor sum = residual_sum(x, bias, residual);  // [..., H]
  return {rms_norm_reference(sum, weight, eps), sum};
}

ResidualNormOutput bias_residual_rms_norm(const torch::Tensor& x, const torch::Tensor& bias,
                                          const torch::Tensor& residual, const torch::Tensor& weight, double eps) {
#ifdef DSCHAT_WITH_CUDA
  check_residual_norm_arguments("bias_residual_rms_norm", x, bias, residual, weight, torch::Tensor(), true);
  if (detail::kernel_applies(x, {x, bias, residual, weight})) {
    return run_residual_norm_kernel("bias_residual_rms_norm", x, bias, residual, weight, torch::Tensor(), eps, true);
  }
#endif
  return bias_residual_rms_norm_reference(x, bias, residual, weight, eps);
}

}  // namespace ops
}  // namespace dschat
