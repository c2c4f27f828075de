// Bad checkpoints and names give errors that name the file and every offending tensor or path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "dschat/models/load_save.h"
#include "dschat/io/model_source.h"
#include "dschat/io/state_dict.h"
#include "dschat/nn/linear.h"
#include "test_util.h"

namespace dschat {
namespace {
namespace fs = std::filesystem;

// A copy of a fixture model whose weights went through `edit`.
fs::path edited_copy(const testing::TempDir& tmp, const std::string& name,
                     const std::function<void(io::TensorMap&)>& edit) {
  fs::path dir = tmp / name;
  fs::create_directories(dir);
  fs::copy_file(testing::fixture(name) / "config.json", dir / "config.json");
  io::TensorMap weights = io::load_state_dict(testing::fixture(name));
  edit(weights);
  io::save_safetensors(dir / "model.safetensors", weights);
  return dir;
}

TEST(ModelErrors, MissingAndUnexpectedTensorsAreListedByName) {
  testing::TempDir tmp;
  auto dir = edited_copy(tmp, "opt-preln", [](io::TensorMap& w) {
    w.erase("model.decoder.layers.1.fc1.bias");
    w["model.decoder.extra.weight"] = torch::zeros({2});
  });
  EXPECT_THROW_WITH(models::load_causal_lm(dir.string()), core::FormatError,
                    "missing tensors: model.decoder.layers.1.fc1.bias; unexpected tensors: model.decoder.extra.weight");
}

TEST(ModelErrors, ConfigContradictingWeightShapesNamesTheTensor) {
  testing::TempDir tmp;
  auto dir = edited_copy(tmp, "llama-gqa", [](io::TensorMap& w) {
    w["model.layers.0.self_attn.k_proj.weight"] = torch::zeros({32, 32});  // config says 2 KV heads: [16, 32]
  });
  EXPECT_THROW_WITH(models::load_causal_lm(dir.string()), core::FormatError,
                    "'model.layers.0.self_attn.k_proj.weight' has shape [32, 32] in the checkpoint but [16, 32]");
}

TEST(ModelErrors, IntegerWeightsAreRejected) {
  testing::TempDir tmp;
  auto dir = edited_copy(tmp, "opt-preln", [](io::TensorMap& w) {
    w["model.decoder.layers.0.fc1.bias"] = torch::zeros({64}, torch::kInt32);
  });
  EXPECT_THROW_WITH(models::load_causal_lm(dir.string()), core::FormatError, "expected a floating-point dtype");
}

TEST(ModelNames, OldOptCheckpointsWithoutModelPrefixLoad) {
  // facebook/opt-* pytorch_model.bin files were saved from OPTModel: "decoder.*", no "model.".
  testing::TempDir tmp;
  auto dir = edited_copy(tmp, "opt-preln", [](io::TensorMap& w) {
    io::TensorMap renamed;
    for (auto& [name, tensor] : w) renamed.emplace(name.substr(std::string("model.").size()), tensor);
    w = renamed;
  });
  auto old_layout = models::load_causal_lm(dir.string());
  auto reference = models::load_causal_lm(testing::fixture("opt-preln").string());
  for (const auto& [name, tensor] : reference->state_dict()) {
    EXPECT_TRUE(torch::equal(tensor, old_layout->state_dict().at(name))) << name;
  }
}

TEST(ModelErrors, UnknownModelTypeNamesTheConfigFile) {
  testing::TempDir tmp;
  std::ofstream(tmp / "config.json") << R"({"model_type": "falcon", "vocab_size": 3})";
  EXPECT_THROW_WITH(models::load_causal_lm(tmp.path().string()), core::Unsupported, "config.json: model_type 'falcon'");
}

TEST(ModelErrors, MissingWeightsListTheFilesLookedFor) {
  testing::TempDir tmp;
  fs::copy_file(testing::fixture("opt-preln") / "config.json", tmp / "config.json");
  EXPECT_THROW_WITH(models::load_causal_lm(tmp.path().string()), core::NotFound, "model.safetensors");
}

TEST(ModelSource, UnknownModelListsEverySearchedPath) {
  testing::TempDir tmp;
  setenv("HF_HOME", tmp.path().c_str(), 1);
  try {
    io::resolve_model_dir("opt-6.7b");
    FAIL() << "expected NotFound";
  } catch (const core::NotFound& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("nothing is downloaded"), std::string::npos) << what;
    EXPECT_NE(what.find((tmp / "hub" / "models--facebook--opt-6.7b" / "snapshots").string()), std::string::npos) << what;
    // ... and how to put the weights there: which files, which cache layout, or random weights.
    for (const char* hint : {"config.json", "model.safetensors", "pytorch_model.bin", "vocab.json and merges.txt",
                             "models--facebook--opt-6.7b/snapshots/<revision>/",
                             "huggingface-cli download facebook/opt-6.7b", "--init random"}) {
      EXPECT_NE(what.find(hint), std::string::npos) << hint << "\n" << what;
    }
  }
  unsetenv("HF_HOME");
  // A step's tokenizer lookup reports the missing model as such, not as a missing tokenizer.
  std::string out;
  EXPECT_NE(testing::run_command("cd " + tmp.path().string() + " && HF_HOME=" + tmp.path().string() + " " +
                                     DSCHAT_CLI_PATH + " sft --actor facebook/opt-1.3b --reward 350m "
                                     "--deployment single_gpu --skip-plan --device cpu",
                                 &out),
            0);
  EXPECT_NE(out.find("model 'facebook/opt-1.3b' not found"), std::string::npos) << out;
  EXPECT_EQ(out.find("no tokenizer for"), std::string::npos) << out;
}

TEST(ModelSource, FindsHubCacheSnapshotsByIdAndShortName) {
  testing::TempDir tmp;
  fs::path repo = tmp / "hub" / "models--facebook--opt-125m";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "snapshots" / "abc123");
  std::ofstream(repo / "refs" / "main") << "abc123";
  fs::copy_file(testing::fixture("opt-preln") / "config.json", repo / "snapshots" / "abc123" / "config.json");
  setenv("HF_HOME", tmp.path().c_str(), 1);
  EXPECT_EQ(io::resolve_model_dir("facebook/opt-125m"), repo / "snapshots" / "abc123");
  EXPECT_EQ(io::resolve_model_dir("opt-125m"), repo / "snapshots" / "abc123");
  unsetenv("HF_HOME");
  EXPECT_EQ(io::expand_short_model_name("llama-2-7b"), "meta-llama/Llama-2-7b-hf");
  EXPECT_EQ(io::expand_short_model_name("opt-1.3b"), "facebook/opt-1.3b");
  // The other families' hub ids, with their casing (the cache folder is case-sensitive).
  const std::pair<const char*, const char*> ids[] = {
      {"gpt2-medium", "openai-community/gpt2-medium"},   {"pythia-1.4b", "EleutherAI/pythia-1.4b"},
      {"gpt-j-6b", "EleutherAI/gpt-j-6b"},               {"gpt-neo-125m", "EleutherAI/gpt-neo-125m"},
      {"bloom-560m", "bigscience/bloom-560m"},           {"bloomz-1b7", "bigscience/bloomz-1b7"},
      {"codegen-350m-mono", "Salesforce/codegen-350M-mono"},
      {"qwen2.5-0.5b-instruct", "Qwen/Qwen2.5-0.5B-Instruct"}, {"Qwen3-8B", "Qwen/Qwen3-8B"},
      {"qwen3-4b-base", "Qwen/Qwen3-4B-Base"},           {"mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1"},
      {"mistral-7b-instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.2"}};
  for (const auto& [name, id] : ids) EXPECT_EQ(io::expand_short_model_name(name), id) << name;
}

TEST(ModelSource, FamilyPresetsRoundTripAndTheSmallOnesRun) {
  // Every preset's config.json round-trips through transformers' keys (plan and --init random
  // read these)...
  for (const std::string& name : core::model_preset_names()) {
    auto preset = core::model_preset(name);
    ASSERT_TRUE(preset.has_value()) << name;
    core::ModelConfig back = core::parse_model_config(core::model_config_to_json(*preset), name);
    EXPECT_EQ(core::model_config_to_json(back), core::model_config_to_json(*preset)) << name;
  }
  // ... and the two smallest new ones build at their real shape, bf16, random weights, and run.
  for (const char* name : {"pythia-70m", "gpt2"}) {
    SCOPED_TRACE(name);
    auto preset = core::model_preset(name);
    models::LoadOptions options;
    options.random_init = true;
    options.dtype = torch::kBFloat16;
    auto model = models::load_causal_lm(name, options);
    EXPECT_EQ(model->config().model_type, preset->model_type);
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model->forward(torch::tensor({{2, 100, 200}}, torch::kInt64));  // [1, 3, V]
    EXPECT_EQ(logits.size(2), preset->vocab_size);
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  }
  EXPECT_EQ(core::model_preset("Qwen/Qwen2.5-7B-Instruct")->num_key_value_heads, 4);
  EXPECT_EQ(core::model_preset("qwen3-8b")->head_dim, 128);
  EXPECT_TRUE(core::model_preset("mistral-7b-v0.1")->is_sliding_layer(31));
}

TEST(ModelSource, RandomInitBuildsPresetsWithoutWeights) {
  models::LoadOptions options;
  options.random_init = true;
  options.dtype = torch::kBFloat16;
  auto model = models::load_causal_lm("opt-125m", options);
  EXPECT_EQ(model->config().num_hidden_layers, 12);
  torch::NoGradGuard no_grad;
  torch::Tensor logits = model->forward(torch::tensor({{2, 100, 200}}, torch::kInt64));  // [1, 3, V]
  EXPECT_EQ(logits.sizes(), (torch::IntArrayRef{1, 3, 50272}));
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

}  // namespace
}  // namespace dschat

namespace dschat {
namespace {

// Deferred loads (ZeRO-3's zero.Init): the parameters stay on the meta device and the values are
// recorded; what the checkpoint lacks (a fresh v_head) gets its layer's initialisation on the
// host; a preset with random weights records the eager random load's values; and a meta model
// cannot be loaded eagerly.
TEST(DeferredLoad, RecordsValuesInitialisesWhatIsMissingAndRefusesAnEagerMetaLoad) {
  models::DeferredParameters deferred;
  models::LoadOptions load;
  load.deferred = &deferred;
  const models::ValueHeadModel critic =
      models::load_value_model(testing::fixture("opt-preln").string(), load, /*allow_missing_head=*/true);
  for (const auto& item : critic->named_parameters()) {
    EXPECT_TRUE(item.value().is_meta()) << item.key();
    ASSERT_TRUE(deferred.values.count(item.key())) << item.key();
    EXPECT_EQ(deferred.values.at(item.key()).sizes(), item.value().sizes()) << item.key();
  }
  const torch::Tensor head = deferred.values.at("v_head.weight");  // [1, hidden]
  EXPECT_TRUE(head.device().is_cpu());
  EXPECT_GT(head.abs().sum().item<double>(), 0.0);

  load.random_init = true;
  models::DeferredParameters random;
  load.deferred = &random;
  torch::manual_seed(3);
  const models::CausalLM lazy = models::load_causal_lm(testing::fixture("llama-gqa").string(), load);
  load.deferred = nullptr;
  torch::manual_seed(3);
  const models::CausalLM eager = models::load_causal_lm(testing::fixture("llama-gqa").string(), load);
  for (const auto& item : eager->named_parameters()) {
    EXPECT_TRUE(torch::equal(random.values.at(item.key()), item.value())) << item.key();
  }

  models::CausalLM meta_model = [&] {
    nn::ParameterPlacementScope placement(torch::kMeta, torch::kFloat32);
    return models::CausalLM(core::load_model_config(testing::fixture("opt-preln").string()));
  }();
  EXPECT_THROW_WITH(meta_model->load_weights(io::load_state_dict(testing::fixture("opt-preln")), "the fixture"),
                    core::InvalidArgument, "is on the meta device, so its value cannot be loaded");
}

}  // namespace
}  // namespace dschat
