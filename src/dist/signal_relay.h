#pragma once
// The launcher's signal handling: SIGINT and SIGTERM are recorded (to be forwarded to the ranks)
// and SIGCHLD only wakes the launcher, all through a self-pipe its poll loop watches. The previous
// handlers come back when the relay is destroyed; one relay may exist at a time.

#include <csignal>

namespace dschat {
namespace dist {

class SignalRelay {
 public:
  /// Throws core::Error when another SignalRelay is alive or the pipe cannot be made.
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  /// Readable after any of the three signals arrived; poll() it.
  int wake_fd() const;
  /// Empties the pipe (after poll() said it is readable).
  void drain();
  /// SIGINT or SIGTERM if one arrived since the last call, else 0.
  int take_stop_signal();

 private:
  struct sigaction old_int_ {}, old_term_ {}, old_chld_ {};
};

}  // namespace dist
}  // namespace dschat
