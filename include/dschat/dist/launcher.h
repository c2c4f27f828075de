#pragma once
// `dschat launch`: starts the ranks of a job the way torchrun and DeepSpeed's launcher do (docs:
// docs/launch.md, DeepSpeed runtime reference §5).
//
// One launcher runs per node. It starts that node's ranks as child processes, each with the
// variables LaunchEnv reads (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, ...), and, when it was given a hostfile, also the launchers of the other nodes
// through ssh (like DeepSpeed's pdsh runner). It then watches them: the first rank (or remote
// node) that exits non-zero or dies from a signal is named in one line on stderr, the others get
// SIGTERM and, after a grace period, SIGKILL. SIGINT and SIGTERM sent to the launcher are
// forwarded to the ranks. It returns once every child has been reaped.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dschat {
namespace dist {

/// One line of a hostfile: `hostname slots=N`.
struct HostfileEntry {
  std::string host;
  int64_t slots = 0;
};

/// Parses DeepSpeed's hostfile format: one `hostname slots=N` per line, `#` starts a comment,
/// blank lines are skipped. Throws core::ConfigError naming `source` and the line for a line
/// without `slots=N`, a slot count that is not a positive integer, a host listed twice, or a file
/// without hosts.
std::vector<HostfileEntry> parse_hostfile(const std::string& text, const std::string& source);

/// parse_hostfile on the file's contents. Throws core::IoError when the file cannot be read.
std::vector<HostfileEntry> read_hostfile(const std::string& path);

struct LaunchPlan {
  /// What every rank runs: a program (looked up in PATH when it has no '/') and its arguments.
  std::vector<std::string> command;
  /// Ranks per node, in node order: node k runs global ranks sum(node_slots[0..k)) onward.
  std::vector<int64_t> node_slots{1};
  /// The host of each node (a hostfile's order). With more than one, this launcher starts the other
  /// nodes' launchers through `ssh_command`; empty: it starts only the ranks of `node_rank` (one
  /// node, or a multi-node job whose launchers are started by hand, as with torchrun).
  std::vector<std::string> hosts;
  /// The node whose ranks this launcher runs itself.
  int64_t node_rank = 0;
  /// Where rank 0 serves the rendezvous store. Empty: 127.0.0.1 for one node (also a hostfile with
  /// one host), else hosts[0].
  std::string master_addr;
  int master_port = 29500;
  /// The remote shell, split at spaces; the host and the remote command line are appended. Empty:
  /// the environment variable DSCHAT_SSH, else "ssh -o BatchMode=yes".
  std::string ssh_command;
  /// The argv that runs `dschat launch` on another host (e.g. {"/opt/dschat/bin/dschat", "launch"});
  /// needed when hosts has more than one entry.
  std::vector<std::string> remote_launcher;
  /// Stop the ranks when stdin reaches end of file: a launcher started through ssh is told this way
  /// that the launcher which started it is gone. Its ranks get /dev/null as stdin.
  bool stop_when_stdin_closes = false;
  /// How long stopped ranks get between SIGTERM and SIGKILL.
  std::chrono::milliseconds stop_grace = std::chrono::seconds(10);
};

/// Runs the job and returns its exit status: 0 when every rank exited 0; otherwise the first
/// failure's exit code, or 128 + signal number for a rank killed by a signal (and for a launcher
/// stopped by SIGINT/SIGTERM). Throws core::InvalidArgument for an inconsistent plan and
/// core::Error when a child cannot be started (after stopping the ones already started). Status
/// lines go to stderr, prefixed "dschat launch: ". One launch at a time per process: it installs
/// handlers for SIGINT, SIGTERM and SIGCHLD while it runs and restores the previous ones after.
int launch(const LaunchPlan& plan);

/// The argv that starts node `node`'s launcher on its host:
///   <ssh command...> <host> "cd '<cwd>' && exec env 'NCCL_...=...' ... '<remote launcher>'
///                            --node-slots 2,2 --node-rank <node> --master-addr A --master-port P
///                            --stop-on-stdin-eof -- '<command>' '<args>'..."
/// Forwarded variables: those starting with NCCL_, GLOO_, UCX_, PYTHON, TORCH_ or DSCHAT_ (except
/// DSCHAT_SSH), and OMP_NUM_THREADS, as DeepSpeed's runner exports its NCCL/PYTHON/UCX ones.
std::vector<std::string> remote_node_argv(const LaunchPlan& plan, int64_t node);

}  // namespace dist
}  // namespace dschat
