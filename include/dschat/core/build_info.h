#pragma once
// What this build of libdschat contains and which devices it sees (`dschat info`).

#include <string>

namespace dschat {
namespace core {

struct BuildInfo {
  std::string dschat_version;
  std::string torch_version;
  std::string cuda_version;   // "not built" without the CUDA kernels
  std::string nccl_version;   // "not built" when LibTorch has no NCCL
  bool cuda_kernels = false;  // kernels/ compiled in (DSCHAT_WITH_CUDA)
  int cuda_device_count = 0;  // devices visible at run time
  std::string build_type;
  std::string sanitizers;
};

BuildInfo build_info();

/// Multi-line human-readable report of build_info() plus the device names.
std::string describe_build();

}  // namespace core
}  // namespace dschat
