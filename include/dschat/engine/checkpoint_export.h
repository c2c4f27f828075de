#pragma once
// Consolidates a training checkpoint (any world size, any ZeRO stage) into one Hugging Face
// model directory, as DeepSpeed's zero_to_fp32.py does: every parameter is assembled from the
// ranks' pieces (fp32 masters for trained parameters, saved values for frozen ones), LoRA
// adapters are fused into their base weights with the scale the engine recorded and dropped
// (as DeepSpeed-Chat's convert_lora_to_linear_layer + save_hf_format), and the result is written
// as model.safetensors (sharded above max_shard_bytes). Names are the training module's, which
// for dschat's CausalLM / ValueHeadModel are the Hugging Face ones.
//   engine::ExportOptions options;
//   options.dtype = torch::kBFloat16;
//   options.model_dir = "opt-125m";  // config.json and tokenizer files are copied from here
//   engine::export_hf_checkpoint("ckpt", "", "out/actor", options);

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dschat/io/state_dict.h"

namespace dschat {
namespace engine {

struct ExportOptions {
  torch::ScalarType dtype = torch::kFloat32;
  /// false: keep the "*.lora_right_weight" / "*.lora_left_weight" tensors unfused.
  bool fuse_lora = true;
  /// When set: config.json, generation_config.json and the tokenizer files found there are
  /// copied next to the weights, and the tensors are written in the layout of that config's
  /// family (models::to_hf_layout: GPT-2's fused c_attn, GPT-NeoX's query_key_value, ...).
  /// Unset, they keep dschat's module names, which are the HF names for OPT and the LLaMA family.
  std::filesystem::path model_dir;
  int64_t max_shard_bytes = int64_t{5} << 30;
  /// model.safetensors (sharded above max_shard_bytes) or one pytorch_model.bin.
  io::WeightsFormat format = io::WeightsFormat::kSafetensors;
};

/// The consolidated parameters of <checkpoint_dir>/<tag> (tag empty: the latest) by name.
/// Throws core::NotFound / core::FormatError naming the file or tensor.
std::map<std::string, torch::Tensor> consolidate_checkpoint(const std::filesystem::path& checkpoint_dir,
                                                            const std::string& tag, const ExportOptions& options);

/// The LoRA scale of every adapted Linear of `module`, by the Linear's qualified name.
nlohmann::json lora_scales(torch::nn::Module& module);

/// Fuses every "<p>.lora_right_weight" [in, r] / "<p>.lora_left_weight" [r, out] pair of `params`
/// into "<p>.weight" [out, in] += scales[p] * (right @ left)^T (DeepSpeed-Chat's fuse_lora_weight)
/// and drops the adapters. Throws core::FormatError naming `where` and the layer when a piece or
/// its scale is missing.
void fuse_lora_adapters(std::map<std::string, torch::Tensor>& params, const nlohmann::json& scales,
                        const std::string& where);

/// Writes consolidate_checkpoint(...) into out_dir (created) and returns the number of tensors.
int64_t export_hf_checkpoint(const std::filesystem::path& checkpoint_dir, const std::string& tag,
                             const std::filesystem::path& out_dir, const ExportOptions& options);

}  // namespace engine
}  // namespace dschat
