// Jobs of real ranks (tests/dist/dist_worker.cpp): started by `dschat launch` on one node, by
// torchrun, by `dschat launch --hostfile` across two network namespaces through the ssh runner,
// and by the test itself; and a rank SIGKILLed half way, where the other ranks (or the launcher)
// must name it.
#include <gtest/gtest.h>

#include <map>

#include "child_runner.h"
#include "test_util.h"

namespace dschat {
namespace {

using std::chrono::seconds;
using testing::count_lines_starting;
using testing::Process;
using testing::TempDir;

constexpr int kCollectiveChecks = 15;  // the expect_equal calls in dist_worker.cpp's run_collectives

std::string cli() { return DSCHAT_CLI_PATH; }
std::string worker() { return DSCHAT_DIST_WORKER_PATH; }

std::string describe(const Process& job) {
  return "exit " + std::to_string(job.exit_code()) + " after " + std::to_string(job.seconds()) + " s\nstdout:\n" +
         job.out() + "stderr:\n" + job.err().substr(0, 6000);
}

void expect_launched_collectives_pass(int ranks) {
  TempDir dir;
  Process job({cli(), "launch", "--nproc-per-node", std::to_string(ranks), "--master-port",
               std::to_string(testing::free_port()), "--", worker(), "collectives", "20000"},
              {}, dir / "out", dir / "err");
  ASSERT_TRUE(job.wait_for(seconds(60))) << describe(job);
  EXPECT_EQ(job.exit_code(), 0) << describe(job);
  EXPECT_EQ(count_lines_starting(job.out(), "PASS "), ranks * kCollectiveChecks) << describe(job);
  EXPECT_EQ(count_lines_starting(job.out(), "FAIL "), 0) << describe(job);
}

TEST(LaunchMultiproc, CollectivesWorldOf2) { expect_launched_collectives_pass(2); }
TEST(LaunchMultiproc, CollectivesWorldOf4) { expect_launched_collectives_pass(4); }

TEST(DistMultiprocAsync, AllGatherHandles) {
  TempDir dir;
  Process job({cli(), "launch", "--nproc-per-node", "3", "--master-port", std::to_string(testing::free_port()), "--",
               worker(), "async_gather", "20000"},
              {}, dir / "out", dir / "err");
  ASSERT_TRUE(job.wait_for(seconds(60))) << describe(job);
  EXPECT_EQ(job.exit_code(), 0) << describe(job);
  EXPECT_EQ(count_lines_starting(job.out(), "PASS "), 3 * 5) << describe(job);
}

TEST(LaunchMultiproc, TorchrunRunsTheSameJob) {
  const std::filesystem::path torchrun = std::filesystem::path(DSCHAT_PYTHON).parent_path() / "torchrun";
  if (!std::filesystem::exists(torchrun)) {
    GTEST_SKIP() << "torchrun not found next to DSCHAT_PYTHON (" << torchrun << "); run tools/setup.sh";
  }
  TempDir dir;
  Process job({torchrun.string(), "--no-python", "--nproc-per-node", "2", "--master-port",
               std::to_string(testing::free_port()), worker(), "collectives", "20000"},
              {}, dir / "out", dir / "err");
  ASSERT_TRUE(job.wait_for(seconds(90))) << describe(job);
  EXPECT_EQ(job.exit_code(), 0) << describe(job);
  EXPECT_EQ(count_lines_starting(job.out(), "PASS "), 2 * kCollectiveChecks) << describe(job);
  // TORCHELASTIC_USE_AGENT_STORE: rank 0 joins the agent's store instead of failing to bind its own.
  EXPECT_EQ(job.err().find("failed to bind"), std::string::npos) << describe(job);
}

// The pid a `steps` rank printed ("rank R pid P"), once it is `steps_done` steps in.
pid_t pid_of_rank_after_steps(Process& job, int rank, int steps_done) {
  const std::string r = "rank " + std::to_string(rank);
  if (!job.wait_for_output(r + " step " + std::to_string(steps_done), seconds(30))) return -1;
  std::string out = job.out();
  size_t at = out.find(r + " pid ");
  return at == std::string::npos ? -1 : std::stoi(out.substr(at + r.size() + 5));
}

// ---- two hosts: network namespaces joined by a veth pair ----------------------------------------

class NetworkNamespaces {
 public:
  explicit NetworkNamespaces(std::vector<std::string> names) : names_(std::move(names)) {}
  ~NetworkNamespaces() {
    for (const std::string& name : created_) testing::run_command("ip netns del " + name);
  }
  // false (with the reason) when this machine refuses to create one: not root, no CAP_NET_ADMIN.
  bool create(std::string* why) {
    for (const std::string& name : names_) {
      if (testing::run_command("ip netns add " + name, why) != 0) return false;
      created_.push_back(name);
    }
    return true;
  }

 private:
  std::vector<std::string> names_, created_;
};

TEST(LaunchMultiproc, TwoHostsInNetworkNamespacesThroughTheSshRunner) {
  const std::string suffix = std::to_string(getpid());
  const std::string host_a = "dschat_a" + suffix, host_b = "dschat_b" + suffix;
  NetworkNamespaces namespaces({host_a, host_b});  // deletes them whatever happens below
  std::string why;
  if (!namespaces.create(&why)) {
    GTEST_SKIP() << "cannot create network namespaces here (needs root or CAP_NET_ADMIN): " << why;
  }
  // The same interface name in both, so one GLOO_SOCKET_IFNAME fits both hosts.
  for (const std::string& command : {
           "ip link add dschat0 netns " + host_a + " type veth peer name dschat0 netns " + host_b,
           "ip -n " + host_a + " addr add 10.213.0.1/24 dev dschat0", "ip -n " + host_a + " link set dschat0 up",
           "ip -n " + host_a + " link set lo up", "ip -n " + host_b + " addr add 10.213.0.2/24 dev dschat0",
           "ip -n " + host_b + " link set dschat0 up", "ip -n " + host_b + " link set lo up"}) {
    std::string output;
    if (testing::run_command(command, &output) != 0) {
      GTEST_SKIP() << "cannot set up the veth pair between the namespaces (" << command << "): " << output;
    }
  }
  TempDir dir;
  std::ofstream(dir / "hostfile") << "# two hosts, two ranks each\n10.213.0.1 slots=2\n10.213.0.2 slots=2\n";
  // The "ssh": run the remote command line in the namespace of the host it names.
  std::ofstream(dir / "netns_ssh") << "#!/bin/bash\ncase \"$1\" in\n  10.213.0.1) ns=" << host_a
                                   << " ;;\n  10.213.0.2) ns=" << host_b
                                   << " ;;\n  *) echo \"netns_ssh: unknown host $1\" >&2; exit 255 ;;\nesac\n"
                                      "shift\nexec ip netns exec \"$ns\" bash -c \"$*\"\n";
  std::filesystem::permissions(dir / "netns_ssh", std::filesystem::perms::owner_all);
  // Node 0's launcher runs on host a; master address and port are the defaults (first host, 29500).
  auto launch_on_host_a = [&](const std::vector<std::string>& worker_args, const std::string& name) {
    std::vector<std::string> argv{"ip", "netns", "exec", host_a, cli(), "launch", "--hostfile",
                                  (dir / "hostfile").string(), "--", worker()};
    argv.insert(argv.end(), worker_args.begin(), worker_args.end());
    return std::make_unique<Process>(
        argv, std::vector<std::string>{"DSCHAT_SSH=" + (dir / "netns_ssh").string(), "GLOO_SOCKET_IFNAME=dschat0"},
        dir / (name + ".out"), dir / (name + ".err"));
  };
  auto job = launch_on_host_a({"collectives", "20000"}, "collectives");
  ASSERT_TRUE(job->wait_for(seconds(60))) << describe(*job);
  EXPECT_EQ(job->exit_code(), 0) << describe(*job);
  EXPECT_EQ(count_lines_starting(job->out(), "PASS "), 4 * kCollectiveChecks) << describe(*job);
  EXPECT_EQ(count_lines_starting(job->out(), "FAIL "), 0) << describe(*job);

  // A rank of host b killed: b's launcher names it, and a's names node 1 and stops its own ranks.
  auto steps = launch_on_host_a({"steps", "20000", "400"}, "steps");
  pid_t victim = pid_of_rank_after_steps(*steps, 3, 3);
  ASSERT_GT(victim, 0) << describe(*steps);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(steps->wait_for(seconds(60))) << describe(*steps);
  EXPECT_EQ(steps->exit_code(), 128 + SIGKILL) << describe(*steps);
  const std::string err = steps->err();
  // (b's launcher names its own hostname: the namespaces share this machine's.)
  EXPECT_NE(err.find("dschat launch: rank 3 (pid " + std::to_string(victim) + ", host "), std::string::npos)
      << describe(*steps);
  EXPECT_NE(err.find(") was killed by SIGKILL; stopping the other ranks"), std::string::npos) << describe(*steps);
  EXPECT_NE(err.find("dschat launch: node 1 (host 10.213.0.2, ranks 2-3; ssh pid "), std::string::npos)
      << describe(*steps);
  EXPECT_NE(err.find(") exited with code 137; stopping the other ranks"), std::string::npos) << describe(*steps);
}

// ---- a rank SIGKILLed half way --------------------------------------------------------------------

TEST(LaunchMultiproc, KilledRankIsNamedWithItsSignalAndTheOthersStop) {
  TempDir dir;
  Process job({cli(), "launch", "--nproc-per-node", "3", "--master-port", std::to_string(testing::free_port()), "--",
               worker(), "steps", "20000", "400"},
              {}, dir / "out", dir / "err");
  pid_t victim = pid_of_rank_after_steps(job, 1, 3);
  ASSERT_GT(victim, 0) << describe(job);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(job.wait_for(seconds(60))) << describe(job);
  const double seconds_after_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds_after_kill, 60.0) << describe(job);
  EXPECT_EQ(job.exit_code(), 128 + SIGKILL) << describe(job);
  EXPECT_NE(job.err().find("dschat launch: rank 1 (pid " + std::to_string(victim) + ", host "), std::string::npos)
      << describe(job);
  EXPECT_NE(job.err().find("was killed by SIGKILL; stopping the other ranks"), std::string::npos) << describe(job);
  EXPECT_EQ(job.out().find("PASS steps"), std::string::npos) << describe(job);
  // The launcher reaped every rank before it returned: none is left running or as a zombie.
  for (int rank : {0, 2}) {
    const std::string out = job.out(), prefix = "rank " + std::to_string(rank) + " pid ";
    size_t at = out.find(prefix);
    ASSERT_NE(at, std::string::npos) << describe(job);
    pid_t pid = std::stoi(out.substr(at + prefix.size()));
    EXPECT_NE(kill(pid, 0), 0) << "rank " << rank << " (pid " << pid << ") is still there\n" << describe(job);
  }
}

// The ranks started by the test itself: nothing stops the survivors but their own failure.
struct DirectJob {
  TempDir dir;
  std::vector<std::unique_ptr<Process>> ranks;

  DirectJob(int world_size, const std::vector<std::string>& args) {
    const std::string port = std::to_string(testing::free_port());
    for (int rank = 0; rank < world_size; ++rank) {
      std::vector<std::string> argv{worker()};
      argv.insert(argv.end(), args.begin(), args.end());
      const std::string r = std::to_string(rank);
      ranks.push_back(std::make_unique<Process>(
          argv,
          std::vector<std::string>{"RANK=" + r, "WORLD_SIZE=" + std::to_string(world_size), "LOCAL_RANK=" + r,
                                   "LOCAL_WORLD_SIZE=" + std::to_string(world_size), "MASTER_ADDR=127.0.0.1",
                                   "MASTER_PORT=" + port, "OMP_NUM_THREADS=1", "TORCHELASTIC_USE_AGENT_STORE"},
          dir / ("rank" + r + ".out"), dir / ("rank" + r + ".err")));
    }
  }

  std::string describe_all() const {
    std::string text;
    for (size_t rank = 0; rank < ranks.size(); ++rank) text += "--- rank " + std::to_string(rank) + " " + describe(*ranks[rank]) + "\n";
    return text;
  }
};

void expect_survivors_name_the_killed_rank(int world_size, int victim_rank, const std::string& naming) {
  DirectJob job(world_size, {"steps", "20000", "400"});
  pid_t victim = pid_of_rank_after_steps(*job.ranks[victim_rank], victim_rank, 3);
  ASSERT_GT(victim, 0) << job.describe_all();
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  for (int rank = 0; rank < world_size; ++rank) {
    Process& survivor = *job.ranks[rank];
    ASSERT_TRUE(survivor.wait_for(seconds(60))) << "rank " << rank << " still running\n" << job.describe_all();
    if (rank == victim_rank) continue;
    EXPECT_EQ(survivor.exit_code(), 1) << job.describe_all();
    EXPECT_NE(survivor.err().find(naming), std::string::npos) << "rank " << rank << "\n" << job.describe_all();
  }
  const double seconds_after_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(seconds_after_kill, 60.0) << job.describe_all();
}

TEST(DistMultiprocFaultNaming, SurvivorsNameTheKilledRank) {
  expect_survivors_name_the_killed_rank(3, 1, "; lost rank 1 (its heartbeat in the store stopped");
}

TEST(DistMultiprocFaultNaming, SurvivorsNameRank0WhenTheStoreDiesWithIt) {
  expect_survivors_name_the_killed_rank(3, 0, "rank 0, which serves it, is gone");
}

}  // namespace
}  // namespace dschat
