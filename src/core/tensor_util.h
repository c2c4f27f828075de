#pragma once
// Small tensor helpers every layer's argument checks and masks need (private to libdschat).
#include <torch/torch.h>

#include <limits>
#include <string>

namespace dschat {
namespace core {

/// "[a, b, c]" of a tensor's shape, or "undefined": the shape in an error message.
inline std::string shape_of(const torch::Tensor& t) {
  return t.defined() ? c10::str(t.sizes()) : std::string("undefined");
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

}  // namespace core
}  // namespace dschat
