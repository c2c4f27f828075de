#pragma once
// The reducible core of summarize_reward_scores (reward_diagnostics.h): every metric is a ratio of
// sums, so ranks that scored different pairs add their sums (one all-reduce) and finish alike.
#include <functional>
#include <vector>

#include "dschat/rlhf/rewards/reward_diagnostics.h"

namespace dschat {
namespace rlhf {

/// `local`: this rank's pairs. `all_chosen_tokens`: the chosen answer lengths of every rank's pairs
/// (the length buckets' edges, the same on every rank). `reduce` sums a vector over the ranks in
/// place (a no-op in a world of one).
RewardDiagnostics summarize_reward_scores(const RewardPairScores& local, const std::vector<int64_t>& all_chosen_tokens,
                                          double clip_reward_value,
                                          const std::function<void(std::vector<double>&)>& reduce);

}  // namespace rlhf
}  // namespace dschat
