// Top-p without a full sort (outside_top_p: the CPU quickselect; outside_top_p_by_topk: the
// devices' path) against Hugging Face's TopPLogitsWarper rule computed
// the way it computes it (ascending sort, cumulative softmax, drop <= 1 - top_p, keep the best);
// the logit bias and the penalties against OpenAI's formula.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dschat/core/error.h"
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

// OpenAI's penalties (its API reference: mu[j] - c[j] * frequency - (c[j] > 0) * presence, c[j]
// counting token j among the tokens generated so far) after the logit bias and Hugging Face's
// repetition penalty, in vLLM's order, element by element in plain C++: the reference.
TEST(Penalties, EqualOpenAIsFormulaAfterTheBiasAndRepetitionPenalty) {
  torch::manual_seed(9);
  const int64_t rows = 3, vocab = 40, prompt = 5, generated = 7;
  torch::Tensor logits = torch::randn({rows, vocab}) * 3.0;  // [B, V]
  logits[1][6] = logits[1].max().item<float>() + 1.0f;      // row 1's best token, the one its answer repeats
  // Generated ids with repeats; row 2 also repeats prompt ids in its answer.
  torch::Tensor seen = torch::tensor({{1, 2, 3, 4, 5, 7, 7, 7, 8, 9, 7, 1},
                                      {0, 0, 0, 0, 6, 6, 6, 6, 6, 6, 6, 6},
                                      {2, 4, 6, 8, 10, 2, 4, 2, 39, 39, 11, 12}},
                                     torch::kInt64);  // [B, T + generated]
  ASSERT_EQ(seen.size(1), prompt + generated);
  core::GenerationConfig config;
  config.repetition_penalty = 1.3;
  config.frequency_penalty = 0.45;
  config.presence_penalty = -0.7;  // negative: rewards a token used before
  config.logit_bias = {{7, 2.5}, {39, -100.0}, {0, 1.25}};
  config.eos_token_id = 3;
  config.min_new_tokens = generated + 1;  // EOS still suppressed
  torch::Tensor got = inference::process_logits(logits.clone(), seen, config, generated);  // [B, V]

  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < vocab; ++j) {
      float expected = logits[r][j].item<float>();
      if (config.logit_bias.count(j)) expected += static_cast<float>(config.logit_bias.at(j));
      bool in_seen = false;
      int64_t count = 0;  // times generated
      for (int64_t t = 0; t < seen.size(1); ++t) {
        const bool match = seen[r][t].item<int64_t>() == j;
        in_seen = in_seen || match;
        if (match && t >= prompt) ++count;
      }
      if (in_seen) expected = expected < 0 ? expected * 1.3f : expected / 1.3f;
      expected -= static_cast<float>(count) * 0.45f;
      if (count > 0) expected -= -0.7f;
      if (j == 3) expected = -std::numeric_limits<float>::infinity();
      const float value = got[r][j].item<float>();
      if (std::isinf(expected)) {
        EXPECT_TRUE(std::isinf(value) && value < 0) << "row " << r << " token " << j;
      } else {
        EXPECT_NEAR(value, expected, 1e-5 + 1e-6 * std::fabs(expected)) << "row " << r << " token " << j;
      }
    }
  }
  // Greedy decoding sees them too (vLLM applies them before its argmax).
  EXPECT_FALSE(config.do_sample);
  EXPECT_EQ(logits.argmax(1)[1].item<int64_t>(), 6);
  EXPECT_NE(got.argmax(1)[1].item<int64_t>(), 6) << "row 1's answer repeats 6 seven times: the frequency penalty "
                                                    "(0.45 each) and the repetition penalty push it down";
  // A bias on a token outside the vocabulary names it.
  config.logit_bias = {{vocab, 1.0}};
  try {
    inference::process_logits(logits.clone(), seen, config, generated);
    ADD_FAILURE() << "a bias outside the vocabulary was accepted";
  } catch (const core::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("logit_bias: token id 40 is outside the vocabulary (40 ids)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dschat
