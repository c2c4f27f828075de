#pragma once
// `dschat serve`: saved models behind OpenAI's HTTP API and a web chat page (docs/serve.md).
//
//   GET  /                      the chat page (one model, or two side by side)
//   GET  /health                liveness and the schedulers' counters (no key needed)
//   GET  /v1/models             the served models
//   POST /v1/completions        text completion  } streamed as server-sent events with
//   POST /v1/chat/completions   chat             } "stream": true
//
// Each model has its own BatchScheduler (its own worker thread and engine): concurrent requests
// for one model share decode steps. The HTTP server is cpp-httplib (Debian's libcpp-httplib-dev)
// with a thread per connection, capped in total and per client address, and a deadline for each
// request to arrive: a slow reader or sender holds only its own thread while batches decode on. With an API key every /v1 call needs "Authorization: Bearer
// <key>"; bodies over max_body_bytes are refused (413) before they are read.
//
//   std::vector<serve::ServedModel> models = {{"sft", sft_model, tokenizer}, {"ppo", ppo_model, tokenizer}};
//   serve::Server server(std::move(models), options);
//   int port = server.bind();   // options.port 0: a free port
//   server.serve();             // until stop() (from another thread or a signal watcher)

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dschat/models/causal_lm.h"
#include "dschat/serve/batch_scheduler.h"
#include "dschat/serve/chat_template.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

struct ServedModel {
  std::string name;  // the "model" of requests
  models::CausalLM model;
  tokenizer::Tokenizer tokenizer;
  std::optional<ChatTemplate> chat_template;  // none: ServerOptions::chat_template
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                       // 0: any free port
  std::string api_key;                   // empty: no key needed
  // Host header names accepted besides the bound address (and, on a loopback bind, localhost,
  // 127.0.0.1 and ::1; on a wildcard bind, any IP address): a web page that rebinds its own
  // name to this address is refused (403). "*" accepts every Host.
  std::vector<std::string> allowed_hosts;
  // Web origins ("https://app.example", or "*") whose pages may call the API from a browser:
  // their requests get CORS headers and their pre-flight OPTIONS a 204. Empty: no CORS at all
  // (browsers then keep a cross-site page from reading any answer).
  std::vector<std::string> cors_origins;
  size_t max_body_bytes = 1 << 20;
  int64_t default_max_tokens = 16;       // OpenAI's completions default
  int64_t max_out_tokens = 512;          // prompt + answer tokens per row (the KV workspace)
  bool enable_cuda_graph = false;         // decode steps as CUDA graphs (CUDA devices; no effect on the CPU)
  SchedulerOptions scheduler;
  ChatTemplate chat_template;            // for the models that bring none (select_chat_template)
  // Connections (a thread each): at most max_connections open, max_connections_per_client from
  // one address (503 beyond either); a request's head and body must arrive within
  // request_timeout_s or its connection is closed (src/serve/connection_guard.h).
  int64_t max_connections = 1024;
  int64_t max_connections_per_client = 256;
  double request_timeout_s = 15.0;
};

class Server {
 public:
  Server(std::vector<ServedModel> models, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds host:port; returns the port. Throws core::IoError naming host:port when it cannot.
  int bind();
  /// Serves until stop(). Call bind() first.
  void serve();
  /// Stops accepting, fails queued and running generations ("the server is stopping") and makes
  /// serve() return. Thread-safe; idempotent.
  void stop();

  struct State;  // private (src/serve/server_state.h)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace serve
}  // namespace dschat
