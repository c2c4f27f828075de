#pragma once
// One PPO micro-step over a slice of experience (DeepSpeed-Chat's train_rlhf), and the mixture
// step (train_unsupervised).
#include <torch/torch.h>

#include "dschat/data/collate.h"
#include "dschat/rlhf/pipeline_config.h"
#include "dschat/rlhf/experience.h"
#include "dschat/rlhf/rlhf_models.h"

namespace dschat {
namespace rlhf {

struct PpoStepStats {
  double actor_loss = 0.0, critic_loss = 0.0;
  double actor_clip_fraction = 0.0, critic_clip_fraction = 0.0;
  double kl = 0.0;               // masked mean of logprob - ref_logprob over answer actions
  double mean_reward = 0.0;      // mean reward-model score of the slice
  double mean_answer_tokens = 0.0;
};

/// Targets (no grad), then actor forward/backward/step, then critic forward/backward/step. With
/// align_overflow both backwards run first and, at a boundary where only one of the two
/// overflowed, the other skips its step too.
PpoStepStats train_rlhf(RlhfModels& models, const Experience& exp, const PpoConstants& constants,
                        bool compute_fp32_loss, bool align_overflow);

/// actor LM loss on an unsupervised block batch, backward of unsup_coef * loss, step. Returns the
/// unscaled loss.
double train_unsupervised(RlhfModels& models, const data::SftBatch& batch, double unsup_coef);

}  // namespace rlhf
}  // namespace dschat
