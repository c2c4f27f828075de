#pragma once
// One reward source of the critic-free step (GrpoConfig::rewards in pipeline_config.h; what each
// type computes is in reward_sources.h). In a config file:
//
//   "rewards": [{"type": "exact_match"},
//               {"type": "regex", "pattern": "[0-9]+", "weight": 0.1},
//               {"type": "command", "argv": ["python3", "verify.py"], "timeout_seconds": 30}]
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dschat {
namespace rlhf {

/// What computes a source's score (reward_sources.h); "type" in a config file.
enum class RewardSourceType { kRewardModel, kExactMatch, kRegex, kDemoTask, kCommand, kCallback };
/// The JSON name: reward_model | exact_match | regex | demo_task | command | callback.
const char* reward_source_type_name(RewardSourceType type);

/// One reward source. The reward of an answer is the weighted sum of every source's score.
struct RewardSourceConfig {
  RewardSourceType type = RewardSourceType::kDemoTask;
  double weight = 1.0;
  /// The source's name in logs and metrics (default: its type). For "callback", the name the
  /// C++ caller registered the function under (required).
  std::string name;
  std::string model;                // reward_model: a step-2 model directory (value head)
  std::string pattern;              // regex: must match the whole answer (ECMAScript syntax)
  std::vector<std::string> argv;    // command: the program and its arguments
  double timeout_seconds = 60.0;    // command: per batch of queries
};

/// What a "command" or "callback" source is asked to score (reward_program.h, reward_sources.h).
struct RewardQuery {
  std::string prompt;
  std::string response;
  nlohmann::json meta = nlohmann::json::object();  // passed through (a reference answer, a test suite, ...)
};

/// A reward a C++ program computes instead (a "callback" reward source, reward_sources.h): one
/// value per query, in order. Registered by name in StepContext::reward_callbacks.
using RewardCallback = std::function<std::vector<double>(const std::vector<RewardQuery>& queries)>;
using RewardCallbacks = std::map<std::string, RewardCallback>;

/// Parses a "rewards" array. Throws core::ConfigError naming `where`, the entry and the key.
std::vector<RewardSourceConfig> parse_reward_sources(const nlohmann::json& json, const std::string& where);

}  // namespace rlhf
}  // namespace dschat
