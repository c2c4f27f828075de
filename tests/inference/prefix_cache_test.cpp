// Prefills over cached tokens: prefix caching across requests and chunked prefill. The
// PrefixCache's tree of blocks (reference counts, LRU leaf eviction, two copies of one prefix), a
// prefill over cached blocks against a full prefill on every fixture (hidden states within float
// tolerance), the continuous engine with prefix caching against the same engine without it
// (greedy and seeded ids) for a shared system prompt, a second chat turn that starts with the
// first turn's prompt and answer, recompute preemption and random traffic with cancels; a long
// prompt prefilled in chunks of the step budget while another sequence decodes, and cancelled
// mid-prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/kv_block_pool.h"
#include "dschat/inference/paged_kv_cache.h"
#include "dschat/inference/prefix_cache.h"
#include "dschat/models/load_save.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::ContinuousEngine;
using inference::ContinuousEngineOptions;

TEST(PrefixCache, MatchesTheLongestCachedPrefixAndEvictsLeastRecentlyUsedLeavesFirst) {
  core::ModelConfig one_layer;  // 1 layer, 1 key/value head of 2 dims: the cache never reads them
  one_layer.num_hidden_layers = 1;
  one_layer.num_key_value_heads = 1;
  one_layer.head_dim = 2;
  inference::KvBlockPool pool(one_layer, 6, 2, torch::kFloat32, torch::kCPU);
  inference::PrefixCache cache(pool);
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5};  // 2 full blocks of 2 tokens and 1 token
  std::vector<int64_t> blocks = {*pool.allocate(), *pool.allocate(), *pool.allocate()};  // 0, 1, 2
  cache.insert(tokens, blocks, 2);
  EXPECT_EQ(cache.cached_blocks(), 2);
  EXPECT_EQ(pool.reference_count(0), 2);
  EXPECT_EQ(pool.reference_count(2), 1);  // the partly filled block is never cached
  for (int64_t block : blocks) pool.release(block);
  EXPECT_EQ(cache.evictable_blocks(), 2);

  EXPECT_EQ(cache.match(tokens, 2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(cache.match({1, 2, 9, 9}, 2), (std::vector<int64_t>{0}));   // diverges in the second block
  EXPECT_EQ(cache.match({1, 2, 3, 4}, 1), (std::vector<int64_t>{0}));   // capped by max_blocks
  EXPECT_TRUE(cache.match({3, 4, 1, 2}, 2).empty());                    // a block stands for its prefix
  EXPECT_EQ(pool.reference_count(0), 4);  // three matches retained it
  EXPECT_EQ(cache.evictable_blocks(), 0);
  EXPECT_FALSE(cache.evict_one());  // every cached block is held
  pool.release(0);
  pool.release(0);
  pool.release(0);
  pool.release(1);
  // Block 1 (the leaf) goes before its parent 0, although 0 was used last.
  ASSERT_TRUE(cache.evict_one());
  EXPECT_EQ(pool.reference_count(1), 0);
  EXPECT_EQ(cache.match(tokens, 2), (std::vector<int64_t>{0}));
  pool.release(0);

  // A second copy of a cached prefix (two sequences prefilled it at once) is not cached, nor is
  // anything after it: the cached block's ancestors stay in the table of whoever holds it.
  std::vector<int64_t> copy = {*pool.allocate(), *pool.allocate()};
  cache.insert(tokens, copy, 2);
  EXPECT_EQ(cache.cached_blocks(), 1);
  EXPECT_EQ(pool.reference_count(copy[0]), 1);
  EXPECT_EQ(pool.reference_count(copy[1]), 1);
  for (int64_t block : copy) pool.release(block);
  EXPECT_THROW_WITH(cache.insert(tokens, copy, 3), core::InvalidArgument,
                    "prefix cache: 3 full blocks of 2 tokens from 2 blocks holding 5 tokens");
  cache.clear();
  EXPECT_EQ(cache.cached_blocks(), 0);
  EXPECT_EQ(pool.free_blocks(), 6);
}

std::vector<int64_t> token_run(int64_t length, int64_t first, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < length; ++t) ids.push_back((first + 7 * t) % (vocab - 4) + 4);
  return ids;
}

class PrefixCacheOnFixtures : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model = models::load_causal_lm(testing::fixture(GetParam()).string()); }
  int64_t vocab() const { return model->config().vocab_size; }
  models::CausalLM model{nullptr};
};

TEST_P(PrefixCacheOnFixtures, APrefillOverCachedBlocksGivesTheFullPrefillsHiddenStates) {
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> tokens = token_run(13, 3, vocab());
  const torch::Tensor first = model->parameters().front();
  inference::KvBlockPool pool(model->config(), 8, 4, first.scalar_type(), first.device());
  std::vector<int64_t> full_blocks = {0, 1, 2, 3}, cached_blocks = {4, 5, 6, 7};
  for (int64_t b = 0; b < 8; ++b) pool.allocate();
  torch::Tensor ids = torch::tensor(tokens, torch::kInt64).unsqueeze(0);  // [1, 13]
  inference::PagedKvCache full(pool, {{&full_blocks, 0}}, 13);
  torch::Tensor expected = model->hidden_states(ids, full.attention_mask(), &full, nn::MaskLayout::kUnpadded);  // [1, 13, E]
  inference::PagedKvCache prefix(pool, {{&cached_blocks, 0}}, 8);
  model->hidden_states(ids.narrow(1, 0, 8), prefix.attention_mask(), &prefix, nn::MaskLayout::kUnpadded);
  inference::PagedKvCache rest(pool, {{&cached_blocks, 8}}, 5);
  torch::Tensor got = model->hidden_states(ids.narrow(1, 8, 5), rest.attention_mask(), &rest,
                                           nn::MaskLayout::kUnpadded);  // [1, 5, E]
  EXPECT_TRUE(torch::allclose(got, expected.narrow(1, 8, 5), 1e-4, 1e-5))
      << (got - expected.narrow(1, 8, 5)).abs().max();
}

// Runs `turns` one after the other (each to its end) on an engine and returns every answer.
std::vector<std::vector<int64_t>> run_in_turns(ContinuousEngine& engine, const std::vector<std::vector<int64_t>>& turns,
                                               const core::GenerationConfig& config) {
  std::vector<std::vector<int64_t>> answers;
  for (const auto& prompt : turns) {
    engine.submit(prompt, config);
    while (engine.has_work()) {
      for (auto& done : engine.step()) answers.push_back(done.generated);
    }
  }
  return answers;
}

TEST_P(PrefixCacheOnFixtures, ASharedSystemPromptAndAChatsEarlierTurnAreNotPrefilledAgain) {
  for (const bool sample : {false, true}) {
    core::GenerationConfig config;
    config.max_new_tokens = 9;
    config.min_new_tokens = 9;  // fixed lengths: the second turn's prompt is known in advance
    config.do_sample = sample;
    config.temperature = 1.2;
    config.top_k = 30;
    config.seed = 23;
    ContinuousEngineOptions options;
    options.block_size = 4;
    ContinuousEngine uncached(model, options);
    options.prefix_caching = true;
    ContinuousEngine cached(model, options);
    const std::vector<int64_t> system = token_run(10, 5, vocab());  // 2 full blocks and 2 tokens
    std::vector<int64_t> first = system, second = system;
    for (int64_t id : token_run(3, 11, vocab())) first.push_back(id);
    for (int64_t id : token_run(6, 2, vocab())) second.push_back(id);
    const auto expected = run_in_turns(uncached, {first, second}, config);
    EXPECT_EQ(run_in_turns(cached, {first, second}, config), expected) << (sample ? "sampled" : "greedy");
    EXPECT_EQ(cached.stats().prefix_hit_tokens, 8) << "the system prompt's 2 full blocks";
    EXPECT_EQ(cached.stats().prefill_tokens, 13 + 16 - 8);

    // A second turn: the first prompt, its answer, a new message (vLLM caches generated blocks too).
    std::vector<int64_t> turn = first;
    turn.insert(turn.end(), expected[0].begin(), expected[0].end());  // 13 + 9 = 22 tokens
    for (int64_t id : token_run(5, 9, vocab())) turn.push_back(id);
    const auto reply = run_in_turns(uncached, {turn}, config);
    const int64_t hits = cached.stats().prefix_hit_tokens;
    EXPECT_EQ(run_in_turns(cached, {turn}, config), reply);
    // 21 of the 22 tokens were cached (the last answer token never is): 5 full blocks.
    EXPECT_EQ(cached.stats().prefix_hit_tokens - hits, 20);
    EXPECT_EQ(cached.pool().free_blocks() + cached.prefix_cache()->cached_blocks(), cached.pool().num_blocks());
    cached.set_model(model);  // the weights may have changed: nothing stays cached
    EXPECT_EQ(cached.prefix_cache()->cached_blocks(), 0);
    EXPECT_EQ(cached.pool().free_blocks(), cached.pool().num_blocks());
  }
}

TEST_P(PrefixCacheOnFixtures, PreemptedSequencesReuseTheirOwnCachedBlocksAndEvictionMakesRoom) {
  core::GenerationConfig config;
  config.max_new_tokens = 14;
  config.do_sample = true;
  config.temperature = 1.3;
  config.seed = 4;
  config.num_return_sequences = 2;
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < 5; ++b) prompts.push_back(token_run(6 + 3 * b, 1 + b, vocab()));
  auto run = [&](bool prefix_caching) {
    ContinuousEngineOptions options;
    options.block_size = 2;
    options.max_running_sequences = 3;
    options.num_blocks = 22;  // room for about one sequence and a bit: preemption and eviction
    options.prefix_caching = prefix_caching;
    auto engine = std::make_unique<ContinuousEngine>(model, options);
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> answers;
    for (const auto& prompt : prompts) {
      engine->submit(prompt, config);
      for (auto& done : engine->step()) answers[{done.request, done.sample}] = done.generated;
    }
    while (engine->has_work()) {
      for (auto& done : engine->step()) answers[{done.request, done.sample}] = done.generated;
    }
    return std::make_pair(answers, std::move(engine));
  };
  const auto [expected, uncached] = run(false);
  const auto [got, cached] = run(true);
  EXPECT_EQ(got, expected);
  EXPECT_GT(cached->stats().preemptions, 0);
  EXPECT_GT(cached->stats().prefix_hit_tokens, 0) << "recomputation was meant to find its own blocks";
  EXPECT_GT(cached->prefix_cache()->evictions(), 0);
  EXPECT_LT(cached->stats().prefill_tokens, uncached->stats().prefill_tokens);
}

TEST_P(PrefixCacheOnFixtures, ALongPromptIsPrefilledInChunksWhileOthersDecode) {
  // A 30-token prompt against a budget of 8 prompt tokens per step: 4 chunk forwards (8, 8, 8,
  // 6) over 4 steps, each attending to the chunks before it as cached keys, while a sequence
  // admitted earlier decodes a token in every one of those steps; the long prompt's answer is
  // the one of an engine that prefills it in one forward.
  for (const bool sample : {false, true}) {
    core::GenerationConfig config;
    config.max_new_tokens = 8;
    config.min_new_tokens = 8;
    config.do_sample = sample;
    config.temperature = 1.1;
    config.seed = 31;
    const std::vector<int64_t> early = token_run(5, 2, vocab()), long_prompt = token_run(30, 6, vocab());
    ContinuousEngineOptions options;
    options.block_size = 4;
    ContinuousEngine whole(model, options);
    const auto expected = run_in_turns(whole, {long_prompt}, config);
    options.max_prefill_tokens = 8;
    ContinuousEngine chunked(model, options);
    config.max_new_tokens = config.min_new_tokens = 12;
    const int64_t first = chunked.submit(early, config);
    chunked.step();  // the short prompt's prefill
    config.max_new_tokens = config.min_new_tokens = 8;
    chunked.submit(long_prompt, config);
    const int64_t forwards = chunked.stats().prefill_forwards, rows = chunked.stats().prefill_rows;
    std::vector<int64_t> answer;
    int64_t steps = 0;
    while (answer.empty()) {
      auto done = chunked.step();
      ++steps;
      const auto& tokens = chunked.last_step_tokens();
      EXPECT_TRUE(std::any_of(tokens.begin(), tokens.end(), [&](const auto& t) { return t.request == first; }))
          << "step " << steps << ": the running sequence did not decode";
      for (auto& finished : done) {
        if (finished.request != first) answer = finished.generated;
      }
      if (steps == 4) {
        EXPECT_EQ(chunked.stats().prefill_rows - rows, 4) << "chunks of 8, 8, 8 and 6";
        EXPECT_EQ(chunked.stats().prefill_forwards - forwards, 4);
      }
      ASSERT_LT(steps, 40);
    }
    EXPECT_EQ(answer, expected.front()) << (sample ? "sampled" : "greedy");
    EXPECT_EQ(chunked.stats().prefill_tokens, 5 + 30);
    while (chunked.has_work()) chunked.step();
    EXPECT_EQ(chunked.pool().free_blocks(), chunked.pool().num_blocks());
  }
}

// Random traffic: prompts sharing random-length prefixes of one token run, 2 samples each, one
// arrival per step into a 15-block pool with 4 rows and a 10-token prefill budget (preemption,
// chunked prefill, eviction, parking); with prefix caching the ids equal the engine without it,
// and with random cancels every block ends free or cached.
TEST(ContinuousEngine, RandomTrafficWithPrefixCachingGivesTheUncachedIdsAndLosesNoBlock) {
  auto model = models::load_causal_lm(testing::fixture("llama-gqa").string());
  const int64_t vocab = model->config().vocab_size;
  for (uint32_t seed : {0u, 1u}) {
    std::mt19937 draw(seed);
    const std::vector<int64_t> shared = token_run(40, 3 + seed, vocab);
    std::vector<std::vector<int64_t>> prompts;
    for (int p = 0; p < 10; ++p) {
      std::vector<int64_t> prompt(shared.begin(), shared.begin() + draw() % 30);
      for (int64_t id : token_run(1 + draw() % 12, p, vocab)) prompt.push_back(id);
      prompts.push_back(prompt);
    }
    auto run = [&](bool prefix_caching, bool cancels) {
      ContinuousEngineOptions options;
      options.block_size = 4;
      options.num_blocks = 15;
      options.max_running_sequences = 4;
      options.max_prefill_tokens = 10;
      options.prefix_caching = prefix_caching;
      ContinuousEngine engine(model, options);
      core::GenerationConfig config;
      config.max_new_tokens = 12;
      config.num_return_sequences = 2;
      std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> answers;
      std::mt19937 cancel_draw(seed + 100);
      for (size_t i = 0; i < prompts.size(); ++i) {
        engine.submit(prompts[i], config);
        for (auto& done : engine.step()) answers[{done.request, done.sample}] = done.generated;
        if (cancels && cancel_draw() % 4 == 0) engine.cancel(cancel_draw() % (i + 1), cancel_draw() % 2);
      }
      while (engine.has_work()) {
        for (auto& done : engine.step()) answers[{done.request, done.sample}] = done.generated;
      }
      const int64_t cached = prefix_caching ? engine.prefix_cache()->cached_blocks() : 0;
      EXPECT_EQ(engine.pool().free_blocks() + cached, engine.pool().num_blocks()) << "seed " << seed;
      return std::make_pair(answers, engine.stats());
    };
    const auto [expected, plain] = run(false, false);
    const auto [got, cached] = run(true, false);
    EXPECT_EQ(got, expected) << "seed " << seed;
    EXPECT_GT(plain.preemptions, 0);
    EXPECT_GT(cached.prefix_hit_tokens, 0);
    EXPECT_LT(cached.prefill_tokens, plain.prefill_tokens);
    run(true, true);
  }
}

TEST(ContinuousEngine, CancellingAPromptBeingPrefilledInChunksFreesItsBlocks) {
  auto model = models::load_causal_lm(testing::fixture("llama-gqa").string());
  ContinuousEngineOptions options;
  options.block_size = 4;
  options.num_blocks = 30;
  options.max_prefill_tokens = 6;
  ContinuousEngine engine(model, options);
  core::GenerationConfig config;
  config.max_new_tokens = 3;
  config.num_return_sequences = 2;
  const int64_t request = engine.submit(token_run(40, 1, model->config().vocab_size), config);
  engine.step();  // 6 of its 40 tokens prefilled, its 10 blocks held
  EXPECT_EQ(engine.pool().free_blocks(), 20);
  EXPECT_EQ(engine.running_sequences(), 2);
  engine.cancel(request, 0);  // the sample holding the blocks: its sibling takes them over
  engine.step();
  EXPECT_EQ(engine.pool().free_blocks(), 20);
  engine.cancel(request);
  EXPECT_FALSE(engine.has_work());
  EXPECT_EQ(engine.pool().free_blocks(), 30);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheOnFixtures, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

}  // namespace
}  // namespace dschat
