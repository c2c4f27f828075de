// Log-probabilities the continuous engine reports with the tokens it draws (SampleOptions::logprobs)
// against score_tokens' one forward over the same ids, and score_rows' order and limits.
// (dschat serve's logprobs against transformers: tests/serve/api_test.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/token_logprobs.h"
#include "dschat/models/load_save.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

TEST(TokenLogprobs, DrawnTokensCarryTheLogSoftmaxOfTheRawLogits) {
  auto model = models::load_causal_lm(testing::fixture("opt-preln").string());
  inference::ContinuousEngine engine(model, {});
  core::GenerationConfig config;
  config.max_new_tokens = 5;
  config.min_new_tokens = 5;
  config.do_sample = true;
  config.temperature = 1.7;  // the reported log-probs are the raw model's, not the tempered ones
  config.top_k = 7;
  config.seed = 3;
  config.num_return_sequences = 2;
  const std::vector<int64_t> prompt = {4, 9, 11, 2, 30, 7};
  inference::SampleOptions scored;
  scored.logprobs = 3;
  const int64_t with = engine.submit(prompt, config, scored);
  const int64_t without = engine.submit(prompt, config);
  std::map<std::pair<int64_t, int64_t>, std::vector<inference::ScoredToken>> drawn;  // (request, sample) -> tokens
  std::map<int64_t, std::vector<int64_t>> plain;  // sample -> tokens of the request without log-probs
  while (engine.has_work()) {
    engine.step();
    for (const auto& step : engine.last_step_tokens()) {
      if (step.request == without) {
        EXPECT_FALSE(step.logprobs.has_value());
        plain[step.sample].push_back(step.token);
        continue;
      }
      ASSERT_TRUE(step.logprobs.has_value());
      EXPECT_EQ(step.logprobs->token, step.token);
      drawn[{step.request, step.sample}].push_back(*step.logprobs);
    }
  }
  ASSERT_EQ(drawn.size(), 2u);
  for (const auto& [key, tokens] : drawn) {
    ASSERT_EQ(tokens.size(), 5u);
    std::vector<int64_t> ids = prompt;
    for (const auto& token : tokens) ids.push_back(token.token);
    // Same seeds, same draws: asking for log-probs changes no token.
    EXPECT_EQ(std::vector<int64_t>(ids.begin() + static_cast<int64_t>(prompt.size()), ids.end()), plain[key.second]);
    // One forward over prompt + drawn tokens: entry t - 1 scores ids[t].
    const auto reference = inference::score_tokens(model, ids, 3, torch::kCPU);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const inference::ScoredToken& want = reference[prompt.size() - 1 + i];
      const inference::ScoredToken& got = tokens[i];
      EXPECT_EQ(got.token, want.token);
      EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "sample " << key.second << " token " << i;
      ASSERT_EQ(got.top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(got.top[k].token, want.top[k].token);
        EXPECT_NEAR(got.top[k].logprob, want.top[k].logprob, 1e-4);
        if (k > 0) EXPECT_GE(got.top[k - 1].logprob, got.top[k].logprob);
      }
      EXPECT_LE(got.logprob, got.top[0].logprob);
    }
  }
  // Scores sum to probability 1 over the vocabulary: the top entry of a row is a log-prob, not a logit.
  EXPECT_LT(drawn.begin()->second[0].top[0].logprob, 0.0f);
}

TEST(TokenLogprobs, RowsOrderTiesByIdAndLimitsAreNamed) {
  torch::Tensor log_probs = torch::log_softmax(torch::tensor({{1.0f, 3.0f, 3.0f, 0.5f}}), 1);  // [1, 4]
  const auto rows = inference::score_rows(log_probs, {0}, {3});
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0].top.size(), 3u);
  EXPECT_EQ(rows[0].top[0].token, 1);  // ids 1 and 2 tie: ascending id
  EXPECT_EQ(rows[0].top[1].token, 2);
  EXPECT_EQ(rows[0].top[2].token, 0);
  EXPECT_NEAR(rows[0].logprob, log_probs[0][0].item<float>(), 0.0f);
  EXPECT_EQ(inference::score_rows(log_probs, {3}, {0})[0].top.size(), 0u);
  EXPECT_EQ(inference::score_rows(log_probs, {3}, {20})[0].top.size(), 4u);  // no more than the vocabulary
  EXPECT_THROW_WITH(inference::score_rows(log_probs, {3}, {21}), core::InvalidArgument, "top 21 exceeds 20");
  auto model = models::load_causal_lm(testing::fixture("opt-preln").string());
  EXPECT_TRUE(inference::score_tokens(model, {5}, 2, torch::kCPU).empty());
  EXPECT_THROW_WITH(inference::score_tokens(model, {}, 2, torch::kCPU), core::InvalidArgument, "no ids");
  inference::ContinuousEngine engine(model, {});
  inference::SampleOptions bad;
  bad.logprobs = 21;
  core::GenerationConfig config;
  EXPECT_THROW_WITH(engine.submit({1, 2}, config, bad), core::InvalidArgument, "logprobs must be -1 (none) or in [0, 20]");
  // Chunked scoring equals one chunk.
  const std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  const auto whole = inference::score_tokens(model, ids, 2, torch::kCPU, 128);
  const auto chunked = inference::score_tokens(model, ids, 2, torch::kCPU, 3);
  ASSERT_EQ(whole.size(), 7u);
  for (size_t t = 0; t < whole.size(); ++t) {
    EXPECT_NEAR(whole[t].logprob, chunked[t].logprob, 1e-5);
    EXPECT_EQ(whole[t].top[0].token, chunked[t].top[0].token);
  }
}

}  // namespace
}  // namespace dschat
