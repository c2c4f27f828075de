#include "signal_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

#include "dschat/core/error.h"

namespace dschat {
namespace dist {
namespace {

// Signal handlers can only reach globals; the relay is a singleton for that reason.
std::atomic<bool> relay_alive{false};
int wake_pipe[2] = {-1, -1};
volatile sig_atomic_t pending_stop_signal = 0;

extern "C" void on_signal(int signal_number) {
  const int saved_errno = errno;  // the interrupted code may be about to read errno
  if (signal_number == SIGINT || signal_number == SIGTERM) pending_stop_signal = signal_number;
  const char byte = 0;
  ssize_t ignored = ::write(wake_pipe[1], &byte, 1);  // non-blocking: a full pipe already wakes
  (void)ignored;
  errno = saved_errno;
}

}  // namespace

SignalRelay::SignalRelay() {
  bool expected = false;
  DSCHAT_CHECK(relay_alive.compare_exchange_strong(expected, true), Error,
               "launch: another launch is already running in this process");
  if (::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    relay_alive = false;
    DSCHAT_THROW(Error, "launch: pipe failed: ", strerror(errno));
  }
  pending_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, &old_int_);
  ::sigaction(SIGTERM, &action, &old_term_);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &action, &old_chld_);
}

SignalRelay::~SignalRelay() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  ::sigaction(SIGCHLD, &old_chld_, nullptr);
  ::close(wake_pipe[0]);
  ::close(wake_pipe[1]);
  wake_pipe[0] = wake_pipe[1] = -1;
  relay_alive = false;
}

int SignalRelay::wake_fd() const { return wake_pipe[0]; }

void SignalRelay::drain() {
  char buffer[64];
  while (::read(wake_pipe[0], buffer, sizeof(buffer)) > 0) {
  }
}

int SignalRelay::take_stop_signal() {
  const int signal_number = pending_stop_signal;
  pending_stop_signal = 0;
  return signal_number;
}

}  // namespace dist
}  // namespace dschat
