#include "dschat/models/hf_layout.h"

#include "core/strings.h"

#include "models/hf_layout_families.h"

namespace dschat {
namespace models {
namespace {

using core::starts_with;


// The head tensors every layout names alike (GPT-NeoX's embed_out is the LM head).
bool head_name(const std::string& name, std::string* head) {
  if (name == "lm_head.weight" || name == "lm_head.bias" || name == "v_head.weight") {
    *head = name;
    return true;
  }
  if (name == "embed_out.weight") {
    *head = "lm_head.weight";
    return true;
  }
  return false;
}

}  // namespace

std::string hf_base_prefix(const core::ModelConfig& config) {
  switch (config.architecture) {
    case core::Architecture::Opt:
    case core::Architecture::Llama: return "model.";
    case core::Architecture::GptNeox: return "gpt_neox.";
    default: return "transformer.";
  }
}

NamedTensors from_hf_layout(const core::ModelConfig& config, const NamedTensors& weights,
                            const std::string& module_prefix, const std::string& source) {
  // Base-model prefixes of *ForCausalLM state dicts, DeepSpeed-Chat's reward model and PEFT.
  static const std::vector<std::string> kBasePrefixes = {"model.", "transformer.", "gpt_neox.", "rwtransformer.",
                                                         "base_model."};
  NamedTensors backbone, out;
  for (const auto& [name, tensor] : weights) {
    std::string head;
    if (head_name(name, &head)) {
      out.emplace(head, tensor);
      continue;
    }
    std::string key = name;
    for (const auto& prefix : kBasePrefixes) {
      if (starts_with(key, prefix)) {
        key = key.substr(prefix.size());
        break;
      }
    }
    backbone.emplace(key, tensor);
  }
  for (auto& [name, tensor] : backbone_from_hf(config, backbone, source)) out.emplace(module_prefix + name, tensor);
  return out;
}

NamedTensors to_hf_layout(const core::ModelConfig& config, const NamedTensors& tensors) {
  const bool value_model = tensors.count("v_head.weight") != 0;
  const std::string module_prefix = value_model ? "rwtransformer." : "model.";
  const std::string hf_prefix = value_model ? "rwtransformer." : hf_base_prefix(config);
  NamedTensors backbone, out;
  for (const auto& [name, tensor] : tensors) {
    if (starts_with(name, module_prefix)) {
      backbone.emplace(name.substr(module_prefix.size()), tensor);
    } else if (config.architecture == core::Architecture::GptNeox && starts_with(name, "lm_head.")) {
      out.emplace("embed_out." + name.substr(8), tensor);
    } else {
      out.emplace(name, tensor);
    }
  }
  for (auto& [name, tensor] : backbone_to_hf(config, backbone)) out.emplace(hf_prefix + name, tensor);
  return out;
}

}  // namespace models
}  // namespace dschat
