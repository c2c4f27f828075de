#pragma once
// Step 3's experience (DeepSpeed-Chat's generate_experience), for PPO and for the critic-free
// algorithms alike: answers sampled from the policy for a batch of left-padded prompts (n per
// prompt), too-short answers dropped, then without grad the scores a policy-gradient loss needs:
// the policy's and the reference's log-probabilities of the taken tokens, the reward of each
// answer, and the critic's values when there is a critic.
//
//   ExperienceSources sources;
//   sources.policy = &actor;                       // a HybridEngine: generates, then scores
//   sources.reference = ref;                       // optional (reference-free losses)
//   sources.reward = reward_model_scores(rm, pad);  // or any function of the sequences
//   ExperienceOptions options{generation, pad};   // generation.num_return_sequences = n
//   std::optional<Experience> exp = generate_experience(sources, prompts, mask, options);
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "dschat/core/generation_config.h"
#include "dschat/engine/training_engine.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/value_head.h"
#include "dschat/rlhf/math/log_probs.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/setup/rlhf_models.h"

namespace dschat {
namespace rlhf {

struct Experience {
  torch::Tensor seq;             // [B, L] int64: prompt (P columns, left padded) + answer (pad after EOS)
  torch::Tensor attention_mask;  // [B, L] int64: seq != pad
  torch::Tensor logprobs;        // [B, L-1] float32: policy log p(seq[:, t+1] | seq[:, :t+1])
  torch::Tensor ref_logprobs;    // [B, L-1] float32: the same under the reference (undefined without one)
  torch::Tensor values;          // [B, L-1] float32: critic values (forward_value(...)[:, :-1]; undefined without one)
  torch::Tensor reward_score;    // [B] float32: the reward of each answer
  torch::Tensor prompt_index;    // [B] int64: the row of the prompt batch each answer continues
  int64_t prompt_length = 0;     // P
  /// How attention_mask is padded, read once per batch: kUnpadded (no pad anywhere: SDPA's causal
  /// path for every forward of this experience) or kLeftPadded (the explicit mask: pads on the
  /// left of prompts, after EOS, and OPT's BOS, which equals its pad id).
  nn::MaskLayout mask_layout = nn::MaskLayout::kLeftPadded;
  int64_t generated_rows = 0;    // rows before the too-short ones were dropped (prompts * n)
  double generate_seconds = 0.0;

  int64_t rows() const { return seq.defined() ? seq.size(0) : 0; }
  /// Rows [begin, end) of every defined tensor (a training micro-batch).
  Experience slice(int64_t begin, int64_t end) const;
  /// The rows `rows` ([K] int64 indices, any device) of every defined tensor, in that order.
  Experience select(const torch::Tensor& rows) const;
};

/// The reward of whole sequences: seq, attention_mask [B, L]; prompt_length P -> [B] float32.
/// Called without grad, after generation, with tensors on the policy's device; the scores may
/// come back on any device (they are moved to the policy's).
using RewardFunction =
    std::function<torch::Tensor(const torch::Tensor& seq, const torch::Tensor& attention_mask, int64_t prompt_length)>;

/// A DeepSpeed-Chat reward model as a RewardFunction: its value at each answer's last token
/// (reward_end_scores). The model is put in eval mode and scores on its own device (the CPU
/// with offload_reward_model below ZeRO stage 3). `engine`: the ZeRO-3 inference engine that
/// partitions it, if any; what its forward gathered is released after each call.
RewardFunction reward_model_scores(models::ValueHeadModel reward, int64_t pad_token_id,
                                   engine::ZeroInferenceEngine* engine = nullptr);

struct ExperienceSources {
  hybrid::HybridEngine* policy = nullptr;          // required: generates, and scores with its training weights
  models::CausalLM reference{nullptr};              // optional: ref_logprobs
  engine::ZeroInferenceEngine* reference_engine = nullptr;  // partitions the reference (ZeRO-3); optional
  RewardFunction reward;                            // required
  models::ValueHeadModel critic{nullptr};           // optional: values
  engine::TrainingEngine* critic_engine = nullptr;  // the critic's engine (releases ZeRO-3 gathers); optional
};

struct ExperienceOptions {
  core::GenerationConfig generation;  // num_return_sequences answers per prompt
  int64_t pad_token_id = 0;
  /// Answers with fewer non-pad tokens are dropped (DS-Chat keeps answers of more than one token).
  int64_t min_answer_tokens = 1;
  /// false keeps every row (group-relative algorithms need all n answers of a prompt); the
  /// too-short ones then simply score as they are.
  bool drop_short_answers = true;
};

/// The generation settings of step 3: max_answer_seq_len new tokens, EOS = pad = the tokenizer's,
/// sampling as configured (greedy by default, as DS-Chat).
core::GenerationConfig experience_generation_config(const PolicyStepConfig& config, int64_t eos_token_id,
                                                    int64_t pad_token_id, uint64_t seed);

/// Generates and scores one batch. prompts, prompt_mask: [B, P] left padded, on the host or the
/// policy's device (host ones are copied over without waiting). Every tensor of the Experience
/// is on the policy's device; a reference elsewhere (offload_reference_model: the CPU) scores
/// there. Collective when the policy's engine has several ranks. Returns nullopt when every answer was dropped as too short
/// on some rank. Leaves the policy (and critic) in train mode, as DS-Chat: their scoring forwards
/// run in train mode; the reference is put in eval mode.
std::optional<Experience> generate_experience(ExperienceSources& sources, const torch::Tensor& prompts,
                                              const torch::Tensor& prompt_mask, const ExperienceOptions& options);

/// generate_experience over step 3's models: actor, reference, reward model and critic.
std::optional<Experience> make_experience(RlhfModels& models, const torch::Tensor& prompts,
                                          const torch::Tensor& prompt_mask, const core::GenerationConfig& generation,
                                          int64_t pad_token_id, int64_t min_answer_tokens);

}  // namespace rlhf
}  // namespace dschat
