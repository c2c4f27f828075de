// DPO through the CLI on the tiny pipeline (tests/tiny_pipeline.h): `dschat train --pipeline
// sft-dpo` trains step 1, then DPO from its model against a frozen copy, evaluates the implicit
// rewards before and after, and saves a model that loads; killed during DPO and rerun, it resumes
// and ends bit-identical to an uninterrupted run; on two ranks at ZeRO-2 and ZeRO-3 (the
// reference then partitioned by a ZeRO-3 inference engine).
#include <gtest/gtest.h>

#include <cmath>

#include "core/json_object.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/load_save.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string cli() { return DSCHAT_CLI_PATH; }

// Two epochs of 6 steps (48 pairs, the tiny pipeline's phase-2 share; the demo's block reads
// every pair) with a checkpoint after each step.
json dpo_blocks(int zero_stage) {
  return {{"pipeline", "sft-dpo"},
          {"step2_dpo",
           {{"num_train_epochs", 2},
            {"data", {{"data_split", "2,4,4"}}},
            {"per_device_train_batch_size", 8},
            {"per_device_eval_batch_size", 8},
            {"checkpoint_interval", 1},
            {"learning_rate", 1e-3},
            {"zero_stage", zero_stage}}}};
}

json summary(const fs::path& dir) { return core::read_json_file((dir / "training_summary.json").string()); }

void expect_same_model(const fs::path& a, const fs::path& b) {
  const io::TensorMap x = io::load_state_dict(a), y = io::load_state_dict(b);
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, value] : x) EXPECT_TRUE(torch::equal(y.at(name), value)) << name;
}

TEST(DpoPipeline, SftThenDpoTrainsEvaluatesSavesAndResumesAfterAKill) {
  testing::TempDir straight, killed;
  const fs::path config = testing::write_tiny_pipeline_config(straight.path(), dpo_blocks(0));
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  for (const char* line : {"---=== Running Step 2 ===---", "***** Evaluating rewards, Epoch 0/2 *****", "margin: "}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  const json s = summary(straight / "out/dpo");
  EXPECT_GT(s.at("optimizer_steps").get<int64_t>(), 2);
  for (const char* when : {"before", "after"}) {
    const json& e = s.at(when);
    for (const char* key : {"loss", "chosen_reward", "rejected_reward", "margin", "accuracy"}) {
      EXPECT_TRUE(std::isfinite(e.at(key).get<double>())) << when << " " << key;
    }
    EXPECT_GE(e.at("accuracy").get<double>(), 0.0);
    EXPECT_LE(e.at("accuracy").get<double>(), 1.0);
  }
  // Policy = reference before training: every implicit reward is 0 and the loss is log 2.
  EXPECT_NEAR(s["before"]["loss"].get<double>(), std::log(2.0), 1e-6);
  EXPECT_NEAR(s["before"]["margin"].get<double>(), 0.0, 1e-6);
  EXPECT_NE(s["after"]["margin"].get<double>(), 0.0);
  auto dpo = models::load_causal_lm((straight / "out/dpo").string());
  const io::TensorMap trained = io::load_state_dict(straight / "out/dpo"), sft = io::load_state_dict(straight / "out/actor");
  EXPECT_GT(testing::max_abs_diff(trained.at("model.decoder.layers.0.fc1.weight"),
                                  sft.at("model.decoder.layers.0.fc1.weight")),
            0.0);

  // The same run, killed once DPO has committed its third checkpoint, then the same command.
  const fs::path again = testing::write_tiny_pipeline_config(killed.path(), dpo_blocks(0));
  const std::string run = cli() + " train --config " + again.string() + " --no-progress";
  const int status = testing::run_command(
      "bash -c '" + run + " > " + (killed / "first.log").string() + " 2>&1 & pid=$!; for i in $(seq 1200); do " +
          "grep -qE \"global_step([3-9]|[1-9][0-9])$\" " + (killed / "out/dpo_checkpoints/latest").string() +
          " 2>/dev/null && break; sleep 0.05; done; kill -9 $pid; wait $pid'",
      &out);
  ASSERT_NE(status, 0) << "the run finished before it could be killed\n" << out;
  ASSERT_FALSE(fs::exists(killed / "out/dpo/training_summary.json"));
  ASSERT_EQ(testing::run_command(run, &out), 0) << out;
  EXPECT_NE(out.find("Step 1 already finished"), std::string::npos) << out;
  EXPECT_NE(out.find("step 2 (DPO): resuming from"), std::string::npos) << out;
  expect_same_model(straight / "out/dpo", killed / "out/dpo");
  EXPECT_EQ(summary(killed / "out/dpo")["before"], s["before"]);
}

TEST(DpoPipeline, PipelineFlagAndDryRunNameTheDpoStep) {
  testing::TempDir tmp;
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path());
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " train --config " + config.string() + " --pipeline sft-dpo --dry-run", &out),
            0)
      << out;
  EXPECT_NE(out.find("step1: sft"), std::string::npos) << out;
  EXPECT_NE(out.find("step2: dpo"), std::string::npos) << out;
  EXPECT_NE(out.find("model " + (tmp / "out/actor").string()), std::string::npos) << out;
  EXPECT_EQ(out.find("step3"), std::string::npos) << out;
  EXPECT_NE(testing::run_command(cli() + " train --config " + config.string() + " --pipeline sft-ppo --dry-run", &out),
            0);
  EXPECT_NE(out.find("'sft-ppo' is not one of"), std::string::npos) << out;
}

// DPO with LoRA on the decoder layers and only the adapters trained (`only_optimize_lora`): the
// saved policy has the adapters fused into the layers' weights, and nothing else moved.
TEST(DpoPipeline, LoraTrainsOnlyTheAdaptedLayersAndSavesThemFused) {
  testing::TempDir tmp;
  json blocks = dpo_blocks(0);
  blocks["step2_dpo"]["lora_dim"] = 4;
  blocks["step2_dpo"]["only_optimize_lora"] = true;
  blocks["step2_dpo"]["num_train_epochs"] = 1;
  blocks["step2_dpo"]["checkpoint_interval"] = 0;
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), blocks);
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  const io::TensorMap dpo = io::load_state_dict(tmp / "out/dpo"), sft = io::load_state_dict(tmp / "out/actor");
  ASSERT_EQ(dpo.size(), sft.size()) << "the adapters are fused, not saved as extra tensors";
  EXPECT_GT(testing::max_abs_diff(dpo.at("model.decoder.layers.0.fc1.weight"), sft.at("model.decoder.layers.0.fc1.weight")),
            0.0);
  for (const char* frozen : {"model.decoder.embed_tokens.weight", "model.decoder.layers.0.fc1.bias"}) {
    EXPECT_TRUE(torch::equal(dpo.at(frozen), sft.at(frozen))) << frozen;
  }
  // The adapters moved the implicit reward away from the reference's (0 before training).
  EXPECT_NE(summary(tmp / "out/dpo")["after"]["margin"].get<double>(), 0.0);
}

// Two ranks: step 1 at ZeRO-2, DPO at ZeRO-2 and at ZeRO-3 (`dschat dpo` for the second).
TEST(DpoPipelineMultiproc, TwoRanksAtZeroTwoAndThree) {
  testing::TempDir tmp;
  json blocks = dpo_blocks(2);
  blocks["step1"] = {{"zero_stage", 2}};
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), blocks);
  const std::string launch = testing::two_rank_launch();
  std::string out;
  ASSERT_EQ(testing::run_command(launch + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  const json two = summary(tmp / "out/dpo");
  EXPECT_GT(two.at("optimizer_steps").get<int64_t>(), 0);
  EXPECT_NEAR(two["before"]["loss"].get<double>(), std::log(2.0), 1e-6);

  json stage3 = core::read_json_file(config.string());
  stage3["step2_dpo"]["zero_stage"] = 3;
  stage3["step2_dpo"]["output_dir"] = (tmp / "out/dpo3").string();
  std::ofstream(tmp / "stage3.json") << stage3.dump(2);
  ASSERT_EQ(testing::run_command(launch + " dpo --config " + (tmp / "stage3.json").string() + " --no-progress", &out),
            0)
      << out;
  const json three = summary(tmp / "out/dpo3");
  EXPECT_EQ(three.at("optimizer_steps"), two.at("optimizer_steps"));
  // The same data, schedule and (fp32) weights: stage 3 continues stage 2's numbers closely.
  EXPECT_NEAR(three["after"]["loss"].get<double>(), two["after"]["loss"].get<double>(), 1e-3);
  auto model = models::load_causal_lm((tmp / "out/dpo3").string());
}

}  // namespace
}  // namespace dschat
