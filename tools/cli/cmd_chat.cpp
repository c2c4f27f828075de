// `dschat chat --model DIR [--tokenizer DIR] [--max-new-tokens N] [sampling flags as generate]`
// An interactive loop over stdin, as DeepSpeed-Chat's chat.py (inference/chatbot.py): every line
// is one human turn; the conversation so far plus " Human: <line>\n Assistant: " is continued by
// the model, the reply is cut where the model starts a "Human:" turn of its own, and printed as
// "Assistant: <reply>". `clear` forgets the conversation, `quit` or end of input exits (status 0).
// With --prompt T the one turn T is answered the same way and the command exits.
// When the conversation no longer fits (max_out_tokens or the model's positions), its oldest
// turns are dropped. One InferenceEngine serves every turn, so its workspace is reused.
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <iostream>

#include "commands.h"
#include "generation_flags.h"
#include "model_flags.h"
#include "dschat/core/error.h"
#include "dschat/inference/generate_text.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace cli {
namespace {

struct ChatOptions {
  std::string model, tokenizer, dtype = "fp32", init, device = "auto";
  std::string prompt;  // --prompt: answer this one turn and exit
  core::GenerationConfig generation;
  int64_t max_out_tokens = 512;
};

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

// The reply up to the model's own next "Human:" turn (chatbot.py's process_response).
std::string cut_reply(const std::string& generated) {
  return trim(generated.substr(0, generated.find("Human:")));
}

std::string join(const std::deque<std::string>& turns) {
  std::string text;
  for (const auto& turn : turns) text += turn;
  return text;
}

void run_chat(ChatOptions o) {
  core::validate_generation_config(o.generation, "chat flags");
  auto model = models::load_causal_lm(o.model, load_options(o.dtype, o.init, o.device));
  auto tokenizer = tokenizer::Tokenizer::load(o.tokenizer.empty() ? o.model : o.tokenizer);
  inference::InferenceEngineOptions engine_options;
  engine_options.max_out_tokens = o.max_out_tokens;
  engine_options.log_stats = false;
  inference::InferenceEngine engine(model, engine_options);
  // Tokens one prompt may take: the workspace's and the position table's limit, less the reply.
  const int64_t budget =
      std::min(o.max_out_tokens, model->config().max_position_embeddings) - o.generation.max_new_tokens;
  const bool interactive = ::isatty(STDIN_FILENO) != 0;

  std::deque<std::string> turns;  // " Human: ...\n Assistant: <reply>\n\n", oldest first
  const bool one_turn = !o.prompt.empty();
  bool prompt_taken = false;
  for (std::string line;;) {
    if (one_turn) {
      if (prompt_taken) return;  // the one turn has been answered
      prompt_taken = true;
      line = o.prompt;
    } else {
      if (interactive) std::cerr << "Enter input (type 'quit' to exit, 'clear' to clean memory): " << std::flush;
      if (!std::getline(std::cin, line)) return;
    }
    line = trim(line);
    if (line == "quit") return;
    if (line == "clear") {
      turns.clear();
      continue;
    }
    if (line.empty()) continue;
    const std::string turn = " Human: " + line + "\n Assistant: ";
    while (!turns.empty() &&
           static_cast<int64_t>(tokenizer.encode(join(turns) + turn).size()) > budget) {
      turns.pop_front();
    }
    const std::string prompt = join(turns) + turn;
    const std::string reply = cut_reply(inference::generate_text(engine, tokenizer, {prompt}, o.generation).front());
    std::cout << "Assistant: " << reply << "\n" << std::flush;
    turns.push_back(turn + reply + "\n\n");
  }
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->generation.max_new_tokens = 128;  // chat.py's default
  auto* cmd = app.add_subcommand("chat", "Chat with a model over stdin (quit / clear / end of input)");
  cmd->add_option("--model", o->model, "Model directory, cached HF id or short name")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer directory (default: the model directory)");
  cmd->add_option("--prompt", o->prompt, "Answer this one human turn and exit (no stdin)");
  add_device_flag(*cmd, o->device);
  cmd->add_option("--dtype", o->dtype, "Compute dtype: fp32, bf16, fp16")->capture_default_str();
  cmd->add_option("--init", o->init, "'random': preset or config.json shapes with random weights");
  cmd->add_option("--max-out-tokens", o->max_out_tokens, "Prompt + new tokens the KV workspace holds")
      ->capture_default_str();
  add_generation_flags(*cmd, o->generation);
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace cli
}  // namespace dschat
