#pragma once
// Tool calls in a chat reply's text (Mistral's [TOOL_CALLS] lists and forced calls further down),
// as Hermes-style templates (Qwen2.5, Qwen3, NousResearch's Hermes) teach the model to write them:
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

/// Mistral's calls (v0.3 and later templates), read as vLLM's "mistral" parser reads them: the
/// content is the text before "[TOOL_CALLS]" (null when empty), after it a JSON list of {"name",
/// "arguments"} (or one such object); anything else there makes no calls and all of it content.
/// Call ids are 9 letters and digits, the form Mistral's template requires of the next turn.
ParsedReply parse_mistral_tool_calls(const std::string& text);

/// LLaMA 3.1's calls, read as vLLM's "llama3_json" parser reads them: a reply that starts with
/// "{" (or "<|python_tag|>") is one or more JSON objects {"name", "parameters" (or "arguments")}
/// separated by ";", each a call, and no content; anything else is all content.
ParsedReply parse_llama3_json_tool_calls(const std::string& text);

/// How a reply carries its calls. tool_choice "auto": in free text, kHermes (<tool_call> blocks,
/// as above), kMistral (a [TOOL_CALLS] list) or kLlama3Json (the reply is the calls), as the
/// model's template shows them. A forced
/// tool_choice makes the whole reply JSON through schema-guided decoding (json_schema.h), as vLLM
/// does: kRequired ("required") a list of {"name", "parameters"}, kNamed (a named function) that
/// function's arguments.
struct ToolCallMode {
  enum class Kind { kHermes, kMistral, kLlama3Json, kRequired, kNamed };
  Kind kind = Kind::kHermes;
  std::string function;  // kNamed
  /// The calls come in free text after a tag (not forced by a schema).
  bool free_text() const { return kind == Kind::kHermes || kind == Kind::kMistral || kind == Kind::kLlama3Json; }
};

/// The calls of a whole reply. A forced reply that is not whole JSON (it hit max_tokens) makes no
/// calls and is all content.
ParsedReply parse_tool_calls(const std::string& text, const ToolCallMode& mode);

/// The finish reason OpenAI gives: "tool_calls" once a call was made, but a named function's
/// forced call keeps the generation's own reason ("stop"), as OpenAI and vLLM answer.
std::string tool_finish_reason(const ToolCallMode& mode, bool called, const std::string& generation_reason);

/// The same for a streamed reply: content goes out as it comes, up to where the mode's tag
/// (<tool_call>, [TOOL_CALLS]) may begin (a piece that could be the start of the tag is held back
/// until it is not); from the tag on, the text is kept and parsed once the reply ends. A LLaMA
/// reply that starts as a call, and a forced reply, are held back whole.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallMode mode = {})
      : mode_(std::move(mode)), in_call_(!mode_.free_text()) {}
  /// The content of `piece` (and of earlier held-back text) that can go out now.
  std::string push(const std::string& piece);
  /// At the reply's end: the content not yet sent (the held-back text, or all of it from the tag
  /// on when the blocks are no calls) and the calls.
  ParsedReply finish();
  const ToolCallMode& mode() const { return mode_; }

 private:
  ToolCallMode mode_;
  std::string text_;     // the whole reply so far
  size_t sent_ = 0;      // characters of text_ already returned as content
  bool in_call_ = false;  // the tag was seen: nothing more goes out before finish()
  bool content_only_ = false;  // LLaMA: the reply did not start as a call, so it is all content
};

}  // namespace serve
}  // namespace dschat
