#include "dschat/rlhf/trainers/pipeline.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "core/log.h"
#include "dschat/monitor/guardian.h"
#include "dschat/rlhf/trainers/critic_free_trainer.h"
#include "dschat/rlhf/trainers/dpo_trainer.h"
#include "dschat/rlhf/setup/output_gate.h"
#include "dschat/rlhf/trainers/ppo_trainer.h"
#include "dschat/rlhf/rewards/reward_gate.h"
#include "dschat/rlhf/trainers/reward_trainer.h"
#include "dschat/rlhf/trainers/sft_trainer.h"
#include "dschat/rlhf/setup/step_runner.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

using Clock = std::chrono::steady_clock;

std::string step_output(const PipelineConfig& config, int step) { return config.output_of(step); }

// e2e_rlhf.py's verify_model: step 3 needs the step-1 and step-2 models.
void require_model(const std::string& dir, int step) {
  DSCHAT_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "config.json"), NotFound, "step 3 needs the step-",
               step, " model in ", dir, ", which does not exist; run `dschat train --step ", step,
               "` first (or set step3.", step == 1 ? "actor" : "critic", "_model_name_or_path)");
}

}  // namespace

std::string format_hms(double seconds) {
  const auto total = static_cast<long long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof(text), "%lld:%02lld:%02lld", total / 3600, (total / 60) % 60, total % 60);
  return text;
}

namespace {

// Runs step `step` of the pipeline; its summary goes to result.summaries["step<N>"].
void run_step(const PipelineConfig& config, int step, StepContext& context, PipelineResult& result) {
  const std::string key = "step" + std::to_string(step);
  // A step 2 that starts from step 1's trained model (the demo's reward model, DPO's policy and
  // reference, the critic-free actor) loads its weights, not random ones.
  if (step == 2 && config.model_of(step) == config.step1.output_dir) context.random_init = false;
  switch (config.kind_of(step)) {
    case StepKind::kSft:
      result.summaries[key] = run_sft(config.step1, context).to_json();
      break;
    case StepKind::kDpo:
      result.summaries[key] = run_dpo(config.step2_dpo, context).to_json();
      break;
    case StepKind::kCriticFree:
      result.summaries[key] = run_grpo(config.step2_grpo, context).to_json();
      break;
    case StepKind::kRewardModel:
      result.summaries[key] = run_reward(config.step2, context).to_json();
      break;
    case StepKind::kPpo:
      require_model(config.step3.actor_model_name_or_path, 1);
      require_model(config.step3.critic_model_name_or_path, 2);
      context.random_init = false;  // step 3 starts from the trained models
      // Before PPO learns to exploit the reward model: refuses (or warns) by step3.reward_gate.
      run_reward_gate(config, context);
      result.summaries[key] = run_ppo(config.step3, context).to_json();
      break;
  }
}

}  // namespace

PipelineResult run_pipeline(const PipelineConfig& config, const StepContext& context) {
  const auto start = Clock::now();
  PipelineResult result;
  std::vector<int> ran;
  for (int step : config.steps) {
    const std::string key = "step" + std::to_string(step);
    const std::string output = step_output(config, step);
    if (auto summary = finished_step_summary(output)) {
      core::log_info("---=== Step ", step, " already finished (", output, "); skipped ===---");
      result.summaries[key] = *summary;
      result.skipped.push_back(step);
      continue;
    }
    core::log_info("---=== Running Step ", step, " ===---");
    const auto step_start = Clock::now();
    StepContext step_context = context;
    if (!ran.empty()) step_context.resume_from.clear();  // --resume-from names the first step's tag
    if (auto overview = context.step_overviews.find(step); overview != context.step_overviews.end()) {
      step_context.run_overview = overview->second.json;
      if (context_rank(context) == 0) {
        std::istringstream lines(overview->second.text);
        for (std::string line; std::getline(lines, line);) core::log_info(line);
      }
    }
    try {
      run_step(config, step, step_context, result);
      if (!step_context.run_overview.is_null()) result.summaries[key]["run_overview"] = step_context.run_overview;
    } catch (const Interrupted&) {
      throw;  // these three messages already say where the run resumes, or which checkpoints stay
    } catch (const StepFailed&) {
      throw;
    } catch (const monitor::GuardianStop&) {
      throw;
    } catch (const std::exception& e) {
      // Every rank says which step failed and what it can resume from (a lost rank's collective
      // error names the rank; this names the phase and the checkpoint).
      core::log_error(key, " (", step_kind_name(config.kind_of(step)), ") failed: ", e.what(), "; ", checkpoint_note(output),
                      "; the same command resumes from there");
      throw;
    }
    ran.push_back(step);
    core::log_info("---=== Finished Step ", step, " in ",
                   format_hms(std::chrono::duration<double>(Clock::now() - step_start).count()), " ===---");
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (ran.size() > 1) {
    std::string list;
    for (int s : ran) list += (list.empty() ? "" : ", ") + std::to_string(s);
    core::log_info("---=== Finished Steps [", list, "] in ", format_hms(result.seconds), " ===---");
  }
  return result;
}

}  // namespace rlhf
}  // namespace dschat
