// The step's gradient norm and clipping, computed on the gradients' device with one host read per
// step: the clip coefficient bit for bit the host double formula it replaced; the CPU norm (the
// fp32 loop of engine/grad_norm_cpu.h) within 1e-13 relative of a float64 oracle, the same bits at
// 1 and 2 threads and non-finite for an inf or NaN anywhere; and at every ZeRO stage the norm and
// the clipped gradients that a direct computation over a plain copy of the model gives. An fp16
// overflow still skips the step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "dschat/core/device.h"
#include "dschat/core/model_config.h"
#include "dschat/engine/training_engine.h"
#include "dschat/models/causal_lm.h"
#include "engine/grad_norm_cpu.h"
#include "engine/zero_optimizer.h"
#include "test_util.h"

#include <ATen/Parallel.h>

namespace dschat {
namespace {

using nlohmann::json;

// The formula the engine evaluated on the host before the factor moved to the device.
double host_factor(double norm_squared, double scale, double clip) {
  const double norm = std::sqrt(norm_squared) / scale;
  double factor = 1.0 / scale;
  if (clip > 0 && norm + 1e-6 > clip) factor *= clip / (norm + 1e-6);
  return factor;
}

// Random squared norms, and ones within rounding of the clip threshold, where the branch flips.
std::vector<double> norms_squared_around(double scale, double clip) {
  std::vector<double> norms_squared;
  for (int i = 0; i < 40; ++i) norms_squared.push_back(std::pow(10.0, torch::rand({}).item<double>() * 8 - 4));
  const double at_clip = (clip - 1e-6) * scale;
  for (double nudge : {-1e-12, 0.0, 1e-12}) norms_squared.push_back(std::pow(at_clip * (1 + nudge), 2));
  return norms_squared;
}

// `ops_bitwise`: whether the tensor-op path (the one a device norm takes) rounds as the host does.
void expect_factors_match_the_host_formula(torch::Device device, bool ops_bitwise) {
  torch::manual_seed(0);
  const torch::Tensor grads = torch::randn({1000}, device);  // [1000] fp32
  for (double scale : {1.0, 65536.0, 3.7}) {
    for (double clip : {0.0, 0.05, 1.0}) {
      for (double norm_squared : norms_squared_around(scale, clip)) {
        SCOPED_TRACE(::testing::Message() << "norm^2 " << norm_squared << " scale " << scale << " clip " << clip);
        const torch::Tensor squares =
            torch::full({1}, norm_squared, torch::dtype(torch::kFloat64).device(device));  // [1]
        const double expected = host_factor(norm_squared, scale, clip);
        const torch::Tensor factor = engine::unscale_and_clip_factor(squares, scale, clip);  // []
        ASSERT_EQ(factor.dim(), 0);
        ASSERT_EQ(factor.device(), core::indexed_device(device));
        ASSERT_EQ(factor.item<double>(), expected);
        // A 0-dim fp64 factor multiplies fp32 gradients exactly as the host double did.
        ASSERT_TRUE(torch::equal(grads.clone().mul_(factor), grads.clone().mul_(expected)));
        const torch::Tensor by_ops = engine::unscale_and_clip_factor_by_tensor_ops(squares, scale, clip);  // []
        if (ops_bitwise) {
          ASSERT_EQ(by_ops.item<double>(), expected);
        } else {  // CPU tensor sqrt: within an ulp or two of the rounded one
          ASSERT_NEAR(by_ops.item<double>(), expected, 1e-14 * expected);
        }
      }
    }
  }
}

TEST(GradNorm, UnscaleAndClipFactorIsTheHostFormulaBitForBit) {
  expect_factors_match_the_host_formula(torch::kCPU, /*ops_bitwise=*/false);
}

TEST(GradNormCuda, UnscaleAndClipFactorOnTheDeviceIsTheHostFormulaBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  expect_factors_match_the_host_formula(torch::kCUDA, true);
}

TEST(GradNorm, CpuSumOfSquaresIsExactToDoubleRoundingAtAnyThreadCountAndPropagatesNonFinite) {
  torch::manual_seed(3);
  // Over 19 blocks (a partial last one, a tail of 5 after the last 8 lanes); values over 8 decades.
  const int64_t count = 18 * engine::detail::kGradNormBlock + 12349;
  torch::Tensor values = torch::randn({count}) * torch::pow(10.0, torch::rand({count}) * 8 - 4);  // [count] fp32
  const double oracle = values.to(torch::kFloat64).pow(2).sum().item<double>();
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const double one = engine::detail::sum_of_squares(values.data_ptr<float>(), count);
  at::set_num_threads(2);
  const double two = engine::detail::sum_of_squares(values.data_ptr<float>(), count);
  at::set_num_threads(threads);
  EXPECT_EQ(one, two);  // bit for bit
  EXPECT_NEAR(one, oracle, 1e-13 * oracle);
  EXPECT_EQ(engine::detail::sum_of_squares(values.data_ptr<float>(), 0), 0.0);
  values[count - 1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(engine::detail::sum_of_squares(values.data_ptr<float>(), count)));
  values[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(engine::detail::sum_of_squares(values.data_ptr<float>(), count)));
}

TEST(GradNorm, ZeroOptimizerNormIsTheSumOfSquaresOfItsOwnedGradients) {
  // 1.2M weights: 19 blocks of the sum, and a partial last one.
  for (int stage : {0, 1, 2}) {
    torch::manual_seed(1);
    auto model = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(1200, 1000), torch::nn::Tanh(),
                                                             torch::nn::Linear(1000, 3));
    engine::ZeroContext context;
    context.stage = stage;
    engine::ZeroConfig zero;
    zero.stage = stage;
    engine::ZeroOptimizer optimizer(*model, context, zero, engine::OptimizerConfig{}, 5e-4);
    const torch::Tensor x = torch::randn({4, 1200});  // [4, 1200]
    optimizer.before_backward(true);
    model->forward(x).pow(2).mean().backward();
    optimizer.after_backward();
    optimizer.reduce_at_boundary();

    const torch::Tensor squares = optimizer.gradient_norm_squared();  // [1] fp64
    ASSERT_EQ(squares.scalar_type(), torch::kFloat64);
    EXPECT_TRUE(squares.device().is_cpu());
    double expected = 0.0;  // each group's sum of squares, in group order
    for (const auto& group : optimizer.groups()) {
      const torch::Tensor grads = group->owned_gradients();  // [owned] fp32
      expected += engine::detail::sum_of_squares(grads.data_ptr<float>(), grads.numel());
    }
    EXPECT_EQ(squares.item<double>(), expected) << "stage " << stage;
    double oracle = 0.0;  // float64 throughout
    for (const auto& group : optimizer.groups()) {
      oracle += group->owned_gradients().to(torch::kFloat64).pow(2).sum().item<double>();
    }
    EXPECT_NEAR(squares.item<double>(), oracle, 1e-13 * oracle) << "stage " << stage;
    EXPECT_GT(expected, 0.0);
  }
}

constexpr int64_t kTokens = 12;

core::ModelConfig tiny_opt_config() {
  core::ModelConfig config = core::load_model_config(testing::fixture("opt-preln").string());
  config.dropout = 0.0;
  return config;
}

torch::Tensor lm_loss(models::CausalLM& model, const torch::Tensor& ids) {  // ids [B, T]
  torch::Tensor logits = model->forward(ids).to(torch::kFloat32);          // [B, T, V]
  torch::Tensor shifted = logits.narrow(1, 0, kTokens - 1).reshape({-1, logits.size(2)});  // [B * (T-1), V]
  torch::Tensor targets = ids.narrow(1, 1, kTokens - 1).reshape({-1});                     // [B * (T-1)]
  return torch::nn::functional::cross_entropy(shifted, targets);
}

std::vector<torch::Tensor> token_batches(int count, int64_t vocab) {
  torch::Generator generator = at::detail::createCPUGenerator(42);
  std::vector<torch::Tensor> batches;
  for (int i = 0; i < count; ++i) batches.push_back(torch::randint(3, vocab, {2, kTokens}, generator, torch::kInt64));
  return batches;  // each [2, T]
}

struct Layout {
  int stage;
  bool offload;
  bool overlap_comm;
};

engine::TrainingEngineOptions engine_options(const Layout& layout, json extra) {
  json zero = {{"stage", layout.stage},
               {"overlap_comm", layout.overlap_comm},
               {"reduce_bucket_size", 3000},
               {"allgather_bucket_size", 5000},
               {"stage3_param_persistence_threshold", 64}};
  if (layout.offload) {
    zero["offload_optimizer"] = {{"device", "cpu"}};
    if (layout.stage == 3) zero["offload_param"] = {{"device", "cpu"}};
  }
  json ds = {{"train_batch_size", 4}, {"train_micro_batch_size_per_gpu", 2}, {"steps_per_print", 0},
             {"zero_optimization", zero}};
  ds.update(extra);
  engine::TrainingEngineOptions options;
  options.config = engine::DeepSpeedConfig::parse(ds, 1, "grad_norm_test");
  return options;
}

class GradNormAtEveryStage : public ::testing::TestWithParam<Layout> {};

TEST_P(GradNormAtEveryStage, NormAndClippedGradientsMatchADirectComputation) {
  // Adam's first step moves a parameter by lr * g / (|g| + eps): with eps = 1 (far above these
  // gradients) the move is close to lr * g, so it shows the clipped gradient the engine used.
  const Layout layout = GetParam();
  const double clip = 0.1, lr = 1.0, eps = 1.0;
  const core::ModelConfig config = tiny_opt_config();
  const auto batches = token_batches(2, config.vocab_size);
  torch::manual_seed(7);
  models::CausalLM model(config);
  torch::manual_seed(7);
  models::CausalLM reference(config);

  engine::TrainingEngineOptions options = engine_options(layout, {{"gradient_clipping", clip}});
  options.optimizer.lr = lr;
  options.optimizer.eps = eps;
  options.optimizer.weight_decay = 0.0;
  engine::TrainingEngine engine(model.ptr(), options);
  const std::map<std::string, torch::Tensor> before = engine.consolidated_parameters();
  for (size_t micro = 0; micro < batches.size(); ++micro) {
    engine.backward(lm_loss(model, batches[micro]));
    EXPECT_EQ(engine.step(), micro + 1 == batches.size());
  }
  const std::map<std::string, torch::Tensor> after = engine.consolidated_parameters();

  // The direct computation: accumulate loss / 2 twice, the global norm of every distinct tensor.
  for (const auto& ids : batches) (lm_loss(reference, ids) / 2).backward();
  std::map<std::string, torch::Tensor> grads;  // by name
  std::set<const c10::TensorImpl*> seen;
  double squares = 0.0;
  for (const auto& item : reference->named_parameters()) {
    grads[item.key()] = item.value().grad().to(torch::kFloat64);
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      squares += grads[item.key()].pow(2).sum().item<double>();
    }
  }
  const double norm = std::sqrt(squares);
  ASSERT_GT(norm, 10 * clip) << "the test needs clipping to act";
  EXPECT_NEAR(engine.last_grad_norm(), norm, 1e-6 * norm);
  const double coefficient = std::min(1.0, clip / (norm + 1e-6));

  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, value] : after) {
    ASSERT_TRUE(grads.count(name)) << name;
    const torch::Tensor clipped = grads[name] * coefficient;                   // [param shape] fp64
    const torch::Tensor expected_move = lr * clipped / (clipped.abs() + eps);  // [param shape]
    const torch::Tensor move = (before.at(name) - value).to(torch::kFloat64);  // [param shape]
    // Absolute floor: fp32 rounding of parameters near 1 (norm weights), and gradients that are
    // rounding noise (the key projection's bias).
    const torch::Tensor tolerance = 2e-7 + 1e-4 * expected_move.abs();  // [param shape]
    EXPECT_TRUE(((move - expected_move).abs() <= tolerance).all().item<bool>())
        << name << ": worst " << (move - expected_move).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, GradNormAtEveryStage,
                         ::testing::Values(Layout{0, false, false}, Layout{1, false, false}, Layout{2, false, false},
                                           Layout{3, false, false}, Layout{1, false, true}, Layout{2, false, true},
                                           Layout{1, true, false}, Layout{2, true, true}, Layout{3, true, false}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return "stage" + std::to_string(info.param.stage) + (info.param.offload ? "_offload" : "") +
                                  (info.param.overlap_comm ? "_overlap" : "");
                         });

TEST(GradNorm, Fp16OverflowSkipsTheStepAtEveryStage) {
  const core::ModelConfig config = tiny_opt_config();
  const auto batches = token_batches(2, config.vocab_size);
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    torch::manual_seed(7);
    models::CausalLM model(config);
    model->to(torch::kHalf);
    engine::TrainingEngineOptions options = engine_options(
        {stage, false, false},
        {{"train_batch_size", 2}, {"gradient_accumulation_steps", 1}, {"gradient_clipping", 1.0},
         {"fp16", {{"enabled", true}, {"loss_scale_window", 100}, {"hysteresis", 1}}}});
    engine::TrainingEngine engine(model.ptr(), options);
    EXPECT_EQ(engine.loss_scale(), 65536.0);
    const std::map<std::string, torch::Tensor> before = engine.consolidated_parameters();

    engine.backward(lm_loss(model, batches[0]) * std::numeric_limits<float>::infinity());
    EXPECT_FALSE(engine.step());
    EXPECT_EQ(engine.skipped_steps(), 1);
    EXPECT_EQ(engine.last_grad_norm(), -1.0);
    EXPECT_EQ(engine.loss_scale(), 32768.0);  // hysteresis 1: the first overflow halves it
    for (const auto& [name, value] : engine.consolidated_parameters()) {
      EXPECT_TRUE(torch::equal(value, before.at(name))) << name;
    }

    engine.backward(lm_loss(model, batches[1]));
    EXPECT_TRUE(engine.step());
    EXPECT_EQ(engine.skipped_steps(), 1);
    EXPECT_TRUE(std::isfinite(engine.last_grad_norm()));
    EXPECT_GT(engine.last_grad_norm(), 0.0);
    bool moved = false;
    for (const auto& [name, value] : engine.consolidated_parameters()) {
      moved = moved || !torch::equal(value, before.at(name));
    }
    EXPECT_TRUE(moved);
  }
}

}  // namespace
}  // namespace dschat
