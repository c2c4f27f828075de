// Resuming on another world size (issue 38). A run killed (SIGKILL of the launcher and every
// rank) after a few committed checkpoints and resumed on another number of ranks, with the same
// global batch, ends like an uninterrupted run on the new number: the same optimizer steps,
// every epoch trains each sample exactly once (asserted from the step's sample log, which also
// shows the records of the killed run's lost steps were dropped), and the weights agree within
// float summation-order tolerance. 2 -> 1 and 1 -> 2 ranks on SFT (ZeRO-0 and ZeRO-3), 2 -> 4
// and 4 -> 2 on the reward model (ZeRO-2 and ZeRO-3); 2 -> 1 on GRPO and PPO (steps and prompts only). A
// resume that changes the global batch is refused naming both layouts unless elastic_resume is
// "allow".
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "dschat/core/json_file.h"
#include "dschat/io/state_dict.h"
#include "elastic_run.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// One row (SFT) or pair (RM) per micro-batch, so every layout with the same global batch groups
// the step's rows alike: a per-micro-batch token mean over another grouping would be another
// number. No dropout: the ranks' random streams differ from a single rank's. A checkpoint after
// every step; the sample log on.
json step_block(const std::string& step, int64_t gas, int zero_stage) {
  json block = {{step,
           {{"num_train_epochs", 2}, {"per_device_train_batch_size", 1}, {"gradient_accumulation_steps", gas},
            {"dropout", 0.0}, {"zero_stage", zero_stage}, {"checkpoint_interval", 1}, {"keep_checkpoints", 0},
            {"guardian", {{"enabled", false}}}, {"log_sample_ids", true}}}};
  // The reward model from the demo's base model (random init), not from step 1's output.
  if (step == "step2") block[step]["model_name_or_path"] = std::string(DSCHAT_SOURCE_DIR) + "/assets/demo-opt";
  return block;
}

int64_t optimizer_steps(const fs::path& model) {
  return core::read_json_file((model / "training_summary.json").string()).at("optimizer_steps").get<int64_t>();
}

struct Elastic {
  std::string step_key;  // "step1" | "step2"
  int step;              // 1 | 2
  std::string output;    // "actor" | "reward"
  int zero_stage;
  int world_before, world_after;
  int64_t global_batch;
  int64_t kill_after;   // committed optimizer steps before the kill
  int64_t total_steps;  // of the uninterrupted run (2 epochs)
  double tolerance;     // max |weight difference| against the uninterrupted run
};

// The uninterrupted run on world_after ranks, the run killed on world_before ranks and its
// resume on world_after ranks: same steps, same per-epoch sample multisets (each sample once),
// weights within tolerance. Returns the killed run's folder for further checks.
void expect_elastic_resume_matches(const Elastic& e, testing::TempDir& straight, testing::TempDir& elastic) {
  std::string out;
  const fs::path reference = testing::write_tiny_pipeline_config(
      straight.path(), step_block(e.step_key, e.global_batch / e.world_after, e.zero_stage));
  ASSERT_EQ(testing::run_train(e.world_after, reference, e.step, straight.path(), "reference", &out), 0) << out;

  const fs::path before = testing::write_tiny_pipeline_config(
      elastic.path(), step_block(e.step_key, e.global_batch / e.world_before, e.zero_stage));
  testing::run_train_killed(e.world_before, before, e.step, elastic.path(), elastic / ("out/" + e.output + "_checkpoints"),
                            e.kill_after);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_FALSE(fs::exists(elastic / ("out/" + e.output))) << "killed before the end";

  const fs::path after = testing::write_tiny_pipeline_config(
      elastic.path(), step_block(e.step_key, e.global_batch / e.world_after, e.zero_stage));
  ASSERT_EQ(testing::run_train(e.world_after, after, e.step, elastic.path(), "resumed", &out), 0) << out;
  const std::string from = std::to_string(e.world_before) + (e.world_before == 1 ? " rank x 1 rows x GAS " : " ranks x 1 rows x GAS ") +
                           std::to_string(e.global_batch / e.world_before);
  EXPECT_NE(out.find("from a checkpoint of " + from), std::string::npos) << out;

  EXPECT_EQ(optimizer_steps(straight / ("out/" + e.output)), e.total_steps);
  EXPECT_EQ(optimizer_steps(elastic / ("out/" + e.output)), e.total_steps);

  const testing::SampleLogContents want = testing::read_sample_log(straight / ("out/" + e.output + "_logs"));
  const testing::SampleLogContents got = testing::read_sample_log(elastic / ("out/" + e.output + "_logs"));
  EXPECT_EQ(got.resumes, 1);
  ASSERT_EQ(want.ids_per_epoch.size(), 2u);
  EXPECT_EQ(got.ids_per_epoch, want.ids_per_epoch);
  for (const auto& [epoch, ids] : got.ids_per_epoch) {
    EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), ids.size()) << "epoch " << epoch << " repeats a sample";
    EXPECT_EQ(static_cast<int64_t>(ids.size()), e.total_steps / 2 * e.global_batch) << "epoch " << epoch;
  }
  // One record per update 1..total: the killed run's steps after its checkpoint were dropped.
  EXPECT_EQ(static_cast<int64_t>(got.updates.size()), e.total_steps);
  EXPECT_EQ(*got.updates.rbegin(), e.total_steps);

  const io::TensorMap resumed = io::load_state_dict(elastic / ("out/" + e.output));
  const io::TensorMap uninterrupted = io::load_state_dict(straight / ("out/" + e.output));
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (const auto& [name, tensor] : uninterrupted) {
    // Ranks average their accumulated gradients where fewer ranks accumulate more rows: the same
    // sum in another order, so float rounding alone separates the runs.
    EXPECT_LT(testing::max_abs_diff(resumed.at(name), tensor), e.tolerance) << name;
  }
}

// 120 SFT rows, global batch 8: 15 steps per epoch.
TEST(ElasticResumeMultiproc, SftTwoRanksKilledThenOneRankContinuesAtTheFirstUnseenSample) {
  testing::TempDir straight, elastic;
  expect_elastic_resume_matches({"step1", 1, "actor", 0, 2, 1, 8, 5, 30, 2e-4}, straight, elastic);
}

TEST(ElasticResumeMultiproc, SftZero3OneRankKilledThenTwoRanksContinue) {
  testing::TempDir straight, elastic;
  expect_elastic_resume_matches({"step1", 1, "actor", 3, 1, 2, 8, 4, 30, 2e-4}, straight, elastic);
}

// 120 pairs (the demo's step 2 reads every pair of the data), global batch 8: 15 steps per epoch.
TEST(ElasticResumeMultiproc, RewardZero2TwoRanksKilledThenFourRanksContinue) {
  testing::TempDir straight, elastic;
  expect_elastic_resume_matches({"step2", 2, "reward", 2, 2, 4, 8, 4, 30, 2e-4}, straight, elastic);
}

TEST(ElasticResumeMultiproc, RewardZero3FourRanksKilledThenTwoRanksContinue) {
  testing::TempDir straight, elastic;
  expect_elastic_resume_matches({"step2", 2, "reward", 3, 4, 2, 8, 4, 30, 2e-4}, straight, elastic);
}

// The critic-free step (GRPO) counts prompt batches the same way: 24 prompts, 8 per step (2 ranks
// x 4 or 1 rank x 8), 2 epochs = 6 steps. Its answers are sampled with per-rank seeds, so the
// weights of another world size differ; the steps and the prompts of each epoch must not.
TEST(ElasticResumeMultiproc, GrpoTwoRanksKilledThenOneRankTrainsEveryPromptOncePerEpoch) {
  const auto blocks = [](int64_t prompts_per_rank) {
    return json{{"pipeline", "sft-grpo"},
                {"step2_grpo",
                 {{"actor_model_name_or_path", std::string(DSCHAT_SOURCE_DIR) + "/assets/demo-opt"},
                  {"num_train_epochs", 2},
                  {"data", {{"data_split", "4,4,2"}}},
                  {"n_samples_per_prompt", 4},
                  {"per_device_generation_batch_size", prompts_per_rank},
                  {"per_device_training_batch_size", 8},
                  {"checkpoint_interval", 1},
                  {"keep_checkpoints", 0},
                  {"num_warmup_steps", 0},
                  {"guardian", {{"enabled", false}}},
                  {"log_sample_ids", true},
                  {"rewards", json::array({{{"type", "demo_task"}}})}}}};
  };
  testing::TempDir dir;
  const fs::path two_ranks = testing::write_tiny_pipeline_config(dir.path(), blocks(4));
  testing::run_train_killed(2, two_ranks, 2, dir.path(), dir / "out/grpo_checkpoints/actor", 2);
  if (HasFatalFailure()) return;
  std::string out;
  const fs::path one_rank = testing::write_tiny_pipeline_config(dir.path(), blocks(8));
  ASSERT_EQ(testing::run_train(1, one_rank, 2, dir.path(), "resumed", &out), 0) << out;
  EXPECT_NE(out.find("from a checkpoint of 2 ranks x 4 rows x GAS 1"), std::string::npos) << out;
  EXPECT_EQ(core::read_json_file((dir / "out/grpo/training_summary.json").string()).at("steps").get<int64_t>(), 6);
  const testing::SampleLogContents got = testing::read_sample_log(dir / "out/grpo_logs");
  EXPECT_EQ(got.resumes, 1);
  ASSERT_EQ(got.ids_per_epoch.size(), 2u);
  for (const auto& [epoch, ids] : got.ids_per_epoch) {
    EXPECT_EQ(ids.size(), 24u) << "epoch " << epoch;
    EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), 24u) << "epoch " << epoch << " repeats a prompt";
  }
  EXPECT_EQ(got.updates, (std::set<int64_t>{1, 2, 3, 4, 5, 6}));
}

// PPO (step 3) likewise: 48 prompts, 8 per step, 1 epoch = 6 steps, from steps 1 and 2 trained
// first on one rank.
TEST(ElasticResumeMultiproc, PpoTwoRanksKilledThenOneRankTrainsEveryPromptOnce) {
  const auto blocks = [](int64_t prompts_per_rank) {
    return json{{"step3",
                 {{"per_device_generation_batch_size", prompts_per_rank},
                  {"per_device_training_batch_size", prompts_per_rank},
                  {"keep_checkpoints", 0},
                  {"guardian", {{"enabled", false}}},
                  {"log_sample_ids", true}}}};
  };
  testing::TempDir dir;
  const fs::path two_ranks = testing::write_tiny_pipeline_config(dir.path(), blocks(4));
  std::string out;
  for (int step : {1, 2}) {
    ASSERT_EQ(testing::run_train(1, two_ranks, step, dir.path(), "step" + std::to_string(step), &out), 0) << out;
  }
  testing::run_train_killed(2, two_ranks, 3, dir.path(), dir / "out/step3_checkpoints/actor", 2);
  if (HasFatalFailure()) return;
  const fs::path one_rank = testing::write_tiny_pipeline_config(dir.path(), blocks(8));
  ASSERT_EQ(testing::run_train(1, one_rank, 3, dir.path(), "resumed", &out), 0) << out;
  EXPECT_NE(out.find("from a checkpoint of 2 ranks x 4 rows x GAS 1"), std::string::npos) << out;
  EXPECT_EQ(core::read_json_file((dir / "out/step3/training_summary.json").string()).at("steps").get<int64_t>(), 6);
  const testing::SampleLogContents got = testing::read_sample_log(dir / "out/step3_logs");
  EXPECT_EQ(got.resumes, 1);
  ASSERT_EQ(got.ids_per_epoch.size(), 1u);
  const std::multiset<int64_t>& ids = got.ids_per_epoch.begin()->second;
  EXPECT_EQ(ids.size(), 48u);
  EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), 48u) << "a prompt was trained twice";
  EXPECT_EQ(got.updates, (std::set<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(ElasticResumeMultiproc, ResumeWithAnotherGlobalBatchIsRefusedUnlessAllowed) {
  testing::TempDir dir;
  const fs::path two_ranks = testing::write_tiny_pipeline_config(dir.path(), step_block("step1", 4, 0));
  testing::run_train_killed(2, two_ranks, 1, dir.path(), dir / "out/actor_checkpoints", 2);
  if (HasFatalFailure()) return;
  const int64_t committed = testing::committed_step(dir / "out/actor_checkpoints");

  // 1 rank x GAS 4: global batch 4 instead of 8; refused, naming both layouts, nothing changes.
  std::string out;
  const fs::path smaller = testing::write_tiny_pipeline_config(dir.path(), step_block("step1", 4, 0));
  EXPECT_NE(testing::run_train(1, smaller, 1, dir.path(), "refused", &out), 0) << out;
  EXPECT_NE(out.find("the checkpoint was written by 2 ranks x 1 rows x GAS 4 (global batch 8) and this run is "
                     "1 rank x 1 rows x GAS 4 (global batch 4)"),
            std::string::npos)
      << out;
  EXPECT_EQ(testing::committed_step(dir / "out/actor_checkpoints"), committed);

  // With elastic_resume "allow" it goes on from the same sample: the rest of the epoch's rows in
  // steps of 4, each sample still once per epoch.
  json allow = step_block("step1", 4, 0);
  allow["step1"]["elastic_resume"] = "allow";
  const fs::path allowed = testing::write_tiny_pipeline_config(dir.path(), allow);
  ASSERT_EQ(testing::run_train(1, allowed, 1, dir.path(), "allowed", &out), 0) << out;
  const testing::SampleLogContents got = testing::read_sample_log(dir / "out/actor_logs");
  ASSERT_EQ(got.ids_per_epoch.size(), 2u);
  for (const auto& [epoch, ids] : got.ids_per_epoch) {
    EXPECT_EQ(ids.size(), 120u) << "epoch " << epoch;
    EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), 120u) << "epoch " << epoch;
  }
  // committed steps of 8 rows, then (240 - 8 * committed) rows in steps of 4.
  EXPECT_EQ(optimizer_steps(dir / "out/actor"), committed + (240 - 8 * committed) / 4);
}

}  // namespace
}  // namespace dschat
