// DeepSpeed-Chat's --enable_mixed_precision_lora (ZeRO++ zero_quantized_nontrainable_weights) end
// to end: step 3 (PPO) of the demo on 2 ranks at ZeRO-3 with actor LoRA and the hybrid engine,
// through `dschat launch ... dschat train`, once with the frozen base weights as int8 partitions
// and once in fp32. The int8 partitions cross the ranks in the all-gathers and are dequantized
// for training forwards and for generation (LoRA fused into the dequantized weights layer by
// layer and unfused after). Seeded sampling (the demo's), so both runs draw the same answers
// unless a quantization error moves a draw across a token boundary; tolerances at each check. Steps 1 and 2 run once, on one
// rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "dschat/io/state_dict.h"
#include "dschat/monitor/metrics_log.h"
#include "elastic_run.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The EMA stays on: partitioned at ZeRO-3, over the int8 groups' dequantized values.
json step3_variant(const fs::path& trained, const fs::path& out, bool mixed_precision) {
  return testing::zero3_step3_config(trained, out,
                                     {{"actor_lora_dim", 8},
                                      {"actor_lora_module_name", "decoder.layers."},
                                      {"only_optimize_lora", true},
                                      {"actor_lora_learning_rate", 1e-2},
                                      {"enable_mixed_precision_lora", mixed_precision}});
}

std::vector<monitor::MetricsRow> ppo_rows(const fs::path& out) {
  std::vector<monitor::MetricsRow> rows;
  for (monitor::MetricsRow& row : monitor::read_metrics_jsonl(out / "step3_logs/metrics.jsonl")) {
    if (row.phase == "ppo") rows.push_back(std::move(row));
  }
  return rows;
}

TEST(MixedPrecisionLoraMultiproc, PpoWithAnInt8FrozenBaseFollowsTheFullPrecisionRun) {
  testing::TempDir dir;
  std::string out;
  const fs::path first_steps = testing::write_tiny_pipeline_config(dir.path());
  for (int step : {1, 2}) {
    ASSERT_EQ(testing::run_train(1, first_steps, step, dir.path(), "step" + std::to_string(step), &out), 0) << out;
  }
  const io::TensorMap base = io::load_state_dict(dir / "out/actor");
  std::map<bool, io::TensorMap> actors;
  std::map<bool, std::vector<monitor::MetricsRow>> rows;
  for (bool mixed : {false, true}) {
    const std::string name = mixed ? "int8_base" : "fp32_base";
    const fs::path variant = dir / name;
    fs::create_directories(variant);
    const fs::path config = testing::write_tiny_pipeline_config(variant, step3_variant(dir / "out", variant / "out", mixed));
    ASSERT_EQ(testing::run_train(2, config, 3, variant, name, &out), 0) << name << "\n" << out;
    actors[mixed] = io::load_state_dict(variant / "out/step3/actor");
    rows[mixed] = ppo_rows(variant / "out");
  }
  // A PPO run diverges as soon as one sampled token differs, and the int8 base moves a few draws
  // across token boundaries from the first generation on (measured: mean reward -2.314 against
  // -2.333 at step 1, -2.222 against -2.182 at step 2). So the runs are compared as runs: the same
  // steps, mean rewards within 0.1 of each other, finite losses.
  ASSERT_EQ(rows[false].size(), 2u);
  ASSERT_EQ(rows[true].size(), rows[false].size());
  for (size_t i = 0; i < rows[false].size(); ++i) {
    const auto& want = rows[false][i].values;
    const auto& got = rows[true][i].values;
    std::cout << "step " << i + 1 << ": reward fp32 base " << want.at("reward") << ", int8 base " << got.at("reward")
              << "; kl " << want.at("kl") << " / " << got.at("kl") << "\n";
    EXPECT_NEAR(got.at("reward"), want.at("reward"), 0.1) << "step " << i + 1;
    for (const char* loss : {"actor_loss", "critic_loss"}) EXPECT_TRUE(std::isfinite(got.at(loss))) << loss;
  }
  // Before any update the fp32 actor is its reference (KL 0 exactly); the int8 actor computes with
  // the dequantized base while the reference keeps the exact one: a small, non-zero KL.
  EXPECT_EQ(rows[false][0].values.at("kl"), 0.0);
  EXPECT_GT(std::abs(rows[true][0].values.at("kl")), 0.0);
  EXPECT_LT(std::abs(rows[true][0].values.at("kl")), 1e-2);
  // The saved actors. The token embedding is frozen and not adapted: the int8 run saves its
  // dequantized value, within half an int8 step of its absmax (absmax / 254) of the exact one.
  const std::string embedding = "model.decoder.embed_tokens.weight";
  const double embedding_error = (actors[true].at(embedding) - actors[false].at(embedding)).abs().max().item<double>();
  EXPECT_GT(embedding_error, 0.0);
  EXPECT_LE(embedding_error, base.at(embedding).abs().max().item<double>() / 254.0 * (1 + 1e-5));
  // The adapted weights (LoRA fused) differ by the quantization and by the different experience:
  // within the quantization bound plus three times what training moved the fp32 run's weight
  // (measured: at most 1.9 times); parameters outside the adapters and the embedding are equal.
  for (const auto& [name, want] : actors.at(false)) {
    if (name == embedding) continue;
    const torch::Tensor& got = actors.at(true).at(name);
    const double moved = (want - base.at(name)).abs().max().item<double>();
    const double diff = (got - want).abs().max().item<double>();
    if (moved == 0.0) {
      EXPECT_EQ(diff, 0.0) << name;
      continue;
    }
    EXPECT_LE(diff, base.at(name).abs().max().item<double>() / 254.0 + 3.0 * moved) << name;
  }
  EXPECT_GT(testing::max_abs_diff(actors.at(false).at("model.decoder.layers.0.fc1.weight"),
                                  base.at("model.decoder.layers.0.fc1.weight")),
            1e-4);
}

}  // namespace
}  // namespace dschat
