#include "dschat/engine/param_groups.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "dschat/core/error.h"

namespace dschat {
namespace engine {
namespace {

std::string to_lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool contains_any(const std::string& lowered_name, const std::vector<std::string>& fragments) {
  return std::any_of(fragments.begin(), fragments.end(),
                     [&](const std::string& fragment) { return lowered_name.find(fragment) != std::string::npos; });
}

}  // namespace

const std::vector<std::string>& no_decay_name_list() {
  static const std::vector<std::string> names = {"bias", "layer_norm.weight", "layernorm.weight", "norm.weight",
                                                 "ln_f.weight"};
  return names;
}

const std::vector<std::string>& lora_name_list() {
  static const std::vector<std::string> names = {"lora_right_weight", "lora_left_weight"};
  return names;
}

int optimizer_group_index(const std::string& name) {
  const std::string lowered = to_lower(name);
  // A no-decay match wins over LoRA: DeepSpeed-Chat's LoRA group requires "not no-decay".
  return contains_any(lowered, no_decay_name_list()) ? 2 : contains_any(lowered, lora_name_list()) ? 1 : 0;
}

std::vector<ParamGroup> optimizer_grouped_parameters(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params, double lr, double weight_decay,
    double lora_lr, const std::vector<std::string>* model_names) {
  DSCHAT_CHECK(lr >= 0.0 && lora_lr >= 0.0 && weight_decay >= 0.0, InvalidArgument,
               "optimizer_grouped_parameters: lr, lora_lr and weight_decay must be >= 0, got lr ", lr, ", lora_lr ",
               lora_lr, ", weight_decay ", weight_decay);
  // DeepSpeed-Chat builds the three lists in this order; the optimizer state of a checkpoint
  // is indexed by position, so the order is part of the format.
  ParamGroup decay{{}, {}, lr, weight_decay};
  ParamGroup lora{{}, {}, lora_lr, weight_decay};
  ParamGroup no_decay{{}, {}, lr, 0.0};
  for (const auto& [name, param] : named_params) {
    DSCHAT_CHECK(param.defined(), InvalidArgument, "optimizer_grouped_parameters: parameter '", name,
                 "' is an undefined tensor");
    if (!param.requires_grad()) continue;
    const int index = optimizer_group_index(name);
    ParamGroup& group = index == 2 ? no_decay : index == 1 ? lora : decay;
    group.names.push_back(name);
    group.params.push_back(param);
  }
  std::array<bool, 3> present = {!decay.params.empty(), !lora.params.empty(), !no_decay.params.empty()};
  if (model_names) {
    present = {false, false, false};
    for (const std::string& name : *model_names) present[static_cast<size_t>(optimizer_group_index(name))] = true;
  }
  std::vector<ParamGroup> groups;
  std::array<ParamGroup*, 3> ordered = {&decay, &lora, &no_decay};
  for (size_t g = 0; g < ordered.size(); ++g) {
    if (present[g]) groups.push_back(std::move(*ordered[g]));
  }
  return groups;
}

std::vector<ParamGroup> optimizer_grouped_parameters(const torch::nn::Module& module, double lr, double weight_decay,
                                                     double lora_lr) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) named.emplace_back(item.key(), item.value());
  return optimizer_grouped_parameters(named, lr, weight_decay, lora_lr);
}

}  // namespace engine
}  // namespace dschat
