// `dschat generate --model DIR --prompt TEXT [--tokenizer DIR] [--config gen.json] [sampling flags]`
// Prints the completion of the prompt (the new text only) on stdout.
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "model_flags.h"
#include "dschat/core/error.h"
#include "dschat/core/generation_config.h"
#include "dschat/inference/generate_text.h"
#include "dschat/inference/model_loader.h"

namespace dschat {
namespace cli {
namespace {

struct GenerateOptions {
  std::string model, tokenizer, config_file, dtype = "fp32", init;
  std::vector<std::string> prompts;
  core::GenerationConfig generation;
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
  inference::LoadOptions load = load_options(o.dtype, o.init);
  auto model = inference::load_causal_lm(o.model, load);
  auto tokenizer = tokenizer::Tokenizer::load(o.tokenizer.empty() ? o.model : o.tokenizer);
  for (const auto& text : inference::generate_text(model, tokenizer, o.prompts, o.generation)) {
    std::cout << text << "\n";
  }
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
  cmd->add_option("--init", o->init, "'random': preset or config.json shapes with random weights");
  auto& g = o->generation;
  cmd->add_option("--max-new-tokens", g.max_new_tokens)->capture_default_str();
  cmd->add_option("--min-new-tokens", g.min_new_tokens)->capture_default_str();
  cmd->add_flag("--do-sample", g.do_sample, "Sample instead of greedy decoding");
  cmd->add_option("--temperature", g.temperature)->capture_default_str();
  cmd->add_option("--top-k", g.top_k)->capture_default_str();
  cmd->add_option("--top-p", g.top_p)->capture_default_str();
  cmd->add_option("--repetition-penalty", g.repetition_penalty)->capture_default_str();
  cmd->add_option("--seed", g.seed)->capture_default_str();
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace cli
}  // namespace dschat
