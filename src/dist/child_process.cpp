#include "child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>

#include "core/env.h"
#include "dschat/core/error.h"

namespace dschat {
namespace dist {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// execvp's PATH search, done before fork: between fork and exec only async-signal-safe calls are
// allowed, and a missing program is then an error of the launcher, not an exit code of a rank.
std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::stringstream path(core::read_string_from_env("PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
  for (std::string dir; std::getline(path, dir, ':');) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
  }
  DSCHAT_THROW(InvalidArgument, "launch: command '", name, "' was not found in PATH");
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

void close_if_open(int fd) {
  if (fd >= 0) ::close(fd);
}

// Runs in the forked child: async-signal-safe calls only, and no return.
[[noreturn]] void exec_child(const char* program, char* const* argv, char* const* envp, pid_t launcher,
                             int stdin_fd, int error_fd) {
  ::setpgid(0, 0);
  // SIGTERM when the launcher dies, even by SIGKILL, so no rank outlives it; if it already died
  // before this line, getppid() no longer names it.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(127);
  // The launcher's own handlers are reset by exec anyway; ignored signals and the mask are not.
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (stdin_fd >= 0) ::dup2(stdin_fd, 0);
  ::execve(program, argv, envp);
  int error = errno;
  ssize_t ignored = ::write(error_fd, &error, sizeof(error));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

StartedChild start_child(const ChildSpec& spec) {
  DSCHAT_CHECK(!spec.argv.empty() && !spec.argv[0].empty(), InvalidArgument, "launch: empty command");
  const std::string program = resolve_program(spec.argv[0]);
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);

  int stdin_fd = -1;
  int stdin_writer = -1;
  if (spec.stdin_mode == ChildStdin::DevNull) {
    stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  } else if (spec.stdin_mode == ChildStdin::Pipe) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) == 0) {
      stdin_fd = fds[0];
      stdin_writer = fds[1];
    }
  }
  DSCHAT_CHECK(spec.stdin_mode == ChildStdin::Inherit || stdin_fd >= 0, Error, "launch: cannot set up stdin for '",
               program, "': ", strerror(errno));
  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0) {
    int error = errno;
    close_if_open(stdin_fd);
    close_if_open(stdin_writer);
    DSCHAT_THROW(Error, "launch: pipe failed: ", strerror(error));
  }

  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) exec_child(program.c_str(), argv.data(), envp.data(), launcher, stdin_fd, error_pipe[1]);
  const int fork_error = errno;
  ::close(error_pipe[1]);
  close_if_open(stdin_fd);
  if (pid < 0) {
    ::close(error_pipe[0]);
    close_if_open(stdin_writer);
    DSCHAT_THROW(Error, "launch: fork failed for '", program, "': ", strerror(fork_error));
  }
  // Also here, so the group exists before the launcher signals it, whoever runs first.
  ::setpgid(pid, pid);

  // The pipe closes at exec (success: nothing to read) or carries exec's errno.
  int exec_error = 0;
  ssize_t got = 0;
  do {
    got = ::read(error_pipe[0], &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  ::close(error_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(exec_error))) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close_if_open(stdin_writer);
    DSCHAT_THROW(Error, "launch: cannot run '", program, "': ", strerror(exec_error));
  }
  return {pid, stdin_writer};
}

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal " + std::to_string(signal_number);
  }
}

std::string describe_exit_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by " + signal_name(WTERMSIG(status)) + (WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace dist
}  // namespace dschat
