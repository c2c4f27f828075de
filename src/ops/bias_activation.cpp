#include "dschat/ops/bias_activation.h"

#include "dschat/core/error.h"
#include "ops/kernel_dispatch.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dschat/core/status_check.h"
#include "kernels/bias_activation.cuh"
#endif

namespace dschat {
namespace ops {
namespace {

void check_bias_activation(const torch::Tensor& x, const torch::Tensor& bias) {
  DSCHAT_CHECK(x.defined() && x.dim() >= 1, InvalidArgument, "bias_activation: expected x of shape [..., F], got ",
               detail::shape_of(x));
  DSCHAT_CHECK(x.is_floating_point(), InvalidArgument, "bias_activation: x must be floating point, got ",
               x.scalar_type());
  if (!bias.defined()) return;
  DSCHAT_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), InvalidArgument,
               "bias_activation: expected bias of shape [", x.size(-1), "], got ", bias.sizes());
  DSCHAT_CHECK(bias.scalar_type() == x.scalar_type(), InvalidArgument, "bias_activation: bias dtype ",
               bias.scalar_type(), " differs from x dtype ", x.scalar_type());
  DSCHAT_CHECK(bias.device() == x.device(), InvalidArgument, "bias_activation: bias is on ", bias.device(),
               ", x on ", x.device());
}

void check_silu_and_mul(const torch::Tensor& gate, const torch::Tensor& up) {
  DSCHAT_CHECK(gate.defined() && gate.dim() >= 1, InvalidArgument,
               "silu_and_mul: expected gate of shape [..., F], got ", detail::shape_of(gate));
  DSCHAT_CHECK(up.defined() && up.sizes() == gate.sizes(), InvalidArgument, "silu_and_mul: up shape ",
               detail::shape_of(up), " differs from gate shape ", gate.sizes());
  DSCHAT_CHECK(gate.is_floating_point(), InvalidArgument, "silu_and_mul: gate must be floating point, got ",
               gate.scalar_type());
  DSCHAT_CHECK(up.scalar_type() == gate.scalar_type(), InvalidArgument, "silu_and_mul: up dtype ", up.scalar_type(),
               " differs from gate dtype ", gate.scalar_type());
  DSCHAT_CHECK(up.device() == gate.device(), InvalidArgument, "silu_and_mul: up is on ", up.device(), ", gate on ",
               gate.device());
}

torch::Tensor activation_reference(const torch::Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::Relu: return torch::relu(x);
    case Activation::Gelu: return torch::gelu(x);
    case Activation::GeluTanh: return torch::gelu(x, "tanh");
    case Activation::Silu: return torch::silu(x);
  }
  DSCHAT_INTERNAL_ASSERT(false, "unhandled activation ", static_cast<int>(activation));
}

#ifdef DSCHAT_WITH_CUDA
kernels::Activation kernel_activation(Activation activation) {
  switch (activation) {
    case Activation::Relu: return kernels::Activation::Relu;
    case Activation::Gelu: return kernels::Activation::Gelu;
    case Activation::GeluTanh: return kernels::Activation::GeluTanh;
    case Activation::Silu: return kernels::Activation::Silu;
  }
  DSCHAT_INTERNAL_ASSERT(false, "unhandled activation ", static_cast<int>(activation));
}

torch::Tensor run_bias_activation(const torch::Tensor& x, const torch::Tensor& bias, Activation activation) {
  c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor xs = x.contiguous();                                    // [..., F]
  torch::Tensor b = bias.defined() ? bias.contiguous() : bias;          // [F]
  torch::Tensor out = torch::empty_like(xs);                            // [..., F]
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : xs.numel() / cols;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  detail::dispatch_kernel_dtype("bias_activation", x.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    DSCHAT_CUDA_CHECK(kernels::bias_activation(detail::data_as<T>(xs), detail::data_as<T>(b),
                                               detail::mutable_data_as<T>(out), rows, cols,
                                               kernel_activation(activation), stream));
  });
  return out;
}

// gate, up: [N, F] with unit stride along F (rows at any stride).
torch::Tensor run_silu_and_mul(const torch::Tensor& gate, const torch::Tensor& up) {
  c10::cuda::CUDAGuard guard(gate.device());
  const int64_t rows = gate.size(0), cols = gate.size(1);
  torch::Tensor out = torch::empty({rows, cols}, gate.options());  // [N, F]
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  detail::dispatch_kernel_dtype("silu_and_mul", gate.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    DSCHAT_CUDA_CHECK(kernels::silu_and_mul(detail::data_as<T>(gate), detail::data_as<T>(up),
                                            detail::mutable_data_as<T>(out), rows, cols, gate.stride(0),
                                            up.stride(0), stream));
  });
  return out;
}

// t: [..., F] -> [N, F] with unit stride along F: a view when t already has that layout.
torch::Tensor as_rows(const torch::Tensor& t) {
  if (t.dim() == 2 && t.stride(1) == 1) return t;
  return t.contiguous().view({-1, t.size(-1)});
}

// The output shape of silu_and_mul: gate's shape (the last dim F).
std::vector<int64_t> shape_with_last(const torch::Tensor& t, int64_t last) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape.back() = last;
  return shape;
}
#endif

}  // namespace

torch::Tensor bias_activation_reference(const torch::Tensor& x, const torch::Tensor& bias, Activation activation) {
  check_bias_activation(x, bias);
  return activation_reference(bias.defined() ? x + bias : x, activation);
}

torch::Tensor bias_activation(const torch::Tensor& x, const torch::Tensor& bias, Activation activation) {
  check_bias_activation(x, bias);
#ifdef DSCHAT_WITH_CUDA
  if (detail::kernel_applies(x, {x, bias})) return run_bias_activation(x, bias, activation);
#endif
  return activation_reference(bias.defined() ? x + bias : x, activation);
}

torch::Tensor silu_and_mul_reference(const torch::Tensor& gate, const torch::Tensor& up) {
  check_silu_and_mul(gate, up);
  return torch::silu(gate) * up;
}

torch::Tensor silu_and_mul(const torch::Tensor& gate, const torch::Tensor& up) {
  check_silu_and_mul(gate, up);
#ifdef DSCHAT_WITH_CUDA
  if (detail::kernel_applies(gate, {gate, up}) && gate.numel() > 0) {
    return run_silu_and_mul(as_rows(gate), as_rows(up)).view(gate.sizes());
  }
#endif
  return torch::silu(gate) * up;
}

torch::Tensor silu_and_mul(const torch::Tensor& gate_up) {
  DSCHAT_CHECK(gate_up.defined() && gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, InvalidArgument,
               "silu_and_mul: expected gate_up of shape [..., 2F], got ", detail::shape_of(gate_up));
  const int64_t half = gate_up.size(-1) / 2;
#ifdef DSCHAT_WITH_CUDA
  if (detail::kernel_applies(gate_up, {gate_up}) && gate_up.numel() > 0) {
    torch::Tensor rows = as_rows(gate_up);  // [N, 2F]
    return run_silu_and_mul(rows.narrow(1, 0, half), rows.narrow(1, half, half))
        .view(shape_with_last(gate_up, half));
  }
#endif
  return silu_and_mul_reference(gate_up.narrow(-1, 0, half), gate_up.narrow(-1, half, half));
}

}  // namespace ops
}  // namespace dschat
