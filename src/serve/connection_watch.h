#pragma once
// Socket-level help for cpp-httplib 0.11. Noticing that an HTTP client went away while its answer is still being generated, so the
// generation can be cancelled instead of run to max_tokens for nobody. cpp-httplib 0.11 (Debian 12)
// does not expose a request's socket, so it is looked up once by the client's address and port
// among this process's sockets (Linux /proc/self/fd), then polled.

#include <string>

namespace dschat {
namespace serve {

/// The socket connected to remote_addr:remote_port, or -1 when none is found (the watch is then
/// off for that request: it still ends, after max_tokens).
int find_connection_socket(const std::string& remote_addr, int remote_port);

/// Raises the accept backlog of this process's listening socket on `port` to the system's maximum
/// (httplib 0.11 listens with a backlog of 5: a burst of 64 connecting clients would see dropped
/// SYNs and a second's retry each). Returns false when no such socket is found.
bool widen_listen_backlog(int port);

/// True when the peer closed or reset the connection (a half-closed or reset socket; pending
/// request bytes, such as a pipelined next request, do not count as closed).
bool peer_closed(int socket);

}  // namespace serve
}  // namespace dschat
