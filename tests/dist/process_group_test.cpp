// The dist layer. DistLaunchEnv*: launcher variables -> LaunchEnv (no processes). DistCommunicator*:
// a world of one, in process. DistMultiproc*: world_size copies of tests/dist/dist_worker.cpp
// rendezvous on 127.0.0.1 through a real TCPStore + ProcessGroupGloo; each test waits for them
// with a deadline (killing leftovers) and checks their exit status and output.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "dschat/dist/launch_env.h"
#include "dschat/dist/process_group.h"
#include "dschat/core/build_info.h"
#include "rank_jobs.h"
#include "test_util.h"

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
  comm.start_reduce_scatter(out, t * 3, {4}).wait();
  EXPECT_TRUE(at::equal(out, t * 3));
  dist::PendingCollective average = comm.start_all_reduce(out, dist::ReduceOp::Avg);
  average.wait();
  EXPECT_TRUE(at::equal(out, t * 3));
}

TEST(DistCommunicator, RejectsBadArguments) {
  auto comm = dist::Communicator::create(LaunchEnv{});
  at::Tensor t = at::zeros({4});
  at::Tensor small = at::zeros({3});
  EXPECT_THROW_WITH(comm.broadcast(t, 1), core::InvalidArgument, "src rank 1");
  EXPECT_THROW_WITH(comm.all_gather_into(small, t), core::InvalidArgument, "all_gather_into: output has 3");
  EXPECT_THROW_WITH(comm.reduce_scatter(t, small), core::InvalidArgument, "reduce_scatter: input has 3");
  EXPECT_THROW_WITH(comm.start_reduce_scatter(small, t, {4, 0}), core::InvalidArgument, "2 counts for a world of 1");
  EXPECT_THROW_WITH(comm.start_reduce_scatter(small, t, {4}), core::InvalidArgument, "counts[0] = 4");
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

// world_size copies of dist_worker running `scenario` (tests/rank_jobs.h starts and reaps them).
testing::JobOutcome run_job(const std::string& scenario, int world_size, int timeout_ms, std::chrono::seconds deadline,
                            bool stop_peers_after_rank0 = false) {
  testing::JobSpec spec;
  spec.argv = {DSCHAT_DIST_WORKER_PATH, scenario, std::to_string(timeout_ms)};
  spec.world_size = world_size;
  spec.deadline = deadline;
  spec.stop_peers_after_rank0 = stop_peers_after_rank0;
  return testing::run_rank_job(spec);
}

std::string describe(const testing::JobOutcome& job) { return job.describe(); }
using testing::count_lines_starting;

void expect_collectives_pass(int world_size) {
  constexpr int kChecks = 15;  // the expect_equal calls in dist_worker.cpp's run_collectives
  testing::JobOutcome job = run_job("collectives", world_size, 10000, std::chrono::seconds(60));
  ASSERT_FALSE(job.deadline_hit) << describe(job);
  for (const testing::RankOutcome& rank : job.ranks) {
    EXPECT_EQ(rank.exit_code, 0) << describe(job);
    EXPECT_EQ(count_lines_starting(rank.out, "PASS "), kChecks) << describe(job);
    EXPECT_EQ(count_lines_starting(rank.out, "FAIL "), 0) << describe(job);
  }
}

TEST(DistMultiprocCollectives, WorldOf2) { expect_collectives_pass(2); }
TEST(DistMultiprocCollectives, WorldOf3) { expect_collectives_pass(3); }
TEST(DistMultiprocCollectives, WorldOf4) { expect_collectives_pass(4); }

// Communicator::subgroup: pairs of consecutive ranks (tensor-parallel groups of 2 on 4 ranks), a
// group of three and one of one, each reducing within itself, the world's collectives in between.
TEST(DistMultiprocCollectives, SubgroupsReduceWithinThemselves) {
  testing::JobOutcome job = run_job("subgroups", 4, 10000, std::chrono::seconds(60));
  ASSERT_FALSE(job.deadline_hit) << describe(job);
  ASSERT_EQ(job.ranks.size(), 4u);
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    const testing::RankOutcome& rank = job.ranks[r];
    EXPECT_EQ(rank.exit_code, 0) << describe(job);
    EXPECT_EQ(count_lines_starting(rank.out, "PASS "), r == 1 ? 5 : 6) << describe(job);  // rank 1: {1} alone
    EXPECT_EQ(count_lines_starting(rank.out, "FAIL "), 0) << describe(job);
  }
}

// Rank 0's all_reduce after its peer died (or stopped answering) throws within the timeout with a
// message naming the operation, and the process exits non-zero.
void expect_peer_failure_detected(const std::string& scenario, int timeout_ms) {
  auto deadline = std::chrono::seconds(timeout_ms / 1000 + 30);
  testing::JobOutcome job = run_job(scenario, 2, timeout_ms, deadline, /*stop_peers_after_rank0=*/true);
  ASSERT_FALSE(job.deadline_hit) << describe(job);
  const testing::RankOutcome& rank0 = job.ranks[0];
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
