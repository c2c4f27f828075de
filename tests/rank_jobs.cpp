#include "rank_jobs.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "test_util.h"

extern char** environ;

namespace dschat {
namespace testing {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

bool is_launcher_variable(const std::string& entry) {
  static const char* kPrefixes[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "LOCAL_SIZE=",
                                    "MASTER_ADDR=", "MASTER_PORT=", "GLOO_SOCKET_IFNAME=", "OMPI_COMM_WORLD_",
                                    "SLURM_", "GROUP_RANK=", "NODE_RANK="};
  for (const char* prefix : kPrefixes) {
    if (entry.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

JobOutcome run_once(const JobSpec& spec, int port) {
  TempDir dir;
  const int world = spec.world_size;
  std::vector<pid_t> pids(world, -1);
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> env_strings;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      if (!is_launcher_variable(*entry)) env_strings.emplace_back(*entry);
    }
    for (const std::string& entry :
         {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=" + std::to_string(rank),
          "LOCAL_WORLD_SIZE=" + std::to_string(world), std::string("MASTER_ADDR=127.0.0.1"),
          "MASTER_PORT=" + std::to_string(port), std::string("OMP_NUM_THREADS=1")}) {
      env_strings.push_back(entry);
    }
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = spec.argv;
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const std::string out_path = (dir / ("rank" + std::to_string(rank) + ".out")).string();
    const std::string err_path = (dir / ("rank" + std::to_string(rank) + ".err")).string();
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pids[rank], args[0].c_str(), &files, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&files);
    EXPECT_EQ(rc, 0) << "cannot start " << args[0];
    if (rc != 0) pids[rank] = -1;
  }

  JobOutcome job;
  job.ranks.resize(world);
  const auto give_up_at = start + spec.deadline;
  int running = 0;
  for (pid_t pid : pids) running += pid > 0 ? 1 : 0;
  auto kill_all = [&] {
    for (pid_t pid : pids) {
      if (pid > 0) kill(pid, SIGKILL);
    }
  };
  while (running > 0) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int rank = 0; rank < world; ++rank) {
      int status = 0;
      if (pids[rank] <= 0 || waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      job.ranks[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      job.ranks[rank].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      job.ranks[rank].seconds = elapsed;
      pids[rank] = -1;
      --running;
      if (rank == 0 && spec.stop_peers_after_rank0) kill_all();
    }
    if (running > 0 && spec.monitor) spec.monitor(pids, elapsed);
    if (running > 0 && std::chrono::steady_clock::now() > give_up_at) {
      job.deadline_hit = true;
      kill_all();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int rank = 0; rank < world; ++rank) {
    job.ranks[rank].out = read_text(dir / ("rank" + std::to_string(rank) + ".out"));
    job.ranks[rank].err = read_text(dir / ("rank" + std::to_string(rank) + ".err"));
  }
  return job;
}

}  // namespace

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

JobOutcome run_rank_job(const JobSpec& spec) {
  JobOutcome job;
  for (int attempt = 0; attempt < 3; ++attempt) {
    job = run_once(spec, free_port());
    const std::string& rank0_err = job.ranks[0].err;
    const bool port_taken = rank0_err.find("EADDRINUSE") != std::string::npos ||
                            rank0_err.find("ddress already in use") != std::string::npos;
    if (!port_taken) break;
  }
  return job;
}

std::string JobOutcome::describe() const {
  std::ostringstream text;
  if (deadline_hit) text << "deadline hit, workers killed\n";
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    text << "--- rank " << rank << " exit " << ranks[rank].exit_code << " signal " << ranks[rank].signal
         << " after " << ranks[rank].seconds << " s\nstdout:\n"
         << ranks[rank].out.substr(0, 2000) << "stderr:\n"
         << ranks[rank].err.substr(0, 2000) << "\n";
  }
  return text.str();
}

int count_lines_starting(const std::string& text, const std::string& prefix) {
  int count = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) count += line.rfind(prefix, 0) == 0 ? 1 : 0;
  return count;
}

}  // namespace testing
}  // namespace dschat
