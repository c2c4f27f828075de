#pragma once
// Where this process sits in a distributed job, read from the variables its launcher exported.
//
// Launchers, first match wins (docs: DeepSpeed runtime reference §5):
//   torchrun / deepspeed launcher : RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (DeepSpeed's
//                                   launcher writes LOCAL_SIZE instead), MASTER_ADDR, MASTER_PORT
//   mpirun (Open MPI)             : OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   srun (Slurm)                  : SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and per-node task
//                                   counts from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE
//   none of them                  : a single process, rank 0 of 1
// MASTER_ADDR and MASTER_PORT are honoured under every launcher. Without MASTER_ADDR a job on one
// node rendezvouses on 127.0.0.1; a Slurm job on several nodes uses the first host of its node
// list; any other multi-node job must set it. MASTER_PORT defaults to DeepSpeed's 29500.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dschat {
namespace dist {

struct LaunchEnv {
  int64_t rank = 0;
  int64_t local_rank = 0;
  int64_t world_size = 1;
  int64_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// GLOO_SOCKET_IFNAME: the network interface Gloo binds to ("" = pick from the hostname), as
  /// in torch.distributed; multi-node hosts with several interfaces need it.
  std::string socket_ifname;
  /// TORCHELASTIC_USE_AGENT_STORE=True (torchrun sets it): torchrun's agent already serves the
  /// store at MASTER_ADDR:MASTER_PORT, so every rank, rank 0 included, connects to it as a client.
  bool store_served_by_agent = false;
  /// Which launcher the values came from: "torchrun", "openmpi", "slurm" or "single".
  std::string source = "single";

  /// Reads the process environment. Throws core::ConfigError naming the variable and its value
  /// when values are non-numeric, out of range or inconsistent (RANK >= WORLD_SIZE, RANK set
  /// without WORLD_SIZE, ...).
  static LaunchEnv from_environment();

  /// Same rules over any variable source (unset or empty -> nullopt); tests use a map.
  using Lookup = std::function<std::optional<std::string>(const char* name)>;
  static LaunchEnv from_lookup(const Lookup& lookup);
};

}  // namespace dist
}  // namespace dschat
