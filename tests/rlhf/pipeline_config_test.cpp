// The typed pipeline config: DS-Chat's defaults, the compiled-in presets against the reference's
// script tables (deepspeed-chat-app.md §2-§4), error messages, merge patch, and path chaining.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/trainers/critic_free_support.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;
using rlhf::parse_pipeline_config;

rlhf::PipelineConfig parse_preset(const std::string& deployment, const std::string& actor, const std::string& reward) {
  return parse_pipeline_config(rlhf::merge_config(rlhf::preset_config(deployment, actor, reward), json::object()),
                               deployment + " preset");
}

TEST(PipelineConfig, EmptyBlocksGiveDeepSpeedChatDefaults) {
  rlhf::PipelineConfig c = parse_pipeline_config(json::object(), "empty.json");
  EXPECT_EQ(c.actor_model, "facebook/opt-1.3b");
  EXPECT_EQ(c.reward_model, "facebook/opt-350m");
  EXPECT_EQ(c.deployment, "single_gpu");
  EXPECT_EQ(c.steps, (std::vector<int>{1, 2, 3}));

  const rlhf::SftConfig& s1 = c.step1;
  EXPECT_EQ(s1.data.data_path, (std::vector<std::string>{"Dahoas/rm-static"}));
  EXPECT_EQ(s1.data.data_split, "2,4,4");
  EXPECT_EQ(s1.data.data_output_path, "/tmp/data_files");
  EXPECT_DOUBLE_EQ(s1.data.unsup_coef, 27.8);
  EXPECT_EQ(s1.per_device_train_batch_size, 16);
  EXPECT_EQ(s1.per_device_eval_batch_size, 16);
  EXPECT_EQ(s1.max_seq_len, 512);
  EXPECT_DOUBLE_EQ(s1.model.learning_rate, 1e-3);
  EXPECT_DOUBLE_EQ(s1.model.weight_decay, 0.0);
  EXPECT_EQ(s1.common.num_train_epochs, 1);
  EXPECT_EQ(s1.common.gradient_accumulation_steps, 1);
  EXPECT_EQ(s1.common.lr_scheduler_type, "cosine");
  EXPECT_EQ(s1.common.num_warmup_steps, 0);
  EXPECT_EQ(s1.common.seed, 1234u);
  EXPECT_EQ(s1.common.dtype, torch::kHalf);
  EXPECT_EQ(s1.model.zero_stage, 0);
  EXPECT_EQ(s1.model.lora_dim, 0);
  EXPECT_EQ(s1.model.lora_module_name, "decoder.layers.");
  EXPECT_DOUBLE_EQ(s1.model.lora_learning_rate, 5e-4);
  EXPECT_FALSE(s1.model.dropout.has_value());
  EXPECT_FALSE(s1.model.gradient_checkpointing);
  EXPECT_EQ(s1.eot_token, "<|endoftext|>");

  const rlhf::RewardConfig& s2 = c.step2;
  EXPECT_DOUBLE_EQ(s2.model.learning_rate, 5e-5);
  EXPECT_FALSE(s2.num_padding_at_beginning.has_value());  // ours: from the tokenizer
  EXPECT_EQ(s2.eval_interval, 0);
  EXPECT_EQ(s2.eval_iters, 100);
  EXPECT_EQ(s2.common.seed, 1234u);

  const rlhf::PpoConfig& s3 = c.step3;
  EXPECT_DOUBLE_EQ(s3.actor.learning_rate, 9.65e-6);
  EXPECT_DOUBLE_EQ(s3.critic.learning_rate, 5e-6);
  EXPECT_EQ(s3.common.num_warmup_steps, 100);
  EXPECT_EQ(s3.common.seed, 1234u);  // DS-Chat: None (docs/config.md)
  EXPECT_EQ(s3.num_padding_at_beginning, 1);
  EXPECT_EQ(s3.per_device_generation_batch_size, 16);
  EXPECT_EQ(s3.per_device_training_batch_size, 16);
  EXPECT_EQ(s3.generation_batches, 1);
  EXPECT_EQ(s3.ppo_epochs, 1);
  EXPECT_EQ(s3.max_prompt_seq_len, 256);
  EXPECT_EQ(s3.max_answer_seq_len, 256);
  EXPECT_EQ(s3.inference_tp_size, 1);
  EXPECT_EQ(s3.tp_gather_partition_size, 8);
  EXPECT_FALSE(s3.enable_hybrid_engine);
  EXPECT_DOUBLE_EQ(s3.constants.kl_ctl, 0.1);
  EXPECT_DOUBLE_EQ(s3.constants.lam, 0.95);
  EXPECT_FALSE(s3.sampling.do_sample);
  EXPECT_EQ(s3.min_answer_tokens, 2);  // DS-Chat drops answers with valid_len <= 1
  EXPECT_DOUBLE_EQ(s3.actor.lora_learning_rate, 5e-4);
  EXPECT_DOUBLE_EQ(s3.critic.lora_learning_rate, 5e-4);
}

TEST(PipelineConfig, EveryPresetParses) {
  // The combinations e2e_rlhf.py can reach (plus llama-2-7b): steps 1/3 by actor, 2 by reward.
  std::set<std::string> covered;
  std::map<std::string, std::map<int, std::set<std::string>>> table;
  for (const auto& name : rlhf::preset_names()) {
    std::filesystem::path p(name);
    table[p.begin()->string()][std::next(p.begin())->string().back() - '0'].insert(p.stem().string());
  }
  ASSERT_EQ(table.size(), 3u);
  for (const auto& [deployment, steps] : table) {
    for (const auto& actor : steps.at(1)) {
      if (!steps.at(3).count(actor)) continue;
      for (const auto& reward : steps.at(2)) {
        SCOPED_TRACE(deployment + " " + actor + " " + reward);
        EXPECT_NO_THROW(parse_preset(deployment, actor, reward));
        covered.insert(deployment + "/step1/" + actor + ".json");
        covered.insert(deployment + "/step2/" + reward + ".json");
        covered.insert(deployment + "/step3/" + actor + ".json");
      }
    }
  }
  std::vector<std::string> names = rlhf::preset_names();
  EXPECT_EQ(covered, std::set<std::string>(names.begin(), names.end()));
  // Every preset file under configs/<deployment>/ in the source tree is compiled in.
  size_t on_disk = 0;
  // (The loose files at the top, demo.json and demo-grpo.json, are not presets.)
  const std::filesystem::path configs = testing::source_dir() / "configs";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(configs)) {
    if (entry.path().extension() == ".json" && entry.path().parent_path() != configs) ++on_disk;
  }
  EXPECT_EQ(on_disk, names.size());
}

TEST(PipelineConfig, PresetValuesMatchTheScripts) {
  rlhf::PipelineConfig n13 = parse_preset("single_node", "facebook/opt-13b", "facebook/opt-350m");
  EXPECT_EQ(n13.step3.inference_tp_size, 2);
  EXPECT_EQ(n13.step3.actor.lora_dim, 128);
  EXPECT_DOUBLE_EQ(n13.step3.actor.learning_rate, 5e-4);
  EXPECT_EQ(n13.step3.per_device_generation_batch_size, 16);
  EXPECT_EQ(n13.step3.per_device_training_batch_size, 16);
  EXPECT_EQ(n13.step3.actor.zero_stage, 3);
  EXPECT_EQ(n13.step1.per_device_train_batch_size, 4);
  EXPECT_DOUBLE_EQ(n13.step1.model.learning_rate, 1e-4);
  EXPECT_EQ(n13.step1.data.data_path.size(), 4u);
  EXPECT_EQ(n13.step2.per_device_train_batch_size, 4);
  EXPECT_EQ(n13.step2.num_padding_at_beginning, 1);
  EXPECT_EQ(n13.step2.model.dropout, 0.0);

  rlhf::PipelineConfig g = parse_preset("single_gpu", "opt-1.3b", "350m");
  EXPECT_EQ(g.actor_model, "opt-1.3b");
  EXPECT_EQ(g.reward_model, "facebook/opt-350m");  // a bare size names DS-Chat's checkpoint
  EXPECT_EQ(g.step1.common.gradient_accumulation_steps, 8);
  EXPECT_EQ(g.step1.model.lora_dim, 128);
  EXPECT_EQ(g.step2.common.gradient_accumulation_steps, 4);
  EXPECT_DOUBLE_EQ(g.step2.model.weight_decay, 0.1);
  EXPECT_EQ(g.step3.common.gradient_accumulation_steps, 2);
  EXPECT_TRUE(g.step3.enable_hybrid_engine);
  EXPECT_TRUE(g.step3.actor.gradient_checkpointing);
  EXPECT_FALSE(g.step3.enable_ema);

  rlhf::PipelineConfig m = parse_preset("multi_node", "facebook/opt-66b", "facebook/opt-350m");
  EXPECT_EQ(m.step3.inference_tp_size, 8);
  EXPECT_EQ(m.step3.tp_gather_partition_size, 4);
  EXPECT_EQ(m.step1.common.num_train_epochs, 2);
  EXPECT_EQ(m.step2.per_device_train_batch_size, 2);

  rlhf::PipelineConfig n1 = parse_preset("single_node", "opt-1.3b", "opt-350m");
  EXPECT_TRUE(n1.step3.enable_ema);
  EXPECT_EQ(n1.step3.actor.zero_stage, 2);
  EXPECT_EQ(n1.step1.common.num_train_epochs, 16);

  rlhf::PipelineConfig l = parse_preset("single_node", "meta-llama/Llama-2-7b-hf", "llama-2-7b");
  EXPECT_EQ(l.step2.num_padding_at_beginning, 0);
  EXPECT_TRUE(l.step3.offload_reference_model);
  EXPECT_EQ(l.step3.per_device_generation_batch_size, 1);
}

TEST(PipelineConfig, UnknownPresetListsTheCombinations) {
  EXPECT_THROW_WITH(rlhf::preset_config("single_gpu", "opt-13b", "opt-350m"), core::ConfigError,
                    "single_node: step1 {llama-2-7b, opt-1.3b, opt-13b, opt-6.7b}");
  EXPECT_THROW_WITH(rlhf::preset_config("cluster", "opt-1.3b", "opt-350m"), core::ConfigError,
                    "single_gpu: step1 {opt-1.3b} step2 {opt-350m} step3 {opt-1.3b}");
}

// A model directory of the user's own is trained with the deployment's nearest script however far
// its size (the bundled tiny OPT on single_gpu: OPT-1.3B's), the distance said in the description;
// a preset name beyond 4x stays an error (above).
TEST(PipelineConfig, AnyModelDirectoryTakesTheDeploymentsNearestScript) {
  const std::string tiny = (testing::source_dir() / "assets" / "tiny-opt").string();
  json c = rlhf::preset_config("single_gpu", tiny, tiny);
  EXPECT_EQ(c["actor_model"], tiny);
  EXPECT_DOUBLE_EQ(c["step1"]["learning_rate"].get<double>(), 1e-3);  // opt/single_gpu/run_1.3b.sh
  const std::string description = c["description"].get<std::string>();
  EXPECT_NE(description.find("opt-1.3b's script, the nearest size (sizes far apart"), std::string::npos) << description;
  EXPECT_NO_THROW(parse_pipeline_config(c, "tiny preset"));
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " sft --dry-run --device cpu --actor " + tiny +
                                     " --reward " + tiny,
                                 &out),
            0)
      << out;
  EXPECT_NE(out.find("model " + tiny), std::string::npos) << out;
}

// Families and sizes with no DeepSpeed-Chat script borrow the script of the nearest size (LLaMA's
// for LLaMA-shaped models), with LoRA pointed at their own layers and the reason in the description.
TEST(PipelineConfig, OtherFamiliesBorrowTheNearestSizedScript) {
  json q = rlhf::preset_config("single_node", "Qwen/Qwen2.5-7B-Instruct", "qwen2.5-0.5b");
  EXPECT_EQ(q["actor_model"], "Qwen/Qwen2.5-7B-Instruct");
  EXPECT_DOUBLE_EQ(q["step1"]["learning_rate"].get<double>(), 9.65e-6);  // llama2/run_llama2_7b.sh
  EXPECT_EQ(q["step1"]["lora_module_name"], "layers.");
  EXPECT_EQ(q["step3"]["actor_lora_module_name"], "layers.");
  EXPECT_DOUBLE_EQ(q["step2"]["learning_rate"].get<double>(), 5e-5);  // opt/single_node/run_350m.sh
  EXPECT_EQ(q["step2"]["lora_module_name"], "layers.");
  EXPECT_EQ(q["step3"]["critic_lora_module_name"], "layers.");
  EXPECT_NE(q["description"].get<std::string>().find("llama-2-7b's script, the nearest size"), std::string::npos)
      << q["description"];
  EXPECT_NO_THROW(parse_pipeline_config(q, "qwen preset"));

  // GPT-2 XL (1.6B) on one GPU: OPT-1.3B's script, LoRA on GPT-2's "h." layers.
  json g = rlhf::preset_config("single_gpu", "gpt2-xl", "gpt2-medium");
  EXPECT_DOUBLE_EQ(g["step1"]["learning_rate"].get<double>(), 1e-3);
  EXPECT_EQ(g["step1"]["lora_module_name"], "h.");
  EXPECT_EQ(g["step2"]["lora_module_name"], "h.");
  EXPECT_NE(g["description"].get<std::string>().find("gpt2 1.6B parameters"), std::string::npos) << g["description"];

  // Pythia-6.9B is a LayerNorm decoder: OPT-6.7B's script rather than LLaMA-2-7B's.
  json p = rlhf::preset_config("single_node", "EleutherAI/pythia-6.9b-deduped", "opt-350m");
  EXPECT_NE(p["description"].get<std::string>().find("opt-6.7b's script"), std::string::npos) << p["description"];
  EXPECT_EQ(p["step1"]["lora_module_name"], "layers.");
  EXPECT_FALSE(p["step2"].contains("lora_module_name"));  // the reward model has its own script

  // A local directory's config.json gives the shapes.
  testing::TempDir dir;
  std::ofstream(dir / "config.json") << core::model_config_to_json(*core::model_preset("gpt2-medium"));
  json d = rlhf::preset_config("single_gpu", "opt-1.3b", dir.path().string());
  EXPECT_EQ(d["step2"]["lora_module_name"], "h.");

  // Too far from every script, or nothing to size it by: the error lists the presets.
  EXPECT_THROW_WITH(rlhf::preset_config("single_node", "qwen2.5-72b", "opt-350m"), core::ConfigError,
                    "nearest size within 4x");
  EXPECT_THROW_WITH(rlhf::preset_config("single_node", "my-org/unknown-model", "opt-350m"), core::ConfigError,
                    "no preset for deployment 'single_node' with actor 'my-org/unknown-model'");
}

TEST(PipelineConfig, MisspelledKeyNamesFileKeyAndSuggestion) {
  json config = {{"step3", {{"actor_learning_rat", 1e-5}}}};
  EXPECT_THROW_WITH(parse_pipeline_config(config, "my.json"), core::ConfigError,
                    "my.json: step3: unknown key 'actor_learning_rat' (did you mean 'actor_learning_rate'?)");
  EXPECT_THROW_WITH(parse_pipeline_config({{"step1", {{"data", {{"data_paht", "x"}}}}}}, "my.json"),
                    core::ConfigError, "my.json: step1: data: unknown key 'data_paht' (did you mean 'data_path'?)");
  EXPECT_THROW_WITH(parse_pipeline_config({{"step3", {{"ppo_constants", {{"kl_ctrl", 0.1}}}}}}, "my.json"),
                    core::ConfigError, "did you mean 'kl_ctl'?");
  EXPECT_THROW_WITH(parse_pipeline_config({{"deploymnet", "single_gpu"}}, "my.json"), core::ConfigError,
                    "my.json: unknown key 'deploymnet' (did you mean 'deployment'?)");
}

TEST(PipelineConfig, WrongTypesAndRangesNameTheKey) {
  auto step = [](const char* block, json body) { return parse_pipeline_config({{block, body}}, "my.json"); };
  EXPECT_THROW_WITH(step("step1", {{"per_device_train_batch_size", "16"}}), core::ConfigError,
                    "key 'per_device_train_batch_size' expects an integer");
  EXPECT_THROW_WITH(step("step1", {{"per_device_train_batch_size", 0}}), core::ConfigError,
                    "key 'per_device_train_batch_size' must be >= 1");
  EXPECT_THROW_WITH(step("step2", {{"num_train_epochs", 0}}), core::ConfigError, "key 'num_train_epochs'");
  EXPECT_THROW_WITH(step("step2", {{"gradient_accumulation_steps", 0}}), core::ConfigError,
                    "key 'gradient_accumulation_steps'");
  EXPECT_THROW_WITH(step("step1", {{"zero_stage", 4}}), core::ConfigError, "key 'zero_stage' must be in [0, 3]");
  EXPECT_THROW_WITH(step("step3", {{"critic_zero_stage", -1}}), core::ConfigError, "key 'critic_zero_stage'");
  EXPECT_THROW_WITH(step("step1", {{"dtype", "fp8"}}), core::ConfigError, "key 'dtype': 'fp8' is not one of fp16");
  EXPECT_THROW_WITH(step("step1", {{"lr_scheduler_type", "cosin"}}), core::ConfigError,
                    "key 'lr_scheduler_type': 'cosin' is not one of linear, cosine");
  EXPECT_THROW_WITH(step("step1", {{"lora_dim", -1}}), core::ConfigError, "key 'lora_dim'");
  EXPECT_THROW_WITH(step("step3", {{"max_answer_seq_len", 0}}), core::ConfigError, "key 'max_answer_seq_len'");
  EXPECT_THROW_WITH(step("step3", {{"ppo_constants", {{"gamma", 1.5}}}}), core::ConfigError, "key 'gamma'");
  EXPECT_THROW_WITH(step("step3", {{"ppo_constants", {{"cliprange", 0}}}}), core::ConfigError, "key 'cliprange'");
  EXPECT_THROW_WITH(step("step3", {{"ppo_constants", {{"kl_ctl", -0.1}}}}), core::ConfigError, "key 'kl_ctl'");
  EXPECT_THROW_WITH(step("step3", {{"experience_sampling", {{"top_p", 0.0}}}}), core::ConfigError, "key 'top_p'");
  EXPECT_THROW_WITH(step("step3", {{"experience_sampling", {{"temperature", 0.0}}}}), core::ConfigError,
                    "key 'temperature'");
  EXPECT_THROW_WITH(step("data", {{"data_split", "2,x,4"}}), core::ConfigError, "my.json: data: key 'data_split'");
  EXPECT_THROW_WITH(step("step1", {{"seed", -1}}), core::ConfigError, "key 'seed'");
  EXPECT_THROW_WITH(step("step3", {{"min_answer_tokens", 0}}), core::ConfigError, "key 'min_answer_tokens'");
  EXPECT_EQ(step("step3", {{"min_answer_tokens", 1}}).step3.min_answer_tokens, 1);
  EXPECT_THROW_WITH(parse_pipeline_config({{"deployment", "laptop"}}, "my.json"), core::ConfigError,
                    "key 'deployment': 'laptop' is not one of single_gpu, single_node, multi_node");
  EXPECT_THROW_WITH(parse_pipeline_config({{"init", "zeros"}}, "my.json"), core::ConfigError, "key 'init'");
  EXPECT_THROW_WITH(parse_pipeline_config({{"steps", {1, 4}}}, "my.json"), core::ConfigError, "key 'steps'");
  EXPECT_THROW_WITH(parse_pipeline_config({{"steps", {2, 2}}}, "my.json"), core::ConfigError, "listed twice");
  EXPECT_THROW_WITH(parse_pipeline_config({{"step1", 3}}, "my.json"), core::ConfigError, "key 'step1' expects an object");
  EXPECT_EQ(parse_pipeline_config({{"steps", {3, 1}}}, "my.json").steps, (std::vector<int>{3, 1}));
  EXPECT_EQ(step("step1", {{"dtype", "fp32"}}).step1.common.dtype, torch::kFloat32);
  EXPECT_EQ(step("step1", {{"dtype", "bf16"}}).step1.common.dtype, torch::kBFloat16);
  // The hybrid engine's LoRA backup is refused here, by name, before any engine sees it.
  EXPECT_THROW_WITH(step("step3", {{"lora_fuse_backup", "gpu"}}), core::ConfigError,
                    "my.json: step3: key 'lora_fuse_backup': 'gpu' is not one of auto, device, host");
  EXPECT_EQ(step("step3", {{"lora_fuse_backup", "host"}}).step3.lora_fuse_backup, hybrid::LoraFuseBackup::kHost);
  EXPECT_EQ(step("step2_grpo", {{"lora_fuse_backup", "device"}}).step2_grpo.lora_fuse_backup,
            hybrid::LoraFuseBackup::kDevice);
}

TEST(PipelineConfig, StepThreeValidationRules) {
  auto ppo = [](json body) { return rlhf::parse_ppo_config(body, "my.json: step3"); };
  try {
    ppo({{"inference_tp_size", 2}, {"actor_zero_stage", 2}});
    ADD_FAILURE() << "tp 2 with actor ZeRO-2 was accepted";
  } catch (const core::ConfigError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("inference_tp_size"), std::string::npos) << what;
    EXPECT_NE(what.find("actor_zero_stage"), std::string::npos) << what;
  }
  EXPECT_EQ(ppo({{"inference_tp_size", 2}, {"actor_zero_stage", 3}}).inference_tp_size, 2);
  json z2 = {{"actor_zero_stage", 2}, {"critic_zero_stage", 2}, {"enable_hybrid_engine", true}, {"offload", true}};
  EXPECT_THROW_WITH(ppo(z2), core::ConfigError, "unstable in DeepSpeed-Chat");
  z2["actor_lora_dim"] = 8;
  EXPECT_NO_THROW(ppo(z2));
  // DeepSpeed-Chat's asserts for mixed-precision LoRA: actor LoRA and actor ZeRO-3.
  EXPECT_THROW_WITH(ppo({{"enable_mixed_precision_lora", true}}), core::ConfigError,
                    "enable_mixed_precision_lora needs actor_lora_dim > 0 and actor_zero_stage 3 (got 0 and");
  EXPECT_THROW_WITH(ppo({{"enable_mixed_precision_lora", true}, {"actor_lora_dim", 8}, {"actor_zero_stage", 2}}),
                    core::ConfigError, "(got 8 and 2)");
  EXPECT_TRUE(ppo({{"enable_mixed_precision_lora", true}, {"actor_lora_dim", 8}, {"actor_zero_stage", 3}})
                  .enable_mixed_precision_lora);
}

TEST(PipelineConfig, MergePatch) {
  json base = {{"a", {{"b", 1}, {"c", 2}}}, {"list", {1, 2, 3}}, {"gone", true}, {"keep", "x"}};
  json patch = {{"a", {{"c", 5}, {"d", 6}}}, {"list", {9}}, {"gone", nullptr}, {"new", {{"z", nullptr}}}};
  json merged = rlhf::merge_config(base, patch);
  EXPECT_EQ(merged, json({{"a", {{"b", 1}, {"c", 5}, {"d", 6}}}, {"list", {9}}, {"keep", "x"}, {"new", json::object()}}));
  EXPECT_EQ(rlhf::merge_config(base, json::object()), base);
  EXPECT_EQ(rlhf::merge_config(base, 7), json(7));
  EXPECT_EQ(rlhf::merge_config(json(1), {{"k", 1}}), json({{"k", 1}}));
  // A --config over a preset: one key changes, the rest of the preset stays.
  json preset = rlhf::preset_config("single_node", "opt-13b", "opt-350m");
  rlhf::PipelineConfig c = parse_pipeline_config(
      rlhf::merge_config(preset, {{"step3", {{"actor_learning_rate", 1e-4}}}}), "my.json");
  EXPECT_DOUBLE_EQ(c.step3.actor.learning_rate, 1e-4);
  EXPECT_EQ(c.step3.inference_tp_size, 2);
}

TEST(PipelineConfig, ChainsModelAndOutputPaths) {
  rlhf::PipelineConfig c = parse_pipeline_config(
      {{"actor_model", "A"}, {"reward_model", "R"}, {"output_dir", "/o"}}, "my.json");
  EXPECT_EQ(c.step1.model_name_or_path, "A");
  EXPECT_EQ(c.step2.model_name_or_path, "R");  // DS-Chat: step 2 starts from the base model
  EXPECT_EQ(c.step1.output_dir, "/o/actor");
  EXPECT_EQ(c.step2.output_dir, "/o/reward");
  EXPECT_EQ(c.step3.actor_model_name_or_path, "/o/actor");
  EXPECT_EQ(c.step3.critic_model_name_or_path, "/o/reward");
  EXPECT_EQ(c.step3.output_dir, "/o/step3");

  rlhf::PipelineConfig given = parse_pipeline_config(
      {{"output_dir", "/o"}, {"step1", {{"model_name_or_path", "S"}}}, {"step3", {{"critic_model_name_or_path", "C"}}}},
      "my.json");
  EXPECT_EQ(given.step1.model_name_or_path, "S");
  EXPECT_EQ(given.step3.critic_model_name_or_path, "C");
  EXPECT_EQ(given.step3.actor_model_name_or_path, "/o/actor");
}

// The sft-dpo pipeline: steps 1 and 2, step 2 being DPO from step 1's model into <out>/dpo, with
// step2_dpo_finetuning's defaults; step 3 and out-of-range DPO keys are refused by name.
TEST(PipelineConfig, SftDpoPipelineChainsStepOneIntoDpo) {
  rlhf::PipelineConfig c = parse_pipeline_config({{"pipeline", "sft-dpo"}, {"actor_model", "A"}, {"output_dir", "/o"},
                                                  {"step2_dpo", {{"beta", 0.2}}}},
                                                 "my.json");
  EXPECT_TRUE(c.dpo());
  EXPECT_EQ(c.steps, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.step2_dpo.model_name_or_path, "/o/actor");
  EXPECT_EQ(c.step2_dpo.output_dir, "/o/dpo");
  EXPECT_EQ(c.output_of(2), "/o/dpo");
  EXPECT_EQ(&c.common_of(2), &c.step2_dpo.common);
  EXPECT_DOUBLE_EQ(c.step2_dpo.beta, 0.2);
  EXPECT_DOUBLE_EQ(c.step2_dpo.label_smoothing, 0.0);
  EXPECT_DOUBLE_EQ(c.step2_dpo.model.learning_rate, 1e-3);  // main.py's --learning_rate default
  EXPECT_EQ(c.step2_dpo.per_device_train_batch_size, 16);
  EXPECT_FALSE(c.step2_dpo.offload_reference_model);
  EXPECT_FALSE(parse_pipeline_config({{"output_dir", "/o"}}, "my.json").dpo());
  EXPECT_THROW_WITH(parse_pipeline_config({{"pipeline", "sft-dpo"}, {"steps", {1, 3}}}, "my.json"), core::ConfigError,
                    "there is no step 3");
  EXPECT_THROW_WITH(parse_pipeline_config({{"pipeline", "sft-ppo"}}, "my.json"), core::ConfigError, "pipeline");
  EXPECT_THROW_WITH(parse_pipeline_config({{"step2_dpo", {{"label_smoothing", 0.7}}}}, "my.json"), core::ConfigError,
                    "label_smoothing");
  EXPECT_THROW_WITH(parse_pipeline_config({{"step2_dpo", {{"betta", 0.1}}}}, "my.json"), core::ConfigError, "beta");
}

TEST(PipelineConfig, TopLevelDeviceIsEveryStepsDefault) {
  rlhf::PipelineConfig c = parse_pipeline_config(json::object(), "my.json");
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(c.step1.common.device, "auto");
  EXPECT_EQ(c.step3.common.device, "auto");

  rlhf::PipelineConfig given =
      parse_pipeline_config({{"device", "cpu"}, {"step2", {{"device", "cuda:1"}}}}, "my.json");
  EXPECT_EQ(given.step1.common.device, "cpu");
  EXPECT_EQ(given.step2.common.device, "cuda:1");  // a step's own key wins
  EXPECT_EQ(given.step3.common.device, "cpu");
}

TEST(PipelineConfig, BadDeviceNamesTheKey) {
  for (const std::string bad : {"gpu", "cuda:", "cuda:x", "CUDA", "cuda:-1"}) {
    EXPECT_THROW_WITH(parse_pipeline_config({{"device", bad}}, "my.json"), core::ConfigError,
                      "my.json: key 'device': '" + bad + "' is not a device (auto, cpu, cuda or cuda:N)");
    EXPECT_THROW_WITH(parse_pipeline_config({{"step3", {{"device", bad}}}}, "my.json"), core::ConfigError,
                      "my.json: step3: key 'device': '" + bad + "' is not a device");
  }
}

// The app resolves every block's device once; the trainers' step_device then reads it. cuda:99
// exists on no machine, so the test means the same with or without a GPU.
TEST(PipelineConfig, StepDevicesAreResolvedOnceAndRunBlocksMustResolve) {
  rlhf::PipelineConfig c = parse_pipeline_config(
      {{"device", "cpu"}, {"steps", {1}}, {"step3", {{"device", "cuda:99"}}}}, "my.json");
  rlhf::resolve_step_devices(c, -1);
  ASSERT_TRUE(c.step1.common.resolved_device.has_value());
  EXPECT_TRUE(c.step1.common.resolved_device->is_cpu());
  EXPECT_TRUE(c.step2_grpo.common.resolved_device.has_value());
  EXPECT_FALSE(c.step3.common.resolved_device.has_value());  // not run: left for step_device to refuse
  rlhf::StepContext context;
  EXPECT_THROW_WITH(rlhf::step_device(c.step3.common, context, "my.json: step3"), core::ConfigError,
                    "my.json: step3: key 'device'");
  // What step_device returns is the resolved device, not a fresh resolution of the name.
  c.step1.common.device = "cuda:99";
  EXPECT_TRUE(rlhf::step_device(c.step1.common, context, "my.json: step1").is_cpu());

  rlhf::PipelineConfig runs_it = parse_pipeline_config(
      {{"device", "cpu"}, {"steps", {1, 3}}, {"step3", {{"device", "cuda:99"}}}}, "my.json");
  EXPECT_THROW_WITH(rlhf::resolve_step_devices(runs_it, -1), core::ConfigError, "step3: key 'device': ");
}

TEST(PipelineConfig, StepDataMergesOverSharedData) {
  rlhf::PipelineConfig c = parse_pipeline_config(
      {{"data", {{"data_path", "local/jsonfile"}, {"data_split", "6,2,2"}}},
       {"step3", {{"data", {{"unsupervised_dataset_name", "wiki.txt"}}}}}},
      "my.json");
  EXPECT_EQ(c.step1.data.data_path, (std::vector<std::string>{"local/jsonfile"}));
  EXPECT_EQ(c.step3.data.data_split, "6,2,2");
  EXPECT_EQ(c.step3.data.unsupervised_dataset_name, (std::vector<std::string>{"wiki.txt"}));
  EXPECT_TRUE(c.step1.data.unsupervised_dataset_name.empty());
}

TEST(PipelineConfig, DemoConfigParses) {
  json demo = rlhf::demo_config();
  EXPECT_TRUE(demo.contains("description"));
  rlhf::PipelineConfig c = parse_pipeline_config(demo, "configs/demo.json");
  EXPECT_EQ(c.init, "random");
  EXPECT_EQ(c.tokenizer, "assets/demo-opt");
  EXPECT_EQ(c.step1.model_name_or_path, "assets/demo-opt");
  EXPECT_EQ(c.step1.data.local_jsonfile_dir, "data/demo/sft");  // the sloppy demonstrations
  EXPECT_EQ(c.step2.data.local_jsonfile_dir, "data/demo");
  EXPECT_EQ(c.step3.data.local_jsonfile_dir, "data/demo");
  EXPECT_EQ(c.step1.data.data_output_path, "");
  EXPECT_EQ(c.step1.common.dtype, torch::kFloat32);
  EXPECT_EQ(c.step3.max_answer_seq_len, 4);
  EXPECT_TRUE(c.step3.sampling.do_sample);
  EXPECT_TRUE(c.step3.enable_ema);
}

// Ours: step 3's and the critic-free step's enable_cuda_graph reaches the actor's hybrid_engine
// DeepSpeed config, which is what the HybridEngine reads (default off, as DeepSpeed has none).
TEST(PipelineConfig, EnableCudaGraphReachesTheHybridEngineConfig) {
  EXPECT_FALSE(rlhf::parse_ppo_config(json::object(), "t").enable_cuda_graph);
  const rlhf::PpoConfig ppo = rlhf::parse_ppo_config({{"enable_cuda_graph", true}}, "t");
  EXPECT_TRUE(ppo.enable_cuda_graph);
  // The critic-free step's policy keys are the very fields the model builders read.
  const rlhf::GrpoConfig grpo = rlhf::parse_grpo_config({{"enable_cuda_graph", true}}, "t");
  const rlhf::PolicyStepConfig& policy = grpo;
  EXPECT_TRUE(policy.enable_cuda_graph);
  EXPECT_THROW(rlhf::parse_ppo_config({{"enable_cuda_graph", "yes"}}, "t"), core::ConfigError);
  for (bool on : {false, true}) {
    engine::HybridEngineConfig hybrid;
    hybrid.enabled = true;
    hybrid.enable_cuda_graph = on;
    const engine::DeepSpeedConfig ds = rlhf::train_ds_config(ppo.common, 0, 4, 1, 1, "t", &hybrid);
    EXPECT_EQ(ds.hybrid_engine.enable_cuda_graph, on);
  }
}

// Ours: continuous_batching and its pool and rows reach the actor's hybrid_engine DeepSpeed
// config for PPO and the critic-free steps; a negative pool is a named error.
TEST(PipelineConfig, ContinuousBatchingReachesTheHybridEngineConfig) {
  EXPECT_FALSE(rlhf::parse_ppo_config(json::object(), "t").continuous_batching);
  const rlhf::PpoConfig ppo = rlhf::parse_ppo_config(
      {{"continuous_batching", true}, {"kv_cache_memory_mib", 64}, {"max_running_sequences", 4}, {"prefix_caching", true}},
      "t");
  EXPECT_TRUE(ppo.continuous_batching);
  const rlhf::GrpoConfig grpo = rlhf::parse_grpo_config({{"continuous_batching", true}}, "t");
  EXPECT_TRUE(static_cast<const rlhf::PolicyStepConfig&>(grpo).continuous_batching);
  EXPECT_THROW_WITH(rlhf::parse_ppo_config({{"kv_cache_memory_mib", -1}}, "t"), core::ConfigError,
                    "kv_cache_memory_mib");
  engine::HybridEngineConfig hybrid;
  hybrid.enabled = true;
  hybrid.continuous_batching = ppo.continuous_batching;
  hybrid.kv_cache_memory_mib = ppo.kv_cache_memory_mib;
  hybrid.max_running_sequences = ppo.max_running_sequences;
  hybrid.prefix_caching = ppo.prefix_caching;
  const engine::DeepSpeedConfig ds = rlhf::train_ds_config(ppo.common, 0, 4, 1, 1, "t", &hybrid);
  EXPECT_TRUE(ds.hybrid_engine.continuous_batching);
  EXPECT_EQ(ds.hybrid_engine.kv_cache_memory_mib, 64);
  EXPECT_EQ(ds.hybrid_engine.max_running_sequences, 4);
  EXPECT_TRUE(ds.hybrid_engine.prefix_caching);
}

}  // namespace
}  // namespace dschat
