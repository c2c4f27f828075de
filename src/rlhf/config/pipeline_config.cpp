// The whole `dschat train` file: top-level keys, the shared data block, the three step blocks, and
// the chaining of model and output paths between the steps. The step blocks themselves are parsed
// in step_config_parse.cpp; the compiled-in presets live in config_presets.cpp.
#include "dschat/rlhf/config/pipeline_config.h"

#include <algorithm>
#include <filesystem>

#include "core/json_object.h"
#include "core/strings.h"
#include "dschat/core/device.h"
#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {

nlohmann::json merge_config(nlohmann::json base, const nlohmann::json& patch) {
  base.merge_patch(patch);  // RFC 7386: null deletes a key, a non-object patch replaces wholesale
  return base;
}

namespace {

std::vector<int> read_steps(core::JsonObject& o, const std::vector<int>& fallback) {
  if (!o.has("steps")) {
    o.accept({"steps"});
    return fallback;
  }
  std::vector<int> steps;
  for (int64_t step : o.get<std::vector<int64_t>>("steps", {})) {
    DSCHAT_CHECK(step >= 1 && step <= 3, ConfigError, o.at("steps"), ": ", step, " is not a step (1, 2 or 3)");
    DSCHAT_CHECK(std::find(steps.begin(), steps.end(), step) == steps.end(), ConfigError, o.at("steps"),
                 ": step ", step, " is listed twice");
    steps.push_back(static_cast<int>(step));
  }
  DSCHAT_CHECK(!steps.empty(), ConfigError, o.at("steps"), " must list at least one step");
  return steps;
}

std::string read_one_of(core::JsonObject& o, const std::string& key, const std::string& fallback,
                        const std::vector<std::string>& choices) {
  std::string value = o.get<std::string>(key, fallback);
  DSCHAT_CHECK(std::find(choices.begin(), choices.end(), value) != choices.end(), ConfigError, o.at(key), ": '",
               value, "' is not one of ", core::join(choices));
  return value;
}

std::string join_path(const std::string& dir, const std::string& leaf) {
  return (std::filesystem::path(dir) / leaf).string();
}

const nlohmann::json& member(const nlohmann::json& json, const char* key) {
  static const nlohmann::json kNull;
  auto it = json.find(key);
  return it == json.end() ? kNull : *it;
}

// The top-level keys that are each step's defaults ("device", "save_format"): a step block's own
// key wins.
nlohmann::json with_step_defaults(const nlohmann::json& block, const nlohmann::json& defaults) {
  nlohmann::json out = block.is_null() ? nlohmann::json::object() : block;
  if (!out.is_object()) return out;
  for (const auto& [key, value] : defaults.items()) {
    if (!out.contains(key)) out[key] = value;
  }
  return out;
}

}  // namespace

const std::vector<std::string>& step_block_names() {
  static const std::vector<std::string> kNames = {"step1", "step2", "step3", "step2_dpo", "step2_grpo"};
  return kNames;
}

const char* step_dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kHalf: return "fp16";
    case torch::kBFloat16: return "bf16";
    case torch::kFloat32: return "fp32";
    default: break;
  }
  DSCHAT_THROW(InvalidArgument, "a step's dtype is fp16, bf16 or fp32, not ", c10::toString(dtype));
}

const char* step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::kSft: return "sft";
    case StepKind::kRewardModel: return "rm";
    case StepKind::kPpo: return "ppo";
    case StepKind::kDpo: return "dpo";
    case StepKind::kCriticFree: return "grpo";
  }
  return "?";
}

std::string step_block_name(StepKind kind) {
  switch (kind) {
    case StepKind::kSft: return "step1";
    case StepKind::kRewardModel: return "step2";
    case StepKind::kPpo: return "step3";
    case StepKind::kDpo: return "step2_dpo";
    case StepKind::kCriticFree: return "step2_grpo";
  }
  return "?";
}

StepKind PipelineConfig::kind_of(int step) const {
  if (step == 1) return StepKind::kSft;
  if (step == 3) return StepKind::kPpo;
  return dpo() ? StepKind::kDpo : critic_free() ? StepKind::kCriticFree : StepKind::kRewardModel;
}

const CommonStepConfig& PipelineConfig::common_of(int step) const {
  switch (kind_of(step)) {
    case StepKind::kSft: return step1.common;
    case StepKind::kRewardModel: return step2.common;
    case StepKind::kPpo: return step3.common;
    case StepKind::kDpo: return step2_dpo.common;
    case StepKind::kCriticFree: return step2_grpo.common;
  }
  return step1.common;
}

CommonStepConfig& PipelineConfig::common_of(int step) {
  return const_cast<CommonStepConfig&>(static_cast<const PipelineConfig&>(*this).common_of(step));
}

std::vector<std::pair<std::string, CommonStepConfig*>> PipelineConfig::blocks() {
  return {{"step1", &step1.common}, {"step2", &step2.common}, {"step3", &step3.common},
          {"step2_dpo", &step2_dpo.common}, {"step2_grpo", &step2_grpo.common}};
}

std::string PipelineConfig::model_of(int step) const {
  switch (kind_of(step)) {
    case StepKind::kSft: return step1.model_name_or_path;
    case StepKind::kRewardModel: return step2.model_name_or_path;
    case StepKind::kPpo: return step3.actor_model_name_or_path + " + " + step3.critic_model_name_or_path;
    case StepKind::kDpo: return step2_dpo.model_name_or_path;
    case StepKind::kCriticFree: return step2_grpo.actor_model_name_or_path;
  }
  return "";
}

const std::string& PipelineConfig::output_of(int step) const {
  switch (kind_of(step)) {
    case StepKind::kSft: return step1.output_dir;
    case StepKind::kRewardModel: return step2.output_dir;
    case StepKind::kPpo: return step3.output_dir;
    case StepKind::kDpo: return step2_dpo.output_dir;
    case StepKind::kCriticFree: return step2_grpo.output_dir;
  }
  return step1.output_dir;
}

PipelineConfig parse_pipeline_config(const nlohmann::json& json, const std::string& where) {
  core::JsonObject o(json, where);
  PipelineConfig c;
  o.get<nlohmann::json>("description", nullptr);  // free text, ignored
  c.actor_model = o.get<std::string>("actor_model", c.actor_model);
  c.reward_model = o.get<std::string>("reward_model", c.reward_model);
  c.demo_report = o.get<bool>("demo_report", c.demo_report);
  c.collective_timeout_seconds = core::check_range<int64_t>(
      o, "collective_timeout_seconds", o.get<int64_t>("collective_timeout_seconds", c.collective_timeout_seconds), 1,
      86400);
  c.deployment = read_one_of(o, "deployment", c.deployment, {"single_gpu", "single_node", "multi_node"});
  c.device = o.get<std::string>("device", c.device);
  DSCHAT_CHECK(core::is_device_name(c.device), ConfigError, o.at("device"), ": '", c.device,
               "' is not a device (auto, cpu, cuda or cuda:N)");
  nlohmann::json step_defaults = {{"device", c.device}};
  if (o.has("save_format")) {
    step_defaults["save_format"] = read_one_of(o, "save_format", "safetensors", {"safetensors", "bin"});
  }
  c.output_dir = o.get<std::string>("output_dir", c.output_dir);
  DSCHAT_CHECK(!c.output_dir.empty(), ConfigError, o.at("output_dir"), " must not be empty");
  c.init = read_one_of(o, "init", c.init, {"pretrained", "random"});
  c.tokenizer = o.get<std::string>("tokenizer", c.tokenizer);
  c.pipeline = read_one_of(o, "pipeline", c.pipeline,
                           {"sft-rm-ppo", "sft-dpo", "sft-grpo", "sft-rloo", "sft-reinforce_pp"});
  c.step2_kind = c.pipeline == "sft-dpo"      ? StepKind::kDpo
                 : c.pipeline == "sft-rm-ppo" ? StepKind::kRewardModel
                                              : StepKind::kCriticFree;  // sft-grpo | sft-rloo | sft-reinforce_pp
  const bool two_steps = c.step2_kind != StepKind::kRewardModel;
  c.steps = read_steps(o, two_steps ? std::vector<int>{1, 2} : c.steps);
  DSCHAT_CHECK(!two_steps || std::find(c.steps.begin(), c.steps.end(), 3) == c.steps.end(), ConfigError,
               o.at("steps"), ": the ", c.pipeline, " pipeline has steps 1 (SFT) and 2 (",
               c.pipeline.substr(4), "); there is no step 3");
  // Type-check the nested blocks here (object() throws for a non-object) so the error names the
  // top-level key; their contents are parsed below with their own `where`.
  o.object("data");
  for (const std::string& block : step_block_names()) o.object(block);
  o.finish();

  DataConfig data = parse_data_config(member(json, "data"), where + ": data");
  c.step1 = parse_sft_config(with_step_defaults(member(json, "step1"), step_defaults), where + ": step1", data);
  c.step2 = parse_reward_config(with_step_defaults(member(json, "step2"), step_defaults), where + ": step2", data);
  c.step3 = parse_ppo_config(with_step_defaults(member(json, "step3"), step_defaults), where + ": step3", data);
  c.step2_dpo = parse_dpo_config(with_step_defaults(member(json, "step2_dpo"), step_defaults), where + ": step2_dpo", data);
  // The pipeline names the estimator (sft-grpo: grpo); the block's defaults follow it.
  const std::string estimator = c.critic_free() ? c.pipeline.substr(4) : "";
  c.step2_grpo =
      parse_grpo_config(with_step_defaults(member(json, "step2_grpo"), step_defaults), where + ": step2_grpo", data, estimator);
  const bool runs_grpo = c.critic_free() && std::find(c.steps.begin(), c.steps.end(), 2) != c.steps.end();
  DSCHAT_CHECK(!runs_grpo || !c.step2_grpo.rewards.empty(), ConfigError, where,
               ": step2_grpo: key 'rewards' is required by the ", c.pipeline,
               " pipeline: at least one reward source, e.g. [{\"type\": \"exact_match\"}]");

  // Chaining, as e2e_rlhf.py passes the step outputs along. Step 2 starts from the base reward
  // model, not from step 1's output (DS-Chat's run_350m.sh loads facebook/opt-350m).
  if (c.step1.model_name_or_path.empty()) c.step1.model_name_or_path = c.actor_model;
  if (c.step2.model_name_or_path.empty()) c.step2.model_name_or_path = c.reward_model;
  if (c.step1.output_dir.empty()) c.step1.output_dir = join_path(c.output_dir, "actor");
  if (c.step2.output_dir.empty()) c.step2.output_dir = join_path(c.output_dir, "reward");
  if (c.step3.actor_model_name_or_path.empty()) c.step3.actor_model_name_or_path = c.step1.output_dir;
  if (c.step3.critic_model_name_or_path.empty()) c.step3.critic_model_name_or_path = c.step2.output_dir;
  if (c.step3.output_dir.empty()) c.step3.output_dir = join_path(c.output_dir, "step3");
  if (c.step2_dpo.model_name_or_path.empty()) c.step2_dpo.model_name_or_path = c.step1.output_dir;
  if (c.step2_dpo.output_dir.empty()) c.step2_dpo.output_dir = join_path(c.output_dir, "dpo");
  if (c.step2_grpo.actor_model_name_or_path.empty()) c.step2_grpo.actor_model_name_or_path = c.step1.output_dir;
  if (c.step2_grpo.output_dir.empty()) c.step2_grpo.output_dir = join_path(c.output_dir, "grpo");
  return c;
}

}  // namespace rlhf
}  // namespace dschat
