// The dist layer. DistLaunchEnv*: launcher variables -> LaunchEnv (no processes). DistCommunicator*:
// a world of one, in process. DistMultiproc*: world_size copies of tests/dist/dist_worker.cpp
// rendezvous on 127.0.0.1 through a real TCPStore + ProcessGroupGloo; each test waits for them
// with a deadline (killing leftovers) and checks their exit status and output.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "dschat/dist/launch_env.h"
#include "dschat/dist/process_group.h"
#include "dschat/core/build_info.h"
#include "test_util.h"

extern char** environ;

namespace dschat {
namespace {

using dist::LaunchEnv;
using Vars = std::map<std::string, std::string>;

LaunchEnv parse(const Vars& vars) {
  return LaunchEnv::from_lookup([&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  });
}

TEST(DistLaunchEnv, NoLauncherIsOneProcess) {
  LaunchEnv env = parse({});
  EXPECT_EQ(env.source, "single");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(DistLaunchEnv, Torchrun) {
  LaunchEnv env = parse({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                         {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}, {"GLOO_SOCKET_IFNAME", "eth1"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(env.socket_ifname, "eth1");
}

TEST(DistLaunchEnv, DeepSpeedLauncherLocalSizeAndDefaults) {
  LaunchEnv env = parse({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.local_rank, 1);  // rank % local size
  EXPECT_EQ(env.master_port, 29500);
  LaunchEnv one_node = parse({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  EXPECT_EQ(one_node.local_world_size, 3);
  EXPECT_EQ(one_node.local_rank, 2);
  EXPECT_EQ(one_node.master_addr, "127.0.0.1");
}

TEST(DistLaunchEnv, OpenMpi) {
  LaunchEnv env = parse({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                         {"MASTER_PORT", "29600"}});
  EXPECT_EQ(env.source, "openmpi");
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29600);
}

TEST(DistLaunchEnv, SlurmDerivesLocalSizeAndMasterFromNodeList) {
  LaunchEnv env = parse({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "2"},
                         {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4,3"},
                         {"SLURM_JOB_NODELIST", "gpu[07-08,12],cpu1"}});
  EXPECT_EQ(env.source, "slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 7);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.master_addr, "gpu07");
  LaunchEnv repeated = parse({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_NODEID", "2"},
                              {"SLURM_TASKS_PER_NODE", "2(x3)"}, {"SLURM_STEP_NODELIST", "n1"}});
  EXPECT_EQ(repeated.local_world_size, 2);
  EXPECT_EQ(repeated.local_rank, 1);
  EXPECT_EQ(repeated.master_addr, "n1");
  LaunchEnv per_node = parse({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(per_node.local_world_size, 2);
  EXPECT_EQ(per_node.master_addr, "127.0.0.1");
}

TEST(DistLaunchEnv, TorchrunWinsOverOtherLaunchers) {
  LaunchEnv env = parse({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"},
                         {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(env.source, "torchrun");
  EXPECT_EQ(env.rank, 1);
}

TEST(DistLaunchEnv, InconsistentValuesNameTheVariable) {
  EXPECT_THROW_WITH(parse({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), core::ConfigError, "RANK='4' is out of range");
  EXPECT_THROW_WITH(parse({{"RANK", "1"}}), core::ConfigError, "WORLD_SIZE is not");
  EXPECT_THROW_WITH(parse({{"WORLD_SIZE", "2"}}), core::ConfigError, "RANK is not");
  EXPECT_THROW_WITH(parse({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), core::ConfigError, "RANK='one'");
  EXPECT_THROW_WITH(parse({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), core::ConfigError, "WORLD_SIZE='0'");
  EXPECT_THROW_WITH(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}), core::ConfigError,
                    "LOCAL_RANK='2'");
  EXPECT_THROW_WITH(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}), core::ConfigError,
                    "MASTER_PORT='70000'");
  EXPECT_THROW_WITH(parse({{"MASTER_PORT", "29x"}}), core::ConfigError, "MASTER_PORT='29x'");
  EXPECT_THROW_WITH(parse({{"OMPI_COMM_WORLD_RANK", "3"}}), core::ConfigError, "OMPI_COMM_WORLD_SIZE is not");
  EXPECT_THROW_WITH(parse({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}}), core::ConfigError,
                    "MASTER_ADDR is not set");
  EXPECT_THROW_WITH(parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(x"}}),
                    core::ConfigError, "SLURM_TASKS_PER_NODE='2(x'");
}

TEST(DistCommunicator, WorldOfOneNeedsNoNetworkAndIsIdentity) {
  LaunchEnv env;
  env.master_port = 1;  // never contacted
  auto comm = dist::Communicator::create(env, dist::Backend::Gloo, std::chrono::seconds(1));
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  at::Tensor t = at::arange(4, at::kFloat);
  comm.all_reduce(t, dist::ReduceOp::Avg);
  comm.broadcast(t, 0);
  comm.barrier();
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
  at::Tensor out = at::empty({4});
  comm.all_gather_into(out, t);
  EXPECT_TRUE(at::equal(out, t));
  comm.reduce_scatter(out, t * 2);
  EXPECT_TRUE(at::equal(out, t * 2));
}

TEST(DistCommunicator, RejectsBadArguments) {
  auto comm = dist::Communicator::create(LaunchEnv{});
  at::Tensor t = at::zeros({4});
  at::Tensor small = at::zeros({3});
  EXPECT_THROW_WITH(comm.broadcast(t, 1), core::InvalidArgument, "src rank 1");
  EXPECT_THROW_WITH(comm.all_gather_into(small, t), core::InvalidArgument, "all_gather_into: output has 3");
  EXPECT_THROW_WITH(comm.reduce_scatter(t, small), core::InvalidArgument, "reduce_scatter: input has 3");
  at::Tensor ints = at::zeros({2}, at::kLong);
  EXPECT_THROW_WITH(comm.all_reduce(ints, dist::ReduceOp::Avg), core::InvalidArgument, "floating-point");
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW_WITH(comm.all_reduce(strided), core::InvalidArgument, "contiguous");
  // The test binary does not see the library's DSCHAT_WITH_CUDA, so ask the library.
  if (!core::build_info().cuda_kernels) {
    EXPECT_THROW_WITH(dist::Communicator::create(LaunchEnv{}, dist::Backend::Nccl), core::Unsupported, "CUDA");
  }
}

// ---- multi-process -----------------------------------------------------------------------------

// A port nothing listens on now: bind port 0, read what the kernel picked, close. Another process
// may take it before rank 0 binds it; run_job retries on that.
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

struct RankOutcome {
  int exit_code = -1;    // -1 when killed by a signal
  std::string out, err;  // stdout, stderr
};

struct JobOutcome {
  std::vector<RankOutcome> ranks;
  bool deadline_hit = false;
};

std::string read_file(const std::filesystem::path& path) {
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

bool is_launcher_variable(const std::string& entry) {
  static const char* kPrefixes[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "LOCAL_SIZE=",
                                    "MASTER_ADDR=", "MASTER_PORT=", "GLOO_SOCKET_IFNAME=", "OMPI_COMM_WORLD_",
                                    "SLURM_"};
  for (const char* prefix : kPrefixes) {
    if (entry.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// Starts world_size workers on one free port, waits for all of them until `deadline` (then kills
// the rest). With stop_peers_after_rank0, the other ranks are killed as soon as rank 0 exits.
JobOutcome run_job_once(const std::string& scenario, int world_size, int timeout_ms, std::chrono::seconds deadline,
                        bool stop_peers_after_rank0, int port) {
  testing::TempDir dir;
  std::vector<pid_t> pids(world_size, -1);
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> env_strings;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      if (!is_launcher_variable(*entry)) env_strings.emplace_back(*entry);
    }
    for (const std::string& entry :
         {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world_size),
          "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
          std::string("OMP_NUM_THREADS=1")}) {
      env_strings.push_back(entry);
    }
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::string worker = DSCHAT_DIST_WORKER_PATH;
    std::string timeout_arg = std::to_string(timeout_ms);
    std::vector<char*> argv{worker.data(), const_cast<char*>(scenario.c_str()), timeout_arg.data(), nullptr};
    std::string out_path = (dir / ("rank" + std::to_string(rank) + ".out")).string();
    std::string err_path = (dir / ("rank" + std::to_string(rank) + ".err")).string();
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&files, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int rc = posix_spawn(&pids[rank], worker.c_str(), &files, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&files);
    EXPECT_EQ(rc, 0) << "cannot start " << worker;
  }

  JobOutcome job;
  job.ranks.resize(world_size);
  auto give_up_at = std::chrono::steady_clock::now() + deadline;
  int running = 0;
  for (pid_t pid : pids) running += pid > 0 ? 1 : 0;
  while (running > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      int status = 0;
      if (pids[rank] <= 0 || waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      job.ranks[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      pids[rank] = -1;
      --running;
      if (rank == 0 && stop_peers_after_rank0) {
        for (pid_t pid : pids) {
          if (pid > 0) kill(pid, SIGKILL);
        }
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() > give_up_at) {
      job.deadline_hit = true;
      for (pid_t pid : pids) {
        if (pid > 0) kill(pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int rank = 0; rank < world_size; ++rank) {
    job.ranks[rank].out = read_file(dir / ("rank" + std::to_string(rank) + ".out"));
    job.ranks[rank].err = read_file(dir / ("rank" + std::to_string(rank) + ".err"));
  }
  return job;
}

JobOutcome run_job(const std::string& scenario, int world_size, int timeout_ms, std::chrono::seconds deadline,
                   bool stop_peers_after_rank0 = false) {
  JobOutcome job;
  for (int attempt = 0; attempt < 3; ++attempt) {
    job = run_job_once(scenario, world_size, timeout_ms, deadline, stop_peers_after_rank0, free_port());
    const std::string& rank0_err = job.ranks[0].err;
    bool port_taken = rank0_err.find("EADDRINUSE") != std::string::npos ||
                      rank0_err.find("ddress already in use") != std::string::npos;
    if (!port_taken) break;
  }
  return job;
}

std::string describe(const JobOutcome& job) {
  std::ostringstream text;
  if (job.deadline_hit) text << "deadline hit, workers killed\n";
  for (size_t rank = 0; rank < job.ranks.size(); ++rank) {
    text << "--- rank " << rank << " exit " << job.ranks[rank].exit_code << "\nstdout:\n"
         << job.ranks[rank].out << "stderr:\n"
         << job.ranks[rank].err.substr(0, 2000) << "\n";
  }
  return text.str();
}

int count_lines_starting(const std::string& text, const std::string& prefix) {
  int count = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) count += line.rfind(prefix, 0) == 0 ? 1 : 0;
  return count;
}

void expect_collectives_pass(int world_size) {
  constexpr int kChecks = 12;  // the expect_equal calls in dist_worker.cpp's run_collectives
  JobOutcome job = run_job("collectives", world_size, 10000, std::chrono::seconds(60));
  ASSERT_FALSE(job.deadline_hit) << describe(job);
  for (const RankOutcome& rank : job.ranks) {
    EXPECT_EQ(rank.exit_code, 0) << describe(job);
    EXPECT_EQ(count_lines_starting(rank.out, "PASS "), kChecks) << describe(job);
    EXPECT_EQ(count_lines_starting(rank.out, "FAIL "), 0) << describe(job);
  }
}

TEST(DistMultiprocCollectives, WorldOf2) { expect_collectives_pass(2); }
TEST(DistMultiprocCollectives, WorldOf3) { expect_collectives_pass(3); }
TEST(DistMultiprocCollectives, WorldOf4) { expect_collectives_pass(4); }

// Rank 0's all_reduce after its peer died (or stopped answering) throws within the timeout with a
// message naming the operation, and the process exits non-zero.
void expect_peer_failure_detected(const std::string& scenario, int timeout_ms) {
  auto deadline = std::chrono::seconds(timeout_ms / 1000 + 30);
  JobOutcome job = run_job(scenario, 2, timeout_ms, deadline, /*stop_peers_after_rank0=*/true);
  ASSERT_FALSE(job.deadline_hit) << describe(job);
  const RankOutcome& rank0 = job.ranks[0];
  EXPECT_EQ(rank0.exit_code, 1) << describe(job);
  EXPECT_NE(rank0.err.find("dist::all_reduce failed on rank 0 of 2"), std::string::npos) << describe(job);
  EXPECT_NE(rank0.err.find("peer rank"), std::string::npos) << describe(job);
  size_t at = rank0.out.find("collective_ms=");
  ASSERT_NE(at, std::string::npos) << describe(job);
  int collective_ms = std::stoi(rank0.out.substr(at + 14));
  EXPECT_LE(collective_ms, timeout_ms + 1000) << describe(job);
}

TEST(DistMultiprocFault, PeerKilledBeforeCollective) { expect_peer_failure_detected("peer_exits", 5000); }
TEST(DistMultiprocFault, PeerHangingInCollectiveTimesOut) { expect_peer_failure_detected("peer_hangs", 2000); }

}  // namespace
}  // namespace dschat
