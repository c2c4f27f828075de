// The backbone's layer parameter hooks (ZeRO stage 3, nn/layer_hooks.h) on tiny random OPT and
// LLaMA models: a test engine really frees each layer's parameters outside its brackets, as
// ZeRO-3 does (set_data to an empty tensor, same Variable). Checked: the exact call sequence of a
// training step, that only the layer being run is materialised, logits and every gradient equal
// to the same model without hooks (also with frozen embeddings), the no-grad and KV-cache rules.
// Tolerance: fp32, max abs diff <= 1e-6 (the hooked run recomputes the same ops on the same
// values with the same dropout masks).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dschat/core/model_config.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/models/causal_lm.h"
#include "dschat/nn/layer_hooks.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace dschat {
namespace {

using testing::max_abs_diff;
using Calls = std::vector<std::string>;

constexpr int64_t kLayers = 3;
constexpr double kTolerance = 1e-6;

// Keeps each decoder layer's real data on the side and gives it to the parameters only between
// acquire_layer and release_layer, recording every call.
class ReleasingHooks : public nn::LayerParameterHooks {
 public:
  explicit ReleasingHooks(models::Backbone& backbone) {
    for (const auto& layer : backbone.decoder_layers()) {
      params_.push_back(layer->parameters());
      stored_.emplace_back();
      for (const auto& param : params_.back()) stored_.back().push_back(param.detach());
    }
    gradients_seen.assign(params_.size(), 0);
    grads_at_ready.resize(params_.size());
    for (size_t layer = 0; layer < params_.size(); ++layer) free_layer(layer);
  }

  ~ReleasingHooks() override { materialise_all(); }

  void begin_forward() override { calls.push_back("begin"); }

  void acquire_layer(int64_t layer) override {
    calls.push_back("acquire " + std::to_string(layer));
    for (size_t other = 0; other < params_.size(); ++other) {
      if (!live(other)) continue;
      others_live.push_back("layer " + std::to_string(other) + " live at acquire " + std::to_string(layer));
    }
    materialise(static_cast<size_t>(layer));
  }

  void release_layer(int64_t layer) override {
    calls.push_back("release " + std::to_string(layer));
    free_layer(static_cast<size_t>(layer));
  }

  void layer_gradients_ready(int64_t layer) override {
    calls.push_back("ready " + std::to_string(layer));
    for (const auto& param : params_[layer]) {
      if (!param.grad().defined()) continue;
      ++gradients_seen[layer];
      grads_at_ready[layer].push_back(param.grad().clone());
    }
  }

  bool live(size_t layer) const {
    for (const auto& param : params_[layer]) {
      if (param.numel() > 0) return true;
    }
    return false;
  }
  size_t live_layers() const {
    size_t count = 0;
    for (size_t layer = 0; layer < params_.size(); ++layer) count += live(layer) ? 1 : 0;
    return count;
  }
  /// Gives every layer its data back (what an engine does before it drops ZeRO-3).
  void materialise_all() {
    for (size_t layer = 0; layer < params_.size(); ++layer) materialise(layer);
  }
  size_t params_in(size_t layer) const { return params_[layer].size(); }
  const std::vector<torch::Tensor>& params_of(size_t layer) const { return params_[layer]; }

  Calls calls;
  std::vector<std::string> others_live;                  // violations found at acquire_layer
  std::vector<int> gradients_seen;                       // per layer, at layer_gradients_ready
  std::vector<std::vector<torch::Tensor>> grads_at_ready;  // per layer: copies of the grads then

 private:
  void materialise(size_t layer) {
    for (size_t i = 0; i < params_[layer].size(); ++i) params_[layer][i].set_data(stored_[layer][i]);
  }
  void free_layer(size_t layer) {
    for (auto& param : params_[layer]) param.set_data(torch::empty({0}, param.options()));
  }

  std::vector<std::vector<torch::Tensor>> params_;  // per layer, the registered Variables
  std::vector<std::vector<torch::Tensor>> stored_;  // per layer, their real data
};

Calls forward_brackets() {
  Calls calls = {"begin"};
  for (int64_t i = 0; i < kLayers; ++i) {
    calls.push_back("acquire " + std::to_string(i));
    calls.push_back("release " + std::to_string(i));
  }
  return calls;
}

Calls training_step_calls() {
  Calls calls = forward_brackets();
  for (int64_t i = kLayers - 1; i >= 0; --i) {
    for (const char* call : {"acquire ", "ready ", "release "}) calls.push_back(call + std::to_string(i));
  }
  return calls;
}

struct Batch {
  torch::Tensor ids;    // [B, T]
  torch::Tensor mask;   // [B, T], row 0 left-padded
  torch::Tensor probe;  // [B, T, V] weights of the scalar loss
};

class LayerHooks : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    config_ = core::load_model_config(testing::fixture(GetParam()).string());  // tiny: hidden 32
    config_.num_hidden_layers = kLayers;
    torch::manual_seed(42);
    model_ = models::CausalLM(config_);
    reference_ = models::CausalLM(config_);
    reference_->load_weights(model_->state_dict(), "the hooked model");
    batch_.ids = torch::randint(3, config_.vocab_size, {2, 7}, torch::kInt64);
    batch_.mask = torch::ones({2, 7}, torch::kInt64);
    batch_.mask.narrow(1, 0, 2)[0].fill_(0);
    batch_.probe = torch::randn({2, 7, config_.vocab_size});
  }

  // One training forward + backward of `model` in train mode (OPT fixtures: dropout 0.1) with a
  // fixed dropout stream; returns the logits [B, T, V].
  torch::Tensor train_step(models::CausalLM& model) {
    model->train();
    torch::manual_seed(7);
    torch::Tensor logits = model->forward(batch_.ids, batch_.mask);  // [B, T, V]
    (logits * batch_.probe).sum().backward();
    return logits.detach();
  }

  core::ModelConfig config_;
  models::CausalLM model_{nullptr}, reference_{nullptr};
  Batch batch_;
};

TEST_P(LayerHooks, TrainingStepFollowsTheProtocolWithOnlyOneLayerLive) {
  for (bool checkpointing : {false, true}) {  // the hooks' checkpointing takes over either way
    SCOPED_TRACE(checkpointing ? "gradient checkpointing on" : "gradient checkpointing off");
    model_->zero_grad();
    model_->backbone().set_gradient_checkpointing(checkpointing);
    ReleasingHooks hooks(model_->backbone());
    model_->backbone().set_layer_parameter_hooks(&hooks);
    EXPECT_EQ(model_->backbone().layer_parameter_hooks(), &hooks);
    EXPECT_EQ(hooks.live_layers(), 0u);

    model_->train();
    torch::manual_seed(7);
    torch::Tensor logits = model_->forward(batch_.ids, batch_.mask);  // [B, T, V]
    EXPECT_EQ(hooks.calls, forward_brackets());
    EXPECT_EQ(hooks.live_layers(), 0u) << "a layer stayed materialised after forward";
    (logits * batch_.probe).sum().backward();

    EXPECT_EQ(hooks.calls, training_step_calls());
    EXPECT_TRUE(hooks.others_live.empty()) << hooks.others_live.front();
    EXPECT_EQ(hooks.live_layers(), 0u) << "a layer stayed materialised after backward";
    for (size_t layer = 0; layer < kLayers; ++layer) {
      EXPECT_EQ(hooks.gradients_seen[layer], static_cast<int>(hooks.params_in(layer))) << "layer " << layer;
      // Gradients at layer_gradients_ready are already final.
      const auto& params = hooks.params_of(layer);
      for (size_t i = 0; i < hooks.grads_at_ready[layer].size(); ++i) {
        EXPECT_TRUE(torch::equal(hooks.grads_at_ready[layer][i], params[i].grad())) << "layer " << layer;
      }
    }
    model_->backbone().set_layer_parameter_hooks(nullptr);
  }
}

TEST_P(LayerHooks, LogitsAndGradientsEqualTheModelWithoutHooks) {
  ReleasingHooks hooks(model_->backbone());
  model_->backbone().set_layer_parameter_hooks(&hooks);
  torch::Tensor logits = train_step(model_);              // [B, T, V]
  torch::Tensor expected_logits = train_step(reference_);  // [B, T, V]
  EXPECT_LE(max_abs_diff(logits, expected_logits), kTolerance);

  auto expected = reference_->named_parameters();
  int compared = 0;
  for (const auto& param : model_->named_parameters()) {
    const torch::Tensor& expected_grad = expected[param.key()].grad();
    ASSERT_TRUE(expected_grad.defined()) << param.key();
    ASSERT_TRUE(param.value().grad().defined()) << param.key();
    EXPECT_LE(max_abs_diff(param.value().grad(), expected_grad), kTolerance) << param.key();
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(expected.size()));
}

TEST_P(LayerHooks, FrozenEmbeddingsStillGiveEveryLayerItsGradients) {
  // LoRA-style training: the layers' input needs no gradient, their parameters do.
  for (auto* model : {&model_, &reference_}) {
    std::set<const c10::TensorImpl*> in_layers;  // whatever the family calls its layer list
    for (const auto& layer : (*model)->backbone().decoder_layers()) {
      for (const auto& param : layer->parameters()) in_layers.insert(param.unsafeGetTensorImpl());
    }
    for (const auto& param : (*model)->parameters()) {
      if (!in_layers.count(param.unsafeGetTensorImpl())) param.set_requires_grad(false);
    }
  }
  ReleasingHooks hooks(model_->backbone());
  model_->backbone().set_layer_parameter_hooks(&hooks);
  train_step(model_);
  train_step(reference_);
  EXPECT_EQ(hooks.calls, training_step_calls());
  auto expected = reference_->named_parameters();
  for (const auto& param : model_->named_parameters()) {
    if (!param.value().requires_grad()) continue;
    ASSERT_TRUE(param.value().grad().defined()) << param.key();
    EXPECT_LE(max_abs_diff(param.value().grad(), expected[param.key()].grad()), kTolerance) << param.key();
  }
}

TEST_P(LayerHooks, NoGradForwardOnlyBracketsTheLayers) {
  ReleasingHooks hooks(model_->backbone());
  model_->backbone().set_layer_parameter_hooks(&hooks);
  model_->eval();
  reference_->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor logits = model_->forward(batch_.ids, batch_.mask);  // [B, T, V]
  EXPECT_EQ(hooks.calls, forward_brackets());
  EXPECT_EQ(hooks.live_layers(), 0u);
  EXPECT_LE(max_abs_diff(logits, reference_->forward(batch_.ids, batch_.mask)), kTolerance);

  // Cached generation is a no-grad forward too: allowed, same brackets per step.
  inference::ContiguousKvCache cache(config_, 2, 8, torch::kFloat32, torch::kCPU);
  hooks.calls.clear();
  model_->forward(batch_.ids, batch_.mask, &cache);
  EXPECT_EQ(hooks.calls, forward_brackets());

  // Removing the hooks removes the calls.
  hooks.materialise_all();
  model_->backbone().set_layer_parameter_hooks(nullptr);
  EXPECT_EQ(model_->backbone().layer_parameter_hooks(), nullptr);
  hooks.calls.clear();
  EXPECT_LE(max_abs_diff(model_->forward(batch_.ids, batch_.mask), logits), kTolerance);
  EXPECT_TRUE(hooks.calls.empty());
}

TEST_P(LayerHooks, GradEnabledForwardWithKvCacheIsUnsupported) {
  ReleasingHooks hooks(model_->backbone());
  model_->backbone().set_layer_parameter_hooks(&hooks);
  inference::ContiguousKvCache cache(config_, 2, 8, torch::kFloat32, torch::kCPU);
  EXPECT_THROW_WITH(model_->forward(batch_.ids, batch_.mask, &cache), core::Unsupported,
                    "cannot run a grad-enabled forward with a KV cache");
  EXPECT_TRUE(hooks.calls.empty()) << "refused before begin_forward";
}

TEST_P(LayerHooks, DecoderLayersAreTheLayerModulesInOrder) {
  auto layers = model_->backbone().decoder_layers();
  ASSERT_EQ(layers.size(), static_cast<size_t>(kLayers));
  const auto arch = config_.architecture;
  const std::string prefix = arch == core::Architecture::Opt                                      ? "model.decoder.layers."
                             : arch == core::Architecture::Llama || arch == core::Architecture::GptNeox ? "model.layers."
                                                                                                  : "model.h.";
  auto params = model_->named_parameters();
  for (size_t i = 0; i < layers.size(); ++i) {
    for (const auto& param : layers[i]->named_parameters()) {
      const std::string name = prefix + std::to_string(i) + "." + param.key();
      ASSERT_NE(params.find(name), nullptr) << name;
      EXPECT_TRUE(params[name].is_same(param.value())) << name;  // same Variable: identity works
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyRandom, LayerHooks, ::testing::ValuesIn(testing::model_fixtures()), testing::FixtureName());

}  // namespace
}  // namespace dschat
