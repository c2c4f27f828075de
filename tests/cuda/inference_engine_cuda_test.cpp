// The inference engine's CUDA-graph decode on the GPU, per fixture (fp32, left-padded batches):
// greedy ids with the decode step captured once per batch size and replayed equal the eager
// engine's and transformers'. Every fixture's step must actually be captured (replays counted):
// LLaMA's rotary frequencies stay on the device (nn::RotaryFrequencies), so its step copies
// nothing from the host either. Sampling draws on the device from a seeded CUDA generator: the
// same seed gives the same ids, and reading "all rows finished" every 8 steps (the GPU default)
// gives the ids of reading it every step. Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "cuda/cuda_greedy_fixture.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/inference/logits_processing.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"
#include "model_fixtures.h"

namespace dschat {
namespace {

class InferenceEngineCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DSCHAT_REQUIRE_CUDA(); }
  std::filesystem::path dir() const { return testing::fixture(GetParam()); }
};

inference::InferenceEngineOptions engine_options(bool graphs) {
  inference::InferenceEngineOptions options;
  options.max_out_tokens = 40;
  options.enable_cuda_graph = graphs;
  options.log_stats = false;
  return options;
}

TEST_P(InferenceEngineCuda, GraphReplayGivesTheEagerGreedyIds) {
  const testing::GreedyFixtureOnCuda f = testing::load_greedy_fixture_on_cuda(dir());
  const torch::Tensor &ids = f.ids, &mask = f.mask, &expected = f.expected;  // [B, T], [B, T], [B, T + N]
  auto model = f.model;
  inference::InferenceEngine eager(model, engine_options(false));
  inference::InferenceEngine graphs(model, engine_options(true));
  core::GenerationConfig config;
  config.max_new_tokens = expected.size(1) - ids.size(1);

  for (int call = 0; call < 2; ++call) {  // the second call replays the graph captured by the first
    auto a = eager.generate(ids, mask, config);
    auto b = graphs.generate(ids, mask, config);
    EXPECT_TRUE(torch::equal(b.sequences.cpu(), expected)) << "call " << call << "\n" << b.sequences;
    EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu()));
    EXPECT_TRUE(torch::equal(a.attention_mask.cpu(), b.attention_mask.cpu()));
    EXPECT_EQ(graphs.last_stats().cuda_graph_replays, config.max_new_tokens - 1) << "call " << call;
  }

  // Another batch size (a second graph) and a per-row EOS (finished rows fed pad under the mask).
  config.eos_token_id = expected[1][ids.size(1) + 1].item<int64_t>();
  auto a = eager.generate(ids.narrow(0, 1, 2), mask.narrow(0, 1, 2), config);
  auto b = graphs.generate(ids.narrow(0, 1, 2), mask.narrow(0, 1, 2), config);
  EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu())) << a.sequences << "\ngraphs\n" << b.sequences;
  EXPECT_TRUE(torch::equal(a.attention_mask.cpu(), b.attention_mask.cpu()));
  EXPECT_GT(graphs.last_stats().cuda_graph_replays, 0);

  // Released and retaken: the graphs pointed into the old workspace and are captured again.
  graphs.release_workspace();
  EXPECT_EQ(graphs.workspace_bytes(), 0);
  auto c = graphs.generate(ids.narrow(0, 1, 2), mask.narrow(0, 1, 2), config);
  EXPECT_TRUE(torch::equal(c.sequences.cpu(), b.sequences.cpu()));
}

TEST_P(InferenceEngineCuda, SamplingOnTheDeviceIsReproducibleFromTheSeed) {
  torch::Tensor ids = io::load_npy(dir() / "expected" / "input_ids.npy").to(torch::kCUDA);        // [B, T]
  torch::Tensor mask = io::load_npy(dir() / "expected" / "attention_mask.npy").to(torch::kCUDA);  // [B, T]
  models::LoadOptions load;
  load.device = torch::kCUDA;
  auto model = models::load_causal_lm(dir().string(), load);
  inference::InferenceEngineOptions every_step = engine_options(false);
  every_step.finished_check_interval = 1;
  inference::InferenceEngine first(model, engine_options(false)), second(model, every_step);
  core::GenerationConfig config;
  config.max_new_tokens = 12;
  config.do_sample = true;
  config.top_k = 20;
  config.seed = 7;
  auto a = first.generate(ids, mask, config);
  auto b = second.generate(ids, mask, config);
  EXPECT_TRUE(a.sequences.is_cuda());
  EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu())) << a.sequences << "\n" << b.sequences;
  // An EOS that row 0 samples early: the 8-step reads run past it and trim back.
  config.eos_token_id = a.sequences[0][ids.size(1) + 1].item<int64_t>();
  a = first.generate(ids, mask, config);
  b = second.generate(ids, mask, config);
  EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu())) << a.sequences << "\n" << b.sequences;
  EXPECT_TRUE(torch::equal(a.attention_mask.cpu(), b.attention_mask.cpu()));
  config.seed = 8;
  EXPECT_FALSE(torch::equal(first.generate(ids, mask, config).sequences.cpu(), a.sequences.cpu()));
}

TEST(SamplingGeneratorCuda, DrawsOnTheLogitsDeviceReproduciblyFromTheSeed) {
  DSCHAT_REQUIRE_CUDA();
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({64, 100}, torch::kCUDA);  // [B, V]
  core::GenerationConfig config;
  config.do_sample = true;
  auto draw = [&](uint64_t seed) {
    std::vector<at::Generator> generators = inference::make_row_generators(logits.device(), seed, logits.size(0));
    EXPECT_EQ(generators[0].device(), logits.device());
    return inference::select_next_tokens(logits, config, generators);  // [B]
  };
  torch::Tensor a = draw(5);
  EXPECT_TRUE(a.is_cuda());
  EXPECT_TRUE(torch::equal(a.cpu(), draw(5).cpu()));
  EXPECT_FALSE(torch::equal(a.cpu(), draw(6).cpu()));  // 64 rows of 100 tokens: never all equal
}

INSTANTIATE_TEST_SUITE_P(Fixtures, InferenceEngineCuda, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

}  // namespace
}  // namespace dschat
