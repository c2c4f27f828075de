#include "dschat/rlhf/math/reward_loss.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/tensor_util.h"
#include "dschat/core/error.h"

namespace dschat {
namespace rlhf {
using core::shape_of;
namespace {


// `c_inds[npb] if len(c_inds) > npb else seq_len`: the (npb)-th pad position. With OPT's BOS equal
// to its pad, npb = 1 skips the BOS and lands on the first real pad, i.e. one past the last token.
int64_t end_index(const int64_t* ids, int64_t length, int64_t pad_token_id, int64_t num_padding_at_beginning) {
  int64_t seen = 0;
  for (int64_t t = 0; t < length; ++t) {
    if (ids[t] != pad_token_id) continue;
    if (seen == num_padding_at_beginning) return t;
    ++seen;
  }
  return length;
}

}  // namespace

PairIndices reward_pair_indices(const torch::Tensor& chosen, const torch::Tensor& rejected, int64_t pad_token_id,
                                int64_t num_padding_at_beginning) {
  DSCHAT_CHECK(chosen.defined() && chosen.dim() == 1, InvalidArgument,
               "reward_pair_indices: expected chosen ids [T], got ", chosen.defined() ? shape_of(chosen) : "undefined");
  DSCHAT_CHECK(rejected.defined() && rejected.sizes() == chosen.sizes(), InvalidArgument,
               "reward_pair_indices: rejected ids ", rejected.defined() ? shape_of(rejected) : "undefined",
               " must have the shape of chosen ", shape_of(chosen));
  DSCHAT_CHECK(num_padding_at_beginning >= 0, InvalidArgument,
               "reward_pair_indices: num_padding_at_beginning must be >= 0, got ", num_padding_at_beginning);
  torch::Tensor c_ids = chosen.to(torch::kCPU, torch::kLong).contiguous();    // [T]
  torch::Tensor r_ids = rejected.to(torch::kCPU, torch::kLong).contiguous();  // [T]
  const int64_t length = c_ids.size(0);
  const int64_t* c = c_ids.data_ptr<int64_t>();
  const int64_t* r = r_ids.data_ptr<int64_t>();

  PairIndices out;
  out.chosen_end = end_index(c, length, pad_token_id, num_padding_at_beginning);
  const int64_t first_difference = std::mismatch(c, c + length, r).first - c;
  if (first_difference == length) {
    // Identical rows: DS-Chat scores only the last position (the loss is log 2 with no gradient).
    out.span_end = length;
    out.divergence = length - 1;
    out.rejected_end = out.chosen_end;
  } else {
    out.rejected_end = end_index(r, length, pad_token_id, num_padding_at_beginning);
    out.span_end = std::max(out.chosen_end, out.rejected_end);
    out.divergence = first_difference;
  }
  DSCHAT_CHECK(out.divergence > 0, InvalidArgument, "reward_pair_indices: the rows differ at position 0 (",
               "DS-Chat asserts divergence_ind > 0)");
  // DS-Chat would index values[-1] here (Python wraps) and average an empty span into NaN; with
  // right padding this means num_padding_at_beginning does not cover a leading pad (OPT needs 1).
  DSCHAT_CHECK(out.chosen_end > 0 && out.rejected_end > 0, InvalidArgument,
               "reward_pair_indices: a row begins with the pad id ", pad_token_id, " that num_padding_at_beginning ",
               num_padding_at_beginning, " does not skip (OPT's BOS is its pad: use 1)");
  DSCHAT_CHECK(out.divergence < out.span_end, InvalidArgument, "reward_pair_indices: empty loss span [",
               out.divergence, ", ", out.span_end, "): the rows first differ after both ends");
  return out;
}

RewardLossOutput reward_pairwise_loss(const torch::Tensor& input_ids, const torch::Tensor& values,
                                      int64_t pad_token_id, int64_t num_padding_at_beginning, bool compute_fp32) {
  DSCHAT_CHECK(input_ids.defined() && input_ids.dim() == 2 && input_ids.size(0) % 2 == 0 && input_ids.size(0) > 0,
               InvalidArgument, "reward_pairwise_loss: expected input_ids [2B, T] with B > 0, got ",
               input_ids.defined() ? shape_of(input_ids) : "undefined");
  DSCHAT_CHECK(values.defined() && values.sizes() == input_ids.sizes(), InvalidArgument,
               "reward_pairwise_loss: values ", values.defined() ? shape_of(values) : "undefined",
               " must have the shape of input_ids ", shape_of(input_ids));
  const int64_t pairs = input_ids.size(0) / 2;
  torch::Tensor ids = input_ids.to(torch::kCPU, torch::kLong);  // [2B, T], read once on the host
  torch::Tensor chosen_values = values.slice(0, 0, pairs);      // [B, T]
  torch::Tensor rejected_values = values.slice(0, pairs);       // [B, T]

  std::vector<int64_t> chosen_last(pairs);    // c_ind - 1 per pair
  std::vector<int64_t> rejected_last(pairs);  // r_ind - 1 per pair
  torch::Tensor loss;                         // [] running sum over pairs, in pair order as DS-Chat
  for (int64_t i = 0; i < pairs; ++i) {
    const PairIndices idx = reward_pair_indices(ids[i], ids[pairs + i], pad_token_id, num_padding_at_beginning);
    chosen_last[i] = idx.chosen_end - 1;
    rejected_last[i] = idx.rejected_end - 1;
    torch::Tensor c = chosen_values[i].slice(0, idx.divergence, idx.span_end);    // [span]
    torch::Tensor r = rejected_values[i].slice(0, idx.divergence, idx.span_end);  // [span]
    if (compute_fp32) {
      c = c.to(torch::kFloat);
      r = r.to(torch::kFloat);
    }
    torch::Tensor pair_loss = -torch::log_sigmoid(c - r).mean();  // []
    loss = loss.defined() ? loss + pair_loss : pair_loss;
  }
  RewardLossOutput out;
  out.loss = loss / pairs;
  auto gather_at = [&](const torch::Tensor& rows, const std::vector<int64_t>& positions) {
    // Queued, not waited for: the host would otherwise wait for the GPU's forward every micro-batch.
    torch::Tensor index = core::host_to_device(torch::tensor(positions, torch::kLong), rows.device()).unsqueeze(1);  // [B, 1]
    return rows.gather(1, index).squeeze(1);                                                     // [B]
  };
  out.chosen_end_scores = gather_at(chosen_values, chosen_last);
  out.rejected_end_scores = gather_at(rejected_values, rejected_last);
  return out;
}

torch::Tensor reward_end_scores(const torch::Tensor& input_ids, const torch::Tensor& values, int64_t pad_token_id,
                                int64_t prompt_length) {
  DSCHAT_CHECK(input_ids.defined() && input_ids.dim() == 2, InvalidArgument,
               "reward_end_scores: expected input_ids [B, T], got ",
               input_ids.defined() ? shape_of(input_ids) : "undefined");
  DSCHAT_CHECK(values.defined() && values.sizes() == input_ids.sizes(), InvalidArgument,
               "reward_end_scores: values ", values.defined() ? shape_of(values) : "undefined",
               " must have the shape of input_ids ", shape_of(input_ids));
  DSCHAT_CHECK(prompt_length > 1, InvalidArgument,
               "reward_end_scores: prompt_length must be greater than 1 to help select the end score, got ",
               prompt_length);
  const int64_t length = input_ids.size(1);
  torch::Tensor end;  // [B] c_ind
  if (prompt_length >= length) {
    end = torch::full({input_ids.size(0)}, length, input_ids.options().dtype(torch::kLong));
  } else {
    // Only the answer is searched, so the prompt's left padding (and OPT's BOS) never counts.
    torch::Tensor is_pad = input_ids.slice(1, prompt_length).eq(pad_token_id);  // [B, T-P]
    torch::Tensor first_pad = is_pad.to(torch::kInt).argmax(1);                 // [B] first max = first pad
    end = torch::where(is_pad.any(1), first_pad + prompt_length, torch::full_like(first_pad, length));
  }
  return values.gather(1, end.sub(1).unsqueeze(1).to(values.device())).squeeze(1);  // [B]
}

}  // namespace rlhf
}  // namespace dschat
