// Batched prefill: several prompts' prefills in one forward, each row over its own cached tokens
// with its own number of new tokens (PagedKvCache's padded frame). The frame and the stored keys
// checked against plain tensors; on every fixture a batched forward of rows with different
// cached and new lengths gives each row the hidden states of its own unpadded prefill; the
// engine with and without batched_prefill gives the same ids under preemption, chunking, prefix
// caching and parking; prompts that share a prefix with one being prefilled wait one step and
// take its blocks from the cache, prefilled together in one forward; a forward's padding is
// bounded (rows of very different lengths go to separate forwards).
#include <gtest/gtest.h>

#include <map>

#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/kv_block_pool.h"
#include "dschat/inference/paged_kv_cache.h"
#include "dschat/models/load_save.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::ContinuousEngine;
using inference::ContinuousEngineOptions;
using inference::PagedKvCache;

std::vector<int64_t> id_run(int64_t length, int64_t first, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < length; ++t) ids.push_back((first + 5 * t) % (vocab - 4) + 4);
  return ids;
}

TEST(PagedKvCache, RowsWithDifferentNewTokenCountsAreRightAlignedAndOnlyRealTokensStored) {
  core::ModelConfig config;
  config.num_hidden_layers = 1;
  config.num_key_value_heads = 1;
  config.head_dim = 2;
  inference::KvBlockPool pool(config, 6, 2, torch::kFloat32, torch::kCPU);
  std::vector<int64_t> row0 = {5, 0}, row1 = {2, 3, 4};  // row 0: 1 cached + 2 new; row 1: 0 cached + 5 new
  {
    PagedKvCache warm(pool, {{&row0, 0}}, 1);
    warm.append(0, torch::full({1, 1, 1, 2}, 7.0), torch::full({1, 1, 1, 2}, 7.0));
  }
  PagedKvCache cache(pool, {{&row0, 1}, {&row1, 0}}, std::vector<int64_t>{2, 5});
  EXPECT_EQ(cache.cached_length(), 1);
  EXPECT_EQ(cache.new_tokens(), 5);
  EXPECT_TRUE(cache.padded());
  // Frame of 1 + 5 columns: row 0 = cached | 3 padding | 2 new; row 1 = padding | 5 new.
  EXPECT_TRUE(torch::equal(cache.attention_mask(),
                           torch::tensor({1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1}, torch::kInt64).view({2, 6})));
  torch::Tensor fresh = torch::arange(10, torch::kFloat32).view({2, 1, 5, 1}).expand({2, 1, 5, 2}).contiguous();  // [B, H_kv, T, D]
  auto [keys, values] = cache.append(0, fresh, fresh);  // [2, 1, 6, 2] each
  EXPECT_EQ(keys[0][0][0][0].item<float>(), 7.0f);                 // row 0's cached token
  EXPECT_EQ(keys[0][0][4][0].item<float>(), 3.0f);                 // its new tokens: columns 3 and 4 of its input
  EXPECT_EQ(keys[0][0][5][0].item<float>(), 4.0f);
  for (int64_t t = 0; t < 5; ++t) EXPECT_EQ(keys[1][0][1 + t][0].item<float>(), 5.0f + t);
  // Stored: row 0's tokens 1 and 2 (block 5 slot 1, block 0 slot 0); its padding columns nowhere.
  EXPECT_EQ(pool.keys(0)[5 * 2 + 1][0].item<float>(), 3.0f);
  EXPECT_EQ(pool.keys(0)[0][0].item<float>(), 4.0f);
  EXPECT_EQ(pool.keys(0)[1][0].item<float>(), 0.0f) << "row 0's block 0 slot 1 is beyond its tokens";
  EXPECT_EQ(pool.keys(0)[4 * 2][0].item<float>(), 9.0f);  // row 1's fifth token: block 4 slot 0
  EXPECT_THROW_WITH(PagedKvCache(pool, {{&row0, 0}}, std::vector<int64_t>{0}), core::InvalidArgument,
                    "row 0 feeds 0 new tokens");
  EXPECT_THROW_WITH(PagedKvCache(pool, {{&row0, 0}}, std::vector<int64_t>{1, 1}), core::InvalidArgument,
                    "a count of new tokens for each (got 2)");
}

class BatchedPrefillOnFixtures : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model = models::load_causal_lm(testing::fixture(GetParam()).string()); }
  int64_t vocab() const { return model->config().vocab_size; }
  models::CausalLM model{nullptr};
};

TEST_P(BatchedPrefillOnFixtures, EachRowGetsTheHiddenStatesOfItsOwnPrefill) {
  torch::NoGradGuard no_grad;
  const torch::Tensor first = model->parameters().front();
  inference::KvBlockPool pool(model->config(), 24, 4, first.scalar_type(), first.device());
  for (int64_t b = 0; b < 24; ++b) pool.allocate();
  // Three prompts; rows 0 and 2 have cached tokens (a prefix cache hit, an earlier chunk).
  const std::vector<std::vector<int64_t>> prompts = {id_run(10, 3, vocab()), id_run(3, 8, vocab()), id_run(9, 1, vocab())};
  const std::vector<int64_t> cached = {4, 0, 8};
  std::vector<std::vector<int64_t>> own = {{0, 1, 2}, {3}, {4, 5, 6}}, batched = {{7, 8, 9}, {10}, {11, 12, 13}};
  std::vector<torch::Tensor> expected;  // [1, new_r, E] each: the row's prefill alone, no padding
  std::vector<PagedKvCache::Row> rows;
  std::vector<int64_t> fed;
  for (size_t r = 0; r < prompts.size(); ++r) {
    const int64_t length = static_cast<int64_t>(prompts[r].size());
    torch::Tensor ids = torch::tensor(prompts[r], torch::kInt64).unsqueeze(0);  // [1, length]
    PagedKvCache whole(pool, {{&own[r], 0}}, length);
    expected.push_back(model->hidden_states(ids, whole.attention_mask(), &whole, nn::MaskLayout::kUnpadded)
                           .narrow(1, cached[r], length - cached[r]));
    if (cached[r] > 0) {  // the cached part, prefilled earlier into the batched row's own blocks
      PagedKvCache prefix(pool, {{&batched[r], 0}}, cached[r]);
      model->hidden_states(ids.narrow(1, 0, cached[r]), prefix.attention_mask(), &prefix, nn::MaskLayout::kUnpadded);
    }
    rows.push_back({&batched[r], cached[r]});
    fed.push_back(length - cached[r]);
  }
  PagedKvCache cache(pool, rows, fed);
  const int64_t width = cache.new_tokens();  // 6: row 0's
  torch::Tensor ids = torch::zeros({3, width}, torch::kInt64);  // [3, width], each row right-aligned
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<int64_t> tail(prompts[r].begin() + cached[r], prompts[r].end());
    ids[r].narrow(0, width - fed[r], fed[r]).copy_(torch::tensor(tail, torch::kInt64));
  }
  torch::Tensor hidden = model->hidden_states(ids, cache.attention_mask(), &cache, nn::MaskLayout::kLeftPadded);  // [3, width, E]
  for (int64_t r = 0; r < 3; ++r) {
    torch::Tensor got = hidden[r].narrow(0, width - fed[r], fed[r]).unsqueeze(0);  // [1, new_r, E]
    EXPECT_TRUE(torch::allclose(got, expected[r], 1e-4, 1e-5)) << "row " << r << ": " << (got - expected[r]).abs().max();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchedPrefillOnFixtures, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

// Submits prompts[i] before step i (then steps to the end); every answer by (request, sample).
std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> run_traffic(ContinuousEngine& engine,
                                                                        const std::vector<std::vector<int64_t>>& prompts,
                                                                        const core::GenerationConfig& config) {
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> answers;
  auto collect = [&](std::vector<inference::SequenceOutput> done) {
    for (auto& d : done) answers[{d.request, d.sample}] = std::move(d.generated);
  };
  for (const auto& prompt : prompts) {
    engine.submit(prompt, config);
    collect(engine.step());
  }
  while (engine.has_work()) collect(engine.step());
  return answers;
}

TEST(ContinuousEngine, BatchedPrefillGivesTheIdsOfOnePrefillPerPromptUnderPreemptionAndChunking) {
  auto model = models::load_causal_lm(testing::fixture("llama-gqa").string());
  const int64_t vocab = model->config().vocab_size;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t p = 0; p < 12; ++p) prompts.push_back(id_run(2 + (p * 7) % 13, p, vocab));
  for (const bool prefix_caching : {false, true}) {
    for (const bool sample : {false, true}) {
      core::GenerationConfig config;
      config.max_new_tokens = 10;
      config.num_return_sequences = 2;
      config.do_sample = sample;
      config.temperature = 1.2;
      config.seed = 9;
      auto run = [&](bool batched) {
        ContinuousEngineOptions options;
        options.block_size = 4;
        options.num_blocks = 18;  // preemption
        options.max_running_sequences = 5;  // parking
        options.max_prefill_tokens = 12;    // chunks
        options.prefix_caching = prefix_caching;
        options.batched_prefill = batched;
        ContinuousEngine engine(model, options);
        // Two waves: prompts arriving one per step, then all at once (several prefills per step).
        auto answers = run_traffic(engine, prompts, config);
        std::vector<std::vector<int64_t>> wave = prompts;
        for (auto& prompt : wave) engine.submit(prompt, config);
        while (engine.has_work()) {
          for (auto& d : engine.step()) answers[{d.request, d.sample}] = d.generated;
        }
        const int64_t cached = prefix_caching ? engine.prefix_cache()->cached_blocks() : 0;
        EXPECT_EQ(engine.pool().free_blocks() + cached, engine.pool().num_blocks());
        return std::make_pair(answers, engine.stats());
      };
      const auto [expected, one_by_one] = run(false);
      const auto [got, batched] = run(true);
      const std::string what = std::string(sample ? "sampled" : "greedy") + (prefix_caching ? ", prefix caching" : "");
      EXPECT_EQ(got, expected) << what;
      EXPECT_EQ(one_by_one.prefill_forwards, one_by_one.prefill_rows) << what;
      EXPECT_LT(batched.prefill_forwards, batched.prefill_rows) << what << ": no step batched two prefills";
      EXPECT_GT(batched.preemptions, 0) << what;
      EXPECT_GT(batched.parked_samples, 0) << what;
    }
  }
}

TEST(ContinuousEngine, PromptsSharingAPrefixBeingPrefilledWaitAStepAndTakeItFromTheCache) {
  auto model = models::load_causal_lm(testing::fixture("opt-preln").string());
  const std::vector<int64_t> system = id_run(12, 2, model->config().vocab_size);  // 3 full blocks of 4
  ContinuousEngineOptions options;
  options.block_size = 4;
  options.prefix_caching = true;
  ContinuousEngine engine(model, options);
  core::GenerationConfig config;
  config.max_new_tokens = 3;
  for (int64_t p = 0; p < 4; ++p) {
    std::vector<int64_t> prompt = system;
    prompt.push_back(10 + p);  // 13 tokens: the last one is always fed
    engine.submit(prompt, config);
  }
  engine.step();  // the first prompt alone: the others would share its blocks
  EXPECT_EQ(engine.stats().prefill_rows, 1);
  EXPECT_EQ(engine.waiting_sequences(), 3);
  engine.step();  // the other three, one token each over the cached 12, in one forward
  EXPECT_EQ(engine.stats().prefill_rows, 4);
  EXPECT_EQ(engine.stats().prefill_forwards, 2);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 3 * 12);
  EXPECT_EQ(engine.stats().prefill_tokens, 13 + 3);
  while (engine.has_work()) engine.step();
}

TEST(ContinuousEngine, ABatchedPrefillForwardPadsAtMostTwiceItsRealTokens) {
  auto model = models::load_causal_lm(testing::fixture("opt-preln").string());
  const int64_t vocab = model->config().vocab_size;
  ContinuousEngineOptions options;
  options.block_size = 4;
  ContinuousEngine engine(model, options);
  core::GenerationConfig config;
  config.max_new_tokens = 2;
  // 40 + 3 tokens: 2 x 40 <= 2 x 43, one forward; a third row would make 3 x 40 > 2 x 46.
  engine.submit(id_run(40, 1, vocab), config);
  for (int64_t p = 0; p < 4; ++p) engine.submit(id_run(3, 2 + p, vocab), config);
  engine.step();
  EXPECT_EQ(engine.stats().prefill_rows, 5);
  EXPECT_EQ(engine.stats().prefill_forwards, 2) << "[40, 3] and [3, 3, 3]";
  EXPECT_EQ(engine.stats().prefill_tokens, 40 + 4 * 3);
  while (engine.has_work()) engine.step();
}

}  // namespace
}  // namespace dschat
