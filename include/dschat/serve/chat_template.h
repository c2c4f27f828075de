#pragma once
// Chat messages -> the prompt text the model continues. The default is DeepSpeed-Chat's format,
// the one its SFT data (and chat.py) use:
//
//   [{system: S}, {user: A}, {assistant: B}, {user: C}]
//   -> "S\n\n Human: A\n Assistant: B\n\n Human: C\n Assistant: "
//
// and a reply ends where the model starts a "Human:" turn of its own (chat.py's process_response),
// its leading whitespace dropped. A JSON file may replace any part:
//   {"system": "{content}\n\n", "user": " Human: {content}\n", "assistant": " Assistant: {content}\n\n",
//    "generation_prompt": " Assistant: ", "stop": [" Human:", "Human:"], "trim_leading_space": true}

#include <string>
#include <vector>

namespace dschat {
namespace serve {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct ChatTemplate {
  std::string system = "{content}\n\n";
  std::string user = " Human: {content}\n";
  std::string assistant = " Assistant: {content}\n\n";
  std::string generation_prompt = " Assistant: ";
  std::vector<std::string> stop = {" Human:", "Human:"};
  bool trim_leading_space = true;

  /// The prompt for `messages`, ending with generation_prompt. Throws core::InvalidArgument
  /// naming the message index for an unknown role.
  std::string render(const std::vector<ChatMessage>& messages) const;
};

/// Reads a template file (keys above; others are errors naming the key and the file). Each of the
/// four role strings must contain "{content}" once, except generation_prompt, which must not.
ChatTemplate load_chat_template(const std::string& path);

}  // namespace serve
}  // namespace dschat
