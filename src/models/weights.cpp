#include "dschat/models/weights.h"

#include <sstream>

#include "core/strings.h"
#include "dschat/core/error.h"

namespace dschat {
namespace models {
namespace {

std::string shape_string(torch::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

}  // namespace

void load_weights(torch::nn::Module& module, const NamedTensors& weights, const WeightBinding& binding,
                  const std::string& source) {
  auto parameters = module.named_parameters(/*recurse=*/true);
  std::vector<std::string> missing, unexpected, problems;
  for (const auto& item : parameters) {
    if (!weights.count(item.key()) && !binding.optional.count(item.key())) missing.push_back(item.key());
  }
  for (const auto& [name, tensor] : weights) {
    const torch::Tensor* parameter = parameters.find(name);
    if (parameter == nullptr) {
      if (!binding.ignored.count(name)) unexpected.push_back(name);
      continue;
    }
    if (!tensor.is_floating_point()) {
      problems.push_back("'" + name + "' has dtype " + std::string(c10::toString(tensor.scalar_type())) +
                         ", expected a floating-point dtype");
    } else if (tensor.sizes() != parameter->sizes()) {
      problems.push_back("'" + name + "' has shape " + shape_string(tensor.sizes()) + " in the checkpoint but " +
                         shape_string(parameter->sizes()) + " in the model built from config.json");
    }
  }
  DSCHAT_CHECK(problems.empty(), FormatError, source, ": ", core::join(problems, "; "));
  DSCHAT_CHECK(missing.empty() && unexpected.empty(), FormatError, source, ": checkpoint does not match the model",
               missing.empty() ? "" : "; missing tensors: " + core::join(missing),
               unexpected.empty() ? "" : "; unexpected tensors: " + core::join(unexpected));
  torch::NoGradGuard no_grad;
  for (auto& item : parameters) {
    auto it = weights.find(item.key());
    if (it == weights.end()) continue;
    if (item.value().is_meta()) {
      DSCHAT_CHECK(binding.deferred != nullptr, InvalidArgument, source, ": parameter '", item.key(),
                   "' is on the meta device, so its value cannot be loaded (no deferred load was asked for)");
      (*binding.deferred)[item.key()] = it->second;
    } else {
      item.value().copy_(it->second);
    }
  }
}

NamedTensors named_weights(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) out.emplace(item.key(), item.value());
  return out;
}

NamedTensors with_prefix(const NamedTensors& weights, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, tensor] : weights) out.emplace(prefix + name, tensor);
  return out;
}

}  // namespace models
}  // namespace dschat
