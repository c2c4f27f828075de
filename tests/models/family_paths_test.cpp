// The paths beyond forward for the families of issue 37, on their tiny fixtures: LoRA on
// DeepSpeed-Chat's module names, ZeRO stage 3 against stage 0 and the HF export in each family's
// own layout, the deferred (partitioned) load, and the config errors that name what is refused.
// Tolerances: 1e-6 absolute between ZeRO stages (fp32, summation order only); 1e-5 on logits of
// an exported model (the same weights through a fresh load).
#include <gtest/gtest.h>

#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/engine/checkpoint_export.h"
#include "dschat/engine/training_engine.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/families.h"
#include "dschat/models/hf_layout.h"
#include "dschat/models/load_save.h"
#include "dschat/nn/lora.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

// The registry's lora_module_name for a model_type ("gptj, codegen" lists two).
std::string lora_module_name(const std::string& model_type) {
  for (const auto& family : models::supported_families()) {
    if ((family.model_types + ",").find(model_type + ",") != std::string::npos) return family.lora_modules;
  }
  return "";
}

torch::Tensor token_batch(int step) {
  torch::Generator generator = at::detail::createCPUGenerator(50 + step);
  return torch::randint(3, 512, {2, 9}, generator, torch::kInt64);  // [B, T]
}

torch::Tensor loss_of(models::CausalLM& model, int step) {
  torch::Tensor ids = token_batch(step);
  torch::Tensor logits = model->forward(ids);  // [B, T, V]
  return torch::nn::functional::cross_entropy(logits.narrow(1, 0, 8).reshape({-1, logits.size(2)}),
                                              ids.narrow(1, 1, 8).reshape({-1}));
}

class FamilyPaths : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return testing::fixture(GetParam()).string(); }
};

TEST_P(FamilyPaths, LoraOnDeepSpeedChatModuleNamesLeavesTheModelAndFusesBack) {
  auto model = models::load_causal_lm(dir());
  const std::string filter = lora_module_name(model->config().model_type);
  ASSERT_FALSE(filter.empty()) << model->config().model_type;
  torch::NoGradGuard no_grad;
  torch::Tensor before = model->forward(token_batch(0));  // [B, T, V]
  nn::LoraOptions lora;
  lora.lora_dim = 4;
  lora.module_name_filter = filter;
  // Every decoder layer's q, k, v, output projection and MLP Linears (3 of them in the gated MLP).
  const int64_t per_layer = model->config().architecture == core::Architecture::Llama ? 7 : 6;
  EXPECT_EQ(nn::convert_linear_layers_to_lora(*model, lora), per_layer * model->config().num_hidden_layers);
  EXPECT_LT(testing::max_abs_diff(model->forward(token_batch(0)), before), 1e-6);  // left weights start at 0
  // Trained adapters fused as a step saves them (engine::fuse_lora_adapters), then written in the
  // family's layout: no adapter tensor is left, and the model equals the unfused one.
  for (const auto& item : model->named_parameters()) {
    if (item.key().find("lora_left_weight") != std::string::npos) item.value().normal_(0.0, 0.1);
  }
  torch::Tensor with_adapters = model->forward(token_batch(0));  // [B, T, V]
  std::map<std::string, torch::Tensor> params = models::named_weights(*model);
  for (auto& [name, tensor] : params) tensor = tensor.clone();
  engine::fuse_lora_adapters(params, engine::lora_scales(*model), "test");
  const models::NamedTensors hf = models::to_hf_layout(model->config(), params);
  for (const auto& [name, tensor] : hf) EXPECT_FALSE(nn::is_lora_parameter(name)) << name;
  auto plain = models::load_causal_lm(dir());
  plain->load_weights(hf, "fused");
  EXPECT_LT(testing::max_abs_diff(plain->forward(token_batch(0)), with_adapters), 1e-5);
}

TEST_P(FamilyPaths, ZeroStage3MatchesStage0AndExportsTheFamilyLayout) {
  std::vector<std::map<std::string, torch::Tensor>> trained;
  testing::TempDir checkpoint, exported;
  models::CausalLM stage0{nullptr};
  for (int stage : {0, 3}) {
    auto model = models::load_causal_lm(dir());  // eval: no dropout, so both stages see one function
    engine::TrainingEngineOptions options;
    options.config = engine::DeepSpeedConfig::parse(
        json{{"train_batch_size", 2}, {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 40}}}},
        1, "test");
    options.optimizer.lr = 1e-2;
    engine::TrainingEngine engine(model.ptr(), options);
    for (int step = 0; step < 2; ++step) {
      engine.backward(loss_of(model, step));
      engine.step();
    }
    trained.push_back(engine.consolidated_parameters());
    if (stage == 3) engine.save_checkpoint(checkpoint.path());
    if (stage == 0) stage0 = model;
  }
  for (const auto& [name, value] : trained[0]) {
    EXPECT_LT(testing::max_abs_diff(trained[1].at(name), value), 1e-6) << name;
  }
  engine::ExportOptions export_options;
  export_options.model_dir = dir();
  engine::export_hf_checkpoint(checkpoint.path(), "", exported.path(), export_options);
  // The export has exactly the checkpoint names transformers wrote for this family.
  const io::TensorMap written = io::load_state_dict(exported.path()), original = io::load_state_dict(dir());
  std::vector<std::string> a, b;
  for (const auto& item : written) a.push_back(item.first);
  for (const auto& item : original) b.push_back(item.first);
  EXPECT_EQ(a, b);
  auto loaded = models::load_causal_lm(exported.path().string());
  stage0->eval();
  torch::NoGradGuard no_grad;
  EXPECT_LT(testing::max_abs_diff(loaded->forward(token_batch(9)), stage0->forward(token_batch(9))), 1e-5);
}

TEST_P(FamilyPaths, DeferredLoadRecordsEachParameterInModuleLayout) {
  auto eager = models::load_causal_lm(dir());
  models::DeferredParameters deferred;
  models::LoadOptions options;
  options.deferred = &deferred;
  auto meta = models::load_causal_lm(dir(), options);
  const auto params = eager->named_parameters();
  ASSERT_EQ(deferred.values.size(), params.size());
  for (const auto& item : params) {
    ASSERT_TRUE(deferred.values.count(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(deferred.values.at(item.key()).contiguous(), item.value())) << item.key();
    EXPECT_TRUE(meta->named_parameters()[item.key()].is_meta()) << item.key();
  }
}

// One fixture per layout that is not the identity, and Qwen2 (q/k/v biases only).
INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyPaths,
                         ::testing::Values("gpt2", "gpt-neo-local", "codegen", "gpt-neox-parallel", "bloom",
                                           "qwen2-tied", "qwen3"),
                         testing::FixtureName());

core::ModelConfig parse(json config) {
  config.update({{"vocab_size", 64}});
  return core::parse_model_config(config.dump(), "m/config.json");
}

TEST(FamilyConfig, RefusesWhatItDoesNotHandleByName) {
  EXPECT_THROW_WITH(parse({{"model_type", "falcon"}}), core::Unsupported,
                    "model_type 'falcon' is not supported (supported: opt, llama, mistral, qwen2, qwen3, gpt2");
  const json gpt2 = {{"model_type", "gpt2"}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4}};
  json inverse = gpt2;
  inverse["scale_attn_by_inverse_layer_idx"] = true;
  EXPECT_THROW_WITH(parse(inverse), core::Unsupported, "key 'scale_attn_by_inverse_layer_idx'");
  EXPECT_THROW_WITH(parse({{"model_type", "bloom"}, {"hidden_size", 32}, {"n_layer", 2}, {"n_head", 4},
                           {"slow_but_exact", true}}),
                    core::Unsupported, "key 'slow_but_exact'");
  const json qwen = {{"model_type", "qwen2"}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                     {"num_attention_heads", 4}, {"intermediate_size", 64}};
  json types = qwen;
  types["layer_types"] = {"full_attention", "chunked_attention"};
  EXPECT_THROW_WITH(parse(types), core::Unsupported, "layer type 'chunked_attention'");
  json yarn = qwen;
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THROW_WITH(parse(yarn), core::Unsupported, "rope type 'yarn' is not supported");
  EXPECT_THROW_WITH(parse({{"model_type", "gpt2"}, {"n_embd", 30}, {"n_layer", 2}, {"n_head", 4}}),
                    core::ConfigError, "n_embd (30) must be divisible by n_head (4)");
  EXPECT_THROW_WITH(parse({{"model_type", "gptj"}, {"n_embd", 32}, {"n_layer", 2}, {"n_head", 4}, {"rotary_dim", 12}}),
                    core::ConfigError, "rotary_dim (12) must be even and at most the head size (8)");
}

TEST(FamilyConfig, ReadsEachFamilysSwitches) {
  core::ModelConfig neox = parse({{"model_type", "gpt_neox"}, {"hidden_size", 64}, {"num_hidden_layers", 2},
                                  {"num_attention_heads", 4}, {"intermediate_size", 128}, {"rotary_pct", 0.25},
                                  {"use_parallel_residual", false}});
  EXPECT_EQ(neox.rotary_dims(), 4);
  EXPECT_FALSE(neox.parallel_residual);
  core::ModelConfig neo = parse({{"model_type", "gpt_neo"}, {"hidden_size", 32}, {"num_layers", 4}, {"num_heads", 4},
                                 {"attention_types", {{{"global", "local"}, 2}}}, {"window_size", 16}});
  EXPECT_EQ(neo.sliding_window, 16);
  EXPECT_EQ(neo.sliding_layers, (std::vector<bool>{false, true, false, true}));
  EXPECT_FALSE(neo.scale_attention);
  core::ModelConfig qwen = parse({{"model_type", "qwen2"}, {"hidden_size", 32}, {"num_hidden_layers", 4},
                                  {"num_attention_heads", 4}, {"intermediate_size", 64}, {"use_sliding_window", true},
                                  {"sliding_window", 8}, {"max_window_layers", 2}});
  EXPECT_EQ(qwen.sliding_layers, (std::vector<bool>{false, false, true, true}));
  EXPECT_TRUE(qwen.attention_bias);
  EXPECT_FALSE(qwen.attention_output_bias);
  core::ModelConfig off = parse({{"model_type", "qwen2"}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                                 {"num_attention_heads", 4}, {"intermediate_size", 64}, {"sliding_window", 8}});
  EXPECT_EQ(off.sliding_window, 0) << "use_sliding_window defaults to false";
}

}  // namespace
}  // namespace dschat
