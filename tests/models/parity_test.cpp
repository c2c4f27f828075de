// Parity with Hugging Face transformers on the tiny random checkpoints of tools/make_fixtures.py.
// Tolerances: fp32 logits 1e-4 absolute; gradients 1e-4 x max(the largest entry of the gradient,
// 1e-3 x the largest entry of any of the fixture's gradients) (see GradientsMatchTransformers);
// loss 1e-5 relative; greedy ids identical (the fixtures' greedy top-2 logit margins are >= 5e-4,
// far above the fp32 differences); bf16 logits 0.03 absolute: 4 bf16 ulps at the fixtures' logit
// magnitude (< 2), since the two runs may round intermediate sums differently (measured: at most
// 0.0156, and fp32 logits are bitwise equal to transformers').
// Mask layouts (nn::MaskLayout, MaskLayoutParity): the causal path a caller states for unpadded
// and right-padded batches, and the explicit mask for left-padded ones, give at every real token
// the logits of the explicit mask and of each row run alone: fp32, within 1e-5 x max(1, the
// largest |logit|) (an absolute floor of 1e-5; the two paths differ only in SDPA's masking);
// gradients of a loss over real tokens within the tolerance of GradientsMatchTransformers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "dschat/inference/generate.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/models/hf_layout.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"
#include "dschat/io/state_dict.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::fixture;
using testing::max_abs_diff;

struct Batch {
  torch::Tensor ids;   // [B, T]
  torch::Tensor mask;  // [B, T]
};

Batch load_batch(const std::string& name) {
  auto dir = fixture(name) / "expected";
  return {io::load_npy(dir / "input_ids.npy"), io::load_npy(dir / "attention_mask.npy")};
}

// max |a - b| over the positions where mask == 1 (HF leaves padded positions unspecified).
double masked_max_diff(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
  torch::Tensor keep = mask.to(torch::kBool);  // [B, T]
  return max_abs_diff(a.index({keep}), b.index({keep}));
}

// The loss of tools/make_fixtures.py: mean next-token NLL where target and context are real.
torch::Tensor lm_loss(const torch::Tensor& logits, const Batch& batch) {
  const int64_t t = logits.size(1);
  torch::Tensor logp = torch::log_softmax(logits.narrow(1, 0, t - 1).to(torch::kFloat32), -1);  // [B, T-1, V]
  torch::Tensor target = batch.ids.narrow(1, 1, t - 1);                                          // [B, T-1]
  torch::Tensor nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1);                         // [B, T-1]
  torch::Tensor weight = (batch.mask.narrow(1, 1, t - 1) * batch.mask.narrow(1, 0, t - 1)).to(torch::kFloat32);
  return (nll * weight).sum() / weight.sum();
}

class ModelParity : public ::testing::TestWithParam<std::string> {
 protected:
  std::string name() const { return GetParam(); }
  std::string model_dir() const { return (fixture(name())).string(); }

  // Loads the model in `dtype` and compares its logits with transformers' `expected_file`.
  void expect_half_precision_logits_close(torch::ScalarType dtype, const std::string& expected_file,
                                          double tolerance) {
    Batch batch = load_batch(name());
    torch::Tensor expected = io::load_npy(fixture(name()) / "expected" / expected_file);  // [B, T, V]
    models::LoadOptions options;
    options.dtype = dtype;
    auto model = models::load_causal_lm(model_dir(), options);
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model->forward(batch.ids, batch.mask);  // [B, T, V] in dtype
    EXPECT_EQ(logits.scalar_type(), dtype);
    EXPECT_LT(masked_max_diff(logits, expected, batch.mask), tolerance);
  }
};

TEST_P(ModelParity, Fp32LogitsMatchTransformers) {
  Batch batch = load_batch(name());
  torch::Tensor expected = io::load_npy(fixture(name()) / "expected" / "logits.npy");  // [B, T, V]
  for (const auto& dir : {model_dir(), model_dir() + "/bin"}) {
    auto model = models::load_causal_lm(dir);
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model->forward(batch.ids, batch.mask);  // [B, T, V]
    ASSERT_EQ(logits.sizes(), expected.sizes());
    EXPECT_LT(masked_max_diff(logits, expected, batch.mask), 1e-4) << dir;
  }
}

TEST_P(ModelParity, GreedyIdsMatchTransformers) {
  Batch batch = load_batch(name());
  torch::Tensor expected = io::load_npy(fixture(name()) / "expected" / "greedy.npy");  // [B, T + N]
  auto model = models::load_causal_lm(model_dir());
  core::GenerationConfig config;
  config.max_new_tokens = expected.size(1) - batch.ids.size(1);
  auto result = inference::generate(model, batch.ids, batch.mask, config);
  EXPECT_TRUE(torch::equal(result.sequences, expected)) << result.sequences << "\nexpected\n" << expected;
}

TEST_P(ModelParity, GradientsMatchTransformers) {
  Batch batch = load_batch(name());
  auto model = models::load_causal_lm(model_dir());
  torch::Tensor loss = lm_loss(model->forward(batch.ids, batch.mask), batch);
  loss.backward();
  float expected_loss = io::load_npy(fixture(name()) / "expected" / "loss.npy").item<float>();
  EXPECT_NEAR(loss.item<float>(), expected_loss, 1e-5 * std::abs(expected_loss));
  std::map<std::string, torch::Tensor> expected_grads;  // transformers' gradients, by parameter name
  double largest = 0.0;  // the largest entry of any of them
  for (const auto& entry : std::filesystem::directory_iterator(fixture(name()) / "expected" / "grad")) {
    torch::Tensor expected = io::load_npy(entry.path());
    largest = std::max(largest, expected.abs().max().item<double>());
    expected_grads[entry.path().stem().string()] = expected;
  }
  // 1e-4 of the gradient's own scale, but never below 1e-7 of the largest (the embeddings', which
  // the fixtures include): fp32 sums round at ~1e-7 of the terms they add, and those are of the
  // model's gradient scale, not of the result's. A gradient that is mathematically zero (a key
  // projection's bias: softmax ignores a shift shared by every key) or cancels to far below the
  // rest is rounding noise on both sides (opt-preln's k_proj.bias: ~6e-10 beside 0.25, differing
  // by ~2e-9 on some CPUs), which a tolerance relative to itself alone would compare bit for bit.
  const double scale_floor = 1e-3 * largest;
  // Our gradients in the checkpoint's layout (fused q/k/v, Conv1D, rotary order: hf_layout.h), so
  // they compare with transformers' by name; the mapping only moves entries.
  models::NamedTensors module_grads;
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    module_grads[p.key()] = p.value().grad();
  }
  const models::NamedTensors grads = models::to_hf_layout(model->config(), module_grads);
  int compared = 0;
  for (const auto& [param, expected] : expected_grads) {
    ASSERT_TRUE(grads.count(param)) << param;
    torch::Tensor grad = grads.at(param);
    const double scale = std::max(expected.abs().max().item<double>(), scale_floor);
    EXPECT_LT(max_abs_diff(grad, expected), 1e-4 * scale) << param;
    ++compared;
  }
  EXPECT_GE(compared, 5);
}

TEST_P(ModelParity, Bf16LogitsCloseToTransformersBf16) {
  expect_half_precision_logits_close(torch::kBFloat16, "logits_bf16.npy", 0.03);
}

TEST_P(ModelParity, Fp16LogitsCloseToTransformersFp32) {
  // fp16 keeps 11 mantissa bits: 1e-2 absolute on logits below 2 (measured: at most 0.003).
  expect_half_precision_logits_close(torch::kFloat16, "logits.npy", 1e-2);
}

TEST_P(ModelParity, IncrementalDecodingMatchesFullForward) {
  Batch batch = load_batch(name());
  auto model = models::load_causal_lm(model_dir());
  torch::NoGradGuard no_grad;
  torch::Tensor full = model->forward(batch.ids, batch.mask);  // [B, T, V]
  const int64_t t = batch.ids.size(1), split = 6;
  inference::ContiguousKvCache cache(model->config(), batch.ids.size(0), t, torch::kFloat32, torch::kCPU);
  torch::Tensor first = model->forward(batch.ids.narrow(1, 0, split), batch.mask.narrow(1, 0, split), &cache);
  std::vector<torch::Tensor> pieces = {first};
  for (int64_t i = split; i < t; ++i) {
    pieces.push_back(model->forward(batch.ids.narrow(1, i, 1), batch.mask.narrow(1, 0, i + 1), &cache));
  }
  EXPECT_EQ(cache.cached_length(), t);
  EXPECT_LT(masked_max_diff(torch::cat(pieces, 1), full, batch.mask), 1e-4);
}

TEST_P(ModelParity, GradientCheckpointingGivesTheSameGradients) {
  Batch batch = load_batch(name());
  std::vector<std::map<std::string, torch::Tensor>> grads(2);
  for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
    auto model = models::load_causal_lm(model_dir());
    model->train();  // dropout on (OPT): the checkpoint must replay the same masks
    model->backbone().set_gradient_checkpointing(checkpointing == 1);
    torch::manual_seed(7);
    lm_loss(model->forward(batch.ids, batch.mask), batch).backward();
    for (const auto& p : model->named_parameters()) grads[checkpointing][p.key()] = p.value().grad().clone();
  }
  for (const auto& [param, grad] : grads[0]) {
    EXPECT_LT(max_abs_diff(grad, grads[1][param]), 1e-6) << param;
  }
}

TEST_P(ModelParity, SaveThenLoadIsBitwiseIdentical) {
  testing::TempDir tmp;
  auto model = models::load_causal_lm(model_dir());
  models::save_causal_lm(model, tmp.path(), /*max_shard_bytes=*/40000);  // several shards
  EXPECT_TRUE(std::filesystem::exists(tmp / "model.safetensors.index.json"));
  auto reloaded = models::load_causal_lm(tmp.path().string());
  auto a = model->state_dict(), b = reloaded->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [param, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(param))) << param;
  EXPECT_EQ(core::model_config_to_json(model->config()), core::model_config_to_json(reloaded->config()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelParity, ::testing::ValuesIn(testing::model_fixtures()), testing::FixtureName());

// The fixture's rows with their real tokens moved to the front: a right-padded batch [B, T].
Batch right_padded(const Batch& left) {
  std::vector<torch::Tensor> ids, masks;
  for (int64_t r = 0; r < left.ids.size(0); ++r) {
    torch::Tensor real = left.ids[r].masked_select(left.mask[r].to(torch::kBool));  // [n]
    const int64_t pad = left.ids.size(1) - real.size(0);
    ids.push_back(torch::cat({real, torch::zeros({pad}, torch::kInt64)}));
    masks.push_back(torch::cat({torch::ones({real.size(0)}, torch::kInt64), torch::zeros({pad}, torch::kInt64)}));
  }
  return {torch::stack(ids), torch::stack(masks)};
}

double layout_tolerance(const torch::Tensor& reference) {
  return 1e-5 * std::max(1.0, reference.abs().max().item<double>());
}

class MaskLayoutParity : public ::testing::TestWithParam<std::string> {
 protected:
  models::CausalLM model = models::load_causal_lm(fixture(GetParam()).string());
  Batch left = load_batch(GetParam());  // left padded
};

TEST_P(MaskLayoutParity, RightPaddedCausalPathEqualsTheExplicitMaskAndEachRowAlone) {
  torch::NoGradGuard no_grad;
  const Batch right = right_padded(left);
  torch::Tensor causal = model->forward(right.ids, right.mask, nn::MaskLayout::kRightPadded);  // [B, T, V]
  torch::Tensor masked = model->forward(right.ids, right.mask);  // [B, T, V] kUnknown: the explicit mask
  EXPECT_LT(masked_max_diff(causal, masked, right.mask), layout_tolerance(masked));
  for (int64_t r = 0; r < right.ids.size(0); ++r) {
    const int64_t n = right.mask[r].sum().item<int64_t>();
    torch::Tensor alone = model->forward(right.ids[r].narrow(0, 0, n).unsqueeze(0));  // [1, n, V] unpadded
    EXPECT_LT(max_abs_diff(causal[r].narrow(0, 0, n), alone[0]), layout_tolerance(alone)) << "row " << r;
  }
}

TEST_P(MaskLayoutParity, LeftPaddedExplicitMaskEqualsEachRowAlone) {
  torch::NoGradGuard no_grad;
  torch::Tensor logits = model->forward(left.ids, left.mask, nn::MaskLayout::kLeftPadded);  // [B, T, V]
  EXPECT_TRUE(torch::equal(logits, model->forward(left.ids, left.mask)));  // kUnknown takes the same path
  const int64_t t = left.ids.size(1);
  for (int64_t r = 0; r < left.ids.size(0); ++r) {
    const int64_t n = left.mask[r].sum().item<int64_t>();
    torch::Tensor alone = model->forward(left.ids[r].narrow(0, t - n, n).unsqueeze(0));  // [1, n, V]
    EXPECT_LT(max_abs_diff(logits[r].narrow(0, t - n, n), alone[0]), layout_tolerance(alone)) << "row " << r;
  }
}

TEST_P(MaskLayoutParity, UnpaddedCausalPathEqualsTheExplicitMask) {
  torch::NoGradGuard no_grad;
  torch::Tensor ones = torch::ones_like(left.mask);                              // [B, T]
  torch::Tensor causal = model->forward(left.ids, ones, nn::MaskLayout::kUnpadded);  // [B, T, V]
  EXPECT_TRUE(torch::equal(causal, model->forward(left.ids)));  // an undefined mask is unpadded
  torch::Tensor masked = model->forward(left.ids, ones);        // kUnknown: the explicit mask
  EXPECT_LT(max_abs_diff(causal, masked), layout_tolerance(masked));
}

TEST_P(MaskLayoutParity, RightPaddedGradientsOfARealTokenLossEqualTheExplicitMask) {
  // SFT's loss reads real tokens only, so the causal path must give its gradients too.
  const Batch right = right_padded(left);
  std::vector<std::map<std::string, torch::Tensor>> grads(2);
  for (int causal = 0; causal < 2; ++causal) {
    auto fresh = models::load_causal_lm(fixture(GetParam()).string());
    const auto layout = causal == 1 ? nn::MaskLayout::kRightPadded : nn::MaskLayout::kUnknown;
    lm_loss(fresh->forward(right.ids, right.mask, layout), right).backward();
    for (const auto& p : fresh->named_parameters()) grads[causal][p.key()] = p.value().grad();
  }
  double largest = 0.0;
  for (const auto& [param, grad] : grads[0]) largest = std::max(largest, grad.abs().max().item<double>());
  for (const auto& [param, grad] : grads[0]) {
    const double scale = std::max(grad.abs().max().item<double>(), 1e-3 * largest);
    EXPECT_LT(max_abs_diff(grads[1][param], grad), 1e-4 * scale) << param;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MaskLayoutParity, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

TEST(ValueHeadParity, RightPaddedValuesEqualTheExplicitMaskAtRealTokens) {
  auto model = models::load_value_model(fixture("reward-opt-postln").string());
  const Batch right = right_padded(load_batch("reward-opt-postln"));
  torch::NoGradGuard no_grad;
  torch::Tensor causal = model->forward(right.ids, right.mask, nn::MaskLayout::kRightPadded);  // [B, T]
  torch::Tensor masked = model->forward(right.ids, right.mask, nn::MaskLayout::kLeftPadded);   // [B, T]
  EXPECT_LT(masked_max_diff(causal, masked, right.mask), layout_tolerance(masked));
}

class ValueHeadLayout : public ::testing::TestWithParam<std::string> {};

// DeepSpeed-Chat's reward layout over OPT (word_embed_proj_dim != hidden) and GPT-2 (fused c_attn
// and Conv1D weights under rwtransformer.): values equal its RewardModel's, and save/load round trips.
TEST_P(ValueHeadLayout, RewardValuesMatchDeepSpeedChatLayout) {
  auto dir = fixture(GetParam());
  torch::Tensor ids = io::load_npy(dir / "expected" / "input_ids.npy");        // [B, T]
  torch::Tensor mask = io::load_npy(dir / "expected" / "attention_mask.npy");  // [B, T]
  torch::Tensor expected = io::load_npy(dir / "expected" / "values.npy");      // [B, T]
  auto model = models::load_value_model(dir.string());
  const bool opt = GetParam() == "reward-opt-postln";
  if (opt) EXPECT_EQ(model->config().output_dim(), 16);  // word_embed_proj_dim, not hidden_size
  torch::NoGradGuard no_grad;
  EXPECT_LT(masked_max_diff(model->forward(ids, mask), expected, mask), 1e-4);

  testing::TempDir tmp;
  models::save_value_model(model, tmp.path());
  // The file holds exactly the checkpoint's tensor names (DeepSpeed-Chat's layout).
  const io::TensorMap saved = io::load_state_dict(tmp.path());
  const io::TensorMap original = io::load_state_dict(dir);
  ASSERT_EQ(saved.size(), original.size());
  for (const auto& [name, tensor] : original) {
    ASSERT_TRUE(saved.count(name)) << name;
    EXPECT_TRUE(torch::equal(saved.at(name), tensor)) << name;
  }
  EXPECT_TRUE(saved.count(opt ? "rwtransformer.decoder.embed_tokens.weight" : "rwtransformer.h.0.attn.c_attn.weight"));
  auto reloaded = models::load_value_model(tmp.path().string());
  EXPECT_TRUE(torch::equal(reloaded->forward(ids, mask), model->forward(ids, mask)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ValueHeadLayout, ::testing::Values("reward-opt-postln", "reward-gpt2"),
                         testing::FixtureName());

TEST(ValueHeadParity, InitialisesFromCausalLmCheckpointWhenAllowed) {
  std::string dir = fixture("opt-postln").string();
  EXPECT_THROW_WITH(models::load_value_model(dir), core::FormatError, "v_head.weight");
  auto model = models::load_value_model(dir, {}, /*allow_missing_head=*/true);
  auto lm = models::load_causal_lm(dir);
  EXPECT_TRUE(torch::equal(model->state_dict().at("rwtransformer.decoder.layers.1.fc1.weight"),
                           lm->state_dict().at("model.decoder.layers.1.fc1.weight")));
}

}  // namespace
}  // namespace dschat
