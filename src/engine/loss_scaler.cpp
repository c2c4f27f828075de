#include "dschat/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/json_object.h"
#include "core/log.h"

namespace dschat {
namespace engine {
namespace {

// The keys whose mere presence makes DeepSpeed build the dynamic args from the config
// (runtime/config.py get_dynamic_loss_scale_args); without any of them ZeRO keeps the class defaults.
const std::vector<std::string> kDynamicKeys = {"initial_scale_power", "loss_scale_window", "min_loss_scale",
                                               "hysteresis", "consecutive_hysteresis"};

// Python's int(x) of a float, printed in full (the scale may exceed the range of int64).
std::string python_int(double x) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(0) << std::trunc(x);
  return out.str();
}

}  // namespace

const char* loss_scale_mode_name(LossScaleMode mode) {
  switch (mode) {
    case LossScaleMode::None: return "none";
    case LossScaleMode::Static: return "static";
    case LossScaleMode::Dynamic: return "dynamic";
  }
  return "?";
}

LossScaler::LossScaler(LossScaleMode mode, double scale, DynamicLossScaleOptions options)
    : mode_(mode), scale_(scale), options_(options), cur_hysteresis_(options.delayed_shift) {}

LossScaler LossScaler::none() {
  DynamicLossScaleOptions unused;
  return LossScaler(LossScaleMode::None, 1.0, unused);
}

LossScaler LossScaler::fixed(double scale) {
  DSCHAT_CHECK(std::isfinite(scale) && scale > 0.0, ConfigError, "static loss scale must be a finite number > 0, got ",
               scale);
  return LossScaler(LossScaleMode::Static, scale, DynamicLossScaleOptions{});
}

LossScaler LossScaler::dynamic(const DynamicLossScaleOptions& o) {
  auto positive = [](double x) { return std::isfinite(x) && x > 0.0; };
  DSCHAT_CHECK(positive(o.init_scale), ConfigError, "dynamic loss scale: init_scale must be > 0, got ", o.init_scale);
  DSCHAT_CHECK(std::isfinite(o.scale_factor) && o.scale_factor > 1.0, ConfigError,
               "dynamic loss scale: scale_factor must be > 1, got ", o.scale_factor);
  DSCHAT_CHECK(o.scale_window >= 1, ConfigError, "dynamic loss scale: scale_window must be >= 1, got ",
               o.scale_window);
  DSCHAT_CHECK(positive(o.min_scale), ConfigError, "dynamic loss scale: min_scale must be > 0, got ", o.min_scale);
  DSCHAT_CHECK(o.delayed_shift >= 1, ConfigError, "dynamic loss scale: delayed_shift (hysteresis) must be >= 1, got ",
               o.delayed_shift);
  return LossScaler(LossScaleMode::Dynamic, o.init_scale, o);
}

LossScaler LossScaler::from_fp16_config(const nlohmann::json& fp16_block, const std::string& where) {
  core::JsonObject block(fp16_block, where);
  bool enabled = block.get<bool>("enabled", false);
  // Read for their types only: autocast and fp16 master weights belong to other engine parts.
  block.get<bool>("auto_cast", false);
  block.get<bool>("fp16_master_weights_and_grads", false);
  double loss_scale = block.get<double>("loss_scale", 0.0);
  DSCHAT_CHECK(std::isfinite(loss_scale) && loss_scale >= 0.0, ConfigError, block.at("loss_scale"),
               " must be >= 0 (0 selects dynamic loss scaling), got ", loss_scale);

  bool any_dynamic_key = std::any_of(kDynamicKeys.begin(), kDynamicKeys.end(),
                                     [&](const std::string& key) { return block.has(key); });
  // DeepSpeedFP16Config's defaults, which apply only when some dynamic key is present.
  auto power = core::check_range<int64_t>(block, "initial_scale_power",
                                          block.get<int64_t>("initial_scale_power", 16), 0, 64);
  auto window = core::check_range<int64_t>(block, "loss_scale_window",
                                           block.get<int64_t>("loss_scale_window", 1000), 1, INT64_MAX);
  auto hysteresis =
      core::check_range<int64_t>(block, "hysteresis", block.get<int64_t>("hysteresis", 2), 1, INT64_MAX);
  bool consecutive = block.get<bool>("consecutive_hysteresis", false);
  double min_loss_scale = block.get<double>("min_loss_scale", 1.0);
  DSCHAT_CHECK(std::isfinite(min_loss_scale) && min_loss_scale > 0.0, ConfigError, block.at("min_loss_scale"),
               " must be > 0, got ", min_loss_scale);
  block.finish();

  if (!enabled) return none();
  if (loss_scale > 0.0) return fixed(loss_scale);
  if (!any_dynamic_key) return dynamic(DynamicLossScaleOptions{});
  DynamicLossScaleOptions options;
  options.init_scale = std::ldexp(1.0, static_cast<int>(power));
  options.scale_window = window;
  options.min_scale = min_loss_scale;
  options.delayed_shift = hysteresis;
  options.consecutive_hysteresis = consecutive;
  return dynamic(options);
}

bool LossScaler::update(bool overflow) {
  if (mode_ == LossScaleMode::None) return false;
  if (mode_ == LossScaleMode::Static) return overflow;

  const auto& o = options_;
  if (overflow) {
    if (o.delayed_shift == 1 || cur_hysteresis_ == 1) {
      DSCHAT_CHECK(!(scale_ == o.min_scale && o.raise_error_at_min_scale), Error,
                   "fp16 loss scale already at minimum (", scale_,
                   ") - cannot decrease the scale anymore: the gradients overflow even at min_loss_scale "
                   "(DeepSpeed exits the run here)");
      double next_scale = std::max(scale_ / o.scale_factor, o.min_scale);
      core::log_info_rank0("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: ", python_int(scale_),
                           ", reducing to ", python_int(next_scale));
      scale_ = next_scale;
    } else {
      core::log_info_rank0("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: ", python_int(scale_),
                           ", but hysteresis is ", cur_hysteresis_, ". Reducing hysteresis to ",
                           cur_hysteresis_ - 1);
      cur_hysteresis_ -= 1;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (o.consecutive_hysteresis) cur_hysteresis_ = o.delayed_shift;
    if ((cur_iter_ - last_overflow_iter_) % o.scale_window == 0) {
      if (!o.consecutive_hysteresis) cur_hysteresis_ = o.delayed_shift;
      scale_ *= o.scale_factor;
    }
  }
  cur_iter_ += 1;
  return overflow;
}

double LossScaler::scale_after_clean_step() const {
  if (mode_ != LossScaleMode::Dynamic) return scale_;
  return (cur_iter_ - last_overflow_iter_) % options_.scale_window == 0 ? scale_ * options_.scale_factor : scale_;
}

nlohmann::json LossScaler::state_dict() const {
  return {{"mode", loss_scale_mode_name(mode_)},
          {"scale", scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_}};
}

void LossScaler::load_state_dict(const nlohmann::json& state, const std::string& where) {
  core::JsonObject object(state, where);
  auto mode = object.require<std::string>("mode");
  DSCHAT_CHECK(mode == loss_scale_mode_name(mode_), ConfigError, object.at("mode"), ": the checkpoint has a '", mode,
               "' loss scaler, this run a '", loss_scale_mode_name(mode_), "' one");
  auto scale = object.require<double>("scale");
  auto cur_iter = object.require<int64_t>("cur_iter");
  auto last_overflow_iter = object.require<int64_t>("last_overflow_iter");
  auto cur_hysteresis = object.require<int64_t>("cur_hysteresis");
  object.finish();
  DSCHAT_CHECK(std::isfinite(scale) && scale > 0.0, ConfigError, object.at("scale"), " must be > 0, got ", scale);
  DSCHAT_CHECK(mode_ != LossScaleMode::None || scale == 1.0, ConfigError, object.at("scale"),
               " must be 1 without loss scaling, got ", scale);
  DSCHAT_CHECK(cur_iter >= 0, ConfigError, object.at("cur_iter"), " must be >= 0, got ", cur_iter);
  // update() relies on cur_iter - last_overflow_iter > 0 for its window test.
  DSCHAT_CHECK(last_overflow_iter >= -1 && last_overflow_iter < cur_iter, ConfigError,
               object.at("last_overflow_iter"), " must be in [-1, cur_iter), got ", last_overflow_iter);
  DSCHAT_CHECK(cur_hysteresis >= 1, ConfigError, object.at("cur_hysteresis"), " must be >= 1, got ", cur_hysteresis);
  scale_ = scale;
  cur_iter_ = cur_iter;
  last_overflow_iter_ = last_overflow_iter;
  cur_hysteresis_ = cur_hysteresis;
}

torch::Tensor inf_or_nan_flag(const std::vector<torch::Tensor>& grads) {
  torch::Tensor any_bad;  // [] bool
  for (const auto& grad : grads) {
    if (!grad.defined()) continue;
    torch::Tensor bad = torch::isfinite(grad).all().logical_not();  // [] bool on the gradient's device
    if (!any_bad.defined()) {
      any_bad = bad;
    } else {
      // Gradients split across devices: a blocking copy (a non-blocking one to the host could be
      // read before it lands). The engine never mixes devices here.
      any_bad = any_bad.logical_or(bad.to(any_bad.device()));
    }
  }
  return any_bad.defined() ? any_bad : torch::zeros({}, torch::kBool);
}

bool has_inf_or_nan(const std::vector<torch::Tensor>& grads) { return inf_or_nan_flag(grads).item<bool>(); }

}  // namespace engine
}  // namespace dschat
