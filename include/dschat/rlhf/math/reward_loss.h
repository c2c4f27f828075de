#pragma once
// DeepSpeed-Chat's reward-model math (dschat/utils/model/reward_model.py) over the value head's
// per-token outputs: the step-2 pairwise loss of RewardModel.forward and the end score of
// RewardModel.forward_value that step 3 uses as the reward. docs/rlhf.md has the index rules.

#include <torch/torch.h>

#include <cstdint>

namespace dschat {
namespace rlhf {

struct RewardLossOutput {
  torch::Tensor loss;                 // [] differentiable: sum over pairs of the span loss, / B
  torch::Tensor chosen_end_scores;    // [B] value at the chosen row's last real token ("chosen_mean_scores")
  torch::Tensor rejected_end_scores;  // [B] value at the rejected row's last real token
};

/// The per-pair indices RewardModel.forward derives from the ids (exposed for tests and logging).
struct PairIndices {
  int64_t chosen_end = 0;    // c_ind: position of the (npb)-th pad of the chosen row, or T without one
  int64_t rejected_end = 0;  // r_ind: the same on the rejected row (= c_ind for identical rows)
  int64_t divergence = 0;    // first position where the rows differ (T-1 for identical rows)
  int64_t span_end = 0;      // end_ind: max(c_ind, r_ind) (T for identical rows)
};

/// c_ind/r_ind/divergence/end of one pair, as RewardModel.forward's loop body. chosen, rejected:
/// [T] integer ids. Throws core::InvalidArgument where DS-Chat asserts (divergence at position 0)
/// and where it would silently produce NaN or a wrapped index: an empty span [divergence, end)
/// or an end index of 0 (the row begins with a pad that num_padding_at_beginning does not skip).
PairIndices reward_pair_indices(const torch::Tensor& chosen, const torch::Tensor& rejected, int64_t pad_token_id,
                                int64_t num_padding_at_beginning);

/// RewardModel.forward's loss. input_ids: [2B, T], rows 0..B-1 chosen and B..2B-1 rejected (the
/// DataCollatorReward order); values: [2B, T], the v_head output per token. For each pair i:
///   loss_i = mean over t in [divergence, span_end) of -logsigmoid(values_c[t] - values_r[t])
/// (the slices cast to float32 first when compute_fp32), loss = (loss_0 + ... + loss_{B-1}) / B.
/// End scores: values_c[c_ind - 1], values_r[r_ind - 1]. The indices are computed on the host:
/// pass the batch's host ids with device values and nothing waits for the device (device ids
/// are copied back first, which does).
RewardLossOutput reward_pairwise_loss(const torch::Tensor& input_ids, const torch::Tensor& values,
                                      int64_t pad_token_id, int64_t num_padding_at_beginning,
                                      bool compute_fp32 = false);

/// RewardModel.forward_value's chosen_end_scores: per row, c_ind = prompt_length + the first pad
/// position in input_ids[:, prompt_length:] (T when there is none), score = values[c_ind - 1].
/// input_ids, values: [B, T]; prompt_length > 1 (DS-Chat asserts it). Returns [B], differentiable.
torch::Tensor reward_end_scores(const torch::Tensor& input_ids, const torch::Tensor& values, int64_t pad_token_id,
                                int64_t prompt_length);

}  // namespace rlhf
}  // namespace dschat
