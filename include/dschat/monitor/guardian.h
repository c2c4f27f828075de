#pragma once
// The training-health guardian: every trainer hands it the figures of each optimizer step (all
// ranks' means, so every rank decides alike) and it answers what to do. Signals (each with its
// threshold and action in GuardianConfig, docs/guardian.md):
//   non_finite        the loss or the gradient norm is NaN/Inf
//   loss_spike        the step's loss is above `factor` x the median of the last `window` steps
//                     and at least `min_increase` above it (small losses are noisy in ratio)
//   kl                the KL to the reference (nats per token) is above `limit`
//   kl_growth         the KL rises faster than `limit` per step (least-squares slope over `window`)
//   entropy           the policy's mean token entropy (nats) fell below `floor`
//   answer_length     mean answer length stuck near the shortest allowed answer or at the maximum
//   repeated_answers  more than `share` of the prompts got an answer another prompt also got
//   reward_hacking    the training reward rose by more than `min_rise` over the last `window`
//                     held-out checks while the held-out score fell by more than `min_drop`
// Actions: warn (logged once when the condition starts, again only after it cleared), stop (the
// trainer saves a checkpoint and ends with GuardianStop), rollback (the trainer restores the last
// healthy snapshot, lowers the learning rate, skips or retries the offending batches, reseeds, and
// goes on; after max_rollbacks, a stop). Every event goes to the console (rank 0), the metrics
// JSON Lines and TensorBoard (phase "guardian").
//
// The guardian is pure bookkeeping: it never touches an engine. rlhf::GuardedRun does the
// snapshots and the restore.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/core/error.h"

namespace dschat {
namespace monitor {

class MetricsLog;

/// Ordered by severity: a step's verdict is its most severe fired signal's action.
enum class GuardianAction { kOff = 0, kWarn = 1, kStop = 2, kRollback = 3 };

const char* action_name(GuardianAction action);
/// "off" | "warn" | "stop" | "rollback"; throws core::ConfigError naming `where` otherwise.
GuardianAction parse_action(const std::string& name, const std::string& where);

struct GuardianRule {
  GuardianAction action = GuardianAction::kWarn;
  double threshold = 0.0;  // the signal's limit, factor, floor, share or rise (see the file comment)
  int64_t window = 0;      // steps (or held-out checks) looked back over; 0 where unused
};

struct GuardianConfig {
  bool enabled = true;
  /// Optimizer steps between snapshots of a healthy state (taken only when some signal's action
  /// is rollback); the snapshot is the engine checkpoint written to <output>_guardian.
  int64_t snapshot_interval = 50;
  int64_t max_rollbacks = 3;
  double lr_factor = 0.5;          // learning rates are multiplied by this on every rollback
  std::string batches = "skip";    // skip | retry: the offending step's batches after a rollback
  bool reseed = true;              // draw new random seeds (sampling, dropout) after a rollback
  GuardianRule non_finite{GuardianAction::kRollback, 0.0, 0};
  GuardianRule loss_spike{GuardianAction::kRollback, 5.0, 20};
  int64_t loss_spike_min_steps = 10;  // steps of history before loss_spike is armed
  double loss_spike_min_increase = 1.0;  // nats above the median, whatever the ratio
  GuardianRule kl{GuardianAction::kRollback, 10.0, 0};
  GuardianRule kl_growth{GuardianAction::kWarn, 0.5, 10};
  GuardianRule entropy{GuardianAction::kWarn, 0.05, 0};
  GuardianRule answer_length{GuardianAction::kWarn, 0.5, 0};  // threshold: tokens of margin
  GuardianRule repeated_answers{GuardianAction::kWarn, 0.8, 0};
  GuardianRule reward_hacking{GuardianAction::kWarn, 0.1, 4};  // threshold: min_rise (reward units)
  double reward_hacking_min_drop = 0.1;  // held-out score units
  /// Optimizer steps between held-out checks (0: none; the trainers that have one say so).
  int64_t heldout_interval = 10;
  int64_t heldout_prompts = 16;
  /// The critic-free step's held-out scorer: the name of one of its reward sources (a verifier,
  /// possibly with weight 0); "": the weighted reward itself. Step 3 scores with its reward model.
  std::string heldout_source;

  /// Whether any signal rolls back (then snapshots are kept).
  bool wants_snapshots() const;
};

/// What one optimizer step looked like (all ranks' means). Unset figures are not checked.
struct StepFigures {
  int64_t step = 0;
  std::optional<double> loss;
  std::optional<double> grad_norm;  // < 0 or non-finite: the engine saw non-finite gradients
  /// NaN/Inf values among the weights right after the step's update (the engine's
  /// non_finite_weight_count: the parameters this rank's optimizer updates); > 0 fires non_finite.
  std::optional<double> non_finite_weights;
  std::optional<double> kl;
  std::optional<double> entropy;
  std::optional<double> mean_answer_tokens;
  int64_t min_answer_tokens = 1;    // the shortest answer the trainer keeps
  int64_t max_answer_tokens = 0;    // 0: no maximum known
  std::optional<double> repeated_share;  // share of the batch's answers that another row also got
  std::optional<double> reward;
};

struct GuardianEvent {
  int64_t step = 0;
  std::string signal;
  double value = 0.0;
  double threshold = 0.0;
  GuardianAction action = GuardianAction::kWarn;
  std::string message;
};

struct GuardianVerdict {
  GuardianAction action = GuardianAction::kOff;  // kOff: healthy (warnings may have been logged)
  std::vector<GuardianEvent> events;             // everything that fired at this step
  /// The signal that decided a stop or rollback ("" otherwise).
  std::string cause() const;
};

/// Thrown (on every rank) when a signal asks to stop, or rollbacks are exhausted, after the
/// trainer saved a checkpoint. `dschat train` exits with code 3.
class GuardianStop : public core::Error {
 public:
  explicit GuardianStop(const std::string& what) : core::Error(what) {}
};

class Guardian {
 public:
  /// `name` ("step 1 (SFT)") starts every message; `metrics` may be null (no rows written);
  /// only `rank0` logs to the console.
  Guardian(GuardianConfig config, std::string name, MetricsLog* metrics, bool rank0);

  const GuardianConfig& config() const { return config_; }
  bool enabled() const { return config_.enabled; }

  /// Checks one step's figures, logs what fired and returns the verdict. Steps must come in
  /// order; a step at or before the last one observed (after a rollback) is accepted.
  GuardianVerdict observe(const StepFigures& figures);
  /// A held-out check's score at `step` (the reward model's score of greedy answers to fixed
  /// prompts, or a verifier's), compared against the training rewards observed since.
  GuardianVerdict observe_heldout(int64_t step, double score);

  /// Records a rollback from `from_step` to the snapshot at `to_step`: the counters, the learning
  /// rate multiplier, the offending step's data position `skipped` (kept when `batches` is skip;
  /// the trainer's own JSON, e.g. {"epoch", "begin", "end"}) and the histories cut back.
  /// Returns false (and records nothing) when max_rollbacks are used up: the trainer stops.
  bool record_rollback(int64_t from_step, int64_t to_step, const std::string& cause, const nlohmann::json& skipped);
  int64_t rollbacks() const { return rollbacks_; }
  /// Product of lr_factor over the rollbacks so far.
  double lr_multiplier() const { return lr_multiplier_; }
  /// An offset for random seeds: 0 before any rollback, or without reseed.
  uint64_t seed_offset() const;

  /// The data positions rollbacks skip from now on, as the trainer described them.
  const std::vector<nlohmann::json>& skipped_data() const { return skipped_data_; }

  /// Everything needed to continue after a resume (checkpoint client state).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  struct History {
    std::vector<std::pair<int64_t, double>> points;  // (step, value), oldest first
    void add(int64_t step, double value, size_t keep);
    void cut_after(int64_t step);
  };
  void fire(GuardianVerdict& verdict, int64_t step, const std::string& signal, bool condition, double value,
            const GuardianRule& rule, const std::string& message);
  void log_event(const GuardianEvent& event);

  GuardianConfig config_;
  std::string name_;
  MetricsLog* metrics_;
  bool rank0_;
  History losses_, kls_, rewards_, heldout_;
  std::vector<std::string> active_warnings_;  // signals warned about and not yet cleared
  int64_t rollbacks_ = 0;
  double lr_multiplier_ = 1.0;
  std::vector<nlohmann::json> skipped_data_;
};

/// Median of `values` (the mean of the middle two for an even count); 0 for none.
double median_of(std::vector<double> values);
/// Least-squares slope of (x, y) points; 0 for fewer than two distinct x.
double slope_of(const std::vector<std::pair<int64_t, double>>& points);

}  // namespace monitor
}  // namespace dschat
