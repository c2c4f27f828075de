#pragma once
// Log-probabilities of tokens under a model, for callers that report them (`dschat serve`'s
// OpenAI `logprobs`, evaluation harnesses that score a continuation given a context).
//
// A log-probability is the log-softmax of the model's raw logits in float32: before temperature,
// top-k/top-p, repetition penalty or EOS suppression (vLLM's default "raw" log-probs), so it says
// what the model thinks, not how a request chose to sample.
//
//   auto scored = score_tokens(model, prompt_ids, /*top=*/5);  // prompt_ids.size() - 1 entries
//   scored[t].token == prompt_ids[t + 1]; scored[t].logprob = log p(prompt_ids[t + 1] | prompt_ids[..t])

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "dschat/models/causal_lm.h"

namespace dschat {
namespace inference {

/// One token and its log-probability.
struct TokenLogprob {
  int64_t token = 0;
  float logprob = 0.0f;
};

/// A token at one position, with the `top` most likely tokens there (most likely first; ties in
/// ascending id order).
struct ScoredToken {
  int64_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

/// Most alternatives one position reports (OpenAI's chat API allows 20).
constexpr int64_t kMaxTopLogprobs = 20;

/// log_probs: [R, V] float32 log-softmaxed rows; tokens[r] the token whose log-prob row r reports,
/// with top[r] alternatives (0..kMaxTopLogprobs) -> R entries, copied to the host in one transfer.
std::vector<ScoredToken> score_rows(const torch::Tensor& log_probs, const std::vector<int64_t>& tokens,
                                    const std::vector<int64_t>& top);

/// Every token of `ids` after the first, scored given the tokens before it: one forward without a
/// cache, the LM head applied `chunk` positions at a time so the [T, V] logits are never whole.
/// Throws core::InvalidArgument for fewer than 1 id or `top` outside [0, kMaxTopLogprobs].
std::vector<ScoredToken> score_tokens(models::CausalLM& model, const std::vector<int64_t>& ids, int64_t top,
                                      torch::Device device, int64_t chunk = 128);

}  // namespace inference
}  // namespace dschat
