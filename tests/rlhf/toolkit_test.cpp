// The trainer toolkit's public pieces on their own: per-token log-probs and answer masks
// (log_probs.h), n answers per prompt (GenerationConfig::num_return_sequences), and experience
// generation from a policy, an optional reference and a reward function, without a critic
// (experience.h), as a critic-free algorithm uses it.
#include <gtest/gtest.h>

#include <algorithm>

#include "dschat/core/error.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/inference/generate.h"
#include "dschat/models/load_save.h"
#include "dschat/nn/lora.h"
#include "dschat/rlhf/setup/experience.h"
#include "dschat/rlhf/math/log_probs.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "dschat/tokenizer/tokenizer.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::fixture;

TEST(Toolkit, GatherLogProbsIsLogSoftmaxOfTheNextToken) {
  torch::manual_seed(0);
  torch::Tensor logits = torch::randn({2, 5, 7});                      // [B, L, V]
  torch::Tensor labels = torch::randint(0, 7, {2, 5}, torch::kInt64);  // [B, L]
  torch::Tensor got = rlhf::gather_log_probs(logits, labels);          // [B, L-1]
  ASSERT_EQ(got.sizes(), torch::IntArrayRef({2, 4}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 4; ++t) {
      const double expected = torch::log_softmax(logits[b][t], 0)[labels[b][t + 1].item<int64_t>()].item<double>();
      EXPECT_NEAR(got[b][t].item<double>(), expected, 1e-6) << b << "," << t;
    }
  }
  EXPECT_THROW(rlhf::gather_log_probs(logits, labels.slice(1, 0, 4)), core::InvalidArgument);
}

TEST(Toolkit, AnswerMasksSelectTheActionsThatProduceAnswerTokens) {
  // Two rows of L = 6: prompt of P = 3 columns (row 1 left padded by one), answers of 3 and 1 tokens.
  torch::Tensor mask = torch::tensor({{1, 1, 1, 1, 1, 1}, {0, 1, 1, 1, 0, 0}}, torch::kInt64);  // [2, 6]
  torch::Tensor actions = rlhf::action_mask(mask);                                               // [2, 5]
  EXPECT_TRUE(torch::equal(actions, mask.slice(1, 1).to(torch::kFloat32)));
  torch::Tensor answer = rlhf::answer_mask(mask, 3);  // actions 2.. produce tokens 3..
  EXPECT_TRUE(torch::equal(answer, torch::tensor({{0.f, 0.f, 1.f, 1.f, 1.f}, {0.f, 0.f, 1.f, 0.f, 0.f}})));
  // Per-row prompt lengths agree with the scalar form when they are all equal ...
  EXPECT_TRUE(torch::equal(rlhf::answer_mask(mask, torch::tensor({3, 3})), answer));
  // ... and follow each row otherwise (right-padded pairs with prompts of 2 and 4 tokens).
  torch::Tensor per_row = rlhf::answer_mask(mask, torch::tensor({2, 4}));  // [2, 5]
  EXPECT_TRUE(torch::equal(per_row, torch::tensor({{0.f, 1.f, 1.f, 1.f, 1.f}, {0.f, 0.f, 0.f, 0.f, 0.f}})));
  EXPECT_THROW(rlhf::answer_mask(mask, 6), core::InvalidArgument);
  EXPECT_THROW(rlhf::answer_mask(mask, torch::tensor({3})), core::InvalidArgument);

  torch::Tensor log_probs = torch::tensor({{-1.f, -2.f, -3.f, -4.f, -5.f}, {-1.f, -2.f, -3.f, -4.f, -5.f}});
  EXPECT_TRUE(torch::allclose(rlhf::masked_sum(log_probs, answer), torch::tensor({-12.f, -3.f})));
}

core::GenerationConfig greedy(int64_t tokens) {
  core::GenerationConfig config;
  config.max_new_tokens = tokens;
  config.eos_token_id = 2;
  config.pad_token_id = 1;
  return config;
}

TEST(Toolkit, NumReturnSequencesGivesEachPromptNAdjacentAnswers) {
  models::CausalLM model = models::load_causal_lm(fixture("opt-preln").string(), {});
  model->eval();
  torch::Tensor ids = torch::tensor({{1, 1, 5, 6, 7}, {9, 10, 11, 12, 13}}, torch::kInt64);  // [2, 5]
  torch::Tensor mask = (ids != 1).to(torch::kInt64);                                          // [2, 5]
  core::GenerationConfig one = greedy(4);
  core::GenerationConfig three = one;
  three.num_return_sequences = 3;
  inference::GenerationResult single = inference::generate(model, ids, mask, one);     // [2, 9]
  inference::GenerationResult repeated = inference::generate(model, ids, mask, three);  // [6, 9]
  ASSERT_EQ(repeated.sequences.size(0), 6);
  ASSERT_EQ(repeated.sequences.size(1), single.sequences.size(1));
  // Greedy: the three answers of a prompt are one answer, and follow that prompt. (Rows are not
  // compared with the batch of two: a different batch size may block the matrix products
  // differently, and these random-weight logits have near ties.)
  for (int64_t row = 0; row < 6; ++row) {
    EXPECT_TRUE(torch::equal(repeated.sequences[row].slice(0, 0, 5), ids[row / 3])) << "row " << row;
    EXPECT_TRUE(torch::equal(repeated.sequences[row], repeated.sequences[row - row % 3])) << "row " << row;
  }
  // Sampled answers to one prompt differ from each other (the rows draw separately).
  three.do_sample = true;
  three.max_new_tokens = 8;
  inference::GenerationResult sampled = inference::generate(model, ids, mask, three);
  EXPECT_FALSE(torch::equal(sampled.sequences[0], sampled.sequences[1]) &&
               torch::equal(sampled.sequences[1], sampled.sequences[2]));
  three.num_return_sequences = 0;
  EXPECT_THROW(inference::generate(model, ids, mask, three), core::ConfigError);
}

hybrid::HybridEngineOptions small_engine_options() {
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 6},
                       {"gradient_accumulation_steps", 1},
                       {"train_batch_size", 6},
                       {"steps_per_print", 0},
                       {"hybrid_engine", {{"enabled", true}, {"max_out_tokens", 16}}}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "toolkit test");
  options.logits_self_check = false;
  return options;
}

TEST(Toolkit, ExperienceFromAPolicyAReferenceAndARewardFunctionWithoutACritic) {
  // No dropout: the policy scores in train mode (as DS-Chat), the reference in eval mode, and the
  // two must then agree.
  models::LoadOptions load;
  load.dropout = 0.0;
  models::CausalLM policy = models::load_causal_lm(fixture("opt-preln").string(), load);
  models::CausalLM reference = models::load_causal_lm(fixture("opt-preln").string(), load);
  hybrid::HybridEngine actor(policy, small_engine_options());
  int64_t reward_calls = 0;
  rlhf::ExperienceSources sources;
  sources.policy = &actor;
  sources.reference = reference;
  // A reward any program can compute: the answer's length in tokens (here, from the mask).
  sources.reward = [&](const torch::Tensor& seq, const torch::Tensor& attention_mask, int64_t prompt_length) {
    ++reward_calls;
    EXPECT_EQ(seq.sizes(), attention_mask.sizes());
    return attention_mask.slice(1, prompt_length).sum(1).to(torch::kFloat32);  // [B]
  };
  rlhf::ExperienceOptions options;
  options.generation = greedy(4);
  options.generation.do_sample = true;
  options.generation.num_return_sequences = 3;
  options.pad_token_id = 1;
  options.drop_short_answers = false;
  torch::Tensor ids = torch::tensor({{1, 1, 5, 6, 7}, {9, 10, 11, 12, 13}}, torch::kInt64);  // [2, 5]
  torch::Tensor mask = (ids != 1).to(torch::kInt64);

  std::optional<rlhf::Experience> exp = rlhf::generate_experience(sources, ids, mask, options);
  ASSERT_TRUE(exp.has_value());
  EXPECT_EQ(reward_calls, 1);
  EXPECT_EQ(exp->rows(), 6);
  EXPECT_EQ(exp->generated_rows, 6);
  EXPECT_EQ(exp->prompt_length, 5);
  EXPECT_TRUE(torch::equal(exp->prompt_index, torch::tensor({0, 0, 0, 1, 1, 1}, torch::kInt64)));
  for (int64_t row = 0; row < 6; ++row) {  // each answer continues its own prompt
    EXPECT_TRUE(torch::equal(exp->seq[row].slice(0, 0, 5), ids[row / 3])) << "row " << row;
  }
  EXPECT_FALSE(exp->values.defined());  // no critic
  ASSERT_TRUE(exp->ref_logprobs.defined());
  EXPECT_EQ(exp->logprobs.sizes(), exp->ref_logprobs.sizes());
  // The reference is the same checkpoint: its log-probs equal the policy's (rounding aside).
  EXPECT_LT((exp->logprobs - exp->ref_logprobs).abs().max().item<double>(), 1e-4);
  EXPECT_TRUE(torch::equal(exp->reward_score, exp->attention_mask.slice(1, 5).sum(1).to(torch::kFloat32)));
  EXPECT_TRUE(actor.actor()->is_training());  // back in train mode for the update
  // Slicing keeps every tensor's rows together, and leaves the undefined ones undefined.
  rlhf::Experience tail = exp->slice(3, 6);
  EXPECT_TRUE(torch::equal(tail.prompt_index, torch::tensor({1, 1, 1}, torch::kInt64)));
  EXPECT_FALSE(tail.values.defined());

  // Without a reference, ref_logprobs stays undefined; a reward of the wrong shape is an error.
  sources.reference = models::CausalLM(nullptr);
  std::optional<rlhf::Experience> no_ref = rlhf::generate_experience(sources, ids, mask, options);
  ASSERT_TRUE(no_ref.has_value());
  EXPECT_FALSE(no_ref->ref_logprobs.defined());
  sources.reward = [](const torch::Tensor& seq, const torch::Tensor&, int64_t) { return torch::zeros({seq.size(0) + 1}); };
  EXPECT_THROW(rlhf::generate_experience(sources, ids, mask, options), core::InvalidArgument);
  sources.policy = nullptr;
  EXPECT_THROW(rlhf::generate_experience(sources, ids, mask, options), core::InvalidArgument);
}

// Engine construction with DeepSpeed-Chat's defaults, LoRA, and saving an HF directory with LoRA
// fused and the tokenizer files: what a custom trainer needs around its loop.
TEST(Toolkit, EngineWithDsChatDefaultsLoraAndSavingAFusedHfDirectory) {
  torch::manual_seed(5);
  models::CausalLM model = models::load_causal_lm(fixture("opt-preln").string(), {});
  rlhf::ModelTrainingConfig training;
  training.learning_rate = 1e-3;
  training.lora_dim = 4;
  training.lora_learning_rate = 5e-4;
  rlhf::apply_lora(*model, training, /*only_optimize_lora=*/false);
  int64_t adapters = 0;
  for (const auto& item : model->named_parameters()) adapters += item.key().find("lora_right_weight") != std::string::npos;
  EXPECT_GT(adapters, 0);

  rlhf::CommonStepConfig common;
  common.dtype = torch::kFloat32;
  common.lr_scheduler_type = "constant";
  rlhf::StepContext context;
  auto engine = rlhf::make_training_engine(model.ptr(), common, training, /*micro_batch=*/2,
                                           /*total_optimizer_steps=*/10, context, "toolkit test");
  // DS-Chat's parameter groups: weights with decay, biases/norms without, LoRA at its own rate.
  std::vector<double> rates = engine->learning_rates();
  EXPECT_NE(std::find(rates.begin(), rates.end(), 1e-3), rates.end());
  EXPECT_NE(std::find(rates.begin(), rates.end(), 5e-4), rates.end());

  torch::Tensor ids = torch::tensor({{2, 10, 11, 12, 13, 14}, {2, 20, 21, 22, 23, 24}}, torch::kInt64);  // [2, 6]
  torch::Tensor mask = torch::ones_like(ids);
  torch::Tensor logits = model->forward(ids, mask);                                              // [2, 6, V]
  torch::Tensor loss = -rlhf::masked_sum(rlhf::gather_log_probs(logits, ids), rlhf::action_mask(mask)).mean();
  engine->backward(loss);
  engine->step();
  EXPECT_EQ(engine->global_steps(), 1);

  testing::TempDir tmp;
  const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(std::filesystem::path(DSCHAT_SOURCE_DIR) / "assets/demo-opt");
  rlhf::save_trained_model(*engine, model->config(), tokenizer, tmp / "actor", {{"note", "toolkit"}}, context);
  for (const char* file : {"config.json", "vocab.json", "merges.txt", "training_summary.json"}) {
    EXPECT_TRUE(std::filesystem::exists(tmp / "actor" / file)) << file;
  }
  // The saved model is the trained one with its adapters fused: same logits, no LoRA tensors.
  models::CausalLM saved = models::load_causal_lm((tmp / "actor").string(), {});
  for (const auto& item : saved->named_parameters()) EXPECT_FALSE(nn::is_lora_parameter(item.key())) << item.key();
  model->eval();
  saved->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor want = model->forward(ids, mask);  // [2, 6, V]
  torch::Tensor got = saved->forward(ids, mask);   // [2, 6, V]
  EXPECT_LT((want - got).abs().max().item<double>(), 1e-4 * std::max(1.0, want.abs().max().item<double>()));
}

}  // namespace
}  // namespace dschat
