// The critic-free step through the CLI and the library on the tiny pipeline (tests/tiny_pipeline.h):
// `dschat train --pipeline sft-grpo` trains step 1, then GRPO from its model with the demo task's
// checker and a format regex as rewards, logs, saves a model that loads, and after a kill resumes
// to a bit-identical model; RLOO with a reward program and exact match, and REINFORCE++ with a
// KL penalty and dynamic sampling, run through `dschat grpo`; a C++ callback is a reward source
// (with the EMA and LoRA on),
// and a failing one stops the step before any update; two ranks at ZeRO-2 and ZeRO-3.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "core/json_object.h"
#include "dschat/core/json_file.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/trainers/critic_free_trainer.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string cli() { return DSCHAT_CLI_PATH; }

// Six steps of 4 prompts (24 prompts: a fifth of the tiny data as phase 3) with 4 answers each.
// The tiny actor's answers are near-uniform random tokens: a reward that random text earns only
// rarely (a whole answer of [a-z0-9]) leaves most groups with equal rewards, so whether anything
// trains would hang on the sampling seed. An "e" somewhere in 4 random GPT-2 tokens is a coin
// flip-like event: most groups of 4 get different rewards.
constexpr const char* kFrequentPattern = "[^]*e[^]*";

json grpo_blocks(const std::string& pipeline, json step) {
  json base = {{"num_train_epochs", 1},
               {"data", {{"data_split", "4,4,2"}}},
               {"n_samples_per_prompt", 4},
               {"per_device_generation_batch_size", 4},
               {"per_device_training_batch_size", 8},
               {"checkpoint_interval", 1},
               {"actor_learning_rate", 1e-3},
               {"num_warmup_steps", 0},
               {"rewards", json::array({{{"type", "demo_task"}}, {{"type", "regex"}, {"pattern", kFrequentPattern}, {"weight", 0.1}}})}};
  base.merge_patch(step);
  return {{"pipeline", pipeline}, {"step2_grpo", base}};
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

json summary(const fs::path& dir) { return core::read_json_file((dir / "training_summary.json").string()); }

void expect_same_model(const fs::path& a, const fs::path& b) {
  const io::TensorMap x = io::load_state_dict(a), y = io::load_state_dict(b);
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, value] : x) EXPECT_TRUE(torch::equal(y.at(name), value)) << name;
}

void expect_trained(const fs::path& grpo, const fs::path& sft) {
  SCOPED_TRACE(grpo.string());
  const io::TensorMap trained = io::load_state_dict(grpo), start = io::load_state_dict(sft);
  EXPECT_GT(testing::max_abs_diff(trained.at("model.decoder.layers.0.fc1.weight"),
                                  start.at("model.decoder.layers.0.fc1.weight")),
            0.0);
}

TEST(GrpoPipeline, SftThenGrpoTrainsLogsSavesAndResumesAfterAKill) {
  testing::TempDir straight, killed;
  const json blocks = grpo_blocks("sft-grpo", json::object());
  const fs::path config = testing::write_tiny_pipeline_config(straight.path(), blocks);
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  for (const char* line : {"---=== Running Step 2 ===---", "| grpo | Loss: ", "(group std ", "| Entropy: "}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
  }
  const json s = summary(straight / "out/grpo");
  const int64_t steps = s.at("steps").get<int64_t>();
  EXPECT_GE(steps, 3);
  ASSERT_EQ(s.at("step_rewards").size(), static_cast<size_t>(steps));
  for (const json& r : s.at("step_rewards")) EXPECT_TRUE(std::isfinite(r.get<double>()));
  EXPECT_TRUE(s.at("source_means").contains("demo_task") && s.at("source_means").contains("regex")) << s.dump();
  const std::string metrics = read_text(straight / "out/grpo_logs/metrics.jsonl");
  for (const char* key : {"\"reward_group_std\"", "\"entropy\"", "\"clip_frac\"", "\"answer_len\"", "\"source_regex\""}) {
    EXPECT_NE(metrics.find(key), std::string::npos) << key;
  }
  auto model = models::load_causal_lm((straight / "out/grpo/actor").string());
  expect_trained(straight / "out/grpo/actor", straight / "out/actor");

  // The same run, killed once GRPO has committed its third checkpoint, then the same command.
  const fs::path again = testing::write_tiny_pipeline_config(killed.path(), blocks);
  const std::string run = cli() + " train --config " + again.string() + " --no-progress";
  const int status = testing::run_command(
      "bash -c '" + run + " > " + (killed / "first.log").string() + " 2>&1 & pid=$!; for i in $(seq 1200); do " +
          "grep -qE \"global_step([3-9]|[1-9][0-9])$\" " + (killed / "out/grpo_checkpoints/actor/latest").string() +
          " 2>/dev/null && break; sleep 0.05; done; kill -9 $pid; wait $pid'",
      &out);
  ASSERT_NE(status, 0) << "the run finished before it could be killed\n" << out;
  ASSERT_FALSE(fs::exists(killed / "out/grpo/training_summary.json"));
  ASSERT_EQ(testing::run_command(run, &out), 0) << out;
  EXPECT_NE(out.find("Step 1 already finished"), std::string::npos) << out;
  EXPECT_NE(out.find("step 2 (grpo): resuming from"), std::string::npos) << out;
  expect_same_model(straight / "out/grpo/actor", killed / "out/grpo/actor");
  EXPECT_EQ(summary(killed / "out/grpo")["step_rewards"], s["step_rewards"]);
}


TEST(GrpoPipeline, RlooWithAProgramAndReinforceWithKlAndDynamicSamplingThroughTheGrpoCommand) {
  testing::TempDir tmp;
  const fs::path program = tmp / "verify.py";
  std::ofstream(program) << "import json, sys\n"
                            "for line in sys.stdin:\n"
                            "    q = json.loads(line)\n"
                            "    ok = q['response'].strip() == q['meta'].get('chosen')\n"
                            "    print(json.dumps({'reward': 1.0 if ok else 0.0}), flush=True)\n";
  json rloo = grpo_blocks("sft-rloo", {{"rewards", json::array({{{"type", "command"}, {"argv", {DSCHAT_PYTHON, program.string()}}},
                                                               {{"type", "exact_match"}, {"weight", 0.5}},
                                                               {{"type", "regex"}, {"pattern", kFrequentPattern}, {"weight", 0.1}},
                                                               {{"type", "demo_task"}}})}});
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), rloo);
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  json s = summary(tmp / "out/grpo");
  EXPECT_GE(s.at("steps").get<int64_t>(), 3);
  // The program and exact match agree on every answer (the same check), so their means match.
  EXPECT_DOUBLE_EQ(s["source_means"]["command"].get<double>(), s["source_means"]["exact_match"].get<double>());
  // The KL penalty's reference was loaded and the policy moved away from it (k1 may be negative).
  EXPECT_NE(s.at("mean_kl").get<double>(), 0.0);
  expect_trained(tmp / "out/grpo/actor", tmp / "out/actor");

  // REINFORCE++ from the same step-1 model, via `dschat grpo` (the estimator named in the block),
  // its rollouts generated by the continuous engine (hybrid_engine.continuous_batching).
  json reinforce = core::read_json_file(config.string());
  reinforce.erase("pipeline");
  reinforce["step2_grpo"] = grpo_blocks("", {{"advantage_estimator", "reinforce_pp"},
                                             {"kl_coef", 0.05},
                                             {"dynamic_sampling", true},
                                             {"dynamic_sampling_max_batches", 2},
                                             {"continuous_batching", true},  // rollouts through the ContinuousEngine
                                             {"rewards", json::array({{{"type", "regex"}, {"pattern", kFrequentPattern}}})},
                                             {"output_dir", (tmp / "out/reinforce").string()}})["step2_grpo"];
  std::ofstream(tmp / "reinforce.json") << reinforce.dump(2);
  ASSERT_EQ(testing::run_command(cli() + " grpo --config " + (tmp / "reinforce.json").string() + " --no-progress", &out),
            0)
      << out;
  EXPECT_NE(out.find("| reinforce_pp | Loss: "), std::string::npos) << out;
  EXPECT_NE(out.find("| Groups kept: "), std::string::npos) << out;
  s = summary(tmp / "out/reinforce");
  EXPECT_GE(s.at("steps").get<int64_t>(), 1);
  EXPECT_GE(s.at("dropped_groups").get<int64_t>(), 0);
  expect_trained(tmp / "out/reinforce/actor", tmp / "out/actor");
}

// The library: a C++ callback as a reward source, and a callback that fails on the second step
// stops the step with its name, leaving no output model and the first step's checkpoint.
TEST(GrpoPipeline, ACallbackRewardAndAFailingOneStopsTheStepBeforeItsUpdate) {
  testing::TempDir tmp;
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), grpo_blocks("sft-grpo", json::object()));
  std::string out;
  ASSERT_EQ(testing::run_command(cli() + " sft --config " + config.string() + " --no-progress", &out), 0) << out;
  json file = core::read_json_file(config.string());
  file.erase("preset");  // what `dschat train` merges it over:
  rlhf::PipelineConfig pipeline = rlhf::parse_pipeline_config(rlhf::merge_config(rlhf::demo_config(), file), "config.json");
  rlhf::GrpoConfig grpo = pipeline.step2_grpo;
  grpo.common.guardian.heldout_interval = 0;  // the callback is called by the training steps only
  grpo.rewards.clear();
  rlhf::RewardSourceConfig callback;
  callback.type = rlhf::RewardSourceType::kCallback;
  callback.name = "shorter_is_better";
  grpo.rewards.push_back(callback);
  rlhf::StepContext context;
  context.progress = false;
  int calls = 0;
  context.reward_callbacks["shorter_is_better"] = [&](const std::vector<rlhf::RewardQuery>& q) {
    ++calls;
    std::vector<double> out;
    for (const auto& x : q) out.push_back(-static_cast<double>(x.response.size()));
    return out;
  };
  grpo.common.gradient_accumulation_steps = 3;  // 16 answers in micro-batches of 8: 2 per pass
  EXPECT_THROW_WITH(rlhf::run_grpo(grpo, context), core::ConfigError,
                    "gradient_accumulation_steps 3 must divide the micro-batches of a pass, 2");
  grpo.common.gradient_accumulation_steps = 1;
  grpo.enable_ema = true;   // and the EMA actor and LoRA adapters, as PPO has them
  grpo.actor.lora_dim = 4;
  const rlhf::GrpoResult result = rlhf::run_grpo(grpo, context);
  EXPECT_EQ(calls, result.steps);
  EXPECT_TRUE(fs::exists(fs::path(grpo.output_dir) / "actor/config.json"));
  EXPECT_TRUE(fs::exists(fs::path(grpo.output_dir) / "actor_ema/config.json"));
  auto fused = models::load_causal_lm((fs::path(grpo.output_dir) / "actor").string());  // LoRA fused on save
  grpo.enable_ema = false;
  grpo.actor.lora_dim = 0;

  grpo.output_dir = (tmp / "out/failing").string();
  calls = 0;
  context.reward_callbacks["shorter_is_better"] = [&](const std::vector<rlhf::RewardQuery>& q) {
    if (++calls == 2) return std::vector<double>(q.size(), std::nan(""));
    return std::vector<double>(q.size(), 1.0);
  };
  EXPECT_THROW_WITH(rlhf::run_grpo(grpo, context), core::InvalidArgument,
                    "reward source 'shorter_is_better' (callback) returned nan");
  EXPECT_FALSE(fs::exists(tmp / "out/failing/training_summary.json"));
  EXPECT_EQ(read_text(tmp / "out/failing_checkpoints/actor/latest").substr(0, 12), "global_step1")
      << "the failed step must leave the first step's checkpoint as the latest";
}

// Two ranks: step 1 at ZeRO-2, GRPO (with a KL loss to the reference) at ZeRO-2, then REINFORCE++
// (its KL per token in the reward, its advantages normalised over both ranks' answers) at ZeRO-3.
TEST(GrpoPipelineMultiproc, TwoRanksAtZeroTwoAndThree) {
  testing::TempDir tmp;
  json blocks = grpo_blocks("sft-grpo", {{"actor_zero_stage", 2},
                                        {"kl_coef", 0.05},
                                        {"scale_rewards", "batch"},
                                        {"data", {{"data_split", "6,1,3"}}}});
  blocks["step1"] = {{"zero_stage", 2}};
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), blocks);
  const std::string launch = testing::two_rank_launch();
  std::string out;
  ASSERT_EQ(testing::run_command(launch + " train --config " + config.string() + " --no-progress", &out), 0) << out;
  const json two = summary(tmp / "out/grpo");
  EXPECT_GE(two.at("steps").get<int64_t>(), 1);
  expect_trained(tmp / "out/grpo/actor", tmp / "out/actor");

  json stage3 = core::read_json_file(config.string());
  stage3["step2_grpo"]["actor_zero_stage"] = 3;
  stage3["step2_grpo"]["advantage_estimator"] = "reinforce_pp";
  stage3["pipeline"] = "sft-reinforce_pp";
  stage3["step2_grpo"].erase("scale_rewards");
  stage3["step2_grpo"]["output_dir"] = (tmp / "out/grpo3").string();
  std::ofstream(tmp / "stage3.json") << stage3.dump(2);
  ASSERT_EQ(testing::run_command(launch + " grpo --config " + (tmp / "stage3.json").string() + " --no-progress", &out),
            0)
      << out;
  const json three = summary(tmp / "out/grpo3");
  EXPECT_EQ(three.at("steps"), two.at("steps"));
  EXPECT_NE(out.find("| reinforce_pp | Loss: "), std::string::npos) << out;
  // The same samples (same seeds and weights at the first step): the first step's rewards agree.
  EXPECT_NEAR(three["step_rewards"][0].get<double>(), two["step_rewards"][0].get<double>(), 1e-6);
  auto model = models::load_causal_lm((tmp / "out/grpo3/actor").string());
}

}  // namespace
}  // namespace dschat
