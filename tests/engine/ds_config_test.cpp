// DeepSpeed-style engine configs: DeepSpeed-Chat's own train/eval configs parse unchanged,
// DeepSpeed's batch-size rule, and clear errors for bad or unsupported settings.
#include <gtest/gtest.h>

#include "dschat/engine/ds_config.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

// ds_utils.get_train_ds_config(offload=True, dtype="fp16", stage=2, enable_hybrid_engine=True, ...)
json deepspeed_chat_train_config() {
  return json::parse(R"({
    "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
    "zero_optimization": {"stage": 2, "overlap_comm": true, "offload_param": {"device": "cpu"},
                          "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 1e4,
                          "stage3_max_live_parameters": 3e7, "stage3_prefetch_bucket_size": 3e7,
                          "memory_efficient_linear": false},
    "fp16": {"enabled": true, "loss_scale_window": 100},
    "gradient_clipping": 1.0, "prescale_gradients": false, "wall_clock_breakdown": false,
    "hybrid_engine": {"enabled": true, "max_out_tokens": 512, "inference_tp_size": 1,
                      "release_inference_cache": false, "pin_parameters": true, "tp_gather_partition_size": 8},
    "tensorboard": {"enabled": false, "output_path": "step3_tensorboard/ds_tensorboard_logs/",
                    "job_name": "step3_actor_tensorboard"}})");
}

TEST(DeepSpeedConfig, DeepSpeedChatTrainConfigParsesUnchanged) {
  auto config = engine::DeepSpeedConfig::parse(deepspeed_chat_train_config(), 4, "train.json");
  EXPECT_EQ(config.train_batch_size, 32);
  EXPECT_EQ(config.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(config.gradient_accumulation_steps, 2);  // 32 / (4 * 4)
  EXPECT_EQ(config.precision, engine::Precision::kFp16);
  EXPECT_EQ(config.fp16_block["loss_scale_window"], 100);
  EXPECT_EQ(config.zero.stage, 2);
  EXPECT_TRUE(config.zero.overlap_comm);
  EXPECT_EQ(config.zero.stage3_max_live_parameters, 30000000);
  EXPECT_EQ(config.zero.offload_optimizer.device, "cpu");
  EXPECT_TRUE(config.hybrid_engine.enabled);
  EXPECT_EQ(config.hybrid_engine.max_out_tokens, 512);
  EXPECT_EQ(config.tensorboard.job_name, "step3_actor_tensorboard");
  EXPECT_DOUBLE_EQ(config.gradient_clipping, 1.0);
  EXPECT_FALSE(config.optimizer.has_value());
  EXPECT_EQ(config.not_acted_on,
            (std::vector<std::string>{"zero_optimization.offload_param (stage < 3)",
                                      "zero_optimization.memory_efficient_linear"}));
}

TEST(DeepSpeedConfig, DeepSpeedChatEvalConfigParsesUnchanged) {
  auto eval = json::parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1e4,
                            "offload_param": {"device": "none"}, "memory_efficient_linear": false},
      "bfloat16": {"enabled": true}, "gradient_clipping": 1.0, "prescale_gradients": false,
      "wall_clock_breakdown": false})");
  auto config = engine::DeepSpeedConfig::parse(eval, 8, "eval.json");
  EXPECT_EQ(config.precision, engine::Precision::kBf16);
  EXPECT_EQ(config.zero.stage, 3);
  EXPECT_TRUE(config.zero.overlap_comm);  // DeepSpeed's default at stage 3
  EXPECT_EQ(config.gradient_accumulation_steps, 1);
}

TEST(DeepSpeedConfig, BatchSizeRuleIsDeepSpeeds) {
  auto resolve = [](int64_t t, int64_t m, int64_t a, int64_t w) {
    engine::resolve_batch_sizes(t, m, a, w, "c.json");
    return std::vector<int64_t>{t, m, a};
  };
  EXPECT_EQ(resolve(64, 4, 0, 2), (std::vector<int64_t>{64, 4, 8}));
  EXPECT_EQ(resolve(64, 0, 2, 4), (std::vector<int64_t>{64, 8, 2}));
  EXPECT_EQ(resolve(0, 4, 3, 2), (std::vector<int64_t>{24, 4, 3}));
  EXPECT_EQ(resolve(16, 0, 0, 4), (std::vector<int64_t>{16, 4, 1}));
  EXPECT_EQ(resolve(0, 5, 0, 3), (std::vector<int64_t>{15, 5, 1}));
  EXPECT_THROW_WITH(resolve(30, 4, 0, 2), core::ConfigError,
                    "train_batch_size 30 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 3 * world size 2");
  EXPECT_THROW_WITH(resolve(32, 4, 2, 2), core::ConfigError, "inconsistent batch sizes");
  EXPECT_THROW_WITH(resolve(0, 0, 4, 1), core::ConfigError, "either train_batch_size or train_micro_batch_size_per_gpu");
  EXPECT_THROW_WITH(resolve(2, 0, 0, 4), core::ConfigError, "inconsistent");
}

TEST(DeepSpeedConfig, BadSettingsAreNamed) {
  auto with = [](const char* patch) {
    json config = deepspeed_chat_train_config();
    config.merge_patch(json::parse(patch));
    return config;
  };
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(with(R"({"gradient_cliping": 1.0})"), 4, "c.json"),
                    core::ConfigError, "unknown key 'gradient_cliping' (did you mean 'gradient_clipping'?)");
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(with(R"({"zero_optimization": {"stage": 4}})"), 4, "c.json"),
                    core::ConfigError, "c.json: zero_optimization: key 'stage': 4 is not a ZeRO stage");
  EXPECT_THROW_WITH(
      engine::DeepSpeedConfig::parse(with(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})"), 4, "c.json"),
      core::Unsupported, "NVMe offload is not supported");
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(with(R"({"bf16": {"enabled": true}})"), 4, "c.json"),
                    core::ConfigError, "fp16 and bf16 cannot both be enabled");
  EXPECT_THROW_WITH(
      engine::DeepSpeedConfig::parse(with(R"({"optimizer": {"type": "Lamb", "params": {}}})"), 4, "c.json"),
      core::Unsupported, "'Lamb' is not supported");
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(
                        with(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})"), 4, "c.json"),
                    core::ConfigError, "use the top-level gradient_clipping");
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(with(R"({"zero_optimization": {"stage": 0,
                        "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}})"), 4, "c.json"),
                    core::ConfigError, "offload_optimizer needs stage 1, 2 or 3");
  EXPECT_THROW_WITH(engine::DeepSpeedConfig::parse(with(R"({"on_nonfinite_loss": "ignore"})"), 4, "c.json"),
                    core::ConfigError, "'ignore' is not one of skip, error");
}

TEST(DeepSpeedConfig, OptimizerBlock) {
  json config = deepspeed_chat_train_config();
  config["optimizer"] = json::parse(R"({"type": "Adam", "params": {"lr": 5e-4, "betas": [0.9, 0.95],
                                        "eps": 1e-6, "weight_decay": 0.1, "torch_adam": false}})");
  auto parsed = engine::DeepSpeedConfig::parse(config, 4, "c.json");
  ASSERT_TRUE(parsed.optimizer.has_value());
  EXPECT_DOUBLE_EQ(parsed.optimizer->lr, 5e-4);
  EXPECT_DOUBLE_EQ(parsed.optimizer->beta2, 0.95);
  EXPECT_TRUE(parsed.optimizer->adam_w_mode);  // DeepSpeed: "Adam" is decoupled unless adam_w_mode is false
}

}  // namespace
}  // namespace dschat
