// The inference engine on the tiny fixtures (left-padded batches, fp32 CPU): KV-cache decoding
// gives the ids of a full uncached recomputation of the whole sequence at every step (greedy ids
// identical, per-row EOS included), the CUDA-graph step's full-capacity layout run eagerly gives
// the same ids and logits within 1e-5 of the narrowed step (fp32 noise: only the attention's
// summation length differs; masked slots add exact zeros), the workspace is one allocation reused / grown / released as documented, and
// sampling is reproducible from its seed and draws on the CPU exactly as a CPU generator does;
// reading "all rows finished" every k steps (a GPU's default) changes no id.
// transformers' greedy ids: tests/models/parity_test.cpp.
#include <gtest/gtest.h>

#include "dschat/inference/generate.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/inference/logits_processing.h"
#include "inference/decode_graph.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"
#include "inference/fixture_prompts.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::GenerationResult;
using inference::InferenceEngine;
using inference::InferenceEngineOptions;

using Prompts = testing::FixturePrompts;
using testing::fixture_prompts;

// Greedy decoding without a cache: every step runs the model over the whole sequence so far.
// After a row's EOS it gets `pad` with mask 0, as generate() does.
GenerationResult greedy_by_recomputation(models::CausalLM& model, const Prompts& p, int64_t steps,
                                         std::optional<int64_t> eos, int64_t pad) {
  torch::NoGradGuard no_grad;
  torch::Tensor ids = p.ids, mask = p.mask;                      // [B, T + n]
  torch::Tensor finished = torch::zeros({ids.size(0)}, torch::kBool);  // [B]
  for (int64_t step = 0; step < steps; ++step) {
    torch::Tensor next = model->forward(ids, mask).select(1, -1).argmax(1);  // [B]
    next = torch::where(finished, torch::full_like(next, pad), next);
    ids = torch::cat({ids, next.unsqueeze(1)}, 1);
    mask = torch::cat({mask, finished.logical_not().to(torch::kInt64).unsqueeze(1)}, 1);
    if (eos) finished = finished.logical_or(next == *eos);
    if (finished.all().item<bool>()) break;
  }
  return {ids, mask};
}

InferenceEngineOptions quiet(int64_t max_out_tokens) {
  InferenceEngineOptions options;
  options.max_out_tokens = max_out_tokens;
  options.log_stats = false;
  return options;
}

class InferenceEngineOnFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(InferenceEngineOnFixtures, CachedGreedyEqualsFullRecomputation) {
  auto model = models::load_causal_lm(testing::fixture(GetParam()).string());
  const Prompts p = fixture_prompts(GetParam());
  core::GenerationConfig config;
  config.max_new_tokens = 12;
  InferenceEngine engine(model, quiet(64));
  GenerationResult cached = engine.generate(p.ids, p.mask, config);
  GenerationResult reference = greedy_by_recomputation(model, p, 12, std::nullopt, 0);
  EXPECT_TRUE(torch::equal(cached.sequences, reference.sequences)) << cached.sequences << "\nreference\n"
                                                                    << reference.sequences;
  EXPECT_TRUE(torch::equal(cached.attention_mask, reference.attention_mask));

  // Per-row EOS: the token row 0 emits second ends it early; the other rows run on.
  config.eos_token_id = cached.sequences[0][p.ids.size(1) + 1].item<int64_t>();
  config.pad_token_id = 1;
  GenerationResult stopped = engine.generate(p.ids, p.mask, config);
  GenerationResult stopped_reference = greedy_by_recomputation(model, p, 12, config.eos_token_id, 1);
  EXPECT_TRUE(torch::equal(stopped.sequences, stopped_reference.sequences))
      << stopped.sequences << "\nreference\n" << stopped_reference.sequences;
  EXPECT_TRUE(torch::equal(stopped.attention_mask, stopped_reference.attention_mask));
  EXPECT_EQ(stopped.attention_mask[0][p.ids.size(1) + 2].item<int64_t>(), 0);  // pad after row 0's EOS
}

TEST_P(InferenceEngineOnFixtures, FullCapacityDecodeLayoutGivesTheSameIds) {
  // The CUDA-graph step's arithmetic (every workspace slot under a key mask, the scratch slot,
  // positions from the mask's last column) run eagerly: it must decode exactly as the narrowed step.
  auto model = models::load_causal_lm(testing::fixture(GetParam()).string());
  const Prompts p = fixture_prompts(GetParam());
  core::GenerationConfig config;
  config.max_new_tokens = 12;
  InferenceEngine eager(model, quiet(40));
  InferenceEngineOptions options = quiet(40);
  options.full_capacity_decode = true;
  options.enable_cuda_graph = true;  // no effect on the CPU
  InferenceEngine full(model, options);
  GenerationResult a = eager.generate(p.ids, p.mask, config);
  GenerationResult b = full.generate(p.ids, p.mask, config);
  EXPECT_TRUE(torch::equal(a.sequences, b.sequences)) << a.sequences << "\nfull capacity\n" << b.sequences;
  config.eos_token_id = a.sequences[1][p.ids.size(1) + 1].item<int64_t>();
  a = eager.generate(p.ids, p.mask, config);
  b = full.generate(p.ids, p.mask, config);
  EXPECT_TRUE(torch::equal(a.sequences, b.sequences)) << a.sequences << "\nfull capacity\n" << b.sequences;
  EXPECT_TRUE(torch::equal(a.attention_mask, b.attention_mask));
  EXPECT_EQ(full.last_stats().cuda_graph_replays, 0);
}

TEST_P(InferenceEngineOnFixtures, FullCapacityStepLogitsEqualTheNarrowedStep) {
  // Logit level (greedy ids of tiny random models tolerate small errors): each decode step in the
  // full-capacity layout against the eager step over the same cache, with row 0 "finished" (its
  // current token masked) from the third step on. Both write the same slot with the same values.
  auto model = models::load_causal_lm(testing::fixture(GetParam()).string());
  const Prompts p = fixture_prompts(GetParam());
  torch::NoGradGuard no_grad;
  inference::KvWorkspace workspace;
  workspace.reserve(model->config(), p.ids.size(0), 24, torch::kFloat32, torch::kCPU);
  inference::ContiguousKvCache cache(workspace, p.ids.size(0));
  inference::DecodeGraphs layout;
  torch::Tensor mask = p.mask;                                                        // [B, T + n]
  torch::Tensor next = model->forward(p.ids, mask, &cache).select(1, -1).argmax(1);  // [B]
  for (int64_t step = 0; step < 6; ++step) {
    torch::Tensor current = torch::ones({p.ids.size(0), 1}, torch::kInt64);  // [B, 1]
    if (step >= 2) current[0][0] = 0;
    mask = torch::cat({mask, current}, 1);
    torch::Tensor full = layout.step(model, workspace, next.unsqueeze(1), mask, /*capture=*/false).clone();  // [B, V]
    torch::Tensor narrowed = model->forward(next.unsqueeze(1), mask, &cache).select(1, -1);                // [B, V]
    EXPECT_LT(testing::max_abs_diff(full, narrowed), 1e-5) << "step " << step;
    next = narrowed.argmax(1);
  }
}

TEST_P(InferenceEngineOnFixtures, DecodeStepsUnderTheKeyMaskEqualUnmaskedStepsBitwise) {
  // The engine's decode steps always pass the key mask (kLeftPadded), so that no step reads the
  // mask on the host; over unpadded rows that must be exactly the unmasked step it replaced.
  auto model = models::load_causal_lm(testing::fixture(GetParam()).string());
  const Prompts p = fixture_prompts(GetParam());
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = p.ids.narrow(0, 0, 1);  // [1, T] row 0: unpadded
  const int64_t t = ids.size(1);
  std::vector<torch::Tensor> steps;  // [1, 1, V] per layout
  for (const auto layout : {nn::MaskLayout::kUnpadded, nn::MaskLayout::kLeftPadded}) {
    inference::ContiguousKvCache cache(model->config(), 1, t + 2, torch::kFloat32, torch::kCPU);
    torch::Tensor next = model->forward(ids, {}, &cache).select(1, -1).argmax(1, true);  // [1, 1]
    steps.push_back(model->forward(next, torch::ones({1, t + 1}, torch::kInt64), &cache, layout));
  }
  EXPECT_TRUE(torch::equal(steps[0], steps[1]));
}

TEST_P(InferenceEngineOnFixtures, ReadingFinishedRowsEveryFewStepsChangesNoIds) {
  // A device reads "every row finished" only every k steps, so up to k - 1 steps run after the
  // last EOS; they are trimmed off. Row 0 alone stops at its second token (every row finished);
  // all three rows: rows 1 and 2 run on. Sampling too: the extra steps' draws are discarded.
  auto model = models::load_causal_lm(testing::fixture(GetParam()).string());
  const Prompts p = fixture_prompts(GetParam());
  core::GenerationConfig config;
  config.max_new_tokens = 12;
  InferenceEngine every_step(model, quiet(40));
  config.eos_token_id = every_step.generate(p.ids, p.mask, config).sequences[0][p.ids.size(1) + 1].item<int64_t>();
  for (const int64_t interval : {3, 5}) {
    InferenceEngineOptions options = quiet(40);
    options.finished_check_interval = interval;
    InferenceEngine sparse(model, options);
    for (const int64_t rows : {1, 3}) {
      for (const bool sample : {false, true}) {
        config.do_sample = sample;
        const torch::Tensor ids = p.ids.narrow(0, 0, rows), mask = p.mask.narrow(0, 0, rows);  // [rows, T]
        GenerationResult a = every_step.generate(ids, mask, config);
        GenerationResult b = sparse.generate(ids, mask, config);
        EXPECT_TRUE(torch::equal(a.sequences, b.sequences))
            << "interval " << interval << ", rows " << rows << "\n" << a.sequences << "\nsparse\n" << b.sequences;
        EXPECT_TRUE(torch::equal(a.attention_mask, b.attention_mask));
        EXPECT_GE(sparse.last_stats().forward_steps, every_step.last_stats().forward_steps);
        if (rows == 1 && !sample) EXPECT_LE(a.sequences.size(1), p.ids.size(1) + 2);  // stopped at its EOS
      }
    }
  }
  EXPECT_THROW_WITH(InferenceEngine(model, [] {
                      InferenceEngineOptions bad = quiet(40);
                      bad.finished_check_interval = -1;
                      return bad;
                    }()),
                    core::InvalidArgument, "finished_check_interval must be >= 0");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, InferenceEngineOnFixtures, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

class InferenceEngineWorkspace : public ::testing::Test {
 protected:
  models::CausalLM model = models::load_causal_lm(testing::fixture("opt-preln").string());
  Prompts p = fixture_prompts("opt-preln");
  core::GenerationConfig config;

  // [L, 2, B, H_kv, M, D] float32.
  int64_t expected_bytes(int64_t batch, int64_t max_tokens) const {
    const auto& c = model->config();
    return c.num_hidden_layers * 2 * batch * c.num_key_value_heads * max_tokens * c.head_dim * 4;
  }
};

TEST_F(InferenceEngineWorkspace, ReusedAcrossCallsGrownForALargerBatchRetakenAfterRelease) {
  config.max_new_tokens = 6;
  InferenceEngine engine(model, quiet(32));
  EXPECT_EQ(engine.workspace_bytes(), 0);  // taken on the first call
  GenerationResult first = engine.generate(p.ids, p.mask, config);
  EXPECT_EQ(engine.workspace_bytes(), expected_bytes(3, 32));
  const void* address = engine.workspace().data();
  GenerationResult second = engine.generate(p.ids, p.mask, config);
  EXPECT_EQ(engine.workspace_bytes(), expected_bytes(3, 32));
  EXPECT_EQ(engine.workspace().data(), address);  // the same allocation
  EXPECT_TRUE(torch::equal(first.sequences, second.sequences));

  // A smaller batch fits the same allocation; a larger one grows it.
  engine.generate(p.ids.narrow(0, 1, 2), p.mask.narrow(0, 1, 2), config);
  EXPECT_EQ(engine.workspace().data(), address);
  torch::Tensor ids4 = torch::cat({p.ids, p.ids.narrow(0, 0, 1)});    // [4, T]
  torch::Tensor mask4 = torch::cat({p.mask, p.mask.narrow(0, 0, 1)});  // [4, T]
  GenerationResult grown = engine.generate(ids4, mask4, config);
  EXPECT_EQ(engine.workspace_bytes(), expected_bytes(4, 32));
  EXPECT_TRUE(torch::equal(grown.sequences.narrow(0, 0, 3), first.sequences));

  engine.release_workspace();
  EXPECT_EQ(engine.workspace_bytes(), 0);
  GenerationResult retaken = engine.generate(p.ids, p.mask, config);
  EXPECT_EQ(engine.workspace_bytes(), expected_bytes(4, 32));  // the size it had before the release
  EXPECT_TRUE(torch::equal(retaken.sequences, first.sequences));
}

TEST_F(InferenceEngineWorkspace, ReleasedAfterEveryGenerateWhenAsked) {
  config.max_new_tokens = 4;
  InferenceEngineOptions options = quiet(16);
  options.release_workspace_after_generate = true;
  InferenceEngine engine(model, options);
  GenerationResult a = engine.generate(p.ids, p.mask, config);
  EXPECT_EQ(engine.workspace_bytes(), 0);
  GenerationResult b = engine.generate(p.ids, p.mask, config);
  EXPECT_EQ(engine.workspace_bytes(), 0);
  EXPECT_TRUE(torch::equal(a.sequences, b.sequences));
  EXPECT_TRUE(torch::equal(a.sequences, inference::generate(model, p.ids, p.mask, config).sequences));
}

TEST_F(InferenceEngineWorkspace, PromptPlusNewTokensBeyondMaxOutTokensIsANamedError) {
  config.max_new_tokens = 30;
  InferenceEngine engine(model, quiet(32));
  EXPECT_THROW_WITH(engine.generate(p.ids, p.mask, config), core::InvalidArgument,
                    "prompt (10 tokens) + max_new_tokens (30) = 40 exceeds max_out_tokens (32)");
  EXPECT_EQ(engine.workspace_bytes(), 0);  // rejected before anything was allocated
  EXPECT_THROW_WITH(InferenceEngine(model, quiet(1)), core::InvalidArgument, "max_out_tokens must be at least 2");
}

TEST_F(InferenceEngineWorkspace, SeededSamplingIsReproducibleAcrossEngines) {
  config.max_new_tokens = 10;
  config.do_sample = true;
  config.temperature = 1.5;
  config.top_k = 50;
  config.top_p = 0.95;
  config.repetition_penalty = 1.2;
  config.seed = 7;
  InferenceEngine first(model, quiet(32)), second(model, quiet(32));
  GenerationResult a = first.generate(p.ids, p.mask, config);
  GenerationResult b = second.generate(p.ids, p.mask, config);
  EXPECT_TRUE(torch::equal(a.sequences, b.sequences));
  config.seed = 8;
  GenerationResult c = first.generate(p.ids, p.mask, config);
  EXPECT_FALSE(torch::equal(a.sequences, c.sequences));
}

TEST(SamplingGenerator, EachRowDrawsFromItsOwnGeneratorWhateverItsBatch) {
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({4, 50});  // [B, V]
  core::GenerationConfig config;
  config.do_sample = true;
  std::vector<at::Generator> generators = inference::make_row_generators(torch::kCPU, 11, 4);
  ASSERT_EQ(generators.size(), 4u);
  EXPECT_EQ(generators[0].device(), torch::Device(torch::kCPU));
  torch::Tensor together = inference::select_next_tokens(logits, config, generators);  // [B]
  for (int64_t r = 0; r < 4; ++r) {
    // Row r alone, from a fresh generator of its seed: the same token.
    std::vector<at::Generator> own = inference::make_row_generators(torch::kCPU, 11, 1, /*first_row=*/r);
    torch::Tensor alone = inference::select_next_tokens(logits.narrow(0, r, 1), config, own);  // [1]
    EXPECT_EQ(alone.item<int64_t>(), together[r].item<int64_t>()) << "row " << r;
  }
  // Flat logits over 50 tokens, 400 rows: the rows' draws spread over the vocabulary.
  std::vector<at::Generator> many = inference::make_row_generators(torch::kCPU, 11, 400);
  torch::Tensor spread = inference::select_next_tokens(torch::zeros({400, 50}), config, many);  // [400]
  EXPECT_GE(std::get<0>(at::_unique(spread)).numel(), 45) << spread;
  EXPECT_NE(inference::row_seed(11, 0), inference::row_seed(11, 1));
  EXPECT_NE(inference::row_seed(11, 0), inference::row_seed(12, 0));
  std::vector<at::Generator> too_few = inference::make_row_generators(torch::kCPU, 11, 3);
  EXPECT_THROW_WITH(inference::select_next_tokens(logits, config, too_few), core::InvalidArgument,
                    "3 row generators for 4 rows");
}

TEST(SamplingGenerator, InverseCdfPicksTheFirstTokenPastTheUniformAndMatchesTheDistribution) {
  torch::Tensor probabilities = torch::tensor({0.2, 0.4, 1.4}, torch::kFloat32).unsqueeze(0).repeat({4, 1});  // [4, 3]
  torch::Tensor uniform = torch::tensor({0.0, 0.0999, 0.1001, 0.9999}, torch::kFloat64);  // [4], total 2.0
  torch::Tensor picked = inference::draw_by_inverse_cdf(probabilities, uniform);           // [4]
  EXPECT_TRUE(torch::equal(picked, torch::tensor({0, 0, 1, 2}, torch::kInt64))) << picked;
  // A uniform that rounds u * total up to the total still picks the last token with probability,
  // never the masked ones after it.
  torch::Tensor masked_tail = torch::tensor({0.5f, 0.5f, 0.0f, 0.0f}).unsqueeze(0);  // [1, 4]
  EXPECT_EQ(inference::draw_by_inverse_cdf(masked_tail, torch::tensor({1.0}, torch::kFloat64)).item<int64_t>(), 1);
  // 40,000 draws: each frequency within 0.01 of its probability (5 standard deviations at most).
  const int64_t draws = 40000;
  at::Generator generator = inference::make_sampling_generator(torch::kCPU, 5);
  torch::Tensor many = inference::draw_by_inverse_cdf(probabilities.narrow(0, 0, 1).expand({draws, 3}),
                                                      torch::rand({draws}, generator, torch::kFloat64));  // [draws]
  torch::Tensor frequency = torch::bincount(many, {}, 3).to(torch::kFloat64) / draws;  // [3]
  EXPECT_TRUE(torch::allclose(frequency, torch::tensor({0.1, 0.2, 0.7}, torch::kFloat64), 0.0, 0.01)) << frequency;
}

TEST_F(InferenceEngineWorkspace, MinNewTokensHoldsBackEos) {
  config.max_new_tokens = 8;
  GenerationResult free_run = inference::generate(model, p.ids, p.mask, config);
  config.eos_token_id = free_run.sequences[0][p.ids.size(1)].item<int64_t>();  // row 0's first token
  config.min_new_tokens = 4;
  InferenceEngine engine(model, quiet(32));
  GenerationResult held = engine.generate(p.ids, p.mask, config);
  torch::Tensor first_four = held.sequences.narrow(1, p.ids.size(1), 4);  // [B, 4]
  EXPECT_FALSE(first_four.eq(*config.eos_token_id).any().item<bool>()) << held.sequences;
}

TEST_F(InferenceEngineWorkspace, StatsArePositiveAndFormattedLikeDeepSpeedChat) {
  config.max_new_tokens = 5;
  InferenceEngine engine(model, quiet(32));
  engine.generate(p.ids, p.mask, config);
  const inference::GenerationStats& s = engine.last_stats();
  EXPECT_EQ(s.batch, 3);
  EXPECT_EQ(s.prefill_rows, 3);
  EXPECT_EQ(s.prompt_tokens, 10);
  EXPECT_EQ(s.new_tokens, 5);
  EXPECT_EQ(s.forward_steps, 5);
  EXPECT_GT(s.latency_s, 0.0);
  EXPECT_GT(s.prefill_s, 0.0);
  EXPECT_LE(s.prefill_s, s.latency_s);
  EXPECT_GT(s.per_token_latency_s, 0.0);
  EXPECT_GT(s.tokens_per_s, 0.0);
  EXPECT_GT(s.tflops, 0.0);
  EXPECT_GT(s.bandwidth_gb_s, 0.0);
  EXPECT_EQ(s.bytes_per_parameter, 4);
  int64_t params = 0;
  for (const auto& t : model->parameters()) params += t.numel();
  EXPECT_EQ(s.parameters, params);
  const std::string line = inference::format_generation_stats(s);
  EXPECT_NE(line.find("Generation => Latency: "), std::string::npos) << line;
  EXPECT_NE(line.find("Per-token Latency"), std::string::npos) << line;
  EXPECT_NE(line.find("Answer Seq. Length: 5"), std::string::npos) << line;
  // DeepSpeed-Chat's estimate: 24·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)).
  const double b = 3, seq = 15, l = 2, h = 32, v = 512;
  EXPECT_DOUBLE_EQ(inference::generation_flops(3, 15, 2, 32, 512),
                   24 * b * seq * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h)));
}

TEST(ContiguousKvCache, RepeatRowsCopiesEachRowsFilledSlotsToItsNRows) {
  core::ModelConfig config = models::load_causal_lm(testing::fixture("llama-gqa").string())->config();
  const int64_t heads = config.num_key_value_heads, dim = config.head_dim;
  inference::KvWorkspace workspace;
  workspace.reserve(config, 6, 8, torch::kFloat32, torch::kCPU);
  inference::ContiguousKvCache cache(workspace, 2);
  torch::manual_seed(5);
  std::vector<torch::Tensor> keys, values;  // per layer [2, H_kv, 3, D]
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    keys.push_back(torch::randn({2, heads, 3, dim}));
    values.push_back(torch::randn({2, heads, 3, dim}));
    cache.append(layer, keys.back(), values.back());
  }
  cache.commit(3);
  cache.repeat_rows(3);
  EXPECT_EQ(cache.batch(), 6);
  EXPECT_EQ(cache.cached_length(), 3);
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    EXPECT_TRUE(torch::equal(workspace.keys(layer, 6).narrow(2, 0, 3), keys[layer].repeat_interleave(3, 0)));
    EXPECT_TRUE(torch::equal(workspace.values(layer, 6).narrow(2, 0, 3), values[layer].repeat_interleave(3, 0)));
  }
  // The next append covers all six rows.
  auto kv = cache.append(0, torch::zeros({6, heads, 1, dim}), torch::zeros({6, heads, 1, dim}));
  EXPECT_EQ(kv.first.size(0), 6);
  EXPECT_EQ(kv.first.size(2), 4);
  EXPECT_THROW_WITH(cache.repeat_rows(2), core::InvalidArgument,
                    "repeating 6 rows 2 times needs 12 rows, but the workspace holds 6");
}

// num_return_sequences = n prefills each prompt once and copies its cache rows and logits to its
// n rows; the ids must be those of generating the explicitly repeated prompts (n-fold prefill).
// Sampled ids are compared exactly too: both paths draw B * n tokens per step from the same seeded
// generator, and on the CPU these fixtures' prefill logits of a row came out bitwise the same in a
// batch of 3 and of 9 rows (checked; a GEMM may in general block differently per batch size).
TEST(InferenceEngine, SharedPrefillMatchesRepeatedPrompts) {
  const int64_t n = 3;
  for (const std::string name : {"opt-preln", "llama-gqa"}) {
    auto model = models::load_causal_lm(testing::fixture(name).string());
    const Prompts p = fixture_prompts(name);  // [3, 10]: prompts of 10, 7 and 4 tokens, left-padded
    const GenerationResult expanded = inference::repeat_for_return_sequences(p.ids, p.mask, n);  // [9, 10]
    InferenceEngine shared(model, quiet(32)), repeated(model, quiet(32));
    InferenceEngineOptions full_options = quiet(32);
    full_options.full_capacity_decode = true;  // the CUDA-graph step's layout, eagerly: B * n rows
    InferenceEngine full(model, full_options);
    for (const bool sample : {false, true}) {
      core::GenerationConfig config;
      config.max_new_tokens = 10;
      config.do_sample = sample;
      config.temperature = 1.0;
      config.top_k = 0;
      config.seed = 13;
      config.num_return_sequences = 1;
      GenerationResult reference = repeated.generate(expanded.sequences, expanded.attention_mask, config);
      if (sample) {
        // An EOS that row 1 samples at its third token: rows of one prompt then finish apart.
        config.eos_token_id = reference.sequences[1][p.ids.size(1) + 2].item<int64_t>();
        config.pad_token_id = 0;
        reference = repeated.generate(expanded.sequences, expanded.attention_mask, config);
      }
      config.num_return_sequences = n;
      for (InferenceEngine* engine : {&shared, &full}) {
        GenerationResult got = engine->generate(p.ids, p.mask, config);
        const std::string what = name + (sample ? ", sampled" : ", greedy") +
                                 (engine == &full ? ", full-capacity decode" : "");
        ASSERT_EQ(got.sequences.size(0), p.ids.size(0) * n) << what;
        EXPECT_TRUE(torch::equal(got.sequences, reference.sequences))
            << what << "\n" << got.sequences << "\nrepeated prompts\n" << reference.sequences;
        EXPECT_TRUE(torch::equal(got.attention_mask, reference.attention_mask)) << what;
        // The prefill ran on the 3 prompts; the 9 rows decoded from there.
        EXPECT_EQ(engine->last_stats().prefill_rows, p.ids.size(0)) << what;
        EXPECT_EQ(engine->last_stats().batch, p.ids.size(0) * n) << what;
        EXPECT_EQ(engine->last_stats().forward_steps, repeated.last_stats().forward_steps) << what;
      }
      EXPECT_EQ(repeated.last_stats().prefill_rows, p.ids.size(0) * n);
      if (sample) {
        // Sampling differs across a prompt's rows (else the comparison above proves little), and
        // row 1 stopped at its EOS while the others ran on.
        const torch::Tensor answers = reference.sequences.narrow(1, p.ids.size(1), 3);  // [9, 3]
        EXPECT_FALSE(torch::equal(answers[0], answers[1]) && torch::equal(answers[1], answers[2]))
            << reference.sequences;
        EXPECT_EQ(reference.attention_mask[1][p.ids.size(1) + 3].item<int64_t>(), 0) << reference.attention_mask;
      }
    }
    // The FLOP estimate leaves out the prompt tokens of the rows that shared a prefill: the same
    // latency and lengths give fewer FLOPs than an n-fold prefill.
    inference::GenerationStats one = shared.last_stats();
    inference::GenerationStats all = one;
    all.prefill_rows = all.batch;
    const auto& c = model->config();
    inference::finish_generation_stats(all, c.num_hidden_layers, c.hidden_size, c.vocab_size);
    inference::finish_generation_stats(one, c.num_hidden_layers, c.hidden_size, c.vocab_size);
    EXPECT_LT(one.tflops, all.tflops);
    EXPECT_NE(inference::format_generation_stats(one).find("batch 9 from 3 prompts"), std::string::npos)
        << inference::format_generation_stats(one);
  }
}

}  // namespace
}  // namespace dschat
