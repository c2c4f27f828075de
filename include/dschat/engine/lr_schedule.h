#pragma once
// Learning-rate schedules by the names DeepSpeed-Chat's `--lr_scheduler_type` accepts, with the
// formulas of transformers' optimization.py (get_scheduler) reproduced operation for operation, so
// the learning rate at every step equals what transformers' LambdaLR sets, bit for bit:
//   lr(group, step) = base_lr(group) * multiplier(step)
// `step` is LambdaLR's last_epoch: 0 before the first optimizer step, +1 after each step that was
// not skipped (DeepSpeed does not step the scheduler on an fp16 overflow).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dschat {
namespace engine {

struct LrScheduleOptions {
  /// linear | cosine | cosine_with_restarts | polynomial | constant | constant_with_warmup
  std::string type = "cosine";
  int64_t num_warmup_steps = 0;   // ignored by "constant", as in get_scheduler
  int64_t num_training_steps = 0; // ignored by "constant" and "constant_with_warmup"
  /// Cosine periods; unset takes transformers' defaults (0.5 for cosine, 1 for restarts).
  std::optional<double> num_cycles;
  /// polynomial only: the final lr, the decay power, and the optimizer's default lr
  /// (transformers reads optimizer.defaults["lr"]; the multiplier is relative to it).
  double lr_end = 1e-7;
  double power = 1.0;
  double initial_lr = 0.0;
};

class LrSchedule {
 public:
  /// Checks the options; throws core::ConfigError for an unknown type (listing the valid names),
  /// negative step counts, or polynomial with initial_lr <= lr_end or warmup == total steps
  /// (transformers divides by their difference at the last step).
  static LrSchedule create(const LrScheduleOptions& options);

  /// The names create() accepts, in DeepSpeed-Chat's order.
  static const std::vector<std::string>& type_names();

  /// The LambdaLR factor at `step` (>= 0; InvalidArgument otherwise).
  double multiplier(int64_t step) const;

  const LrScheduleOptions& options() const { return options_; }
  /// The num_cycles in effect (the default when options().num_cycles is unset).
  double num_cycles() const { return num_cycles_; }

 private:
  enum class Kind { Linear, Cosine, CosineWithRestarts, Polynomial, Constant, ConstantWithWarmup };
  LrSchedule(LrScheduleOptions options, Kind kind, double num_cycles);

  LrScheduleOptions options_;
  Kind kind_;
  double num_cycles_;
};

/// A schedule applied to an optimizer's param groups, optimizer-agnostic: it owns the base lrs
/// (each group's lr when training began) and the step count, like torch's LambdaLR.
class LrScheduler {
 public:
  LrScheduler(LrSchedule schedule, std::vector<double> base_lrs);

  /// One scheduler step (call after each optimizer step that was taken).
  void step() { ++step_count_; }
  int64_t step_count() const { return step_count_; }

  /// base_lr * multiplier(step_count) per group.
  std::vector<double> current_lrs() const;
  /// Writes current_lrs() into the optimizer's group lrs (sizes must match: InvalidArgument).
  void apply(std::vector<double>& group_lrs) const;

  /// Multiplies every group's base learning rate (the guardian's rollback); kept in checkpoints.
  void scale_base_lrs(double factor) {
    for (double& lr : base_lrs_) lr *= factor;
  }

  const LrSchedule& schedule() const { return schedule_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }

  /// {"step_count", "base_lrs", "schedule": {...}} for checkpoints.
  nlohmann::json state_dict() const;
  /// Restores step_count and base_lrs (group count must match). As with torch's LambdaLR, the
  /// schedule itself comes from this run's options; the saved "schedule" is informational.
  /// Malformed state throws core::ConfigError naming `where`.
  void load_state_dict(const nlohmann::json& state, const std::string& where);

 private:
  LrSchedule schedule_;
  std::vector<double> base_lrs_;
  int64_t step_count_ = 0;
};

}  // namespace engine
}  // namespace dschat
