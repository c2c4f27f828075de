#pragma once
// Chat messages -> the prompt text the model continues, and where the model's reply ends.
//
// A model whose tokenizer directory has a Hugging Face chat template (chat_template.jinja, or
// tokenizer_config.json's "chat_template") is prompted with it, rendered as transformers'
// apply_chat_template renders it (tokenizer/jinja_template.h): the messages,
// add_generation_prompt, tools = documents = none, and the tokenizer's bos/eos/unk/pad tokens.
// Its prompt is encoded without the tokenizer's special tokens (the template writes them), and a
// reply ends at the eos token or at the template's end-of-turn token (what it writes right after
// an assistant message, e.g. Qwen's <|im_end|>, LLaMA-3's <|eot_id|>); nothing is trimmed.
//
// Otherwise (or with --chat-template deepspeed) it is DeepSpeed-Chat's format, the one its SFT
// data (and chat.py) use:
//
//   [{system: S}, {user: A}, {assistant: B}, {user: C}]
//   -> "S\n\n Human: A\n Assistant: B\n\n Human: C\n Assistant: "
//
// and a reply ends where the model starts a "Human:" turn of its own (chat.py's process_response),
// its leading whitespace dropped. A JSON file may replace any part:
//   {"system": "{content}\n\n", "user": " Human: {content}\n", "assistant": " Assistant: {content}\n\n",
//    "generation_prompt": " Assistant: ", "stop": [" Human:", "Human:"], "trim_leading_space": true}

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dschat/tokenizer/jinja_template.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool" (a tool's result)
  std::string content;
  /// An assistant turn's calls, as Hugging Face templates read them: [{"id", "type": "function",
  /// "function": {"name", "arguments": {...}}}] (arguments an object, not OpenAI's JSON text);
  /// null when none. Such a turn's content may be absent (content_null).
  nlohmann::ordered_json tool_calls = nullptr;
  bool content_null = false;
  std::string tool_call_id;  // a "tool" message: the call it answers
};

struct ChatTemplate {
  std::string system = "{content}\n\n";
  std::string user = " Human: {content}\n";
  std::string assistant = " Assistant: {content}\n\n";
  std::string generation_prompt = " Assistant: ";
  std::vector<std::string> stop = {" Human:", "Human:"};
  bool trim_leading_space = true;

  /// A Jinja template (select_chat_template): when set, render() is its rendering and the role
  /// patterns above are unused.
  std::shared_ptr<const tokenizer::JinjaTemplate> jinja;
  /// The template's variables besides messages and add_generation_prompt.
  nlohmann::ordered_json jinja_variables = nlohmann::ordered_json::object();
  /// Ids that end a reply besides the tokenizer's eos (the template's end-of-turn token).
  std::vector<int64_t> stop_token_ids;
  /// Whether prompts are encoded with the tokenizer's special tokens (a Jinja template writes its own).
  bool add_special_tokens = true;
  /// How the model writes a tool call, when its template offers tools: "hermes" for a template
  /// that takes `tools` and shows <tool_call> blocks (Qwen2.5, Qwen3, Hermes), "mistral" for one
  /// that shows a [TOOL_CALLS] list (Mistral v0.3 and later), "llama3_json" for one whose replies
  /// are {"name", "parameters"} objects (LLaMA 3.1 and later); "" for none.
  std::string tool_call_format;

  /// The prompt for `messages`, ending with generation_prompt (a Jinja template: with
  /// add_generation_prompt). `tools` (a Jinja template only): the function definitions the
  /// template lists, OpenAI's [{"type": "function", "function": {...}}], or null. Throws
  /// core::InvalidArgument naming the message index for an unknown role or a tool turn the
  /// role patterns cannot write, or naming the template's file, line and column when it fails or
  /// raise_exception()s.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                     const nlohmann::ordered_json& tools = nullptr) const;
  /// Where the template came from, for logs: DeepSpeed-Chat's format, or a file.
  std::string source = "DeepSpeed-Chat's Human:/Assistant: format";
};

/// Reads a template file (keys above; others are errors naming the key and the file). Each of the
/// four role strings must contain "{content}" once, except generation_prompt, which must not.
ChatTemplate load_chat_template(const std::string& path);

/// The value of --chat-template that forces DeepSpeed-Chat's format.
constexpr const char* kDeepSpeedChatTemplate = "deepspeed";

/// The chat template for a model with `tokenizer`, as --chat-template `flag` says:
///   ""            the format the model was trained in when dschat recorded it in the tokenizer
///                 directory (data::kChatFormatFile), else its Jinja template if it has one, else
///                 DeepSpeed-Chat's
///   "deepspeed"   DeepSpeed-Chat's format, whatever the model has
///   FILE.jinja    that Jinja template
///   FILE          a JSON template file (load_chat_template)
/// Throws core::Unsupported / core::FormatError naming the file, line:column and the construct for a
/// template dschat cannot render.
ChatTemplate select_chat_template(const std::string& flag, const tokenizer::Tokenizer& tokenizer);

/// A Jinja template bound to `tokenizer`: its special tokens as variables, its end-of-turn token.
ChatTemplate jinja_chat_template(const tokenizer::ChatTemplateSource& source, const tokenizer::Tokenizer& tokenizer);

}  // namespace serve
}  // namespace dschat
