// The inference engine's CUDA-graph decode on the GPU, per fixture (fp32, left-padded batches):
// greedy ids with the decode step captured once per batch size and replayed equal the eager
// engine's and transformers'. OPT's step must actually be captured (replays counted); a LLaMA
// step may fall back to eager decoding (its rotary tables are built on the host,
// nn::rotary_cos_sin), which must give the same ids too. Skips without a GPU.
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/inference/inference_engine.h"
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
  torch::Tensor ids = io::load_npy(dir() / "expected" / "input_ids.npy").to(torch::kCUDA);        // [B, T]
  torch::Tensor mask = io::load_npy(dir() / "expected" / "attention_mask.npy").to(torch::kCUDA);  // [B, T]
  torch::Tensor expected = io::load_npy(dir() / "expected" / "greedy.npy");                       // [B, T + N]
  models::LoadOptions load;
  load.device = torch::kCUDA;
  auto model = models::load_causal_lm(dir().string(), load);
  inference::InferenceEngine eager(model, engine_options(false));
  inference::InferenceEngine graphs(model, engine_options(true));
  core::GenerationConfig config;
  config.max_new_tokens = expected.size(1) - ids.size(1);
  const bool opt = model->config().model_type == "opt";

  for (int call = 0; call < 2; ++call) {  // the second call replays the graph captured by the first
    auto a = eager.generate(ids, mask, config);
    auto b = graphs.generate(ids, mask, config);
    EXPECT_TRUE(torch::equal(b.sequences.cpu(), expected)) << "call " << call << "\n" << b.sequences;
    EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu()));
    EXPECT_TRUE(torch::equal(a.attention_mask.cpu(), b.attention_mask.cpu()));
    if (opt) EXPECT_EQ(graphs.last_stats().cuda_graph_replays, config.max_new_tokens - 1) << "call " << call;
  }

  // Another batch size (a second graph) and a per-row EOS (finished rows fed pad under the mask).
  config.eos_token_id = expected[1][ids.size(1) + 1].item<int64_t>();
  auto a = eager.generate(ids.narrow(0, 1, 2), mask.narrow(0, 1, 2), config);
  auto b = graphs.generate(ids.narrow(0, 1, 2), mask.narrow(0, 1, 2), config);
  EXPECT_TRUE(torch::equal(a.sequences.cpu(), b.sequences.cpu())) << a.sequences << "\ngraphs\n" << b.sequences;
  EXPECT_TRUE(torch::equal(a.attention_mask.cpu(), b.attention_mask.cpu()));
  if (opt) EXPECT_GT(graphs.last_stats().cuda_graph_replays, 0);

  // Released and retaken: the graphs pointed into the old workspace and are captured again.
  graphs.release_workspace();
  EXPECT_EQ(graphs.workspace_bytes(), 0);
  auto c = graphs.generate(ids.narrow(0, 1, 2), mask.narrow(0, 1, 2), config);
  EXPECT_TRUE(torch::equal(c.sequences.cpu(), b.sequences.cpu()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, InferenceEngineCuda, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

}  // namespace
}  // namespace dschat
