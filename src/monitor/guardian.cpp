#include "dschat/monitor/guardian.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/log.h"
#include "dschat/monitor/metrics_log.h"

namespace dschat {
namespace monitor {
namespace {

// Enough history for any window a config can ask for without growing without bound.
constexpr size_t kHistoryLimit = 4096;

std::string number(double value) {
  std::ostringstream out;
  out.precision(6);
  out << value;
  return out.str();
}

}  // namespace

const char* action_name(GuardianAction action) {
  switch (action) {
    case GuardianAction::kOff: return "off";
    case GuardianAction::kWarn: return "warn";
    case GuardianAction::kStop: return "stop";
    case GuardianAction::kRollback: return "rollback";
  }
  return "?";
}

GuardianAction parse_action(const std::string& name, const std::string& where) {
  for (GuardianAction a : {GuardianAction::kOff, GuardianAction::kWarn, GuardianAction::kStop, GuardianAction::kRollback}) {
    if (name == action_name(a)) return a;
  }
  DSCHAT_THROW(ConfigError, where, ": '", name, "' is not one of off, warn, stop, rollback");
}

bool GuardianConfig::wants_snapshots() const {
  if (!enabled) return false;
  for (const GuardianRule* rule : {&non_finite, &loss_spike, &kl, &kl_growth, &entropy, &answer_length,
                                   &repeated_answers, &reward_hacking}) {
    if (rule->action == GuardianAction::kRollback) return true;
  }
  return false;
}

std::string GuardianVerdict::cause() const {
  for (const GuardianEvent& e : events) {
    if (e.action == action && action >= GuardianAction::kStop) return e.signal;
  }
  return "";
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lower + upper);
}

double slope_of(const std::vector<std::pair<int64_t, double>>& points) {
  if (points.size() < 2) return 0.0;
  double mean_x = 0.0, mean_y = 0.0;
  for (const auto& [x, y] : points) {
    mean_x += static_cast<double>(x);
    mean_y += y;
  }
  const double n = static_cast<double>(points.size());
  mean_x /= n;
  mean_y /= n;
  double sxy = 0.0, sxx = 0.0;
  for (const auto& [x, y] : points) {
    sxy += (static_cast<double>(x) - mean_x) * (y - mean_y);
    sxx += (static_cast<double>(x) - mean_x) * (static_cast<double>(x) - mean_x);
  }
  return sxx > 0.0 ? sxy / sxx : 0.0;
}

void Guardian::History::add(int64_t step, double value, size_t keep) {
  points.emplace_back(step, value);
  if (points.size() > keep) points.erase(points.begin(), points.end() - static_cast<std::ptrdiff_t>(keep));
}

void Guardian::History::cut_after(int64_t step) {
  points.erase(std::remove_if(points.begin(), points.end(), [step](const auto& p) { return p.first > step; }),
               points.end());
}

Guardian::Guardian(GuardianConfig config, std::string name, MetricsLog* metrics, bool rank0)
    : config_(std::move(config)), name_(std::move(name)), metrics_(metrics), rank0_(rank0) {}

uint64_t Guardian::seed_offset() const {
  return config_.reseed ? static_cast<uint64_t>(rollbacks_) * 1000003ULL : 0;
}

void Guardian::log_event(const GuardianEvent& event) {
  if (rank0_) {
    core::log_warn(name_, ": guardian: ", event.signal, " at step ", event.step, ": ", event.message, " (",
                   number(event.value), ", limit ", number(event.threshold), "); action: ", action_name(event.action));
  }
  if (metrics_) {
    metrics_->write("guardian", event.step,
                    {{event.signal, event.value},
                     {event.signal + "_limit", event.threshold},
                     {event.signal + "_action", static_cast<double>(event.action)}});
  }
}

void Guardian::fire(GuardianVerdict& verdict, int64_t step, const std::string& signal, bool condition, double value,
                    const GuardianRule& rule, const std::string& message) {
  auto active = std::find(active_warnings_.begin(), active_warnings_.end(), signal);
  if (!condition || rule.action == GuardianAction::kOff) {
    if (active != active_warnings_.end()) active_warnings_.erase(active);
    return;
  }
  GuardianEvent event{step, signal, value, rule.threshold, rule.action, message};
  verdict.action = std::max(verdict.action, rule.action);
  verdict.events.push_back(event);
  // A warning is logged when its condition starts; stops and rollbacks every time they fire.
  if (rule.action == GuardianAction::kWarn) {
    if (active != active_warnings_.end()) return;
    active_warnings_.push_back(signal);
  }
  log_event(event);
}

GuardianVerdict Guardian::observe(const StepFigures& f) {
  GuardianVerdict verdict;
  if (!config_.enabled) return verdict;
  const int64_t step = f.step;

  const bool loss_bad = f.loss && !std::isfinite(*f.loss);
  const bool grad_bad = f.grad_norm && (!std::isfinite(*f.grad_norm) || *f.grad_norm < 0.0);
  // Finite gradients times a huge learning rate overflow the weights themselves: caught at the
  // step that did it rather than at the next step's NaN loss.
  const bool weights_bad = f.non_finite_weights && *f.non_finite_weights > 0.0;
  fire(verdict, step, "non_finite", loss_bad || grad_bad || weights_bad,
       loss_bad ? *f.loss : (grad_bad ? *f.grad_norm : (weights_bad ? *f.non_finite_weights : 0.0)), config_.non_finite,
       loss_bad   ? "the loss is not finite"
       : grad_bad ? "the gradients are not finite (the engine skipped the step)"
                  : number(*f.non_finite_weights) + " weights are NaN or Inf after the update");

  if (f.loss && std::isfinite(*f.loss)) {
    const GuardianRule& rule = config_.loss_spike;
    std::vector<double> recent;
    const size_t window = static_cast<size_t>(std::max<int64_t>(rule.window, 1));
    for (size_t i = losses_.points.size() > window ? losses_.points.size() - window : 0; i < losses_.points.size(); ++i) {
      recent.push_back(losses_.points[i].second);
    }
    const double median = median_of(recent);
    const bool armed = static_cast<int64_t>(losses_.points.size()) >= config_.loss_spike_min_steps && median > 0.0;
    const bool spike =
        armed && *f.loss > rule.threshold * median && *f.loss - median >= config_.loss_spike_min_increase;
    fire(verdict, step, "loss_spike", spike, *f.loss, rule,
         "the loss is " + number(*f.loss / std::max(median, 1e-30)) + " x the median of the last " +
             std::to_string(recent.size()) + " steps (" + number(median) + ")");
    if (!spike) losses_.add(step, *f.loss, kHistoryLimit);  // a spike stays out of the median
  }

  if (f.kl && std::isfinite(*f.kl)) {
    fire(verdict, step, "kl", *f.kl > config_.kl.threshold, *f.kl, config_.kl,
         "the KL to the reference is " + number(*f.kl) + " nats per token; the policy is running away "
         "(lower the actor's learning rate or raise kl_ctl)");
    kls_.add(step, *f.kl, kHistoryLimit);
    const GuardianRule& rule = config_.kl_growth;
    const size_t window = static_cast<size_t>(std::max<int64_t>(rule.window, 2));
    if (kls_.points.size() >= window) {
      const std::vector<std::pair<int64_t, double>> recent(kls_.points.end() - static_cast<std::ptrdiff_t>(window),
                                                           kls_.points.end());
      const double slope = slope_of(recent);
      fire(verdict, step, "kl_growth", slope > rule.threshold, slope, rule,
           "the KL grows by " + number(slope) + " nats per token per step over the last " + std::to_string(window) +
               " steps");
    }
  }

  if (f.entropy && std::isfinite(*f.entropy)) {
    fire(verdict, step, "entropy", *f.entropy < config_.entropy.threshold, *f.entropy, config_.entropy,
         "the policy's mean token entropy fell to " + number(*f.entropy) + " nats: it has become nearly deterministic");
  }

  if (f.mean_answer_tokens) {
    const double mean = *f.mean_answer_tokens, margin = config_.answer_length.threshold;
    // With a one-token minimum, a one-token answer may be the right one (the demo task's).
    const bool too_short = f.min_answer_tokens > 1 && mean < static_cast<double>(f.min_answer_tokens) + margin;
    const bool too_long = f.max_answer_tokens > 4 && mean >= static_cast<double>(f.max_answer_tokens) - margin;
    fire(verdict, step, "answer_length", too_short || too_long, mean, config_.answer_length,
         too_short ? "answers are drifting to empty (mean " + number(mean) + " tokens)"
                   : "answers run to the maximum length (" + std::to_string(f.max_answer_tokens) +
                         " tokens) without an end: the actor may be rambling to exploit the reward");
  }

  if (f.repeated_share) {
    fire(verdict, step, "repeated_answers", *f.repeated_share > config_.repeated_answers.threshold, *f.repeated_share,
         config_.repeated_answers, "most prompts got an answer another prompt also got: the policy is collapsing to "
         "one reply");
  }
  if (f.reward && std::isfinite(*f.reward)) rewards_.add(step, *f.reward, kHistoryLimit);
  return verdict;
}

GuardianVerdict Guardian::observe_heldout(int64_t step, double score) {
  GuardianVerdict verdict;
  if (!config_.enabled) return verdict;
  heldout_.add(step, score, kHistoryLimit);
  if (metrics_) metrics_->write("heldout", step, {{"score", score}});
  const GuardianRule& rule = config_.reward_hacking;
  const size_t window = static_cast<size_t>(std::max<int64_t>(rule.window, 2));
  if (heldout_.points.size() < window) return verdict;
  const std::vector<std::pair<int64_t, double>> checks(heldout_.points.end() - static_cast<std::ptrdiff_t>(window),
                                                       heldout_.points.end());
  const int64_t first = checks.front().first, last = checks.back().first;
  std::vector<std::pair<int64_t, double>> rewards;
  for (const auto& p : rewards_.points) {
    if (p.first >= first && p.first <= last) rewards.push_back(p);
  }
  const double span = static_cast<double>(last - first);
  const double rise = slope_of(rewards) * span;   // the training reward's trend over the window
  const double drop = -slope_of(checks) * span;   // the held-out score's fall over the window
  fire(verdict, step, "reward_hacking", rise > rule.threshold && drop > config_.reward_hacking_min_drop, drop, rule,
       "the training reward rose by " + number(rise) + " over steps " + std::to_string(first) + "-" +
           std::to_string(last) + " while the held-out score fell by " + number(drop) +
           ": the policy is exploiting its reward");
  return verdict;
}

bool Guardian::record_rollback(int64_t from_step, int64_t to_step, const std::string& cause,
                               const nlohmann::json& skipped) {
  if (rollbacks_ >= config_.max_rollbacks) return false;
  ++rollbacks_;
  lr_multiplier_ *= config_.lr_factor;
  if (config_.batches == "skip" && !skipped.is_null()) skipped_data_.push_back(skipped);
  for (History* h : {&losses_, &kls_, &rewards_, &heldout_}) h->cut_after(to_step);
  active_warnings_.clear();
  if (rank0_) {
    core::log_warn(name_, ": guardian: rollback ", rollbacks_, " of ", config_.max_rollbacks, " (", cause,
                   " at step ", from_step, "): restoring the snapshot of step ", to_step,
                   ", learning rates x", number(lr_multiplier_),
                   config_.batches == "skip" ? ", the offending batches skipped" : ", the same batches retried",
                   config_.reseed ? ", new random seeds" : "");
  }
  if (metrics_) {
    metrics_->write("guardian", from_step, {{"rollback_to", static_cast<double>(to_step)},
                                            {"rollbacks", static_cast<double>(rollbacks_)},
                                            {"lr_multiplier", lr_multiplier_}});
  }
  return true;
}

nlohmann::json Guardian::state() const {
  const auto points = [](const History& h) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [step, value] : h.points) out.push_back({step, value});
    return out;
  };
  return {{"rollbacks", rollbacks_},       {"lr_multiplier", lr_multiplier_}, {"skipped", skipped_data_},
          {"losses", points(losses_)},     {"kls", points(kls_)},             {"rewards", points(rewards_)},
          {"heldout", points(heldout_)},   {"active_warnings", active_warnings_}};
}

void Guardian::load_state(const nlohmann::json& state) {
  rollbacks_ = state.at("rollbacks").get<int64_t>();
  lr_multiplier_ = state.at("lr_multiplier").get<double>();
  skipped_data_ = state.at("skipped").get<std::vector<nlohmann::json>>();
  const auto read = [&state](const char* key, History& h) {
    h.points.clear();
    for (const nlohmann::json& p : state.at(key)) h.points.emplace_back(p.at(0).get<int64_t>(), p.at(1).get<double>());
  };
  read("losses", losses_);
  read("kls", kls_);
  read("rewards", rewards_);
  read("heldout", heldout_);
  active_warnings_ = state.at("active_warnings").get<std::vector<std::string>>();
}

}  // namespace monitor
}  // namespace dschat
