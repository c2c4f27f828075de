// The guardian in the policy trainers, through `dschat train` on the tiny pipeline
// (tests/tiny_pipeline.h): step 3 (PPO) with a learning-rate spike that blows the KL to the
// reference up rolls back to its last confirmed snapshot with a lower learning rate and finishes
// with finite weights; the critic-free step with a reward program that pays for length is caught
// exploiting it (answers running to the maximum length) and stopped with a checkpoint and exit
// code 3; the events are in the metrics JSON Lines.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "dschat/io/state_dict.h"
#include "dschat/monitor/guardian.h"
#include "dschat/monitor/metrics_log.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string cli() { return DSCHAT_CLI_PATH; }

std::vector<monitor::MetricsRow> guardian_rows(const fs::path& metrics) {
  std::vector<monitor::MetricsRow> out;
  for (monitor::MetricsRow& row : monitor::read_metrics_jsonl(metrics)) {
    if (row.phase == "guardian") out.push_back(std::move(row));
  }
  return out;
}

void expect_finite_model(const fs::path& dir) {
  for (const auto& [name, value] : io::load_state_dict(dir)) {
    EXPECT_TRUE(torch::isfinite(value).all().item<bool>()) << dir.string() << ": " << name;
  }
}

TEST(GuardianPipeline, PpoLearningRateSpikeBlowsUpTheKlAndIsRolledBack) {
  testing::TempDir tmp;
  const json extra = {
      {"step3",
       {{"actor_learning_rate", 1.0},  // ~1e5 x the demo's: the KL to the reference explodes
        {"guardian",
         {{"snapshot_interval", 1},
          {"lr_factor", 0.001},
          {"kl", {{"limit", 1.0}, {"action", "rollback"}}},
          {"reward_hacking", {{"interval", 0}}}}}}}};
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), extra);
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  EXPECT_NE(out.find("guardian: kl at step"), std::string::npos) << out;
  EXPECT_NE(out.find("guardian: rollback 1 of 3"), std::string::npos) << out;
  const std::vector<monitor::MetricsRow> rows = guardian_rows(tmp / "out/step3_logs/metrics.jsonl");
  int64_t kl_event_step = -1, rollback_to = -1;
  for (const monitor::MetricsRow& row : rows) {
    if (row.values.count("kl") && kl_event_step < 0) {
      kl_event_step = row.step;
      EXPECT_GT(row.values.at("kl"), 1.0);
      EXPECT_EQ(row.values.at("kl_action"), static_cast<double>(monitor::GuardianAction::kRollback));
    }
    if (row.values.count("rollback_to") && rollback_to < 0) {
      rollback_to = static_cast<int64_t>(row.values.at("rollback_to"));
      EXPECT_EQ(row.values.at("lr_multiplier"), 0.001);
    }
  }
  ASSERT_GE(kl_event_step, 2) << "the first step's experience comes from the starting weights";
  // The snapshot of step s is trusted once step s+1 looked healthy: the KL at step k condemns the
  // weights after step k-1, so the rollback goes to step k-2 at the latest.
  EXPECT_GE(rollback_to, 0);
  EXPECT_LE(rollback_to, kl_event_step - 2);
  expect_finite_model(tmp / "out/step3/actor");
  EXPECT_FALSE(fs::exists(tmp / "out/step3_guardian"));
}

// The critic-free step from an SFT model whose answers end after a token, rewarded by a program
// that pays for length (a format check rides along with weight 0, the held-out verifier).
json length_paying_step(const fs::path& program, const fs::path& output_dir, const json& guardian) {
  return {{"num_train_epochs", 1},
          {"output_dir", output_dir.string()},
          {"data", {{"data_split", "4,4,2"}}},
          {"n_samples_per_prompt", 4},
          {"per_device_generation_batch_size", 4},
          {"per_device_training_batch_size", 8},
          {"max_answer_seq_len", 16},
          {"actor_learning_rate", 1e-2},
          {"num_warmup_steps", 0},
          {"experience_sampling", {{"do_sample", true}}},
          {"rewards", json::array({{{"type", "command"}, {"argv", {DSCHAT_PYTHON, program.string()}}},
                                   {{"type", "regex"}, {"pattern", "\\S{1,6}"}, {"weight", 0.0}, {"name", "short"}}})},
          {"guardian", guardian}};
}

TEST(GuardianPipeline, CriticFreeRewardThatPaysForLengthIsCaught) {
  testing::TempDir tmp;
  const fs::path program = tmp / "length_reward.py";
  std::ofstream(program) << "import json, sys\n"
                            "for line in sys.stdin:\n"
                            "    q = json.loads(line)\n"
                            "    print(json.dumps({'reward': len(q['response'])}), flush=True)\n";
  // 1. Answers running to the maximum length: answer_length, made a stop.
  const json rambling = {{"answer_length", {{"action", "stop"}}}, {"reward_hacking", {{"interval", 0}}}};
  const json extra = {{"pipeline", "sft-grpo"},
                      {"step1", {{"num_train_epochs", 6}}},  // answers that end: one token and the eos
                      {"step2_grpo", length_paying_step(program, tmp / "out/grpo", rambling)}};
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), extra);
  std::string out;
  int code = testing::run_command(cli() + " train --config " + config.string() + " --no-progress", &out);
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("guardian: answer_length at step"), std::string::npos) << out;
  EXPECT_NE(out.find("the guardian stopped the run"), std::string::npos) << out;
  std::vector<monitor::MetricsRow> rows = guardian_rows(tmp / "out/grpo_logs/metrics.jsonl");
  ASSERT_FALSE(rows.empty());
  ASSERT_TRUE(rows.back().values.count("answer_length")) << "the stopping event is the last row";
  EXPECT_GE(rows.back().values.at("answer_length"), 16.0 - 0.5);
  // Learned, not inherited: the first step's answers were short.
  EXPECT_GE(rows.back().step, 2);
  for (const monitor::MetricsRow& row : monitor::read_metrics_jsonl(tmp / "out/grpo_logs/metrics.jsonl")) {
    if (row.phase == "grpo" && row.step == 1) EXPECT_LT(row.values.at("answer_len"), 4.0);
  }
  EXPECT_TRUE(fs::exists(tmp / "out/grpo_checkpoints/actor/latest")) << "a stop leaves a checkpoint";
  EXPECT_FALSE(fs::exists(tmp / "out/grpo/training_summary.json"));

  // 2. The same step again from the same SFT model (step 1 is found finished), watched by the
  // held-out check instead: greedy answers to 16 eval prompts scored by the format check, whose
  // score falls while the training reward climbs.
  const json hacking = {{"answer_length", {{"action", "off"}}},
                        {"reward_hacking",
                         {{"action", "stop"}, {"interval", 1}, {"window", 3}, {"min_rise", 1.0}, {"min_drop", 0.1},
                          {"source", "short"}}}};
  json again = testing::tiny_pipeline_json(tmp / "again", extra);
  again["output_dir"] = (tmp / "out").string();
  again["step2_grpo"] = length_paying_step(program, tmp / "out/grpo_hacked", hacking);
  std::ofstream(tmp / "again.json") << again.dump(2);
  code = testing::run_command(cli() + " train --config " + (tmp / "again.json").string() + " --no-progress", &out);
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("Step 1 already finished"), std::string::npos) << out;
  EXPECT_NE(out.find("guardian: reward_hacking at step"), std::string::npos) << out;
  std::vector<double> heldout;
  for (const monitor::MetricsRow& row : monitor::read_metrics_jsonl(tmp / "out/grpo_hacked_logs/metrics.jsonl")) {
    if (row.phase == "heldout") heldout.push_back(row.values.at("score"));
  }
  ASSERT_GE(heldout.size(), 3u);
  EXPECT_GT(heldout.front(), 0.1) << "the SFT model's greedy answers pass the format check";
  EXPECT_LT(heldout.back(), heldout.front() - 0.1);
  rows = guardian_rows(tmp / "out/grpo_hacked_logs/metrics.jsonl");
  ASSERT_FALSE(rows.empty());
  EXPECT_TRUE(rows.back().values.count("reward_hacking"));
}

}  // namespace
}  // namespace dschat
