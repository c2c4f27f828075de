#pragma once
// Socket-level help for cpp-httplib 0.11: noticing that an HTTP client went away while its answer
// is still being generated (so the generation is cancelled instead of run to max_tokens for
// nobody; the socket comes from GuardedServer::socket_of), a peer's address, the accept backlog.

#include <string>
#include <vector>

namespace dschat {
namespace serve {

/// The printable address and port of a socket's peer; false for non-IP or unconnected sockets.
bool peer_of(int fd, std::string& address, int& port);

/// Raises the accept backlog of this process's listening socket on `port` to the system's maximum
/// (httplib 0.11 listens with a backlog of 5: a burst of 64 connecting clients would see dropped
/// SYNs and a second's retry each). Returns false when no such socket is found.
bool widen_listen_backlog(int port);

/// This process's connected sockets whose local port is `port` (the connections a server on it
/// accepted), from /proc/self/fd.
std::vector<int> accepted_sockets(int port);

/// True when the peer closed or reset the connection (a half-closed or reset socket; pending
/// request bytes, such as a pipelined next request, do not count as closed).
bool peer_closed(int socket);

}  // namespace serve
}  // namespace dschat
