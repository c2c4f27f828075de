// One test body per device (CTranslate2's per-device pattern): "cpu" runs everywhere (CI), "cuda"
// where a GPU is visible (tools/gpu_check.sh runs `dschat_tests --gtest_filter='*OnDevice*'`),
// and skips elsewhere. What runs on each device:
// - a ZeRO-0 and a ZeRO-3 training step in fp32 match the CPU's (tolerance 2e-5 relative, floor
//   1e-6: reductions run in another order on a GPU);
// - bf16 (and, on CUDA, fp16 with loss scaling) training stays finite and its loss falls;
// - greedy generation gives transformers' ids for OPT and LLaMA (fixtures' greedy.npy), with the
//   static and with the continuous engine (paged attention in place and gathered);
// - a HybridEngine generates the ids of a plain copy of its weights after a training step;
// - a deferred (zero.Init) load trains like an eager one; a ZeRO-3 inference engine scores like
//   the replicated model.
#include <gtest/gtest.h>

#include "dschat/core/device.h"
#include "dschat/engine/training_engine.h"
#include "dschat/engine/zero_inference_engine.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/io/npy.h"
#include "dschat/models/load_save.h"
#include "dschat/nn/linear.h"
#include "dschat/nn/lora.h"
#include "test_util.h"

namespace dschat {
namespace {

class OnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda" && !torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  // Indexed (cuda:0, not cuda): the device tensors placed there report, so the two compare equal.
  torch::Device device() const { return core::indexed_device(torch::Device(GetParam())); }
};

models::CausalLM load_on(const std::string& fixture, const torch::Device& device,
                         torch::ScalarType dtype = torch::kFloat32) {
  models::LoadOptions load;
  load.device = device;
  load.dtype = dtype;
  load.dropout = 0.0;  // the same forward on every device
  return models::load_causal_lm(testing::fixture(fixture).string(), load);
}

engine::TrainingEngineOptions engine_options(int stage, const std::string& precision) {
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2},
                       {"gradient_accumulation_steps", 1},
                       {"train_batch_size", 2},
                       {"steps_per_print", 0},
                       {"gradient_clipping", 1.0},
                       {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 16}}}};
  if (precision == "fp16") ds["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  if (precision == "bf16") ds["bf16"] = {{"enabled", true}};
  engine::TrainingEngineOptions options;
  options.config = engine::DeepSpeedConfig::parse(ds, 1, "on-device test");
  options.optimizer.lr = 1e-2;
  return options;
}

// A deferred (zero.Init) load of a fixture for `device`: the model and the values it left.
std::pair<models::CausalLM, std::shared_ptr<models::DeferredParameters>> load_deferred(const std::string& fixture,
                                                                                     const torch::Device& device) {
  auto deferred = std::make_shared<models::DeferredParameters>();
  models::LoadOptions load;
  load.device = device;
  load.dropout = 0.0;
  load.deferred = deferred.get();
  return {models::load_causal_lm(testing::fixture(fixture).string(), load), deferred};
}

// Next-token loss of a fixed batch, `steps` optimizer steps; the losses, read after the loop.
// `deferred`: the model was loaded deferred (its engine materialises it on deferred->device).
std::vector<double> train_losses(models::CausalLM model, int stage, const std::string& precision, int steps,
                                 std::shared_ptr<const models::DeferredParameters> deferred = nullptr) {
  const torch::Device device = deferred ? deferred->device : model->parameters().front().device();
  engine::TrainingEngineOptions options = engine_options(stage, precision);
  options.deferred = std::move(deferred);
  engine::TrainingEngine engine(model.ptr(), std::move(options));
  model->train();
  torch::Generator generator = at::detail::createCPUGenerator(5);
  const int64_t vocab = model->config().vocab_size;
  torch::Tensor batch = torch::randint(3, vocab, {2, 8}, generator, torch::kInt64).to(device);  // [2, 8]
  std::vector<torch::Tensor> losses;  // [] each, on the device: no read inside the loop
  for (int i = 0; i < steps; ++i) {
    torch::Tensor logits = model->forward(batch);  // [2, 8, V]
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.narrow(1, 0, 7).reshape({-1, vocab}).to(torch::kFloat32), batch.narrow(1, 1, 7).reshape({-1}));
    engine.backward(loss);
    engine.step();
    losses.push_back(loss.detach());
  }
  torch::Tensor host = torch::stack(losses).to(torch::kCPU, torch::kFloat64);  // [steps]
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + steps);
}

TEST_P(OnDevice, Fp32TrainingStepsMatchTheCpu) {
  for (int stage : {0, 3}) {
    const std::vector<double> cpu = train_losses(load_on("opt-preln", torch::kCPU), stage, "fp32", 3);
    const std::vector<double> here = train_losses(load_on("opt-preln", device()), stage, "fp32", 3);
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_NEAR(here[i], cpu[i], std::max(2e-5 * std::abs(cpu[i]), 1e-6)) << "stage " << stage << " step " << i;
    }
    EXPECT_LT(cpu.back(), cpu.front());
  }
}

TEST_P(OnDevice, LowPrecisionTrainingStaysFiniteAndLearns) {
  std::vector<std::string> precisions = {"bf16"};
  if (device().is_cuda()) precisions.push_back("fp16");  // fp16 matmuls are a GPU's business
  for (const std::string& precision : precisions) {
    const torch::ScalarType dtype = precision == "bf16" ? torch::kBFloat16 : torch::kFloat16;
    const std::vector<double> losses = train_losses(load_on("opt-preln", device(), dtype), 0, precision, 8);
    for (double loss : losses) ASSERT_TRUE(std::isfinite(loss)) << precision;
    EXPECT_LT(losses.back(), losses.front()) << precision;
  }
}

// A fixture's prompts and transformers' greedy continuation of them (tools/make_fixtures.py).
struct GreedyCase {
  torch::Tensor ids;       // [B, T] on the device
  torch::Tensor mask;      // [B, T] on the device
  torch::Tensor expected;  // [B, T + N] on the CPU
  core::GenerationConfig config;  // greedy, N new tokens
};

GreedyCase greedy_case(const std::string& fixture, const torch::Device& device) {
  const auto expected_dir = testing::fixture(fixture) / "expected";
  GreedyCase c;
  c.ids = io::load_npy(expected_dir / "input_ids.npy").to(device);
  c.mask = io::load_npy(expected_dir / "attention_mask.npy").to(device);
  c.expected = io::load_npy(expected_dir / "greedy.npy");
  c.config.max_new_tokens = c.expected.size(1) - c.ids.size(1);
  return c;
}

TEST_P(OnDevice, GreedyGenerationGivesTransformersIds) {
  for (const std::string fixture : {"opt-preln", "llama-gqa"}) {
    const GreedyCase c = greedy_case(fixture, device());
    auto model = load_on(fixture, device());
    inference::InferenceEngineOptions options;
    options.max_out_tokens = c.expected.size(1);
    options.log_stats = false;
    inference::InferenceEngine engine(model, options);
    torch::Tensor got = engine.generate(c.ids, c.mask, c.config).sequences.cpu();  // [B, T + N]
    EXPECT_TRUE(torch::equal(got, c.expected)) << fixture << "\n" << got << "\n" << c.expected;
  }
}

// The continuous engine on the device: decode steps attend through the block tables in place (on
// CUDA decode_attention's kernel in paged mode, on the CPU its CPU kernel) and give transformers'
// ids, as the gathering reference path does, as the fixed-shape layout of its CUDA graphs does run
// eagerly, and (CUDA) as its graphs do, every decode step replayed.
TEST_P(OnDevice, ContinuousEngineGivesTransformersIds) {
  for (const std::string fixture : {"opt-preln", "llama-gqa"}) {
    const GreedyCase c = greedy_case(fixture, device());
    auto model = load_on(fixture, device());
    for (const std::string mode : {"in place", "gathered", "fixed frame", "cuda graphs"}) {
      inference::ContinuousEngineOptions options;
      options.block_size = 4;
      options.num_blocks = 64;
      options.gather_for_attention = mode == "gathered";
      options.fixed_frame_decode = mode == "fixed frame";
      options.enable_cuda_graph = mode == "cuda graphs";
      inference::ContinuousEngine engine(model, options);
      torch::Tensor got = engine.generate(c.ids, c.mask, c.config).sequences.cpu();  // [B, T + N]
      EXPECT_TRUE(torch::equal(got, c.expected)) << fixture << " " << mode << "\n" << got << "\n" << c.expected;
      const bool replayed = mode == "cuda graphs" && device().is_cuda();
      EXPECT_EQ(engine.stats().cuda_graph_replays, replayed ? engine.stats().decode_forwards : 0)
          << fixture << " " << mode;
    }
  }
}

TEST_P(OnDevice, HybridEngineGeneratesWhatItsWeightsGenerate) {
  auto actor = load_on("opt-preln", device());
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2},
                       {"gradient_accumulation_steps", 1},
                       {"train_batch_size", 2},
                       {"steps_per_print", 0},
                       {"zero_optimization", {{"stage", 0}}},
                       {"hybrid_engine", {{"enabled", true}, {"max_out_tokens", 24}}}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "on-device hybrid test");
  options.training.optimizer.lr = 1e-2;
  hybrid::HybridEngine engine(actor, options);
  torch::Generator generator = at::detail::createCPUGenerator(11);
  const int64_t vocab = actor->config().vocab_size;
  torch::Tensor prompt = torch::randint(3, vocab, {2, 6}, generator, torch::kInt64).to(device());  // [2, 6]
  torch::Tensor mask = torch::ones({2, 6}, torch::dtype(torch::kInt64).device(device()));          // [2, 6]
  mask[1].narrow(0, 0, 2).zero_();  // row 1 left padded
  core::GenerationConfig config;
  config.max_new_tokens = 6;

  engine.train();
  torch::Tensor logits = engine.actor()->forward(prompt);  // [2, 6, V]
  engine.backward(logits.to(torch::kFloat32).logsumexp(-1).mean());
  engine.step();
  engine.eval();
  torch::Tensor hybrid_ids = engine.generate(prompt, mask, config).sequences.cpu();  // [2, 12]
  engine.train();

  auto copy = load_on("opt-preln", device());
  {
    torch::NoGradGuard no_grad;
    auto trained = engine.actor()->named_parameters();
    for (auto& item : copy->named_parameters()) item.value().copy_(trained[item.key()]);
  }
  copy->eval();
  torch::Tensor plain_ids = inference::generate(copy, prompt, mask, config).sequences.cpu();  // [2, 12]
  EXPECT_TRUE(torch::equal(hybrid_ids, plain_ids)) << hybrid_ids << "\n" << plain_ids;
}

// LoRA fused for generation and restored at train(), with the exact weights kept on the device or
// on the host: either way the training weights come back bit for bit.
TEST_P(OnDevice, LoraFuseBackupOnDeviceOrHostRestoresBitForBit) {
  for (const hybrid::LoraFuseBackup backup :
       {hybrid::LoraFuseBackup::kDevice, hybrid::LoraFuseBackup::kHost, hybrid::LoraFuseBackup::kAuto}) {
    auto actor = load_on("opt-preln", device());
    torch::manual_seed(3);
    nn::convert_linear_layers_to_lora(*actor, {4, 1.0, 0.0, "layers."});
    {
      torch::NoGradGuard no_grad;  // nonzero adapters, so that fusing changes the weights
      for (auto& item : actor->named_parameters()) {
        if (item.key().find("lora_left_weight") != std::string::npos) item.value().normal_(0.0, 0.05);
      }
    }
    nn::only_optimize_lora_parameters(*actor);
    std::map<std::string, torch::Tensor> before;
    for (const auto& item : actor->named_parameters()) before[item.key()] = item.value().detach().clone();
    nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2}, {"gradient_accumulation_steps", 1},
                         {"train_batch_size", 2}, {"steps_per_print", 0},
                         {"hybrid_engine", {{"enabled", true}, {"max_out_tokens", 16}}}};
    hybrid::HybridEngineOptions options;
    options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "lora backup test");
    options.lora_fuse_backup = backup;
    hybrid::HybridEngine engine(actor, options);
    torch::Tensor prompt = torch::full({1, 4}, 5, torch::dtype(torch::kInt64).device(device()));  // [1, 4]
    core::GenerationConfig config;
    config.max_new_tokens = 2;
    engine.eval();
    engine.generate(prompt, torch::ones_like(prompt), config);
    engine.train();
    for (const auto& item : actor->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), before.at(item.key())))
          << hybrid::lora_fuse_backup_name(backup) << " " << item.key();
    }
  }
}

// Loading builds dschat's layers straight on the device in the dtype (ParameterPlacementScope);
// every parameter ends there, and the scope is undone (and nests) on this thread.
TEST_P(OnDevice, ModelsLoadOntoTheDeviceInTheirDtype) {
  for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const std::string fixture : {"opt-preln", "llama-gqa"}) {
      auto model = load_on(fixture, device(), dtype);
      for (const auto& item : model->named_parameters()) {
        EXPECT_EQ(item.value().device(), device()) << fixture << " " << item.key();
        EXPECT_EQ(item.value().scalar_type(), dtype) << fixture << " " << item.key();
      }
    }
  }
  {
    nn::ParameterPlacementScope outer(device(), torch::kBFloat16);
    {
      nn::ParameterPlacementScope inner(torch::kCPU, torch::kFloat16);
      EXPECT_EQ(nn::Linear(nn::LinearOptions(4, 3))->weight.scalar_type(), torch::kFloat16);
    }
    nn::Linear linear(nn::LinearOptions(4, 3));
    EXPECT_EQ(linear->weight.device(), device());
    EXPECT_EQ(linear->bias.scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(nn::Linear(nn::LinearOptions(4, 3))->weight.device(), torch::Device(torch::kCPU));
  EXPECT_EQ(nn::Linear(nn::LinearOptions(4, 3))->weight.scalar_type(), torch::kFloat32);
}

// DeepSpeed's zero.Init in one process: a deferred load holds no parameter memory (every
// parameter on the meta device) and trains exactly as an eager load, at stage 3 (partitioned
// groups copied piece by piece from the checkpoint) and at stage 0 (materialised whole), LoRA
// adapters included (a deferred model's are made on the host; here they get the eager model's
// values, since the two initialise them on different generators on a GPU).
TEST_P(OnDevice, PartitionedLoadTrainsLikeAnEagerLoad) {
  for (int stage : {0, 3}) {
    for (bool lora : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (lora ? " with LoRA" : ""));
      models::CausalLM eager = load_on("opt-preln", device());
      auto [partitioned, deferred] = load_deferred("opt-preln", device());
      for (const auto& item : partitioned->named_parameters()) {
        EXPECT_TRUE(item.value().is_meta()) << item.key();
        EXPECT_EQ(deferred->values.at(item.key()).sizes(), item.value().sizes()) << item.key();
      }
      if (lora) {
        nn::LoraOptions options;
        options.lora_dim = 4;
        options.module_name_filter = "decoder.layers.";
        nn::convert_linear_layers_to_lora(*eager, options);
        nn::convert_linear_layers_to_lora(*partitioned, options);
        torch::NoGradGuard no_grad;
        const auto eager_params = eager->named_parameters();
        for (auto& item : partitioned->named_parameters()) {
          if (item.key().find("lora") == std::string::npos) continue;
          EXPECT_TRUE(item.value().device().is_cpu()) << item.key();
          item.value().copy_(eager_params[item.key()]);
        }
      }
      const std::vector<double> expected = train_losses(eager, stage, "fp32", 3);
      const std::vector<double> got = train_losses(partitioned, stage, "fp32", 3, deferred);
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_NEAR(got[i], expected[i], 1e-6 + 1e-6 * std::abs(expected[i])) << "step " << i;
      }
      for (const auto& item : partitioned->named_parameters()) {
        EXPECT_EQ(item.value().device(), device()) << item.key();
      }
    }
  }
}

// A frozen model partitioned by a ZeRO-3 inference engine (DS-Chat's reference and reward models
// at stage 3) gives the replicated model's logits, with its partitions on the device or, with
// offload_param, in host memory; after release_gathered_parameters only the small resident
// parameters are materialised on the device.
TEST_P(OnDevice, ZeroInferenceEngineScoresLikeTheReplicatedModel) {
  models::CausalLM eager = load_on("opt-preln", device());
  torch::Generator generator = at::detail::createCPUGenerator(11);
  const torch::Tensor ids =
      torch::randint(3, eager->config().vocab_size, {2, 9}, generator, torch::kInt64).to(device());  // [2, 9]
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = eager->forward(ids);  // [2, 9, V]
  int64_t total_bytes = 0;
  for (const auto& p : eager->parameters()) total_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload_param" : "on the device");
    auto [model, deferred] = load_deferred("opt-preln", device());
    for (auto& p : model->parameters()) p.set_requires_grad(false);
    engine::ZeroInferenceOptions options;
    options.zero.stage = 3;
    options.zero.stage3_param_persistence_threshold = 16;
    if (offload) options.zero.offload_param.device = "cpu";
    options.deferred = deferred;
    engine::ZeroInferenceEngine engine(model.ptr(), options);
    for (int round = 0; round < 2; ++round) {
      const torch::Tensor got = model->forward(ids);  // [2, 9, V]
      engine.release_gathered_parameters();
      EXPECT_LE(testing::max_abs_diff(got, expected), 1e-5);
    }
    int64_t on_device = 0;
    for (const auto& p : model->parameters()) on_device += p.numel() * static_cast<int64_t>(p.element_size());
    EXPECT_LT(on_device, total_bytes / 50) << "only the resident small parameters stay materialised";
    // The partitions (a world of one owns everything) plus the resident ones.
    EXPECT_GE(engine.memory_footprint().parameter_bytes, total_bytes);
  }
  auto [trainable, deferred] = load_deferred("opt-preln", device());
  engine::ZeroInferenceOptions options;
  options.zero.stage = 3;
  EXPECT_THROW_WITH(engine::ZeroInferenceEngine(trainable.ptr(), options), core::InvalidArgument,
                    "requires grad; an inference engine holds a frozen model");
  options.zero.stage = 2;
  EXPECT_THROW_WITH(engine::ZeroInferenceEngine(trainable.ptr(), options), core::ConfigError,
                    "zero_optimization.stage must be 3, got 2");
}

INSTANTIATE_TEST_SUITE_P(Devices, OnDevice, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace dschat
