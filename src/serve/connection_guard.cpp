#include "serve/connection_guard.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "serve/connection_watch.h"
#include "serve/openai_protocol.h"

namespace dschat {
namespace serve {
namespace {

bool send_all(int sock, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(sock, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

GuardedServer::GuardedServer(ConnectionLimits limits) : limits_(limits), watcher_([this] { watch(); }) {}

GuardedServer::~GuardedServer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  watcher_.join();
}

void GuardedServer::refuse(int sock, const std::string& message) {
  const std::string body = wire_json(error_body(ApiError(503, message, "", "too_many_connections", "server_error")));
  send_all(sock, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body);
  // Read what the client sent before closing: closing with unread bytes resets the connection,
  // and a reset can reach the client before the 503 does.
  ::shutdown(sock, SHUT_WR);
  timeval wait{0, 200 * 1000};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(sock, sink, sizeof(sink), 0) > 0; ++i) {
  }
  ::close(sock);
}

int GuardedServer::admit_newest(int& refused, std::string& message, std::string& address_out, int& port_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  int sock = -1;
  std::string address;
  int port = 0;
  for (int candidate : accepted_sockets(port_)) {
    std::string candidate_address;
    int candidate_port = 0;
    if (!peer_of(candidate, candidate_address, candidate_port)) continue;
    auto known = connections_.find(candidate);
    // A known socket number with another peer: its old connection closed and the number was reused.
    if (known != connections_.end() && known->second.address == candidate_address &&
        known->second.port == candidate_port) {
      continue;
    }
    sock = candidate;
    address = candidate_address;
    port = candidate_port;
    break;
  }
  if (sock < 0) return -2;
  // The client's own limit first: it names what that client can change.
  if (per_client_.count(address) && per_client_[address] >= limits_.max_per_client) {
    message = "this client address holds its limit of " + std::to_string(limits_.max_per_client) +
              " open connections (--max-connections-per-client); close some or retry later";
  } else if (counters_.open >= limits_.max_connections) {
    message = "the server holds its limit of " + std::to_string(limits_.max_connections) +
              " open connections (--max-connections); retry later";
  }
  if (!message.empty()) {
    ++counters_.refused_total;
    refused = sock;
    return -1;
  }
  ++counters_.open;
  ++per_client_[address];
  Connection& connection = connections_[sock];
  connection = Connection{};
  connection.socket = sock;
  connection.address = address;
  connection.port = port;
  connection.deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(limits_.request_timeout_s));
  address_out = address;
  port_out = port;
  changed_.notify_all();
  return sock;
}

void GuardedServer::release(int sock, const std::string& address, int port) {
  std::lock_guard<std::mutex> lock(mutex_);
  --counters_.open;
  if (--per_client_[address] == 0) per_client_.erase(address);
  // Between httplib's close and this call the number may already belong to a new connection.
  auto it = connections_.find(sock);
  if (it != connections_.end() && it->second.address == address && it->second.port == port) connections_.erase(it);
}

GuardedServer::Connection* GuardedServer::find(const httplib::Request& request) {
  for (auto& [sock, connection] : connections_) {
    if (connection.port == request.remote_port && connection.address == request.remote_addr) return &connection;
  }
  return nullptr;
}

const GuardedServer::Connection* GuardedServer::find(const httplib::Request& request) const {
  return const_cast<GuardedServer*>(this)->find(request);
}

void GuardedServer::request_read(const httplib::Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Connection* connection = find(request)) connection->armed = false;
}

void GuardedServer::response_written(const httplib::Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  Connection* connection = find(request);
  if (connection == nullptr) return;
  if (connection->close_after_response) {
    ::shutdown(connection->socket, SHUT_RDWR);  // httplib's next read ends the connection
    return;
  }
  connection->armed = true;
  connection->deadline = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(limits_.request_timeout_s));
  changed_.notify_all();
}

void GuardedServer::close_after_response(const httplib::Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Connection* connection = find(request)) connection->close_after_response = true;
}

int GuardedServer::socket_of(const httplib::Request& request) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Connection* connection = find(request);
  return connection == nullptr ? -1 : connection->socket;
}

ConnectionCounters GuardedServer::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

void GuardedServer::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    auto next = now + std::chrono::seconds(1);
    for (auto& [key, connection] : connections_) {
      if (!connection.armed) continue;
      if (connection.deadline <= now) {
        // Wakes the connection's thread from its read; the thread ends it and closes the socket.
        ::shutdown(connection.socket, SHUT_RDWR);
        connection.armed = false;
        ++counters_.timed_out_total;
      } else {
        next = std::min(next, connection.deadline);
      }
    }
    changed_.wait_until(lock, next);
  }
}

void ConnectionThreads::enqueue(std::function<void()> task) {
  int refused = -1, port = 0;
  std::string message, address;
  const int sock = server_->admit_newest(refused, message, address, port);
  if (sock == -1) {
    start([refused, message] { GuardedServer::refuse(refused, message); });  // the task never runs
  } else if (sock == -2) {
    start(std::move(task));
  } else {
    GuardedServer* server = server_;
    start([server, sock, address, port, task = std::move(task)] {
      task();  // httplib serves the connection and closes its socket
      server->release(sock, address, port);
    });
  }
}

void ConnectionThreads::start(std::function<void()> body) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++running_;
  }
  std::thread([this, body = std::move(body)] {
    body();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--running_ == 0) done_.notify_all();
  }).detach();
}

void ConnectionThreads::shutdown() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return running_ == 0; });
}

}  // namespace serve
}  // namespace dschat
