#pragma once
// Tool calls in a chat reply's text, as Hermes-style templates (Qwen2.5, Qwen3, NousResearch's
// Hermes) teach the model to write them:
//
//   "Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>"
//
// read the way vLLM's "hermes" parser reads them: the content is the text before the first
// <tool_call> (null when empty), each block (the last may be unclosed: the reply hit max_tokens)
// is a JSON object with "name" and "arguments"; when any block is not such an object, nothing is
// a call and the whole text is content. Calls come out in OpenAI's form, the arguments as JSON
// text: {"id": "call_...", "type": "function", "function": {"name", "arguments"}}.

#include <nlohmann/json.hpp>

#include <string>

namespace dschat {
namespace serve {

struct ParsedReply {
  nlohmann::ordered_json content = nullptr;                        // a string, or null
  nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // OpenAI's calls; empty: none
};

ParsedReply parse_hermes_tool_calls(const std::string& text);

/// The same for a streamed reply: content goes out as it comes, up to where a <tool_call> may
/// begin (a piece that could be the start of the tag is held back until it is not); from the tag
/// on, the text is kept and parsed once the reply ends.
class ToolCallStream {
 public:
  /// The content of `piece` (and of earlier held-back text) that can go out now.
  std::string push(const std::string& piece);
  /// At the reply's end: the content not yet sent (the held-back text, or all of it from the tag
  /// on when the blocks are no calls) and the calls.
  ParsedReply finish();

 private:
  std::string text_;     // the whole reply so far
  size_t sent_ = 0;      // characters of text_ already returned as content
  bool in_call_ = false;  // the tag was seen: nothing more goes out before finish()
};

}  // namespace serve
}  // namespace dschat
