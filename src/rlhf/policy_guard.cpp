#include "rlhf/policy_guard.h"

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
    monitor::GuardianVerdict heldout = guardian.observe_heldout(figures.step, heldout_score());
    if (heldout.action > verdict.action) verdict = heldout;
  }
  const monitor::GuardianAction agreed = guard.agree(verdict.action);
  if (agreed < monitor::GuardianAction::kStop) {
    guard.confirm_healthy(figures.step);
    return;
  }
  const std::string cause = verdict.action >= monitor::GuardianAction::kStop ? verdict.cause() : "another rank's verdict";
  throw PolicyAlarm{agreed, figures.step, cause, skipped};
}

void stop_for_guardian(StepRunner& runner, const GuardedRun& guard, const PolicyAlarm& alarm,
                       const StepRunner::SaveFunction& save) {
  const std::string why = alarm.action == monitor::GuardianAction::kStop
                              ? "its action is stop"
                              : "no rollback is left (guardian.max_rollbacks " +
                                    std::to_string(guard.config().max_rollbacks) + ")";
  core::log_warn(runner.name(), ": guardian: stopping at step ", alarm.step, " (", alarm.cause, "; ", why, ")");
  runner.save_checkpoint(save, /*wait=*/true);
  throw monitor::GuardianStop(runner.name() + ": the guardian stopped the run at optimizer step " +
                              std::to_string(alarm.step) + " (" + alarm.cause + "; " + why +
                              "); the checkpoints are in " + runner.checkpoint_dir().string());
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
