// `dschat launch` without collectives: the hostfile, the plan and the remote command, argument
// errors, the ranks' environment, failure, signal and grace handling (with `sh` as the rank
// program, so these run in milliseconds), and the single-process parts of the dist layer this
// task added. Jobs of real ranks are in launcher_jobs_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>

#include "child_runner.h"
#include "dschat/dist/launch_env.h"
#include "dschat/dist/launcher.h"
#include "dschat/dist/process_group.h"
#include "test_util.h"

namespace dschat {
namespace {

using std::chrono::seconds;
using testing::Process;
using testing::TempDir;

// ---- hostfile ----------------------------------------------------------------------------------

TEST(LaunchHostfile, HostsSlotsCommentsAndBlankLines) {
  auto entries = dist::parse_hostfile(
      "# two workers\n\nworker-1 slots=4\n   worker-2\tslots=2   # the small one\n\n#worker-3 slots=8\n", "hf");
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].host, "worker-1");
  EXPECT_EQ(entries[0].slots, 4);
  EXPECT_EQ(entries[1].host, "worker-2");
  EXPECT_EQ(entries[1].slots, 2);
}

TEST(LaunchHostfile, ErrorsNameTheFileAndLine) {
  EXPECT_THROW_WITH(dist::parse_hostfile("a slots=2\nb slots=x\n", "hostfile /h"), core::ConfigError,
                    "hostfile /h line 2: 'slots=x': slots must be a positive integer");
  EXPECT_THROW_WITH(dist::parse_hostfile("a slots=0\n", "hostfile /h"), core::ConfigError,
                    "hostfile /h line 1: 'slots=0': slots must be a positive integer");
  EXPECT_THROW_WITH(dist::parse_hostfile("a slots=-1\n", "hf"), core::ConfigError, "line 1");
  EXPECT_THROW_WITH(dist::parse_hostfile("# c\na slots=1\n\na slots=2\n", "hostfile /h"), core::ConfigError,
                    "hostfile /h line 4: host 'a' is already listed on line 2");
  EXPECT_THROW_WITH(dist::parse_hostfile("a slots=1\nb\n", "hostfile /h"), core::ConfigError,
                    "hostfile /h line 2: 'b': expected 'hostname slots=N' (missing slots=N)");
  EXPECT_THROW_WITH(dist::parse_hostfile("a 4\n", "hf"), core::ConfigError, "hf line 1: 'a 4'");
  EXPECT_THROW_WITH(dist::parse_hostfile("a slots=2 gpus=1\n", "hf"), core::ConfigError, "hf line 1");
  EXPECT_THROW_WITH(dist::parse_hostfile("# nothing\n\n", "hostfile /h"), core::ConfigError,
                    "hostfile /h: no hosts");
}

TEST(LaunchHostfile, ReadsAFileAndNamesAMissingOne) {
  TempDir dir;
  std::ofstream(dir / "hostfile") << "node0 slots=1\nnode1 slots=3\n";
  auto entries = dist::read_hostfile((dir / "hostfile").string());
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[1].slots, 3);
  EXPECT_THROW_WITH(dist::read_hostfile((dir / "missing").string()), core::IoError, "missing: cannot open");
  std::ofstream(dir / "bad") << "node0 slots=1\nnode0 slots=1\n";
  EXPECT_THROW_WITH(dist::read_hostfile((dir / "bad").string()), core::ConfigError,
                    (dir / "bad").string() + " line 2");
}

// ---- plan --------------------------------------------------------------------------------------

TEST(LaunchPlan, RemoteCommandCarriesTheLayoutEnvironmentAndQuotedCommand) {
  dist::LaunchPlan plan;
  plan.command = {"/opt/train", "--name", "it's"};
  plan.node_slots = {2, 3};
  plan.hosts = {"h0", "h1"};
  plan.master_port = 1234;
  plan.ssh_command = "myssh  -p 2222";
  plan.remote_launcher = {"/opt/dschat", "launch"};
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("DSCHAT_SSH", "not-forwarded", 1);
  auto argv = dist::remote_node_argv(plan, 1);
  unsetenv("NCCL_DEBUG");
  unsetenv("DSCHAT_SSH");
  ASSERT_EQ(argv.size(), 5u);
  EXPECT_EQ(argv[0], "myssh");
  EXPECT_EQ(argv[1], "-p");
  EXPECT_EQ(argv[2], "2222");
  EXPECT_EQ(argv[3], "h1");
  const std::string& remote = argv[4];
  EXPECT_EQ(remote.rfind("cd '" + std::filesystem::current_path().string() + "' && exec env ", 0), 0u) << remote;
  EXPECT_NE(remote.find("'NCCL_DEBUG=INFO'"), std::string::npos) << remote;
  EXPECT_EQ(remote.find("DSCHAT_SSH"), std::string::npos) << remote;
  EXPECT_NE(remote.find("'/opt/dschat' 'launch' --node-slots 2,3 --node-rank 1 --master-addr 'h0' --master-port "
                        "1234 --stop-on-stdin-eof -- '/opt/train' '--name' 'it'\\''s'"),
            std::string::npos)
      << remote;
}

TEST(LaunchPlan, InconsistentPlansAreRejected) {
  dist::LaunchPlan plan;
  EXPECT_THROW_WITH(dist::launch(plan), core::InvalidArgument, "no command");
  plan.command = {"true"};
  plan.node_slots = {2, 0};
  EXPECT_THROW_WITH(dist::launch(plan), core::InvalidArgument, "node 1 has 0 ranks");
  plan.node_slots = {2, 2};
  plan.node_rank = 2;
  EXPECT_THROW_WITH(dist::launch(plan), core::InvalidArgument, "node rank 2 is out of range for 2 node(s)");
  plan.node_rank = 1;
  EXPECT_THROW_WITH(dist::launch(plan), core::InvalidArgument, "needs the master address");
  plan.hosts = {"a", "b"};
  EXPECT_THROW_WITH(dist::launch(plan), core::InvalidArgument, "remote_launcher");
  plan.hosts = {"a"};
  EXPECT_THROW_WITH(dist::launch(plan), core::InvalidArgument, "1 hosts for 2 nodes");
  dist::LaunchPlan missing;
  missing.command = {"dschat-no-such-program"};
  EXPECT_THROW_WITH(dist::launch(missing), core::InvalidArgument, "'dschat-no-such-program' was not found in PATH");
}

// ---- the CLI -----------------------------------------------------------------------------------

std::string cli() { return DSCHAT_CLI_PATH; }

TEST(LaunchCli, BadArgumentsNameTheArgument) {
  struct Case {
    std::string args, fragment;
  };
  TempDir dir;
  std::ofstream(dir / "hostfile") << "a slots=1\n";
  const std::string hostfile = (dir / "hostfile").string();
  for (const Case& c : std::vector<Case>{
           {"--nproc-per-node 0 -- true", "--nproc-per-node: expected at least 1 rank, got 0"},
           {"--nnodes 0 -- true", "--nnodes: expected at least 1 node"},
           {"--nnodes 2 -- true", "--master-addr is required with --nnodes 2"},
           {"--nnodes 2 --node-rank 2 --master-addr h -- true", "--node-rank: 2 is out of range for 2 node(s)"},
           {"--master-port 70000 -- true", "--master-port: 70000 is out of range"},
           {"--hostfile " + hostfile + " --nproc-per-node 2 -- true", "--nproc-per-node excludes --hostfile"},
           {"--hostfile " + dir.path().string() + "/none -- true", "none: cannot open"},
           {"--nproc-per-node 2", "no command: give it after '--'"},
           {"-- dschat-no-such-program", "'dschat-no-such-program' was not found in PATH"},
       }) {
    std::string output;
    int status = testing::run_command(cli() + " launch " + c.args, &output);
    EXPECT_NE(status, 0) << c.args;
    EXPECT_NE(output.find(c.fragment), std::string::npos) << c.args << "\n" << output;
  }
}

TEST(LaunchMultiproc, RanksGetTheTorchrunVariables) {
  TempDir dir;
  Process launcher({cli(), "launch", "--nproc-per-node", "3", "--master-port", "2345", "--", "sh", "-c",
                    "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE LS=$LOCAL_SIZE G=$GROUP_RANK "
                    "N=$NODE_RANK M=$MASTER_ADDR:$MASTER_PORT O=$OMP_NUM_THREADS\""},
                   {"RANK=99", "OMP_NUM_THREADS"}, dir / "out", dir / "err");
  ASSERT_TRUE(launcher.wait_for(seconds(20)));
  EXPECT_EQ(launcher.exit_code(), 0) << launcher.err();
  const std::string out = launcher.out();
  for (int rank = 0; rank < 3; ++rank) {
    const std::string line = "R=" + std::to_string(rank) + " L=" + std::to_string(rank) +
                             " W=3 LW=3 LS=3 G=0 N=0 M=127.0.0.1:2345 O=1";  // as torchrun, for several ranks
    EXPECT_NE(out.find(line), std::string::npos) << out;
  }
  Process defaults({cli(), "launch", "--", "sh", "-c", "echo \"W=$WORLD_SIZE P=$MASTER_PORT O=${OMP_NUM_THREADS-unset}\""},
                   {"OMP_NUM_THREADS"}, dir / "out2", dir / "err2");
  ASSERT_TRUE(defaults.wait_for(seconds(20)));
  EXPECT_NE(defaults.out().find("W=1 P=29500 O=unset"), std::string::npos) << defaults.out();
}

TEST(LaunchMultiproc, NodeLayoutsFromFlagsAndHostfile) {
  TempDir dir;
  const std::string show = "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE M=$MASTER_ADDR\"";
  // Node 1 of 2 started by hand: global ranks 2 and 3.
  Process by_hand({cli(), "launch", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
                   "10.1.2.3", "--", "sh", "-c", show},
                  {}, dir / "out", dir / "err");
  ASSERT_TRUE(by_hand.wait_for(seconds(20)));
  EXPECT_EQ(by_hand.exit_code(), 0) << by_hand.err();
  EXPECT_NE(by_hand.out().find("R=2 L=0 W=4 G=1 GW=2 M=10.1.2.3"), std::string::npos) << by_hand.out();
  EXPECT_NE(by_hand.out().find("R=3 L=1 W=4 G=1 GW=2 M=10.1.2.3"), std::string::npos) << by_hand.out();
  // A hostfile with one host is one node: no ssh, rendezvous on loopback.
  std::ofstream(dir / "hostfile") << "some-host slots=2\n";
  Process one_host({cli(), "launch", "--hostfile", (dir / "hostfile").string(), "--", "sh", "-c", show}, {},
                   dir / "out2", dir / "err2");
  ASSERT_TRUE(one_host.wait_for(seconds(20)));
  EXPECT_EQ(one_host.exit_code(), 0) << one_host.err();
  EXPECT_NE(one_host.out().find("R=1 L=1 W=2 G=0 GW=1 M=127.0.0.1"), std::string::npos) << one_host.out();
}

TEST(LaunchMultiproc, FirstFailureIsNamedAndStopsTheOthers) {
  TempDir dir;
  Process launcher({cli(), "launch", "--nproc-per-node", "3", "--", "sh", "-c",
                    "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 30"},
                   {}, dir / "out", dir / "err");
  ASSERT_TRUE(launcher.wait_for(seconds(20)));
  EXPECT_EQ(launcher.exit_code(), 3) << launcher.err();
  EXPECT_LT(launcher.seconds(), 8.0);
  EXPECT_NE(launcher.err().find("dschat launch: rank 1 (pid "), std::string::npos) << launcher.err();
  EXPECT_NE(launcher.err().find(") exited with code 3; stopping the other ranks"), std::string::npos)
      << launcher.err();
}

TEST(LaunchMultiproc, RankIgnoringSigtermIsKilledAfterTheGrace) {
  TempDir dir;
  // The ranks ignore SIGTERM (and so does the `sleep` each execs); only SIGKILL ends them.
  dist::LaunchPlan plan;
  plan.command = {"sh", "-c", "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.3; exit 2; fi; exec sleep 30"};
  plan.node_slots = {2};
  plan.stop_grace = std::chrono::milliseconds(500);
  ::testing::internal::CaptureStderr();
  auto start = std::chrono::steady_clock::now();
  int status = dist::launch(plan);
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 2) << err;
  EXPECT_LT(elapsed, 8.0);
  EXPECT_NE(err.find("rank 0 (pid"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 1 (pid"), std::string::npos) << err;
  EXPECT_NE(err.find("did not stop within 0.5 s of being told to; sending SIGKILL"), std::string::npos) << err;
}

TEST(LaunchMultiproc, SigintIsForwardedToTheRanks) {
  TempDir dir;
  Process launcher({cli(), "launch", "--nproc-per-node", "2", "--", "sh", "-c",
                    "trap 'echo \"rank $RANK got SIGINT\"; exit 5' INT; echo \"pid $$\"; while :; do sleep 0.1; done"},
                   {}, dir / "out", dir / "err");
  ASSERT_TRUE(launcher.wait_for_output("pid", seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // both ranks set their trap
  launcher.signal(SIGINT);
  ASSERT_TRUE(launcher.wait_for(seconds(20))) << launcher.err();
  EXPECT_EQ(launcher.exit_code(), 128 + SIGINT) << launcher.err();
  EXPECT_NE(launcher.err().find("got SIGINT; forwarding it to the ranks"), std::string::npos) << launcher.err();
  EXPECT_NE(launcher.out().find("rank 0 got SIGINT"), std::string::npos) << launcher.out();
  EXPECT_NE(launcher.out().find("rank 1 got SIGINT"), std::string::npos) << launcher.out();
}

TEST(LaunchMultiproc, StdinEndStopsALauncherStartedThroughSsh) {
  TempDir dir;  // Process gives it /dev/null as stdin: the end of file comes at once
  Process launcher({cli(), "launch", "--node-slots", "1,2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                    "--stop-on-stdin-eof", "--", "sh", "-c", "echo \"rank $RANK of $WORLD_SIZE\"; exec sleep 30"},
                   {}, dir / "out", dir / "err");
  ASSERT_TRUE(launcher.wait_for(seconds(20))) << launcher.err();
  EXPECT_EQ(launcher.exit_code(), 128 + SIGHUP) << launcher.err();
  EXPECT_LT(launcher.seconds(), 8.0);
  EXPECT_NE(launcher.err().find("stdin closed: the launcher that started this node is gone; stopping the ranks"),
            std::string::npos)
      << launcher.err();
}

// ---- dist pieces without peers -----------------------------------------------------------------

TEST(LaunchEnvTorchrun, AgentStoreFlag) {
  auto parse = [](std::map<std::string, std::string> vars) {
    return dist::LaunchEnv::from_lookup([vars](const char* name) -> std::optional<std::string> {
      auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    });
  };
  EXPECT_TRUE(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}})
                  .store_served_by_agent);
  EXPECT_FALSE(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}})
                   .store_served_by_agent);
  EXPECT_FALSE(parse({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).store_served_by_agent);
}

TEST(DistCommunicator, AsyncAllGatherInAWorldOfOne) {
  auto comm = dist::Communicator::create(dist::LaunchEnv{});
  at::Tensor input = at::arange(3, at::kFloat);
  at::Tensor output = at::empty({3});
  dist::PendingCollective pending = comm.start_all_gather_into(output, input);
  pending.wait();
  pending.wait();
  EXPECT_TRUE(at::equal(output, input));
  dist::PendingCollective empty;
  empty.wait();
  at::Tensor small = at::empty({2});
  EXPECT_THROW_WITH(comm.start_all_gather_into(small, input), core::InvalidArgument, "all_gather_into: output has 2");
}

}  // namespace
}  // namespace dschat
