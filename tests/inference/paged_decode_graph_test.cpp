// The continuous engine's fixed-shape decode layout (src/inference/paged_decode_graph.h: rows and
// cached width rounded up to buckets, what its CUDA graphs replay), run eagerly on the CPU where
// no GPU is present: a step's logits equal PagedKvCache's own frame bit for bit (rows of different
// cached lengths in scattered blocks, padding rows, a width rounded up), and the engine decodes the
// same greedy and seeded ids either way on every fixture, giving every block back.
#include <gtest/gtest.h>

#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/kv_block_pool.h"
#include "dschat/inference/paged_kv_cache.h"
#include "dschat/models/load_save.h"
#include "inference/fixture_prompts.h"
#include "inference/paged_decode_graph.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::ContinuousEngine;
using inference::ContinuousEngineOptions;
using inference::GenerationResult;

class FixedFrameDecode : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model = models::load_causal_lm(testing::fixture(GetParam()).string()); }
  models::CausalLM model{nullptr};
};

TEST_P(FixedFrameDecode, AStepGivesThePlainFramesLogitsBitwise) {
  torch::NoGradGuard no_grad;
  const core::ModelConfig& config = model->config();
  const int64_t block_size = 4;
  inference::KvBlockPool pool(config, 24, block_size, torch::kFloat32, torch::kCPU);
  torch::manual_seed(3);
  pool.storage().normal_();  // cached keys and values: any values serve
  // Three rows of 9, 0 and 5 cached tokens in blocks taken from the pool (out of order): 4 rows
  // in the bucket (one padding row), width 16 (4 blocks) against the plain frame's 9.
  const std::vector<int64_t> cached = {9, 0, 5};
  std::vector<std::vector<int64_t>> tables(cached.size());
  for (int64_t skip = 0; skip < 3; ++skip) pool.allocate();  // the rows' blocks do not start at 0
  for (size_t r = 0; r < cached.size(); ++r) {
    for (int64_t b = 0; b * block_size < cached[r] + 1; ++b) tables[r].push_back(*pool.allocate());
  }
  std::vector<inference::PagedKvCache::Row> rows;
  for (size_t r = 0; r < cached.size(); ++r) rows.push_back({&tables[r], cached[r]});
  const std::vector<int64_t> ids = {5, config.vocab_size - 1, 17};
  const int64_t free_before = pool.free_blocks();

  inference::PagedDecodeGraphs graphs(pool);
  const torch::Tensor fixed = graphs.step(model, rows, ids, /*capture=*/false).clone();  // [3, V]
  EXPECT_EQ(pool.free_blocks(), free_before) << "the scratch block is given back after the step";
  inference::PagedKvCache cache(pool, rows, 1);
  torch::Tensor hidden = model->hidden_states(torch::tensor(ids).unsqueeze(1), cache.attention_mask(), &cache,
                                              nn::MaskLayout::kLeftPadded);  // [3, 1, E]
  const torch::Tensor plain = model->lm_logits(hidden.select(1, -1)).to(torch::kFloat32);  // [3, V]
  ASSERT_EQ(fixed.sizes(), plain.sizes());
  // Bitwise where the decode step attends through the tables in place (the CPU loop reads each
  // row's last cached + 1 columns whatever the frame's width); ALiBi and sliding-window layers
  // gather the frame and run SDPA over it, whose sums over a wider frame round differently.
  const bool in_place = config.model_type != "bloom" && config.sliding_window == 0;  // BLOOM: ALiBi
  if (in_place) {
    EXPECT_TRUE(torch::equal(fixed, plain)) << "max abs diff " << testing::max_abs_diff(fixed, plain);
  } else {
    EXPECT_LT(testing::max_abs_diff(fixed, plain), 1e-5);  // logits of magnitude <= ~5: fp32 noise
  }
  EXPECT_EQ(graphs.replays(), 0);
}

TEST_P(FixedFrameDecode, TheEngineDecodesTheSameIds) {
  const testing::FixturePrompts p = testing::fixture_prompts(GetParam());
  core::GenerationConfig greedy;
  greedy.max_new_tokens = 12;
  greedy.pad_token_id = 1;
  core::GenerationConfig sampled = greedy;
  sampled.do_sample = true;
  sampled.temperature = 1.3;
  sampled.top_k = 20;
  sampled.num_return_sequences = 3;
  sampled.seed = 7;
  {  // row 0's second token as EOS: rows end at different steps
    ContinuousEngine engine(model);
    greedy.eos_token_id = engine.generate(p.ids, p.mask, greedy).sequences[0][p.ids.size(1) + 1].item<int64_t>();
  }
  for (const core::GenerationConfig& config : {greedy, sampled}) {
    GenerationResult results[2];
    for (const bool fixed : {false, true}) {
      ContinuousEngineOptions options;
      options.block_size = 4;
      options.max_running_sequences = 6;
      options.fixed_frame_decode = fixed;
      options.enable_cuda_graph = true;  // no effect on the CPU
      ContinuousEngine engine(model, options);
      results[fixed] = engine.generate(p.ids, p.mask, config);
      EXPECT_GT(engine.stats().decode_forwards, 0);
      EXPECT_EQ(engine.stats().cuda_graph_replays, 0);
      EXPECT_EQ(engine.pool().free_blocks(), engine.pool().num_blocks());
    }
    EXPECT_TRUE(torch::equal(results[0].sequences, results[1].sequences))
        << (config.do_sample ? "sampled" : "greedy") << "\n" << results[0].sequences << "\nfixed frame\n"
        << results[1].sequences;
    EXPECT_TRUE(torch::equal(results[0].attention_mask, results[1].attention_mask));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixedFrameDecode, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

}  // namespace
}  // namespace dschat
