// DeepSpeed-Chat's nightly step-3 matrix (tests/test_training.py: ZeRO {2, 3} x hybrid engine x
// offload x actor LoRA, test mode stopping after a few steps, z2 + HE + offload without LoRA
// skipped as upstream refuses it) on a tiny random OPT on the CPU, through run_ppo. Each case
// checks that the steps ran, the losses are finite, the actor changed and the saved models load.
#include <gtest/gtest.h>

#include <cmath>

#include "dschat/data/demo_task.h"
#include "dschat/models/load_save.h"
#include "dschat/io/state_dict.h"
#include "dschat/rlhf/ppo_trainer.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;

struct MatrixCase {
  int zero;
  bool hybrid, offload, lora;
};

std::string case_name(const MatrixCase& c) {
  return "z" + std::to_string(c.zero) + (c.hybrid ? "_he" : "_nohe") + (c.offload ? "_offload" : "") +
         (c.lora ? "_lora" : "");
}

// A step-1 and a step-2 model (random weights, the demo's shape and tokenizer) and demo data.
void make_inputs(const fs::path& dir) {
  const fs::path shape = testing::source_dir() / "assets/demo-opt";
  models::LoadOptions random;
  random.random_init = true;
  torch::manual_seed(5);
  auto actor = models::load_causal_lm(shape.string(), random);
  models::save_causal_lm(actor, dir / "actor");
  auto critic = models::load_value_model(shape.string(), random);
  models::save_value_model(critic, dir / "reward");
  for (const char* file : {"vocab.json", "merges.txt"}) {
    fs::copy_file(shape / file, dir / "actor" / file);
    fs::copy_file(shape / file, dir / "reward" / file);
  }
  data::write_demo_dataset(dir / "data", 11, 80, 10);
}

void run_case(const fs::path& dir, const MatrixCase& c) {
  SCOPED_TRACE(case_name(c));
  const fs::path out = dir / case_name(c);
  nlohmann::json json = {{"actor_model_name_or_path", (dir / "actor").string()},
                         {"critic_model_name_or_path", (dir / "reward").string()},
                         {"data", {{"data_path", {"local/jsonfile"}},
                                   {"local_jsonfile_dir", (dir / "data").string()},
                                   {"data_output_path", ""}}},
                         {"dtype", "fp32"},
                         {"per_device_generation_batch_size", 4},
                         {"per_device_training_batch_size", 4},
                         {"max_prompt_seq_len", 24},
                         {"max_answer_seq_len", 4},
                         {"min_answer_tokens", 1},
                         {"actor_learning_rate", 1e-3},
                         {"critic_learning_rate", 1e-3},
                         {"num_warmup_steps", 0},
                         {"actor_zero_stage", c.zero},
                         {"critic_zero_stage", c.zero},
                         {"enable_hybrid_engine", c.hybrid},
                         {"offload", c.offload},
                         {"actor_lora_dim", c.lora ? 4 : 0},
                         {"actor_lora_module_name", "decoder.layers."},
                         {"enable_ema", true},
                         {"enable_test_mode", true},
                         {"test_stop_step", 2},
                         {"print_interval", 1},
                         {"output_dir", out.string()},
                         {"experience_sampling", {{"do_sample", true}}}};
  rlhf::PpoConfig config = rlhf::parse_ppo_config(json, case_name(c));
  rlhf::StepContext context;
  context.progress = false;
  const rlhf::PpoResult result = rlhf::run_ppo(config, context);
  EXPECT_EQ(result.steps, 2);
  for (double r : result.step_rewards) EXPECT_TRUE(std::isfinite(r));
  for (const char* part : {"actor", "critic", "actor_ema"}) EXPECT_TRUE(fs::exists(out / part / "config.json")) << part;
  const io::TensorMap before = io::load_state_dict(dir / "actor"), after = io::load_state_dict(out / "actor");
  EXPECT_GT(testing::max_abs_diff(before.at("model.decoder.layers.0.fc1.weight"),
                                  after.at("model.decoder.layers.0.fc1.weight")),
            0.0);
  for (const auto& item : after) EXPECT_EQ(item.first.find("lora"), std::string::npos) << item.first;
  models::load_value_model((out / "critic").string());
}

std::vector<MatrixCase> matrix() {
  std::vector<MatrixCase> cases;
  for (int zero : {2, 3}) {
    for (bool hybrid : {false, true}) {
      for (bool offload : {false, true}) {
        for (bool lora : {false, true}) {
          if (zero == 2 && hybrid && offload && !lora) continue;  // refused upstream (unstable)
          cases.push_back({zero, hybrid, offload, lora});
        }
      }
    }
  }
  return cases;
}

// One process for the 15 cases (a ctest process each cost CI a minute of start-up and model saving).
TEST(PpoMatrix, DeepSpeedChatSweepRunsTestModeSteps) {
  testing::TempDir dir;
  make_inputs(dir.path());
  for (const MatrixCase& c : matrix()) run_case(dir.path(), c);
}

TEST(PpoConfigRules, RefusesTheUnstableZeroTwoCombination) {
  nlohmann::json json = {{"actor_model_name_or_path", "a"}, {"critic_model_name_or_path", "c"},
                         {"actor_zero_stage", 2},           {"critic_zero_stage", 2},
                         {"enable_hybrid_engine", true},    {"offload", true}};
  EXPECT_THROW(rlhf::parse_ppo_config(json, "matrix"), core::ConfigError);
}

}  // namespace
}  // namespace dschat
