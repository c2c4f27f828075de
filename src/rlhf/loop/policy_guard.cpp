#include "rlhf/loop/policy_guard.h"

#include <map>

#include "dschat/core/host_sync.h"
#include "core/log.h"

namespace dschat {
namespace rlhf {

std::optional<data::PromptBatch> heldout_prompt_batch(const data::TokenizedDataset& eval,
                                                      const data::TokenizedDataset& train, int64_t count,
                                                      int64_t pad_token_id, int64_t prompt_length,
                                                      const torch::Device& device) {
  const data::TokenizedDataset& source = eval.size() > 0 ? eval : train;
  const int64_t rows = std::min<int64_t>(count, source.size());
  if (rows <= 0) return std::nullopt;
  std::vector<int64_t> items(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) items[static_cast<size_t>(i)] = i;
  return data::collate_prompts(source, items, pad_token_id, prompt_length).to(device, /*non_blocking=*/false);
}

nlohmann::json policy_position_state(int64_t epoch, int64_t next_batch, int64_t steps_per_epoch, int64_t step,
                                     const GuardedRun& guard, const DataLayout& layout) {
  const bool epoch_done = next_batch >= steps_per_epoch;
  return {{"epoch", epoch_done ? epoch + 1 : epoch},
          {"batch", epoch_done ? 0 : next_batch},
          {data_layout_key(), layout.to_json()},
          {"step", step},
          {"guardian", guard.guardian().state()}};
}

std::optional<data::PromptBatch> start_policy_guard(GuardedRun& guard, int64_t step,
                                                    const std::function<void(bool confirmed)>& snapshot,
                                                    const data::PhaseData& phase, int64_t pad_token_id,
                                                    int64_t prompt_length, const torch::Device& device) {
  guard.set_confirmation_lag(1);  // a step's figures judge the weights of the step before
  if (guard.snapshot_due(step)) snapshot(/*confirmed=*/true);
  const monitor::GuardianConfig& c = guard.config();
  if (!c.enabled || c.heldout_interval <= 0) return std::nullopt;
  return heldout_prompt_batch(phase.eval, phase.train, c.heldout_prompts, pad_token_id, prompt_length, device);
}

void heldout_baseline(GuardedRun& guard, int64_t step, const std::function<double()>& heldout_score) {
  if (!guard.enabled() || !heldout_score || guard.config().heldout_interval <= 0) return;
  core::HostSync sync("evaluation (perplexity / reward accuracy)");
  guard.guardian().observe_heldout(step, heldout_score());
}

double repeated_answer_share(const std::vector<std::string>& answers) {
  if (answers.size() < 2) return 0.0;
  std::map<std::string, int64_t> counts;
  for (const std::string& a : answers) ++counts[a];
  int64_t repeated = 0;
  for (const auto& [answer, count] : counts) {
    if (count > 1) repeated += count;
  }
  return static_cast<double>(repeated) / static_cast<double>(answers.size());
}

void check_policy_step(GuardedRun& guard, const monitor::StepFigures& figures,
                       const std::function<double()>& heldout_score, const nlohmann::json& skipped) {
  monitor::Guardian& guardian = guard.guardian();
  monitor::GuardianVerdict verdict = guardian.observe(figures);
  const int64_t interval = guardian.config().heldout_interval;
  if (guardian.enabled() && heldout_score && interval > 0 && figures.step % interval == 0) {
    core::HostSync sync("evaluation (perplexity / reward accuracy)");
    monitor::GuardianVerdict heldout = guardian.observe_heldout(figures.step, heldout_score());  // draws nothing
    if (heldout.action > verdict.action) verdict = heldout;
  }
  const monitor::GuardianAction agreed = guard.agree(verdict.action);
  if (agreed < monitor::GuardianAction::kStop) {
    guard.confirm_healthy(figures.step);
    return;
  }
  const std::string cause = verdict.action >= monitor::GuardianAction::kStop ? verdict.cause() : "another rank's verdict";
  throw GuardianAlarm{agreed, figures.step, cause, skipped};
}

void stop_for_guardian(StepRunner& runner, const GuardedRun& guard, const GuardianAlarm& alarm,
                       const StepRunner::SaveFunction& save) {
  const std::string why = alarm.action == monitor::GuardianAction::kStop
                              ? "its action is stop"
                              : "no rollback is left (guardian.max_rollbacks " +
                                    std::to_string(guard.config().max_rollbacks) + ")";
  core::log_warn(runner.name(), ": guardian: stopping at step ", alarm.step, " (", alarm.cause, "; ", why, ")");
  if (save) runner.save_checkpoint(save, /*wait=*/true);
  throw monitor::GuardianStop(runner.name() + ": the guardian stopped the run at optimizer step " +
                              std::to_string(alarm.step) + " (" + alarm.cause + "; " + why +
                              "); the checkpoints are in " + runner.checkpoint_dir().string());
}

void answer_guardian_alarm(const GuardianAlarm& alarm, GuardedRun& guard, StepRunner& runner,
                         const GuardedRun::LoadSnapshot& load, const std::vector<engine::TrainingEngine*>& engines,
                         const StepRunner::SaveFunction& save_here, uint64_t seed) {
  const bool rolled_back = alarm.action == monitor::GuardianAction::kRollback &&
                           guard.roll_back(alarm.step, alarm.cause, alarm.skipped, load, engines);
  if (!rolled_back) stop_for_guardian(runner, guard, alarm, save_here);
  runner.supersede_checkpoints_after(engines.front()->global_steps());
  if (guard.config().reseed) torch::manual_seed(seed + guard.guardian().seed_offset());
}

bool skipped_prompt_batch(const monitor::Guardian& guardian, int64_t epoch, int64_t batch) {
  for (const nlohmann::json& w : guardian.skipped_data()) {
    if (w.value("epoch", int64_t{-1}) == epoch && batch >= w.value("begin", int64_t{0}) &&
        batch < w.value("end", int64_t{0})) {
      return true;
    }
  }
  return false;
}

}  // namespace rlhf
}  // namespace dschat
