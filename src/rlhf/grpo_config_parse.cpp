// The "step2_grpo" block (GrpoConfig) and its "rewards" array. Keys left unset take the defaults
// of the chosen estimator's reference implementation:
//                      n   kl_coef  kl_mode  kl_estimator  loss_aggregation
//   grpo (TRL)         8   0.0      loss     k3            token-mean (TRL's "dapo")
//   rloo (TRL)         2   0.05     reward   k1            sequence-mean (its only one)
//   reinforce_pp(_baseline) (OpenRLHF)
//                      4   0.01     reward   k1            token-mean
// (OpenRLHF samples 1 answer per prompt by default; a group needs 2, so ours is 4.)
#include <cmath>
#include <regex>
#include <set>

#include "core/json_object.h"
#include "dschat/core/error.h"
#include "dschat/rlhf/pipeline_config.h"
#include "rlhf/config_read.h"

namespace dschat {
namespace rlhf {
namespace {

using core::JsonObject;
using namespace config_read;

struct EstimatorDefaults {
  int64_t n_samples_per_prompt;
  double kl_coef;
  const char* kl_mode;
  const char* kl_estimator;
  const char* loss_aggregation;
};

EstimatorDefaults defaults_of(const std::string& estimator) {
  if (estimator == "rloo") return {2, 0.05, "reward", "k1", "sequence-mean"};
  if (estimator == "grpo") return {8, 0.0, "loss", "k3", "token-mean"};
  return {4, 0.01, "reward", "k1", "token-mean"};  // reinforce_pp, reinforce_pp_baseline
}

const std::vector<std::string> kEstimators = {"grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"};

RewardSourceConfig parse_reward_source(const nlohmann::json& json, const std::string& where) {
  DSCHAT_CHECK(json.is_object(), ConfigError, where, " must be an object such as {\"type\": \"exact_match\"}, got ",
               json.dump());
  JsonObject o(json, where);
  RewardSourceConfig r;
  r.type = read_choice(o, "type", "", {"reward_model", "exact_match", "regex", "demo_task", "command", "callback"});
  r.weight = o.get<double>("weight", r.weight);
  DSCHAT_CHECK(std::isfinite(r.weight), ConfigError, o.at("weight"), " must be a finite number, got ", r.weight);
  r.name = o.get<std::string>("name", r.type == "callback" ? "" : r.type);
  DSCHAT_CHECK(!r.name.empty(), ConfigError, o.at("name"),
               r.type == "callback" ? " is required: the name the C++ caller registered its function under"
                                    : " must not be empty");
  if (r.type == "reward_model") {
    r.model = o.get<std::string>("model", "");
    DSCHAT_CHECK(!r.model.empty(), ConfigError, o.at("model"), " is required: a step-2 reward model directory");
  }
  if (r.type == "regex") {
    r.pattern = o.get<std::string>("pattern", "");
    DSCHAT_CHECK(!r.pattern.empty(), ConfigError, o.at("pattern"), " is required: the format an answer must match");
    try {
      std::regex check(r.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      DSCHAT_THROW(ConfigError, o.at("pattern"), ": '", r.pattern, "' is not a valid regular expression (", e.what(),
                   ")");
    }
  }
  if (r.type == "command") {
    r.argv = o.get<std::vector<std::string>>("argv", {});
    DSCHAT_CHECK(!r.argv.empty() && !r.argv.front().empty(), ConfigError, o.at("argv"),
                 " is required: the program and its arguments, e.g. [\"python3\", \"verify.py\"]");
    r.timeout_seconds = read_positive(o, "timeout_seconds", r.timeout_seconds);
  }
  o.finish();
  return r;
}

}  // namespace

std::vector<RewardSourceConfig> parse_reward_sources(const nlohmann::json& json, const std::string& where) {
  if (json.is_null()) return {};
  DSCHAT_CHECK(json.is_array(), ConfigError, where, " must be an array of reward sources, got ", json.dump());
  std::vector<RewardSourceConfig> sources;
  std::set<std::string> names;
  for (size_t i = 0; i < json.size(); ++i) {
    const std::string entry = where + "[" + std::to_string(i) + "]";
    sources.push_back(parse_reward_source(json[i], entry));
    DSCHAT_CHECK(names.insert(sources.back().name).second, ConfigError, entry, ": the name '", sources.back().name,
                 "' is used twice; give one of them another \"name\"");
  }
  return sources;
}

GrpoConfig parse_grpo_config(const nlohmann::json& json, const std::string& where, const DataConfig& data,
                             const std::string& estimator) {
  JsonObject o(object_or_empty(json), where);
  GrpoConfig c;
  c.actor.learning_rate = 1e-6;  // TRL's and OpenRLHF's default
  accept_description(o);
  const std::string fallback = estimator.empty() ? c.advantage_estimator : estimator;
  c.advantage_estimator = read_choice(o, "advantage_estimator", fallback, kEstimators);
  // The pipeline names a family: sft-reinforce_pp runs reinforce_pp or reinforce_pp_baseline.
  const bool same_family = c.advantage_estimator == estimator ||
                           (estimator == "reinforce_pp" && c.advantage_estimator == "reinforce_pp_baseline");
  DSCHAT_CHECK(estimator.empty() || same_family, ConfigError, o.at("advantage_estimator"),
               ": '", c.advantage_estimator, "' contradicts the pipeline, which runs '", estimator,
               "'; remove the key or choose the matching pipeline");
  const EstimatorDefaults d = defaults_of(c.advantage_estimator);
  c.actor_model_name_or_path = o.get<std::string>("actor_model_name_or_path", c.actor_model_name_or_path);
  c.data = read_step_data(o, data);
  read_common(o, c.common);
  read_model(o, "actor_", c.actor);
  c.n_samples_per_prompt = read_min(o, "n_samples_per_prompt", d.n_samples_per_prompt, 2);
  read_policy_step_keys(o, c);
  c.scale_rewards = read_choice(o, "scale_rewards", c.scale_rewards, {"none", "group", "batch"});
  c.normalize_advantages = o.get<bool>("normalize_advantages", c.normalize_advantages);
  c.kl_coef = read_nonnegative(o, "kl_coef", d.kl_coef);
  c.kl_mode = read_choice(o, "kl_mode", d.kl_mode, {"loss", "reward"});
  c.kl_estimator = read_choice(o, "kl_estimator", d.kl_estimator, {"k1", "k2", "k3"});
  c.clip_low = core::check_range(o, "clip_low", o.get<double>("clip_low", c.clip_low), 0.0, 1.0);
  c.clip_high = read_nonnegative(o, "clip_high", c.clip_high);
  c.loss_aggregation = read_choice(o, "loss_aggregation", d.loss_aggregation, {"token-mean", "sequence-mean"});
  c.dynamic_sampling = o.get<bool>("dynamic_sampling", c.dynamic_sampling);
  c.dynamic_sampling_max_batches = read_min(o, "dynamic_sampling_max_batches", c.dynamic_sampling_max_batches, 1);
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  c.rewards = parse_reward_sources(o.get<nlohmann::json>("rewards", nullptr), o.at("rewards"));
  o.finish();

  DSCHAT_CHECK(c.advantage_estimator != "rloo" || c.loss_aggregation == "sequence-mean", ConfigError,
               o.at("loss_aggregation"), ": rloo's loss is one clipped ratio per answer (TRL's RLOO), so only "
               "sequence-mean applies; got '", c.loss_aggregation, "'");
  DSCHAT_CHECK(c.advantage_estimator != "rloo" || c.kl_mode == "reward" || c.kl_coef == 0.0, ConfigError,
               o.at("kl_mode"), ": rloo takes the KL to the reference in the reward (TRL's RLOO); set kl_mode to "
               "reward or kl_coef to 0");
  DSCHAT_CHECK(c.inference_tp_size == 1 || c.actor.zero_stage == 3, ConfigError, where, ": inference_tp_size ",
               c.inference_tp_size, " > 1 requires actor_zero_stage 3 (got ", c.actor.zero_stage, ")");
  DSCHAT_CHECK(c.sampling.do_sample, ConfigError, o.at("experience_sampling"),
               ": do_sample must be true: greedy decoding gives the n answers of a prompt identical, so every "
               "group-relative advantage is 0");
  return c;
}

}  // namespace rlhf
}  // namespace dschat
