// `dschat chat --model DIR [--tokenizer DIR] [--chat-template deepspeed|FILE] [--max-new-tokens N]
//  [sampling flags as generate]`
// An interactive loop over stdin, as DeepSpeed-Chat's chat.py (inference/chatbot.py): every line
// is one human turn; the conversation so far plus " Human: <line>\n Assistant: " is continued by
// the model, the reply is cut where the model starts a "Human:" turn of its own, and printed as
// "Assistant: <reply>". `clear` forgets the conversation, `quit` or end of input exits (status 0).
// A model whose tokenizer directory has a Hugging Face chat template is prompted with it instead,
// and its reply ends at the eos or end-of-turn token (serve/chat_template.h; --chat-template
// deepspeed keeps DeepSpeed-Chat's format).
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
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/serve/chat_template.h"
#include "dschat/serve/text_stream.h"

namespace dschat {
namespace cli {
namespace {

struct ChatOptions {
  std::string model, tokenizer, dtype = "fp32", init, device = "auto";
  std::string prompt;  // --prompt: answer this one turn and exit
  std::string chat_template;  // --chat-template: "", "deepspeed" or a file
  core::GenerationConfig generation;
  int64_t max_out_tokens = 512;
};

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

// The conversation so far and the new human turn, as messages.
std::vector<serve::ChatMessage> conversation(const std::deque<std::pair<std::string, std::string>>& turns,
                                            const std::string& line) {
  std::vector<serve::ChatMessage> messages;
  for (const auto& [human, reply] : turns) {
    messages.push_back({"user", human});
    messages.push_back({"assistant", reply});
  }
  messages.push_back({"user", line});
  return messages;
}

// The model's reply to `prompt`: generation ends at eos or one of the template's end-of-turn ids;
// the text is cut at the template's first stop string (DeepSpeed-Chat: the model's own "Human:"
// turn, chatbot.py's process_response) and trimmed.
std::string reply_to(inference::InferenceEngine& engine, const tokenizer::Tokenizer& tokenizer,
                     const serve::ChatTemplate& chat, const std::vector<int64_t>& prompt,
                     core::GenerationConfig config) {
  if (!config.eos_token_id) config.eos_token_id = tokenizer.eos_token_id();
  if (!config.pad_token_id) config.pad_token_id = tokenizer.pad_token_id() ? tokenizer.pad_token_id() : config.eos_token_id;
  const int64_t length = static_cast<int64_t>(prompt.size());
  const auto device = engine.model()->parameters().front().device();
  torch::Tensor ids = torch::tensor(prompt, torch::kInt64).reshape({1, length}).to(device);  // [1, T]
  torch::Tensor mask = torch::ones({1, length}, torch::kInt64).to(device);                   // [1, T]
  inference::GenerationResult result;
  if (chat.stop_token_ids.empty()) {
    result = engine.generate(ids, mask, config);
  } else {
    inference::StepHooks hooks;
    hooks.end_rows = [&](const torch::Tensor& next, int64_t) {
      const int64_t id = next[0].item<int64_t>();
      return std::vector<bool>{std::find(chat.stop_token_ids.begin(), chat.stop_token_ids.end(), id) !=
                               chat.stop_token_ids.end()};
    };
    result = engine.generate(ids, mask, config, hooks);
  }
  torch::Tensor sequences = result.sequences.cpu();  // [1, T + N]
  torch::Tensor kept = result.attention_mask.cpu();  // [1, T + N]
  std::vector<int64_t> new_ids;
  for (int64_t t = length; t < sequences.size(1); ++t) {
    if (kept[0][t].item<int64_t>() == 1) new_ids.push_back(sequences[0][t].item<int64_t>());
  }
  const std::string text = tokenizer.decode(new_ids, /*skip_special_tokens=*/true);
  return trim(text.substr(0, std::min(text.size(), serve::find_first_stop(text, chat.stop))));
}

void run_chat(ChatOptions o) {
  core::validate_generation_config(o.generation, "chat flags");
  auto model = models::load_causal_lm(o.model, load_options(o.dtype, o.init, o.device));
  auto tokenizer = tokenizer::Tokenizer::load(o.tokenizer.empty() ? o.model : o.tokenizer);
  const serve::ChatTemplate chat = serve::select_chat_template(o.chat_template, tokenizer);
  if (chat.jinja) std::cerr << "dschat chat: chat template from " << chat.source << "\n";
  inference::InferenceEngineOptions engine_options;
  engine_options.max_out_tokens = o.max_out_tokens;
  engine_options.log_stats = false;
  inference::InferenceEngine engine(model, engine_options);
  // Tokens one prompt may take: the workspace's and the position table's limit, less the reply.
  const int64_t budget =
      std::min(o.max_out_tokens, model->config().max_position_embeddings) - o.generation.max_new_tokens;
  const bool interactive = ::isatty(STDIN_FILENO) != 0;

  std::deque<std::pair<std::string, std::string>> turns;  // (human line, reply), oldest first
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
    const auto encode = [&] {
      return tokenizer.encode(chat.render(conversation(turns, line)), chat.add_special_tokens);
    };
    std::vector<int64_t> prompt = encode();
    while (!turns.empty() && static_cast<int64_t>(prompt.size()) > budget) {
      turns.pop_front();
      prompt = encode();
    }
    const std::string reply = reply_to(engine, tokenizer, chat, prompt, o.generation);
    std::cout << "Assistant: " << reply << "\n" << std::flush;
    turns.emplace_back(line, reply);
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
  cmd->add_option("--chat-template", o->chat_template,
                  "'deepspeed' (DeepSpeed-Chat's Human:/Assistant:), a .jinja file or a JSON template file "
                  "(default: the tokenizer directory's Jinja chat template, else DeepSpeed-Chat's)");
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
