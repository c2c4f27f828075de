// `dschat launch`: per-node rank start-up and supervision (see dschat/dist/launcher.h).
#include "dschat/dist/launcher.h"

#include "core/strings.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <numeric>
#include <sstream>

#include "child_process.h"
#include "core/env.h"
#include "dschat/core/error.h"
#include "signal_relay.h"

extern char** environ;

namespace dschat {
namespace dist {
namespace {

using core::starts_with;

using Clock = std::chrono::steady_clock;

// The variables each rank gets from the launcher. Inherited copies are dropped first so a launch
// nested in another job (or run under torchrun) cannot leak the outer job's values. torchrun's
// agent-store flag is dropped too: here rank 0 serves the store itself.
const char* const kRankVariables[] = {"RANK",         "LOCAL_RANK",       "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                      "LOCAL_SIZE",   "GROUP_RANK",       "NODE_RANK",  "GROUP_WORLD_SIZE",
                                      "CROSS_RANK",   "CROSS_SIZE",       "MASTER_ADDR", "MASTER_PORT",
                                      "TORCHELASTIC_"};


bool is_rank_variable(const std::string& entry) {
  for (const char* name : kRankVariables) {
    const std::string prefix(name);
    if (prefix.back() == '_' ? starts_with(entry, prefix) : starts_with(entry, prefix + "=")) return true;
  }
  return false;
}

// What a remote node's launcher needs from this environment, after DeepSpeed's runner (which
// exports NCCL*, PYTHON*, UCX*, MV2*): the transport and threading knobs, not host-specific paths.
bool is_forwarded_to_remote_nodes(const std::string& entry) {
  for (const char* prefix : {"NCCL_", "GLOO_", "UCX_", "PYTHON", "TORCH_", "DSCHAT_", "OMP_NUM_THREADS="}) {
    if (starts_with(entry, prefix)) return !starts_with(entry, "DSCHAT_SSH=");
  }
  return false;
}

std::string shell_quote(const std::string& word) {
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string local_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::string current_directory() {
  std::vector<char> buffer(4096);
  DSCHAT_CHECK(::getcwd(buffer.data(), buffer.size()) != nullptr, Error,
               "launch: cannot read the current directory (needed for the remote nodes' `cd`)");
  return buffer.data();
}

std::string join_slots(const std::vector<int64_t>& slots) {
  std::string text;
  for (int64_t n : slots) text += (text.empty() ? "" : ",") + std::to_string(n);
  return text;
}

void validate(const LaunchPlan& plan) {
  DSCHAT_CHECK(!plan.command.empty() && !plan.command[0].empty(), InvalidArgument,
               "launch: no command given for the ranks to run");
  DSCHAT_CHECK(!plan.node_slots.empty(), InvalidArgument, "launch: node_slots is empty");
  for (size_t node = 0; node < plan.node_slots.size(); ++node) {
    DSCHAT_CHECK(plan.node_slots[node] >= 1, InvalidArgument, "launch: node ", node, " has ",
                 plan.node_slots[node], " ranks; every node needs at least 1");
  }
  const auto nodes = static_cast<int64_t>(plan.node_slots.size());
  DSCHAT_CHECK(plan.node_rank >= 0 && plan.node_rank < nodes, InvalidArgument, "launch: node rank ",
               plan.node_rank, " is out of range for ", nodes, " node(s) (expected 0..", nodes - 1, ")");
  DSCHAT_CHECK(plan.hosts.empty() || plan.hosts.size() == plan.node_slots.size(), InvalidArgument, "launch: ",
               plan.hosts.size(), " hosts for ", plan.node_slots.size(), " nodes");
  DSCHAT_CHECK(plan.master_port >= 1 && plan.master_port <= 65535, InvalidArgument, "launch: master port ",
               plan.master_port, " is out of range (expected 1..65535)");
  DSCHAT_CHECK(nodes == 1 || !plan.master_addr.empty() || !plan.hosts.empty(), InvalidArgument,
               "launch: a job on ", nodes, " nodes needs the master address (the host of rank 0)");
  DSCHAT_CHECK(plan.hosts.size() <= 1 || !plan.remote_launcher.empty(), InvalidArgument,
               "launch: starting other hosts needs remote_launcher (the `dschat launch` command there)");
  DSCHAT_CHECK(plan.stop_grace.count() >= 0, InvalidArgument, "launch: negative stop grace");
}

std::string master_address(const LaunchPlan& plan) {
  if (!plan.master_addr.empty()) return plan.master_addr;
  // One node rendezvouses on loopback, even when a hostfile names it (as DeepSpeed's local mode).
  return plan.hosts.empty() || plan.node_slots.size() == 1 ? "127.0.0.1" : plan.hosts[0];
}

std::vector<std::string> rank_environment(const LaunchPlan& plan, int64_t local_rank) {
  const int64_t world = std::accumulate(plan.node_slots.begin(), plan.node_slots.end(), int64_t{0});
  const int64_t first_rank =
      std::accumulate(plan.node_slots.begin(), plan.node_slots.begin() + plan.node_rank, int64_t{0});
  const int64_t local_world = plan.node_slots[plan.node_rank];
  const std::string nodes = std::to_string(plan.node_slots.size());
  const std::string node = std::to_string(plan.node_rank);
  std::vector<std::string> env;
  bool has_omp_threads = false;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (is_rank_variable(*entry)) continue;
    has_omp_threads = has_omp_threads || starts_with(*entry, "OMP_NUM_THREADS=");
    env.emplace_back(*entry);
  }
  // torchrun and DeepSpeed names side by side: LOCAL_SIZE/CROSS_* are DeepSpeed's launcher's.
  for (const std::string& entry : {
           "RANK=" + std::to_string(first_rank + local_rank), "LOCAL_RANK=" + std::to_string(local_rank),
           "WORLD_SIZE=" + std::to_string(world), "LOCAL_WORLD_SIZE=" + std::to_string(local_world),
           "LOCAL_SIZE=" + std::to_string(local_world), "GROUP_RANK=" + node, "NODE_RANK=" + node,
           "GROUP_WORLD_SIZE=" + nodes, "CROSS_RANK=" + node, "CROSS_SIZE=" + nodes,
           "MASTER_ADDR=" + master_address(plan), "MASTER_PORT=" + std::to_string(plan.master_port)}) {
    env.push_back(entry);
  }
  // As torchrun: several ranks with a full OpenMP pool each oversubscribe the cores.
  if (!has_omp_threads && local_world > 1) env.emplace_back("OMP_NUM_THREADS=1");
  return env;
}

std::vector<std::string> ssh_words(const LaunchPlan& plan) {
  std::string command = plan.ssh_command;
  if (command.empty()) command = core::read_string_from_env("DSCHAT_SSH").value_or("ssh -o BatchMode=yes");
  std::istringstream words_in(command);
  std::vector<std::string> words;
  for (std::string word; words_in >> word;) words.push_back(word);
  DSCHAT_CHECK(!words.empty(), InvalidArgument, "launch: the ssh command is empty (plan or DSCHAT_SSH)");
  return words;
}

struct Child {
  std::string label;  // "rank 1 (pid 1234, host a)", "node 1 (host b, ranks 2-3; ssh pid 1235)"
  pid_t pid = -1;
  int stdin_writer = -1;
  bool reaped = false;
};

void say(const std::string& line) { std::cerr << "dschat launch: " << line << std::endl; }

// Signals the child's whole process group (it leads one); the pgid stays valid until it is reaped.
void signal_child(Child& child, int signal_number) {
  if (child.reaped) return;
  if (::kill(-child.pid, signal_number) != 0) ::kill(child.pid, signal_number);
  if (child.stdin_writer >= 0) {  // the remote launcher's cue that this one is gone
    ::close(child.stdin_writer);
    child.stdin_writer = -1;
  }
}

class Supervisor {
 public:
  Supervisor(std::vector<Child>& children, std::chrono::milliseconds grace, bool watch_stdin)
      : children_(children), grace_(grace), watch_stdin_(watch_stdin) {}

  // Waits until every child is reaped; returns the job's exit status.
  int run(SignalRelay& relay) {
    while (running() > 0) {
      pollfd fds[2] = {{relay.wake_fd(), POLLIN, 0}, {0, POLLIN, 0}};
      const int watched = watch_stdin_ ? 2 : 1;
      if (::poll(fds, watched, 100) > 0 && (fds[0].revents & POLLIN)) relay.drain();
      reap();
      if (int signal_number = relay.take_stop_signal()) on_stop_signal(signal_number);
      if (watch_stdin_ && (fds[1].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) check_stdin();
      enforce_grace();
    }
    return result_;
  }

  // Used when start-up fails half way: SIGTERM, grace, SIGKILL, reap.
  void stop_all() {
    begin_stop(SIGTERM);
    while (running() > 0) {
      ::usleep(20000);
      reap();
      enforce_grace();
    }
  }

 private:
  size_t running() const {
    size_t count = 0;
    for (const Child& child : children_) count += child.reaped ? 0 : 1;
    return count;
  }

  void reap() {
    for (Child& child : children_) {
      int status = 0;
      if (child.reaped || ::waitpid(child.pid, &status, WNOHANG) != child.pid) continue;
      child.reaped = true;
      if (child.stdin_writer >= 0) ::close(child.stdin_writer);
      child.stdin_writer = -1;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (!failed || stopping_) continue;  // after the first failure the rest is the fallout
      result_ = exit_code_of_status(status);
      say(child.label + " " + describe_exit_status(status) +
          (running() > 0 ? "; stopping the other ranks" : ""));
      begin_stop(SIGTERM);
    }
  }

  void on_stop_signal(int signal_number) {
    if (stopping_) {  // a second Ctrl-C: do not wait out the grace period
      say("got " + signal_name(signal_number) + " again; killing the ranks");
      for (Child& child : children_) signal_child(child, SIGKILL);
      killed_ = true;
      return;
    }
    say("got " + signal_name(signal_number) + "; forwarding it to the ranks");
    result_ = 128 + signal_number;
    begin_stop(signal_number);
  }

  void check_stdin() {
    char buffer[256];
    ssize_t got = ::read(0, buffer, sizeof(buffer));
    if (got > 0 || (got < 0 && errno == EINTR)) return;  // stray input is ignored
    watch_stdin_ = false;
    if (stopping_) return;
    say("stdin closed: the launcher that started this node is gone; stopping the ranks");
    result_ = 128 + SIGHUP;
    begin_stop(SIGTERM);
  }

  void begin_stop(int signal_number) {
    stopping_ = true;
    stop_deadline_ = Clock::now() + grace_;
    for (Child& child : children_) signal_child(child, signal_number);
  }

  void enforce_grace() {
    if (!stopping_ || killed_ || Clock::now() < stop_deadline_) return;
    for (Child& child : children_) {
      if (child.reaped) continue;
      std::ostringstream seconds;
      seconds << grace_.count() / 1000.0;
      say(child.label + " did not stop within " + seconds.str() + " s of being told to; sending SIGKILL");
      signal_child(child, SIGKILL);
    }
    killed_ = true;
  }

  std::vector<Child>& children_;
  std::chrono::milliseconds grace_;
  bool watch_stdin_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point stop_deadline_;
  int result_ = 0;
};

std::string rank_range(int64_t first, int64_t count) {
  return count == 1 ? "rank " + std::to_string(first)
                    : "ranks " + std::to_string(first) + "-" + std::to_string(first + count - 1);
}

}  // namespace

std::vector<std::string> remote_node_argv(const LaunchPlan& plan, int64_t node) {
  validate(plan);
  DSCHAT_CHECK(node >= 0 && node < static_cast<int64_t>(plan.hosts.size()), InvalidArgument, "launch: node ",
               node, " has no host (", plan.hosts.size(), " hosts)");
  std::string remote = "cd " + shell_quote(current_directory()) + " && exec env";
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (is_forwarded_to_remote_nodes(*entry)) remote += " " + shell_quote(*entry);
  }
  for (const std::string& word : plan.remote_launcher) remote += " " + shell_quote(word);
  remote += " --node-slots " + join_slots(plan.node_slots) + " --node-rank " + std::to_string(node) +
            " --master-addr " + shell_quote(master_address(plan)) + " --master-port " +
            std::to_string(plan.master_port) + " --stop-on-stdin-eof --";
  for (const std::string& word : plan.command) remote += " " + shell_quote(word);
  std::vector<std::string> argv = ssh_words(plan);
  argv.push_back(plan.hosts[node]);
  argv.push_back(remote);
  return argv;
}

int launch(const LaunchPlan& plan) {
  validate(plan);
  SignalRelay relay;  // before the first fork, so no SIGCHLD or Ctrl-C slips past
  const std::string host = plan.hosts.empty() ? local_hostname() : plan.hosts[plan.node_rank];
  const int64_t first_rank =
      std::accumulate(plan.node_slots.begin(), plan.node_slots.begin() + plan.node_rank, int64_t{0});
  std::vector<Child> children;
  children.reserve(plan.node_slots.size() + plan.node_slots[plan.node_rank]);
  Supervisor supervisor(children, plan.stop_grace, plan.stop_when_stdin_closes);
  try {
    for (int64_t local_rank = 0; local_rank < plan.node_slots[plan.node_rank]; ++local_rank) {
      ChildSpec spec{plan.command, rank_environment(plan, local_rank),
                     plan.stop_when_stdin_closes ? ChildStdin::DevNull : ChildStdin::Inherit};
      StartedChild started = start_child(spec);
      children.push_back({rank_range(first_rank + local_rank, 1) + " (pid " + std::to_string(started.pid) +
                              ", host " + host + ")",
                          started.pid, started.stdin_writer});
    }
    if (plan.hosts.size() > 1) {
      int64_t node_first_rank = 0;
      for (int64_t node = 0; node < static_cast<int64_t>(plan.hosts.size()); ++node) {
        const int64_t slots = plan.node_slots[node];
        if (node != plan.node_rank) {
          ChildSpec spec{remote_node_argv(plan, node), {}, ChildStdin::Pipe};
          for (char** entry = environ; *entry != nullptr; ++entry) spec.env.emplace_back(*entry);
          StartedChild started = start_child(spec);
          children.push_back({"node " + std::to_string(node) + " (host " + plan.hosts[node] + ", " +
                                  rank_range(node_first_rank, slots) + "; ssh pid " +
                                  std::to_string(started.pid) + ")",
                              started.pid, started.stdin_writer});
        }
        node_first_rank += slots;
      }
    }
  } catch (...) {
    supervisor.stop_all();
    throw;
  }
  return supervisor.run(relay);
}

}  // namespace dist
}  // namespace dschat
