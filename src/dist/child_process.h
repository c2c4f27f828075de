#pragma once
// Starting and describing the launcher's child processes (POSIX fork/exec, Linux prctl).

#include <sys/types.h>

#include <string>
#include <vector>

namespace dschat {
namespace dist {

enum class ChildStdin {
  Inherit,  // the launcher's own stdin (torchrun does the same)
  DevNull,  // nothing: ranks of a launcher whose stdin is its ssh channel
  Pipe,     // a pipe whose write end the launcher keeps; closing it is an end of file there
};

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is run as given when it has a '/', else found in PATH
  std::vector<std::string> env;   // the complete environment, "NAME=value"
  ChildStdin stdin_mode = ChildStdin::Inherit;
};

struct StartedChild {
  pid_t pid = -1;
  int stdin_writer = -1;  // with ChildStdin::Pipe, else -1
};

/// Forks and execs `spec`. The child leads its own process group (so signals reach whatever it
/// starts, and a terminal's Ctrl-C reaches only the launcher, which forwards it once) and gets
/// SIGTERM if the launcher dies. Throws core::InvalidArgument when the program is not found and
/// core::Error when fork or exec fails (exec errors come back through a close-on-exec pipe).
StartedChild start_child(const ChildSpec& spec);

/// "exited with code 3", "was killed by SIGKILL" for a waitpid status.
std::string describe_exit_status(int status);

/// The shell's convention: the exit code, or 128 + the signal number.
int exit_code_of_status(int status);

/// "SIGKILL", "SIGTERM", ... ("signal 42" for ones without a name here).
std::string signal_name(int signal_number);

}  // namespace dist
}  // namespace dschat
