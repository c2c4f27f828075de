#pragma once
// The parts of the critic-free trainer (critic_free_trainer.cpp) around its loop: the policy
// models' view of its config, sampling and scoring a prompt batch, dynamic sampling's choice of
// a step's groups, and the step's log line and metrics row.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dschat/data/collate.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/rewards/reward_sources.h"
#include "dschat/rlhf/setup/rlhf_models.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/tokenizer/tokenizer.h"
#include "rlhf/loop/critic_free_step.h"

namespace dschat {
namespace rlhf {

/// The step's reward: its sources, and the queries they score (each answer's prompt and text
/// decoded, and the prompt's record as meta: {"chosen", "rejected"} from the data files).
class ScoredReward {
 public:
  ScoredReward(const GrpoConfig& config, const StepContext& context, const RlhfPlacement& placement,
               const tokenizer::Tokenizer& tokenizer, int64_t pad_token_id);
  RewardSources& sources() { return *sources_; }
  /// [N, F] float32 on the CPU for sequences seq [N, L] whose first P columns are the prompt.
  torch::Tensor score(const torch::Tensor& seq, const torch::Tensor& attention_mask, int64_t prompt_length);
  /// The decoded prompt and answer of each row, with its record's meta.
  std::vector<RewardQuery> queries(const torch::Tensor& seq, int64_t prompt_length) const;

 private:
  const tokenizer::Tokenizer& tokenizer_;
  int64_t pad_;
  std::unordered_map<std::string, nlohmann::json> meta_;  // by trimmed prompt text
  std::vector<std::unique_ptr<engine::ZeroInferenceEngine>> engines_;  // reward models' (kept alive)
  std::unique_ptr<RewardSources> sources_;
};

/// n_samples_per_prompt sampled answers to each prompt of `batch` (on the policy's device), their
/// log-probs, and every source's rewards.
CriticFreeBatch sample_and_score(RlhfModels& models, ScoredReward& reward, const GrpoConfig& config,
                                 const data::PromptBatch& batch, int64_t eos_token_id, int64_t pad_token_id,
                                 uint64_t seed);

/// The guardian's held-out check: one greedy answer to each prompt of `batch`, scored by the
/// reward source named `source` ("": the weighted reward); the mean over the prompts. Throws
/// core::ConfigError naming guardian.reward_hacking.source when no source has that name.
double heldout_score(RlhfModels& models, ScoredReward& reward, const GrpoConfig& config, const data::PromptBatch& batch,
                     int64_t eos_token_id, int64_t pad_token_id, const std::string& source);

struct StepAnswers {
  CriticFreeBatch batch;       // generation_batch_size groups of n answers
  int64_t dropped_groups = 0;  // groups sampled for this step whose rewards were all equal
  double kept_share = 1.0;     // share of the sampled groups that carried a signal
};

/// The step's answers once `pool` (the batches sampled since the last step) holds enough: without
/// dynamic sampling, the one batch; with it, `groups` groups whose rewards differ, once every rank
/// has them (collective), or at dynamic_sampling_max_batches batches with equal-reward groups
/// filling the rest. nullopt: sample another batch.
std::optional<StepAnswers> take_step_answers(const std::vector<CriticFreeBatch>& pool, int64_t pool_batches,
                                             const GrpoConfig& config, const torch::Tensor& weights, int64_t groups,
                                             int64_t pad_token_id, const StepContext& context);

/// Rank 0 logs the first answers of a step with their rewards.
void print_answers(const CriticFreeBatch& batch, const ScoredReward& reward, const torch::Tensor& weights);

struct StepFigures {
  double reward = 0.0, group_std = 0.0, kl = 0.0, entropy = 0.0, clip_fraction = 0.0, loss = 0.0;
  double answer_tokens = 0.0, kept_groups = 1.0;
  std::vector<double> source_means;
};

/// The step's figures, all-reduced over the ranks (one read of the device).
StepFigures read_step(const CriticFreeBatch& batch, const torch::Tensor& weights, int64_t n,
                      const std::vector<CriticFreeMicroStats>& micro, double kept_share, const StepContext& context);

/// The step's log lines (rank 0, every print_interval steps) and metrics row.
void log_step(monitor::MetricsLog& metrics, const GrpoConfig& config, const RewardSources& sources, int64_t step,
              int64_t epoch, const StepFigures& figures, double generate_seconds, double train_seconds, int64_t rank);

}  // namespace rlhf
}  // namespace dschat
