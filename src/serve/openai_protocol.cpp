#include "serve/openai_protocol.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "dschat/core/generation_config.h"
#include "serve/chat_messages.h"
#include "serve/json_mode.h"

namespace dschat {
namespace serve {
namespace {

using nlohmann::json;

// Keys accepted and ignored: they change nothing here (attribution, storage, tool-less defaults).
const std::set<std::string> kIgnoredKeys = {"user", "metadata", "store", "service_tier", "parallel_tool_calls"};

ApiError bad_value(const std::string& param, const std::string& message) { return ApiError(400, message, param); }

std::string type_name(const json& value) { return value.type_name(); }

std::string compact(double x) {  // 2 rather than 2.000000
  char text[32];
  std::snprintf(text, sizeof(text), "%g", x);
  return text;
}

// The keys of each endpoint, for the unknown-key check.
const std::set<std::string>& known_keys(Endpoint endpoint) {
  static const std::set<std::string> shared = {
      "model",          "max_tokens", "temperature",  "top_p",   "top_k",       "n",
      "stop",           "seed",       "stream",       "stream_options", "logprobs", "presence_penalty",
      "frequency_penalty", "logit_bias", "repetition_penalty"};
  static const std::set<std::string> chat = [] {
    std::set<std::string> keys = shared;
    keys.insert({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
                 "function_call", "response_format"});
    return keys;
  }();
  static const std::set<std::string> completions = [] {
    std::set<std::string> keys = shared;
    keys.insert({"prompt", "echo", "best_of", "suffix"});
    return keys;
  }();
  return endpoint == Endpoint::kChat ? chat : completions;
}

double number(const json& body, const std::string& key, double fallback, double lo, double hi, bool lo_open) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& value = body[key];
  if (!value.is_number()) throw bad_value(key, "'" + key + "' must be a number, got " + type_name(value));
  const double x = value.get<double>();
  if (x > hi || x < lo || (lo_open && x == lo)) {
    throw bad_value(key, "'" + key + "' must be in " + std::string(lo_open ? "(" : "[") + compact(lo) + ", " + compact(hi) +
                             "], got " + value.dump());
  }
  return x;
}

int64_t integer(const json& body, const std::string& key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& value = body[key];
  if (!value.is_number_integer()) throw bad_value(key, "'" + key + "' must be an integer, got " + value.dump());
  const int64_t x = value.get<int64_t>();
  if (x < lo || x > hi) {
    throw bad_value(key, "'" + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                             std::to_string(x));
  }
  return x;
}

// Parameters dschat serve does not implement (best_of > 1, suffix) or no longer takes (the
// deprecated functions): refused by name.
void refuse_unsupported(const json& body) {
  const auto present = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  const auto refuse = [](const std::string& key, const std::string& what) {
    throw bad_value(key, "'" + key + "' is not supported by dschat serve (" + what + ")");
  };
  if (present("best_of") && body["best_of"] != 1) refuse("best_of", "use n");
  if (present("suffix")) refuse("suffix", "no insertion mode");
  for (const char* key : {"functions", "function_call"}) {
    if (present(key)) refuse(key, "deprecated by OpenAI; use tools and tool_choice");
  }
}

// response_format: text, json_object (JSON mode) or json_schema {"name", "schema", "strict"}
// (the schema always holds, strict or not); json_mode.h. `body`: in the client's key order, which
// is the order the schema's properties are written in.
std::shared_ptr<const JsonSchema> response_schema(const nlohmann::ordered_json& body) {
  if (!body.contains("response_format") || body["response_format"].is_null()) return nullptr;
  const nlohmann::ordered_json& format = body["response_format"];
  const std::string type = format.is_object() ? format.value("type", "") : "";
  if (type == "json_object") return json_object_schema();
  if (type == "json_schema") {
    const bool given = format.contains("json_schema") && format["json_schema"].is_object() &&
                       format["json_schema"].contains("schema");
    if (!given) {
      throw bad_value("response_format.json_schema.schema",
                      "'response_format' json_schema must be {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
                      "..., \"schema\": {...}}}");
    }
    return compile_json_schema(format["json_schema"]["schema"], "response_format.json_schema.schema");
  }
  if (type != "text") {
    throw bad_value("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                                       "or {\"type\": \"json_schema\", \"json_schema\": {...}}");
  }
  return nullptr;
}

// {"50256": -100, ...}: OpenAI's token ids as strings, each bias in [-100, 100]. The ids are
// checked against the model's vocabulary where the model is known (generation_handler.cpp).
std::map<int64_t, double> logit_bias(const json& body) {
  std::map<int64_t, double> bias;
  if (!body.contains("logit_bias") || body["logit_bias"].is_null()) return bias;
  const json& object = body["logit_bias"];
  if (!object.is_object()) {
    throw bad_value("logit_bias", "'logit_bias' must be an object of token id -> bias, got " + type_name(object));
  }
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    const std::optional<int64_t> id = core::logit_bias_token_id(key);
    if (!id) throw bad_value("logit_bias", "'logit_bias' keys must be token ids (digits), got \"" + key + "\"");
    const json& value = item.value();
    if (!value.is_number() || std::fabs(value.get<double>()) > 100.0) {
      throw bad_value("logit_bias",
                      "'logit_bias' values must be numbers in [-100, 100], got " + value.dump() + " for " + key);
    }
    bias[*id] = value.get<double>();
  }
  return bias;
}

std::vector<std::string> stop_strings(const json& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const json& stop = body["stop"];
  std::vector<std::string> out;
  if (stop.is_string()) {
    out.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    if (stop.size() > 4) throw bad_value("stop", "'stop' takes at most 4 sequences, got " + std::to_string(stop.size()));
    for (const auto& item : stop) {
      if (!item.is_string()) throw bad_value("stop", "'stop' must be a string or a list of strings");
      out.push_back(item.get<std::string>());
    }
  } else {
    throw bad_value("stop", "'stop' must be a string or a list of strings, got " + type_name(stop));
  }
  for (const auto& s : out) {
    if (s.empty()) throw bad_value("stop", "'stop' sequences must not be empty");
  }
  return out;
}

void read_prompt(const json& body, ApiRequest& request) {
  if (!body.contains("prompt")) throw bad_value("prompt", "'prompt' is required");
  const json& prompt = body["prompt"];
  const auto ids = [](const json& list) {
    std::vector<int64_t> out;
    for (const auto& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) throw bad_value("prompt", "'prompt' token ids must be integers >= 0");
      out.push_back(id.get<int64_t>());
    }
    if (out.empty()) throw bad_value("prompt", "'prompt' must not be empty");
    return out;
  };
  if (prompt.is_string()) {
    request.prompts.push_back(prompt.get<std::string>());
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_string()) {
    for (const auto& item : prompt) {
      if (!item.is_string()) throw bad_value("prompt", "'prompt' lists must hold only strings (or only token ids)");
      request.prompts.push_back(item.get<std::string>());
    }
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    request.prompt_ids.push_back(ids(prompt));
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_array()) {
    for (const auto& item : prompt) request.prompt_ids.push_back(ids(item));
  } else {
    throw bad_value("prompt", "'prompt' must be a string, a list of strings or a list of token ids");
  }
}

// completions: logprobs N (the drawn token's log-prob and the N most likely), echo (the prompt's
// tokens first, with theirs); chat: logprobs true and top_logprobs N.
void read_logprobs(const json& body, Endpoint endpoint, SamplingParams& params) {
  const auto present = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  if (endpoint == Endpoint::kCompletions) {
    if (present("logprobs") && body["logprobs"] != false) {
      params.logprobs = integer(body, "logprobs", -1, 0, inference::kMaxTopLogprobs);
    }
    if (present("echo")) {
      if (!body["echo"].is_boolean()) throw bad_value("echo", "'echo' must be true or false");
      params.echo = body["echo"].get<bool>();
    }
    return;
  }
  bool wanted = false;
  if (present("logprobs")) {
    if (!body["logprobs"].is_boolean()) throw bad_value("logprobs", "'logprobs' must be true or false");
    wanted = body["logprobs"].get<bool>();
  }
  if (present("top_logprobs") && !wanted) {
    throw bad_value("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  if (wanted) params.logprobs = integer(body, "top_logprobs", 0, 0, inference::kMaxTopLogprobs);
}

}  // namespace

ApiError bad_key(const std::string& where, const std::string& rule) {
  return ApiError(400, "'" + where + "' " + rule, where);
}

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(std::move(message)),
      status(status_),
      type(std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

json error_body(const ApiError& error) {
  json body = {{"message", error.what()}, {"type", error.type}, {"param", nullptr}, {"code", nullptr}};
  if (!error.param.empty()) body["param"] = error.param;
  if (!error.code.empty()) body["code"] = error.code;
  return json{{"error", body}};
}

std::string wire_json(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

json parse_request_object(const std::string& text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::parse_error& e) {  // the parser also refuses text that is not UTF-8
    const bool utf8 = std::string(e.what()).find("UTF-8") != std::string::npos;
    throw ApiError(400, std::string("the request body is not valid JSON (") +
                            (utf8 ? "text that is not UTF-8" : "a syntax error") + " at byte " +
                            std::to_string(e.byte) + ")");
  } catch (const json::out_of_range&) {  // 1e400: nlohmann's "number overflow"
    throw ApiError(400, "the request body holds a number outside the range of a double");
  } catch (const json::exception&) {
    throw ApiError(400, "the request body is not valid JSON");
  }
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object, got " + type_name(body));
  return body;
}

ApiRequest parse_api_request(const std::string& text, Endpoint endpoint, int64_t default_max_tokens) {
  const json body = parse_request_object(text);
  const auto& known = known_keys(endpoint);
  for (const auto& item : body.items()) {
    if (!known.count(item.key()) && !kIgnoredKeys.count(item.key())) {
      throw bad_value(item.key(), "unrecognized request argument supplied: '" + item.key() + "'");
    }
  }
  refuse_unsupported(body);
  ApiRequest request;
  request.endpoint = endpoint;
  if (!body.contains("model") || !body["model"].is_string()) throw bad_value("model", "'model' is required (a string)");
  request.model = body["model"].get<std::string>();
  // Parsed again with the client's key order: tools and call arguments reach the template as sent,
  // a schema's properties come in the order written.
  const nlohmann::ordered_json ordered_body = nlohmann::ordered_json::parse(text);
  request.params.json_schema = response_schema(ordered_body);
  if (endpoint == Endpoint::kChat) {
    read_chat_messages(ordered_body, request);
  } else {
    read_prompt(body, request);
  }
  SamplingParams& params = request.params;
  const char* length_key = endpoint == Endpoint::kChat && body.contains("max_completion_tokens") &&
                                   !body["max_completion_tokens"].is_null()
                               ? "max_completion_tokens"
                               : "max_tokens";
  read_logprobs(body, endpoint, params);
  // echo with max_tokens 0 scores the prompt without generating (lm-eval's loglikelihood).
  params.max_tokens = integer(body, length_key, default_max_tokens, params.echo ? 0 : 1, 1 << 20);
  params.temperature = number(body, "temperature", 1.0, 0.0, 2.0, false);
  params.top_p = number(body, "top_p", 1.0, 0.0, 1.0, true);
  params.top_k = integer(body, "top_k", 0, 0, 1 << 20);
  params.n = integer(body, "n", 1, 1, 128);
  params.frequency_penalty = number(body, "frequency_penalty", 0.0, -2.0, 2.0, false);
  params.presence_penalty = number(body, "presence_penalty", 0.0, -2.0, 2.0, false);
  params.repetition_penalty = number(body, "repetition_penalty", 1.0, 1.0, 2.0, false);
  params.logit_bias = logit_bias(body);
  params.stop = stop_strings(body);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) throw bad_value("seed", "'seed' must be an integer");
    params.seed = static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) throw bad_value("stream", "'stream' must be true or false");
    request.stream = body["stream"].get<bool>();
  }
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& options = body["stream_options"];
    if (!request.stream) throw bad_value("stream_options", "'stream_options' is only allowed with stream: true");
    if (!options.is_object()) throw bad_value("stream_options", "'stream_options' must be an object");
    for (const auto& item : options.items()) {
      if (item.key() != "include_usage" || !item.value().is_boolean()) {
        throw bad_value("stream_options." + item.key(), "'stream_options' takes only include_usage (true or false)");
      }
    }
    request.include_usage = options.value("include_usage", false);
  }
  return request;
}

std::string new_response_id(Endpoint endpoint) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  char digits[40];
  std::snprintf(digits, sizeof(digits), "%012llx%06llx", static_cast<unsigned long long>(salt & 0xffffffffffffULL),
                static_cast<unsigned long long>(++counter & 0xffffffULL));
  return std::string(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + digits;
}

namespace {

json usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

json envelope(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model, bool chunk) {
  const char* object = endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                   : "text_completion";
  return json{{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

}  // namespace

json full_response(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                   const std::vector<ChoiceResult>& choices, int64_t prompt_tokens, int64_t completion_tokens) {
  json body = envelope(endpoint, id, created, model, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json choice = {{"index", i}, {"finish_reason", choices[i].finish_reason}};
    if (endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
      if (choices[i].content_null) choice["message"]["content"] = nullptr;
      if (!choices[i].tool_calls.empty()) choice["message"]["tool_calls"] = choices[i].tool_calls;
    } else {
      choice["text"] = choices[i].text;
    }
    choice["logprobs"] = choices[i].logprobs;
    list.push_back(choice);
  }
  body["choices"] = list;
  body["usage"] = usage(prompt_tokens, completion_tokens);
  return body;
}

json stream_chunk(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model, int64_t index,
                  const std::string& text, const std::string& finish_reason, bool first, const json& logprobs,
                  const json& tool_calls) {
  json body = envelope(endpoint, id, created, model, true);
  json choice = {{"index", index}, {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    if (!tool_calls.is_null()) delta["tool_calls"] = tool_calls;
    choice["delta"] = delta;
    if (!logprobs.is_null()) choice["logprobs"] = logprobs;
  } else {
    choice["text"] = text;
    choice["logprobs"] = logprobs;
  }
  body["choices"] = json::array({choice});
  return body;
}

json usage_chunk(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                 int64_t prompt_tokens, int64_t completion_tokens) {
  json body = envelope(endpoint, id, created, model, true);
  body["choices"] = json::array();
  body["usage"] = usage(prompt_tokens, completion_tokens);
  return body;
}

}  // namespace serve
}  // namespace dschat
