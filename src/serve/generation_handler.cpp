// POST /v1/completions and /v1/chat/completions: from the request body to a queued
// GenerationRequest, then its answer, whole or streamed.
#include <chrono>

#include "dschat/core/error.h"
#include "serve/connection_watch.h"
#include "serve/logprobs_json.h"
#include "serve/server_state.h"
#include "serve/tool_call_parser.h"

namespace dschat {
namespace serve {
namespace {

using nlohmann::json;
constexpr std::chrono::milliseconds kPollInterval{50};  // how soon a gone client is noticed

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The prompts as token ids, checked against the model's context and the batch size.
std::vector<std::vector<int64_t>> prompt_ids(const ModelSlot& slot, ApiRequest& api) {
  const tokenizer::Tokenizer& tokenizer = slot.scheduler->tokenizer();
  std::vector<std::vector<int64_t>> prompts = api.prompt_ids;
  const char* param = api.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (api.endpoint == Endpoint::kChat) {
    const bool auto_calls = api.tool_calls && api.tool_calls->free_text();
    if (auto_calls && slot.chat_template.tool_call_format.empty()) {
      throw ApiError(400, "model '" + api.model + "' has no tool calling: its chat template (" +
                              slot.chat_template.source + ") shows no tool calls the way Qwen2.5/Qwen3/Hermes "
                              "(<tool_call> blocks), Mistral v0.3 ([TOOL_CALLS]) or LLaMA 3.1 ({\"name\", "
                              "\"parameters\"} replies) templates do; --chat-template FILE.jinja sets one; "
                              "tool_choice \"required\" or a named function works with any model",
                     "tools");
    }
    const std::string& format = slot.chat_template.tool_call_format;
    if (auto_calls && (format == "mistral" || format == "llama3_json")) {
      const bool mistral = format == "mistral";
      api.tool_calls->kind = mistral ? ToolCallMode::Kind::kMistral : ToolCallMode::Kind::kLlama3Json;
      // Their tokenizers make the call tag a special token: its text must reach the parser.
      const std::optional<int64_t> tag = tokenizer.token_to_id(mistral ? "[TOOL_CALLS]" : "<|python_tag|>");
      if (tag && tokenizer.is_special(*tag)) api.params.kept_special_ids.push_back(*tag);
    }
    // A forced call is shaped by its schema whatever the template; a Jinja template still sees the
    // tools (those that ignore them, and DeepSpeed-Chat's role patterns, are rendered without).
    const bool show_tools = auto_calls || slot.chat_template.jinja != nullptr;
    std::string text;
    try {
      text = slot.chat_template.render(api.messages, /*add_generation_prompt=*/true,
                                       show_tools ? api.tools : nlohmann::ordered_json());
    } catch (const core::InvalidArgument& e) {  // an unknown role, or the template refused the conversation
      throw ApiError(400, e.what(), "messages");
    } catch (const core::Unsupported& e) {  // the template needs what dschat's Jinja subset lacks
      throw ApiError(500, e.what(), "messages", "", "server_error");
    }
    prompts.push_back(tokenizer.encode(text, slot.chat_template.add_special_tokens));
  }
  for (const auto& text : api.prompts) prompts.push_back(tokenizer.encode(text));
  const int64_t context = slot.scheduler->context_tokens();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto& ids = prompts[p];
    if (ids.empty()) throw ApiError(400, "the prompt encodes to no tokens; give at least one", param);
    for (int64_t id : ids) {
      if (id >= slot.vocab_size) {
        throw ApiError(400, "token id " + std::to_string(id) + " is outside the model's vocabulary (" +
                                std::to_string(slot.vocab_size) + " ids)", param);
      }
    }
    const int64_t length = static_cast<int64_t>(ids.size());
    if (length + api.params.max_tokens > context) {
      throw ApiError(400,
                     "this model's context is " + std::to_string(context) + " tokens (prompt + answer; the smaller of "
                     "--max-out-tokens and the model's max_position_embeddings), but the prompt" +
                         (prompts.size() > 1 ? " " + std::to_string(p) : std::string()) + " has " +
                         std::to_string(length) + " tokens and max_tokens asks for " +
                         std::to_string(api.params.max_tokens) + " more; shorten the prompt or lower max_tokens",
                     param, "context_length_exceeded");
    }
  }
  for (const auto& [id, bias] : api.params.logit_bias) {
    if (id >= slot.vocab_size) {
      throw ApiError(400, "'logit_bias' names token id " + std::to_string(id) + ", outside the model's vocabulary (" +
                              std::to_string(slot.vocab_size) + " ids)", "logit_bias");
    }
  }
  const int64_t rows = static_cast<int64_t>(prompts.size()) * api.params.n;
  if (rows > slot.scheduler->max_batch_rows()) {
    throw ApiError(400, "prompts x n = " + std::to_string(rows) + " answers exceed the " +
                            std::to_string(slot.scheduler->max_batch_rows()) + " rows one batch holds (--max-batch-rows)",
                   "n");
  }
  return prompts;
}

std::string sse(const json& event) { return "data: " + wire_json(event) + "\n\n"; }

// The generation failed or the server stops: the status to answer with.
ApiError generation_error(const Server::State& state, const std::string& message) {
  if (state.stopping) return ApiError(503, message, "", "server_stopping", "server_error");
  return ApiError(500, message, "", "", "server_error");
}

void answer_whole(Server::State& state, const ModelSlot& slot, const httplib::Request& http,
                  httplib::Response& response, const std::shared_ptr<GenerationRequest>& request,
                  const ApiRequest& api) {
  const int socket = state.http.socket_of(http);
  std::vector<ChoiceResult> choices(static_cast<size_t>(request->rows()));
  std::vector<ChoiceEvent> events;
  for (bool done = false; !done;) {
    done = request->wait(events, kPollInterval);
    if (!done && peer_closed(socket)) {  // nobody will read the answer
      request->cancel();
      return;
    }
  }
  if (!request->error().empty()) return send_error(response, generation_error(state, request->error()));
  std::vector<std::vector<inference::ScoredToken>> scored(choices.size());
  for (auto& event : events) {
    ChoiceResult& choice = choices[static_cast<size_t>(event.index)];
    choice.text += event.text;
    if (!event.finish_reason.empty()) choice.finish_reason = event.finish_reason;
    auto& tokens = scored[static_cast<size_t>(event.index)];
    tokens.insert(tokens.end(), event.logprobs.begin(), event.logprobs.end());
  }
  if (api.params.logprobs >= 0) {
    for (size_t i = 0; i < choices.size(); ++i) {
      choices[i].logprobs = ChoiceLogprobs(slot.scheduler->tokenizer(), api.endpoint).next(scored[i]);
    }
  }
  if (api.tool_calls) {
    for (auto& choice : choices) {
      ParsedReply reply = parse_tool_calls(choice.text, *api.tool_calls);
      if (reply.tool_calls.empty()) continue;
      choice.content_null = reply.content.is_null();
      choice.text = choice.content_null ? "" : reply.content.get<std::string>();
      choice.tool_calls = json(reply.tool_calls);
      choice.finish_reason = tool_finish_reason(*api.tool_calls, true, choice.finish_reason);
    }
  }
  const json body = full_response(api.endpoint, new_response_id(api.endpoint), unix_now(), api.model, choices,
                                  request->prompt_tokens(), request->completion_tokens());
  response.set_content(wire_json(body), "application/json");
}

// The stream's state between calls of httplib's chunked content provider.
struct StreamState {
  std::shared_ptr<GenerationRequest> request;
  Endpoint endpoint;
  std::string id, model;
  int64_t created = 0;
  bool include_usage = false;
  int socket = -1;
  bool opened = false;
  std::vector<ChoiceLogprobs> logprobs;  // per choice when the request asked for log-probs
  std::vector<ToolCallStream> tool_calls;  // per choice when the request offered tools
};

// A chat choice's event when the request offered tools: content goes out through the choice's
// ToolCallStream (up to where a call may begin), and at the choice's end the rest of its content, its calls
// (each with its index, whole: OpenAI's clients join a call's pieces, and one piece is a valid
// split) and the finish reason (tool_finish_reason).
template <typename Write>
bool write_with_tool_calls(StreamState& stream, const ChoiceEvent& event, json logprobs, const Write& write) {
  const auto chunk = [&](const std::string& text, const std::string& reason, const json& calls) {
    std::string data = sse(stream_chunk(stream.endpoint, stream.id, stream.created, stream.model, event.index, text,
                                        reason, false, logprobs, calls));
    logprobs = nullptr;
    return data;
  };
  ToolCallStream& calls = stream.tool_calls[static_cast<size_t>(event.index)];
  const std::string content = calls.push(event.text);
  if ((!content.empty() || !logprobs.is_null()) && !write(chunk(content, "", nullptr))) return false;
  if (event.finish_reason.empty()) return true;
  const ParsedReply reply = calls.finish();
  if (reply.content.is_string() && !reply.content.get<std::string>().empty() &&
      !write(chunk(reply.content.get<std::string>(), "", nullptr))) {
    return false;
  }
  if (reply.tool_calls.empty()) return write(chunk("", event.finish_reason, nullptr));
  json indexed = json::array();
  for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
    json call = json(reply.tool_calls[i]);
    call["index"] = i;
    indexed.push_back(std::move(call));
  }
  return write(chunk("", "", indexed)) &&
         write(chunk("", tool_finish_reason(calls.mode(), true, event.finish_reason), nullptr));
}

void answer_streamed(Server::State& state, const ModelSlot& slot, const httplib::Request& http,
                     httplib::Response& response, const std::shared_ptr<GenerationRequest>& request,
                     const ApiRequest& api) {
  auto stream = std::make_shared<StreamState>();
  stream->request = request;
  stream->endpoint = api.endpoint;
  stream->id = new_response_id(api.endpoint);
  stream->model = api.model;
  stream->created = unix_now();
  stream->include_usage = api.include_usage;
  stream->socket = state.http.socket_of(http);
  if (api.params.logprobs >= 0) {
    stream->logprobs.assign(static_cast<size_t>(request->rows()), ChoiceLogprobs(slot.scheduler->tokenizer(), api.endpoint));
  }
  if (api.tool_calls) stream->tool_calls.assign(static_cast<size_t>(request->rows()), ToolCallStream(*api.tool_calls));
  response.set_header("Cache-Control", "no-cache");
  response.set_header("X-Accel-Buffering", "no");  // proxies: pass events on as they come
  const Server::State* server = &state;
  httplib::ContentProviderWithoutLength provider = [stream, server](size_t, httplib::DataSink& sink) {
    GenerationRequest& generation = *stream->request;
    const auto write = [&](const std::string& text) {
      if (sink.write(text.data(), text.size())) return true;
      generation.cancel();  // the client went away mid-answer
      return false;
    };
    if (!stream->opened) {  // chat: every choice opens with its role, as OpenAI's streams do
      stream->opened = true;
      if (stream->endpoint == Endpoint::kChat) {
        for (int64_t i = 0; i < generation.rows(); ++i) {
          if (!write(sse(stream_chunk(stream->endpoint, stream->id, stream->created, stream->model, i, "", "", true)))) {
            return false;
          }
        }
      }
    }
    std::vector<ChoiceEvent> events;
    const bool done = generation.wait(events, kPollInterval);
    for (const auto& event : events) {
      json logprobs = nullptr;  // this piece's tokens, on its first chunk
      if (!stream->logprobs.empty()) logprobs = stream->logprobs[static_cast<size_t>(event.index)].next(event.logprobs);
      const auto chunk = [&](const std::string& text, const std::string& reason) {
        std::string data = sse(stream_chunk(stream->endpoint, stream->id, stream->created, stream->model, event.index,
                                            text, reason, false, logprobs));
        logprobs = nullptr;
        return data;
      };
      if (!stream->tool_calls.empty()) {
        if (!write_with_tool_calls(*stream, event, logprobs, write)) return false;
      } else if (stream->endpoint == Endpoint::kChat) {
        if (!event.text.empty() && !write(chunk(event.text, ""))) return false;
        if (!event.finish_reason.empty() && !write(chunk("", event.finish_reason))) return false;
      } else if (!write(chunk(event.text, event.finish_reason))) {
        return false;
      }
    }
    if (!done) {
      if (events.empty() && peer_closed(stream->socket)) {
        generation.cancel();
        return false;
      }
      return true;  // called again
    }
    if (!generation.error().empty()) {
      if (!write(sse(error_body(generation_error(*server, generation.error()))))) return false;
    } else if (stream->include_usage) {
      if (!write(sse(usage_chunk(stream->endpoint, stream->id, stream->created, stream->model,
                                 generation.prompt_tokens(), generation.completion_tokens())))) {
        return false;
      }
    }
    if (!write("data: [DONE]\n\n")) return false;
    sink.done();
    return true;
  };
  const auto released = [stream](bool success) {
    if (!success) stream->request->cancel();
  };
  if (http.version == "HTTP/1.0") {
    // HTTP/1.0 has no chunked encoding: the events go out as they come and closing the
    // connection ends the body.
    response.set_header("Connection", "close");
    response.set_content_provider("text/event-stream", std::move(provider), released);
  } else {
    response.set_chunked_content_provider("text/event-stream", std::move(provider), released);
  }
}

}  // namespace

void handle_generation(Server::State& state, const httplib::Request& http, httplib::Response& response,
                       Endpoint endpoint) {
  try {
    ApiRequest api = parse_api_request(http.body, endpoint, state.options.default_max_tokens);
    ModelSlot* slot = &state.require(api.model);
    if (endpoint == Endpoint::kChat) {
      const ChatTemplate& chat = slot->chat_template;
      api.params.stop.insert(api.params.stop.end(), chat.stop.begin(), chat.stop.end());
      api.params.trim_leading_space = chat.trim_leading_space;
      api.params.stop_token_ids = chat.stop_token_ids;
    }
    std::vector<std::vector<int64_t>> prompts = prompt_ids(*slot, api);  // may set api.params' kept ids first
    auto request = std::make_shared<GenerationRequest>(std::move(prompts), api.params);
    if (state.stopping) throw ApiError(503, "the server is stopping", "", "server_stopping", "server_error");
    try {
      slot->scheduler->submit(request);
    } catch (const QueueFull& e) {
      throw ApiError(429, e.what(), "", "rate_limit_exceeded", "rate_limit_exceeded");
    } catch (const core::InvalidArgument& e) {  // submitted while stopping
      throw ApiError(503, e.what(), "", "server_stopping", "server_error");
    }
    if (api.stream) {
      answer_streamed(state, *slot, http, response, request, api);
    } else {
      answer_whole(state, *slot, http, response, request, api);
    }
  } catch (const ApiError& e) {
    send_error(response, e);
  }
}

}  // namespace serve
}  // namespace dschat
