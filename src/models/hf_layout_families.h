#pragma once
// Per-family conversions between a checkpoint's base-model tensors and dschat's backbone modules
// (internal to src/models; the layout is described in dschat/models/hf_layout.h). Names are
// relative to the base model: "h.0.attn.c_attn.weight", not "transformer.h.0...".

#include <string>

#include "dschat/core/model_config.h"
#include "dschat/models/weights.h"

namespace dschat {
namespace models {

NamedTensors backbone_from_hf(const core::ModelConfig& config, const NamedTensors& weights, const std::string& source);
NamedTensors backbone_to_hf(const core::ModelConfig& config, const NamedTensors& tensors);

/// Whether every module tensor is the checkpoint tensor of the same name (OPT, the LLaMA family).
bool backbone_layout_is_identity(const core::ModelConfig& config);

}  // namespace models
}  // namespace dschat
