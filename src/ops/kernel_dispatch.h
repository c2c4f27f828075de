#pragma once
// Private to src/ops: when an op takes its CUDA kernel, and the one switch from a tensor's dtype
// to the kernel's element type. The fused kernels are forward-only, so a call goes to the kernel
// only when its tensors are on CUDA in a kernel dtype and autograd is not recording them;
// otherwise the op runs its ATen reference, which is differentiable.

#include <torch/torch.h>

#include <initializer_list>
#include <limits>
#include <string>

#include "core/tensor_util.h"
#include "dschat/core/error.h"

#ifdef DSCHAT_WITH_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace dschat {
namespace ops {
namespace detail {

/// True when autograd would record an op over `tensors` (grad mode on, some input requires grad).
inline bool autograd_records(std::initializer_list<torch::Tensor> tensors) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto& t : tensors) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

/// True when a built kernel can serve `first` (and the other inputs, same device and dtype):
/// CUDA, float32/float16/bfloat16, no autograd recording.
inline bool kernel_applies(const torch::Tensor& first, std::initializer_list<torch::Tensor> tensors) {
#ifdef DSCHAT_WITH_CUDA
  const auto dtype = first.scalar_type();
  return first.is_cuda() &&
         (dtype == torch::kFloat32 || dtype == torch::kFloat16 || dtype == torch::kBFloat16) &&
         !autograd_records(tensors);
#else
  (void)first;
  (void)tensors;
  return false;
#endif
}


using core::lowest_value;
using core::shape_of;

#ifdef DSCHAT_WITH_CUDA
/// The stride of dimension `d`, or 0 when it has one element (any value is valid there, and 0
/// keeps a kernel's vector-alignment test from failing on it).
inline int64_t stride_of(const torch::Tensor& t, int64_t d) { return t.size(d) == 1 ? 0 : t.stride(d); }

/// Calls f(T{}) with T = float, __half or __nv_bfloat16 for `dtype`.
template <typename F>
void dispatch_kernel_dtype(const char* op, torch::ScalarType dtype, F&& f) {
  switch (dtype) {
    case torch::kFloat32: f(float{}); return;
    case torch::kFloat16: f(__half{}); return;
    case torch::kBFloat16: f(__nv_bfloat16{}); return;
    default: DSCHAT_THROW(Unsupported, op, ": the CUDA kernel takes float32, float16 or bfloat16, got ", dtype);
  }
}

/// t's data as the kernel's element type; null for an undefined tensor.
template <typename T>
const T* data_as(const torch::Tensor& t) {
  return t.defined() ? reinterpret_cast<const T*>(t.data_ptr()) : nullptr;
}

template <typename T>
T* mutable_data_as(const torch::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}
#endif

}  // namespace detail
}  // namespace ops
}  // namespace dschat
