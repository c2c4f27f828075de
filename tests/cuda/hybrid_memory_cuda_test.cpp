// HybridEngine on the GPU: 100 train <-> generate switches (ZeRO-3 gathers, a bf16 inference
// copy, LoRA fused for generation and restored) leave the GPU's allocated bytes flat: after the
// first ten switches (optimizer state, workspaces) the next ninety may not grow them by more than
// 1 MiB (the model is ~100 KiB, so one leaked copy per switch would add ~9 MiB). Skips without a GPU.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include "cuda/cuda_cases.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/nn/lora.h"

namespace dschat {
namespace {

int64_t allocated_bytes(int device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}

TEST(HybridEngineCuda, HundredSwitchesLeaveGpuMemoryFlat) {
  DSCHAT_REQUIRE_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  models::LoadOptions load;
  load.device = device;
  load.dropout = 0.0;
  auto actor = models::load_causal_lm(testing::fixture("opt-preln").string(), load);
  torch::manual_seed(3);
  nn::convert_linear_layers_to_lora(*actor, {4, 1.0, 0.0, "layers."});
  nn::only_optimize_lora_parameters(*actor);
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 2},
                       {"gradient_accumulation_steps", 1},
                       {"train_batch_size", 2},
                       {"steps_per_print", 0},
                       {"zero_optimization", {{"stage", 3}, {"stage3_param_persistence_threshold", 16}}},
                       {"hybrid_engine", {{"enabled", true}, {"max_out_tokens", 16}, {"release_inference_cache", true}}}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, 1, "hybrid memory test");
  options.training.optimizer.lr = 1e-2;
  options.inference_dtype = torch::kBFloat16;
  options.logits_self_check = false;
  hybrid::HybridEngine engine(actor, options);
  const int64_t vocab = actor->config().vocab_size;
  torch::Tensor prompt = torch::randint(3, vocab, {2, 6}, torch::dtype(torch::kInt64).device(device));  // [2, 6]
  torch::Tensor mask = torch::ones_like(prompt);                                                         // [2, 6]
  core::GenerationConfig config;
  config.max_new_tokens = 2;
  int64_t after_warmup = 0;
  for (int i = 0; i < 100; ++i) {
    engine.eval();
    engine.generate(prompt, mask, config);
    engine.train();
    torch::Tensor logits = engine.actor()->forward(prompt);  // [2, 6, V]
    engine.backward(logits.to(torch::kFloat32).logsumexp(-1).mean());
    engine.step();
    if (i == 9) after_warmup = allocated_bytes(0);
  }
  torch::cuda::synchronize();
  EXPECT_LT(allocated_bytes(0) - after_warmup, 1 << 20);
}

}  // namespace
}  // namespace dschat
