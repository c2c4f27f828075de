// Resuming on another world size (issue 38): SFT killed on 2 ranks, resumed on 1 rank with the
// same global batch (GAS doubled) continues at the first unseen sample, so it ends with the
// optimizer steps and, within float summation-order tolerance, the weights of an uninterrupted
// 1-rank run; a resume that changes the global batch is refused naming both layouts unless
// elastic_resume is "allow".
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "dist/child_runner.h"
#include "dschat/core/json_file.h"
#include "dschat/io/state_dict.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// 120 SFT rows (the tiny data's step-1 set), one per micro-batch: 2 ranks x GAS 4 and 1 rank x
// GAS 8 both train rows [8s, 8s + 8) of the epoch's order at step s (global batch 8, 15 steps per
// epoch), and with one row per micro-batch the per-row token means add up to the same gradient
// (a larger micro-batch would group the rows differently between the two layouts, and a token
// mean over another group is another number). No dropout: the ranks' random streams differ from a
// single rank's.
json sft_block(int64_t gas) {
  return {{"step1",
           {{"num_train_epochs", 2}, {"per_device_train_batch_size", 1}, {"gradient_accumulation_steps", gas},
            {"dropout", 0.0}, {"checkpoint_interval", 1}, {"keep_checkpoints", 0}, {"guardian", {{"enabled", false}}}}}};
}

std::string train(const fs::path& config, const std::string& extra = "") {
  return std::string(DSCHAT_CLI_PATH) + " train --config " + config.string() + " --step 1 --no-progress" + extra;
}

// SIGKILLs every process whose command line mentions `tag` (the launcher and its ranks).
void kill_all(const std::string& tag) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (testing::read_text(entry.path() / "cmdline").find(tag) != std::string::npos) {
      kill(static_cast<pid_t>(std::stoi(name)), SIGKILL);
    }
  }
}

int64_t optimizer_steps(const fs::path& actor) {
  return core::read_json_file((actor / "training_summary.json").string()).at("optimizer_steps").get<int64_t>();
}

TEST(ElasticResumeMultiproc, TwoRanksKilledThenOneRankContinuesAtTheFirstUnseenSample) {
  testing::TempDir straight, elastic;
  std::string out;
  // The reference: 1 rank x GAS 8 from the start.
  const fs::path reference = testing::write_tiny_pipeline_config(straight.path(), sft_block(8));
  ASSERT_EQ(testing::run_command(train(reference), &out), 0) << out;

  // 2 ranks x GAS 4, killed (launcher and ranks) once a few checkpoints are committed.
  const fs::path two_ranks = testing::write_tiny_pipeline_config(elastic.path(), sft_block(4));
  {
    const std::string cli = DSCHAT_CLI_PATH;
    testing::Process job({cli, "launch", "--nproc-per-node", "2", "--master-port",
                          std::to_string(testing::free_port()), "--", cli, "train", "--config", two_ranks.string(),
                          "--step", "1", "--no-progress"},
                         {"OMP_NUM_THREADS=1"}, elastic / "launch.out", elastic / "launch.err");
    const fs::path latest = elastic / "out/actor_checkpoints/latest";
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(240);
    const auto committed_steps = [&] {  // "global_step<N>" -> N
      const std::string tag = fs::exists(latest) ? testing::read_text(latest) : "";
      return tag.size() > 11 ? std::stoll(tag.substr(11)) : 0LL;
    };
    while (job.running() && std::chrono::steady_clock::now() < give_up && committed_steps() < 5) {
      job.wait_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(job.running()) << "the 2-rank run ended before it could be killed\n" << job.err();
    kill_all(two_ranks.string());
    ASSERT_TRUE(job.wait_for(std::chrono::seconds(30))) << job.err();
  }
  ASSERT_FALSE(fs::exists(elastic / "out/actor")) << "killed before the end";

  // Another global batch (1 rank x GAS 4 = 4): refused, naming both layouts; nothing changes.
  const fs::path smaller = testing::write_tiny_pipeline_config(elastic.path(), sft_block(4));
  EXPECT_NE(testing::run_command(train(smaller), &out), 0) << out;
  EXPECT_NE(out.find("the checkpoint was written by 2 ranks x 1 rows x GAS 4 (global batch 8) and this run is "
                     "1 rank x 1 rows x GAS 4 (global batch 4)"),
            std::string::npos)
      << out;

  // 1 rank x GAS 8: the same global batch, so the run continues exactly.
  const fs::path one_rank = testing::write_tiny_pipeline_config(elastic.path(), sft_block(8));
  ASSERT_EQ(testing::run_command(train(one_rank), &out), 0) << out;
  EXPECT_NE(out.find("resuming on 1 rank x 1 rows x GAS 8 (global batch 8) from a checkpoint of 2 ranks x 1 rows x "
                     "GAS 4 (global batch 8)"),
            std::string::npos)
      << out;
  EXPECT_EQ(optimizer_steps(elastic / "out/actor"), optimizer_steps(straight / "out/actor"));
  EXPECT_EQ(optimizer_steps(straight / "out/actor"), 30);  // 2 epochs x 15 steps
  const io::TensorMap resumed = io::load_state_dict(elastic / "out/actor");
  const io::TensorMap uninterrupted = io::load_state_dict(straight / "out/actor");
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (const auto& [name, tensor] : uninterrupted) {
    // Two ranks average their accumulated gradients where one rank accumulates all eight rows:
    // the same sum in another order, so float rounding alone separates the two runs.
    EXPECT_LT(testing::max_abs_diff(resumed.at(name), tensor), 2e-4) << name;
  }
}

}  // namespace
}  // namespace dschat
