#pragma once
// What a trainer needs to act on the guardian's verdicts (monitor/guardian.h): snapshots of a
// healthy state, the rollback to the last one, and the ranks agreeing on every decision.
//
// A snapshot is an engine checkpoint (every engine a step trains, through the trainer's save
// function) written synchronously to <output>_guardian/guardian_step<N>, replacing the previous
// one; a rollback loads it back (the trainer's load function, which also moves its data position
// back), then scales every engine's learning rates to the guardian's multiplier. The figures the
// guardian sees are all-reduced means, so every rank reaches the same verdict; agree() makes sure
// of it with one all-reduce (max) of the action, so all ranks roll back or stop together.
//
//   GuardedRun guard(config.common.guardian, "step 1 (SFT)", runner, &metrics, communicator);
//   if (guard.snapshot_due(step)) guard.take_snapshot(step, save_all_engines);
//   if (guard.agree(verdict.action) == GuardianAction::kRollback)
//     guard.roll_back(step, verdict.cause(), data_position, load_all_engines, {&engine});
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/dist/process_group.h"
#include "dschat/engine/training_engine.h"
#include "dschat/monitor/guardian.h"
#include "dschat/rlhf/setup/step_runner.h"

namespace dschat {
namespace rlhf {

class GuardedRun {
 public:
  /// Snapshots go to <runner's output>_guardian (removed by finish()).
  GuardedRun(const monitor::GuardianConfig& config, const std::string& name, const StepRunner& runner,
             monitor::MetricsLog* metrics, std::shared_ptr<dist::Communicator> communicator);

  monitor::Guardian& guardian() { return guardian_; }
  const monitor::Guardian& guardian() const { return guardian_; }
  const monitor::GuardianConfig& config() const { return guardian_.config(); }
  bool enabled() const { return guardian_.enabled(); }
  /// Whether the guardian looks at the weights after each step (its non_finite signal is on).
  bool checks_weights() const {
    return guardian_.enabled() && guardian_.config().non_finite.action != monitor::GuardianAction::kOff;
  }

  /// Collective: the means of `values` over the ranks (as they are in a world of one).
  std::vector<double> mean_over_ranks(std::vector<double> values) const;
  /// Collective: the most severe of the ranks' actions.
  monitor::GuardianAction agree(monitor::GuardianAction local) const;

  /// Whether a snapshot should be taken after `step`: rollback is some signal's action and there
  /// is none yet, or `step` is a multiple of snapshot_interval. Call only for healthy steps.
  bool snapshot_due(int64_t step) const;
  /// How many more healthy steps a snapshot needs before a rollback may return to it. 0 (the
  /// supervised loop): a step's figures judge the weights it started from, so a snapshot taken
  /// after a healthy step is healthy. 1 (the policy loops): step s's KL, entropy and answers come
  /// from the experience the weights after step s-1 generated, so the snapshot of step s-1 is
  /// trusted only once step s looked healthy.
  void set_confirmation_lag(int64_t steps) { confirmation_lag_ = steps; }
  /// Collective like agree(): every step the ranks agreed was healthy.
  void confirm_healthy(int64_t step);
  /// Writes a checkpoint of every engine into (dir, tag); the dir is the snapshot directory or a
  /// part of it (the trainer's choice, e.g. dir / "actor").
  using SaveSnapshot = std::function<void(const std::filesystem::path& dir, const std::string& tag)>;
  /// Restores every engine from (dir, tag) and moves the trainer's data position back.
  using LoadSnapshot = std::function<void(const std::filesystem::path& dir, const std::string& tag)>;
  /// Collective: writes the snapshot of `step` (trusted at once when `confirmed`, e.g. the state
  /// a run starts from; otherwise after the confirmation lag) and removes those it supersedes.
  void take_snapshot(int64_t step, const SaveSnapshot& save, bool confirmed = false);
  /// Whether there is a snapshot a rollback may return to, and its step (-1: none).
  bool has_snapshot() const { return snapshot_step() >= 0; }
  int64_t snapshot_step() const;

  /// Collective: a rollback from `from_step` (the step whose verdict asked for it, blamed on
  /// `cause`) to the last snapshot. `skipped` is the offending step's data position (the
  /// trainer's JSON; null when there is nothing to skip). Returns false, touching nothing, when
  /// there is no snapshot or max_rollbacks are used up: the trainer stops instead.
  bool roll_back(int64_t from_step, const std::string& cause, const nlohmann::json& skipped, const LoadSnapshot& load,
                 const std::vector<engine::TrainingEngine*>& engines);

  /// Removes the snapshots (rank 0; collective).
  void finish();

  const std::filesystem::path& snapshot_dir() const { return dir_; }

 private:
  struct Snapshot {
    int64_t step = 0;
    double lr_multiplier = 1.0;  // the guardian's multiplier when it was taken
    bool confirmed = false;      // a rollback may return to it
  };
  std::string tag_of(int64_t step) const { return "guardian_step" + std::to_string(step); }
  // Keeps the newest confirmed snapshot and the unconfirmed ones after it (rank 0 deletes the
  // rest; the caller's collective follows). `keep_unconfirmed` false: the unconfirmed ones go too.
  void prune(bool keep_unconfirmed);

  monitor::Guardian guardian_;
  std::string name_;
  std::filesystem::path dir_;
  std::shared_ptr<dist::Communicator> communicator_;
  std::vector<Snapshot> snapshots_;  // oldest first
  int64_t confirmation_lag_ = 0;
};

}  // namespace rlhf
}  // namespace dschat
