#pragma once
// The device's peak memory over a benchmark's timed part: the CUDA caching allocator's peak of
// allocated bytes since the last reset. -1 on the CPU, or where LibTorch has no CUDA headers.
#include <torch/torch.h>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define DSCHAT_BENCH_CUDA_MEMORY 1
#endif

namespace dschat {
namespace bench {

inline void reset_peak_device_memory(const torch::Device& device) {
#ifdef DSCHAT_BENCH_CUDA_MEMORY
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index() : 0);
#else
  (void)device;
#endif
}

inline double peak_device_memory(const torch::Device& device) {
#ifdef DSCHAT_BENCH_CUDA_MEMORY
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.has_index() ? device.index() : 0);
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }
#else
  (void)device;
#endif
  return -1.0;
}

}  // namespace bench
}  // namespace dschat
