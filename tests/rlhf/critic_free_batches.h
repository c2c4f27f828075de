#pragma once
// The answers each rank of the cross-rank advantage test holds (tests/rlhf/critic_free_worker.cpp
// computes them on two ranks, tests/rlhf/critic_free_multiproc_test.cpp on one process): two
// groups of 4 answers per rank, answer widths that differ between ranks (3 + rank columns), two
// reward sources and policy/reference log-probs, all drawn from the rank's own seed.
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dschat/rlhf/config/pipeline_config.h"
#include "rlhf/loop/critic_free_step.h"

namespace dschat {
namespace testing {

constexpr int64_t kAnswersPerRank = 8, kSamplesPerPrompt = 4, kPromptColumns = 2;

inline int64_t rank_answer_width(int64_t rank) { return 3 + rank; }

/// Rank `rank`'s batch: row i has 1 + i % T answer tokens of T = rank_answer_width(rank) columns.
inline rlhf::CriticFreeBatch rank_answers(int64_t rank) {
  const int64_t n = kAnswersPerRank, width = rank_answer_width(rank);
  torch::manual_seed(100 + rank);
  rlhf::CriticFreeBatch batch;
  batch.rewards_per_source = torch::rand({n, 2});  // [N, 2]
  torch::Tensor mask = torch::zeros({n, width});   // [N, T]
  for (int64_t i = 0; i < n; ++i) mask[i].narrow(0, 0, 1 + i % width).fill_(1.0);
  batch.answer_mask = mask;
  batch.old_logps = -torch::rand({n, width}) * mask;                          // [N, T]
  batch.ref_logps = -torch::rand({n, width}) * mask;                          // [N, T]
  batch.exp.seq = torch::zeros({n, kPromptColumns + width}, torch::kInt64);  // [N, P + T]
  batch.exp.prompt_length = kPromptColumns;
  return batch;
}

/// The three estimators with their batch-wide statistics on: grpo with scale_rewards "batch",
/// rloo with normalize_advantages and a KL penalty, reinforce_pp with a per-token KL penalty.
inline rlhf::GrpoConfig estimator_config(const std::string& estimator) {
  rlhf::GrpoConfig config;
  config.advantage_estimator = rlhf::advantage_estimator_named(estimator, "estimator_config");
  config.n_samples_per_prompt = kSamplesPerPrompt;
  config.scale_rewards = rlhf::RewardScaling::kBatch;
  config.normalize_advantages = true;
  config.kl_coef = estimator == "grpo" ? 0.0 : 0.05;
  config.kl_mode = rlhf::KlMode::kReward;
  config.kl_estimator = rlhf::KlEstimator::kK1;
  return config;
}

inline std::vector<std::string> estimators() { return {"grpo", "rloo", "reinforce_pp"}; }

inline torch::Tensor source_weights() { return torch::tensor({1.0f, 0.5f}); }  // [2]

}  // namespace testing
}  // namespace dschat
