#pragma once
// The math of one critic-free step between sampling and the optimizer (critic_free_trainer.cpp):
// the advantages of the step's answers for the configured estimator, and one training
// micro-step's loss. Shapes: N answers in groups of n contiguous rows, T answer columns (the
// experience's columns after its P prompt columns), F reward sources.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/rlhf/math/critic_free.h"
#include "dschat/rlhf/setup/experience.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"

namespace dschat {
namespace rlhf {

/// A step's answers and what its loss needs, on the policy's device unless stated.
struct CriticFreeBatch {
  Experience exp;                     // N rows
  torch::Tensor rewards_per_source;   // [N, F] float32 on the CPU
  torch::Tensor answer_mask;          // [N, T] float32: 1 on answer tokens up to and with EOS
  torch::Tensor old_logps;            // [N, T] float32: the policy's at sampling time
  torch::Tensor ref_logps;            // [N, T] float32: the reference's (undefined without one)
  torch::Tensor advantages;           // [N] (grpo, rloo) or [N, T] (reinforce_pp) float32
  std::vector<int64_t> answer_tokens;  // per row, on the host
};

/// Fills answer_mask, old_logps, ref_logps and answer_tokens from exp (one host read).
void prepare_answers(CriticFreeBatch& batch);

/// Sets batch.advantages. Collective: the batch-wide statistics (grpo's scale_rewards "batch",
/// rloo's normalize_advantages, REINFORCE++'s normalisation) span every rank's answers; each rank
/// gathers them all and keeps its own rows (tests/rlhf/critic_free_multiproc_test.cpp).
void compute_advantages(const GrpoConfig& config, const torch::Tensor& weights, CriticFreeBatch& batch,
                        const StepContext& context);

/// One micro-step's statistics, each [] detached on the device.
struct CriticFreeMicroStats {
  torch::Tensor loss, clip_fraction, kl, entropy;
};

/// Forward of the actor on `rows` of the batch, the estimator's clipped loss (+ the KL term with
/// kl_mode "loss"), backward and step. `tokens_per_rank`: for token-mean, the answer tokens of
/// this micro-step's optimizer window summed over every rank, divided by world size and by
/// gradient_accumulation_steps (so that the engine's averaging gives the mean over every token).
CriticFreeMicroStats critic_free_micro_step(hybrid::HybridEngine& actor, const GrpoConfig& config,
                                            const CriticFreeBatch& batch, const torch::Tensor& rows,
                                            double tokens_per_rank);

/// The values of row indices [K] int64 (built on the host by the trainer) as a vector.
std::vector<int64_t> host_indices(const torch::Tensor& rows);

/// The rows `rows` of every per-row tensor of the batch (dynamic sampling's groups), and the
/// concatenation of several batches (padded on the right to the longest answer).
CriticFreeBatch select_rows(const CriticFreeBatch& batch, const torch::Tensor& rows);
CriticFreeBatch concatenate(const std::vector<CriticFreeBatch>& parts, int64_t pad_token_id);

}  // namespace rlhf
}  // namespace dschat
