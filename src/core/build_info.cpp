#include "dschat/core/build_info.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <sstream>

#include "dschat/core/device.h"
#include "dschat_build_info.h"

#ifdef DSCHAT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/nccl.h>
#endif

namespace dschat {
namespace core {

BuildInfo build_info() {
  BuildInfo info;
  info.dschat_version = DSCHAT_VERSION_STRING;
  info.torch_version = TORCH_VERSION;
  info.build_type = DSCHAT_BUILD_TYPE_STRING;
  info.sanitizers = DSCHAT_SANITIZE_STRING;
  info.cuda_version = "not built";
  info.nccl_version = "not built";
#ifdef DSCHAT_WITH_CUDA
  info.cuda_kernels = true;
  info.cuda_version = std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  uint64_t nccl = torch::cuda::nccl::version();  // packed as major << 32 | minor << 16 | patch
  info.nccl_version = std::to_string(nccl >> 32) + "." + std::to_string((nccl >> 16) & 0xffff) + "." +
                      std::to_string(nccl & 0xffff);
  info.cuda_device_count = static_cast<int>(c10::cuda::device_count());
#endif
  return info;
}

std::string describe_build() {
  BuildInfo info = build_info();
  std::ostringstream out;
  out << "dschat      " << info.dschat_version << " (" << info.build_type
      << (info.sanitizers.empty() ? "" : ", sanitize=" + info.sanitizers) << ")\n"
      << "LibTorch    " << info.torch_version << "\n"
      << "CUDA        " << info.cuda_version << "\n"
      << "NCCL        " << info.nccl_version << "\n"
      << "devices     cpu (" << torch::get_num_threads() << " threads)";
#ifdef DSCHAT_WITH_CUDA
  for (int i = 0; i < info.cuda_device_count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      out << ", cuda:" << i << " " << prop.name << " (" << prop.totalGlobalMem / (1 << 20) << " MiB)";
    }
  }
#endif
  // What `--device auto` (every command's default) resolves to in this process.
  out << "\nauto        " << describe_device(resolve_device("auto", "auto"));
  out << "\nfeatures    cuda-kernels=" << (info.cuda_kernels ? "on" : "off")
      << " models=opt,llama\n";
  return out.str();
}

}  // namespace core
}  // namespace dschat
