#pragma once
// What `dschat plan` and the plan `dschat train` runs first share: choosing the hardware from
// the flags (a table GPU, a memory size, or the device the config resolves to on this machine)
// and running the planner over the parsed pipeline config.
#include <cstdint>
#include <string>

#include "dschat/plan/step_plan.h"
#include "dschat/rlhf/config/pipeline_config.h"

namespace dschat {
namespace app {

struct HardwareFlags {
  std::string gpu;          // a table name; "" : --gpu-memory, else this machine's device
  double gpu_memory = 0;    // GiB per GPU (> 0: overrides the table's memory)
  int64_t gpus = 0;         // ranks per node (0: the launcher's world, else 1)
  int64_t nodes = 1;
  double host_memory = 0;   // GiB per node (0: this machine's)
  double margin = 0.10;     // fraction of device memory kept free
  int64_t dataset_rows = -1;
  bool count_rows = true;   // count the datasets for the total time (train's check skips it)
  /// Whether the flags name GPUs this machine may not have (planning for another machine).
  bool names_gpu() const { return !gpu.empty() || gpu_memory > 0; }
};

/// The hardware of the flags; with none named, the device `config`'s first step was resolved to
/// (plan_train; its memory and product name when it is a GPU; the host when it is the CPU).
/// Throws core::InvalidArgument for an unknown GPU or a negative size, naming the flag.
plan::Hardware choose_hardware(const HardwareFlags& flags, const rlhf::PipelineConfig& config);

/// The plan of `config` on the flags' hardware.
plan::PipelinePlan plan_for(const rlhf::PipelineConfig& config, const HardwareFlags& flags);

}  // namespace app
}  // namespace dschat
