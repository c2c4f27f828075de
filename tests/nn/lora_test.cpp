// LoRA adapters on nn::Linear against DeepSpeed-Chat's LinearLayer_LoRA arithmetic run in PyTorch
// at test time (through the project venv), plus fuse/unfuse exactness, the init distribution,
// trainable-parameter selection and the module-name filter on real OPT and LLaMA models.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include "dschat/core/model_config.h"
#include "dschat/io/npy.h"
#include "dschat/models/causal_lm.h"
#include "dschat/nn/lora.h"
#include "test_util.h"

namespace dschat {
namespace {

using NameSet = std::set<std::string>;

/// A converted Linear whose left adapter is random, so the adapter path is not a no-op.
nn::Linear adapted_linear(int64_t in, int64_t out, int64_t r, double scaling, double dropout = 0.0) {
  nn::Linear linear(nn::LinearOptions(in, out));
  linear->enable_lora(nn::LinearLoraOptions(r).lora_scaling(scaling).lora_dropout(dropout));
  torch::NoGradGuard no_grad;
  linear->lora_left_weight.normal_(0.0, 0.5);
  return linear;
}

models::CausalLM fixture_model(const std::string& name) {
  models::CausalLM model(core::load_model_config(testing::fixture(name).string()));
  model->eval();  // the OPT fixtures have dropout 0.1
  return model;
}

NameSet lora_layer_names(const torch::nn::Module& model) {
  NameSet names;
  for (const auto& item : model.named_modules()) {
    auto linear = std::dynamic_pointer_cast<nn::LinearImpl>(item.value());
    if (linear && linear->has_lora()) names.insert(item.key());
  }
  return names;
}

NameSet trainable_names(const torch::nn::Module& model) {
  NameSet names;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) names.insert(item.key());
  }
  return names;
}

TEST(LoraLinear, ForwardAndGradientsMatchPyTorchReference) {
  torch::manual_seed(11);
  const double scaling = 2.0;  // scale = 2 / 4
  nn::Linear linear = adapted_linear(24, 16, 4, scaling);
  torch::Tensor x = torch::randn({2, 3, 24}).requires_grad_(true);  // [B, T, in]
  torch::Tensor grad_out = torch::randn({2, 3, 16});                // [B, T, out]
  testing::TempDir tmp;
  io::save_npy(tmp / "x.npy", x.detach());
  io::save_npy(tmp / "g.npy", grad_out);
  io::save_npy(tmp / "w.npy", linear->weight.detach());
  io::save_npy(tmp / "b.npy", linear->bias.detach());
  io::save_npy(tmp / "right.npy", linear->lora_right_weight.detach());
  io::save_npy(tmp / "left.npy", linear->lora_left_weight.detach());
  const std::string script = R"PY(
import sys, numpy as np, torch
d = sys.argv[1]
t = lambda n, g=False: torch.from_numpy(np.load(f"{d}/{n}.npy")).requires_grad_(g)
x, g, w, b, right, left = t("x", True), t("g"), t("w"), t("b", True), t("right", True), t("left", True)
scaling = float(sys.argv[2]) / right.shape[1]   # LinearLayer_LoRA: lora_scaling / lora_dim
y = x @ w.T + b + (x @ right @ left) * scaling
y.backward(g)
for name, v in [("y", y), ("gx", x.grad), ("gb", b.grad), ("gright", right.grad), ("gleft", left.grad)]:
    np.save(f"{d}/ref_{name}.npy", v.detach().numpy())
)PY";
  std::ofstream(tmp / "ref.py") << script;
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_PYTHON) + " " + (tmp / "ref.py").string() + " " +
                                     tmp.path().string() + " " + std::to_string(scaling),
                                 &out),
            0)
      << out;

  torch::Tensor y = linear->forward(x);  // [B, T, out]
  y.backward(grad_out);
  EXPECT_LT(testing::max_abs_diff(y, io::load_npy(tmp / "ref_y.npy")), 1e-6);
  EXPECT_LT(testing::max_abs_diff(x.grad(), io::load_npy(tmp / "ref_gx.npy")), 1e-5);
  EXPECT_LT(testing::max_abs_diff(linear->bias.grad(), io::load_npy(tmp / "ref_gb.npy")), 1e-5);
  EXPECT_LT(testing::max_abs_diff(linear->lora_right_weight.grad(), io::load_npy(tmp / "ref_gright.npy")), 1e-5);
  EXPECT_LT(testing::max_abs_diff(linear->lora_left_weight.grad(), io::load_npy(tmp / "ref_gleft.npy")), 1e-5);
  EXPECT_FALSE(linear->weight.grad().defined()) << "the frozen base weight must get no gradient";
  // The adapter path contributes: without it the output would differ from the reference.
  torch::Tensor base = torch::nn::functional::linear(x, linear->weight, linear->bias).detach();  // [B, T, out]
  EXPECT_GT(testing::max_abs_diff(base, io::load_npy(tmp / "ref_y.npy")), 1e-2);
}

TEST(LoraLinear, EnablingRegistersDeepSpeedChatNamesAndFreezesOnlyTheWeight) {
  nn::Linear linear(nn::LinearOptions(8, 6));
  linear->enable_lora(nn::LinearLoraOptions(3).lora_scaling(6.0));
  NameSet names;
  for (const auto& item : linear->named_parameters()) names.insert(item.key());
  EXPECT_EQ(names, (NameSet{"weight", "bias", "lora_right_weight", "lora_left_weight"}));
  EXPECT_EQ(linear->lora_right_weight.sizes(), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(linear->lora_left_weight.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_DOUBLE_EQ(linear->lora_scale(), 2.0);
  EXPECT_FALSE(linear->weight.requires_grad());
  EXPECT_TRUE(linear->bias.requires_grad());
  EXPECT_TRUE(linear->lora_right_weight.requires_grad());
  EXPECT_TRUE(linear->lora_left_weight.requires_grad());
}

TEST(LoraLinear, InitIsKaimingUniformOverRankForRightAndZeroForLeft) {
  torch::manual_seed(3);
  nn::Linear linear(nn::LinearOptions(256, 64));
  linear->to(torch::kFloat64);
  linear->enable_lora(nn::LinearLoraOptions(8));
  torch::Tensor right = linear->lora_right_weight.detach();  // [in, r]
  EXPECT_EQ(right.scalar_type(), torch::kFloat64) << "adapters follow the weight's dtype";
  const double bound = 1.0 / std::sqrt(8.0);  // fan_in of [in, r] is r; a fan of 256 gives 0.0625
  EXPECT_LE(right.abs().max().item<double>(), bound);
  EXPECT_GT(right.max().item<double>(), 0.95 * bound);
  EXPECT_LT(right.min().item<double>(), -0.95 * bound);
  EXPECT_NEAR(right.std().item<double>(), bound / std::sqrt(3.0), 0.05 * bound);
  EXPECT_TRUE(torch::equal(linear->lora_left_weight, torch::zeros({8, 64}, torch::kFloat64)));
  // A fresh adapter changes nothing.
  torch::Tensor x = torch::randn({5, 256}, torch::kFloat64);  // [N, in]
  EXPECT_TRUE(torch::equal(linear->forward(x), torch::nn::functional::linear(x, linear->weight, linear->bias)));
}

TEST(LoraLinear, FusedForwardEqualsUnfusedAndUnfuseRestoresWeightBitForBit) {
  torch::manual_seed(5);
  for (bool backup_on_cpu : {true, false}) {
    nn::Linear linear = adapted_linear(40, 24, 8, 16.0);
    torch::Tensor x = torch::randn({7, 40});  // [N, in]
    torch::Tensor unfused = linear->forward(x).detach();  // [N, out]
    torch::Tensor before = linear->weight.detach().clone();  // [out, in]
    const void* storage = linear->weight.data_ptr();
    linear->fuse_lora(backup_on_cpu ? torch::Device(torch::kCPU) : linear->weight.device());
    EXPECT_TRUE(linear->lora_fused());
    EXPECT_FALSE(torch::equal(linear->weight, before)) << "fusing must change W";
    torch::Tensor fused = linear->forward(x).detach();  // [N, out]
    EXPECT_LT(testing::max_abs_diff(fused, unfused), 1e-5);
    EXPECT_TRUE(torch::equal(fused, torch::nn::functional::linear(x, linear->weight, linear->bias)))
        << "fused forward is the plain linear";
    linear->unfuse_lora();
    EXPECT_FALSE(linear->lora_fused());
    EXPECT_TRUE(torch::equal(linear->weight, before));
    EXPECT_EQ(linear->weight.data_ptr(), storage) << "unfuse restores in place";
    EXPECT_TRUE(torch::equal(linear->forward(x), unfused));
  }
}

TEST(LoraLinear, DropoutActsOnlyInTrainingMode) {
  torch::manual_seed(9);
  nn::Linear linear = adapted_linear(32, 16, 4, 4.0, /*dropout=*/0.5);
  torch::Tensor x = torch::randn({6, 32});  // [N, in]
  torch::NoGradGuard no_grad;
  torch::Tensor expected = torch::nn::functional::linear(x, linear->weight, linear->bias) +
                           x.matmul(linear->lora_right_weight).matmul(linear->lora_left_weight) * 1.0;  // [N, out]
  linear->eval();
  EXPECT_LT(testing::max_abs_diff(linear->forward(x), expected), 1e-6);
  linear->train();
  torch::Tensor a = linear->forward(x);  // [N, out]
  torch::Tensor b = linear->forward(x);  // [N, out]
  EXPECT_GT(testing::max_abs_diff(a, b), 1e-4) << "two training forwards draw different masks";
  EXPECT_GT(testing::max_abs_diff(a, expected), 1e-4);
}

TEST(LoraModel, OptFilterConvertsExactlyTheDecoderLayerProjections) {
  for (const std::string fixture : {"opt-preln", "opt-postln"}) {
    auto model = fixture_model(fixture);
    const int64_t layers = model->config().num_hidden_layers;
    EXPECT_EQ(nn::convert_linear_layers_to_lora(*model, {16, 1.0, 0.0, "decoder.layers."}), 6 * layers) << fixture;
    NameSet expected;
    for (int64_t i = 0; i < layers; ++i) {
      std::string layer = "model.decoder.layers." + std::to_string(i) + ".";
      for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                               "fc1", "fc2"}) {
        expected.insert(layer + proj);
      }
    }
    EXPECT_EQ(lora_layer_names(*model), expected) << fixture;
    EXPECT_EQ(nn::count_lora_layers(*model), 6 * layers);
    EXPECT_TRUE(model->named_parameters().contains("model.decoder.layers.0.self_attn.q_proj.lora_right_weight"));
    EXPECT_TRUE(model->named_parameters().contains("model.decoder.layers.1.fc2.lora_left_weight"));
  }
  // opt-postln (the opt-350m shape) has project_in/out; they stay plain.
  auto postln = fixture_model("opt-postln");
  nn::convert_linear_layers_to_lora(*postln, {4, 1.0, 0.0, "decoder.layers."});
  EXPECT_TRUE(postln->named_modules().contains("model.decoder.project_in"));
  EXPECT_EQ(lora_layer_names(*postln).count("model.decoder.project_in"), 0u);
}

TEST(LoraModel, LlamaFilterConvertsAttentionAndMlpProjectionsButNotLmHead) {
  auto model = fixture_model("llama-gqa");
  EXPECT_TRUE(model->named_modules().contains("lm_head"));
  EXPECT_EQ(nn::convert_linear_layers_to_lora(*model, {8, 1.0, 0.0, "layers."}), 14);
  NameSet expected;
  for (int i = 0; i < 2; ++i) {
    std::string layer = "model.layers." + std::to_string(i) + ".";
    for (const char* proj : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      expected.insert(layer + proj);
    }
  }
  EXPECT_EQ(lora_layer_names(*model), expected);
}

TEST(LoraModel, OnlyOptimizeLeavesExactlyLoraAndForcedParametersTrainable) {
  auto model = fixture_model("opt-preln");
  nn::convert_linear_layers_to_lora(*model, {4, 1.0, 0.0, "decoder.layers."});
  NameSet lora;
  for (const auto& item : model->named_parameters()) {
    if (nn::is_lora_parameter(item.key())) lora.insert(item.key());
  }
  EXPECT_EQ(lora.size(), 2u * 6 * 2);
  // Without only_optimize, biases and norms stay trainable next to the adapters.
  EXPECT_TRUE(trainable_names(*model).count("model.decoder.layers.0.fc1.bias"));
  EXPECT_FALSE(trainable_names(*model).count("model.decoder.layers.0.fc1.weight"));

  EXPECT_THROW_WITH(nn::only_optimize_lora_parameters(*model, {"v_head.weight"}), core::InvalidArgument,
                    "force name 'v_head.weight'");
  EXPECT_TRUE(trainable_names(*model).count("model.decoder.layers.0.fc1.bias")) << "a refused call changes nothing";

  nn::only_optimize_lora_parameters(*model);
  EXPECT_EQ(trainable_names(*model), lora);
  const std::string forced = "model.decoder.final_layer_norm.weight";
  nn::only_optimize_lora_parameters(*model, {forced});
  NameSet expected = lora;
  expected.insert(forced);
  EXPECT_EQ(trainable_names(*model), expected);

  EXPECT_TRUE(nn::is_lora_parameter("model.layers.3.mlp.up_proj.lora_left_weight"));
  EXPECT_FALSE(nn::is_lora_parameter("model.layers.3.mlp.up_proj.weight"));
}

TEST(LoraModel, ModelFuseMatchesUnfusedLogitsAndUnfuseRestoresEveryParameter) {
  torch::manual_seed(21);
  auto model = fixture_model("llama-gqa");
  nn::convert_linear_layers_to_lora(*model, {4, 1.0, 0.0, "layers."});
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) {
      if (item.key().find("lora_left_weight") != std::string::npos) item.value().normal_(0.0, 0.2);
    }
  }
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : model->named_parameters()) before[item.key()] = item.value().detach().clone();
  torch::NoGradGuard no_grad;
  torch::Tensor ids = torch::randint(0, 512, {2, 9});  // [B, T]
  torch::Tensor unfused = model->forward(ids);          // [B, T, V]
  nn::fuse_lora(*model);
  torch::Tensor fused = model->forward(ids);  // [B, T, V]
  EXPECT_LT(testing::max_abs_diff(fused, unfused), 1e-4);
  EXPECT_FALSE(torch::equal(model->named_parameters()["model.layers.0.self_attn.q_proj.weight"],
                            before["model.layers.0.self_attn.q_proj.weight"]));
  EXPECT_THROW_WITH(nn::fuse_lora(*model), core::InvalidArgument, "module 'model.layers.0.self_attn.q_proj'");
  nn::unfuse_lora(*model);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), before[item.key()])) << item.key();
  }
  EXPECT_THROW_WITH(nn::unfuse_lora(*model), core::InvalidArgument, "is not fused");
}

TEST(LoraErrors, BadArgumentsAndStatesAreNamed) {
  auto model = fixture_model("opt-preln");
  EXPECT_THROW_WITH(nn::convert_linear_layers_to_lora(*model, {0, 1.0, 0.0, "decoder.layers."}),
                    core::InvalidArgument, "lora_dim must be >= 1, got 0");
  EXPECT_THROW_WITH(nn::convert_linear_layers_to_lora(*model, {8, 1.0, 0.0, "transformer.h."}), core::InvalidArgument,
                    "lora_module_name 'transformer.h.' matches no Linear module");
  EXPECT_THROW_WITH(nn::convert_linear_layers_to_lora(*model, {8, 1.0, 0.0, "transformer.h."}), core::InvalidArgument,
                    "'model.decoder.layers.0.self_attn.q_proj'");
  EXPECT_THROW_WITH(nn::convert_linear_layers_to_lora(*model, {8, 1.0, 1.0, "decoder.layers."}),
                    core::InvalidArgument, "lora_dropout must be in [0, 1), got 1");
  EXPECT_EQ(nn::count_lora_layers(*model), 0) << "refused conversions change nothing";
  nn::convert_linear_layers_to_lora(*model, {8, 1.0, 0.0, "fc1"});
  EXPECT_THROW_WITH(nn::convert_linear_layers_to_lora(*model, {8, 1.0, 0.0, "decoder.layers."}),
                    core::InvalidArgument, "module 'model.decoder.layers.0.fc1' already has adapters");
  EXPECT_EQ(nn::count_lora_layers(*model), 2);

  nn::Linear plain(nn::LinearOptions(4, 4));
  EXPECT_THROW_WITH(plain->fuse_lora(), core::InvalidArgument, "has no LoRA adapters");
  EXPECT_THROW_WITH(plain->enable_lora(nn::LinearLoraOptions(-1)), core::InvalidArgument, "got -1");
  plain->enable_lora(nn::LinearLoraOptions(2));
  EXPECT_THROW_WITH(plain->unfuse_lora(), core::InvalidArgument, "not fused");
  plain->fuse_lora();
  EXPECT_THROW_WITH(plain->fuse_lora(), core::InvalidArgument, "already fused");
}

}  // namespace
}  // namespace dschat
