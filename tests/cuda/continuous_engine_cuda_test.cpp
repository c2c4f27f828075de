// The continuous engine's CUDA-graph decode on the GPU, per fixture (fp32): greedy ids with the
// decode steps replayed from graphs captured per bucket (rows, cached width) equal the eager
// engine's and transformers', with rows ending at different steps (a per-row EOS: the bucket of
// rows shrinks) and n seeded samples per prompt; every fixture's step must actually be captured
// (replays counted). Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "cuda/cuda_greedy_fixture.h"
#include "dschat/inference/continuous_engine.h"
#include "model_fixtures.h"

namespace dschat {
namespace {

class ContinuousEngineCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
  std::filesystem::path dir() const { return testing::fixture(GetParam()); }
};

inference::ContinuousEngineOptions engine_options(bool graphs) {
  inference::ContinuousEngineOptions options;
  options.block_size = 4;
  options.num_blocks = 96;
  options.enable_cuda_graph = graphs;
  return options;
}

TEST_P(ContinuousEngineCuda, GraphReplayGivesTheEagerIds) {
  const testing::GreedyFixtureOnCuda f = testing::load_greedy_fixture_on_cuda(dir());
  const torch::Tensor &ids = f.ids, &mask = f.mask, &expected = f.expected;  // [B, T], [B, T], [B, T + N]
  auto model = f.model;
  inference::ContinuousEngine eager(model, engine_options(false));
  inference::ContinuousEngine graphs(model, engine_options(true));
  core::GenerationConfig config;
  config.max_new_tokens = expected.size(1) - ids.size(1);
  for (int call = 0; call < 2; ++call) {  // the second call replays the graphs captured by the first
    const int64_t replays_before = graphs.stats().cuda_graph_replays, decodes_before = graphs.stats().decode_forwards;
    auto a = eager.generate(ids, mask, config);
    auto b = graphs.generate(ids, mask, config);
    EXPECT_TRUE(torch::equal(b.sequences.cpu(), expected)) << "call " << call << "\n" << b.sequences;
    EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu()));
    EXPECT_GT(graphs.stats().decode_forwards, decodes_before);
    EXPECT_EQ(graphs.stats().cuda_graph_replays - replays_before, graphs.stats().decode_forwards - decodes_before)
        << "every decode step replays a graph";
  }
  // Rows ending at different steps, and three seeded samples per prompt.
  config.eos_token_id = expected[0][ids.size(1) + 1].item<int64_t>();
  config.pad_token_id = 1;
  auto a = eager.generate(ids, mask, config);
  auto b = graphs.generate(ids, mask, config);
  EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu())) << a.sequences << "\ngraphs\n" << b.sequences;
  config.do_sample = true;
  config.num_return_sequences = 3;
  config.seed = 5;
  a = eager.generate(ids, mask, config);
  b = graphs.generate(ids, mask, config);
  EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu())) << a.sequences << "\ngraphs\n" << b.sequences;
  EXPECT_EQ(graphs.pool().free_blocks(), graphs.pool().num_blocks()) << "the scratch block is given back";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ContinuousEngineCuda, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

}  // namespace
}  // namespace dschat
