#pragma once
// `dschat train` on the demo's tiny random model and a small slice of demo-format data, for the
// tests that run whole pipelines: seconds per run on the CPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "rank_jobs.h"  // free_port
#include "test_util.h"

namespace dschat {
namespace testing {

/// Demo-format data small enough for seconds (`dschat make-demo-data`): 24 SFT records, 48 pairs,
/// 48 prompts with the 2,4,4 split. Returns <dir>/data.
inline std::filesystem::path make_tiny_demo_data(const std::filesystem::path& dir) {
  std::string out;
  EXPECT_EQ(run_command(std::string(DSCHAT_CLI_PATH) + " make-demo-data --out " + (dir / "data").string() +
                            " --seed 7 --train 120 --eval 24",
                        &out),
            0)
      << out;
  return dir / "data";
}

/// The demo preset with one epoch per step, batches of 8 and a checkpoint after every PPO step,
/// on the data above, writing into <dir>/out; `extra` is merged over it (JSON merge patch).
inline nlohmann::json tiny_pipeline_json(const std::filesystem::path& dir,
                                         const nlohmann::json& extra = nlohmann::json::object()) {
  const std::filesystem::path data = make_tiny_demo_data(dir);
  nlohmann::json config = {
      {"preset", "demo"},
      {"description", "tiny pipeline (tests)"},
      {"demo_report", false},
      {"output_dir", (dir / "out").string()},
      {"data", {{"local_jsonfile_dir", data.string()}, {"data_split", "2,4,4"}}},
      {"step1",
       {{"num_train_epochs", 1},
        {"per_device_train_batch_size", 8},
        {"per_device_eval_batch_size", 8},
        {"data", {{"local_jsonfile_dir", (data / "sft").string()}}}}},
      {"step2", {{"num_train_epochs", 1}, {"per_device_train_batch_size", 8}, {"per_device_eval_batch_size", 8}}},
      {"step3",
       {{"num_train_epochs", 1},
        {"per_device_generation_batch_size", 8},
        {"per_device_training_batch_size", 8},
        {"checkpoint_interval", 1},
        {"num_warmup_steps", 0},
        // One epoch on a few dozen pairs leaves the reward model near chance (accuracy ~0.5 on
        // its 24 eval pairs), which the default gate refuses; the gate still runs and reports.
        {"reward_gate", {{"action", "warn"}}}}}};
  config.merge_patch(extra);
  return config;
}

/// tiny_pipeline_json written to <dir>/config.json (for `dschat train --config`).
inline std::filesystem::path write_tiny_pipeline_config(const std::filesystem::path& dir,
                                                        const nlohmann::json& extra = nlohmann::json::object()) {
  const std::filesystem::path file = dir / "config.json";
  std::ofstream(file) << tiny_pipeline_json(dir, extra).dump(2);
  return file;
}

/// A config whose step 3 (PPO) starts from steps 1 and 2's outputs in `trained` (actor, reward)
/// and writes to `out`: both models at ZeRO-3, batches of 4, test mode stopping after 2 steps, the
/// EMA on, the guardian off; `step3_extra` is merged over the step3 block.
inline nlohmann::json zero3_step3_config(const std::filesystem::path& trained, const std::filesystem::path& out,
                                         const nlohmann::json& step3_extra) {
  nlohmann::json step3 = {{"actor_model_name_or_path", (trained / "actor").string()},
                          {"critic_model_name_or_path", (trained / "reward").string()},
                          {"actor_zero_stage", 3},
                          {"critic_zero_stage", 3},
                          {"per_device_generation_batch_size", 4},
                          {"per_device_training_batch_size", 4},
                          {"enable_test_mode", true},
                          {"test_stop_step", 2},
                          {"enable_ema", true},
                          {"guardian", {{"enabled", false}}}};
  step3.merge_patch(step3_extra);
  return {{"output_dir", out.string()}, {"step3", step3}};
}

/// `dschat launch` of two local ranks on a free port, ready for the dschat subcommand to append.
/// Never the default port 29500: ctest runs the multi-process shards side by side, and two jobs
/// on one port fail with EADDRINUSE.
inline std::string two_rank_launch() {
  const std::string cli = DSCHAT_CLI_PATH;
  return cli + " launch --nproc-per-node 2 --master-port " + std::to_string(free_port()) + " -- " + cli;
}

}  // namespace testing
}  // namespace dschat
