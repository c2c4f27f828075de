#include "serve/tool_call_parser.h"

#include <algorithm>
#include <random>

#include "serve/json_machine.h"
#include "serve/json_mode.h"

namespace dschat {
namespace serve {
namespace {

constexpr const char* kCallOpen = "<tool_call>";
constexpr const char* kCallClose = "</tool_call>";
constexpr size_t kCallOpenLength = 11;
constexpr size_t kCallCloseLength = 12;
constexpr const char* kMistralCalls = "[TOOL_CALLS]";
constexpr const char* kPythonTag = "<|python_tag|>";

// OpenAI's form, "call_" and 24 random hex digits (unique enough within a conversation, as
// OpenAI's are), or Mistral's: 9 letters and digits (its template refuses any other).
std::string new_call_id(bool mistral) {
  static thread_local std::mt19937_64 source{std::random_device{}()};
  static const std::string kHex = "0123456789abcdef";
  static const std::string kAlphanumeric = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const std::string& digits = mistral ? kAlphanumeric : kHex;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += digits[source() % digits.size()];
  return id;
}

nlohmann::ordered_json openai_call(const std::string& name, const nlohmann::ordered_json& arguments,
                                   bool mistral_id = false) {
  // Arguments are JSON text on the wire; a model that already wrote them as text keeps its text.
  const std::string text = arguments.is_string() ? arguments.get<std::string>() : arguments.dump();
  return {{"id", new_call_id(mistral_id)}, {"type", "function"}, {"function", {{"name", name}, {"arguments", text}}}};
}

// The tag after which a free-text reply's calls come.
std::string call_tag(const ToolCallMode& mode) {
  return mode.kind == ToolCallMode::Kind::kMistral ? kMistralCalls : kCallOpen;
}

// The whole reply as content: it made no calls.
ParsedReply all_content(const std::string& text) { return ParsedReply{text, nlohmann::ordered_json::array()}; }

// One call object -> an OpenAI call; false when it is not {"name": string, `arguments`: ...}.
bool read_call(const nlohmann::ordered_json& object, const char* arguments, nlohmann::ordered_json& call,
               bool mistral_id = false) {
  if (!object.is_object() || !object.contains("name") || !object["name"].is_string()) return false;
  call = openai_call(object["name"].get<std::string>(), object.value(arguments, nlohmann::ordered_json::object()),
                     mistral_id);
  return true;
}

// LLaMA's objects name their arguments "parameters" (or "arguments", as vLLM also takes).
bool read_llama_call(const nlohmann::ordered_json& object, nlohmann::ordered_json& call) {
  return read_call(object, object.is_object() && object.contains("arguments") ? "arguments" : "parameters", call);
}

bool read_call(const std::string& block, nlohmann::ordered_json& call) {
  return read_call(nlohmann::ordered_json::parse(block, nullptr, /*allow_exceptions=*/false), "arguments", call);
}

// A forced reply: the named function's arguments, or (required) a list of {"name", "parameters"}.
ParsedReply parse_forced_tool_calls(const std::string& text, const ToolCallMode& mode) {
  const auto value = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  ParsedReply reply;
  if (mode.kind == ToolCallMode::Kind::kNamed && !value.is_discarded()) {
    reply.tool_calls.push_back(openai_call(mode.function, value));
    return reply;
  }
  if (value.is_array() && !value.empty()) {
    for (const auto& item : value) {
      nlohmann::ordered_json call;
      if (!read_call(item, "parameters", call)) return all_content(text);
      reply.tool_calls.push_back(std::move(call));
    }
    return reply;
  }
  return all_content(text);  // cut short: no calls, all content
}

}  // namespace

ParsedReply parse_hermes_tool_calls(const std::string& text) {
  ParsedReply reply;
  const size_t first = text.find(kCallOpen);
  if (first == std::string::npos) {
    reply.content = text;
    return reply;
  }
  for (size_t at = first; at != std::string::npos; at = text.find(kCallOpen, at)) {
    const size_t begin = at + kCallOpenLength;
    const size_t end = text.find(kCallClose, begin);  // npos: an unclosed last block runs to the end
    nlohmann::ordered_json call;
    if (!read_call(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin), call)) {
      return all_content(text);  // not calls after all: all of it is content
    }
    reply.tool_calls.push_back(std::move(call));
    if (end == std::string::npos) break;
    at = end + kCallCloseLength;
  }
  if (first > 0) reply.content = text.substr(0, first);
  return reply;
}

ParsedReply parse_mistral_tool_calls(const std::string& text) {
  const size_t tag = text.find(kMistralCalls);
  if (tag == std::string::npos) return all_content(text);
  nlohmann::ordered_json list = nlohmann::ordered_json::parse(text.substr(tag + std::string(kMistralCalls).size()),
                                                              nullptr, /*allow_exceptions=*/false);
  if (list.is_object()) list = nlohmann::ordered_json::array({list});
  if (!list.is_array() || list.empty()) return all_content(text);
  ParsedReply reply;
  for (const auto& item : list) {
    nlohmann::ordered_json call;
    if (!read_call(item, "arguments", call, /*mistral_id=*/true)) return all_content(text);
    reply.tool_calls.push_back(std::move(call));
  }
  if (tag > 0) reply.content = text.substr(0, tag);
  return reply;
}

ParsedReply parse_llama3_json_tool_calls(const std::string& text) {
  const ParsedReply none = all_content(text);
  const bool tagged = text.rfind(kPythonTag, 0) == 0;
  if (!tagged && text.rfind('{', 0) != 0) return none;
  const auto blank = [&](size_t at) {
    return at < text.size() && (text[at] == ' ' || text[at] == '\t' || text[at] == '\r' || text[at] == '\n');
  };
  ParsedReply reply;
  for (size_t at = tagged ? std::string(kPythonTag).size() : 0; at < text.size();) {
    // The object ends where a machine reading one object closes (a string may hold '}' or ';').
    JsonMachine object(*json_object_schema());
    size_t end = at;
    while (end < text.size() && !object.closed()) {
      if (!object.feed(text[end++])) return none;
    }
    if (!object.closed()) return none;  // cut short by max_tokens
    nlohmann::ordered_json call;
    if (!read_llama_call(nlohmann::ordered_json::parse(text.substr(at, end - at)), call)) return none;
    reply.tool_calls.push_back(std::move(call));
    for (at = end; blank(at);) ++at;
    if (at == text.size()) break;
    if (text[at] != ';') return none;
    ++at;
  }
  if (reply.tool_calls.empty()) return none;
  return reply;
}

ParsedReply parse_tool_calls(const std::string& text, const ToolCallMode& mode) {
  switch (mode.kind) {
    case ToolCallMode::Kind::kHermes: return parse_hermes_tool_calls(text);
    case ToolCallMode::Kind::kMistral: return parse_mistral_tool_calls(text);
    case ToolCallMode::Kind::kLlama3Json: return parse_llama3_json_tool_calls(text);
    default: return parse_forced_tool_calls(text, mode);
  }
}

std::string tool_finish_reason(const ToolCallMode& mode, bool called, const std::string& generation_reason) {
  return called && mode.kind != ToolCallMode::Kind::kNamed ? "tool_calls" : generation_reason;
}

std::string ToolCallStream::push(const std::string& piece) {
  text_ += piece;
  if (in_call_) return "";
  if (mode_.kind == ToolCallMode::Kind::kLlama3Json && !content_only_) {
    // A LLaMA call is the whole reply: held back while it starts like one ("{" or the tag).
    const std::string tag = kPythonTag;
    if (text_.empty() || (text_.size() < tag.size() && tag.compare(0, text_.size(), text_) == 0)) return "";
    if (text_[0] == '{' || text_.rfind(tag, 0) == 0) {
      in_call_ = true;
      return "";
    }
    content_only_ = true;
  }
  if (content_only_) {  // a reply that did not start as a call makes none
    std::string out = text_.substr(sent_);
    sent_ = text_.size();
    return out;
  }
  const std::string tag = call_tag(mode_);
  const size_t found = text_.find(tag, sent_ >= tag.size() ? sent_ - tag.size() : 0);
  size_t safe = text_.size();  // content up to here can go out
  if (found != std::string::npos) {
    in_call_ = true;
    safe = found;
  } else {
    // Hold back a tail that could be the start of the tag ("<tool" of "<tool_call>").
    for (size_t keep = std::min(tag.size() - 1, text_.size()); keep > 0; --keep) {
      if (text_.compare(text_.size() - keep, keep, tag, 0, keep) == 0) {
        safe = text_.size() - keep;
        break;
      }
    }
  }
  safe = std::max(safe, sent_);
  std::string out = text_.substr(sent_, safe - sent_);
  sent_ = safe;
  return out;
}

ParsedReply ToolCallStream::finish() {
  ParsedReply reply = parse_tool_calls(text_, mode_);
  if (!mode_.free_text()) return reply;  // nothing was sent before
  if (mode_.kind == ToolCallMode::Kind::kLlama3Json && !reply.tool_calls.empty()) return reply;  // all of it calls
  if (reply.tool_calls.empty()) {
    reply.content = text_.substr(sent_);  // no calls: what was held back is content
  } else {
    const size_t tag = text_.find(call_tag(mode_));
    reply.content = tag > sent_ ? nlohmann::ordered_json(text_.substr(sent_, tag - sent_)) : nullptr;
  }
  return reply;
}

}  // namespace serve
}  // namespace dschat
