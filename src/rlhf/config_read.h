#pragma once
// The readers every step block shares (step_config_parse.cpp, grpo_config_parse.cpp). Each
// throws core::ConfigError naming the block and the key (JsonObject::at).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_object.h"
#include "dschat/rlhf/pipeline_config.h"

namespace dschat {
namespace rlhf {
namespace config_read {

/// An absent step block (or an explicit null, as merge_config leaves none) reads as {}.
const nlohmann::json& object_or_empty(const nlohmann::json& json);
/// The largest count any integer key accepts (2^24).
constexpr int64_t kMaxCount = int64_t{1} << 24;
/// An integer key in [min, kMaxCount] (ConfigError naming the key and the value otherwise).
int64_t read_min(core::JsonObject& o, const std::string& key, int64_t fallback, int64_t min);
double read_nonnegative(core::JsonObject& o, const std::string& key, double fallback);
double read_positive(core::JsonObject& o, const std::string& key, double fallback);
double read_unit(core::JsonObject& o, const std::string& key, double fallback);
std::string read_choice(core::JsonObject& o, const std::string& key, const std::string& fallback,
                        const std::vector<std::string>& choices);
/// DS-Chat's nargs="*" flags: a JSON array of strings, or one string for a single entry.
std::vector<std::string> read_string_list(core::JsonObject& o, const std::string& key,
                                          const std::vector<std::string>& fallback);
void read_data_keys(core::JsonObject& o, DataConfig& data);
/// A step's own "data" object merges over the shared one key by key.
DataConfig read_step_data(core::JsonObject& o, const DataConfig& shared);
void read_common(core::JsonObject& o, CommonStepConfig& c);
/// The "guardian" block (docs/guardian.md); absent keys keep their defaults.
void read_guardian(core::JsonObject& o, monitor::GuardianConfig& g);
/// Step 1/2 flags unprefixed; step 3 passes "actor_" / "critic_".
void read_model(core::JsonObject& o, const std::string& prefix, ModelTrainingConfig& m);
/// A free-text note (presets name the DS-Chat script they mirror).
void accept_description(core::JsonObject& o);
/// "experience_sampling": {do_sample, temperature, top_k, top_p}.
void read_sampling(core::JsonObject& o, ExperienceSampling& e);

/// The keys step 3 and the critic-free step share under the same names: batch sizes, passes,
/// sequence lengths, the actor's hybrid engine, the reference's offload, the EMA and answer printing.
template <typename Config>
void read_policy_step_keys(core::JsonObject& o, Config& c) {
  c.per_device_generation_batch_size =
      read_min(o, "per_device_generation_batch_size", c.per_device_generation_batch_size, 1);
  c.per_device_training_batch_size = read_min(o, "per_device_training_batch_size", c.per_device_training_batch_size, 1);
  c.ppo_epochs = read_min(o, "ppo_epochs", c.ppo_epochs, 1);
  c.max_prompt_seq_len = read_min(o, "max_prompt_seq_len", c.max_prompt_seq_len, 1);
  c.max_answer_seq_len = read_min(o, "max_answer_seq_len", c.max_answer_seq_len, 1);
  c.enable_hybrid_engine = o.get<bool>("enable_hybrid_engine", c.enable_hybrid_engine);
  c.unpin_actor_parameters = o.get<bool>("unpin_actor_parameters", c.unpin_actor_parameters);
  c.release_inference_cache = o.get<bool>("release_inference_cache", c.release_inference_cache);
  c.inference_tp_size = read_min(o, "inference_tp_size", c.inference_tp_size, 1);
  c.tp_gather_partition_size = read_min(o, "tp_gather_partition_size", c.tp_gather_partition_size, 1);
  c.enable_cuda_graph = o.get<bool>("enable_cuda_graph", c.enable_cuda_graph);
  c.offload_reference_model = o.get<bool>("offload_reference_model", c.offload_reference_model);
  c.enable_ema = o.get<bool>("enable_ema", c.enable_ema);
  c.lora_fuse_backup = read_choice(o, "lora_fuse_backup", c.lora_fuse_backup, {"auto", "device", "host"});
  c.print_answers = o.get<bool>("print_answers", c.print_answers);
  c.print_answers_interval = read_min(o, "print_answers_interval", c.print_answers_interval, 1);
  read_sampling(o, c.sampling);
}

}  // namespace config_read
}  // namespace rlhf
}  // namespace dschat
