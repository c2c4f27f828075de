#include "dschat/inference/token_logprobs.h"

#include <algorithm>

#include "dschat/core/error.h"

namespace dschat {
namespace inference {

std::vector<ScoredToken> score_rows(const torch::Tensor& log_probs, const std::vector<int64_t>& tokens,
                                    const std::vector<int64_t>& top) {
  const int64_t rows = log_probs.size(0);
  DSCHAT_CHECK(static_cast<int64_t>(tokens.size()) == rows && static_cast<int64_t>(top.size()) == rows,
               InvalidArgument, "score_rows: ", rows, " rows, ", tokens.size(), " tokens, ", top.size(), " top counts");
  const int64_t most = rows == 0 ? 0 : *std::max_element(top.begin(), top.end());
  DSCHAT_CHECK(most <= kMaxTopLogprobs, InvalidArgument, "score_rows: top ", most, " exceeds ", kMaxTopLogprobs);
  torch::Tensor index = torch::tensor(tokens, torch::kInt64).to(log_probs.device()).unsqueeze(1);  // [R, 1]
  torch::Tensor chosen = log_probs.gather(1, index).squeeze(1);                                     // [R]
  torch::Tensor top_values, top_ids;  // [R, most] each
  if (most > 0) {
    // Sorted, stable: equal log-probs keep ascending ids, so the order does not depend on the kernel.
    auto sorted = log_probs.topk(std::min(most, log_probs.size(1)), /*dim=*/1, /*largest=*/true, /*sorted=*/true);
    top_values = std::get<0>(sorted);
    top_ids = std::get<1>(sorted);
  }
  const torch::Tensor host_chosen = chosen.to(torch::kCPU, torch::kFloat32).contiguous();
  const torch::Tensor host_values = most > 0 ? top_values.to(torch::kCPU, torch::kFloat32).contiguous() : torch::Tensor();
  const torch::Tensor host_ids = most > 0 ? top_ids.to(torch::kCPU).contiguous() : torch::Tensor();
  std::vector<ScoredToken> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    ScoredToken& scored = out[static_cast<size_t>(r)];
    scored.token = tokens[static_cast<size_t>(r)];
    scored.logprob = host_chosen.data_ptr<float>()[r];
    const int64_t k = std::min(top[static_cast<size_t>(r)], most > 0 ? host_ids.size(1) : int64_t{0});
    for (int64_t i = 0; i < k; ++i) {
      scored.top.push_back(TokenLogprob{host_ids.data_ptr<int64_t>()[r * host_ids.size(1) + i],
                                        host_values.data_ptr<float>()[r * host_values.size(1) + i]});
    }
    // topk breaks ties in no promised order: equal log-probs go in ascending id order.
    std::stable_sort(scored.top.begin(), scored.top.end(), [](const TokenLogprob& a, const TokenLogprob& b) {
      return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
    });
  }
  return out;
}

std::vector<ScoredToken> score_tokens(models::CausalLM& model, const std::vector<int64_t>& ids, int64_t top,
                                      torch::Device device, int64_t chunk) {
  DSCHAT_CHECK(!ids.empty(), InvalidArgument, "score_tokens: no ids");
  DSCHAT_CHECK(top >= 0 && top <= kMaxTopLogprobs, InvalidArgument, "score_tokens: top must be in [0, ",
               kMaxTopLogprobs, "], got ", top);
  DSCHAT_CHECK(chunk >= 1, InvalidArgument, "score_tokens: chunk must be >= 1, got ", chunk);
  const int64_t length = static_cast<int64_t>(ids.size());
  if (length == 1) return {};
  torch::NoGradGuard no_grad;
  torch::Tensor input = torch::tensor(ids, torch::kInt64).to(device).unsqueeze(0);  // [1, T]
  torch::Tensor hidden = model->hidden_states(input).squeeze(0);                    // [T, E]
  std::vector<ScoredToken> out;
  out.reserve(static_cast<size_t>(length - 1));
  // Position t's logits predict ids[t + 1]: positions 0 .. T - 2.
  for (int64_t begin = 0; begin < length - 1; begin += chunk) {
    const int64_t end = std::min(begin + chunk, length - 1);
    torch::Tensor logits = model->lm_logits(hidden.slice(0, begin, end)).to(torch::kFloat32);  // [C, V]
    torch::Tensor log_probs = torch::log_softmax(logits, /*dim=*/1);                             // [C, V]
    std::vector<int64_t> next(ids.begin() + begin + 1, ids.begin() + end + 1);
    std::vector<ScoredToken> part = score_rows(log_probs, next, std::vector<int64_t>(next.size(), top));
    out.insert(out.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return out;
}

}  // namespace inference
}  // namespace dschat
