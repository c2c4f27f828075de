// The planner's ZeRO accounting against the engine it predicts: for the demo model at ZeRO 0-3,
// plain and with LoRA, the bytes engine::footprint_at_step computes from the model built on the
// meta device (plan::parameter_specs) equal TrainingEngine::memory_footprint() at the second
// optimizer step of a one-process run. The 2- and 4-rank cases are in
// plan_measure_multiproc_test.cpp.
#include <gtest/gtest.h>

#include "dschat/engine/zero_groups.h"
#include "dschat/plan/model_memory.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "plan_test_setup.h"
#include "test_util.h"

namespace dschat {
namespace {

struct FootprintCase {
  int stage;
  int64_t lora_dim;
  bool quantize_frozen = false;  // enable_mixed_precision_lora: frozen partitions as int8
};

class PlanFootprint : public ::testing::TestWithParam<FootprintCase> {};

TEST_P(PlanFootprint, EqualsTheEnginesAtTheOptimizerStep) {
  const FootprintCase c = GetParam();
  const std::string model_dir = (testing::source_dir() / "assets" / "demo-opt").string();
  rlhf::StepContext context;
  context.random_init = true;
  rlhf::CommonStepConfig common;
  common.device = "cpu";
  common.dtype = torch::kFloat32;
  common.gradient_accumulation_steps = 2;
  common.only_optimize_lora = c.lora_dim > 0;
  rlhf::ModelTrainingConfig training;
  training.zero_stage = c.stage;
  training.lora_dim = c.lora_dim;
  models::LoadOptions load = rlhf::step_load_options(common, training, context, torch::kCPU);
  auto deferred = rlhf::defer_load_at_stage3(load, c.stage);
  models::CausalLM model = models::load_causal_lm(model_dir, load);
  rlhf::apply_lora(*model, training, common.only_optimize_lora);
  model->train();
  engine::DeepSpeedConfig ds = rlhf::train_ds_config(common, c.stage, 2, 2, 1, "test");
  ds.zero.zero_quantized_nontrainable_weights = c.quantize_frozen;
  engine::TrainingEngineOptions options = rlhf::training_engine_options(common, training, ds, 2, context);
  options.deferred = std::move(deferred);
  auto engine = std::make_unique<engine::TrainingEngine>(model.ptr(), std::move(options));
  engine::MemoryFootprint measured;
  for (int micro = 0; micro < 4; ++micro) {
    const torch::Tensor ids = torch::randint(model->config().vocab_size, {2, 8}, torch::kLong);  // [B, T]
    engine->backward(rlhf::causal_lm_loss(model->forward(ids, torch::ones_like(ids)), ids));
    if (micro == 3) {
      // Stage 3's layers still gathered after backward are a transient of the pass (the plan
      // counts them there); the step releases them first anyway.
      engine->release_gathered_parameters();
      measured = engine->memory_footprint();
    }
    engine->step();
  }

  plan::ModelSetup setup = testing::trained_fp32_setup(model->config(), c.stage, c.lora_dim);
  setup.quantize_frozen = c.quantize_frozen;
  const std::vector<engine::ParameterSpec> specs = plan::parameter_specs(setup);
  const engine::MemoryFootprint planned = plan::zero_footprint(setup, specs, /*world=*/1, /*rank=*/0);
  EXPECT_EQ(planned.parameter_bytes, measured.parameter_bytes);
  EXPECT_EQ(planned.gradient_bytes, measured.gradient_bytes);
  EXPECT_EQ(planned.optimizer_bytes, measured.optimizer_bytes);
  if (c.quantize_frozen) {  // and the int8 base really is smaller: under half the fp32 parameter bytes
    setup.quantize_frozen = false;
    EXPECT_LT(measured.parameter_bytes * 2, plan::zero_footprint(setup, specs, 1, 0).parameter_bytes);
  }
  // The LoRA case really freezes the base: far fewer trainable parameters than parameters.
  if (c.lora_dim > 0) EXPECT_LT(plan::trainable_parameters(specs) * 10, plan::total_parameters(specs));
}

INSTANTIATE_TEST_SUITE_P(Stages, PlanFootprint,
                         ::testing::Values(FootprintCase{0, 0}, FootprintCase{1, 0}, FootprintCase{2, 0},
                                           FootprintCase{3, 0}, FootprintCase{0, 8}, FootprintCase{3, 8},
                                           FootprintCase{3, 8, true}),
                         [](const auto& info) {
                           return "Stage" + std::to_string(info.param.stage) +
                                  (info.param.lora_dim > 0 ? "Lora" : "Full") +
                                  (info.param.quantize_frozen ? "Int8Frozen" : "");
                         });

TEST(PlanFootprint, GroupingMatchesTheEnginesRules) {
  // Two layers of two parameters, a small persistent one, an embedding outside the layers.
  std::vector<engine::ParameterSpec> specs = {{"embed", 1000, torch::kFloat32, true, -1},
                                              {"l0.w", 400, torch::kFloat32, true, 0},
                                              {"l0.frozen", 400, torch::kFloat32, false, 0},
                                              {"l1.w", 400, torch::kFloat32, true, 1},
                                              {"l1.bias", 10, torch::kFloat32, true, 1},
                                              {"frozen.small", 10, torch::kFloat32, false, -1}};
  const engine::ZeroGrouping stage2 = engine::group_parameters(specs, 2, 100);
  ASSERT_EQ(stage2.groups.size(), 1u);
  EXPECT_EQ(stage2.groups[0].members, (std::vector<size_t>{0, 1, 3, 4}));
  EXPECT_EQ(stage2.ungrouped, (std::vector<size_t>{2, 5}));
  const engine::ZeroGrouping stage3 = engine::group_parameters(specs, 3, 100);
  std::vector<std::string> labels;
  for (const auto& g : stage3.groups) labels.push_back(g.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"persistent/Float", "layer0/Float", "layer0/frozen/Float",
                                              "layer1/Float", "outer/Float"}));
  EXPECT_EQ(stage3.ungrouped, (std::vector<size_t>{5}));
  // 3 ranks: the layer groups pad 400 to 402; rank 2 owns 134 of which 132 are real.
  const engine::MemoryFootprint rank2 = engine::footprint_at_step(specs, stage3, {3, 3, 2});
  const engine::MemoryFootprint rank0 = engine::footprint_at_step(specs, stage3, {3, 3, 0});
  EXPECT_LT(rank2.optimizer_bytes, rank0.optimizer_bytes);
  EXPECT_EQ(rank0.parameter_bytes - rank2.parameter_bytes, 0);  // partitions are padded alike
}

}  // namespace
}  // namespace dschat
