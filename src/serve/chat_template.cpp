#include "dschat/serve/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/json_object.h"
#include "dschat/data/chat_format.h"
#include "dschat/core/error.h"

namespace dschat {
namespace serve {
namespace {

constexpr const char* kContent = "{content}";

std::string fill(const std::string& pattern, const std::string& content) {
  std::string text = pattern;
  const size_t at = text.find(kContent);
  if (at != std::string::npos) text.replace(at, std::string(kContent).size(), content);
  return text;
}

void check_pattern(const core::JsonObject& file, const std::string& key, const std::string& pattern) {
  const size_t first = pattern.find(kContent);
  DSCHAT_CHECK(first != std::string::npos && pattern.find(kContent, first + 1) == std::string::npos, ConfigError,
               file.at(key), " must contain {content} exactly once, got \"", pattern, "\"");
}

// The token the template writes right after an assistant message's content (ChatML's <|im_end|>,
// LLaMA-3's <|eot_id|>, "</s>"), if it is one special token; else none.
std::optional<int64_t> end_of_turn_token(const ChatTemplate& chat, const tokenizer::Tokenizer& tokenizer) {
  const std::string reply = "dschat-probe-reply";
  std::string text;
  try {
    text = chat.render({{"user", "dschat-probe-question"}, {"assistant", reply}}, /*add_generation_prompt=*/false);
  } catch (const core::Error&) {
    return std::nullopt;  // a template that refuses this conversation: the eos token alone ends replies
  }
  const size_t at = text.rfind(reply);
  if (at == std::string::npos) return std::nullopt;
  std::string after = text.substr(at + reply.size());
  after.erase(0, std::min(after.size(), after.find_first_not_of(" \t\r\n")));
  const std::vector<int64_t> ids = tokenizer.encode(after, /*add_special_tokens=*/false);
  if (ids.empty() || !tokenizer.is_special(ids[0])) return std::nullopt;
  return ids[0];
}

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools) const {
  if (jinja) {
    nlohmann::ordered_json variables = nlohmann::ordered_json::object();
    nlohmann::ordered_json& list = variables["messages"] = nlohmann::ordered_json::array();
    for (const auto& message : messages) {
      nlohmann::ordered_json item = {{"role", message.role}, {"content", message.content}};
      if (message.content_null) item["content"] = nullptr;
      if (!message.tool_calls.is_null()) item["tool_calls"] = message.tool_calls;
      if (!message.tool_call_id.empty()) item["tool_call_id"] = message.tool_call_id;
      list.push_back(std::move(item));
    }
    variables["tools"] = tools;
    variables["documents"] = nullptr;
    variables["add_generation_prompt"] = add_generation_prompt;
    for (const auto& [key, value] : jinja_variables.items()) variables[key] = value;
    return jinja->render(variables);
  }
  DSCHAT_CHECK(tools.is_null(), InvalidArgument, "tools: the chat template (", source, ") takes no tools");
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    DSCHAT_CHECK(message.tool_calls.is_null(), InvalidArgument, "messages[", i, "].tool_calls: the chat template (",
                 source, ") cannot write tool calls");
    if (message.role == "system") {
      prompt += fill(system, message.content);
    } else if (message.role == "user") {
      prompt += fill(user, message.content);
    } else if (message.role == "assistant") {
      prompt += fill(assistant, message.content);
    } else {
      DSCHAT_THROW(InvalidArgument, "messages[", i, "].role must be system, user or assistant (the chat template, ",
                   source, ", has no tool turns), got '", message.role, "'");
    }
  }
  return add_generation_prompt ? prompt + generation_prompt : prompt;
}

ChatTemplate load_chat_template(const std::string& path) {
  const nlohmann::json document = core::read_json_file(path);
  DSCHAT_CHECK(document.is_object(), ConfigError, path, ": a chat template must be a JSON object");
  core::JsonObject file(document, path);
  ChatTemplate chat;
  chat.system = file.get<std::string>("system", chat.system);
  chat.user = file.get<std::string>("user", chat.user);
  chat.assistant = file.get<std::string>("assistant", chat.assistant);
  chat.generation_prompt = file.get<std::string>("generation_prompt", chat.generation_prompt);
  chat.stop = file.get<std::vector<std::string>>("stop", chat.stop);
  chat.trim_leading_space = file.get<bool>("trim_leading_space", chat.trim_leading_space);
  file.finish();
  check_pattern(file, "system", chat.system);
  check_pattern(file, "user", chat.user);
  check_pattern(file, "assistant", chat.assistant);
  DSCHAT_CHECK(chat.generation_prompt.find(kContent) == std::string::npos, ConfigError, file.at("generation_prompt"),
               " must not contain {content}");
  return chat;
}

}  // namespace serve
}  // namespace dschat

namespace dschat {
namespace serve {

ChatTemplate jinja_chat_template(const tokenizer::ChatTemplateSource& source, const tokenizer::Tokenizer& tokenizer) {
  ChatTemplate chat;
  chat.jinja = std::make_shared<const tokenizer::JinjaTemplate>(source.text, source.origin);
  chat.source = source.origin;
  chat.stop.clear();
  chat.trim_leading_space = false;
  chat.add_special_tokens = false;
  // transformers passes the tokenizer's special tokens (special_tokens_map) to the template.
  const std::pair<const char*, std::optional<int64_t>> named[] = {{"bos_token", tokenizer.bos_token_id()},
                                                                  {"eos_token", tokenizer.eos_token_id()},
                                                                  {"unk_token", tokenizer.unk_token_id()},
                                                                  {"pad_token", tokenizer.pad_token_id()}};
  for (const auto& [key, id] : named) {
    if (!id) continue;
    if (const auto token = tokenizer.id_to_token(*id)) chat.jinja_variables[key] = *token;
  }
  if (const auto end = end_of_turn_token(chat, tokenizer); end && end != tokenizer.eos_token_id()) {
    chat.stop_token_ids.push_back(*end);
  }
  // A template that lists `tools` and shows the model <tool_call> blocks asks for Hermes-style
  // calls (what vLLM's "hermes" parser reads: Qwen2.5, Qwen3, NousResearch's Hermes); one that
  // shows a [TOOL_CALLS] list, for Mistral's (vLLM's "mistral" parser); one with LLaMA-3.1's
  // <|python_tag|> and {"name", "parameters"} replies, for LLaMA's (vLLM's "llama3_json").
  const auto has = [&](const char* text) { return source.text.find(text) != std::string::npos; };
  if (has("tools")) {
    if (has("<tool_call>")) {
      chat.tool_call_format = "hermes";
    } else if (has("[TOOL_CALLS]")) {
      chat.tool_call_format = "mistral";
    } else if (has("<|python_tag|>") && has("\"parameters\"")) {
      chat.tool_call_format = "llama3_json";
    }
  }
  return chat;
}

ChatTemplate select_chat_template(const std::string& flag, const tokenizer::Tokenizer& tokenizer) {
  if (flag == kDeepSpeedChatTemplate) return ChatTemplate{};
  if (flag.empty()) {
    // The format the model was trained in (recorded by dschat's SFT) first: it is what it answers to.
    const std::filesystem::path recorded = tokenizer.directory() / data::kChatFormatFile;
    if (std::filesystem::is_regular_file(recorded)) {
      ChatTemplate chat = load_chat_template(recorded.string());
      chat.source = recorded.string() + " (the format the model was trained in)";
      return chat;
    }
    const auto found = tokenizer::find_chat_template(tokenizer.directory());
    return found ? jinja_chat_template(*found, tokenizer) : ChatTemplate{};
  }
  if (std::filesystem::path(flag).extension() == ".jinja") {
    std::ifstream in(flag, std::ios::binary);
    DSCHAT_CHECK(in, IoError, flag, ": cannot read the chat template");
    std::ostringstream text;
    text << in.rdbuf();
    return jinja_chat_template({text.str(), flag}, tokenizer);
  }
  ChatTemplate chat = load_chat_template(flag);
  chat.source = flag;
  return chat;
}

}  // namespace serve
}  // namespace dschat
