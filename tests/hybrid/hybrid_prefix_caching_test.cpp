// hybrid_engine.prefix_caching: prompts of one rollout that share a prefix (a system prompt) take
// its KV blocks from the continuous engine's prefix cache, the ids stay the static engine's, and
// after a training step nothing cached under the old weights is used (set_model empties it).
#include <gtest/gtest.h>

#include "dschat/core/error.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/models/load_save.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

hybrid::HybridEngine make_engine(const std::string& fixture, nlohmann::json hybrid_keys) {
  hybrid_keys["enabled"] = true;
  hybrid_keys["max_out_tokens"] = 64;
  hybrid_keys["release_inference_cache"] = false;
  const nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 1},
                             {"train_batch_size", 2},              {"steps_per_print", 0},
                             {"hybrid_engine", hybrid_keys}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "prefix caching test");
  options.training.optimizer.lr = 1e-2;
  return hybrid::HybridEngine(models::load_causal_lm(testing::fixture(fixture).string(), {}), options);
}

// One step of next-token loss on fixed ids: the weights change.
void train_step(hybrid::HybridEngine& engine, const torch::Tensor& batch) {
  engine.train();
  torch::manual_seed(17);  // the fixture's dropout draws the same masks in both engines
  torch::Tensor logits = engine.actor()->forward(batch);  // [2, T, V]
  const int64_t t = batch.size(1) - 1;
  engine.backward(torch::nn::functional::cross_entropy(logits.narrow(1, 0, t).reshape({-1, logits.size(2)}),
                                                       batch.narrow(1, 1, t).reshape({-1})));
  engine.step();
}

class HybridPrefixCaching : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridPrefixCaching, ASharedSystemPromptIsPrefilledOnceAndNeverOutlivesAWeightUpdate) {
  hybrid::HybridEngine fixed = make_engine(GetParam(), nlohmann::json::object());
  hybrid::HybridEngine cached =
      make_engine(GetParam(), {{"continuous_batching", true}, {"prefix_caching", true}});
  const int64_t vocab = fixed.actor()->config().vocab_size;
  torch::Generator generator = at::detail::createCPUGenerator(7);
  // Two prompts of 21 tokens whose first 18 agree: one full 16-token block in common.
  torch::Tensor ids = torch::randint(3, vocab, {2, 21}, generator, torch::kInt64);  // [2, 21]
  ids[1].narrow(0, 0, 18).copy_(ids[0].narrow(0, 0, 18));
  const torch::Tensor mask = torch::ones({2, 21}, torch::kInt64);  // [2, 21]
  core::GenerationConfig config;
  config.max_new_tokens = 8;
  for (int round = 0; round < 2; ++round) {
    for (const bool sample : {false, true}) {
      config.do_sample = sample;
      config.num_return_sequences = sample ? 2 : 1;
      const auto want = fixed.generate(ids, mask, config);
      const auto got = cached.generate(ids, mask, config);
      const std::string what = std::string(sample ? "sampled" : "greedy") + ", round " + std::to_string(round);
      EXPECT_TRUE(torch::equal(got.sequences, want.sequences)) << what << "\n" << got.sequences << "\nstatic\n"
                                                               << want.sequences;
      // The second prompt's first block came from the first's. A cache kept across the training
      // step (or across calls) would also give each prompt its own block from the last call.
      EXPECT_EQ(cached.last_stats().generation.cached_prompt_tokens, 16) << what;
    }
    train_step(fixed, ids);
    train_step(cached, ids);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridPrefixCaching, ::testing::Values("opt-preln", "llama-gqa"),
                         testing::FixtureName());

TEST(HybridPrefixCaching, NeedsContinuousBatching) {
  EXPECT_THROW_WITH(make_engine("opt-preln", {{"prefix_caching", true}}), core::ConfigError,
                    "hybrid_engine.prefix_caching needs continuous_batching");
}

}  // namespace
}  // namespace dschat
