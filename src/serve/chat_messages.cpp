#include "serve/chat_messages.h"

#include <string>

#include "serve/json_schema.h"

namespace dschat {
namespace serve {
namespace {

using ordered = nlohmann::ordered_json;

bool present(const ordered& object, const char* key) { return object.contains(key) && !object[key].is_null(); }

// A string, or text parts concatenated; absent or null content gives "" and sets `null`.
std::string text_content(const ordered& message, const std::string& where, bool& null) {
  null = !present(message, "content");
  if (null) return "";
  const ordered& content = message["content"];
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {  // content parts: only text parts, concatenated
    std::string text;
    for (const auto& part : content) {
      const bool text_part = part.is_object() && part.value("type", "") == "text" && part.contains("text");
      if (!text_part || !part["text"].is_string()) {
        throw bad_key(where, "parts must be {\"type\": \"text\", \"text\": ...} (no images or audio)");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw bad_key(where, std::string("must be a string, got ") + content.type_name());
}

// A function name as OpenAI allows it: 1-64 of a-z, A-Z, 0-9, '_' and '-'.
bool function_name(const ordered& name) {
  if (!name.is_string()) return false;
  const std::string text = name.get<std::string>();
  static const char* const kAllowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
  return !text.empty() && text.size() <= 64 && text.find_first_not_of(kAllowed) == std::string::npos;
}

// An assistant turn's calls, OpenAI's form -> Hugging Face templates' (arguments as an object, as
// vLLM hands them to the template).
ordered read_tool_calls(const ordered& calls, const std::string& where) {
  if (!calls.is_array() || calls.empty()) throw bad_key(where, "must be a non-empty list of calls");
  ordered out = ordered::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const std::string at = where + "[" + std::to_string(j) + "]";
    const ordered& call = calls[j];
    if (!call.is_object() || call.value("type", "function") != "function" || !call.contains("function") ||
        !call["function"].is_object()) {
      throw bad_key(at, "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    }
    const ordered& function = call["function"];
    if (!function_name(function.value("name", ordered()))) {
      throw bad_key(at + ".function.name", "must be a function name (1-64 letters, digits, '_' or '-')");
    }
    ordered arguments = ordered::object();
    if (present(function, "arguments")) {
      const ordered& text = function["arguments"];
      if (!text.is_string()) throw bad_key(at + ".function.arguments", "must be JSON text (a string)");
      arguments = ordered::parse(text.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (arguments.is_discarded()) throw bad_key(at + ".function.arguments", "is not valid JSON");
    }
    ordered item = ordered::object();
    if (present(call, "id")) item["id"] = call["id"];
    item["type"] = "function";
    item["function"] = {{"name", function["name"]}, {"arguments", arguments}};
    out.push_back(std::move(item));
  }
  return out;
}

// tool_choice "required" or {"type": "function", "function": {"name"}}: the reply is forced into
// JSON calls by a schema, vLLM's: a list of {"name", "parameters"} over the tools, or the named
// function's parameters.
void force_tool_calls(const ordered& tools, const ordered& choice, ApiRequest& request) {
  const auto parameters = [](const ordered& function) {
    return function.contains("parameters") ? function["parameters"]
                                           : ordered{{"type", "object"}, {"properties", ordered::object()}};
  };
  if (choice.is_string()) {  // "required"
    ordered branches = ordered::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ordered& function = tools[i]["function"];
      // Each alone first, so that a schema error names the tool's own key path.
      compile_json_schema(parameters(function), "tools[" + std::to_string(i) + "].function.parameters");
      const ordered properties = {{"name", {{"const", function["name"]}}}, {"parameters", parameters(function)}};
      branches.push_back({{"type", "object"}, {"properties", properties}, {"required", {"name", "parameters"}}});
    }
    const ordered schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", branches}}}};
    request.params.json_schema = compile_json_schema(schema, "tools");
    request.tool_calls = ToolCallMode{ToolCallMode::Kind::kRequired, ""};
    return;
  }
  const std::string name = choice["function"]["name"].get<std::string>();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered& function = tools[i]["function"];
    if (function["name"] != name) continue;
    request.params.json_schema =
        compile_json_schema(parameters(function), "tools[" + std::to_string(i) + "].function.parameters");
    request.tool_calls = ToolCallMode{ToolCallMode::Kind::kNamed, name};
    return;
  }
  throw bad_key("tool_choice.function.name", "names '" + name + "', which is not one of the tools");
}

void read_tools(const ordered& body, ApiRequest& request) {
  ordered choice = "auto";
  if (present(body, "tool_choice")) {
    choice = body["tool_choice"];
    const bool named = choice.is_object() && choice.value("type", "") == "function" && choice.contains("function") &&
                       choice["function"].is_object() && function_name(choice["function"].value("name", ordered()));
    if (choice != "auto" && choice != "none" && choice != "required" && !named) {
      throw bad_key("tool_choice", "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                                       "\"function\": {\"name\": ...}}");
    }
  }
  if (!present(body, "tools")) {
    if (choice != "auto" && choice != "none") throw bad_key("tool_choice", "forces a call, but no tools are given");
    return;
  }
  const ordered& tools = body["tools"];
  if (!tools.is_array()) throw bad_key("tools", "must be a list of {\"type\": \"function\", \"function\": {...}}");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ordered& tool = tools[i];
    if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
        !tool["function"].is_object()) {
      throw bad_key(where, "must be {\"type\": \"function\", \"function\": {\"name\", \"description\", "
                               "\"parameters\"}}");
    }
    const ordered& function = tool["function"];
    if (!function_name(function.value("name", ordered()))) {
      throw bad_key(where + ".function.name", "must be a function name (1-64 letters, digits, '_' or '-')");
    }
    if (present(function, "description") && !function["description"].is_string()) {
      throw bad_key(where + ".function.description", "must be a string");
    }
    if (present(function, "parameters") && !function["parameters"].is_object()) {
      throw bad_key(where + ".function.parameters", "must be a JSON Schema object");
    }
  }
  // "none": the model is not shown the tools, so it answers in text (and nothing is parsed).
  if (choice == "none" || tools.empty()) {
    if (choice != "auto" && choice != "none") throw bad_key("tool_choice", "forces a call, but no tools are given");
    return;
  }
  request.tools = tools;
  if (choice == "auto") {
    request.tool_calls = ToolCallMode{};
    return;
  }
  if (request.params.json_schema) {
    throw bad_key("tool_choice", "forces a call, which cannot be combined with response_format's JSON");
  }
  force_tool_calls(tools, choice, request);
}

}  // namespace

void read_chat_messages(const ordered& body, ApiRequest& request) {
  if (!body.contains("messages")) throw bad_key("messages", "is required");
  const ordered& messages = body["messages"];
  if (!messages.is_array() || messages.empty()) throw bad_key("messages", "must be a non-empty list");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered& message = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) throw bad_key(where, "must be an object");
    if (!message.contains("role") || !message["role"].is_string()) throw bad_key(where + ".role", "is required");
    ChatMessage turn;
    turn.role = message["role"].get<std::string>();
    if (turn.role == "developer") turn.role = "system";  // OpenAI's newer name for the system role
    if (turn.role != "system" && turn.role != "user" && turn.role != "assistant" && turn.role != "tool") {
      throw bad_key(where + ".role", "must be system, user, assistant or tool, got '" + turn.role + "'");
    }
    turn.content = text_content(message, where + ".content", turn.content_null);
    if (present(message, "tool_calls")) {
      if (turn.role != "assistant") throw bad_key(where + ".tool_calls", "is only for assistant messages");
      turn.tool_calls = read_tool_calls(message["tool_calls"], where + ".tool_calls");
    } else if (turn.content_null) {
      throw bad_key(where + ".content", "is required");
    }
    if (turn.role == "tool") {
      if (!present(message, "tool_call_id") || !message["tool_call_id"].is_string()) {
        throw bad_key(where + ".tool_call_id", "is required for a tool message (the id of the call it answers)");
      }
      turn.tool_call_id = message["tool_call_id"].get<std::string>();
    }
    request.messages.push_back(std::move(turn));
  }
  read_tools(body, request);
}

}  // namespace serve
}  // namespace dschat
