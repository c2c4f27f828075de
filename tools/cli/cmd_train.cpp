// `dschat train` (the three steps; with no arguments the embedded demo), `dschat sft|rm|ppo|dpo|grpo
// --config F` (one step from a config file in the `dschat train` format), `dschat eval-rm`.
// Ctrl-C stops a step after saving a checkpoint (main exits with 130); rerunning resumes it.
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

#include "app/demo_report.h"
#include "app/plan_command.h"
#include "app/train_command.h"
#include "commands.h"
#include "model_flags.h"
#include "train_flags.h"
#include "dschat/core/logging.h"
#include "dschat/core/error.h"
#include "dschat/plan/step_overview.h"
#include "dschat/rlhf/trainers/pipeline.h"
#include "dschat/rlhf/trainers/ppo_trainer.h"
#include "dschat/rlhf/rewards/reward_diagnostics.h"
#include "dschat/rlhf/trainers/reward_trainer.h"
#include "dschat/rlhf/trainers/sft_trainer.h"

namespace dschat {
namespace cli {
namespace {

rlhf::StepContext make_context(const TrainFlags& flags, const rlhf::PipelineConfig& config) {
  rlhf::StepContext context;
  context.local_rank = app::launcher_local_rank();
  context.communicator = app::communicator_from_environment(app::pipeline_device(config),
                                                            std::chrono::seconds(config.collective_timeout_seconds));
  context.random_init = config.init == "random";
  context.tokenizer_dir = config.tokenizer;
  context.stop_requested = app::install_stop_signal_handler();
  context.progress = !flags.no_progress;
  context.resume_from = flags.resume_from;
  return context;
}

bool is_rank0(const rlhf::StepContext& context) {
  return !context.communicator || context.communicator->rank() == 0;
}

// The memory plan before anything is loaded: a step that will not fit stops the run here (unless
// --skip-plan), with the plan's table and the changes that make it fit. Null when a model's shape
// is unknown (then nothing is checked).
std::optional<plan::PipelinePlan> check_plan(const rlhf::PipelineConfig& config, bool refuse) {
  app::HardwareFlags hardware;
  hardware.count_rows = false;  // the fit, not the time: the datasets are read by the steps
  plan::PipelinePlan plan;
  try {
    plan = app::plan_for(config, hardware);
  } catch (const core::NotFound& e) {
    core::log_message(core::LogLevel::Warn, std::string("memory plan skipped: ") + e.what());
    return std::nullopt;
  } catch (const core::Error& e) {
    if (refuse) throw;
    // --skip-plan: the plan only feeds the step tables then, and must not stop the run.
    core::log_message(core::LogLevel::Warn, std::string("memory plan skipped: ") + e.what());
    return std::nullopt;
  }
  if (plan.fits() || !refuse) return plan;
  if (app::launcher_local_rank() <= 0) std::cerr << plan::format_plan(plan) << std::flush;
  std::string failing;
  for (const plan::StepPlan& step : plan.steps) {
    if (!step.fits) failing += (failing.empty() ? "" : "; ") + ("step" + std::to_string(step.step)) + ": " + step.why_not;
  }
  throw core::ConfigError("the memory plan says this run will not fit (" + failing +
                          "); nothing was loaded. The table and the changes that make it fit are above "
                          "(`dschat plan` prints them again); --skip-plan runs it anyway");
}

// Each step's start-of-run table (plan::step_overview), by step number: logged as the step starts
// and kept in its training_summary.json; --dry-run prints them.
std::map<int, plan::StepOverview> step_overviews(const plan::PipelinePlan& plan, const rlhf::PipelineConfig& config) {
  std::map<int, plan::StepOverview> overviews;
  for (const plan::StepPlan& step : plan.steps) {
    const auto& device = config.common_of(step.step).resolved_device;  // plan_train resolves every step's
    overviews[step.step] = plan::step_overview(step, plan.options.hardware, device ? device->str() : "auto");
  }
  return overviews;
}

void run_train(const TrainFlags& flags) {
  const app::TrainPlan plan = app::plan_train(flags.resolved(), DSCHAT_SOURCE_DIR);
  if (flags.dry_run) {
    std::cout << app::describe_plan(plan);
    if (const auto memory_plan = check_plan(plan.config, /*refuse=*/false)) {
      for (const auto& [step, overview] : step_overviews(*memory_plan, plan.config)) std::cout << "\n" << overview.text;
    }
    std::cout << std::flush;
    return;
  }
  const std::optional<plan::PipelinePlan> memory_plan = check_plan(plan.config, !flags.skip_plan);
  rlhf::StepContext context = make_context(flags, plan.config);
  if (memory_plan) {
    for (const auto& [step, overview] : step_overviews(*memory_plan, plan.config)) {
      context.step_overviews[step] = {overview.text, overview.json};
    }
  }
  const rlhf::PipelineResult result = rlhf::run_pipeline(plan.config, context);  // Interrupted: main exits 130
  // The table compares SFT with the RL step's model on the task: not for the DPO pipeline.
  if (!plan.demo || !is_rank0(context) || plan.config.dpo()) return;
  // Only once every step of the pipeline has finished.
  const std::vector<const char*> steps =
      plan.config.critic_free() ? std::vector<const char*>{"step1", "step2"} : std::vector<const char*>{"step1", "step2", "step3"};
  for (const char* step : steps) {
    if (!result.summaries.contains(step)) {
      std::cout << "(no demo table: " << step << " has not run; it compares the SFT and RL models)\n";
      return;
    }
  }
  std::cout << app::format_demo_report(app::evaluate_demo(plan.config, result, plan.demo_eval_file)) << std::flush;
}

// `dschat sft|rm|ppo|dpo|grpo`: the pipeline with only that step (dpo, grpo: step 2 of their pipelines).
void add_step_command(CLI::App& app, const std::string& name, int step, const std::string& help) {
  auto f = std::make_shared<TrainFlags>();
  auto* cmd = app.add_subcommand(name, help);
  add_common_flags(*cmd, *f);
  cmd->add_option("--actor", f->actor, "Actor model (step 1's input; step 3 uses <out>/actor unless set)");
  cmd->add_option("--reward", f->reward, "Reward model (step 2's input)");
  cmd->add_option("--deployment", f->deployment, "single_gpu | single_node | multi_node (selects the preset)");
  cmd->callback([f, step, name] {
    TrainFlags flags = *f;
    flags.args.steps = {step};
    if (name == "dpo") flags.pipeline = "sft-dpo";
    flags.args.critic_free_step = name == "grpo";
    if (flags.config_file.empty() && flags.actor.empty() && flags.reward.empty() && flags.deployment.empty()) {
      throw core::InvalidArgument("dschat step commands need --config F, or --actor/--reward/--deployment to pick a "
                                  "preset (`dschat train` with no arguments runs the demo)");
    }
    run_train(flags);
  });
}

struct EvalRmFlags {
  std::string model, tokenizer, device = "auto";
  rlhf::DataConfig data;
  int64_t max_seq_len = 512, batch_size = 16;
  std::optional<int64_t> num_padding_at_beginning;
  rlhf::RewardDiagnosticsOptions diagnostics;
  std::string json;  // "" : none; "-" : stdout, after the table
};

// `dschat eval-rm`: DS-Chat's evaluation line (what scripts grep), then the diagnostics table.
void run_eval_rm(const EvalRmFlags& e) {
  rlhf::StepContext context;
  context.local_rank = app::launcher_local_rank();
  const torch::Device device = core::resolve_device(e.device, "--device", context.local_rank);
  context.communicator = app::communicator_from_environment(device);
  context.tokenizer_dir = e.tokenizer;
  rlhf::RewardDiagnosticsOptions options = e.diagnostics;
  options.max_seq_len = e.max_seq_len;
  options.batch_size = e.batch_size;
  const rlhf::RewardDiagnostics d =
      rlhf::diagnose_reward_model_on_data(e.model, e.data, e.num_padding_at_beginning, options, context, device);
  if (d.pairs == 0) throw core::InvalidArgument(e.model + ": the data's phase-2 eval split is empty");
  if (!is_rank0(context)) return;
  std::cout << "pairs: " << d.pairs << ", chosen_last_scores (higher is better) : " << d.chosen_score
            << ", rejected_last_scores (lower is better) : " << d.rejected_score
            << ", acc (higher is better) : " << d.accuracy << "\n"
            << rlhf::format_reward_diagnostics(d);
  if (e.json == "-") {
    std::cout << d.to_json().dump(2) << "\n";
  } else if (!e.json.empty()) {
    std::ofstream file(e.json);
    file << d.to_json().dump(2) << "\n";
    if (!file) throw core::IoError(e.json + ": cannot write the diagnostics JSON");
  }
  std::cout << std::flush;
}

}  // namespace

void add_common_flags(CLI::App& cmd, TrainFlags& f) {
  cmd.add_option("--config", f.config_file, "JSON config in the `dschat train` format (docs/config.md)");
  cmd.add_option("--output-dir", f.output_dir, "Where the models, checkpoints and logs go");
  cmd.add_option("--collective-timeout", f.args.collective_timeout_seconds,
                 "Seconds a rank waits in a collective for the others before the job fails naming the rank "
                 "that stopped (default 300; the config's collective_timeout_seconds)")
      ->check(CLI::Range(int64_t{1}, int64_t{86400}));
  cmd.add_option("--init", f.init, "'random': base models with random weights (real shapes, no download)");
  cmd.add_option("--tokenizer", f.tokenizer, "Tokenizer directory (default: the model's)");
  cmd.add_option("--data-path", f.args.data_path, "Datasets (names, local/jsonfile[:DIR], files)");
  cmd.add_flag("--no-progress", f.no_progress, "Plain log lines instead of a progress bar");
  cmd.add_flag("--dry-run", f.dry_run, "Print each step's device, dtype and model and the table of its models (the memory plan), then exit "
               "without training");
  cmd.add_option("--device", f.device, std::string(kDeviceHelp) + "; replaces every step's \"device\"");
  cmd.add_flag("--skip-plan", f.skip_plan,
               "Do not stop before loading when `dschat plan` says a step will not fit in memory");
  cmd.add_option("--save-format", f.save_format,
                 "Weights file of the saved models: safetensors (model.safetensors, default) or bin "
                 "(pytorch_model.bin, what DeepSpeed-Chat's own steps load); replaces every step's \"save_format\"")
      ->check(CLI::IsMember({"safetensors", "bin"}));
  cmd.add_option("--resume-from", f.resume_from,
                 "Checkpoint tag (global_step<N>) the first unfinished step resumes from, instead of its newest "
                 "intact one; later tags are moved aside as <tag>.superseded");
}

void add_train_commands(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  auto* cmd = app.add_subcommand(
      "train", "SFT, reward model and PPO in sequence (no arguments: the embedded CPU demo, a few minutes)");
  add_common_flags(*cmd, *f);
  cmd->add_option("--actor", f->actor, "Actor model: directory, cached HF id or short name (opt-1.3b)");
  cmd->add_option("--reward", f->reward, "Reward model (opt-350m)");
  cmd->add_option("--deployment", f->deployment, "single_gpu | single_node | multi_node")
      ->check(CLI::IsMember({"single_gpu", "single_node", "multi_node"}));
  cmd->add_option("--step", f->args.steps, "Steps to run, in order (default 1 2 3)")->check(CLI::Range(1, 3));
  cmd->add_option("--pipeline", f->pipeline,
                  "sft-rm-ppo (default: DeepSpeed-Chat's three steps), sft-dpo (step 1, then DPO as step 2), or "
                  "sft-grpo | sft-rloo | sft-reinforce_pp (step 1, then critic-free RL as step 2)");
  cmd->callback([f] { run_train(*f); });
  add_step_command(app, "sft", 1, "Step 1 only: supervised fine-tuning of the actor");
  add_step_command(app, "rm", 2, "Step 2 only: reward model");
  add_step_command(app, "ppo", 3, "Step 3 only: PPO (actor, reference, critic, reward)");
  add_step_command(app, "dpo", 2,
                   "DPO only (DeepSpeed-Chat's step2_dpo_finetuning): the \"step2_dpo\" block, from step 1's model");
  add_step_command(app, "grpo", 2,
                   "Critic-free RL only (GRPO, RLOO or REINFORCE++, the \"step2_grpo\" block's advantage_estimator) "
                   "with reward-model, verifier, program or callback rewards, from step 1's model");

  auto e = std::make_shared<EvalRmFlags>();
  auto* eval = app.add_subcommand(
      "eval-rm", "Reward-model accuracy, mean scores and diagnostics (length bias, calibration, clipping, padding and "
                 "truncation probes) on a dataset's phase-2 eval split");
  eval->add_option("--model", e->model, "Reward model directory (rwtransformer.* + v_head.weight)")->required();
  eval->add_option("--data-path", e->data.data_path, "Datasets (default Dahoas/rm-static)");
  eval->add_option("--data-split", e->data.data_split, "DeepSpeed-Chat's phase split")->capture_default_str();
  eval->add_option("--local-jsonfile-dir", e->data.local_jsonfile_dir, "What local/jsonfile reads");
  eval->add_option("--tokenizer", e->tokenizer, "Tokenizer directory (default: the model's)");
  add_device_flag(*eval, e->device);
  eval->add_option("--max-seq-len", e->max_seq_len, "Tokens per answer")->capture_default_str();
  eval->add_option("--batch-size", e->batch_size, "Pairs per batch")->capture_default_str();
  eval->add_option("--num-padding-at-beginning", e->num_padding_at_beginning,
                   "DS-Chat's value (default: derived from the tokenizer)");
  eval->add_option("--json", e->json, "Also write the diagnostics as JSON to this file ('-': stdout, after the table)");
  eval->add_option("--clip-reward-value", e->diagnostics.clip_reward_value,
                   "PPO's clip_reward_value: the table reports the share of scores beyond it")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  eval->add_option("--filler", e->diagnostics.filler, "The padding probe's filler text, inserted before the eos")
      ->capture_default_str();
  eval->add_option("--filler-ratio", e->diagnostics.filler_ratio,
                   "Filler tokens added per answer token by the padding probe")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--max-pairs", e->diagnostics.max_pairs, "Evaluate only the split's first N pairs (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  eval->callback([e] { run_eval_rm(*e); });
}

}  // namespace cli
}  // namespace dschat
