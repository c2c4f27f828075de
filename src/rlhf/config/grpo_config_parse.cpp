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
#include "core/strings.h"
#include "dschat/core/error.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "rlhf/config/config_read.h"

namespace dschat {
namespace rlhf {
namespace {

using core::JsonObject;
using namespace config_read;

struct EstimatorDefaults {
  int64_t n_samples_per_prompt;
  double kl_coef;
  KlMode kl_mode;
  KlEstimator kl_estimator;
  LossAggregation loss_aggregation;
};

EstimatorDefaults defaults_of(AdvantageEstimator estimator) {
  switch (estimator) {
    case AdvantageEstimator::kRloo:
      return {2, 0.05, KlMode::kReward, KlEstimator::kK1, LossAggregation::kSequenceMean};
    case AdvantageEstimator::kGrpo: return {8, 0.0, KlMode::kLoss, KlEstimator::kK3, LossAggregation::kTokenMean};
    case AdvantageEstimator::kReinforcePp:
    case AdvantageEstimator::kReinforcePpBaseline: break;
  }
  return {4, 0.01, KlMode::kReward, KlEstimator::kK1, LossAggregation::kTokenMean};
}

// A mode key read once into its enum: one of the names of `Mode`'s values (the message of
// read_choice for another).
template <typename Mode>
Mode read_mode(JsonObject& o, const std::string& key, Mode fallback, const std::vector<Mode>& modes) {
  std::vector<std::string> names;
  for (Mode m : modes) names.push_back(mode_name(m));
  const std::string name = read_choice(o, key, mode_name(fallback), names);
  for (Mode m : modes) {
    if (name == mode_name(m)) return m;
  }
  return fallback;
}

const std::vector<AdvantageEstimator> kEstimators = {AdvantageEstimator::kGrpo, AdvantageEstimator::kRloo,
                                                     AdvantageEstimator::kReinforcePp,
                                                     AdvantageEstimator::kReinforcePpBaseline};

RewardSourceConfig parse_reward_source(const nlohmann::json& json, const std::string& where) {
  DSCHAT_CHECK(json.is_object(), ConfigError, where, " must be an object such as {\"type\": \"exact_match\"}, got ",
               json.dump());
  JsonObject o(json, where);
  RewardSourceConfig r;
  const std::vector<RewardSourceType> types = {RewardSourceType::kRewardModel, RewardSourceType::kExactMatch,
                                               RewardSourceType::kRegex,       RewardSourceType::kDemoTask,
                                               RewardSourceType::kCommand,     RewardSourceType::kCallback};
  std::vector<std::string> type_names;
  for (RewardSourceType t : types) type_names.push_back(reward_source_type_name(t));
  const std::string type_name = read_choice(o, "type", "", type_names);
  for (RewardSourceType t : types) {
    if (type_name == reward_source_type_name(t)) r.type = t;
  }
  const bool callback = r.type == RewardSourceType::kCallback;
  r.weight = o.get<double>("weight", r.weight);
  DSCHAT_CHECK(std::isfinite(r.weight), ConfigError, o.at("weight"), " must be a finite number, got ", r.weight);
  r.name = o.get<std::string>("name", callback ? "" : type_name);
  DSCHAT_CHECK(!r.name.empty(), ConfigError, o.at("name"),
               callback ? " is required: the name the C++ caller registered its function under"
                        : " must not be empty");
  if (r.type == RewardSourceType::kRewardModel) {
    r.model = o.get<std::string>("model", "");
    DSCHAT_CHECK(!r.model.empty(), ConfigError, o.at("model"), " is required: a step-2 reward model directory");
  }
  if (r.type == RewardSourceType::kRegex) {
    r.pattern = o.get<std::string>("pattern", "");
    DSCHAT_CHECK(!r.pattern.empty(), ConfigError, o.at("pattern"), " is required: the format an answer must match");
    try {
      std::regex check(r.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      DSCHAT_THROW(ConfigError, o.at("pattern"), ": '", r.pattern, "' is not a valid regular expression (", e.what(),
                   ")");
    }
  }
  if (r.type == RewardSourceType::kCommand) {
    r.argv = o.get<std::vector<std::string>>("argv", {});
    DSCHAT_CHECK(!r.argv.empty() && !r.argv.front().empty(), ConfigError, o.at("argv"),
                 " is required: the program and its arguments, e.g. [\"python3\", \"verify.py\"]");
    r.timeout_seconds = read_positive(o, "timeout_seconds", r.timeout_seconds);
  }
  o.finish();
  return r;
}

}  // namespace

const char* reward_source_type_name(RewardSourceType type) {
  switch (type) {
    case RewardSourceType::kRewardModel: return "reward_model";
    case RewardSourceType::kExactMatch: return "exact_match";
    case RewardSourceType::kRegex: return "regex";
    case RewardSourceType::kDemoTask: return "demo_task";
    case RewardSourceType::kCommand: return "command";
    case RewardSourceType::kCallback: return "callback";
  }
  return "?";
}

const char* mode_name(AdvantageEstimator mode) {
  switch (mode) {
    case AdvantageEstimator::kGrpo: return "grpo";
    case AdvantageEstimator::kRloo: return "rloo";
    case AdvantageEstimator::kReinforcePp: return "reinforce_pp";
    case AdvantageEstimator::kReinforcePpBaseline: return "reinforce_pp_baseline";
  }
  return "?";
}
const char* mode_name(KlMode mode) { return mode == KlMode::kLoss ? "loss" : "reward"; }
const char* mode_name(LossAggregation mode) {
  return mode == LossAggregation::kTokenMean ? "token-mean" : "sequence-mean";
}
const char* mode_name(RewardScaling mode) {
  switch (mode) {
    case RewardScaling::kNone: return "none";
    case RewardScaling::kGroup: return "group";
    case RewardScaling::kBatch: return "batch";
  }
  return "?";
}
const char* mode_name(KlEstimator mode) {
  switch (mode) {
    case KlEstimator::kK1: return "k1";
    case KlEstimator::kK2: return "k2";
    case KlEstimator::kK3: return "k3";
  }
  return "?";
}

AdvantageEstimator advantage_estimator_named(const std::string& name, const std::string& where) {
  std::vector<std::string> names;
  for (AdvantageEstimator e : kEstimators) {
    if (name == mode_name(e)) return e;
    names.push_back(mode_name(e));
  }
  DSCHAT_THROW(ConfigError, where, ": '", name, "' is not one of ", core::join(names));
}

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
  // The pipeline names a family: sft-reinforce_pp runs reinforce_pp or reinforce_pp_baseline.
  const bool from_pipeline = !estimator.empty();
  const AdvantageEstimator pipeline_estimator =
      from_pipeline ? advantage_estimator_named(estimator, where + ": pipeline") : c.advantage_estimator;
  c.advantage_estimator = read_mode(o, "advantage_estimator", pipeline_estimator, kEstimators);
  const bool same_family = !from_pipeline || c.advantage_estimator == pipeline_estimator ||
                           (pipeline_estimator == AdvantageEstimator::kReinforcePp &&
                            c.advantage_estimator == AdvantageEstimator::kReinforcePpBaseline);
  DSCHAT_CHECK(same_family, ConfigError, o.at("advantage_estimator"), ": '", mode_name(c.advantage_estimator),
               "' contradicts the pipeline, which runs '", estimator,
               "'; remove the key or choose the matching pipeline");
  const EstimatorDefaults d = defaults_of(c.advantage_estimator);
  c.actor_model_name_or_path = o.get<std::string>("actor_model_name_or_path", c.actor_model_name_or_path);
  c.data = read_step_data(o, data);
  read_common(o, c.common);
  read_model(o, "actor_", c.actor);
  c.n_samples_per_prompt = read_min(o, "n_samples_per_prompt", d.n_samples_per_prompt, 2);
  read_policy_step_keys(o, c);
  c.scale_rewards = read_mode(o, "scale_rewards", c.scale_rewards,
                              {RewardScaling::kNone, RewardScaling::kGroup, RewardScaling::kBatch});
  c.normalize_advantages = o.get<bool>("normalize_advantages", c.normalize_advantages);
  c.kl_coef = read_nonnegative(o, "kl_coef", d.kl_coef);
  c.kl_mode = read_mode(o, "kl_mode", d.kl_mode, {KlMode::kLoss, KlMode::kReward});
  c.kl_estimator = read_mode(o, "kl_estimator", d.kl_estimator, {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3});
  c.clip_low = core::check_range(o, "clip_low", o.get<double>("clip_low", c.clip_low), 0.0, 1.0);
  c.clip_high = read_nonnegative(o, "clip_high", c.clip_high);
  c.loss_aggregation = read_mode(o, "loss_aggregation", d.loss_aggregation,
                                 {LossAggregation::kTokenMean, LossAggregation::kSequenceMean});
  c.dynamic_sampling = o.get<bool>("dynamic_sampling", c.dynamic_sampling);
  c.dynamic_sampling_max_batches = read_min(o, "dynamic_sampling_max_batches", c.dynamic_sampling_max_batches, 1);
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  c.rewards = parse_reward_sources(o.get<nlohmann::json>("rewards", nullptr), o.at("rewards"));
  o.finish();

  const bool rloo = c.advantage_estimator == AdvantageEstimator::kRloo;
  DSCHAT_CHECK(!rloo || c.loss_aggregation == LossAggregation::kSequenceMean, ConfigError,
               o.at("loss_aggregation"), ": rloo's loss is one clipped ratio per answer (TRL's RLOO), so only "
               "sequence-mean applies; got '", mode_name(c.loss_aggregation), "'");
  DSCHAT_CHECK(!rloo || c.kl_mode == KlMode::kReward || c.kl_coef == 0.0, ConfigError,
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
