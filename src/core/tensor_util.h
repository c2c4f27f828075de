#pragma once
// Small tensor helpers every layer's argument checks and masks need (private to libdschat).
#include <torch/torch.h>

#include <limits>
#include <string>

#include "dschat/core/device.h"

namespace dschat {
namespace core {

/// "[a, b, c]" of a tensor's shape, or "undefined": the shape in an error message.
inline std::string shape_of(const torch::Tensor& t) {
  return t.defined() ? c10::str(t.sizes()) : std::string("undefined");
}

/// A host tensor on `device` without the host waiting: a pageable host tensor copied to a GPU
/// waits for the copy (CUDA's sync-debug mode flags it), a pinned one is queued on the stream.
inline torch::Tensor host_to_device(const torch::Tensor& host, const torch::Device& device) {
  if (!device.is_cuda()) return host.to(device);
  set_current_device(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

/// The dtype's lowest finite value (torch.finfo(dtype).min). Masked attention scores use it
/// rather than -inf so that a fully masked row (a left-padding query) softmaxes to uniform, not NaN.
inline double lowest_value(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat16: return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case torch::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kFloat64: return std::numeric_limits<double>::lowest();
    default: return std::numeric_limits<float>::lowest();
  }
}

/// Re-points `variable` (a parameter) at `data` and keeps the Variable itself (its module
/// registration, its autograd identity), as Tensor::set_data does, also between the meta device
/// and a real one, which set_data refuses: its check keeps sparse and dense layouts apart, and a
/// meta tensor is a dense tensor without storage. For a deferred load's parameters, which have
/// not been through autograd (set_data's gradient-accumulator reset has nothing to reset).
inline void rebind_parameter_data(const torch::Tensor& variable, const torch::Tensor& data) {
  if (!variable.is_meta() && !data.is_meta()) {
    variable.set_data(data);
    return;
  }
  TORCH_CHECK(variable.layout() == torch::kStrided && data.layout() == torch::kStrided,
              "rebind_parameter_data: strided tensors only");
  variable.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

}  // namespace core
}  // namespace dschat
