#pragma once
// Building models from checkpoints (or presets with random weights) and saving them in the
// Hugging Face layout (`from_pretrained` / `save_pretrained`): where the checkpoint IO meets the
// model classes.

#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <string>

#include "dschat/io/state_dict.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/value_head.h"

namespace dschat {
namespace models {

/// What a deferred load (ZeRO stage 3's partitioned load, DeepSpeed's zero.Init) leaves for the
/// engine that partitions the model: the model's parameters stay on the meta device (shapes and
/// dtype, no memory), and `values` holds each one's value by parameter name as a host tensor: a
/// view of the memory-mapped checkpoint, or a fresh host initialisation for a preset with random
/// weights and for a parameter the checkpoint may lack (a new v_head). engine::TrainingEngine and
/// engine::ZeroInferenceEngine then copy onto `device` only what their rank keeps, so a model
/// larger than one GPU loads. Dropping this frees the mapping.
struct DeferredParameters {
  torch::Device device = torch::kCPU;         // where the engine puts what it keeps
  torch::ScalarType dtype = torch::kFloat32;  // the parameters' dtype there
  NamedTensors values;                        // name -> host tensor of the parameter's shape
};

struct LoadOptions {
  torch::ScalarType dtype = torch::kFloat32;  // parameters are cast to this after loading
  torch::Device device = torch::kCPU;
  bool random_init = false;  // ignore weights: preset or config.json shapes, N(0, 0.02) weights
  /// Overrides every dropout probability of the config (dropout, attention_dropout,
  /// activation_dropout), as DeepSpeed-Chat's --dropout / --actor_dropout do.
  std::optional<double> dropout;
  /// Set: a deferred load into *deferred (see DeferredParameters); nothing is allocated on
  /// `device` and the checkpoint is not copied.
  DeferredParameters* deferred = nullptr;
};

/// `name_or_path`: directory, HF id in the local cache, short name; with random_init also a
/// preset name ("opt-1.3b"). Errors name the checkpoint and every mismatching tensor.
CausalLM load_causal_lm(const std::string& name_or_path, const LoadOptions& options = {});

/// A reward/critic model in DeepSpeed-Chat's layout; with `allow_missing_head`, a causal-LM
/// checkpoint initialises the backbone and v_head starts fresh.
ValueHeadModel load_value_model(const std::string& name_or_path, const LoadOptions& options = {},
                                        bool allow_missing_head = false);

/// Writes config.json + model.safetensors (sharded above `max_shard_bytes`) into `dir`.
void save_causal_lm(CausalLM& model, const std::filesystem::path& dir,
                    int64_t max_shard_bytes = int64_t{5} << 30);
void save_value_model(ValueHeadModel& model, const std::filesystem::path& dir,
                      int64_t max_shard_bytes = int64_t{5} << 30);

/// Writes `state` (module names: a CausalLM's or ValueHeadModel's parameter names) with `config`
/// into `dir` in the family's HF layout (models::to_hf_layout): weights first, config.json last, so
/// a directory with a config.json always holds complete weights.
/// `format`: model.safetensors (default) or pytorch_model.bin (DeepSpeed-Chat interop).
void save_model_tensors(const NamedTensors& state, const core::ModelConfig& config,
                        const std::filesystem::path& dir, int64_t max_shard_bytes = int64_t{5} << 30,
                        io::WeightsFormat format = io::WeightsFormat::kSafetensors);

}  // namespace models
}  // namespace dschat
