// Every key of the pipeline config, set to values of the wrong type, out of range, at the int64
// and double limits: parse_pipeline_config either accepts the value or throws a dschat error
// that names the file and the key. Anything else (a JSON library exception, a wrapped integer
// accepted silently, a crash) fails. Issue 38's "fuzz over the config keys".
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/core/json_file.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

// Configs that between them reach every step block and nested object the parser reads.
std::vector<json> base_configs() {
  json rules = {{"non_finite", {{"action", "rollback"}}},
                {"loss_spike", {{"action", "rollback"}, {"factor", 5.0}, {"window", 20}, {"min_steps", 10},
                                {"min_increase", 1.0}}},
                {"kl", {{"limit", 10.0}}},
                {"kl_growth", {{"limit", 0.5}, {"window", 10}}},
                {"entropy", {{"floor", 0.05}}},
                {"answer_length", {{"margin", 0.5}}},
                {"repeated_answers", {{"share", 0.8}}},
                {"reward_hacking", {{"min_rise", 0.1}, {"window", 4}, {"min_drop", 0.1}, {"interval", 10},
                                    {"prompts", 16}}}};
  json guardian = {{"enabled", true}, {"snapshot_interval", 50}, {"max_rollbacks", 3}, {"lr_factor", 0.5},
                   {"batches", "skip"}, {"reseed", true}};
  guardian.update(rules);
  json ppo = rlhf::preset_config("single_node", "opt-13b", "opt-350m");
  ppo["step1"]["guardian"] = guardian;
  ppo["step1"]["elastic_resume"] = "allow";
  ppo["step1"]["log_sample_ids"] = true;
  ppo["step3"]["ppo_constants"] = {{"kl_ctl", 0.1}, {"clip_reward_value", 5.0}, {"cliprange", 0.2},
                                   {"cliprange_value", 0.2}, {"gamma", 1.0}, {"lam", 0.95}};
  ppo["step3"]["reward_gate"] = {{"action", "warn"}, {"min_accuracy", 0.6}, {"max_length_bias", 0.5},
                                 {"max_padding_win_rate", 0.5}, {"max_pairs", 64}};
  json dpo = {{"pipeline", "sft-dpo"},
              {"step2_dpo", {{"beta", 0.1}, {"label_smoothing", 0.0}, {"offload_reference_model", false},
                             {"eval_interval", 0}, {"eval_iters", 2}, {"per_device_train_batch_size", 2},
                             {"max_seq_len", 64}, {"learning_rate", 1e-4}, {"num_train_epochs", 1}}}};
  json grpo = {{"pipeline", "sft-grpo"},
               {"step2_grpo", {{"n_samples_per_prompt", 4}, {"kl_coef", 0.04}, {"kl_mode", "loss"},
                               {"kl_estimator", "k3"}, {"clip_low", 0.2}, {"clip_high", 0.28},
                               {"scale_rewards", "group"}, {"normalize_advantages", false},
                               {"dynamic_sampling", true}, {"dynamic_sampling_max_batches", 3},
                               {"max_prompt_seq_len", 32}, {"max_answer_seq_len", 16},
                               {"per_device_generation_batch_size", 4}, {"per_device_training_batch_size", 8},
                               {"rewards", json::array({{{"type", "regex"}, {"pattern", "[0-9]+"}, {"weight", 1.0}},
                                                        {{"type", "exact_match"}, {"weight", 0.5}}})}}}};
  return {ppo, rlhf::demo_config(), dpo, grpo};
}

// Every path below the root, objects and array items included: ("step1", "guardian", "kl", "limit").
void collect_paths(const json& node, std::vector<json::json_pointer>& out, const json::json_pointer& at) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      out.push_back(at / key);
      collect_paths(value, out, at / key);
    }
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) {
      out.push_back(at / i);
      collect_paths(node[i], out, at / i);
    }
  }
}

std::vector<json> bad_values() {
  return {json("x"),
          json(true),
          json(-1),
          json(0),
          json(std::numeric_limits<int64_t>::max()),
          json(std::numeric_limits<int64_t>::min()),
          json(std::numeric_limits<uint64_t>::max()),
          json(int64_t{4294967299}),  // 2^32 + 3: wraps to 3 in a 32-bit int
          json(1e308),
          json(-1e308),
          json(1e19),
          json(0.5),
          json::array(),
          json::object()};
}

TEST(ConfigFuzz, EveryKeyAcceptsOrNamesFileAndKey) {
  int64_t accepted = 0, refused = 0;
  for (const json& base : base_configs()) {
    ASSERT_NO_THROW(rlhf::parse_pipeline_config(base, "fuzz.json")) << base.dump();
    std::vector<json::json_pointer> paths;
    collect_paths(base, paths, json::json_pointer());
    for (const auto& path : paths) {
      // The key an error must name: the last object key on the path (an array item's own key, or its array's).
      std::string key;
      for (json::json_pointer p = path; !p.empty(); p = p.parent_pointer()) {
        const std::string last = p.back();
        if (!last.empty() && last.find_first_not_of("0123456789") != std::string::npos) {
          key = last;
          break;
        }
      }
      for (const json& value : bad_values()) {
        json config = base;
        config[path] = value;
        try {
          rlhf::parse_pipeline_config(config, "fuzz.json");
          ++accepted;
        } catch (const core::Error& e) {
          ++refused;
          const std::string what = e.what();
          EXPECT_NE(what.find("fuzz.json"), std::string::npos) << path.to_string() << " = " << value.dump() << ": " << what;
          EXPECT_NE(what.find(key), std::string::npos) << path.to_string() << " = " << value.dump() << ": " << what;
        } catch (const std::exception& e) {
          ADD_FAILURE() << path.to_string() << " = " << value.dump() << ": not a dschat error: " << e.what();
        }
      }
    }
  }
  EXPECT_GT(refused, 1000);  // the bad values are mostly refused...
  EXPECT_GT(accepted, 50);   // ...while free-text and wide-range keys take some of them
}

TEST(ConfigFuzz, CountsAreBoundedSoProductsCannotOverflow) {
  for (const char* key : {"per_device_train_batch_size", "num_train_epochs", "gradient_accumulation_steps",
                          "max_seq_len"}) {
    json config = {{"step1", {{key, int64_t{1} << 24}}}};
    EXPECT_NO_THROW(rlhf::parse_pipeline_config(config, "fuzz.json")) << key;
    config["step1"][key] = (int64_t{1} << 24) + 1;
    EXPECT_THROW_WITH(rlhf::parse_pipeline_config(config, "fuzz.json"), core::ConfigError,
                      std::string("fuzz.json: step1: key '") + key + "' must be <= 16777216");
  }
  // 2^32 + 3 is not zero_stage 3, and a fraction is not an integer.
  EXPECT_THROW_WITH(rlhf::parse_pipeline_config({{"step1", {{"zero_stage", int64_t{4294967299}}}}}, "fuzz.json"),
                    core::ConfigError, "key 'zero_stage'");
  EXPECT_THROW_WITH(rlhf::parse_pipeline_config({{"step1", {{"num_train_epochs", 1.5}}}}, "fuzz.json"),
                    core::ConfigError, "key 'num_train_epochs' expects an integer");
  EXPECT_THROW_WITH(rlhf::parse_pipeline_config({{"step1", {{"num_train_epochs", 1e300}}}}, "fuzz.json"),
                    core::ConfigError, "key 'num_train_epochs' expects an integer");
}

TEST(ConfigFuzz, UnparsableFilesNameTheFile) {
  testing::TempDir dir;
  const std::string overflow = (dir / "overflow.json").string();
  std::ofstream(overflow) << R"({"step1": {"learning_rate": 1e999}})";
  EXPECT_THROW_WITH(core::read_json_file(overflow), core::ConfigError, overflow + ": invalid JSON");
  const std::string array = (dir / "array.json").string();
  std::ofstream(array) << "[1, 2]";
  std::string output;
  EXPECT_NE(testing::run_command(std::string(DSCHAT_CLI_PATH) + " train --dry-run --config " + array, &output), 0);
  EXPECT_NE(output.find(array + ": a dschat config is a JSON object ({...}), got array"), std::string::npos) << output;
  EXPECT_NE(testing::run_command(std::string(DSCHAT_CLI_PATH) + " train --dry-run --config " + overflow, &output), 0);
  EXPECT_NE(output.find(overflow + ": invalid JSON"), std::string::npos) << output;
}

}  // namespace
}  // namespace dschat
