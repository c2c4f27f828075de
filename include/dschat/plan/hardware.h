#pragma once
// What `dschat plan` plans for: an accelerator from a small table (memory, dense bf16/fp16 peak,
// memory bandwidth), how many of them per node, how many nodes, and the host memory per node.
//
//   Hardware h = hardware_for("h200", /*gpus_per_node=*/1, /*nodes=*/1);   // 140 GiB, 989 TFLOP/s
//   Hardware c = cpu_hardware(/*processes=*/2);                             // this machine's memory

#include <cstdint>
#include <string>
#include <vector>

namespace dschat {
namespace plan {

struct Accelerator {
  std::string name;          // "a100-80g"
  double memory_gib = 0;     // usable device memory per GPU (what the driver reports)
  double peak_tflops = 0;    // dense bf16 (fp16 where the chip has no bf16) tensor-core peak
  double bandwidth_gbs = 0;  // device memory bandwidth, GB/s
  std::string description;
};

/// The table `--gpu` picks from (docs/plan.md lists it with its sources).
const std::vector<Accelerator>& accelerator_table();

/// The table's entry for `name` (case-insensitive; "H200", "a100-80g"). Throws core::InvalidArgument
/// naming `name` and listing the table when it is not there.
Accelerator find_accelerator(const std::string& name);

/// The table entry whose family the driver's product name contains ("NVIDIA H200" -> h200) for
/// its peak and bandwidth (H100-class assumed, and said so, when none does), with the device's
/// own memory and name.
Accelerator accelerator_for_product(const std::string& product_name, double memory_gib);

struct Hardware {
  Accelerator device;
  bool cpu = false;           // ranks are host processes; device memory is host memory
  int64_t gpus_per_node = 1;  // ranks per node
  int64_t nodes = 1;
  double host_memory_gib = 0;  // per node
  std::string host_memory_note;  // where host_memory_gib came from when it was not given (reports)
  int64_t world_size() const { return gpus_per_node * nodes; }
};

/// `gpus_per_node` × `nodes` of `accelerator`; host memory is this machine's unless given (> 0).
/// Throws core::InvalidArgument for counts < 1 or negative memory.
Hardware hardware_for(const std::string& accelerator, int64_t gpus_per_node, int64_t nodes,
                      double host_memory_gib = 0);

/// `processes` ranks on this machine's CPU: they share its memory (MemTotal), cores and memory
/// bandwidth, so each rank's "device" has 1/processes of each.
Hardware cpu_hardware(int64_t processes, double host_memory_gib = 0);

/// MemTotal of /proc/meminfo in GiB (0 when it cannot be read).
double machine_memory_gib();

}  // namespace plan
}  // namespace dschat
