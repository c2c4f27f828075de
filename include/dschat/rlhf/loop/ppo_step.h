#pragma once
// One PPO micro-step over a slice of experience (DeepSpeed-Chat's train_rlhf), and the mixture
// step (train_unsupervised).
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "dschat/data/collate.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/setup/experience.h"
#include "dschat/rlhf/setup/rlhf_models.h"

namespace dschat {
namespace rlhf {

/// One micro-step's statistics, left where they were computed, each [] and detached: reading one
/// waits for the device, so a trainer collects them (PpoStatsQueue) and reads many at once.
struct PpoStepStats {
  torch::Tensor actor_loss, critic_loss;
  torch::Tensor actor_clip_fraction, critic_clip_fraction;
  torch::Tensor kl;                  // masked mean of logprob - ref_logprob over answer actions
  torch::Tensor mean_reward;         // mean reward-model score of the slice
  torch::Tensor mean_answer_tokens;  // float64
  torch::Tensor entropy;             // the actor's mean token entropy (nats) over answer actions
};

/// Targets (no grad), then actor forward/backward/step, then critic forward/backward/step. With
/// align_overflow both backwards run first and, at a boundary where only one of the two
/// overflowed, the other skips its step too.
PpoStepStats train_rlhf(RlhfModels& models, const Experience& exp, const PpoConstants& constants,
                        bool compute_fp32_loss, bool align_overflow);

/// actor LM loss on an unsupervised block batch (moved to the actor's device), backward of
/// unsup_coef * loss, step. Returns the unscaled loss, [] detached on the device.
torch::Tensor train_unsupervised(RlhfModels& models, const data::SftBatch& batch, double unsup_coef);

/// A PPO step's statistics on the host: the means over its train_rlhf micro-steps; the mixture
/// loss is summed over its own micro-steps and divided by the same count.
struct PpoStepMeans {
  double actor_loss = 0.0, critic_loss = 0.0;
  double actor_clip_fraction = 0.0, critic_clip_fraction = 0.0;
  double kl = 0.0, mean_reward = 0.0, mean_answer_tokens = 0.0;
  double entropy = 0.0;
  double unsup_loss = 0.0;
  int64_t micro_steps = 0;
};

/// The statistics of PPO steps, kept on the device until read(): one copy brings every pending
/// step's to the host, where each step's micro-steps are summed in order in float64, so the
/// means are those a read per micro-step would have given, bit for bit.
class PpoStatsQueue {
 public:
  /// Opens the next PPO step; add() and add_unsupervised() count towards it.
  void begin_step();
  void add(const PpoStepStats& stats);
  void add_unsupervised(const torch::Tensor& loss);  // []
  int64_t pending_steps() const { return static_cast<int64_t>(steps_.size()); }
  /// The means of every pending step, oldest first (one wait for the device); empties the queue.
  std::vector<PpoStepMeans> read();
  /// Drops every pending step unread (a guardian rollback abandoned them).
  void discard() { steps_.clear(); }

 private:
  struct Step {
    std::vector<torch::Tensor> micro;  // each [kFields] float64: the PpoStepStats fields in order
    std::vector<torch::Tensor> unsup;  // each [1] float64
  };
  std::vector<Step> steps_;
};

}  // namespace rlhf
}  // namespace dschat
