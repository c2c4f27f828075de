#pragma once
// The memory one model of a step takes on one rank, from its shapes alone: the model is built on
// the meta device (nothing is allocated) so the plan sees exactly the parameters, LoRA adapters
// and frozen flags the trainer will create, and ZeRO's accounting is the engine's own
// (engine::footprint_at_step over engine::group_parameters). Activations, logits and the hybrid
// engine's extras are formulas in the model's shapes (docs/plan.md, "Memory").
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dschat/core/model_config.h"
#include "dschat/engine/zero_groups.h"

namespace dschat {
namespace plan {

/// How one model of a step is built and held.
struct ModelSetup {
  std::string role;  // its label in the plan's tables: "actor", "reference", "critic", "reward", "ema", "model"
  std::string source;  // where its weights come from (a directory, HF id or preset), for the tables
  core::ModelConfig config;
  bool value_head = false;  // reward/critic layout (backbone + v_head) instead of a causal LM
  torch::ScalarType dtype = torch::kFloat16;
  bool trained = false;
  int zero_stage = 0;  // frozen models: 3 (partitioned, eval config) or 0 (replicated)
  /// Trained: ZeRO-Offload (optimizer state on the host; parameters too at stage 3). Frozen at
  /// stage 3: parameters on the host (offload_reference_model / offload_reward_model).
  bool offload = false;
  int64_t lora_dim = 0;  // trained models and the actor's EMA copy (frozen, shaped like the actor)
  /// Trained at stage 3: frozen partitions as group-wise int8 (enable_mixed_precision_lora).
  bool quantize_frozen = false;
  std::string lora_module_name = "decoder.layers.";
  bool only_optimize_lora = false;
  bool gradient_checkpointing = false;
  int64_t persistence_threshold = 10000;  // DS-Chat's stage3_param_persistence_threshold
  /// The ranks are CPU processes: they talk over gloo, where a reduce-scatter receives every
  /// rank's chunk of a bucket before summing them (dist::Communicator::start_reduce_scatter;
  /// NCCL's is native), and offload stages nothing between host and device.
  bool cpu_ranks = false;
};

/// Every parameter as ZeRO groups it, from the model built on the meta device with the step's
/// LoRA conversion and freezing (v_head.weight stays trainable, as DS-Chat forces it).
std::vector<engine::ParameterSpec> parameter_specs(const ModelSetup& setup);

/// What ZeRO holds for `setup` on rank `rank` of `world` at an optimizer step: the engine's own
/// accounting (engine::footprint_at_step over engine::group_parameters), what
/// TrainingEngine::memory_footprint() reports there.
engine::MemoryFootprint zero_footprint(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                       int64_t world, int64_t rank);

/// One line of a memory plan. `phase` "" is resident for the whole step; a named phase
/// ("generate", "experience", "train actor", ...) holds its bytes only while it runs.
struct MemoryItem {
  std::string model;
  std::string what;
  std::string phase;
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  /// lora_fuse_backup "auto": the device bytes go to the host when the device's free memory at
  /// the start of the phase holds them less than twice over (hybrid::lora_backup_device).
  bool host_when_short = false;
};

/// The shapes of one pass: rows, tokens per row.
struct PassShape {
  int64_t batch = 1;
  int64_t tokens = 1;
};

/// Resident state on rank `rank` of `world`: parameters, gradients, optimizer (engine
/// accounting; offloaded parts counted on the host). `host_device`: the ranks are CPU processes,
/// so nothing is "offloaded" away from their memory.
std::vector<MemoryItem> resident_state(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                       int64_t world, int64_t rank);

/// A training pass (forward + backward of one micro-batch) under `phase`: saved activations
/// (every layer's, or with gradient checkpointing the layer inputs plus one layer recomputed),
/// the logits and loss buffers (causal LMs) and the transient gradient buffers (a model-dtype
/// gradient per parameter during backward, stage 2's whole fp32 flat buffer, stage 3's gathered
/// layers).
std::vector<MemoryItem> training_pass(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                      const PassShape& shape, int64_t world, int64_t gradient_accumulation_steps,
                                      const std::string& phase);

/// A no-grad forward (log-probs or values for experience, or a reference model's log-probs):
/// one layer's temporaries, the logits and their log-softmax, stage 3's gathered layers.
std::vector<MemoryItem> inference_pass(const ModelSetup& setup, const std::vector<engine::ParameterSpec>& specs,
                                       const PassShape& shape, const std::string& phase);

/// The KV workspace of generation: [L, 2, rows, H_kv, max_out_tokens, D] in the model dtype.
int64_t kv_workspace_bytes(const core::ModelConfig& config, torch::ScalarType dtype, int64_t rows,
                           int64_t max_out_tokens);

/// Bytes of every parameter (whole model) in the model dtype; the LoRA-wrapped weights' bytes.
int64_t model_bytes(const std::vector<engine::ParameterSpec>& specs);
int64_t lora_wrapped_bytes(const std::vector<engine::ParameterSpec>& specs);
/// Bytes of the largest decoder layer's parameters.
int64_t layer_bytes(const std::vector<engine::ParameterSpec>& specs);

/// Trainable parameters and all parameters.
int64_t trainable_parameters(const std::vector<engine::ParameterSpec>& specs);
int64_t total_parameters(const std::vector<engine::ParameterSpec>& specs);

}  // namespace plan
}  // namespace dschat
