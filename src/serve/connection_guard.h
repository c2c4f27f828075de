#pragma once
// What one client can hold of the server, bounded: cpp-httplib 0.11 times out each read (5 s) but
// not a whole request, so a client sending its head a byte every 2 s held a connection thread for
// as long as it liked, and 112 such clients (the fixed pool) stopped the server (issue 42).
//
//   - A thread per connection (ConnectionThreads), not a fixed pool: a slow or idle connection
//     holds its own thread only; generations run on the schedulers' workers, never on these.
//   - At most max_connections open connections, and max_per_client from one address; beyond
//     either the connection gets a 503 OpenAI error object and is closed at once.
//   - Each request's head and body must arrive within request_timeout_s of the connection's
//     start (or of the previous response on a kept-alive connection); past it the connection is
//     closed without an answer (as nginx's client_header_timeout does: writing a 408 to an idle
//     kept-alive connection could be read as the answer to the client's next request). Once a
//     handler runs, no deadline applies (a generation's stream may take minutes).
//
// cpp-httplib 0.11 hands a connection over as an opaque task (its TaskQueue::enqueue, called on
// the accept thread right after accept()) and keeps its socket private, so ConnectionThreads asks
// GuardedServer::admit_newest() which of this process's sockets on the server's port is the one not
// yet registered: accepts are sequential, so exactly one is new. A refused connection's task never
// runs (the 503 is written and the socket closed here).
// Private to src/serve.

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace dschat {
namespace serve {

struct ConnectionLimits {
  int64_t max_connections = 1024;
  int64_t max_per_client = 256;
  double request_timeout_s = 15.0;
};

struct ConnectionCounters {
  int64_t open = 0;
  int64_t refused_total = 0;    // 503: over max_connections or max_per_client
  int64_t timed_out_total = 0;  // closed: a request not in within request_timeout_s
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(ConnectionLimits limits);
  ~GuardedServer() override;

  /// The port bound (admit_newest looks for connections on it).
  void set_port(int port) { port_ = port; }
  /// The connection httplib just accepted: registered with its deadline and returned (>= 0), or
  /// over a limit: answered 503 and closed by `refuse` later on another thread (-1 then; `refused`
  /// holds its socket and message), or not found (-2: it runs unguarded). `address` and `port`:
  /// the admitted peer's.
  int admit_newest(int& refused, std::string& message, std::string& address, int& port);
  /// Answers 503 on a connection over the limits and closes it.
  static void refuse(int sock, const std::string& message);
  /// The connection's task ended (httplib closed its socket).
  void release(int sock, const std::string& address, int port);

  /// The request is in (head and body): its handler runs without a deadline.
  void request_read(const httplib::Request& request);
  /// Its response is written: a kept-alive connection's next request starts its deadline.
  void response_written(const httplib::Request& request);
  /// The connection of `request` closes once its response is written (an unread body follows).
  void close_after_response(const httplib::Request& request);
  /// The socket of the connection `request` came on, or -1.
  int socket_of(const httplib::Request& request) const;
  ConnectionCounters counters() const;
  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct Connection {
    int socket = -1;
    std::string address;
    int port = 0;
    bool armed = true;  // a request is on its way in: the deadline applies
    bool close_after_response = false;
    std::chrono::steady_clock::time_point deadline;
  };
  Connection* find(const httplib::Request& request);
  const Connection* find(const httplib::Request& request) const;
  void watch();  // the deadline thread

  const ConnectionLimits limits_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int, Connection> connections_;           // socket -> connection
  std::map<std::string, int64_t> per_client_;      // address -> open connections
  ConnectionCounters counters_;
  bool stopping_ = false;
  int port_ = -1;
  std::thread watcher_;
};

/// cpp-httplib's task queue as a thread per connection, admitted by `server` (which caps how
/// many). shutdown() waits for every one to end.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(GuardedServer& server) : server_(&server) {}
  void enqueue(std::function<void()> task) override;
  void shutdown() override;

 private:
  void start(std::function<void()> body);

  GuardedServer* server_;
  std::mutex mutex_;
  std::condition_variable done_;
  int64_t running_ = 0;
};

}  // namespace serve
}  // namespace dschat
