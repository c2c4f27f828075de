#pragma once
// The names configs and flags give floating-point dtypes: fp32 | bf16 | fp16 (and the long
// spellings float32 | bfloat16 | float16).
#include <torch/torch.h>

#include <optional>
#include <string>

namespace dschat {
namespace core {

/// The dtype a name stands for, or nullopt when it names none.
std::optional<torch::ScalarType> dtype_from_name(const std::string& name);

/// dtype_from_name, or core::InvalidArgument "<what>: expected fp32, bf16 or fp16, got '<name>'"
/// (`what` names the flag or key, e.g. "--dtype").
torch::ScalarType parse_dtype(const std::string& name, const std::string& what = "dtype");

}  // namespace core
}  // namespace dschat
