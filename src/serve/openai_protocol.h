#pragma once
// OpenAI's HTTP API as JSON: request bodies of /v1/completions and /v1/chat/completions parsed and
// checked (every bad value becomes an ApiError naming its key), and the response, stream-chunk and
// error objects built. No I/O here: http_server.cpp moves the bytes.

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dschat/serve/chat_template.h"
#include "dschat/serve/generation_request.h"
#include "serve/tool_call_parser.h"

namespace dschat {
namespace serve {

/// An answer with an error status: {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "invalid_request_error");
  int status;
  std::string type, param, code;
};

/// A 400 naming the request key `where` breaks, "'where' rule" ("'tools[0].function.name' must ...").
ApiError bad_key(const std::string& where, const std::string& rule);

nlohmann::json error_body(const ApiError& error);

/// JSON text for the wire: bytes that are not UTF-8 (a prompt's raw bytes echoed, a byte-level
/// token decoded alone) become U+FFFD, as Hugging Face decodes with errors="replace", instead of
/// nlohmann's type_error.316.
std::string wire_json(const nlohmann::json& value);

enum class Endpoint { kCompletions, kChat };

struct ApiRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  std::vector<std::string> prompts;                 // completions: text prompts
  std::vector<std::vector<int64_t>> prompt_ids;     // completions: prompts given as token ids
  std::vector<ChatMessage> messages;                // chat
  nlohmann::ordered_json tools = nullptr;           // chat: the functions shown to the model; null: none
  std::optional<ToolCallMode> tool_calls;           // chat: how the replies carry calls; none: no tools
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

/// A request body as a JSON object; a 400 ApiError in our words otherwise (a syntax error or text
/// that is not UTF-8 with its byte offset, a number beyond a double, not an object).
nlohmann::json parse_request_object(const std::string& body);

/// Parses and checks a request body. `default_max_tokens` applies when max_tokens is absent.
ApiRequest parse_api_request(const std::string& body, Endpoint endpoint, int64_t default_max_tokens);

/// One finished choice of a non-streamed answer.
struct ChoiceResult {
  std::string text;
  bool content_null = false;  // chat: a reply that is only tool calls has content null
  nlohmann::json tool_calls = nlohmann::json::array();  // chat: OpenAI's calls (tool_call_parser.h)
  std::string finish_reason;
  nlohmann::json logprobs;  // null, or the choice's "logprobs" object (logprobs_json.h)
};

/// "cmpl-..." / "chatcmpl-...": unique within the server's life.
std::string new_response_id(Endpoint endpoint);

nlohmann::json full_response(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                             const std::vector<ChoiceResult>& choices, int64_t prompt_tokens, int64_t completion_tokens);

/// One streamed chunk for choice `index`: `text` (may be empty), `finish_reason` ("" = null).
/// For chat, `first` adds the delta's role, and `tool_calls` (non-null) the delta's calls, each
/// with its "index". `logprobs`: the piece's "logprobs" object (or null).
nlohmann::json stream_chunk(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                            int64_t index, const std::string& text, const std::string& finish_reason, bool first,
                            const nlohmann::json& logprobs = nullptr, const nlohmann::json& tool_calls = nullptr);

/// The last chunk of a stream with include_usage: no choices, the usage object.
nlohmann::json usage_chunk(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                           int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace serve
}  // namespace dschat
