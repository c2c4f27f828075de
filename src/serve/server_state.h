#pragma once
// What the HTTP handlers share: the options, one scheduler per model, the httplib server.
// Private to src/serve.

#include <httplib.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "dschat/serve/batch_scheduler.h"
#include "dschat/serve/server.h"
#include "serve/connection_guard.h"
#include "serve/openai_protocol.h"

namespace dschat {
namespace serve {

struct ModelSlot {
  std::string name;
  int64_t vocab_size = 0;
  int64_t created = 0;  // unix seconds when loaded (/v1/models' "created")
  ChatTemplate chat_template;
  std::unique_ptr<BatchScheduler> scheduler;
};

struct Server::State {
  explicit State(const ServerOptions& options);
  ServerOptions options;
  std::vector<ModelSlot> models;
  GuardedServer http;
  std::atomic<bool> stopping{false};

  ModelSlot* find(const std::string& name);
  /// find(), or the 404 model_not_found ApiError naming `name`.
  ModelSlot& require(const std::string& name);
};

/// Writes `error` as the response: its status and the OpenAI error object.
void send_error(httplib::Response& response, const ApiError& error);

/// POST /v1/completions and /v1/chat/completions: checks, queues, then answers in one piece or
/// as a stream of server-sent events (generation_handler.cpp).
void handle_generation(Server::State& state, const httplib::Request& request, httplib::Response& response,
                       Endpoint endpoint);

/// GET /tokenizer_info, POST /tokenize and /detokenize (vLLM's; tokenizer_routes.cpp).
void add_tokenizer_routes(Server::State& state);

/// The chat page's HTML (assets/serve/index.html, embedded at build time).
const std::string& web_page();

}  // namespace serve
}  // namespace dschat
