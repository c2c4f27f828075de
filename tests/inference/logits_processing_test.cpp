// Top-p without a full sort (outside_top_p: the CPU quickselect; outside_top_p_by_topk: the
// devices' path) against Hugging Face's TopPLogitsWarper rule computed
// the way it computes it (ascending sort, cumulative softmax, drop <= 1 - top_p, keep the best).
#include <gtest/gtest.h>

#include "dschat/inference/logits_processing.h"

namespace dschat {
namespace {

// TopPLogitsWarper, as transformers writes it: the reference.
torch::Tensor sorted_rule(const torch::Tensor& logits, double top_p) {
  auto [sorted, order] = logits.sort(1, /*descending=*/false);  // [B, V] each
  torch::Tensor cumulative = sorted.softmax(1).cumsum(1);       // [B, V]
  torch::Tensor drop = cumulative <= (1.0 - top_p);             // [B, V]
  drop.select(1, drop.size(1) - 1).fill_(false);
  return drop.scatter(1, order, drop);
}

TEST(TopP, WithoutSortingEqualsTheSortingRule) {
  torch::manual_seed(5);
  const int64_t vocab = 5000;
  std::vector<std::pair<std::string, torch::Tensor>> cases = {
      {"peaked", torch::randn({6, vocab}) * 4.0},   // the nucleus within the first 64
      {"flat", torch::randn({6, vocab}) * 0.1},     // thousands of tokens: k grows to the vocabulary
      {"mixed", torch::cat({torch::randn({3, vocab}) * 4.0, torch::randn({3, vocab}) * 0.3})},
  };
  torch::Tensor masked = torch::randn({4, vocab}) * 2.0;  // top-k's -inf entries before top-p
  masked.narrow(1, 0, vocab / 2).fill_(-std::numeric_limits<float>::infinity());
  cases.emplace_back("masked", masked);
  for (const auto& [name, logits] : cases) {
    for (double top_p : {0.1, 0.5, 0.9, 0.95, 0.999}) {
      EXPECT_TRUE(torch::equal(inference::outside_top_p(logits, top_p), inference::outside_top_p_by_topk(logits, top_p)))
          << name << " top_p " << top_p << ": the CPU quickselect and the topk path agree";
      torch::Tensor fast = inference::outside_top_p(logits, top_p);  // [B, V]
      torch::Tensor reference = sorted_rule(logits, top_p);            // [B, V]
      // A token exactly at the boundary may go either way by float rounding: count the rest.
      torch::Tensor probabilities = logits.softmax(1);
      torch::Tensor differ = fast.ne(reference);
      const int64_t differing = differ.sum().item<int64_t>();
      EXPECT_LE(differing, 1) << name << " top_p " << top_p;
      EXPECT_TRUE(fast.logical_not().any(1).all().item<bool>()) << name << ": every row keeps a token";
      EXPECT_GT(reference.logical_not().sum().item<int64_t>(), 0);
      if (differing == 0) continue;
      // The one that differs sits at the boundary: the kept mass without it is within 1e-5 of top_p.
      const auto where = differ.nonzero();
      const int64_t row = where[0][0].item<int64_t>();
      const double kept_mass = probabilities[row].masked_select(reference[row].logical_not()).sum().item<double>();
      const double token = probabilities[row][where[0][1].item<int64_t>()].item<double>();
      EXPECT_NEAR(kept_mass - token, top_p, 1e-5) << name;
    }
  }
}

TEST(TopP, KeepsTheBestTokenWhenItAloneExceedsTopP) {
  torch::Tensor logits = torch::tensor({{10.0f, 0.0f, 0.0f, 0.0f}});  // [1, 4]
  torch::Tensor drop = inference::outside_top_p(logits, 0.5);
  EXPECT_TRUE(torch::equal(drop, torch::tensor({{false, true, true, true}})));
  EXPECT_TRUE(torch::equal(inference::outside_top_p(logits, 1.0 - 1e-9), torch::tensor({{false, false, false, false}})));
  EXPECT_TRUE(torch::equal(inference::outside_top_p_by_topk(logits, 0.5), drop));
  // Ties at the smallest kept probability are all kept.
  torch::Tensor tied = torch::tensor({{2.0f, 1.0f, 1.0f, 0.0f}});  // p = 0.48, 0.18, 0.18, 0.06
  EXPECT_TRUE(torch::equal(inference::outside_top_p(tied, 0.6), torch::tensor({{false, false, false, true}})));
}

}  // namespace
}  // namespace dschat
