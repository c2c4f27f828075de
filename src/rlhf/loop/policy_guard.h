#pragma once
// The guardian's part in the policy loops (step 3's PPO and the critic-free step): checking a
// step's figures and, every heldout_interval steps, the held-out check (greedy answers to fixed
// prompts, scored by the reward model or a named verifier); a stop or rollback leaves the step
// as a GuardianAlarm that the trainer's outer loop catches, where it restores the snapshot or stops.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/data/collate.h"
#include "dschat/data/prompt_dataset.h"
#include "dschat/data/tokenized_dataset.h"
#include "dschat/monitor/guardian.h"
#include "dschat/rlhf/loop/guarded_run.h"
#include "rlhf/setup/data_layout.h"

namespace dschat {
namespace rlhf {

/// The guardian asked to stop or roll back after `step` (thrown by the step's check, caught by
/// the trainer's outer loop).
struct GuardianAlarm {
  monitor::GuardianAction action = monitor::GuardianAction::kOff;
  int64_t step = 0;
  std::string cause;
  nlohmann::json skipped;  // the step's batches (prompt or micro-batches): {"epoch", "begin", "end"}
};

/// The held-out prompts: the first `count` of the eval split (of train when eval is empty), the
/// same on every rank; nullopt when count is 0 or there are none.
std::optional<data::PromptBatch> heldout_prompt_batch(const data::TokenizedDataset& eval,
                                                      const data::TokenizedDataset& train, int64_t count,
                                                      int64_t pad_token_id, int64_t prompt_length,
                                                      const torch::Device& device);

/// A policy loop's checkpoint keys for the position after prompt batch `next_batch - 1` of
/// `epoch` ({"epoch", "batch"}: the next epoch's start after its last batch), the prompt-batch
/// layout "batch" counts in (rlhf/setup/data_layout.h), "step" and the guardian's state; the trainer
/// adds its own keys.
nlohmann::json policy_position_state(int64_t epoch, int64_t next_batch, int64_t steps_per_epoch, int64_t step,
                                     const GuardedRun& guard, const DataLayout& layout);

/// Starts the guard of a policy loop at `step` (0, or a resumed step): a confirmation lag of one
/// step, the first snapshot (`snapshot(true)`: the state the run starts from is trusted), and the
/// held-out prompts when the held-out check is on (nullopt otherwise).
std::optional<data::PromptBatch> start_policy_guard(GuardedRun& guard, int64_t step,
                                                    const std::function<void(bool confirmed)>& snapshot,
                                                    const data::PhaseData& phase, int64_t pad_token_id,
                                                    int64_t prompt_length, const torch::Device& device);

/// The held-out check of the weights the run starts from (at `step`), the baseline the first trend
/// is measured from; nothing without a held-out check. Collective (it generates).
void heldout_baseline(GuardedRun& guard, int64_t step, const std::function<double()>& heldout_score);

/// Share of `answers` that another answer of the list equals (0 for fewer than two).
double repeated_answer_share(const std::vector<std::string>& answers);

/// Collective. Observes `figures` and, when the step is a multiple of heldout_interval and
/// `heldout_score` is set, the held-out check; the ranks agree on the action. Throws GuardianAlarm
/// for a stop or rollback.
void check_policy_step(GuardedRun& guard, const monitor::StepFigures& figures,
                       const std::function<double()>& heldout_score, const nlohmann::json& skipped);

/// After a stop (asked, or a rollback that could not be made): saves a checkpoint with `save`
/// (waiting for it; none when `save` is empty, e.g. inside an accumulation window) and throws
/// monitor::GuardianStop naming the step, the signal and why.
[[noreturn]] void stop_for_guardian(StepRunner& runner, const GuardedRun& guard, const GuardianAlarm& alarm,
                                    const StepRunner::SaveFunction& save);

/// A loop's answer to an alarm (the supervised loop's and the policy loops'): a rollback (`load` restores the models and the position;
/// `engines`, the first the checkpoint's primary, get the lowered learning rate; the checkpoints
/// saved after the snapshot are superseded and the seeds redrawn from `seed`), or, for a stop or
/// when no rollback can be made, stop_for_guardian with `save_here`.
void answer_guardian_alarm(const GuardianAlarm& alarm, GuardedRun& guard, StepRunner& runner,
                         const GuardedRun::LoadSnapshot& load, const std::vector<engine::TrainingEngine*>& engines,
                         const StepRunner::SaveFunction& save_here, uint64_t seed);

/// Whether a rollback asked to skip batch `batch` of `epoch` (a prompt batch of the policy loops,
/// a micro-batch of the supervised loop): the {"epoch", "begin", "end"} ranges it recorded.
bool skipped_prompt_batch(const monitor::Guardian& guardian, int64_t epoch, int64_t batch);

}  // namespace rlhf
}  // namespace dschat
