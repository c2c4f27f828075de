// TrainingEngine against a hand-written loop over LibTorch's own torch::optim::AdamW (accumulation,
// clipping by global norm, the LR schedule), and its fp16/bf16 and non-finite paths.
#include <gtest/gtest.h>

#include <fstream>

#include "dschat/engine/training_engine.h"
#include "dschat/nn/checkpoint.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

std::shared_ptr<torch::nn::SequentialImpl> tiny_model(torch::Dtype dtype = torch::kFloat32) {
  torch::manual_seed(3);
  auto model = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                                           torch::nn::Linear(16, 4));
  model->to(dtype);
  return model;
}

engine::TrainingEngineOptions options_for(const json& ds, int64_t warmup, int64_t total) {
  engine::TrainingEngineOptions options;
  options.config = engine::DeepSpeedConfig::parse(ds, 1, "test");
  options.optimizer.lr = 1e-2;
  options.optimizer.weight_decay = 0.1;
  options.optimizer.beta2 = 0.95;
  engine::LrScheduleOptions schedule;
  schedule.type = "cosine";
  schedule.num_warmup_steps = warmup;
  schedule.num_training_steps = total;
  options.lr_schedule = schedule;
  return options;
}

struct Batch {
  torch::Tensor x;  // [B, 8]
  torch::Tensor y;  // [B, 4]
};

std::vector<Batch> batches(int count, int64_t rows) {
  torch::manual_seed(11);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i) out.push_back({torch::randn({rows, 8}), torch::randn({rows, 4})});
  return out;
}

torch::Tensor mse(torch::nn::Sequential& model, const Batch& b) {
  return (model->forward(b.x.to(model->parameters()[0].dtype())).to(torch::kFloat32) - b.y).pow(2).mean();
}

TEST(TrainingEngine, MatchesAHandWrittenLoopOverTorchAdamW) {
  const json ds = {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_clipping", 0.05}};
  auto data = batches(20, 4);
  auto ours = tiny_model();
  torch::nn::Sequential ours_seq(ours);
  engine::TrainingEngine engine(ours, options_for(ds, 2, 10));
  std::vector<double> norms;
  for (const auto& b : data) {
    engine.backward(mse(ours_seq, b));
    if (engine.step()) norms.push_back(engine.last_grad_norm());
  }
  EXPECT_EQ(engine.global_steps(), 10);
  EXPECT_EQ(engine.micro_steps(), 20);

  // Reference: DeepSpeed-Chat's groups by hand (weights decay, biases do not), loss / 2 per
  // micro-batch, torch::nn::utils::clip_grad_norm_, lr = base * multiplier(step).
  auto ref = tiny_model();
  torch::nn::Sequential ref_seq(ref);
  auto params = ref->named_parameters();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto adamw = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  groups.emplace_back(std::vector<torch::Tensor>{params["0.weight"], params["2.weight"]}, adamw(0.1));
  groups.emplace_back(std::vector<torch::Tensor>{params["0.bias"], params["2.bias"]}, adamw(0.0));
  torch::optim::AdamW optimizer(groups, torch::optim::AdamWOptions(1e-2));
  engine::LrScheduleOptions schedule{"cosine", 2, 10};
  auto multiplier = engine::LrSchedule::create(schedule);
  for (int step = 0; step < 10; ++step) {
    optimizer.zero_grad();
    for (int micro = 0; micro < 2; ++micro) (mse(ref_seq, data[step * 2 + micro]) / 2).backward();
    double norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.05);
    EXPECT_NEAR(norm, norms[step], 1e-5 * std::max(1.0, norm)) << "step " << step;
    for (auto& group : optimizer.param_groups()) {
      group.options().set_lr(1e-2 * multiplier.multiplier(step));
    }
    optimizer.step();
  }
  for (const auto& item : ours->named_parameters()) {
    EXPECT_LT(testing::max_abs_diff(item.value(), ref->named_parameters()[item.key()]), 2e-6) << item.key();
  }
  EXPECT_NEAR(engine.learning_rates().front(), 1e-2 * multiplier.multiplier(10), 1e-15);
}

TEST(TrainingEngine, AccumulatingTwoHalvesEqualsOneWholeBatch) {
  auto data = batches(6, 4);
  auto accumulated = tiny_model();
  torch::nn::Sequential acc_seq(accumulated);
  engine::TrainingEngine acc(accumulated, options_for({{"train_batch_size", 8}, {"gradient_accumulation_steps", 2}}, 0, 3));
  auto whole = tiny_model();
  torch::nn::Sequential whole_seq(whole);
  engine::TrainingEngine one(whole, options_for({{"train_batch_size", 8}}, 0, 3));
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      acc.backward(mse(acc_seq, data[step * 2 + micro]));
      EXPECT_EQ(acc.step(), micro == 1);
    }
    Batch both{torch::cat({data[step * 2].x, data[step * 2 + 1].x}), torch::cat({data[step * 2].y, data[step * 2 + 1].y})};
    one.backward(mse(whole_seq, both));
    EXPECT_TRUE(one.step());
  }
  for (const auto& item : accumulated->named_parameters()) {
    EXPECT_LT(testing::max_abs_diff(item.value(), whole->named_parameters()[item.key()]), 1e-6) << item.key();
  }
}

TEST(TrainingEngine, Fp16OverflowSkipsTheStepAndTheSchedule) {
  auto model = tiny_model();
  torch::nn::Sequential seq(model);
  json ds = {{"train_batch_size", 4}, {"fp16", {{"enabled", true}, {"loss_scale_window", 100}}}};
  engine::TrainingEngine engine(model, options_for(ds, 0, 10));
  EXPECT_EQ(engine.loss_scale(), 65536.0);
  auto before = model->parameters()[0].clone();
  const double lr = engine.learning_rates().front();
  auto data = batches(3, 4);
  for (int i = 0; i < 2; ++i) {  // hysteresis 2: the first overflow keeps the scale, the second halves it
    engine.backward(mse(seq, data[i]) * std::numeric_limits<float>::infinity());
    EXPECT_FALSE(engine.step());
  }
  EXPECT_EQ(engine.skipped_steps(), 2);
  EXPECT_EQ(engine.global_steps(), 2);
  EXPECT_EQ(engine.loss_scale(), 32768.0);
  EXPECT_EQ(engine.last_grad_norm(), -1.0);
  EXPECT_TRUE(torch::equal(model->parameters()[0], before));
  EXPECT_EQ(engine.learning_rates().front(), lr);
  engine.backward(mse(seq, data[2]));
  EXPECT_TRUE(engine.step());
  EXPECT_FALSE(torch::equal(model->parameters()[0], before));
  EXPECT_LT(engine.learning_rates().front(), lr);
}

TEST(TrainingEngine, CheckOverflowAndSkipNextStepAlignTwoEngines) {
  // DeepSpeed-Chat's align_overflow on a pair: the actor's fp16 gradients overflow, the critic's do
  // not; the critic is told to skip, so neither steps. The critic's loss scale and LR are untouched.
  json ds = {{"train_batch_size", 4}, {"fp16", {{"enabled", true}, {"loss_scale_window", 100}}}};
  auto actor = tiny_model(), critic = tiny_model();
  torch::nn::Sequential actor_seq(actor), critic_seq(critic);
  engine::TrainingEngine actor_engine(actor, options_for(ds, 0, 10));
  engine::TrainingEngine critic_engine(critic, options_for(ds, 0, 10));
  auto data = batches(2, 4);
  auto critic_before = critic->parameters()[0].clone();
  const double critic_lr = critic_engine.learning_rates().front();
  actor_engine.backward(mse(actor_seq, data[0]) * std::numeric_limits<float>::infinity());
  critic_engine.backward(mse(critic_seq, data[0]));
  EXPECT_TRUE(actor_engine.check_overflow());
  EXPECT_FALSE(critic_engine.check_overflow());
  EXPECT_FALSE(critic_engine.check_overflow());  // idempotent: the gradients are reduced once
  critic_engine.skip_next_step();
  EXPECT_FALSE(critic_engine.step());
  EXPECT_FALSE(actor_engine.step());
  EXPECT_TRUE(torch::equal(critic->parameters()[0], critic_before));
  EXPECT_EQ(critic_engine.skipped_steps(), 1);
  EXPECT_EQ(critic_engine.loss_scale(), 65536.0);
  EXPECT_EQ(critic_engine.learning_rates().front(), critic_lr);
  EXPECT_FALSE(critic->parameters()[0].grad().defined() && critic->parameters()[0].grad().abs().sum().item<double>() > 0)
      << "the skipped window's gradients must not leak into the next one";
  // The skip applies once: the next window steps, with the same result as an engine that never skipped.
  auto fresh = tiny_model();
  torch::nn::Sequential fresh_seq(fresh);
  engine::TrainingEngine fresh_engine(fresh, options_for(ds, 0, 10));
  critic_engine.backward(mse(critic_seq, data[1]));
  EXPECT_FALSE(critic_engine.check_overflow());
  EXPECT_TRUE(critic_engine.step());
  fresh_engine.backward(mse(fresh_seq, data[1]));
  EXPECT_TRUE(fresh_engine.step());
  EXPECT_TRUE(torch::equal(critic->parameters()[0], fresh->parameters()[0]));
}

TEST(TrainingEngine, Bf16ModelsTrainThroughFp32Masters) {
  auto model = tiny_model(torch::kBFloat16);
  torch::nn::Sequential seq(model);
  engine::TrainingEngine engine(model, options_for({{"train_batch_size", 4}, {"bf16", {{"enabled", true}}}}, 0, 5));
  auto before = model->parameters()[0].clone();
  auto data = batches(5, 4);
  for (const auto& b : data) {
    engine.backward(mse(seq, b));
    EXPECT_TRUE(engine.step());
  }
  EXPECT_FALSE(torch::equal(model->parameters()[0], before));
  EXPECT_EQ(model->parameters()[0].scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(model->parameters()[0].grad().defined());
  // fp32 masters plus two fp32 moments for every parameter.
  int64_t elements = 0;
  for (const auto& p : model->parameters()) elements += p.numel();
  EXPECT_GE(engine.optimizer_state_bytes(), 2 * 4 * elements);
}

TEST(TrainingEngine, NonFiniteLossSkipsOrStopsAsConfigured) {
  auto data = batches(2, 4);
  {
    auto model = tiny_model();
    torch::nn::Sequential seq(model);
    engine::TrainingEngine engine(model, options_for({{"train_batch_size", 4}}, 0, 5));
    engine.backward(mse(seq, data[0]) * std::numeric_limits<float>::quiet_NaN());
    EXPECT_FALSE(engine.step());
    EXPECT_EQ(engine.skipped_steps(), 1);
  }
  auto model = tiny_model();
  torch::nn::Sequential seq(model);
  engine::TrainingEngine engine(model, options_for({{"train_batch_size", 4}, {"on_nonfinite_loss", "error"}}, 0, 5));
  engine.backward(mse(seq, data[0]) * std::numeric_limits<float>::infinity());
  EXPECT_THROW_WITH(engine.step(), core::Error, "non-finite gradients at global step 0");
}

TEST(TrainingEngine, UnimplementedSettingsAreRefused) {
  // Stage 3 gathers parameters layer by layer, so it needs a model built on a dschat backbone.
  EXPECT_THROW_WITH(engine::TrainingEngine(tiny_model(), options_for({{"train_batch_size", 4},
                                                                      {"zero_optimization", {{"stage", 3}}}}, 0, 5)),
                    core::Unsupported, "needs a model built on a dschat decoder backbone");
  auto frozen = tiny_model();
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  EXPECT_THROW_WITH(engine::TrainingEngine(frozen, options_for({{"train_batch_size", 4}}, 0, 5)),
                    core::InvalidArgument, "no trainable parameters");
  // A config parsed for 2 ranks cannot drive a world of one.
  engine::TrainingEngineOptions two_ranks = options_for({{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}}, 0, 5);
  two_ranks.config = engine::DeepSpeedConfig::parse({{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}}, 2, "test");
  EXPECT_THROW_WITH(engine::TrainingEngine(tiny_model(), two_ranks), core::ConfigError, "world size 1");
}

TEST(TrainingEngine, StagesOneAndTwoInOneProcessMatchStageZero) {
  // In a world of one, partitioning and overlap_comm change nothing but the code path: same values
  // bit for bit. Accumulation over 2 micro-steps, so stages 0-1 overlap only the boundary's backward.
  auto data = batches(6, 4);
  std::vector<torch::Tensor> finals;
  for (bool overlap : {false, true}) {
    for (int stage : {0, 1, 2}) {
      auto model = tiny_model();
      torch::nn::Sequential seq(model);
      json ds = {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_clipping", 0.5},
                 {"zero_optimization",
                  {{"stage", stage},
                   {"reduce_bucket_size", 50},
                   {"allgather_bucket_size", 30},
                   {"overlap_comm", overlap}}}};
      engine::TrainingEngine engine(model, options_for(ds, 1, 3));
      for (const auto& b : data) {
        engine.backward(mse(seq, b));
        engine.step();
      }
      finals.push_back(torch::cat({model->parameters()[0].flatten(), model->parameters()[3].flatten()}));
    }
  }
  for (size_t i = 1; i < finals.size(); ++i) EXPECT_TRUE(torch::equal(finals[0], finals[i])) << "run " << i;
}

// One Linear applied in two activation-checkpointed segments: backward recomputes each segment
// separately, so the weight's gradient arrives twice in one backward.
struct SharedAcrossSegments : torch::nn::Module {
  SharedAcrossSegments() : linear(register_module("linear", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // x: [B, 4]
    auto segment = [this](const torch::Tensor& h) { return linear->forward(h).tanh(); };
    return nn::checkpoint(segment, nn::checkpoint(segment, x)).pow(2).mean();
  }
  torch::nn::Linear linear;
};

TEST(TrainingEngine, OverlapCommRefusesAGradientArrivingAfterItsBucketWasReduced) {
  const json ds = {{"train_batch_size", 2}, {"train_micro_batch_size_per_gpu", 2},
                   {"zero_optimization", {{"stage", 2}, {"overlap_comm", true}}}};
  auto model = std::make_shared<SharedAcrossSegments>();
  engine::TrainingEngine engine(model, options_for(ds, 0, 1));
  // [2, 4]; requiring grad makes both segments take part in backward.
  const torch::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  EXPECT_THROW_WITH(engine.backward(model->forward(x)), core::Unsupported, "parameter 'linear.");
  // Without overlap_comm the two contributions are simply added.
  auto plain = std::make_shared<SharedAcrossSegments>();
  json no_overlap = ds;
  no_overlap["zero_optimization"]["overlap_comm"] = false;
  engine::TrainingEngine plain_engine(plain, options_for(no_overlap, 0, 1));
  EXPECT_NO_THROW(plain_engine.backward(plain->forward(x)));
}

}  // namespace
}  // namespace dschat

namespace dschat {
namespace {

// A model with dropout, so an exact resume also needs the RNG state back.
std::shared_ptr<torch::nn::SequentialImpl> dropout_model(torch::Dtype dtype) {
  torch::manual_seed(5);
  auto model = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(8, 16), torch::nn::Dropout(0.3),
                                                           torch::nn::Tanh(), torch::nn::Linear(16, 4));
  model->to(dtype);
  return model;
}

std::vector<float> run_steps(engine::TrainingEngine& engine, torch::nn::Sequential& seq, const std::vector<Batch>& data,
                             size_t begin, size_t end) {
  std::vector<float> losses;
  for (size_t i = begin; i < end; ++i) {
    auto loss = mse(seq, data[i]);
    losses.push_back(loss.item<float>());
    engine.backward(loss);
    engine.step();
  }
  return losses;
}

class TrainingEngineResume : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainingEngineResume, InterruptedRunContinuesBitForBit) {
  const bool bf16 = std::string(GetParam()) == "bf16";
  const torch::Dtype dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
  json ds = {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_clipping", 1.0}};
  if (bf16) ds["bf16"] = {{"enabled", true}};
  auto data = batches(16, 4);
  testing::TempDir tmp;

  torch::manual_seed(100);
  auto straight = dropout_model(dtype);
  torch::nn::Sequential straight_seq(straight);
  engine::TrainingEngine straight_engine(straight, options_for(ds, 2, 8));
  torch::manual_seed(100);
  std::vector<float> expected = run_steps(straight_engine, straight_seq, data, 0, 16);

  torch::manual_seed(100);
  auto first = dropout_model(dtype);
  torch::nn::Sequential first_seq(first);
  engine::TrainingEngine first_engine(first, options_for(ds, 2, 8));
  torch::manual_seed(100);
  std::vector<float> losses = run_steps(first_engine, first_seq, data, 0, 6);
  first_engine.save_checkpoint(tmp.path(), "", {{"next_batch", 6}});
  EXPECT_EQ(std::ifstream(tmp / "latest").rdbuf() != nullptr, true);

  torch::manual_seed(999);  // a different init and RNG stream: everything must come from the checkpoint
  auto second = dropout_model(dtype);
  torch::nn::Sequential second_seq(second);
  engine::TrainingEngine second_engine(second, options_for(ds, 2, 8));
  json client = second_engine.load_checkpoint(tmp.path());
  EXPECT_EQ(client["next_batch"], 6);
  EXPECT_EQ(second_engine.global_steps(), 3);
  std::vector<float> rest = run_steps(second_engine, second_seq, data, 6, 16);
  losses.insert(losses.end(), rest.begin(), rest.end());
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_EQ(losses[i], expected[i]) << "micro-step " << i;
  for (const auto& item : second->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), straight->named_parameters()[item.key()])) << item.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, TrainingEngineResume, ::testing::Values("fp32", "bf16"));

TEST(TrainingEngineCheckpoint, CorruptOrPartialCheckpointsAreRefusedAndThePreviousOneSurvives) {
  json ds = {{"train_batch_size", 4}};
  auto data = batches(4, 4);
  testing::TempDir tmp;
  auto model = tiny_model();
  torch::nn::Sequential seq(model);
  engine::TrainingEngine engine(model, options_for(ds, 0, 8));
  run_steps(engine, seq, data, 0, 2);
  engine.save_checkpoint(tmp.path());
  run_steps(engine, seq, data, 2, 3);
  // A save that dies half way (simulated: a staging dir left behind, latest untouched).
  std::filesystem::create_directories(tmp / ".tmp-global_step3");
  std::ofstream(tmp / ".tmp-global_step3" / "rank0.safetensors") << "partial";
  EXPECT_EQ(engine.load_checkpoint(tmp.path()), json::object());
  EXPECT_EQ(engine.global_steps(), 2);

  // Flip one byte of the saved state: the checksum catches it before anything is restored.
  auto file = tmp / "global_step2" / "rank0.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  run_steps(engine, seq, data, 3, 4);
  auto before = model->parameters()[0].clone();
  EXPECT_THROW_WITH(engine.load_checkpoint(tmp.path()), core::FormatError, "checksum mismatch");
  EXPECT_TRUE(torch::equal(model->parameters()[0], before));
  EXPECT_EQ(engine.global_steps(), 3);
  EXPECT_THROW_WITH(engine.load_checkpoint(tmp / "nowhere"), core::NotFound, "latest");

  // A checkpoint of a different model shape is refused by name.
  testing::TempDir other;
  auto wide = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                                                          torch::nn::Linear(32, 4));
  torch::nn::Sequential wide_seq(wide);
  engine::TrainingEngine wide_engine(wide, options_for(ds, 0, 8));
  run_steps(wide_engine, wide_seq, data, 0, 1);
  wide_engine.save_checkpoint(other.path());
  EXPECT_THROW_WITH(engine.load_checkpoint(other.path()), core::FormatError, "tensor '0.weight' has shape [32, 8], the model's is [16, 8]");
}

}  // namespace
}  // namespace dschat
