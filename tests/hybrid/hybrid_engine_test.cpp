// HybridEngine in one process: borrowed weights, the bf16 cast copy, LoRA fused for generation and
// restored bit for bit, ZeRO-3 (world of one) pinned and layer by layer, the logits self-check
// catching wrong weights, release_inference_cache, and 100 train <-> generate switches with flat
// memory. Generated ids are compared with inference::generate on a plain copy of the model
// (identical ids); the multi-process cases are in hybrid_multiproc_test.cpp.
#include "dschat/hybrid/hybrid_engine.h"

#include <gtest/gtest.h>

#include <fstream>

#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/models/load_save.h"
#include "dschat/nn/lora.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::fixture;

struct EngineSetup {
  int stage = 0;
  bool pin = true;
  bool release_cache = true;
  bool continuous = false;
  std::optional<torch::ScalarType> inference_dtype;
  bool self_check = true;
  EngineSetup& with_stage(int value, bool pinned = true) {
    stage = value;
    pin = pinned;
    return *this;
  }
  EngineSetup& with_dtype(torch::ScalarType value) {
    inference_dtype = value;
    return *this;
  }
  EngineSetup& with_release(bool value) {
    release_cache = value;
    return *this;
  }
  EngineSetup& with_continuous_batching() {
    continuous = true;
    return *this;
  }
  EngineSetup& without_self_check() {
    self_check = false;
    return *this;
  }
};

models::CausalLM load_actor(const std::string& name, bool lora) {
  auto model = models::load_causal_lm(fixture(name).string(), {});
  if (lora) {
    torch::manual_seed(3);  // the adapters' initial values: the same in every copy
    nn::convert_linear_layers_to_lora(*model, {4, 1.0, 0.0, "layers."});
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {  // nonzero, so that fusing changes the weights
      if (item.key().find("lora_left_weight") != std::string::npos) item.value().normal_(0.0, 0.05);
    }
    nn::only_optimize_lora_parameters(*model);
  }
  return model;
}

hybrid::HybridEngineOptions options_for(const EngineSetup& setup) {
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2},
                       {"gradient_accumulation_steps", 1},
                       {"train_batch_size", 2},
                       {"steps_per_print", 0},
                       {"zero_optimization", {{"stage", setup.stage}, {"stage3_param_persistence_threshold", 16}}},
                       {"hybrid_engine",
                        {{"enabled", true},
                         {"max_out_tokens", 48},
                         {"release_inference_cache", setup.release_cache},
                         {"continuous_batching", setup.continuous},
                         {"pin_parameters", setup.pin}}}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "hybrid test");
  options.training.optimizer.lr = 1e-2;
  options.inference_dtype = setup.inference_dtype;
  options.logits_self_check = setup.self_check;
  return options;
}

struct Prompts {
  torch::Tensor ids;   // [2, 6]
  torch::Tensor mask;  // [2, 6]: row 1 left-padded by 2
};

Prompts prompts(int64_t vocab) {
  torch::Generator generator = at::detail::createCPUGenerator(11);
  Prompts p{torch::randint(3, vocab, {2, 6}, generator, torch::kInt64), torch::ones({2, 6}, torch::kInt64)};
  p.mask[1].narrow(0, 0, 2).zero_();
  return p;
}

core::GenerationConfig greedy(int64_t tokens = 6) {
  core::GenerationConfig config;
  config.max_new_tokens = tokens;
  return config;
}

// One optimizer step on a fixed batch, in train mode (the fixtures have dropout: the seed makes
// two engines draw the same masks).
void train_step(hybrid::HybridEngine& engine, int64_t vocab) {
  engine.train();
  torch::manual_seed(17);
  torch::Generator generator = at::detail::createCPUGenerator(5);
  torch::Tensor batch = torch::randint(3, vocab, {2, 8}, generator, torch::kInt64);  // [2, 8]
  torch::Tensor logits = engine.actor()->forward(batch);                             // [2, 8, V]
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, 7).reshape({-1, logits.size(2)}),
                                                            batch.narrow(1, 1, 7).reshape({-1}));
  engine.backward(loss);
  engine.step();
}

std::map<std::string, torch::Tensor> snapshot(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> values;
  for (const auto& item : module.named_parameters()) values[item.key()] = item.value().detach().clone();
  return values;
}

// inference::generate on a separate copy of the actor's current weights (LoRA fused, in dtype).
torch::Tensor plain_generation(const std::string& name, models::CausalLM& actor, const Prompts& p,
                               std::optional<torch::ScalarType> dtype, const core::GenerationConfig& config) {
  models::CausalLM copy = load_actor(name, nn::count_lora_layers(*actor) > 0);
  {
    torch::NoGradGuard no_grad;
    auto values = snapshot(*actor);
    for (auto& item : copy->named_parameters()) item.value().copy_(values.at(item.key()));
  }
  if (nn::count_lora_layers(*copy) > 0) nn::fuse_lora(*copy);
  if (dtype) copy->to(*dtype);
  copy->eval();
  return inference::generate(copy, p.ids, p.mask, config).sequences;
}

class HybridEngineFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(HybridEngineFixtures, BorrowedWeightsGenerateLikeThePlainModelBeforeAndAfterAStep) {
  auto actor = load_actor(GetParam(), false);
  hybrid::HybridEngine engine(actor, options_for(EngineSetup()));
  const Prompts p = prompts(actor->config().vocab_size);
  auto first = engine.generate(p.ids, p.mask, greedy());
  EXPECT_TRUE(engine.generating());
  EXPECT_EQ(engine.inference_model().ptr().get(), actor.ptr().get()) << "stage 0, same dtype: no copy";
  EXPECT_TRUE(torch::equal(first.sequences, plain_generation(GetParam(), actor, p, {}, greedy())));
  EXPECT_GE(engine.last_stats().self_check_max_diff, 0.0);
  EXPECT_LT(engine.last_stats().self_check_max_diff, 1e-3);
  EXPECT_GT(engine.last_stats().generation.tokens_per_s, 0.0);
  train_step(engine, actor->config().vocab_size);
  auto second = engine.generate(p.ids, p.mask, greedy());
  EXPECT_TRUE(torch::equal(second.sequences, plain_generation(GetParam(), actor, p, {}, greedy())));
}

TEST_P(HybridEngineFixtures, LoraIsFusedForGenerationAndRestoredBitForBit) {
  auto actor = load_actor(GetParam(), true);
  hybrid::HybridEngine engine(actor, options_for(EngineSetup()));
  const auto before = snapshot(*actor);
  const Prompts p = prompts(actor->config().vocab_size);
  const torch::Tensor expected = plain_generation(GetParam(), actor, p, {}, greedy());  // [2, 12]
  auto out = engine.generate(p.ids, p.mask, greedy());
  EXPECT_TRUE(torch::equal(out.sequences, expected));
  bool some_weight_fused = false;
  for (const auto& item : actor->named_parameters()) {
    some_weight_fused = some_weight_fused || !torch::equal(item.value(), before.at(item.key()));
  }
  EXPECT_TRUE(some_weight_fused) << "in generation mode the adapted weights hold W + delta";
  engine.train();
  for (const auto& item : actor->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), before.at(item.key()))) << item.key() << " not restored bit for bit";
  }
}

TEST_P(HybridEngineFixtures, Bf16GenerationFromFp32TrainingCastsOncePerSwitch) {
  auto actor = load_actor(GetParam(), true);
  hybrid::HybridEngine engine(actor, options_for(EngineSetup().with_dtype(torch::kBFloat16)));
  const Prompts p = prompts(actor->config().vocab_size);
  engine.eval();
  models::CausalLM generation = engine.inference_model();
  EXPECT_NE(generation.ptr().get(), actor.ptr().get());
  EXPECT_EQ(generation->parameters().front().scalar_type(), torch::kBFloat16);
  const void* cast_weights = generation->parameters().front().data_ptr();
  auto first = engine.generate(p.ids, p.mask, greedy());
  auto again = engine.generate(p.ids, p.mask, greedy());
  EXPECT_EQ(generation->parameters().front().data_ptr(), cast_weights) << "the cast is reused within a switch";
  EXPECT_TRUE(torch::equal(first.sequences, again.sequences));
  EXPECT_TRUE(torch::equal(first.sequences, plain_generation(GetParam(), actor, p, torch::kBFloat16, greedy())));
  EXPECT_GT(engine.inference_bytes(), 0);
  engine.train();
  EXPECT_EQ(engine.inference_bytes(), 0) << "the cast copy and the workspace are gone in training";
  EXPECT_EQ(actor->parameters().front().scalar_type(), torch::kFloat32);
}

TEST_P(HybridEngineFixtures, Zero3GatheredGenerationEqualsStage0) {
  for (bool pin : {true, false}) {
    for (bool lora : {false, true}) {
      auto actor = load_actor(GetParam(), lora);
      hybrid::HybridEngine engine(actor, options_for(EngineSetup().with_stage(3, pin)));
      auto reference_actor = load_actor(GetParam(), lora);
      hybrid::HybridEngine reference(reference_actor, options_for(EngineSetup()));
      const Prompts p = prompts(actor->config().vocab_size);
      for (int round = 0; round < 2; ++round) {
        auto out = engine.generate(p.ids, p.mask, greedy());
        auto expected = reference.generate(p.ids, p.mask, greedy());
        EXPECT_TRUE(torch::equal(out.sequences, expected.sequences))
            << "pin " << pin << " lora " << lora << " round " << round << "\n"
            << out.sequences << "\n"
            << expected.sequences;
        train_step(engine, actor->config().vocab_size);
        train_step(reference, actor->config().vocab_size);
      }
    }
  }
}

// enable_mixed_precision_lora: the frozen base is kept as int8 partitions; generation gathers and
// dequantizes it, fuses the adapters into it (the whole actor pinned, or layer by layer) and
// unfuses after. The ids must be those of a plain model holding the engine's own view of the
// weights (consolidated_parameters(): the dequantized base and the adapters) with LoRA fused,
// before and after a training step.
TEST_P(HybridEngineFixtures, Zero3Int8FrozenBaseGeneratesWithLoraFusedIntoTheDequantizedBase) {
  for (bool pin : {true, false}) {
    auto actor = load_actor(GetParam(), true);
    hybrid::HybridEngineOptions options = options_for(EngineSetup().with_stage(3, pin));
    options.training.config.zero.zero_quantized_nontrainable_weights = true;
    hybrid::HybridEngine engine(actor, std::move(options));
    const Prompts p = prompts(actor->config().vocab_size);
    for (int round = 0; round < 2; ++round) {
      // Read in training mode: after a pinned generate() the gathered actor stays fused until train().
      const auto values = engine.training_engine().consolidated_parameters();
      if (round == 0) {  // the base the engine holds really is the int8 one, not the checkpoint's
        const std::string weight = "model.layers.0.self_attn.q_proj.weight";
        const std::string key = values.count(weight) ? weight : "model.decoder.layers.0.self_attn.q_proj.weight";
        EXPECT_FALSE(torch::equal(values.at(key), load_actor(GetParam(), true)->named_parameters()[key]));
      }
      const auto out = engine.generate(p.ids, p.mask, greedy());
      models::CausalLM copy = load_actor(GetParam(), true);
      {
        torch::NoGradGuard no_grad;
        for (auto& item : copy->named_parameters()) item.value().copy_(values.at(item.key()));
      }
      nn::fuse_lora(*copy);
      copy->eval();
      const torch::Tensor expected = inference::generate(copy, p.ids, p.mask, greedy()).sequences;
      EXPECT_TRUE(torch::equal(out.sequences, expected)) << "pin " << pin << " round " << round << "\n"
                                                         << out.sequences << "\n" << expected;
      train_step(engine, actor->config().vocab_size);
    }
  }
}

TEST_P(HybridEngineFixtures, ReturnSequencesShareOnePrefillAndEqualRepeatedPrompts) {
  // n answers per prompt: B * n rows, prompt i's in rows [i * n, (i + 1) * n), from a prefill of
  // the B prompts only; the ids are those of the explicitly repeated prompts (n-fold prefill).
  // Stage 3 too: the prefill's forward gathers layer by layer like any other.
  const int64_t n = 3;
  for (int stage : {0, 3}) {
    auto actor = load_actor(GetParam(), false);
    hybrid::HybridEngine engine(actor, options_for(EngineSetup().with_stage(stage)));
    const Prompts p = prompts(actor->config().vocab_size);
    const inference::GenerationResult expanded = inference::repeat_for_return_sequences(p.ids, p.mask, n);  // [6, 6]
    for (const bool sample : {false, true}) {
      core::GenerationConfig config = greedy();
      config.do_sample = sample;
      config.num_return_sequences = n;
      auto out = engine.generate(p.ids, p.mask, config);  // [6, 12]
      const std::string what = "stage " + std::to_string(stage) + (sample ? ", sampled" : ", greedy");
      ASSERT_EQ(out.sequences.size(0), p.ids.size(0) * n) << what;
      EXPECT_EQ(engine.last_stats().generation.prefill_rows, p.ids.size(0)) << what;
      EXPECT_EQ(engine.last_stats().generation.batch, p.ids.size(0) * n) << what;
      for (int64_t row = 0; row < out.sequences.size(0); ++row) {
        EXPECT_TRUE(torch::equal(out.sequences[row].narrow(0, 0, p.ids.size(1)), p.ids[row / n]))
            << what << ": row " << row << " is not an answer to prompt " << row / n;
      }
      config.num_return_sequences = 1;
      auto expected = engine.generate(expanded.sequences, expanded.attention_mask, config);  // [6, 12]
      EXPECT_TRUE(torch::equal(out.sequences, expected.sequences))
          << what << "\n" << out.sequences << "\nrepeated prompts\n" << expected.sequences;
      EXPECT_TRUE(torch::equal(out.attention_mask, expected.attention_mask)) << what;
      EXPECT_EQ(engine.last_stats().generation.prefill_rows, p.ids.size(0) * n) << what;
      if (!sample && stage == 0) {  // under ZeRO-3 the actor's own parameters are partitions
        const Prompts repeated{expanded.sequences, expanded.attention_mask};
        EXPECT_TRUE(torch::equal(out.sequences, plain_generation(GetParam(), actor, repeated, {}, config))) << what;
      }
    }
  }
}

TEST_P(HybridEngineFixtures, ContinuousBatchingGeneratesTheStaticEnginesIdsBeforeAndAfterAStep) {
  // hybrid_engine.continuous_batching: generate() runs the ContinuousEngine over the generation
  // weights (borrowed fp32, or the bf16 copy); greedy and seeded n = 3 sampling give the ids of
  // the static InferenceEngine, also after a training step re-bound the weights.
  for (const std::optional<torch::ScalarType> dtype : {std::optional<torch::ScalarType>(), std::optional(torch::kBFloat16)}) {
    auto static_actor = load_actor(GetParam(), false), continuous_actor = load_actor(GetParam(), false);
    hybrid::HybridEngine fixed(static_actor, options_for(EngineSetup().with_dtype(dtype.value_or(torch::kFloat32))));
    hybrid::HybridEngine continuous(
        continuous_actor,
        options_for(EngineSetup().with_dtype(dtype.value_or(torch::kFloat32)).with_release(false).with_continuous_batching()));
    const Prompts p = prompts(static_actor->config().vocab_size);
    for (int round = 0; round < 2; ++round) {
      for (const bool sample : {false, true}) {
        core::GenerationConfig config = greedy();
        config.do_sample = sample;
        config.num_return_sequences = sample ? 3 : 1;
        const std::string what = std::string(dtype ? "bf16" : "fp32") + (sample ? ", sampled" : ", greedy") +
                                 ", round " + std::to_string(round);
        auto want = fixed.generate(p.ids, p.mask, config);
        auto got = continuous.generate(p.ids, p.mask, config);
        EXPECT_TRUE(torch::equal(got.sequences, want.sequences)) << what << "\n" << got.sequences << "\nstatic\n"
                                                                 << want.sequences;
        EXPECT_TRUE(torch::equal(got.attention_mask, want.attention_mask)) << what;
        EXPECT_EQ(continuous.last_stats().generation.batch, p.ids.size(0) * config.num_return_sequences) << what;
        EXPECT_EQ(continuous.last_stats().generation.prefill_rows, p.ids.size(0)) << what;
        EXPECT_GT(continuous.last_stats().generation.tokens_per_s, 0.0) << what;
        EXPECT_GT(continuous.inference_bytes(), 0) << what << ": the block pool is counted";
      }
      train_step(fixed, static_actor->config().vocab_size);
      train_step(continuous, continuous_actor->config().vocab_size);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridEngineFixtures, ::testing::Values("opt-preln", "llama-gqa"),
                         testing::FixtureName());

TEST(HybridEngine, SelfCheckStopsGenerationOnWrongInferenceWeights) {
  // The bf16 copy belongs to the generation side, so corrupting it leaves the actor intact.
  auto actor = load_actor("opt-preln", false);
  hybrid::HybridEngine engine(actor, options_for(EngineSetup().with_dtype(torch::kBFloat16)));
  const Prompts p = prompts(actor->config().vocab_size);
  engine.eval();
  {
    torch::NoGradGuard no_grad;
    engine.inference_model()->named_parameters()["model.decoder.layers.0.fc1.weight"].mul_(3.0);
  }
  try {
    engine.generate(p.ids, p.mask, greedy());
    ADD_FAILURE() << "the self-check did not fire";
  } catch (const core::Error& error) {
    EXPECT_NE(std::string(error.what()).find("self-check failed"), std::string::npos) << error.what();
  }
  engine.train();  // the next switch binds the weights afresh, and the check passes
  EXPECT_NO_THROW(engine.generate(p.ids, p.mask, greedy()));
  EXPECT_LT(engine.last_stats().self_check_max_diff, 0.1);
}

TEST(HybridEngine, ReleaseInferenceCacheFreesTheWorkspaceAfterEveryGenerate) {
  auto actor = load_actor("opt-preln", false);
  hybrid::HybridEngine keep(actor, options_for(EngineSetup().with_release(false)));
  const Prompts p = prompts(actor->config().vocab_size);
  keep.generate(p.ids, p.mask, greedy());
  EXPECT_GT(keep.inference_bytes(), 0) << "without release_inference_cache the workspace stays";
  auto other = load_actor("opt-preln", false);
  hybrid::HybridEngine release(other, options_for(EngineSetup().with_release(true)));
  auto first = release.generate(p.ids, p.mask, greedy());
  EXPECT_EQ(release.inference_bytes(), 0);
  auto second = release.generate(p.ids, p.mask, greedy());  // takes the workspace again
  EXPECT_TRUE(torch::equal(first.sequences, second.sequences));
}

// Resident set size of this process, from /proc/self/statm.
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * 4096;
}

TEST(HybridEngine, ContinuousBatchingReleasesItsPoolAndRefusesWhatItCannotDo) {
  auto actor = load_actor("opt-preln", false);
  hybrid::HybridEngine release(actor, options_for(EngineSetup().with_release(true).with_continuous_batching()));
  const Prompts p = prompts(actor->config().vocab_size);
  auto first = release.generate(p.ids, p.mask, greedy());
  EXPECT_EQ(release.inference_bytes(), 0) << "release_inference_cache frees the block pool after every generate";
  EXPECT_TRUE(torch::equal(first.sequences, release.generate(p.ids, p.mask, greedy()).sequences));
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 1},
                       {"train_batch_size", 2}, {"hybrid_engine", {{"continuous_batching", true}, {"enable_cuda_graph", true}}}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "hybrid test");
  // Accepted since the continuous engine captures its decode steps (on the CPU the option has no effect).
  hybrid::HybridEngine graphs(load_actor("opt-preln", false), options);
  EXPECT_TRUE(torch::equal(first.sequences, graphs.generate(p.ids, p.mask, greedy()).sequences));
  ds["hybrid_engine"] = {{"kv_cache_memory_mib", -1}};
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(ds, 1, "hybrid test"), core::ConfigError,
                    "kv_cache_memory_mib must be >= 0 and max_running_sequences >= 1, got -1");
}

TEST(HybridEngine, HundredSwitchesLeaveMemoryFlat) {
  for (int stage : {3}) {  // the most moving parts: ZeRO-3 gathers, a bf16 copy, LoRA fuse/unfuse
    auto actor = load_actor("opt-preln", true);
    hybrid::HybridEngine engine(
        actor, options_for(EngineSetup().with_stage(stage).with_dtype(torch::kBFloat16).without_self_check()));
    const Prompts p = prompts(actor->config().vocab_size);
    int64_t training_bytes = 0;  // after the first step, which allocates the optimizer state
    int64_t rss_after_warmup = 0;
    for (int i = 0; i < 100; ++i) {
      engine.generate(p.ids, p.mask, greedy(2));
      train_step(engine, actor->config().vocab_size);
      ASSERT_EQ(engine.inference_bytes(), 0) << "switch " << i;
      if (i == 0) training_bytes = engine.training_engine().memory_footprint().total();
      if (i == 9) rss_after_warmup = resident_bytes();
    }
    EXPECT_EQ(engine.training_engine().memory_footprint().total(), training_bytes) << "stage " << stage;
    // 90 more switches may not grow the process by more than 8 MiB (the model is ~100 KiB: a
    // leaked copy per switch would add > 9 MiB).
    EXPECT_LT(resident_bytes() - rss_after_warmup, 8 << 20) << "stage " << stage;
  }
}

TEST(HybridEngine, TrainingCallsInGenerationModeAndBadTensorParallelSizeAreClearErrors) {
  auto actor = load_actor("opt-preln", false);
  hybrid::HybridEngine engine(actor, options_for(EngineSetup()));
  engine.eval();
  torch::Tensor loss = actor->forward(torch::ones({1, 3}, torch::kInt64)).sum();  // [1]
  EXPECT_THROW(engine.backward(loss), core::InvalidArgument);
  EXPECT_THROW(engine.step(), core::InvalidArgument);
  engine.train();
  EXPECT_THROW(engine.inference_model(), core::InvalidArgument);

  auto options = options_for(EngineSetup());
  options.training.config.hybrid_engine.inference_tp_size = 2;
  try {
    hybrid::HybridEngine tp(load_actor("opt-preln", false), options);
    ADD_FAILURE() << "inference_tp_size 2 on one rank was accepted";
  } catch (const core::ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("inference_tp_size 2 does not divide the 1 ranks"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace dschat
