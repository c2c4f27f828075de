#pragma once
// LoRA over a whole model, as DeepSpeed-Chat's dschat/utils/module/lora.py does it: adapters go on
// every nn::Linear whose qualified module name contains a filter substring ("decoder.layers." for
// OPT: q/k/v/out_proj, fc1, fc2; "layers." for LLaMA: q/k/v/o, gate, up, down — never lm_head or
// OPT's project_in/out). Parameter names stay DeepSpeed-Chat's: "...q_proj.lora_right_weight".
//   convert_linear_layers_to_lora(*model, {128, 1.0, 0.0, "decoder.layers."});
//   only_optimize_lora_parameters(*model);      // when --only_optimize_lora
//   fuse_lora(*model); save(...); unfuse_lora(*model);

#include <torch/torch.h>

#include <string>
#include <vector>

#include "dschat/nn/linear.h"

namespace dschat {
namespace nn {

struct LoraOptions {
  int64_t lora_dim = 0;            // r; DeepSpeed-Chat's --lora_dim (0 there means "LoRA off")
  double lora_scaling = 1.0;       // delta scale = lora_scaling / r
  double lora_dropout = 0.0;       // dropout on the adapter input (0 = identity)
  std::string module_name_filter;  // --lora_module_name: substring of the qualified module name
};

/// Attaches adapters to every nn::Linear whose name (as model.named_modules() gives it, e.g.
/// "model.decoder.layers.0.self_attn.q_proj") contains `options.module_name_filter`; returns how
/// many. Checks everything before changing anything. Throws core::InvalidArgument for lora_dim < 1,
/// when no Linear matches (the message names the filter and a few Linear names that exist), or when
/// a matching Linear already has adapters.
int64_t convert_linear_layers_to_lora(torch::nn::Module& model, const LoraOptions& options);

/// Sets requires_grad = true exactly for LoRA parameters and for the parameters named in `force`
/// (exact qualified names, e.g. "v_head.weight"), false for all others. Throws
/// core::InvalidArgument when a `force` name is not a parameter of `model` (nothing is changed then).
void only_optimize_lora_parameters(torch::nn::Module& model, const std::vector<std::string>& force = {});

/// Fuses every adapted layer (LinearImpl::fuse_lora): forward becomes the plain fused linear, and
/// the exact weights are kept on `backup_device` (host memory by default: one copy of every
/// adapted weight) for unfuse_lora. A model without adapters is left as it is. Throws
/// core::InvalidArgument, naming the layer, when any layer is already fused (nothing changed then).
void fuse_lora(torch::nn::Module& model, const torch::Device& backup_device = torch::kCPU);

/// Restores every adapted layer's pre-fuse weight bit for bit. Throws core::InvalidArgument,
/// naming the layer, when any adapted layer is not fused (nothing changed then).
void unfuse_lora(torch::nn::Module& model);

/// DeepSpeed-Chat's test: the name contains "lora_right_weight" or "lora_left_weight".
bool is_lora_parameter(const std::string& name);

/// Number of nn::Linear modules in `model` that carry adapters.
int64_t count_lora_layers(const torch::nn::Module& model);

}  // namespace nn
}  // namespace dschat
