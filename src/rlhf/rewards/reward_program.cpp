#include "dschat/rlhf/rewards/reward_program.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include "dschat/core/error.h"

extern char** environ;

namespace dschat {
namespace rlhf {
namespace {

using Clock = std::chrono::steady_clock;

std::string quoted(const std::string& line) {
  constexpr size_t kShown = 200;
  return "'" + (line.size() > kShown ? line.substr(0, kShown) + "..." : line) + "'";
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "it exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "it was killed by signal " + std::to_string(WTERMSIG(status));
  return "it stopped";
}

}  // namespace

RewardProgram::RewardProgram(RewardProgramOptions options) : options_(std::move(options)) {
  DSCHAT_CHECK(!options_.argv.empty() && !options_.argv[0].empty(), InvalidArgument,
               "reward program: \"argv\" is empty; it needs at least the program to run");
  for (const std::string& arg : options_.argv) name_ += (name_.empty() ? "" : " ") + arg;
  // A socket pair rather than pipes: send(MSG_NOSIGNAL) to a program that died reports EPIPE
  // instead of raising SIGPIPE in this process.
  int fds[2];
  DSCHAT_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0, IoError, "reward program '", name_,
               "': socketpair failed (", std::strerror(errno), ")");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDIN_FILENO);  // dup2 clears close-on-exec
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  std::vector<char*> argv;
  for (std::string& arg : options_.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int rc = ::posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    pid_ = -1;
    throw core::IoError("reward program '" + name_ + "': cannot start " + options_.argv[0] + " (" +
                        std::strerror(rc) + ")");
  }
  fd_ = fds[0];
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

RewardProgram::~RewardProgram() { stop(); }

void RewardProgram::stop() {
  if (fd_ >= 0) {
    ::shutdown(fd_, SHUT_WR);  // end of input: a well-behaved program exits
  }
  if (pid_ > 0) {
    int status = 0;
    const auto give_up = Clock::now() + std::chrono::seconds(1);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() >= give_up) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void RewardProgram::fail_io(const std::string& what) {
  broken_ = true;
  std::string how;
  if (pid_ > 0) {
    // An ended output usually means an exiting program: give it a moment to be reaped, so the
    // message can say how it ended; a hung one is killed after that.
    int status = 0;
    const auto give_up = Clock::now() + std::chrono::seconds(2);
    pid_t reaped = 0;
    while ((reaped = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (reaped == pid_) {
      how = " (" + describe_status(status) + ")";
      pid_ = -1;
    } else {
      ::kill(pid_, SIGKILL);  // hung or misbehaving: not used again
    }
  }
  stop();
  throw core::IoError("reward program '" + name_ + "': " + what + how);
}

std::vector<double> RewardProgram::score(const std::vector<RewardQuery>& queries) {
  DSCHAT_CHECK(!broken_, IoError, "reward program '", name_, "' failed earlier in this run; it is not used again");
  std::string input;
  for (const RewardQuery& q : queries) {
    input += nlohmann::json{{"prompt", q.prompt}, {"response", q.response}, {"meta", q.meta}}.dump() + "\n";
  }
  std::vector<double> rewards;
  rewards.reserve(queries.size());
  size_t written = 0;
  const auto deadline = Clock::now() + options_.timeout;
  while (rewards.size() < queries.size()) {
    for (size_t end; rewards.size() < queries.size() && (end = pending_.find('\n')) != std::string::npos;) {
      const std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      const size_t k = rewards.size();
      const nlohmann::json answer = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool object = !answer.is_discarded() && answer.is_object();
      const auto it = object ? answer.find("reward") : answer.end();
      const bool numeric = object && it != answer.end() && it->is_number();
      if (!numeric || !std::isfinite(it->get<double>())) {
        broken_ = true;
        stop();
        const std::string why = !object                        ? "is not a JSON object"
                                : it == answer.end()           ? "has no \"reward\""
                                : !numeric                     ? "has a \"reward\" that is not a number"
                                                               : "has a reward that is not finite";
        throw core::FormatError("reward program '" + name_ + "': its answer to query " + std::to_string(k) + " " +
                                why + ": " + quoted(line));
      }
      rewards.push_back(it->get<double>());
    }
    if (rewards.size() == queries.size()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      fail_io("no answer to query " + std::to_string(rewards.size()) + " within " +
              std::to_string(options_.timeout.count()) + " ms (killed)");
    }
    pollfd p{fd_, static_cast<short>(POLLIN | (written < input.size() ? POLLOUT : 0)), 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (ready < 0 && errno != EINTR) fail_io(std::string("poll failed (") + std::strerror(errno) + ")");
    if (ready <= 0) continue;
    if (p.revents & POLLOUT) {
      const ssize_t n = ::send(fd_, input.data() + written, input.size() - written, MSG_NOSIGNAL);
      if (n > 0) {
        written += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail_io("it stopped reading its input at query " + std::to_string(rewards.size()) + " (" +
                std::strerror(errno) + ")");
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[1 << 16];
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n > 0) {
        pending_.append(buffer, static_cast<size_t>(n));
      } else if (n == 0) {
        fail_io("its output ended before the answer to query " + std::to_string(rewards.size()));
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail_io(std::string("reading its answers failed (") + std::strerror(errno) + ")");
      }
    }
  }
  return rewards;
}

}  // namespace rlhf
}  // namespace dschat
