#include "dschat/rlhf/rewards/reward_gate.h"

#include <cstdio>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "io/atomic_file.h"

namespace dschat {
namespace rlhf {
// Named, not anonymous: the unity build shares a unit with other rlhf files' helpers.
namespace rm_gate {

constexpr const char* kKeyPrefix = "step3.reward_gate.";

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", v);
  return text;
}

// "accuracy 0.412 < 0.55 (step3.reward_gate.min_accuracy)"
std::string describe(const RewardGateCheck& c) {
  return c.metric + " " + number(c.value) + (c.at_least ? " < " : " > ") + number(c.limit) + " (" + c.key + ")";
}

nlohmann::json check_json(const RewardGateCheck& c) {
  return {{"metric", c.metric}, {"value", c.value}, {"limit", c.limit},
          {"rule", c.at_least ? ">=" : "<="}, {"key", c.key}, {"passed", c.passed}};
}

// The directory of `file` is created first (the step's log directory may not exist yet).
void write_report(const std::filesystem::path& file, const nlohmann::json& report) {
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  io::write_file_atomically(file, report.dump(2) + "\n");
}

std::filesystem::path log_dir_of(const std::string& output_dir) {
  // StepRunner's <dir>_logs, for "out/step3" and "out/step3/" alike.
  std::filesystem::path dir = std::filesystem::path(output_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  return dir.parent_path() / (dir.filename().string() + "_logs");
}

}  // namespace rm_gate

std::vector<RewardGateCheck> reward_gate_checks(const RewardGateConfig& gate, const RewardDiagnostics& d) {
  using rm_gate::kKeyPrefix;
  std::vector<RewardGateCheck> checks = {
      {"accuracy", d.accuracy, gate.min_accuracy, true, std::string(kKeyPrefix) + "min_accuracy"},
      {"length bias", d.length_bias, gate.max_length_bias, false, std::string(kKeyPrefix) + "max_length_bias"},
      {"padding win rate", d.padding.win_rate, gate.max_padding_win_rate, false,
       std::string(kKeyPrefix) + "max_padding_win_rate"}};
  checks[0].passed = d.pairs == 0 || d.accuracy >= gate.min_accuracy;
  checks[1].passed = d.pairs == 0 || d.length_bias <= gate.max_length_bias;
  checks[2].passed = d.padding.pairs == 0 || d.padding.win_rate <= gate.max_padding_win_rate;
  return checks;
}

nlohmann::json RewardGateOutcome::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const RewardGateCheck& c : checks) list.push_back(rm_gate::check_json(c));
  return {{"ran", ran}, {"passed", passed}, {"checks", list}, {"diagnostics", diagnostics.to_json()}};
}

RewardGateOutcome run_reward_gate(const RewardGateConfig& gate, const RewardGateInputs& inputs,
                                  const StepContext& context) {
  using rm_gate::kKeyPrefix;
  RewardGateOutcome outcome;
  if (gate.action == GateAction::kOff) return outcome;
  const bool rank0 = context_rank(context) == 0;
  core::log_info_rank0("reward gate: diagnostics of ", inputs.reward_model, " on step 2's eval split before step 3 (",
                       kKeyPrefix, "action \"", gate_action_name(gate.action), "\")");
  RewardDiagnosticsOptions options = inputs.options;
  options.max_pairs = gate.max_pairs;
  {
    // Loading copies host tensors in and the scores are read back: once, before step 3's setup.
    core::HostSync sync("step setup (models, engines, data)");
    outcome.diagnostics = diagnose_reward_model_on_data(inputs.reward_model, inputs.data,
                                                        inputs.num_padding_at_beginning, options, context,
                                                        inputs.device, inputs.dtype);
  }
  nlohmann::json report = {{"reward_model", inputs.reward_model},
                           {"action", gate_action_name(gate.action)},
                           {"limits",
                            {{"min_accuracy", gate.min_accuracy},
                             {"max_length_bias", gate.max_length_bias},
                             {"max_padding_win_rate", gate.max_padding_win_rate},
                             {"max_pairs", gate.max_pairs}}}};
  if (outcome.diagnostics.pairs == 0) {
    // Nothing to judge: step 2 had no eval pairs either. Not a reason to stop a run.
    core::log_warn("reward gate: step 2's phase-2 eval split is empty; the reward model is not checked");
    report.update(outcome.to_json());
    if (rank0) rm_gate::write_report(inputs.report_file, report);
    return outcome;
  }
  outcome.ran = true;
  outcome.checks = reward_gate_checks(gate, outcome.diagnostics);
  std::string failures;
  for (const RewardGateCheck& c : outcome.checks) {
    if (!c.passed) failures += (failures.empty() ? "" : "; ") + rm_gate::describe(c);
  }
  outcome.passed = failures.empty();
  report.update(outcome.to_json());
  if (rank0) {
    rm_gate::write_report(inputs.report_file, report);
    core::log_info("reward gate:\n", format_reward_diagnostics(outcome.diagnostics), "reward gate: ",
                   outcome.passed ? "passed" : "failed", " (report: ", inputs.report_file.string(), ")");
  }
  if (outcome.passed) return outcome;
  const std::string what = "the reward model " + inputs.reward_model + " fails the reward gate: " + failures +
                           ". The table is in " + inputs.report_file.string() + " (`dschat eval-rm --model " +
                           inputs.reward_model + "` prints it); set a limit's key to override it, or " + kKeyPrefix +
                           "action to \"warn\" or \"off\"";
  if (gate.action == GateAction::kWarn) {
    core::log_warn(what, "; step 3 runs anyway (action \"warn\")");
    return outcome;
  }
  throw core::ConfigError("step 3 refused: " + what);
}

RewardGateOutcome run_reward_gate(const PipelineConfig& config, const StepContext& context) {
  const RewardGateConfig& gate = config.step3.reward_gate;
  if (gate.action == GateAction::kOff) return {};
  const std::string where = "step 3 (reward gate)";
  RewardGateInputs inputs;
  inputs.reward_model = config.step3.critic_model_name_or_path;
  inputs.data = config.step2.data;
  inputs.num_padding_at_beginning = config.step2.num_padding_at_beginning;
  inputs.options.max_seq_len = config.step2.max_seq_len;
  inputs.options.batch_size = config.step2.per_device_eval_batch_size;
  inputs.options.data_seed = config.step2.common.seed;
  inputs.options.clip_reward_value = config.step3.constants.clip_reward_value;
  inputs.report_file = rm_gate::log_dir_of(config.step3.output_dir) / "reward_gate.json";
  inputs.device = step_device(config.step3.common, context, where);
  inputs.dtype = config.step3.common.dtype;
  return run_reward_gate(gate, inputs, context);
}

}  // namespace rlhf
}  // namespace dschat
