#include "dschat/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/json_object.h"

namespace dschat {
namespace engine {
namespace {

// math.pi; the product below keeps transformers' left-to-right order so the rounding matches.
constexpr double kPi = 3.141592653589793;

// Every schedule except "constant" warms up as float(step) / float(max(1, num_warmup_steps)).
double warmup_factor(int64_t step, int64_t num_warmup_steps) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, num_warmup_steps));
}

// Python's max(0.0, x) returns its first argument unless x is greater (so max(0.0, nan) is 0.0).
double python_max_zero(double x) { return x > 0.0 ? x : 0.0; }

}  // namespace

const std::vector<std::string>& LrSchedule::type_names() {
  static const std::vector<std::string> names = {"linear",     "cosine",   "cosine_with_restarts",
                                                 "polynomial", "constant", "constant_with_warmup"};
  return names;
}

LrSchedule::LrSchedule(LrScheduleOptions options, Kind kind, double num_cycles)
    : options_(std::move(options)), kind_(kind), num_cycles_(num_cycles) {}

LrSchedule LrSchedule::create(const LrScheduleOptions& options) {
  const auto& names = type_names();
  auto found = std::find(names.begin(), names.end(), options.type);
  if (found == names.end()) {
    std::string valid;
    for (const auto& name : names) valid += (valid.empty() ? "" : ", ") + name;
    DSCHAT_THROW(ConfigError, "lr scheduler type '", options.type, "' is not one of: ", valid);
  }
  static const Kind kinds[] = {Kind::Linear,     Kind::Cosine,   Kind::CosineWithRestarts,
                               Kind::Polynomial, Kind::Constant, Kind::ConstantWithWarmup};
  Kind kind = kinds[found - names.begin()];

  const std::string where = "lr scheduler '" + options.type + "': ";
  DSCHAT_CHECK(options.num_warmup_steps >= 0, ConfigError, where, "num_warmup_steps must be >= 0, got ",
               options.num_warmup_steps);
  DSCHAT_CHECK(options.num_training_steps >= 0, ConfigError, where, "num_training_steps must be >= 0, got ",
               options.num_training_steps);
  double num_cycles = options.num_cycles.value_or(kind == Kind::CosineWithRestarts ? 1.0 : 0.5);
  DSCHAT_CHECK(std::isfinite(num_cycles) && num_cycles >= 0.0, ConfigError, where,
               "num_cycles must be a finite number >= 0, got ", num_cycles);
  if (kind == Kind::Polynomial) {
    DSCHAT_CHECK(options.initial_lr > options.lr_end, ConfigError, where, "lr_end (", options.lr_end,
                 ") must be smaller than the initial lr (", options.initial_lr, ")");
    // A negative power would raise ZeroDivisionError in Python (0.0 ** -p) at the last step.
    DSCHAT_CHECK(std::isfinite(options.power) && options.power >= 0.0, ConfigError, where,
                 "power must be a finite number >= 0, got ", options.power);
    // transformers divides by (num_training_steps - num_warmup_steps) once step reaches the end
    // of warmup, so equal counts raise ZeroDivisionError at the last step; refuse them up front.
    DSCHAT_CHECK(options.num_training_steps != options.num_warmup_steps, ConfigError, where,
                 "num_training_steps must differ from num_warmup_steps (both ", options.num_warmup_steps,
                 "): the decay would divide by zero at the last step");
  }
  return LrSchedule(options, kind, num_cycles);
}

double LrSchedule::multiplier(int64_t step) const {
  DSCHAT_CHECK(step >= 0, InvalidArgument, "lr schedule step must be >= 0, got ", step);
  const int64_t warmup = options_.num_warmup_steps;
  const int64_t total = options_.num_training_steps;
  switch (kind_) {
    case Kind::Constant:
      return 1.0;
    case Kind::ConstantWithWarmup:
      return step < warmup ? warmup_factor(step, warmup) : 1.0;
    case Kind::Linear:
      if (step < warmup) return warmup_factor(step, warmup);
      return python_max_zero(static_cast<double>(total - step) /
                             static_cast<double>(std::max<int64_t>(1, total - warmup)));
    case Kind::Cosine: {
      if (step < warmup) return warmup_factor(step, warmup);
      double progress =
          static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
      // transformers also applies `factor * (1 - min_lr_rate) + min_lr_rate` with min_lr_rate 0,
      // which leaves every value unchanged.
      double factor = 0.5 * (1.0 + std::cos(kPi * num_cycles_ * 2.0 * progress));
      return python_max_zero(factor);
    }
    case Kind::CosineWithRestarts: {
      if (step < warmup) return warmup_factor(step, warmup);
      double progress =
          static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
      if (progress >= 1.0) return 0.0;
      // Python's float % equals fmod for the non-negative operands reachable here.
      return python_max_zero(0.5 * (1.0 + std::cos(kPi * std::fmod(num_cycles_ * progress, 1.0))));
    }
    case Kind::Polynomial: {
      if (step < warmup) return warmup_factor(step, warmup);
      const double lr_init = options_.initial_lr;
      const double lr_end = options_.lr_end;
      if (step > total) return lr_end / lr_init;  // LambdaLR multiplies by lr_init again
      double lr_range = lr_init - lr_end;
      double decay_steps = static_cast<double>(total - warmup);
      double pct_remaining = 1.0 - static_cast<double>(step - warmup) / decay_steps;
      double decay = lr_range * std::pow(pct_remaining, options_.power) + lr_end;
      return decay / lr_init;
    }
  }
  DSCHAT_THROW(Error, "internal error: unhandled lr schedule kind (please report this bug)");
}

LrScheduler::LrScheduler(LrSchedule schedule, std::vector<double> base_lrs)
    : schedule_(std::move(schedule)), base_lrs_(std::move(base_lrs)) {}

std::vector<double> LrScheduler::current_lrs() const {
  double factor = schedule_.multiplier(step_count_);
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (double base : base_lrs_) lrs.push_back(base * factor);
  return lrs;
}

void LrScheduler::apply(std::vector<double>& group_lrs) const {
  DSCHAT_CHECK(group_lrs.size() == base_lrs_.size(), InvalidArgument, "lr scheduler holds ", base_lrs_.size(),
               " param groups, the optimizer has ", group_lrs.size());
  group_lrs = current_lrs();
}

nlohmann::json LrScheduler::state_dict() const {
  const auto& o = schedule_.options();
  nlohmann::json schedule = {{"type", o.type},
                             {"num_warmup_steps", o.num_warmup_steps},
                             {"num_training_steps", o.num_training_steps},
                             {"num_cycles", schedule_.num_cycles()}};
  if (o.type == "polynomial") {
    schedule["lr_end"] = o.lr_end;
    schedule["power"] = o.power;
    schedule["initial_lr"] = o.initial_lr;
  }
  return {{"step_count", step_count_}, {"base_lrs", base_lrs_}, {"schedule", schedule}};
}

void LrScheduler::load_state_dict(const nlohmann::json& state, const std::string& where) {
  core::JsonObject object(state, where);
  auto step_count = object.require<int64_t>("step_count");
  DSCHAT_CHECK(step_count >= 0, ConfigError, object.at("step_count"), " must be >= 0, got ", step_count);
  auto base_json = object.require<nlohmann::json>("base_lrs");
  std::vector<double> base_lrs;
  DSCHAT_CHECK(base_json.is_array(), ConfigError, object.at("base_lrs"), " expects an array of numbers, got ",
               base_json.dump());
  for (const auto& item : base_json) {
    DSCHAT_CHECK(item.is_number(), ConfigError, object.at("base_lrs"), " expects an array of numbers, got ",
                 base_json.dump());
    base_lrs.push_back(item.get<double>());
  }
  DSCHAT_CHECK(base_lrs.size() == base_lrs_.size(), ConfigError, object.at("base_lrs"), " holds ", base_lrs.size(),
               " param groups, this run has ", base_lrs_.size());
  object.accept({"schedule"});
  object.finish();
  step_count_ = step_count;
  base_lrs_ = std::move(base_lrs);
}

}  // namespace engine
}  // namespace dschat
