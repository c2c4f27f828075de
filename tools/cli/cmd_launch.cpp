// `dschat launch [--nproc-per-node N] [--hostfile F] [--nnodes K --node-rank R] [--master-addr A]
//                [--master-port P] -- <command> [args...]`
// Starts the ranks of a job like torchrun (one node, or one launcher per node started by hand) or
// like DeepSpeed's runner (a hostfile: the other hosts' launchers are started through ssh). The
// exit status is the first failed rank's (128 + signal for a killed one). docs/launch.md.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "dschat/core/error.h"
#include "dschat/dist/launcher.h"

namespace dschat {
namespace cli {
namespace {

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  std::string hostfile;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master_addr;
  int master_port = 29500;
  std::vector<int64_t> node_slots;  // set by the ssh runner for the other nodes' launchers
  bool stop_on_stdin_eof = false;   // likewise
  std::vector<std::string> command;
};

// The remote nodes run this same binary (a shared file system, or the same install path).
std::string own_executable() {
  std::vector<char> path(4096);
  ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  DSCHAT_CHECK(n > 0, Error, "launch: cannot find the dschat executable (/proc/self/exe)");
  return std::string(path.data(), static_cast<size_t>(n));
}

dist::LaunchPlan make_plan(const LaunchOptions& o) {
  DSCHAT_CHECK(!o.command.empty(), InvalidArgument,
               "launch: no command: give it after '--', e.g. dschat launch --nproc-per-node 2 -- ./train --lr 1e-4");
  DSCHAT_CHECK(o.nproc_per_node >= 1, InvalidArgument, "--nproc-per-node: expected at least 1 rank, got ",
               o.nproc_per_node);
  DSCHAT_CHECK(o.nnodes >= 1, InvalidArgument, "--nnodes: expected at least 1 node, got ", o.nnodes);
  DSCHAT_CHECK(o.master_port >= 1 && o.master_port <= 65535, InvalidArgument, "--master-port: ", o.master_port,
               " is out of range (expected 1..65535)");
  dist::LaunchPlan plan;
  plan.command = o.command;
  plan.master_addr = o.master_addr;
  plan.master_port = o.master_port;
  plan.node_rank = o.node_rank;
  plan.stop_when_stdin_closes = o.stop_on_stdin_eof;
  if (!o.hostfile.empty()) {
    plan.node_slots.clear();
    for (const dist::HostfileEntry& entry : dist::read_hostfile(o.hostfile)) {
      plan.hosts.push_back(entry.host);
      plan.node_slots.push_back(entry.slots);
    }
    plan.remote_launcher = {own_executable(), "launch"};
  } else if (!o.node_slots.empty()) {
    for (int64_t slots : o.node_slots) {
      DSCHAT_CHECK(slots >= 1, InvalidArgument, "--node-slots: every node needs at least 1 rank, got ", slots);
    }
    plan.node_slots = o.node_slots;
  } else {
    plan.node_slots.assign(static_cast<size_t>(o.nnodes), o.nproc_per_node);
    DSCHAT_CHECK(o.nnodes == 1 || !o.master_addr.empty(), InvalidArgument,
                 "--master-addr is required with --nnodes ", o.nnodes, " (the address of node 0, where rank 0 "
                 "serves the rendezvous store)");
  }
  const auto nodes = static_cast<int64_t>(plan.node_slots.size());
  DSCHAT_CHECK(o.node_rank >= 0 && o.node_rank < nodes, InvalidArgument, "--node-rank: ", o.node_rank,
               " is out of range for ", nodes, " node(s) (expected 0..", nodes - 1, ")");
  return plan;
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch", "Start the ranks of a distributed job (torchrun/DeepSpeed style)");
  auto* nproc = cmd->add_option("--nproc-per-node", o->nproc_per_node, "Ranks on this node")->capture_default_str();
  auto* hostfile = cmd->add_option("--hostfile", o->hostfile,
                                   "DeepSpeed hostfile ('host slots=N' lines): this launcher runs the ranks of "
                                   "--node-rank's host and starts the others through ssh ($DSCHAT_SSH)");
  auto* nnodes = cmd->add_option("--nnodes", o->nnodes, "Nodes, each with its own launcher started by hand")
                     ->capture_default_str();
  cmd->add_option("--node-rank", o->node_rank, "This node's index (0 runs rank 0)")->capture_default_str();
  cmd->add_option("--master-addr", o->master_addr,
                  "Host of rank 0 (default: 127.0.0.1 on one node, the first host of a hostfile)");
  cmd->add_option("--master-port", o->master_port, "Port of the rendezvous store")->capture_default_str();
  auto* slots = cmd->add_option("--node-slots", o->node_slots,
                                "Ranks per node, comma separated (set by the ssh runner for remote nodes)")
                    ->delimiter(',');
  cmd->add_flag("--stop-on-stdin-eof", o->stop_on_stdin_eof,
                "Stop the ranks when stdin closes (set by the ssh runner for remote nodes)");
  cmd->add_option("command", o->command, "The program every rank runs, and its arguments (after --)");
  hostfile->excludes(nproc)->excludes(nnodes)->excludes(slots);
  slots->excludes(nproc)->excludes(nnodes);
  cmd->callback([o] {
    const int status = dist::launch(make_plan(*o));
    if (status != 0) {
      // The job's own status (a rank's exit code, 128 + signal), which main()'s error path would
      // flatten to 1 or 2; scripts and outer launchers act on it, as they do on torchrun's.
      std::cout.flush();
      std::cerr.flush();
      std::exit(status);
    }
  });
}

}  // namespace cli
}  // namespace dschat
