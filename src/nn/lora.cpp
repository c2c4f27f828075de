#include "dschat/nn/lora.h"

#include <set>
#include <sstream>
#include <utility>

#include "dschat/core/error.h"

namespace dschat {
namespace nn {
namespace {

/// Every nn::Linear under `model` with its qualified name, in registration order. A module
/// registered under two names is listed once (its first name), so it is never adapted twice.
std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> named_linears(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> linears;
  std::set<const LinearImpl*> seen;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    auto linear = std::dynamic_pointer_cast<LinearImpl>(item.value());
    if (linear && seen.insert(linear.get()).second) linears.emplace_back(item.key(), linear);
  }
  return linears;
}

/// "'a', 'b', 'c', ... (N in all)" for error messages.
std::string some_names(const std::vector<std::string>& names, size_t shown = 6) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size() && i < shown; ++i) out << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() > shown) out << ", ... (" << names.size() << " in all)";
  if (names.empty()) out << "(none)";
  return out.str();
}

}  // namespace

int64_t convert_linear_layers_to_lora(torch::nn::Module& model, const LoraOptions& options) {
  DSCHAT_CHECK(options.lora_dim >= 1, InvalidArgument, "LoRA: lora_dim must be >= 1, got ", options.lora_dim);
  auto linears = named_linears(model);
  std::vector<std::string> all_names;
  std::vector<std::shared_ptr<LinearImpl>> matching;
  for (const auto& [name, linear] : linears) {
    all_names.push_back(name);
    if (name.find(options.module_name_filter) == std::string::npos) continue;
    DSCHAT_CHECK(!linear->has_lora(), InvalidArgument, "LoRA: module '", name, "' already has adapters");
    matching.push_back(linear);
  }
  DSCHAT_CHECK(!matching.empty(), InvalidArgument, "LoRA: lora_module_name '", options.module_name_filter,
               "' matches no Linear module; Linear modules are ", some_names(all_names));
  // enable_lora checks the options before changing anything, so a bad dropout fails on the first
  // layer with the model untouched; the remaining layers cannot fail after it succeeded.
  auto layer_options = LinearLoraOptions(options.lora_dim)
                           .lora_scaling(options.lora_scaling)
                           .lora_dropout(options.lora_dropout);
  for (const auto& linear : matching) linear->enable_lora(layer_options);
  return static_cast<int64_t>(matching.size());
}

void only_optimize_lora_parameters(torch::nn::Module& model, const std::vector<std::string>& force) {
  auto parameters = model.named_parameters(/*recurse=*/true);
  std::set<std::string> forced(force.begin(), force.end());
  for (const auto& name : forced) {
    DSCHAT_CHECK(parameters.contains(name), InvalidArgument, "only_optimize_lora_parameters: force name '", name,
                 "' is not a parameter of the model");
  }
  for (auto& item : parameters) {
    item.value().set_requires_grad(is_lora_parameter(item.key()) || forced.count(item.key()) > 0);
  }
}

void fuse_lora(torch::nn::Module& model, const torch::Device& backup_device) {
  auto linears = named_linears(model);
  for (const auto& [name, linear] : linears) {
    DSCHAT_CHECK(!linear->has_lora() || !linear->lora_fused(), InvalidArgument, "fuse_lora: module '", name,
                 "' is already fused");
  }
  for (const auto& [name, linear] : linears) {
    if (linear->has_lora()) linear->fuse_lora(backup_device);
  }
}

void unfuse_lora(torch::nn::Module& model) {
  auto linears = named_linears(model);
  for (const auto& [name, linear] : linears) {
    DSCHAT_CHECK(!linear->has_lora() || linear->lora_fused(), InvalidArgument, "unfuse_lora: module '", name,
                 "' is not fused");
  }
  for (const auto& [name, linear] : linears) {
    if (linear->has_lora()) linear->unfuse_lora();
  }
}

bool is_lora_parameter(const std::string& name) {
  return name.find("lora_right_weight") != std::string::npos || name.find("lora_left_weight") != std::string::npos;
}

int64_t count_lora_layers(const torch::nn::Module& model) {
  int64_t count = 0;
  for (const auto& [name, linear] : named_linears(model)) count += linear->has_lora() ? 1 : 0;
  return count;
}

}  // namespace nn
}  // namespace dschat
