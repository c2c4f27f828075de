#pragma once
// Which decoder layer a qualified parameter name belongs to (internal to the hybrid engine).

#include <string>
#include <vector>

#include "dschat/models/causal_lm.h"

namespace dschat {
namespace hybrid {

/// "model.decoder.layers.3." for each decoder layer, found by identity among the named modules.
std::vector<std::string> layer_prefixes(models::CausalLM& model);

/// The decoder layer `name` (a qualified parameter name) belongs to, or -1 outside the layers.
int64_t layer_of(const std::string& name, const std::vector<std::string>& prefixes);

}  // namespace hybrid
}  // namespace dschat
