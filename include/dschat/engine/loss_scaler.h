#pragma once
// The fp16 loss scaler of DeepSpeed's ZeRO optimizer (deepspeed/runtime/fp16/loss_scaler.py):
// the loss is multiplied by scale() before backward; after backward the engine checks the
// gradients for inf/NaN (has_inf_or_nan) and calls update(overflow) once per optimizer step,
// which adapts the scale and says whether the step (and the lr-scheduler step) is skipped.
// Three modes: dynamic (fp16, loss_scale 0), static (fp16, loss_scale > 0) and none (bf16/fp32:
// scale 1, no overflow check, never skips).

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dschat {
namespace engine {

/// DynamicLossScaler's constructor arguments; the defaults are the class defaults, which ZeRO
/// uses when the fp16 block names none of the dynamic keys (see LossScaler::from_fp16_config).
struct DynamicLossScaleOptions {
  double init_scale = 4294967296.0;  // 2^32
  double scale_factor = 2.0;
  int64_t scale_window = 1000;       // clean steps before the scale grows
  double min_scale = 1.0;
  int64_t delayed_shift = 1;         // "hysteresis": overflows tolerated before the scale drops
  bool consecutive_hysteresis = false;  // refill the hysteresis after every clean step
  bool raise_error_at_min_scale = true;
};

enum class LossScaleMode { None, Static, Dynamic };

class LossScaler {
 public:
  /// bf16/fp32: scale 1, never overflows.
  static LossScaler none();
  /// A fixed scale (> 0); an overflow still skips the step.
  static LossScaler fixed(double scale);
  /// Throws core::ConfigError for a non-positive scale/factor/window/min scale or delayed_shift < 1.
  static LossScaler dynamic(const DynamicLossScaleOptions& options);

  /// From a DeepSpeed config's "fp16" block (`where` names it in errors, e.g. "ds_config.json: fp16").
  /// enabled false → none(); loss_scale > 0 → fixed(loss_scale); otherwise dynamic, where DeepSpeed's
  /// gotcha applies: the config's values (defaults initial_scale_power 16, loss_scale_window 1000,
  /// hysteresis 2, consecutive_hysteresis false, min_loss_scale 1) are used only if at least one of
  /// those five keys is present; else the class defaults 2^32 / 1000 / min 1 / hysteresis 1.
  /// Unknown keys throw core::ConfigError with the nearest known key suggested.
  static LossScaler from_fp16_config(const nlohmann::json& fp16_block, const std::string& where);

  LossScaleMode mode() const { return mode_; }
  bool is_dynamic() const { return mode_ == LossScaleMode::Dynamic; }
  /// Whether the engine must check the gradients for overflow (fp16 only).
  bool checks_overflow() const { return mode_ != LossScaleMode::None; }
  double scale() const { return scale_; }
  const DynamicLossScaleOptions& options() const { return options_; }

  /// Called once per optimizer step with whether any gradient was inf/NaN; returns whether the
  /// step is skipped. Dynamic mode follows DeepSpeed's update_scale exactly (and logs its
  /// "[deepspeed] OVERFLOW! ..." line on rank 0); an overflow at min_scale with
  /// raise_error_at_min_scale throws core::Error and leaves the state unchanged.
  /// Mode none ignores `overflow` (DeepSpeed does not check bf16/fp32 gradients) and returns false.
  bool update(bool overflow);
  /// The scale update(false) would leave: what a step that is not skipped unscales its gradients
  /// by (DeepSpeed unscales after update_scale, so a clean window's doubling already applies).
  /// Known before the overflow verdict, so the engine can queue the unscale before reading it.
  double scale_after_clean_step() const;

  /// Dynamic-mode counters (DeepSpeed's names); they stay at their initial values otherwise.
  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int64_t cur_hysteresis() const { return cur_hysteresis_; }

  /// {"mode", "scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"} for checkpoints.
  nlohmann::json state_dict() const;
  /// Restores the counters and the scale; the saved mode must equal this scaler's mode.
  /// Malformed or mismatched state throws core::ConfigError naming `where`.
  void load_state_dict(const nlohmann::json& state, const std::string& where);

 private:
  LossScaler(LossScaleMode mode, double scale, DynamicLossScaleOptions options);

  LossScaleMode mode_;
  double scale_;
  DynamicLossScaleOptions options_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t cur_hysteresis_;
};

/// "none" | "static" | "dynamic".
const char* loss_scale_mode_name(LossScaleMode mode);

/// Whether any element of any defined tensor is inf or NaN, as a 0-dim bool on the first defined
/// tensor's device (CPU when there is none): device-side reductions only, no host read.
torch::Tensor inf_or_nan_flag(const std::vector<torch::Tensor>& grads);
/// inf_or_nan_flag() read to the host: a single sync, not one per tensor.
bool has_inf_or_nan(const std::vector<torch::Tensor>& grads);

}  // namespace engine
}  // namespace dschat
