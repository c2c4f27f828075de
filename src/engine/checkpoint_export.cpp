#include "dschat/engine/checkpoint_export.h"

#include "core/strings.h"

#include "dschat/core/error.h"
#include "dschat/core/json_file.h"
#include "io/atomic_file.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/hf_layout.h"
#include "dschat/nn/linear.h"

namespace dschat {
namespace engine {
namespace {

using core::ends_with;

namespace fs = std::filesystem;

const std::string kRight = ".lora_right_weight";
const std::string kLeft = ".lora_left_weight";


}  // namespace

std::map<std::string, torch::Tensor> consolidate_checkpoint(const fs::path& checkpoint_dir, const std::string& tag,
                                                            const ExportOptions& options) {
  const std::string chosen = tag.empty() ? latest_checkpoint_tag(checkpoint_dir) : tag;
  const CheckpointShards shards = CheckpointShards::open(checkpoint_dir / chosen);
  std::map<std::string, torch::Tensor> params;
  for (const auto& [name, info] : shards.params()) {
    params[name] = shards.full(info.trainable ? "master" : "frozen", name);
  }
  if (options.fuse_lora) {
    fuse_lora_adapters(params, shards.engine_state().value("lora_scales", nlohmann::json::object()),
                       shards.path().string());
  }
  for (auto& [name, tensor] : params) tensor = tensor.to(options.dtype).contiguous();
  return params;
}

// W [out, in] += scale * (right [in, r] @ left [r, out])^T, DeepSpeed-Chat's fuse_lora_weight.
void fuse_lora_adapters(std::map<std::string, torch::Tensor>& params, const nlohmann::json& scales,
                        const std::string& where) {
  std::vector<std::string> prefixes;
  for (const auto& [name, tensor] : params) {
    if (ends_with(name, kRight)) prefixes.push_back(name.substr(0, name.size() - kRight.size()));
  }
  for (const std::string& prefix : prefixes) {
    DSCHAT_CHECK(params.count(prefix + kLeft) && params.count(prefix + ".weight"), FormatError, where,
                 ": LoRA adapter '", prefix, "' lacks its left weight or its base weight");
    DSCHAT_CHECK(scales.contains(prefix), FormatError, where, "/engine.json: no LoRA scale recorded for '",
                 prefix, "'");
    const double scale = scales[prefix].get<double>();
    torch::Tensor& weight = params[prefix + ".weight"];  // [out, in]
    const torch::Tensor right = params[prefix + kRight].to(torch::kFloat32);  // [in, r]
    const torch::Tensor left = params[prefix + kLeft].to(torch::kFloat32);    // [r, out]
    weight = (weight.to(torch::kFloat32) + scale * torch::matmul(left.t(), right.t())).to(weight.scalar_type());
    params.erase(prefix + kRight);
    params.erase(prefix + kLeft);
  }
}

nlohmann::json lora_scales(torch::nn::Module& module) {
  nlohmann::json scales = nlohmann::json::object();
  for (const auto& item : module.named_modules()) {
    auto linear = std::dynamic_pointer_cast<nn::LinearImpl>(item.value());
    if (linear && linear->has_lora()) scales[item.key()] = linear->lora_scale();
  }
  return scales;
}

int64_t export_hf_checkpoint(const fs::path& checkpoint_dir, const std::string& tag, const fs::path& out_dir,
                             const ExportOptions& options) {
  std::map<std::string, torch::Tensor> params = consolidate_checkpoint(checkpoint_dir, tag, options);
  // The module names are the HF names for OPT and the LLaMA family; the other families' fused
  // and transposed tensors need the model's config to be written in their own layout.
  if (!options.model_dir.empty() && fs::exists(options.model_dir / "config.json")) {
    params = models::to_hf_layout(core::load_model_config(options.model_dir.string()), params);
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  DSCHAT_CHECK(!ec, IoError, out_dir.string(), ": cannot create (", ec.message(), ")");
  io::save_state_dict(out_dir, io::TensorMap(params.begin(), params.end()), options.format, options.max_shard_bytes);
  if (!options.model_dir.empty()) {
    for (const char* file : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                             "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json"}) {
      const fs::path source = options.model_dir / file;
      if (!fs::exists(source)) continue;
      if (std::string(file) == "config.json") {
        // The config says the dtype the weights are in (transformers loads "auto" by it).
        nlohmann::json config = core::read_json_file(source.string());
        const char* dtype = options.dtype == torch::kBFloat16 ? "bfloat16"
                            : options.dtype == torch::kFloat16 ? "float16"
                                                               : "float32";
        config["torch_dtype"] = dtype;
        if (config.contains("dtype")) config["dtype"] = dtype;  // transformers 5's key
        io::write_file_atomically(out_dir / file, config.dump(2) + "\n");
        continue;
      }
      fs::copy_file(source, out_dir / file, fs::copy_options::overwrite_existing, ec);
      DSCHAT_CHECK(!ec, IoError, source.string(), ": cannot copy to ", out_dir.string(), " (", ec.message(), ")");
    }
  }
  return static_cast<int64_t>(params.size());
}

}  // namespace engine
}  // namespace dschat
