// Single-process ZeRO paths on a real decoder (CausalLM): stage 3 in a world of one against stage
// 0, and the consolidated Hugging Face export (zero_to_fp32) with LoRA fused the way
// DeepSpeed-Chat saves it. Tolerance: 1e-6 absolute (fp32; only summation orders differ).
#include <gtest/gtest.h>

#include <fstream>

#include "dschat/core/json_file.h"
#include "dschat/core/model_config.h"
#include "dschat/engine/checkpoint_export.h"
#include "dschat/engine/checkpoint_shards.h"
#include "dschat/engine/training_engine.h"
#include "dschat/io/state_dict.h"
#include "dschat/models/causal_lm.h"
#include "dschat/nn/lora.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

models::CausalLM tiny_lm() {
  core::ModelConfig config = core::load_model_config(testing::fixture("opt-preln").string());
  config.dropout = 0.0;
  torch::manual_seed(21);
  return models::CausalLM(config);
}

engine::TrainingEngineOptions options(int stage) {
  engine::TrainingEngineOptions options;
  json ds = {{"train_batch_size", 2},
             {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 40}}}};
  options.config = engine::DeepSpeedConfig::parse(ds, 1, "test");
  options.optimizer.lr = 1e-2;
  options.optimizer.weight_decay = 0.1;
  options.lora_learning_rate = 2e-2;
  return options;
}

torch::Tensor loss_of(models::CausalLM& model, int step) {
  torch::Generator generator = at::detail::createCPUGenerator(50 + step);
  torch::Tensor ids = torch::randint(3, 512, {2, 9}, generator, torch::kInt64);  // [B, T]
  torch::Tensor logits = model->forward(ids);                                     // [B, T, V]
  return torch::nn::functional::cross_entropy(logits.narrow(1, 0, 8).reshape({-1, 512}),
                                              ids.narrow(1, 1, 8).reshape({-1}));
}

void train(engine::TrainingEngine& engine, models::CausalLM& model, int steps) {
  for (int step = 0; step < steps; ++step) {
    engine.backward(loss_of(model, step));
    engine.step();
  }
}

TEST(ZeroStage3, OneProcessMatchesStageZeroAndReleasesLayersBetweenSteps) {
  auto plain = tiny_lm();
  auto sharded = tiny_lm();
  engine::TrainingEngine plain_engine(plain.ptr(), options(0));
  engine::TrainingEngine sharded_engine(sharded.ptr(), options(3));
  // At rest, stage 3's large parameters hold no storage in the module.
  EXPECT_EQ(sharded->named_parameters()["model.decoder.layers.0.fc1.weight"].numel(), 0);
  train(plain_engine, plain, 4);
  train(sharded_engine, sharded, 4);
  const auto expected = plain_engine.consolidated_parameters();
  const auto got = sharded_engine.consolidated_parameters();
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [name, value] : expected) EXPECT_LT(testing::max_abs_diff(got.at(name), value), 1e-6) << name;
  EXPECT_EQ(sharded->named_parameters()["model.decoder.layers.1.fc2.weight"].numel(), 0);
  // No-grad evaluation gathers the outer parameters; release_gathered_parameters frees them.
  {
    torch::NoGradGuard no_grad;
    loss_of(sharded, 0);
  }
  EXPECT_GT(sharded->named_parameters()["model.decoder.embed_tokens.weight"].numel(), 0);
  sharded_engine.release_gathered_parameters();
  EXPECT_EQ(sharded->named_parameters()["model.decoder.embed_tokens.weight"].numel(), 0);
}

TEST(CheckpointExport, LoraIsFusedIntoTheBaseWeightsAsDeepSpeedChatSavesIt) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto model = tiny_lm();
    nn::LoraOptions lora;
    lora.lora_dim = 4;
    lora.lora_scaling = 2.0;
    lora.module_name_filter = "decoder.layers.";
    ASSERT_GT(nn::convert_linear_layers_to_lora(*model, lora), 0);
    nn::only_optimize_lora_parameters(*model);
    engine::TrainingEngine engine(model.ptr(), options(stage));
    train(engine, model, 3);
    testing::TempDir ckpt, out;
    engine.save_checkpoint(ckpt.path());

    engine::ExportOptions export_options;
    export_options.model_dir = testing::fixture("opt-preln");
    engine::export_hf_checkpoint(ckpt.path(), "", out.path(), export_options);
    const io::TensorMap exported = io::load_state_dict(out.path());
    for (const auto& [name, tensor] : exported) EXPECT_FALSE(nn::is_lora_parameter(name)) << name;

    // The module fused in memory is the reference; a fresh CausalLM loads the export.
    auto params = engine.consolidated_parameters();
    auto reference = tiny_lm();
    nn::convert_linear_layers_to_lora(*reference, lora);
    {
      torch::NoGradGuard no_grad;
      for (auto& item : reference->named_parameters()) item.value().copy_(params.at(item.key()));
    }
    nn::fuse_lora(*reference);
    for (const auto& item : reference->named_parameters()) {
      if (nn::is_lora_parameter(item.key())) continue;
      ASSERT_TRUE(exported.count(item.key())) << item.key();
      EXPECT_LT(testing::max_abs_diff(exported.at(item.key()), item.value()), 1e-6) << item.key();
    }
    auto loaded = models::CausalLM(core::load_model_config(out.path().string()));
    loaded->load_weights(exported, out.path().string());
    torch::NoGradGuard no_grad;
    reference->eval();
    loaded->eval();
    EXPECT_LT(testing::max_abs_diff(loss_of(loaded, 9), loss_of(reference, 9)), 1e-5);
  }
}

// `dschat ckpt list` / `verify`: tags newest first with their step and integrity. A flipped byte
// keeps the file's size, so only verify (checksums) sees it; a truncated file both see; verify
// exits 1 naming how many tags are damaged.
TEST(CheckpointInspection, ListAndVerifyReportEachTagsIntegrity) {
  auto model = tiny_lm();
  engine::TrainingEngine engine(model.ptr(), options(0));
  testing::TempDir ckpt;
  for (int i = 0; i < 3; ++i) {
    train(engine, model, 1);
    engine.save_checkpoint(ckpt.path());
  }
  {
    std::fstream file(ckpt / "global_step2" / "rank0.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-16, std::ios::end);
    const char byte = static_cast<char>(file.get() ^ 0x5a);
    file.seekp(-16, std::ios::end);
    file.put(byte);
  }
  const fs::path truncated = ckpt / "global_step1" / "rank0.safetensors";
  fs::resize_file(truncated, fs::file_size(truncated) - 8);

  const auto listed = engine::inspect_checkpoints(ckpt.path(), false);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0].tag, "global_step3");
  EXPECT_TRUE(listed[0].latest);
  EXPECT_EQ(listed[0].global_steps, 3);
  EXPECT_GT(listed[0].bytes, 0);
  EXPECT_TRUE(listed[0].fault.empty()) << listed[0].fault;
  EXPECT_TRUE(listed[1].fault.empty()) << "sizes alone cannot see a flipped byte";
  EXPECT_NE(listed[2].fault.find("truncated or modified"), std::string::npos) << listed[2].fault;
  const auto verified = engine::inspect_checkpoints(ckpt.path(), true);
  ASSERT_EQ(verified.size(), 3u);
  EXPECT_TRUE(verified[0].fault.empty()) << verified[0].fault;
  EXPECT_NE(verified[1].fault.find("checksum mismatch"), std::string::npos) << verified[1].fault;

  const std::string cli = std::string(DSCHAT_CLI_PATH) + " ckpt ";
  std::string output;
  EXPECT_EQ(testing::run_command(cli + "list " + ckpt.path().string(), &output), 0) << output;
  EXPECT_NE(output.find("global_step3 (latest)"), std::string::npos) << output;
  EXPECT_EQ(testing::run_command(cli + "verify " + ckpt.path().string(), &output), 1) << output;
  EXPECT_NE(output.find("2 of 3 checkpoint tags are damaged"), std::string::npos) << output;
  EXPECT_NE(testing::run_command(cli + "verify " + (ckpt / "nothing").string(), &output), 0);
  EXPECT_NE(output.find("no such checkpoint directory"), std::string::npos) << output;
  // A saved model's directory is not a checkpoint directory: an error pointing at <dir>_checkpoints.
  testing::TempDir out;
  fs::create_directories(out / "actor" / "tokenizer");
  std::ofstream(out / "actor" / "config.json") << "{}";
  fs::create_directories(out / "actor_checkpoints");
  EXPECT_EQ(testing::run_command(cli + "list " + (out / "actor").string(), &output), 1) << output;
  EXPECT_NE(output.find("no checkpoint tags here"), std::string::npos) << output;
  EXPECT_NE(output.find("beside its output: " + (out / "actor_checkpoints").string()), std::string::npos) << output;

  // `latest` naming a tag that is gone: list shows it missing, verify fails naming it.
  std::ofstream(ckpt / "latest", std::ios::trunc) << "global_step9";
  EXPECT_EQ(testing::run_command(cli + "list " + ckpt.path().string(), &output), 0) << output;
  EXPECT_NE(output.find("global_step9 (latest)"), std::string::npos) << output;
  EXPECT_NE(output.find("missing: no such tag"), std::string::npos) << output;
  EXPECT_EQ(testing::run_command(cli + "verify " + ckpt.path().string(), &output), 1) << output;
  EXPECT_NE(output.find("'latest' names global_step9, which is not there"), std::string::npos) << output;
}

// `dschat export-hf` after a run: without --model-dir it takes config and tokenizer from the run's
// output beside the checkpoint (out/actor for out/actor_checkpoints), and config.json says the
// dtype the weights were written in; with no config anywhere it refuses, naming --model-dir.
TEST(CheckpointExport, TheCliWritesALoadableDirectoryInTheDtypeItSays) {
  auto model = tiny_lm();
  engine::TrainingEngine engine(model.ptr(), options(0));
  train(engine, model, 1);
  testing::TempDir run;
  engine.save_checkpoint(run / "actor_checkpoints");
  const std::string cli = std::string(DSCHAT_CLI_PATH) + " export-hf --checkpoint " + (run / "actor_checkpoints").string();
  std::string output;
  EXPECT_EQ(testing::run_command(cli + " --output " + (run / "x").string(), &output), 1) << output;
  EXPECT_NE(output.find("--model-dir is needed"), std::string::npos) << output;
  EXPECT_NE(output.find("no config.json in " + (run / "actor").string()), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(run / "x")) << "nothing written";

  fs::create_directories(run / "actor");  // the finished step's output: its config and tokenizer
  for (const char* file : {"config.json", "vocab.json", "merges.txt", "tokenizer_config.json"}) {
    if (fs::exists(testing::fixture("opt-preln") / file)) fs::copy_file(testing::fixture("opt-preln") / file, run / "actor" / file);
  }
  ASSERT_EQ(testing::run_command(cli + " --dtype bf16 --output " + (run / "hf").string(), &output), 0) << output;
  EXPECT_NE(output.find("config and tokenizer from " + (run / "actor").string()), std::string::npos) << output;
  EXPECT_EQ(core::read_json_file((run / "hf" / "config.json").string())["torch_dtype"], "bfloat16");
  const core::ModelConfig config = core::load_model_config((run / "hf").string());
  EXPECT_EQ(config.torch_dtype, "bfloat16");
  const io::TensorMap exported = io::load_state_dict(run / "hf");
  for (const auto& [name, tensor] : exported) EXPECT_EQ(tensor.scalar_type(), torch::kBFloat16) << name;
  auto loaded = models::CausalLM(config);
  loaded->load_weights(exported, (run / "hf").string());  // dschat loads it (transformers: docs/toolkit.md)

  // --save-format bin: the same tensors as one pytorch_model.bin (DeepSpeed-Chat's file).
  ASSERT_EQ(testing::run_command(cli + " --dtype bf16 --save-format bin --output " + (run / "bin").string(), &output), 0)
      << output;
  EXPECT_TRUE(fs::exists(run / "bin" / "pytorch_model.bin"));
  EXPECT_FALSE(fs::exists(run / "bin" / "model.safetensors"));
  const io::TensorMap from_bin = io::load_state_dict(run / "bin");
  ASSERT_EQ(from_bin.size(), exported.size());
  for (const auto& [name, tensor] : exported) EXPECT_TRUE(torch::equal(from_bin.at(name), tensor)) << name;
  EXPECT_NE(testing::run_command(cli + " --save-format pt --output " + (run / "pt").string(), &output), 0);
  EXPECT_NE(output.find("--save-format"), std::string::npos) << output;
}

TEST(CheckpointExport, MissingCheckpointsAndBadDtypesAreClearErrors) {
  testing::TempDir empty;
  EXPECT_THROW_WITH(engine::consolidate_checkpoint(empty.path(), "", {}), core::NotFound, "latest");
  std::string output;
  EXPECT_NE(testing::run_command(std::string(DSCHAT_CLI_PATH) + " export-hf --checkpoint " + empty.path().string() +
                                     " --output " + (empty / "o").string() + " --dtype fp8",
                                 &output),
            0);
  EXPECT_NE(output.find("--dtype: expected fp32, bf16 or fp16, got 'fp8'"), std::string::npos) << output;
}

}  // namespace
}  // namespace dschat
