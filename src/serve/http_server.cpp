// The HTTP side of `dschat serve`: routes, the API key, body limits, error objects, /health and
// /v1/models. Generation requests go to generation_handler.cpp.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <set>

#include "dschat/core/error.h"
#include "core/log.h"
#include "serve/connection_watch.h"
#include "serve/server_state.h"

namespace dschat {
namespace serve {
namespace {

using nlohmann::json;

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// Compares without an early exit, so the time taken says nothing about how much of a key matched.
bool same_key(const std::string& given, const std::string& expected) {
  unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    difference |= static_cast<unsigned char>(given[i] ^ expected[i % std::max<size_t>(expected.size(), 1)]);
  }
  return difference == 0;
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The name in a Host header, lowercased, without its port: "Example.com:8000" -> "example.com",
// "[::1]:8000" -> "::1".
std::string host_name(const std::string& header) {
  std::string name = lowercase(header);
  if (!name.empty() && name.front() == '[') {
    const size_t close = name.find(']');
    return close == std::string::npos ? name : name.substr(1, close - 1);
  }
  const size_t colon = name.find(':');
  if (colon != std::string::npos && name.find(':', colon + 1) == std::string::npos) name.resize(colon);
  return name;
}

bool is_ip_literal(const std::string& name) {
  if (name.find(':') != std::string::npos) return true;  // IPv6
  return !name.empty() && name.find_first_not_of("0123456789.") == std::string::npos;
}

bool is_loopback(const std::string& name) {
  return name == "localhost" || name == "::1" || name.rfind("127.", 0) == 0;
}

// DNS rebinding: a page on attacker.example whose name later resolves to this address sends
// "Host: attacker.example". Browsers always send Host; a request without one is not a page's.
bool host_allowed(const std::string& header, const ServerOptions& options) {
  if (header.empty()) return true;
  const std::string name = host_name(header);
  for (const std::string& allowed : options.allowed_hosts) {
    if (allowed == "*" || lowercase(allowed) == name) return true;
  }
  const std::string bound = lowercase(options.host);
  if (name == bound) return true;
  if (is_loopback(bound)) return is_loopback(name);
  if (bound.empty() || bound == "0.0.0.0" || bound == "::") return is_ip_literal(name) || is_loopback(name);
  return false;
}

// The paths behind the API key and the JSON-only rule: /v1 and the tokenizer endpoints.
bool is_api_path(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info";
}

// Cross-site requests a browser sends without a pre-flight (text/plain, forms) must not reach a
// handler: the API takes JSON only.
bool json_content_type(const std::string& header) {
  std::string type = lowercase(header.substr(0, header.find(';')));
  type.erase(type.find_last_not_of(" \t") + 1);
  type.erase(0, type.find_first_not_of(" \t"));
  return type == "application/json";
}

json counters_json(const SchedulerCounters& c) {
  return json{{"queued", c.queued},
              {"running", c.running_rows},
              {"requests_total", c.requests_total},
              {"completed_total", c.completed_total},
              {"cancelled_total", c.cancelled_total},
              {"rejected_total", c.rejected_total},
              {"failed_total", c.failed_total},
              {"generated_tokens_total", c.generated_tokens_total},
              {"batches_total", c.batches_total},
              {"steps_total", c.steps_total},
              {"prefilled_tokens_total", c.prefilled_tokens_total},
              {"cached_prompt_tokens_total", c.cached_prompt_tokens_total}};
}

json health(const Server::State& state) {
  SchedulerCounters total;
  json per_model = json::object();
  json names = json::array();
  for (const auto& slot : state.models) {
    const SchedulerCounters c = slot.scheduler->counters();
    per_model[slot.name] = counters_json(c);
    names.push_back(slot.name);
    total += c;
  }
  json body = counters_json(total);
  body["status"] = state.stopping ? "stopping" : "ok";
  body["models"] = names;
  body["per_model"] = per_model;
  body["rss_bytes"] = resident_bytes();
  const ConnectionCounters connections = state.http.counters();
  body["connections"] = {{"open", connections.open},
                         {"refused_total", connections.refused_total},
                         {"timed_out_total", connections.timed_out_total}};
  return body;
}

json model_list(const Server::State& state) {
  json data = json::array();
  for (const auto& slot : state.models) {
    data.push_back({{"id", slot.name}, {"object", "model"}, {"created", slot.created}, {"owned_by", "dschat"}});
  }
  return json{{"object", "list"}, {"data", data}};
}

// An error status without a body of ours (httplib's own 404, 413, 400): the OpenAI error object.
ApiError error_for_status(const httplib::Request& request, int status, size_t max_body_bytes) {
  switch (status) {
    case 404:
      return ApiError(404, "unknown path " + request.method + " " + request.path +
                               " (served: GET /, /health, /v1/models, /tokenizer_info; POST /v1/completions, /v1/chat/completions, "
                               "/tokenize, /detokenize)",
                      "", "unknown_url");
    case 405:
      return ApiError(405, "method " + request.method + " is not allowed on " + request.path);
    case 413:
      return ApiError(413, "the request body exceeds the server's limit of " + std::to_string(max_body_bytes) +
                               " bytes (--max-body-bytes)", "", "request_too_large");
    case 414:
      return ApiError(414, "the request URI is too long");
    default:
      return ApiError(status, "the request could not be processed (HTTP " + std::to_string(status) + ")", "", "",
                      status >= 500 ? "server_error" : "invalid_request_error");
  }
}

}  // namespace

namespace {

ConnectionLimits connection_limits(const ServerOptions& options) {
  DSCHAT_CHECK(options.max_connections >= 1, InvalidArgument, "serve: max_connections must be at least 1, got ",
               options.max_connections);
  DSCHAT_CHECK(options.max_connections_per_client >= 1, InvalidArgument,
               "serve: max_connections_per_client must be at least 1, got ", options.max_connections_per_client);
  DSCHAT_CHECK(options.request_timeout_s > 0, InvalidArgument, "serve: request_timeout_s must be above 0, got ",
               options.request_timeout_s);
  return ConnectionLimits{options.max_connections, options.max_connections_per_client, options.request_timeout_s};
}

// A Content-Length that is not a plain decimal count a 64-bit signed integer holds ("-1", "1e3",
// 2^64) is the client's error; httplib 0.11 answered 413 after a read timeout.
bool valid_content_length(const std::string& value) {
  if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  return true;
}

// The Access-Control-Allow-Origin value for a request from `origin`, or "" (no CORS headers).
std::string allowed_origin(const std::string& origin, const ServerOptions& options) {
  if (origin.empty()) return "";
  for (const std::string& allowed : options.cors_origins) {
    if (allowed == "*") return "*";
    if (lowercase(allowed) == lowercase(origin)) return origin;
  }
  return "";
}

}  // namespace

Server::State::State(const ServerOptions& options_) : options(options_), http(connection_limits(options_)) {}

ModelSlot* Server::State::find(const std::string& name) {
  for (auto& slot : models) {
    if (slot.name == name) return &slot;
  }
  return nullptr;
}

ModelSlot& Server::State::require(const std::string& name) {
  ModelSlot* slot = find(name);
  if (slot == nullptr) {
    throw ApiError(404, "the model '" + name + "' does not exist; GET /v1/models lists the served models", "model",
                   "model_not_found");
  }
  return *slot;
}

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(wire_json(error_body(error)), "application/json");
}

Server::Server(std::vector<ServedModel> models, ServerOptions options) : state_(std::make_unique<State>(options)) {
  DSCHAT_CHECK(!models.empty(), InvalidArgument, "serve: no model given");
  DSCHAT_CHECK(options.default_max_tokens >= 1, InvalidArgument, "serve: default_max_tokens must be at least 1, got ",
               options.default_max_tokens);
  DSCHAT_CHECK(options.max_body_bytes >= 1024, InvalidArgument, "serve: max_body_bytes must be at least 1024, got ",
               options.max_body_bytes);
  State& state = *state_;
  std::set<std::string> names;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& served : models) {
    DSCHAT_CHECK(!served.name.empty(), InvalidArgument, "serve: a model needs a name");
    DSCHAT_CHECK(names.insert(served.name).second, InvalidArgument, "serve: the model name '", served.name,
                 "' is given twice; name them apart with --model NAME=DIR");
    inference::InferenceEngineOptions engine;
    engine.max_out_tokens = state.options.max_out_tokens;
    engine.enable_cuda_graph = state.options.enable_cuda_graph;  // the continuous engine's decode steps
    ModelSlot slot;
    slot.name = served.name;
    slot.vocab_size = served.model->config().vocab_size;
    slot.created = now;
    slot.chat_template = served.chat_template ? std::move(*served.chat_template) : state.options.chat_template;
    slot.scheduler = std::make_unique<BatchScheduler>(served.model, std::move(served.tokenizer), engine,
                                                      state.options.scheduler);
    state.models.push_back(std::move(slot));
  }

  GuardedServer& http = state.http;
  http.new_task_queue = [&http] { return new ConnectionThreads(http); };
  http.set_logger([this](const httplib::Request& request, const httplib::Response&) {
    state_->http.response_written(request);
  });
  http.set_payload_max_length(state.options.max_body_bytes);
  http.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    const ServerOptions& options = state_->options;
    if (!host_allowed(request.get_header_value("Host"), options)) {
      send_error(response, ApiError(403, "the Host header '" + request.get_header_value("Host") +
                                             "' is not this server's; start it with --allowed-hosts NAME to accept it",
                                    "", "host_not_allowed"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (request.has_header("Content-Length") && !valid_content_length(request.get_header_value("Content-Length"))) {
      state_->http.close_after_response(request);  // its body cannot be told from a next request
      response.set_header("Connection", "close");
      send_error(response, ApiError(400, "the Content-Length header '" + request.get_header_value("Content-Length") +
                                             "' is not a byte count", "", "invalid_content_length"));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string origin = allowed_origin(request.get_header_value("Origin"), options);
    if (!origin.empty()) {
      response.set_header("Access-Control-Allow-Origin", origin);
      if (origin != "*") response.set_header("Vary", "Origin");
      if (request.method == "OPTIONS") {  // a browser's pre-flight for a JSON POST with a key
        response.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        response.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        response.set_header("Access-Control-Max-Age", "600");
        response.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!request.has_header("Content-Length") && !request.has_header("Transfer-Encoding")) {
      state_->http.request_read(request);  // no body follows the head
    }
    const bool api = is_api_path(request.path);
    if (api && request.method == "POST" && !json_content_type(request.get_header_value("Content-Type"))) {
      send_error(response, ApiError(415, "Content-Type must be application/json, got '" +
                                             request.get_header_value("Content-Type") + "'",
                                    "", "unsupported_media_type"));
      return httplib::Server::HandlerResponse::Handled;
    }
    const std::string& key = options.api_key;
    if (key.empty() || !api) return httplib::Server::HandlerResponse::Unhandled;
    const std::string header = request.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (header.rfind(prefix, 0) == 0 && same_key(header.substr(prefix.size()), key)) {
      return httplib::Server::HandlerResponse::Unhandled;  // authorised: route it
    }
    send_error(response, ApiError(401, header.empty() ? "missing API key: send the header 'Authorization: Bearer <key>'"
                                                      : "incorrect API key provided",
                                  "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& request,
                                                                    httplib::Response& response) {
    if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours already
    send_error(response, error_for_status(request, response.status, state_->options.max_body_bytes));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request& request, httplib::Response& response,
                                 std::exception_ptr error) {
    // A fault of ours: logged in full, answered without a library's text.
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    core::log_error("serve: ", request.method, " ", request.path, " failed: ", what);
    send_error(response, ApiError(500, "internal server error (the server's log has the details)", "", "",
                                  "server_error"));
  });
  http.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(web_page(), "text/html; charset=utf-8");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(wire_json(health(*state_)), "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(wire_json(model_list(*state_)), "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    state_->http.request_read(request);
    handle_generation(*state_, request, response, Endpoint::kCompletions);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
    state_->http.request_read(request);
    handle_generation(*state_, request, response, Endpoint::kChat);
  });
  add_tokenizer_routes(state);
}

Server::~Server() { stop(); }

int Server::bind() {
  State& state = *state_;
  int port = state.options.port;
  if (port == 0) {
    port = state.http.bind_to_any_port(state.options.host);
    DSCHAT_CHECK(port > 0, IoError, "serve: cannot bind ", state.options.host, " on any port");
  } else {
    DSCHAT_CHECK(state.http.bind_to_port(state.options.host, port), IoError, "serve: cannot bind ", state.options.host,
                 ":", port, " (in use, or not an address of this machine?)");
  }
  if (!widen_listen_backlog(port)) core::log_warn("serve: could not widen the accept backlog of port ", port);
  state.http.set_port(port);
  return port;
}

void Server::serve() {
  DSCHAT_CHECK(state_->http.is_valid(), InvalidArgument, "serve: the HTTP server could not be set up");
  state_->http.listen_after_bind();
}

void Server::stop() {
  State& state = *state_;
  state.stopping = true;
  for (auto& slot : state.models) slot.scheduler->stop();  // ends every stream and waiting answer
  state.http.stop();
}

}  // namespace serve
}  // namespace dschat
