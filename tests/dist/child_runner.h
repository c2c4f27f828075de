#pragma once
// Processes for the launcher tests: start a command with its output in files, watch the files,
// signal it, wait for it with a deadline. A Process still running when destroyed is SIGKILLed (its
// process group too, in case it is a launcher) and reaped, so a failing test leaves nothing behind.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rank_jobs.h"  // free_port, count_lines_starting

extern char** environ;

namespace dschat {
namespace testing {

inline std::string read_text(const std::filesystem::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

class Process {
 public:
  /// Starts argv (argv[0] looked up in PATH) with this environment plus `extra_env` ("NAME=value"
  /// replaces an inherited NAME, a bare "NAME" removes it), stdout and stderr into the given files.
  Process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
          const std::filesystem::path& out, const std::filesystem::path& err)
      : out_(out), err_(err) {
    std::vector<std::string> env;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string text = *entry;
      bool replaced = false;
      for (const std::string& extra : extra_env) {
        replaced = replaced || text.rfind(extra.substr(0, extra.find('=')) + "=", 0) == 0;
      }
      if (!replaced) env.push_back(text);
    }
    for (const std::string& extra : extra_env) {
      if (extra.find('=') != std::string::npos) env.push_back(extra);
    }
    std::vector<char*> envp, args;
    for (auto& entry : env) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& arg : argv_copy) args.push_back(arg.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&files, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);  // its own group: cleanup kills all of it
    posix_spawnattr_setpgroup(&attributes, 0);
    start_ = std::chrono::steady_clock::now();
    if (posix_spawnp(&pid_, args[0], &files, &attributes, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&files);
  }

  ~Process() {
    if (running()) {
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      wait_for(std::chrono::seconds(10));
    }
  }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool started() const { return pid_ > 0; }
  bool running() const { return pid_ > 0 && !status_; }
  pid_t pid() const { return pid_; }
  void signal(int signal_number) const {
    if (running()) kill(pid_, signal_number);
  }

  /// The wait status, or nullopt when it is still running after `limit`.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    auto give_up_at = std::chrono::steady_clock::now() + limit;
    while (running()) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        end_ = std::chrono::steady_clock::now();
        break;
      }
      if (std::chrono::steady_clock::now() > give_up_at) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }

  /// Exit code, or 128 + signal, or -1 while running.
  int exit_code() const {
    if (!status_) return -1;
    return WIFEXITED(*status_) ? WEXITSTATUS(*status_) : 128 + WTERMSIG(*status_);
  }

  /// Seconds from start to exit (or to now while running).
  double seconds() const {
    auto end = status_ ? end_ : std::chrono::steady_clock::now();
    return std::chrono::duration<double>(end - start_).count();
  }

  std::string out() const { return read_text(out_); }
  std::string err() const { return read_text(err_); }

  /// Waits until stdout contains `text`; false after `limit` or once the process exited without it.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds limit) {
    auto give_up_at = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < give_up_at) {
      if (out().find(text) != std::string::npos) return true;
      if (wait_for(std::chrono::milliseconds(0))) return out().find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  std::filesystem::path out_, err_;
  pid_t pid_ = -1;
  std::optional<int> status_;
  std::chrono::steady_clock::time_point start_, end_;
};

}  // namespace testing
}  // namespace dschat
