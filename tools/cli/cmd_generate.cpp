// `dschat generate --model DIR --prompt TEXT [--tokenizer DIR] [--config gen.json] [--max-out-tokens N]
//   [sampling flags]`
// Prints the completion of each prompt (the new text only) on stdout and DeepSpeed-Chat's
// "Generation => Latency: ..." line on stderr. The flags shared with `dschat chat` live in
// generation_flags.h.
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "generation_flags.h"
#include "model_flags.h"
#include "dschat/core/error.h"
#include "dschat/core/generation_config.h"
#include "dschat/inference/generate_text.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace cli {
namespace {

struct GenerateOptions {
  std::string model, tokenizer, config_file, dtype = "fp32", init, device = "auto";
  std::vector<std::string> prompts;
  core::GenerationConfig generation;
  int64_t max_out_tokens = 512;
};

void run_generate(GenerateOptions o) {
  if (!o.config_file.empty()) {
    std::ifstream in(o.config_file);
    DSCHAT_CHECK(in.good(), IoError, "--config ", o.config_file, ": cannot open file for reading");
    std::stringstream text;
    text << in.rdbuf();
    o.generation = core::parse_generation_config(text.str(), o.config_file);
  }
  core::validate_generation_config(o.generation, "generate flags");
  models::LoadOptions load = load_options(o.dtype, o.init, o.device);
  auto model = models::load_causal_lm(o.model, load);
  for (const auto& [id, bias] : o.generation.logit_bias) {
    DSCHAT_CHECK(id < model->config().vocab_size, ConfigError, o.config_file, ": key 'logit_bias' names token id ", id,
                 ", outside the model's vocabulary (", model->config().vocab_size, " ids)");
  }
  auto tokenizer = tokenizer::Tokenizer::load(o.tokenizer.empty() ? o.model : o.tokenizer);
  inference::InferenceEngineOptions engine_options;
  engine_options.max_out_tokens = o.max_out_tokens;
  engine_options.log_stats = false;  // printed below, once
  inference::InferenceEngine engine(model, engine_options);
  for (const auto& text : inference::generate_text(engine, tokenizer, o.prompts, o.generation)) {
    std::cout << text << "\n";
  }
  std::cout.flush();
  std::cerr << inference::format_generation_stats(engine.last_stats()) << "\n";
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt (greedy by default)");
  cmd->add_option("--model", o->model, "Model directory, cached HF id or short name")->required();
  cmd->add_option("--prompt", o->prompts, "Prompt text (repeat for a batch)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer directory (default: the model directory)");
  cmd->add_option("--config", o->config_file, "Generation config JSON (HF GenerationConfig keys); replaces the flags");
  cmd->add_option("--dtype", o->dtype, "Compute dtype: fp32, bf16, fp16")->capture_default_str();
  add_device_flag(*cmd, o->device);
  cmd->add_option("--init", o->init, "'random': preset or config.json shapes with random weights");
  cmd->add_option("--max-out-tokens", o->max_out_tokens, "Prompt + new tokens the KV workspace holds")
      ->capture_default_str();
  add_generation_flags(*cmd, o->generation);
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace cli
}  // namespace dschat
