#pragma once
// The DeepSpeed-style JSON config of a training (or frozen, "eval") engine. The configs
// DeepSpeed-Chat builds (ds_utils.get_train_ds_config / get_eval_ds_config, with their
// hybrid_engine and tensorboard blocks) parse unchanged. Unknown keys are errors with a
// suggestion; keys DeepSpeed knows that dschat accepts without acting on them are collected in
// `not_acted_on`, for one warning.
//
// Batch sizes follow DeepSpeed's rule: train_batch_size = micro_batch_per_gpu * grad_accum * world;
// any two determine the third, one alone implies grad_accum 1, and a set that does not multiply
// out is an error naming the four numbers.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dschat {
namespace engine {

struct OffloadConfig {
  std::string device = "none";  // none | cpu  (nvme is refused)
  bool pin_memory = false;
  double ratio = 1.0;  // offload_optimizer only
  bool enabled() const { return device != "none"; }
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;
  bool overlap_comm = false;  // DeepSpeed: unset means true at stage 3, false below
  bool round_robin_gradients = false;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  // ZeRO++: stage 3 keeps the partitions of frozen parameters as group-wise int8 and dequantizes
  // them when gathering (engine/quantized_weights.h); DeepSpeed-Chat's enable_mixed_precision_lora.
  bool zero_quantized_nontrainable_weights = false;
  OffloadConfig offload_param;
  OffloadConfig offload_optimizer;
};

struct OptimizerConfig {
  std::string type = "AdamW";  // Adam | AdamW (both decoupled unless adam_w_mode is false)
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;
};

struct HybridEngineConfig {
  bool enabled = false;
  int64_t max_out_tokens = 512;
  int64_t inference_tp_size = 1;
  bool release_inference_cache = false;
  bool pin_parameters = true;
  int64_t tp_gather_partition_size = 8;
  bool enable_cuda_graph = false;  // ours (DeepSpeed's Hybrid Engine has none): decode step as a CUDA graph
  // Ours: generate through inference::ContinuousEngine (paged KV, iteration-level batching) instead
  // of the static InferenceEngine. One rank's rows only: not with inference_tp_size > 1 or ZeRO-3
  // across ranks (lockstep), not with CUDA graphs.
  bool continuous_batching = false;
  int64_t kv_cache_memory_mib = 0;     // its block pool; 0: max_running_sequences rows of max_out_tokens
  int64_t max_running_sequences = 8;   // its rows per decode step
  bool prefix_caching = false;         // its prompts share the KV blocks of common prefixes (a
                                       // system prompt) within one generate call
};

struct TensorboardConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

enum class Precision { kFp32, kFp16, kBf16 };

struct DeepSpeedConfig {
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  Precision precision = Precision::kFp32;
  nlohmann::json fp16_block = nlohmann::json::object();  // for engine::LossScaler::from_fp16_config
  double gradient_clipping = 0.0;                        // 0: off
  std::optional<OptimizerConfig> optimizer;              // absent: the caller supplies one
  std::optional<nlohmann::json> scheduler;               // DeepSpeed scheduler block, kept verbatim
  ZeroConfig zero;
  HybridEngineConfig hybrid_engine;
  TensorboardConfig tensorboard;
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  /// dschat's own key: what a non-finite loss does in bf16/fp32 ("skip" the step with a warning,
  /// or "error"); fp16 overflow is always handled by the loss scaler.
  std::string on_nonfinite_loss = "skip";
  /// Keys present in the file that DeepSpeed defines but dschat does not act on.
  std::vector<std::string> not_acted_on;

  /// Parses `json` for `world_size` data-parallel ranks. `where` names the source in errors
  /// ("ds_config.json"). Throws core::ConfigError (bad or inconsistent values, unknown keys) or
  /// core::Unsupported (valid DeepSpeed settings dschat does not implement).
  static DeepSpeedConfig parse(const nlohmann::json& json, int64_t world_size, const std::string& where);
  /// Reads and parses a file.
  static DeepSpeedConfig load(const std::string& file, int64_t world_size);
};

/// DeepSpeed's _set_batch_related_parameters + _batch_assertion: fills the missing sizes and
/// checks train = micro * accum * world. Zero means "not given". Throws core::ConfigError.
void resolve_batch_sizes(int64_t& train_batch_size, int64_t& micro_batch_per_gpu, int64_t& gradient_accumulation_steps,
                         int64_t world_size, const std::string& where);

}  // namespace engine
}  // namespace dschat
