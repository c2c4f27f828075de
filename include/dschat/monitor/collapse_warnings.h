#pragma once
// Warnings for the ways PPO runs go wrong that DeepSpeed-Chat's users report (peers.md): answers
// collapsing to nothing (dropped as too short), every prompt getting the same answer, answer
// lengths drifting to 0 or to the maximum, and the KL to the reference exploding. Each warning is
// printed when its condition first holds and again only after it cleared, so a long run's log
// does not drown in repeats.
#include <cstdint>
#include <string>
#include <vector>

namespace dschat {
namespace monitor {

class CollapseWatch {
 public:
  /// `min_answer_tokens` is the shortest answer the step keeps (DS-Chat: 2). The answers drift
  /// to empty when their mean comes within half a token of it; with a minimum of one token a
  /// one-token answer may be the right one (the demo task's), so length says nothing and only
  /// the dropped-row warning watches for empty answers.
  explicit CollapseWatch(int64_t max_answer_tokens, int64_t min_answer_tokens = 2, double kl_limit = 10.0)
      : max_answer_tokens_(max_answer_tokens), min_answer_tokens_(min_answer_tokens), kl_limit_(kl_limit) {}

  /// After generation: `kept` rows of `generated` survived the too-short filter.
  void observe_generation(int64_t kept, int64_t generated);
  /// After a PPO step: mean answer tokens, mean per-token KL, and the last experience's answers
  /// as text (special tokens skipped) for the repeated-answer check.
  void observe_step(double mean_answer_tokens, double kl, const std::vector<std::string>& answers);

  int64_t warnings() const { return warnings_; }

 private:
  void warn_once(bool condition, bool& active, const std::string& message);

  int64_t max_answer_tokens_;
  int64_t min_answer_tokens_;
  double kl_limit_;
  int64_t warnings_ = 0;
  bool dropped_active_ = false, repeated_active_ = false, short_active_ = false, long_active_ = false,
       kl_active_ = false;
};

}  // namespace monitor
}  // namespace dschat
