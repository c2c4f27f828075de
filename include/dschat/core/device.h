#pragma once
// Which device a step, a command or a library user runs on: the `device` key of configs and the
// `--device` flag of the CLI. Names: "auto" | "cpu" | "cuda" | "cuda:N".
//   auto   : CUDA when this build has CUDA and a GPU is visible, else the CPU
//   cuda   : the process's GPU: cuda:LOCAL_RANK under a launcher, else cuda:0
//   cuda:N : that GPU, whatever the launcher says
// Asking for CUDA where there is none is a core::ConfigError naming what is missing (no CUDA in
// this build / no visible GPU / N out of range), and `where` (the key or flag).
#include <torch/torch.h>

#include <string>

namespace dschat {
namespace core {

/// What the process can run on; from_runtime() asks LibTorch. Tests build their own.
struct DeviceInventory {
  bool cuda_built = false;  // libdschat compiled with CUDA and LibTorch has CUDA
  int cuda_devices = 0;     // GPUs visible to this process (CUDA_VISIBLE_DEVICES applies)
  static DeviceInventory from_runtime();
};

/// Resolves a device name for this process. `local_rank` is the launcher's LOCAL_RANK (-1 when
/// not launched): "auto"/"cuda" then pick cuda:LOCAL_RANK, which must exist.
torch::Device resolve_device(const std::string& name, const std::string& where, int64_t local_rank,
                             const DeviceInventory& inventory);
torch::Device resolve_device(const std::string& name, const std::string& where, int64_t local_rank = -1);

/// True for the names resolve_device accepts (without resolving them).
bool is_device_name(const std::string& name);

/// `device` with its index: a bare "cuda" (torch::kCUDA) is this thread's current GPU, the index
/// every tensor placed there reports (cuda:0), so devices compare equal to tensors' devices.
torch::Device indexed_device(const torch::Device& device);

/// Makes `device` the current CUDA device (what NCCL communicators and un-indexed kCUDA tensors
/// use); a no-op for the CPU. Call before creating a communicator.
void set_current_device(const torch::Device& device);

/// One line per process, logged once: "device: cuda:0 (NVIDIA H200, 143 GB) [auto]".
void log_device_choice(const torch::Device& device, const std::string& name);

/// "cuda:0 (NVIDIA H200, 143771 MiB)" or "cpu (2 threads)".
std::string describe_device(const torch::Device& device);

/// Total memory of a CUDA device in bytes, and its name ("NVIDIA H200"); 0 and "" for the CPU or
/// a build without CUDA.
int64_t device_memory_bytes(const torch::Device& device);
std::string device_product_name(const torch::Device& device);

}  // namespace core
}  // namespace dschat
