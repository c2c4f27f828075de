#include "hybrid/model_layers.h"

#include <map>

#include "dschat/core/error.h"

namespace dschat {
namespace hybrid {

std::vector<std::string> layer_prefixes(models::CausalLM& model) {
  std::map<const torch::nn::Module*, std::string> names;
  for (const auto& item : model->named_modules()) names[item.value().get()] = item.key();
  std::vector<std::string> prefixes;
  for (const auto& layer : model->backbone().decoder_layers()) {
    auto found = names.find(layer.get());
    DSCHAT_CHECK(found != names.end(), Error, "hybrid engine: a decoder layer is not a submodule of the model");
    prefixes.push_back(found->second + ".");
  }
  return prefixes;
}

int64_t layer_of(const std::string& name, const std::vector<std::string>& prefixes) {
  for (size_t i = 0; i < prefixes.size(); ++i) {
    if (name.compare(0, prefixes[i].size(), prefixes[i]) == 0) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace hybrid
}  // namespace dschat
