// `dschat serve --model DIR | --model NAME=DIR ... [--host 127.0.0.1] [--port 8000] [--api-key KEY]`
// Serves saved models (e.g. the SFT actor and the step-3 actor side by side) through OpenAI's HTTP
// API and a web chat page (docs/serve.md). Prints "dschat serve: listening on http://HOST:PORT"
// on stdout once it accepts connections; SIGINT or SIGTERM stops it (exit 0). The API key may also
// come from the environment variable DSCHAT_API_KEY, which keeps it out of `ps`.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "commands.h"
#include "model_flags.h"
#include "dschat/core/error.h"
#include "dschat/serve/server.h"

namespace dschat {
namespace cli {
namespace {

int stop_pipe[2] = {-1, -1};  // [read, write]: signal numbers from the handler to the watcher

struct ServeOptions {
  std::vector<std::string> models;  // DIR or NAME=DIR
  std::string tokenizer, dtype = "fp32", device = "auto", chat_template;
  int64_t batch_window_ms = 5;
  int64_t kv_cache_memory_mib = 0;
  bool no_prefix_caching = false;
  bool no_batched_prefill = false;
  serve::ServerOptions server;
};

// "NAME=DIR" -> {NAME, DIR}; "DIR" -> {DIR's last component, DIR}.
std::pair<std::string, std::string> model_entry(const std::string& flag) {
  const size_t equals = flag.find('=');
  if (equals != std::string::npos && equals > 0) return {flag.substr(0, equals), flag.substr(equals + 1)};
  std::filesystem::path dir(flag);
  while (dir.has_parent_path() && dir.filename().empty()) dir = dir.parent_path();  // "out/actor/" -> actor
  return {dir.filename().string(), flag};
}

void run_serve(ServeOptions o) {
  if (o.server.api_key.empty()) {
    if (const char* key = std::getenv("DSCHAT_API_KEY")) o.server.api_key = key;
  }
  DSCHAT_CHECK(o.batch_window_ms >= 0, InvalidArgument, "--batch-window-ms must be >= 0, got ", o.batch_window_ms);
  o.server.scheduler.batch_window = std::chrono::milliseconds(o.batch_window_ms);
  DSCHAT_CHECK(o.kv_cache_memory_mib >= 0, InvalidArgument, "--kv-cache-memory-mib must be >= 0, got ",
               o.kv_cache_memory_mib);
  o.server.scheduler.kv_cache_memory = o.kv_cache_memory_mib << 20;
  o.server.scheduler.prefix_caching = !o.no_prefix_caching;
  o.server.scheduler.batched_prefill = !o.no_batched_prefill;
  const models::LoadOptions load = load_options(o.dtype, "", o.device);
  std::vector<serve::ServedModel> served;
  for (const auto& flag : o.models) {
    const auto [name, dir] = model_entry(flag);
    auto model = models::load_causal_lm(dir, load);
    model->eval();
    auto tokenizer = tokenizer::Tokenizer::load(o.tokenizer.empty() ? dir : o.tokenizer);
    serve::ChatTemplate chat = serve::select_chat_template(o.chat_template, tokenizer);
    std::cerr << "dschat serve: model '" << name << "' from " << dir << " (chat template: " << chat.source << ")\n";
    served.push_back({name, model, std::move(tokenizer), std::move(chat)});
  }
  serve::Server server(std::move(served), o.server);
  const int port = server.bind();
  // SIGINT/SIGTERM: the handler only writes the signal's number into a pipe (async-signal-safe,
  // whichever thread it interrupts); a watcher thread reads it and stops the server.
  DSCHAT_CHECK(::pipe(stop_pipe) == 0, IoError, "serve: cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = [](int signal) {
    const unsigned char number = static_cast<unsigned char>(signal);
    [[maybe_unused]] const ssize_t written = ::write(stop_pipe[1], &number, 1);
  };
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  std::thread watcher([&] {
    unsigned char number = 0;
    if (::read(stop_pipe[0], &number, 1) == 1 && number != 0) {
      std::cerr << "dschat serve: stopping (" << (number == SIGINT ? "SIGINT" : "SIGTERM") << ")\n";
    }
    server.stop();
  });
  std::cout << "dschat serve: listening on http://" << o.server.host << ":" << port << std::endl;
  if (!o.server.api_key.empty()) std::cerr << "dschat serve: /v1 requires the API key\n";
  server.serve();  // returns after stop()
  const unsigned char wake = 0;  // serve() ended by itself: let the watcher go
  [[maybe_unused]] const ssize_t written = ::write(stop_pipe[1], &wake, 1);
  watcher.join();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve models through OpenAI's HTTP API and a web chat page");
  cmd->add_option("--model", o->models, "Model directory, or NAME=DIR (repeat to serve several)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer directory for every model (default: each model's directory)");
  cmd->add_option("--host", o->server.host, "Address to listen on (0.0.0.0: every interface)")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key, "Require 'Authorization: Bearer KEY' on /v1 (or set DSCHAT_API_KEY)");
  cmd->add_option("--allowed-hosts", o->server.allowed_hosts,
                  "Host header names to accept besides the bound address (comma-separated; '*': any). Others get 403")
      ->delimiter(',');
  cmd->add_option("--cors-origin", o->server.cors_origins,
                  "Web origins whose pages may call the API from a browser (comma-separated; '*': any). Default: none")
      ->delimiter(',');
  add_device_flag(*cmd, o->device);
  cmd->add_option("--dtype", o->dtype, "Compute dtype: fp32, bf16, fp16")->capture_default_str();
  cmd->add_option("--max-out-tokens", o->server.max_out_tokens, "Prompt + answer tokens per row (the KV workspace)")
      ->capture_default_str();
  cmd->add_option("--max-batch-rows", o->server.scheduler.max_batch_rows, "Answers decoded together at most")
      ->capture_default_str();
  cmd->add_option("--kv-cache-memory-mib", o->kv_cache_memory_mib,
                  "KV block pool per model (0: half of --max-batch-rows rows of --max-out-tokens)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-caching", o->no_prefix_caching,
                "Prefill every prompt in full (default: reuse the KV blocks of earlier prompts' prefixes)");
  cmd->add_flag("--no-batched-prefill", o->no_batched_prefill,
                "Prefill each prompt in its own forward (default: the prompts admitted in one step share one)");
  cmd->add_option("--batch-window-ms", o->batch_window_ms, "How long a request waits for others to batch with")
      ->capture_default_str();
  cmd->add_option("--max-queue", o->server.scheduler.max_queue, "Waiting requests per model before 429")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes, "Largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--default-max-tokens", o->server.default_max_tokens, "max_tokens when a request gives none")
      ->capture_default_str();
  cmd->add_option("--chat-template", o->chat_template,
                  "'deepspeed' (DeepSpeed-Chat's Human:/Assistant:), a .jinja file or a JSON template file "
                  "(default: the tokenizer directory's Jinja chat template, else DeepSpeed-Chat's)");
  cmd->add_flag("--cuda-graph", o->server.enable_cuda_graph, "Decode steps as CUDA graphs (CUDA devices; no effect on the CPU)");
  cmd->add_option("--max-connections", o->server.max_connections, "Open connections at most (503 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-connections-per-client", o->server.max_connections_per_client,
                  "Open connections from one client address at most (503 beyond)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--request-timeout", o->server.request_timeout_s,
                  "Seconds a request's head and body may take to arrive (then the connection closes)")
      ->capture_default_str();
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace cli
}  // namespace dschat
