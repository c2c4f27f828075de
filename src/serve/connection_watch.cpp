#include "serve/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace dschat {
namespace serve {
namespace {

}  // namespace

bool peer_of(int fd, std::string& address, int& port) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    port = ntohs(v4->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&peer);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  address = text;
  return true;
}

namespace {

// The port a socket is bound to, or -1.
int local_port_of(int fd) {
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) return -1;
  if (local.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
  if (local.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
  return -1;
}

// The first of this process's sockets for which `match(fd)` holds, or -1.
template <typename Match>
int find_socket(Match&& match) {
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = ::readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;  // "." and ".."
    struct stat info {};
    if (::fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    if (match(static_cast<int>(fd))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(fds);
  return found;
}

}  // namespace

std::vector<int> accepted_sockets(int port) {
  std::vector<int> found;
  find_socket([&](int fd) {
    int accepting = 0;
    socklen_t length = sizeof(accepting);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &length) != 0 || accepting != 0) return false;
    std::string address;
    int peer_port = 0;
    if (local_port_of(fd) == port && peer_of(fd, address, peer_port)) found.push_back(fd);
    return false;  // every one
  });
  return found;
}

bool widen_listen_backlog(int port) {
  const int listener = find_socket([&](int fd) {
    int accepting = 0;
    socklen_t length = sizeof(accepting);
    return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &length) == 0 && accepting != 0 &&
           local_port_of(fd) == port;
  });
  return listener >= 0 && ::listen(listener, SOMAXCONN) == 0;  // listen() again only resizes the queue
}

bool peer_closed(int socket) {
  if (socket < 0) return false;
  pollfd watch{socket, POLLIN | POLLRDHUP, 0};
  if (::poll(&watch, 1, 0) <= 0) return false;  // nothing happened on it
  if (watch.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // Readable: either bytes of a next request, or end of stream (recv returns 0).
  char byte = 0;
  const ssize_t got = ::recv(socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return got == 0;
}

}  // namespace serve
}  // namespace dschat
