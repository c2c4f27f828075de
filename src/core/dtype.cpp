#include "dschat/core/dtype.h"

#include "dschat/core/error.h"

namespace dschat {
namespace core {

std::optional<torch::ScalarType> dtype_from_name(const std::string& name) {
  if (name == "fp32" || name == "float32") return torch::kFloat32;
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "fp16" || name == "float16") return torch::kFloat16;
  return std::nullopt;
}

torch::ScalarType parse_dtype(const std::string& name, const std::string& what) {
  const std::optional<torch::ScalarType> dtype = dtype_from_name(name);
  DSCHAT_CHECK(dtype.has_value(), InvalidArgument, what, ": expected fp32, bf16 or fp16, got '", name, "'");
  return *dtype;
}

}  // namespace core
}  // namespace dschat
