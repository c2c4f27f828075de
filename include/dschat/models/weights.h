#pragma once
// Binding checkpoint tensors to module parameters by name. Names are those of the module tree
// (which mirrors the Hugging Face state dict); what is missing, unexpected or mis-shaped is
// reported by name, all at once.

#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

namespace dschat {
namespace models {

using NamedTensors = std::map<std::string, torch::Tensor>;

struct WeightBinding {
  std::set<std::string> optional;  // may be absent from the checkpoint (keeps its initial value)
  std::set<std::string> ignored;   // may be present in the checkpoint without a parameter
  /// Deferred loading (ZeRO-3's partitioned load): a parameter on the meta device is not copied
  /// into; its checkpoint tensor is recorded here by parameter name instead. Null: meta
  /// parameters are an error.
  std::map<std::string, torch::Tensor>* deferred = nullptr;
};

/// Copies `weights` into `module`'s parameters (casting to each parameter's dtype/device); meta
/// parameters go to binding.deferred instead.
/// Throws core::FormatError, naming `source` and every offending tensor, when a required
/// parameter is missing, a tensor has no parameter, a shape differs, or a dtype is not floating.
void load_weights(torch::nn::Module& module, const NamedTensors& weights, const WeightBinding& binding,
                  const std::string& source);

/// The module's parameters by name (sharing storage with the module).
NamedTensors named_weights(const torch::nn::Module& module);

/// Prefixes every name: {"a": t} -> {"model.a": t}.
NamedTensors with_prefix(const NamedTensors& weights, const std::string& prefix);

}  // namespace models
}  // namespace dschat
