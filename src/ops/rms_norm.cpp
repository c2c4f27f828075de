#include "dschat/ops/rms_norm.h"

#include "dschat/core/error.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dschat/core/status_check.h"
#include "kernels/rms_norm.cuh"
#endif

namespace dschat {
namespace ops {

torch::Tensor rms_norm_reference(const torch::Tensor& input, const torch::Tensor& weight, double eps) {
  torch::Tensor x = input.to(torch::kFloat32);                                   // [..., H]
  torch::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);                  // [..., 1]
  torch::Tensor normalised = (x * torch::rsqrt(variance + eps)).to(input.scalar_type());  // [..., H]
  return weight * normalised;
}

#ifdef DSCHAT_WITH_CUDA
namespace {

// Forward on the kernel, backward through the reference (recomputed), so training stays exact.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, double eps) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["eps"] = eps;
    torch::Tensor x = input.contiguous();        // [..., H]
    torch::Tensor w = weight.contiguous();       // [H]
    torch::Tensor out = torch::empty_like(x);    // [..., H]
    const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
    c10::cuda::CUDAGuard guard(x.device());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const float feps = static_cast<float>(eps);
    switch (x.scalar_type()) {
      case torch::kFloat32:
        DSCHAT_CUDA_CHECK(kernels::rms_norm(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(),
                                            rows, cols, feps, stream));
        break;
      case torch::kFloat16:
        DSCHAT_CUDA_CHECK(kernels::rms_norm(reinterpret_cast<const __half*>(x.data_ptr()),
                                            reinterpret_cast<const __half*>(w.data_ptr()),
                                            reinterpret_cast<__half*>(out.data_ptr()), rows, cols, feps, stream));
        break;
      case torch::kBFloat16:
        DSCHAT_CUDA_CHECK(kernels::rms_norm(reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()),
                                            reinterpret_cast<const __nv_bfloat16*>(w.data_ptr()),
                                            reinterpret_cast<__nv_bfloat16*>(out.data_ptr()), rows, cols, feps,
                                            stream));
        break;
      default:
        DSCHAT_THROW(Unsupported, "rms_norm: CUDA kernel supports float32, float16, bfloat16; got ",
                     x.scalar_type());
    }
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    torch::Tensor input = saved[0].detach().requires_grad_(true);    // [..., H]
    torch::Tensor weight = saved[1].detach().requires_grad_(true);   // [H]
    torch::Tensor out;
    {
      torch::AutoGradMode enable(true);
      out = rms_norm_reference(input, weight, ctx->saved_data["eps"].toDouble());
    }
    auto grads = torch::autograd::grad({out}, {input, weight}, {grad_outputs[0]});
    return {grads[0], grads[1], torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor rms_norm(const torch::Tensor& input, const torch::Tensor& weight, double eps) {
  DSCHAT_CHECK(input.dim() >= 1 && weight.dim() == 1 && weight.size(0) == input.size(-1), InvalidArgument,
               "rms_norm: expected weight of shape [", input.dim() ? input.size(-1) : 0, "], got ",
               weight.sizes());
  DSCHAT_CHECK(input.scalar_type() == weight.scalar_type(), InvalidArgument,
               "rms_norm: input dtype ", input.scalar_type(), " differs from weight dtype ", weight.scalar_type());
#ifdef DSCHAT_WITH_CUDA
  if (input.is_cuda()) return RmsNormFunction::apply(input, weight, eps);
#endif
  return rms_norm_reference(input, weight, eps);
}

}  // namespace ops
}  // namespace dschat
