#include "dschat/serve/chat_template.h"

#include "core/json_object.h"
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

}  // namespace

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string prompt;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "system") {
      prompt += fill(system, message.content);
    } else if (message.role == "user") {
      prompt += fill(user, message.content);
    } else if (message.role == "assistant") {
      prompt += fill(assistant, message.content);
    } else {
      DSCHAT_THROW(InvalidArgument, "messages[", i, "].role must be system, user or assistant, got '", message.role,
                   "'");
    }
  }
  return prompt + generation_prompt;
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
