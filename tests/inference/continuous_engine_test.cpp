// The rollout engine (continuous batching over a paged KV cache) against today's InferenceEngine
// on the tiny fixtures: greedy and seeded-sampling ids equal row for row, also when prompts
// arrive in a shuffled order between steps and a pool of few blocks forces recompute preemption
// and copy-on-write; the block pool's reference counting and the paged cache's gather checked
// against plain tensors; the n samples of a prompt hold its blocks once.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/inference/kv_block_pool.h"
#include "dschat/inference/logits_processing.h"
#include "dschat/inference/paged_kv_cache.h"
#include "dschat/io/npy.h"
#include "dschat/models/load_save.h"
#include "inference/fixture_prompts.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::ContinuousEngine;
using inference::ContinuousEngineOptions;
using inference::GenerationResult;

core::ModelConfig tiny_config() {
  core::ModelConfig config;
  config.num_hidden_layers = 2;
  config.num_key_value_heads = 2;
  config.head_dim = 3;
  return config;
}

TEST(KvBlockPool, CountsReferencesFreesAtZeroAndCopiesBlocks) {
  inference::KvBlockPool pool(tiny_config(), 3, 4, torch::kFloat32, torch::kCPU);
  EXPECT_EQ(pool.bytes(), 2 * 2 * 3 * 4 * 2 * 3 * 4);
  EXPECT_EQ(inference::KvBlockPool::bytes_per_block(tiny_config(), 4, torch::kFloat32), 2 * 2 * 4 * 2 * 3 * 4);
  EXPECT_EQ(*pool.allocate(), 0);
  EXPECT_EQ(*pool.allocate(), 1);
  EXPECT_EQ(*pool.allocate(), 2);
  EXPECT_FALSE(pool.allocate().has_value());
  pool.retain(1);
  EXPECT_EQ(pool.reference_count(1), 2);
  pool.release(1);
  EXPECT_EQ(pool.free_blocks(), 0);
  pool.release(1);
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_THROW_WITH(pool.release(1), core::InvalidArgument, "release of block 1, which is free");
  EXPECT_THROW_WITH(pool.retain(7), core::InvalidArgument, "block 7 outside [0, 3)");
  pool.keys(1).narrow(0, 2 * 4, 4).fill_(5.0);  // block 2's keys in layer 1
  pool.copy_block(2, 0);
  EXPECT_TRUE(torch::equal(pool.keys(1).narrow(0, 0, 4), pool.keys(1).narrow(0, 8, 4)));
  EXPECT_EQ(inference::KvBlockPool::blocks_for_memory(tiny_config(), 4, torch::kFloat32, 1000), 1000 / 384);
  EXPECT_THROW_WITH(inference::KvBlockPool::blocks_for_memory(tiny_config(), 4, torch::kFloat32, 100),
                    core::InvalidArgument, "kv_cache_memory of 100 bytes is below one block of 4 tokens (384 bytes)");
}

TEST(PagedKvCache, GathersEachRowThroughItsBlockTableIntoTheLeftPaddedFrame) {
  // Two rows in scattered blocks of 2 tokens: row 0 holds 3 tokens, row 1 holds 1; each appends 1.
  inference::KvBlockPool pool(tiny_config(), 6, 2, torch::kFloat32, torch::kCPU);
  std::vector<int64_t> row0 = {4, 1}, row1 = {3};
  torch::manual_seed(0);
  torch::Tensor k0 = torch::randn({1, 2, 3, 3}), k1 = torch::randn({1, 2, 1, 3});  // [1, H_kv, S, D]
  {
    inference::PagedKvCache first(pool, {{&row0, 0}}, 3);
    first.append(0, k0, k0 * 2);
    inference::PagedKvCache second(pool, {{&row1, 0}}, 1);
    second.append(0, k1, k1 * 2);
  }
  inference::PagedKvCache step(pool, {{&row0, 3}, {&row1, 1}}, 1);
  EXPECT_EQ(step.cached_length(), 3);
  EXPECT_TRUE(torch::equal(step.attention_mask(), torch::tensor({1, 1, 1, 1, 0, 0, 1, 1}, torch::kInt64).view({2, 4})));
  torch::Tensor fresh = torch::randn({2, 2, 1, 3});  // [B, H_kv, 1, D]
  auto [keys, values] = step.append(0, fresh, fresh * 2);  // [2, H_kv, 4, D] each
  EXPECT_TRUE(torch::equal(keys[0].narrow(1, 0, 3), k0[0]));
  EXPECT_TRUE(torch::equal(keys[0].narrow(1, 3, 1), fresh[0]));
  EXPECT_TRUE(torch::equal(keys[1].narrow(1, 2, 1), k1[0]));
  EXPECT_TRUE(torch::equal(keys[1].narrow(1, 3, 1), fresh[1]));
  EXPECT_TRUE(torch::equal(values, keys * 2));
  std::vector<int64_t> short_table = {0};
  EXPECT_THROW_WITH(inference::PagedKvCache(pool, {{&short_table, 2}}, 1), core::InvalidArgument,
                    "a row of 2 cached + 1 new tokens has 1 blocks of 2 tokens");
}

using Prompts = testing::FixturePrompts;
using testing::fixture_prompts;

inference::InferenceEngineOptions quiet_static(int64_t max_out_tokens) {
  inference::InferenceEngineOptions options;
  options.max_out_tokens = max_out_tokens;
  options.log_stats = false;
  return options;
}

core::GenerationConfig sampling_config() {
  core::GenerationConfig config;
  config.max_new_tokens = 10;
  config.do_sample = true;
  config.temperature = 1.3;
  config.top_k = 20;
  config.top_p = 0.9;
  config.seed = 17;
  return config;
}

class ContinuousEngineOnFixtures : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model = models::load_causal_lm(testing::fixture(GetParam()).string());
    p = fixture_prompts(GetParam());
  }
  GenerationResult reference(const core::GenerationConfig& config) {
    inference::InferenceEngine engine(model, quiet_static(64));
    return engine.generate(p.ids, p.mask, config);
  }
  models::CausalLM model{nullptr};
  Prompts p;
};

TEST_P(ContinuousEngineOnFixtures, GreedyIdsEqualTheInferenceEngine) {
  core::GenerationConfig config;
  config.max_new_tokens = 12;
  GenerationResult expected = reference(config);
  // Row 0's second token as EOS: rows end at different steps.
  config.eos_token_id = expected.sequences[0][p.ids.size(1) + 1].item<int64_t>();
  config.pad_token_id = 1;
  expected = reference(config);
  for (const bool gather : {false, true}) {  // attention in place through the tables, or the gathered copy
    ContinuousEngineOptions options;
    options.block_size = 4;
    options.gather_for_attention = gather;
    ContinuousEngine engine(model, options);
    GenerationResult got = engine.generate(p.ids, p.mask, config);
    EXPECT_TRUE(torch::equal(got.sequences, expected.sequences))
        << (gather ? "gathered" : "in place") << "\n" << got.sequences << "\nexpected\n" << expected.sequences;
    EXPECT_TRUE(torch::equal(got.attention_mask, expected.attention_mask));
    EXPECT_EQ(engine.pool().free_blocks(), engine.pool().num_blocks());  // every block back
    EXPECT_EQ(engine.stats().prefill_rows, p.ids.size(0));
    EXPECT_EQ(engine.stats().prefill_forwards, 1) << "every prompt in one batched prefill";
  }
}

TEST_P(ContinuousEngineOnFixtures, SeededSamplesEqualTheInferenceEngineForNSamplesPerPrompt) {
  core::GenerationConfig config = sampling_config();
  config.num_return_sequences = 3;
  const GenerationResult expected = reference(config);
  ContinuousEngineOptions options;
  options.block_size = 4;
  options.max_running_sequences = 6;
  ContinuousEngine engine(model, options);
  GenerationResult got = engine.generate(p.ids, p.mask, config);
  EXPECT_TRUE(torch::equal(got.sequences, expected.sequences)) << got.sequences << "\nexpected\n" << expected.sequences;
  EXPECT_TRUE(torch::equal(got.attention_mask, expected.attention_mask));
  EXPECT_EQ(engine.stats().prefill_rows, p.ids.size(0));  // one prefill per prompt, not per sample
  EXPECT_GT(engine.stats().copy_on_write, 0);
}

TEST_P(ContinuousEngineOnFixtures, ShuffledArrivalsAndPreemptionChangeNoId) {
  core::GenerationConfig config = sampling_config();
  config.max_new_tokens = 14;
  config.num_return_sequences = 2;
  const int64_t n = 2, prompts = p.ids.size(0), width = p.ids.size(1);
  const GenerationResult expected = reference(config);
  // Penalties and a bias make a row's logits depend on its own tokens (and take it out of the
  // grouped sampling): in the third run the even prompts carry them, batched with the odd ones.
  // (Not the repetition penalty: InferenceEngine, like transformers, counts left padding in it.)
  core::GenerationConfig penalized = config;
  penalized.frequency_penalty = 0.8;
  penalized.presence_penalty = 0.5;
  penalized.logit_bias = {{expected.sequences[0][width].item<int64_t>(), -3.0}, {5, 2.0}};
  const GenerationResult want_penalized = reference(penalized);
  EXPECT_FALSE(torch::equal(want_penalized.sequences, expected.sequences)) << "the penalties were meant to change ids";
  for (const int variant : {0, 1, 2}) {  // sampled, greedy, sampled with penalties on even prompts
    const bool greedy = variant == 1;
    core::GenerationConfig run = config;
    run.do_sample = !greedy;
    const GenerationResult plain = greedy ? reference(run) : expected;
    const auto with_penalties = [&](int64_t b) { return variant == 2 && b % 2 == 0; };
    const auto want_of = [&](int64_t b) -> const GenerationResult& {
      return with_penalties(b) ? want_penalized : plain;
    };
    ContinuousEngineOptions options;
    options.block_size = 2;
    options.max_running_sequences = 3;
    options.max_prefill_tokens = 8;
    // Room for one sequence and a bit: running sequences keep preempting each other.
    options.num_blocks = (width + run.max_new_tokens) / 2 + 2;
    ContinuousEngine engine(model, options);
    std::vector<int64_t> order(prompts);
    for (int64_t b = 0; b < prompts; ++b) order[b] = b;
    std::shuffle(order.begin(), order.end(), std::mt19937(5 + variant));
    std::map<int64_t, int64_t> prompt_of_request;
    int64_t checked = 0;
    auto check = [&](const std::vector<inference::SequenceOutput>& finished) {
      for (const auto& done : finished) {
        const int64_t b = prompt_of_request.at(done.request), row = b * n + done.sample;
        const GenerationResult& want = want_of(b);
        const int64_t length = want.attention_mask[row].narrow(0, width, want.sequences.size(1) - width).sum().item<int64_t>();
        ASSERT_EQ(static_cast<int64_t>(done.generated.size()), length) << "row " << row;
        EXPECT_TRUE(torch::equal(torch::tensor(done.generated, torch::kInt64), want.sequences[row].narrow(0, width, length)))
            << "row " << row << " (preempted " << done.preemptions << " times)";
        ++checked;
      }
    };
    for (size_t i = 0; i < order.size(); ++i) {  // one arrival every two steps
      const int64_t b = order[i];
      std::vector<int64_t> prompt;
      for (int64_t t = 0; t < width; ++t) {
        if (p.mask[b][t].item<int64_t>() != 0) prompt.push_back(p.ids[b][t].item<int64_t>());
      }
      inference::SampleOptions seeds;
      seeds.seeds = {inference::row_seed(run.seed, b * n), inference::row_seed(run.seed, b * n + 1)};
      prompt_of_request[engine.submit(prompt, with_penalties(b) ? penalized : run, seeds)] = b;
      check(engine.step());
      check(engine.step());
    }
    while (engine.has_work()) check(engine.step());
    EXPECT_EQ(checked, prompts * n);
    EXPECT_GT(engine.stats().preemptions, 0) << "the pool was meant to force preemption";
    EXPECT_GT(engine.stats().parked_samples, 0) << "3 rows for 2 samples per prompt were meant to park some";
    EXPECT_EQ(engine.pool().free_blocks(), engine.pool().num_blocks());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ContinuousEngineOnFixtures, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

TEST(ContinuousEngine, NSamplesHoldThePromptsBlocksOnceAndBadInputIsNamed) {
  auto model = models::load_causal_lm(testing::fixture("opt-preln").string());
  ContinuousEngineOptions options;
  options.block_size = 4;
  options.num_blocks = 40;
  ContinuousEngine engine(model, options);
  core::GenerationConfig config = sampling_config();
  config.num_return_sequences = 8;
  config.max_new_tokens = 3;
  std::vector<int64_t> prompt(18, 5);  // 5 blocks, the last one holding 2 tokens
  engine.submit(prompt, config);
  engine.step();  // prefill: the 8 samples share the prompt's 5 blocks
  EXPECT_EQ(engine.pool().num_blocks() - engine.pool().free_blocks(), 5);
  EXPECT_EQ(engine.stats().prefill_forwards, 1);
  engine.step();  // first decode: 7 samples copy the shared last block, the 8th writes into it
  EXPECT_EQ(engine.pool().num_blocks() - engine.pool().free_blocks(), 5 + 7);
  EXPECT_EQ(engine.stats().copy_on_write, 7);
  while (engine.has_work()) engine.step();
  EXPECT_EQ(engine.pool().free_blocks(), 40);

  config.max_new_tokens = 200;
  EXPECT_THROW_WITH(engine.submit(prompt, config), core::InvalidArgument,
                    "prompt (18 tokens) + max_new_tokens (200) needs 55 blocks of 4 tokens, the pool holds 40");
  config.max_new_tokens = 3;
  config.num_return_sequences = 9;
  EXPECT_THROW_WITH(engine.submit(prompt, config), core::InvalidArgument,
                    "num_return_sequences (9) exceeds max_running_sequences (8)");
  config.num_return_sequences = 1;
  EXPECT_THROW_WITH(engine.submit({}, config), core::InvalidArgument, "empty prompt");
  config.num_return_sequences = 3;
  config.max_new_tokens = 6;
  config.min_new_tokens = 6;  // no EOS: each sample runs to its own limit
  inference::SampleOptions own;
  own.max_new_tokens = {2, 6, 1};
  engine.submit(prompt, config, own);
  std::map<int64_t, size_t> lengths;
  while (engine.has_work()) {
    for (const auto& done : engine.step()) lengths[done.sample] = done.generated.size();
  }
  EXPECT_EQ(lengths, (std::map<int64_t, size_t>{{0, 2}, {1, 6}, {2, 1}}));
  own.max_new_tokens = {2, 7, 1};
  EXPECT_THROW_WITH(engine.submit(prompt, config, own), core::InvalidArgument,
                    "a sample's max_new_tokens (7) must be in [1, 6]");
  own.max_new_tokens = {2};
  EXPECT_THROW_WITH(engine.submit(prompt, config, own), core::InvalidArgument, "1 max_new_tokens for 3 samples");
  config = sampling_config();
  engine.submit(prompt, config);
  torch::Tensor ids = torch::ones({1, 3}, torch::kInt64);  // [1, 3]
  EXPECT_THROW_WITH(engine.generate(ids, ids, config), core::InvalidArgument, "needs an idle engine (1 waiting");
  while (engine.has_work()) engine.step();
  // A generate() batch whose second row the pool cannot hold queues none of its rows.
  torch::Tensor batch = torch::full({2, 170}, 5, torch::kInt64);  // [2, 170]
  torch::Tensor mask = torch::ones({2, 170}, torch::kInt64);      // [2, 170]
  mask[0].narrow(0, 0, 160).zero_();                               // row 0: 10 tokens, row 1: 170
  config.max_new_tokens = 3;
  EXPECT_THROW_WITH(engine.generate(batch, mask, config), core::InvalidArgument, "prompt (170 tokens)");
  EXPECT_FALSE(engine.has_work());
  EXPECT_EQ(engine.generate(batch.narrow(0, 0, 1), mask.narrow(0, 0, 1), config).sequences.size(0), 1);
}

}  // namespace
}  // namespace dschat
