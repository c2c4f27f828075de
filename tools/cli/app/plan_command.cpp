#include "app/plan_command.h"

#include <algorithm>

#include "app/train_command.h"
#include "dschat/core/device.h"
#include "dschat/core/error.h"
#include "dschat/dist/launch_env.h"

namespace dschat {
namespace app {
namespace {

constexpr double kMostGpuGib = 1024;           // more is a unit mistake
constexpr double kMostHostGib = 64 * 1024;     // 64 TiB per node
constexpr double kAssumedHostGibPerGpu = 128;  // a DGX A100: 1 TiB for 8 GPUs

// The table's peak and bandwidth for this GPU's product name, with its own memory.
plan::Accelerator accelerator_of_device(const torch::Device& device) {
  const std::string product = core::device_product_name(device);
  const double memory_gib = static_cast<double>(core::device_memory_bytes(device)) / (1024.0 * 1024.0 * 1024.0);
  return plan::accelerator_for_product(product.empty() ? device.str() : product, memory_gib);
}

}  // namespace

plan::Hardware choose_hardware(const HardwareFlags& flags, const rlhf::PipelineConfig& config) {
  DSCHAT_CHECK(flags.gpu_memory >= 0, InvalidArgument, "--gpu-memory must not be negative, got ", flags.gpu_memory);
  // GiB, not bytes: no accelerator holds a TiB.
  DSCHAT_CHECK(flags.gpu_memory <= kMostGpuGib, InvalidArgument, "--gpu-memory is GiB per GPU (80 for an A100-80G), got ",
               flags.gpu_memory, ": above ", kMostGpuGib, " GiB (bytes? GiB = bytes / 2^30)");
  DSCHAT_CHECK(flags.host_memory <= kMostHostGib, InvalidArgument, "--host-memory is GiB per node, got ", flags.host_memory,
               ": above ", kMostHostGib, " GiB (bytes? GiB = bytes / 2^30)");
  DSCHAT_CHECK(flags.gpus >= 0, InvalidArgument, "--gpus must be at least 1, got ", flags.gpus);
  DSCHAT_CHECK(flags.margin >= 0 && flags.margin < 1, InvalidArgument, "--margin must be in [0, 1), got ", flags.margin);
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  const int64_t ranks = flags.gpus > 0 ? flags.gpus : std::max<int64_t>(env.world_size / std::max<int64_t>(flags.nodes, 1), 1);
  if (flags.names_gpu()) {
    // Another machine's GPUs: this machine's RAM says nothing about its host, so without
    // --host-memory a DGX A100's 128 GiB per GPU is assumed (1 TiB for 8), and the report says so.
    const bool assumed = flags.host_memory == 0;
    plan::Hardware hw = plan::hardware_for(flags.gpu.empty() ? "a100-80g" : flags.gpu, ranks, flags.nodes,
                                           assumed ? kAssumedHostGibPerGpu * static_cast<double>(ranks) : flags.host_memory);
    if (assumed) hw.host_memory_note = "assumed: 128 GiB per GPU, a DGX A100's; give --host-memory";
    if (flags.gpu.empty()) hw.device = {"custom", 0, hw.device.peak_tflops, hw.device.bandwidth_gbs,
                                        "--gpu-memory with A100-80G peak and bandwidth assumed"};
    if (flags.gpu_memory > 0) hw.device.memory_gib = flags.gpu_memory;
    return hw;
  }
  const torch::Device device = pipeline_device(config);
  if (device.is_cpu()) return plan::cpu_hardware(ranks * flags.nodes, flags.host_memory);
  plan::Hardware hw = plan::hardware_for("h100-80g", ranks, flags.nodes, flags.host_memory);
  hw.device = accelerator_of_device(device);
  return hw;
}

plan::PipelinePlan plan_for(const rlhf::PipelineConfig& config, const HardwareFlags& flags) {
  plan::PlanOptions options;
  options.hardware = choose_hardware(flags, config);
  options.margin = flags.margin;
  options.dataset_rows = flags.dataset_rows;
  options.count_rows = flags.count_rows;
  options.host_block_cache = true;  // main() installs it (core::retain_freed_host_memory)
  return plan::plan_pipeline(config, options);
}

}  // namespace app
}  // namespace dschat
