// The continuous engine over tensor-parallel shards (2 ranks as threads, fake_tp_group.h) on every
// fixture: random traffic (prompts sharing random-length prefixes, n = 2, one arrival per step,
// a pool small enough to preempt, chunked prefill, prefix caching) gives each rank exactly the
// schedule of the engine over the full model (preemptions, cache hits, prefill tokens, peak
// blocks) and its greedy and seeded-sampling ids. The shards' row-parallel sums differ from the
// full model's in float rounding only (at most 8.4e-7 on these fixtures,
// tensor_parallel_test.cpp), which leaves the drawn ids as they are; the two ranks receive the
// same sums, so they agree with each other exactly.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/tensor_parallel.h"
#include "dschat/models/load_save.h"
#include "fake_tp_group.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::ContinuousEngine;
using inference::ContinuousEngineOptions;
using inference::ContinuousStats;

constexpr int64_t kRanks = 2;

using Answers = std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>>;  // (request, sample) -> ids

std::vector<std::vector<int64_t>> shared_prefix_prompts(int64_t vocab, uint32_t seed) {
  std::mt19937 draw(seed);
  auto run = [&](int64_t length, int64_t first) {
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < length; ++t) ids.push_back((first + 7 * t) % (vocab - 4) + 4);
    return ids;
  };
  const std::vector<int64_t> shared = run(30, 3 + seed);
  std::vector<std::vector<int64_t>> prompts;
  for (int p = 0; p < 8; ++p) {
    std::vector<int64_t> prompt(shared.begin(), shared.begin() + draw() % 24);
    for (int64_t id : run(1 + draw() % 10, p)) prompt.push_back(id);
    prompts.push_back(prompt);
  }
  return prompts;
}

struct Outcome {
  Answers answers;
  ContinuousStats stats;
  int64_t cached_blocks = 0;
};

// One engine through the traffic: prompt i arrives before step i.
Outcome serve_traffic(models::CausalLM model, const std::vector<std::vector<int64_t>>& prompts,
                      const core::GenerationConfig& config) {
  ContinuousEngineOptions options;
  options.block_size = 4;
  options.num_blocks = 14;
  options.max_running_sequences = 4;
  options.max_prefill_tokens = 9;
  options.prefix_caching = true;
  ContinuousEngine engine(model, options);
  Outcome out;
  for (const auto& prompt : prompts) {
    engine.submit(prompt, config);
    for (auto& done : engine.step()) out.answers[{done.request, done.sample}] = done.generated;
  }
  while (engine.has_work()) {
    for (auto& done : engine.step()) out.answers[{done.request, done.sample}] = done.generated;
  }
  out.stats = engine.stats();
  out.cached_blocks = engine.prefix_cache()->cached_blocks();
  return out;
}

void expect_same_schedule(const ContinuousStats& got, const ContinuousStats& expected, const std::string& what) {
  EXPECT_EQ(got.steps, expected.steps) << what;
  EXPECT_EQ(got.prefill_forwards, expected.prefill_forwards) << what;
  EXPECT_EQ(got.prefill_rows, expected.prefill_rows) << what;
  EXPECT_EQ(got.prefill_tokens, expected.prefill_tokens) << what;
  EXPECT_EQ(got.decode_rows, expected.decode_rows) << what;
  EXPECT_EQ(got.preemptions, expected.preemptions) << what;
  EXPECT_EQ(got.peak_blocks_used, expected.peak_blocks_used) << what;
  EXPECT_EQ(got.copy_on_write, expected.copy_on_write) << what;
  EXPECT_EQ(got.prefix_hit_tokens, expected.prefix_hit_tokens) << what;
}

class ContinuousTensorParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(ContinuousTensorParallel, TwoShardsRunTheFullModelsScheduleAndIds) {
  auto full = models::load_causal_lm(testing::fixture(GetParam()).string());
  const auto prompts = shared_prefix_prompts(full->config().vocab_size, 5);
  auto sum = std::make_shared<testing::SharedSum>(kRanks);
  std::vector<models::CausalLM> shards;
  for (int64_t r = 0; r < kRanks; ++r) {
    shards.push_back(inference::make_tensor_parallel_shard(full, std::make_shared<testing::FakeGroup>(r, kRanks, sum),
                                                           inference::ShardStorage::View));
  }
  core::GenerationConfig greedy;
  greedy.max_new_tokens = 9;
  greedy.num_return_sequences = 2;
  core::GenerationConfig sampled = greedy;
  sampled.do_sample = true;
  sampled.top_k = 20;
  sampled.seed = 11;
  for (const core::GenerationConfig& config : {greedy, sampled}) {
    const std::string what = config.do_sample ? "seeded sampling" : "greedy";
    const Outcome expected = serve_traffic(full, prompts, config);
    EXPECT_GT(expected.stats.preemptions, 0) << what;  // the traffic exercises what it should
    EXPECT_GT(expected.stats.prefix_hit_tokens, 0) << what;
    EXPECT_GT(expected.stats.prefill_rows, static_cast<int64_t>(prompts.size())) << what << ": no chunks";
    std::vector<Outcome> ranks(kRanks);
    std::vector<std::string> errors(kRanks);
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        try {
          ranks[r] = serve_traffic(shards[r], prompts, config);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
    for (int64_t r = 0; r < kRanks; ++r) {
      const std::string rank = what + ", rank " + std::to_string(r);
      ASSERT_EQ(errors[r], "") << rank;
      EXPECT_EQ(ranks[r].answers, expected.answers) << rank;
      expect_same_schedule(ranks[r].stats, expected.stats, rank);
      EXPECT_EQ(ranks[r].cached_blocks, expected.cached_blocks) << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ContinuousTensorParallel, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

TEST(ContinuousTensorParallelShard, LockstepIsRefusedForAShard) {
  auto full = models::load_causal_lm(testing::fixture("opt-preln").string());
  auto shard = inference::make_tensor_parallel_shard(full, std::make_shared<testing::FakeGroup>(0, kRanks),
                                                     inference::ShardStorage::View);
  ContinuousEngineOptions options;
  options.lockstep = std::make_shared<dist::Communicator>(dist::Communicator::create(dist::LaunchEnv{}));
  EXPECT_THROW_WITH(ContinuousEngine(shard, options), core::InvalidArgument, "need none");
}

}  // namespace
}  // namespace dschat
