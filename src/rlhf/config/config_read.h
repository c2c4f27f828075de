#pragma once
// The readers every step block shares (step_config_parse.cpp, grpo_config_parse.cpp). Each
// throws core::ConfigError naming the block and the key (JsonObject::at).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_object.h"
#include "dschat/rlhf/config/pipeline_config.h"

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
void read_policy_step_keys(core::JsonObject& o, PolicyStepConfig& c);

}  // namespace config_read
}  // namespace rlhf
}  // namespace dschat
