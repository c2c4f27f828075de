#include "dschat/core/device.h"

#include <cstdlib>
#include <optional>

#include "core/log.h"
#include "dschat/core/error.h"

#ifdef DSCHAT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace dschat {
namespace core {
namespace {

constexpr const char* kDeviceNames = "auto, cpu, cuda or cuda:N";

// "cuda:N" -> N; -1 for "cuda"; nullopt for anything else.
std::optional<int64_t> cuda_index(const std::string& name) {
  if (name == "cuda") return -1;
  if (name.rfind("cuda:", 0) != 0 || name.size() == 5 || name.size() > 9) return std::nullopt;
  int64_t index = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    index = index * 10 + (name[i] - '0');
  }
  return index;
}

std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? std::string() : std::string(" (CUDA_VISIBLE_DEVICES='") + visible + "')";
}

#ifdef DSCHAT_WITH_CUDA
// The driver's description of a CUDA device (index -1: device 0); nullopt for the CPU or on error.
std::optional<cudaDeviceProp> cuda_properties(const torch::Device& device) {
  cudaDeviceProp prop{};
  if (!device.is_cuda() || cudaGetDeviceProperties(&prop, device.index() < 0 ? 0 : device.index()) != cudaSuccess) {
    return std::nullopt;
  }
  return prop;
}
#endif

}  // namespace

DeviceInventory DeviceInventory::from_runtime() {
  DeviceInventory inventory;
#ifdef DSCHAT_WITH_CUDA
  inventory.cuda_built = true;
  inventory.cuda_devices = static_cast<int>(c10::cuda::device_count());
#endif
  return inventory;
}

bool is_device_name(const std::string& name) {
  return name == "auto" || name == "cpu" || cuda_index(name).has_value();
}

torch::Device resolve_device(const std::string& name, const std::string& where, int64_t local_rank,
                             const DeviceInventory& inventory) {
  DSCHAT_CHECK(is_device_name(name), ConfigError, where, ": '", name, "' is not a device (", kDeviceNames, ")");
  if (name == "cpu") return torch::kCPU;
  const bool have_gpu = inventory.cuda_built && inventory.cuda_devices > 0;
  if (name == "auto" && !have_gpu) return torch::kCPU;
  DSCHAT_CHECK(inventory.cuda_built, ConfigError, where, ": '", name,
               "' needs CUDA, but this dschat build has no CUDA (build with a CUDA LibTorch and nvcc, "
               "DSCHAT_WITH_CUDA=ON); use cpu or auto");
  DSCHAT_CHECK(inventory.cuda_devices > 0, ConfigError, where, ": '", name, "' needs a GPU, but none is visible",
               visible_devices_note(), "; use cpu or auto");
  int64_t index = name == "auto" ? -1 : *cuda_index(name);
  if (index < 0) {
    index = local_rank >= 0 ? local_rank : 0;
    DSCHAT_CHECK(index < inventory.cuda_devices, ConfigError, where, ": '", name, "' on local rank ", local_rank,
                 " means cuda:", index, ", but only ", inventory.cuda_devices, " GPU(s) are visible",
                 visible_devices_note(), "; start at most that many ranks per node");
  }
  DSCHAT_CHECK(index < inventory.cuda_devices, ConfigError, where, ": cuda:", index, " is out of range: ",
               inventory.cuda_devices, " GPU(s) are visible", visible_devices_note());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

torch::Device resolve_device(const std::string& name, const std::string& where, int64_t local_rank) {
  return resolve_device(name, where, local_rank, DeviceInventory::from_runtime());
}

torch::Device indexed_device(const torch::Device& device) {
  if (!device.is_cuda() || device.has_index()) return device;
#ifdef DSCHAT_WITH_CUDA
  return torch::Device(torch::kCUDA, c10::cuda::current_device());
#else
  return device;
#endif
}

void set_current_device(const torch::Device& device) {
  if (!device.is_cuda()) return;
#ifdef DSCHAT_WITH_CUDA
  c10::cuda::set_device(device.index() < 0 ? 0 : device.index());
#else
  DSCHAT_THROW(ConfigError, "device ", device.str(), ": this dschat build has no CUDA");
#endif
}

std::string describe_device(const torch::Device& device) {
  if (!device.is_cuda()) return "cpu (" + std::to_string(torch::get_num_threads()) + " threads)";
#ifdef DSCHAT_WITH_CUDA
  if (const auto prop = cuda_properties(device)) {
    return "cuda:" + std::to_string(device.index() < 0 ? 0 : device.index()) + " (" + prop->name + ", " +
           std::to_string(prop->totalGlobalMem >> 20) + " MiB, compute " + std::to_string(prop->major) + "." +
           std::to_string(prop->minor) + ")";
  }
#endif
  return device.str();
}

int64_t device_memory_bytes(const torch::Device& device) {
#ifdef DSCHAT_WITH_CUDA
  if (const auto prop = cuda_properties(device)) return static_cast<int64_t>(prop->totalGlobalMem);
#endif
  (void)device;
  return 0;
}

std::string device_product_name(const torch::Device& device) {
#ifdef DSCHAT_WITH_CUDA
  if (const auto prop = cuda_properties(device)) return prop->name;
#endif
  (void)device;
  return "";
}

void log_device_choice(const torch::Device& device, const std::string& name) {
  const std::string line = "device: " + describe_device(device) + " [" + name + "]";
  if (first_time_seen(line)) log_info(line);
}

}  // namespace core
}  // namespace dschat
