#include "app/train_command.h"

#include <csignal>

#include "dschat/core/device.h"
#include "dschat/core/error.h"
#include "dschat/core/logging.h"
#include "dschat/core/json_file.h"
#include "dschat/dist/launch_env.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace app {
using namespace rlhf;
namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_stop_requested{false};

extern "C" void on_stop_signal(int signal_number) {
  if (g_stop_requested.exchange(true)) {
    std::signal(signal_number, SIG_DFL);  // second signal: the default action, at once
    std::raise(signal_number);
  }
}

// A bundled path of the demo: as given when it exists from here, else under the source tree.
std::string bundled_path(const std::string& path, const fs::path& source_dir) {
  if (path.empty() || fs::path(path).is_absolute() || fs::exists(path)) return path;
  const fs::path candidate = source_dir / path;
  return fs::exists(candidate) ? candidate.string() : path;
}

bool is_demo(const TrainArguments& args) {
  return !args.actor && !args.reward && !args.deployment && !args.config_file;
}

// fp16/bf16 on the CPU is slow and, for fp16, without the loss-scaled GPU kernels it is meant
// for: a dtype that came from a preset (or DS-Chat's fp16 default) runs as fp32 there. A dtype
// the user's file set for the step is kept.
void run_presets_in_fp32_on_cpu(PipelineConfig& config, const nlohmann::json& user_file) {
  for (const auto& [name, common] : config.blocks()) {
    const bool user_set = user_file.is_object() && user_file.contains(name) && user_file[name].is_object() &&
                          user_file[name].contains("dtype");
    if (user_set || common->dtype == torch::kFloat32) continue;
    if (!common->resolved_device || !common->resolved_device->is_cpu()) continue;
    // Warned only for the blocks this pipeline runs (the others change silently, unused).
    bool runs = false;
    for (int step : config.steps) runs = runs || &config.common_of(step) == common;
    if (runs) {
      core::log_message(core::LogLevel::Warn, std::string(name) + ": the preset's dtype " + rlhf::step_dtype_name(common->dtype) +
                                                  " runs as fp32 on the CPU (set \"dtype\" in the step's block to keep it)");
    }
    common->dtype = torch::kFloat32;
  }
}

// Step `step`'s device as plan_train resolved it (a block the pipeline runs always is).
torch::Device resolved_device_of(const PipelineConfig& config, int step) {
  const CommonStepConfig& common = config.common_of(step);
  DSCHAT_CHECK(common.resolved_device.has_value(), InvalidArgument, "step", step,
               ": its device was not resolved (plan_train resolves every step's device)");
  return *common.resolved_device;
}

}  // namespace

nlohmann::json plan_json(const TrainArguments& args, const fs::path& source_dir) {
  nlohmann::json json;
  if (is_demo(args)) {
    json = demo_config();
    for (const char* key : {"actor_model", "reward_model", "tokenizer"}) {
      if (json.contains(key)) json[key] = bundled_path(json[key].get<std::string>(), source_dir);
    }
    auto resolve_data_dir = [&](nlohmann::json& block) {
      if (!block.contains("data") || !block["data"].contains("local_jsonfile_dir")) return;
      nlohmann::json& dir = block["data"]["local_jsonfile_dir"];
      dir = bundled_path(dir.get<std::string>(), source_dir);
    };
    resolve_data_dir(json);
    for (const std::string& step : step_block_names()) {
      if (json.contains(step)) resolve_data_dir(json[step]);
    }
  } else {
    // The file's "preset" says what it is merged over: "auto" (default) the preset of
    // (deployment, actor, reward), "demo" the embedded demo, "none" DeepSpeed-Chat's defaults.
    nlohmann::json file = args.config_file ? core::read_json_file(*args.config_file) : nlohmann::json::object();
    DSCHAT_CHECK(file.is_object(), ConfigError, *args.config_file, ": a dschat config is a JSON object ({...}), got ",
                 file.type_name());
    const std::string preset = file.is_object() ? file.value("preset", std::string("auto")) : "auto";
    if (file.is_object()) file.erase("preset");
    if (preset == "demo") {
      TrainArguments demo_args;
      json = plan_json(demo_args, source_dir);
    } else if (preset == "none") {
      json = nlohmann::json::object();
    } else {
      DSCHAT_CHECK(preset == "auto", ConfigError, *args.config_file, ": key 'preset' must be auto, demo or none, got '",
                   preset, "'");
      const auto pick = [&](const std::optional<std::string>& flag, const char* key, const char* fallback) {
        return flag ? *flag : file.is_object() && file.contains(key) ? file[key].get<std::string>() : fallback;
      };
      json = preset_config(pick(args.deployment, "deployment", "single_gpu"),
                           pick(args.actor, "actor_model", "facebook/opt-1.3b"),
                           pick(args.reward, "reward_model", "facebook/opt-350m"));
    }
    // The flags win over the file; the preset has normalised them ("1.3b" -> "facebook/opt-1.3b").
    const nlohmann::json preset_models = {{"actor_model", json.value("actor_model", nlohmann::json())},
                                          {"reward_model", json.value("reward_model", nlohmann::json())}};
    json = merge_config(json, file);
    const bool normalised = preset == "auto";
    if (args.actor) json["actor_model"] = normalised ? preset_models["actor_model"] : nlohmann::json(*args.actor);
    if (args.reward) json["reward_model"] = normalised ? preset_models["reward_model"] : nlohmann::json(*args.reward);
    if (args.deployment) json["deployment"] = *args.deployment;
  }
  if (args.device) {
    // Checked here, so an error names the flag, not the config key it becomes in every step block.
    core::resolve_device(*args.device, "--device");
    json["device"] = *args.device;
    for (const std::string& step : step_block_names()) {
      if (json.contains(step) && json[step].is_object()) json[step].erase("device");
    }
  }
  if (args.save_format) {
    json["save_format"] = *args.save_format;
    for (const std::string& step : step_block_names()) {
      if (json.contains(step) && json[step].is_object()) json[step].erase("save_format");
    }
  }
  if (args.output_dir) json["output_dir"] = *args.output_dir;
  if (args.init) json["init"] = *args.init;
  if (args.collective_timeout_seconds) json["collective_timeout_seconds"] = *args.collective_timeout_seconds;
  if (args.tokenizer) json["tokenizer"] = *args.tokenizer;
  if (args.pipeline) json["pipeline"] = *args.pipeline;
  if (args.critic_free_step) {
    const std::string pipeline = json.value("pipeline", std::string());
    if (pipeline != "sft-grpo" && pipeline != "sft-rloo" && pipeline != "sft-reinforce_pp") {
      std::string estimator = "grpo";
      if (json.contains("step2_grpo") && json["step2_grpo"].is_object()) {
        estimator = json["step2_grpo"].value("advantage_estimator", estimator);
      }
      json["pipeline"] = "sft-" + (estimator.rfind("reinforce_pp", 0) == 0 ? std::string("reinforce_pp") : estimator);
    }
  }
  if (!args.steps.empty()) json["steps"] = args.steps;
  if (!args.data_path.empty()) json["data"]["data_path"] = args.data_path;
  return json;
}

TrainPlan plan_train(const TrainArguments& args, const fs::path& source_dir) {
  TrainPlan plan;
  const nlohmann::json json = plan_json(args, source_dir);
  const std::string where = args.config_file ? *args.config_file : is_demo(args) ? "configs/demo.json" : "preset";
  plan.config = parse_pipeline_config(json, where);
  // The one place a run resolves its devices: everything below reads resolved_device.
  rlhf::resolve_step_devices(plan.config, args.local_rank);
  const nlohmann::json user_file = args.config_file ? core::read_json_file(*args.config_file) : nlohmann::json();
  if (!args.keep_preset_dtypes) {
    run_presets_in_fp32_on_cpu(plan.config, is_demo(args) ? demo_config() : user_file);
  }
  plan.demo = plan.config.demo_report;
  // "reward_model": "step1" starts the reward model from the SFT output (the demo's choice: a
  // random 2-layer model cannot learn the task's correctness from its few hundred pairs).
  // A step2 block that names its own model keeps it.
  const bool step2_names_model = json.contains("step2") && json.at("step2").is_object() &&
                                 json.at("step2").contains("model_name_or_path");
  if (json.value("reward_model", std::string()) == "step1" && !step2_names_model) {
    plan.config.step2.model_name_or_path = plan.config.step1.output_dir;
  }
  // The held-out prompts of the pairs (step 1 may train on other records of the same prompts).
  if (plan.demo) plan.demo_eval_file = fs::path(plan.config.step3.data.local_jsonfile_dir) / "eval.json";
  return plan;
}

std::string describe_plan(const TrainPlan& plan) {
  const PipelineConfig& c = plan.config;
  std::string out;
  for (int step : c.steps) {
    const CommonStepConfig& common = c.common_of(step);
    const std::string name = "step" + std::to_string(step);
    const torch::Device device = resolved_device_of(c, step);
    std::string kind = rlhf::step_kind_name(c.kind_of(step));
    kind.resize(std::max<size_t>(kind.size(), 3), ' ');  // "rm " lines up with "sft"
    out += name + ": " + kind + "  device " + device.str() +
           "  dtype " + rlhf::step_dtype_name(common.dtype) + "  model " + c.model_of(step) + "\n";
  }
  return out;
}

std::shared_ptr<dist::Communicator> communicator_from_environment(const torch::Device& device,
                                                                  std::chrono::milliseconds timeout) {
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  // Before the communicator: NCCL binds its communicators to the current device.
  core::set_current_device(device);
  if (env.world_size <= 1) return nullptr;
  const dist::Backend backend = device.is_cuda() ? dist::Backend::Nccl : dist::Backend::Gloo;
  return std::make_shared<dist::Communicator>(dist::Communicator::create(env, backend, timeout));
}

int64_t launcher_local_rank() {
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  return env.source == "single" ? -1 : env.local_rank;
}

torch::Device pipeline_device(const PipelineConfig& config) {
  return resolved_device_of(config, config.steps.empty() ? 1 : config.steps.front());
}

const std::atomic<bool>* install_stop_signal_handler() {
  g_stop_requested = false;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  return &g_stop_requested;
}

}  // namespace app
}  // namespace dschat
