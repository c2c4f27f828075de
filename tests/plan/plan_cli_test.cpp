// `dschat plan` and the plan `dschat train` runs first, through the CLI: the demo's plan as
// JSON, a plan that does not fit with its suggestions, clear errors for bad input, and `dschat
// train` stopping before it loads anything when a step cannot fit.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "test_util.h"

namespace dschat {
namespace {

std::string cli() { return DSCHAT_CLI_PATH; }

TEST(PlanCli, DemoPlanAsJsonFitsWithCountedData) {
  testing::TempDir dir;
  std::string output;
  ASSERT_EQ(testing::run_command("cd " + dir.path().string() + " && " + cli() + " plan --json 2>/dev/null", &output), 0)
      << output;
  const nlohmann::json plan = nlohmann::json::parse(output);
  EXPECT_TRUE(plan["fits"].get<bool>());
  EXPECT_TRUE(plan["hardware"]["cpu"].get<bool>());
  ASSERT_EQ(plan["steps"].size(), 3u);
  const std::vector<std::string> kinds = {"sft", "rm", "ppo"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& step = plan["steps"][i];
    EXPECT_EQ(step["kind"], kinds[i]);
    EXPECT_GT(step["peak_bytes"].get<int64_t>(), step["resident_bytes"].get<int64_t>());
    EXPECT_GT(step["steps"].get<int64_t>(), 0) << step["steps_note"];  // the bundled data was counted
    EXPECT_GT(step["total_seconds"].get<double>(), 0);
  }
  // Step 3 holds the five models of DS-Chat's step 3 (the demo enables the EMA).
  EXPECT_EQ(plan["steps"][2]["models"].size(), 5u);
}

TEST(PlanCli, ThirteenBillionOnOneA100With40GiBDoesNotFitAndSaysWhatWould) {
  std::string output;
  const int rc = testing::run_command(cli() + " plan --actor opt-13b --reward opt-350m --deployment single_node "
                                      "--gpu a100-40g --gpus 1 --host-memory 512 --dataset-rows 1000",
                                      &output);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("DOES NOT FIT"), std::string::npos) << output;
  EXPECT_NE(output.find("changes that make it fit"), std::string::npos) << output;
  EXPECT_NE(output.find("offload"), std::string::npos) << output;
  // --dataset-rows counts before the split: steps 1 and 3 read 20% and 40% of 2,4,4.
  EXPECT_NE(output.find("(200 rows in the phase)"), std::string::npos) << output;
  EXPECT_NE(output.find("(400 rows in the phase)"), std::string::npos) << output;
}

TEST(PlanCli, PlansTheNewFamiliesFromTheirPresets) {
  // Qwen2.5 (GQA, untied 7B with a tied 0.5B reward), Pythia (GPT-NeoX), BLOOM and Mistral
  // presets are planned at their real shapes, nothing loaded.
  for (const std::string models : {"--actor qwen2.5-7b --reward qwen2.5-0.5b", "--actor pythia-1.4b --reward pythia-410m",
                                   "--actor bloom-1b7 --reward bloom-560m", "--actor mistral-7b-v0.1 --reward qwen3-0.6b"}) {
    SCOPED_TRACE(models);
    std::string output;
    ASSERT_EQ(testing::run_command(cli() + " plan " + models + " --deployment single_node --gpu h100-80g --gpus 8 "
                                   "--dataset-rows 1000 --json 2>/dev/null",
                                   &output),
              0)
        << output;
    const nlohmann::json plan = nlohmann::json::parse(output);
    ASSERT_EQ(plan["steps"].size(), 3u);
    for (const auto& step : plan["steps"]) EXPECT_GT(step["peak_bytes"].get<int64_t>(), int64_t{1} << 30);
    EXPECT_TRUE(plan["fits"].get<bool>());
  }
}

TEST(PlanCli, BadInputNamesTheFlagOrFile) {
  testing::TempDir dir;
  const std::string bad = (dir / "bad.json").string();
  std::ofstream(bad) << "{ \"step1\": ";
  const std::pair<std::string, std::string> cases[] = {
      {" plan --gpu h300", "unknown accelerator 'h300'"},
      {" plan --gpu h200 --gpu-memory -5", "--gpu-memory must not be negative"},
      {" plan --gpu h200 --gpus -2", "--gpus"},
      {" plan --gpu h200 --gpus 0", "--gpus"},  // was silently 1
      {" plan --gpu-memory 1e9", "--gpu-memory is GiB per GPU"},
      {" plan --gpu h200 --host-memory 2e12", "--host-memory is GiB per node"},
      {" plan --gpu h200 --margin 1.5", "--margin"},
      {" plan --config " + bad, bad},
  };
  for (const auto& [args, expected] : cases) {
    std::string output;
    EXPECT_NE(testing::run_command(cli() + args, &output), 0) << args;
    EXPECT_NE(output.find(expected), std::string::npos) << args << "\n" << output;
  }
}

// Planning another machine's GPUs without --host-memory assumes a DGX A100's host (128 GiB per
// GPU), whatever this machine has, and says so: the same verdict as --host-memory 1024 on 8 GPUs.
TEST(PlanCli, ARemoteGpuPlanAssumesAServerHostNotThisMachines) {
  const std::string plan = cli() + " plan --actor opt-13b --reward opt-350m --deployment single_node --gpu a100-80g "
                           "--gpus 8 --dataset-rows 1000";
  std::string assumed, given;
  ASSERT_EQ(testing::run_command(plan + " --json 2>/dev/null", &assumed), 0) << assumed;
  ASSERT_EQ(testing::run_command(plan + " --host-memory 1024 --json 2>/dev/null", &given), 0) << given;
  const nlohmann::json a = nlohmann::json::parse(assumed), b = nlohmann::json::parse(given);
  EXPECT_EQ(a["hardware"]["host_memory_gib"], 1024.0);
  EXPECT_EQ(a["fits"], b["fits"]);
  for (size_t i = 0; i < a["steps"].size(); ++i) EXPECT_EQ(a["steps"][i]["peak_bytes"], b["steps"][i]["peak_bytes"]);
  std::string text;
  ASSERT_EQ(testing::run_command(plan + " 2>&1", &text), 0) << text;
  EXPECT_NE(text.find("host 1024 GiB per node (assumed: 128 GiB per GPU"), std::string::npos) << text;
}

// DeepSpeed-Chat's run_66b.sh: OPT-66B on 8 nodes of 8 A100-80G, inference_tp_size 8 (8 TP groups
// of 8 of the 64 ranks; the multi_node preset) fits every step.
TEST(PlanCli, TheMultiNodePresetFitsOn64A100s) {
  std::string output;
  const int rc = testing::run_command(cli() + " plan --actor opt-66b --reward opt-350m --deployment multi_node "
                                      "--gpu a100-80g --gpus 8 --nodes 8 --host-memory 1024 --dataset-rows 76256",
                                      &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("step3 (ppo, config block \"step3\"): fits"), std::string::npos) << output;
  EXPECT_NE(output.find("TP shard copy (1/tp of the model)"), std::string::npos) << output;
  EXPECT_EQ(output.find("DOES NOT FIT"), std::string::npos) << output;
}

TEST(PlanCli, TrainStopsBeforeLoadingWhenAStepCannotFit) {
  testing::TempDir dir;
  const std::string out = (dir / "out").string();
  std::string output;
  const auto start = std::chrono::steady_clock::now();
  // OPT-66B on this machine's CPU: terabytes of optimizer state.
  const int rc = testing::run_command(cli() + " train --actor opt-66b --reward opt-350m --deployment multi_node "
                                      "--init random --device cpu --no-progress --output-dir " + out,
                                      &output);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find("will not fit"), std::string::npos) << output;
  EXPECT_NE(output.find("nothing was loaded"), std::string::npos) << output;
  EXPECT_NE(output.find("DOES NOT FIT"), std::string::npos) << output;  // the table came first
  EXPECT_FALSE(std::filesystem::exists(out)) << "the run wrote " << out;
  EXPECT_LT(seconds, 60.0) << "the refusal must come before any model is built";
}

}  // namespace
}  // namespace dschat
