#include "dschat/monitor/collapse_warnings.h"

#include <algorithm>
#include <map>

#include "core/log.h"

namespace dschat {
namespace monitor {

void CollapseWatch::warn_once(bool condition, bool& active, const std::string& message) {
  if (condition && !active) {
    core::log_warn(message);
    ++warnings_;
  }
  active = condition;
}

void CollapseWatch::observe_generation(int64_t kept, int64_t generated) {
  warn_once(generated > 0 && 2 * kept < generated, dropped_active_,
            "PPO: " + std::to_string(generated - kept) + " of " + std::to_string(generated) +
                " answers were empty or one token and were dropped: the actor is collapsing to empty answers "
                "(start step 3 from an SFT model; lower actor_learning_rate)");
}

void CollapseWatch::observe_step(double mean_answer_tokens, double kl, const std::vector<std::string>& answers) {
  warn_once(min_answer_tokens_ > 1 && mean_answer_tokens < static_cast<double>(min_answer_tokens_) + 0.5, short_active_,
            "PPO: mean answer length fell to " + std::to_string(mean_answer_tokens) +
                " tokens; answers are drifting to empty");
  warn_once(max_answer_tokens_ > 4 && mean_answer_tokens >= static_cast<double>(max_answer_tokens_) - 0.5,
            long_active_,
            "PPO: answers run to max_answer_seq_len (" + std::to_string(max_answer_tokens_) +
                ") without an EOS; the actor may be rambling to exploit the reward model");
  warn_once(kl > kl_limit_, kl_active_,
            "PPO: the KL to the reference model is " + std::to_string(kl) +
                " nats per token; the policy is running away (lower actor_learning_rate or raise kl_ctl)");
  const int64_t rows = static_cast<int64_t>(answers.size());
  if (rows >= 4) {
    std::map<std::string, int64_t> counts;
    int64_t most = 0;
    for (const std::string& answer : answers) most = std::max(most, ++counts[answer]);
    warn_once(10 * most >= 9 * rows && counts.size() == 1, repeated_active_,
              "PPO: every prompt of the batch got the same answer; the actor has collapsed to one reply");
  }
}

}  // namespace monitor
}  // namespace dschat
