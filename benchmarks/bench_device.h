#pragma once
// What the benchmarks do with the device: wait for its queued work before reading a clock (a GPU
// runs ahead of the host), and read its peak memory over a timed part (the CUDA caching
// allocator's peak of allocated bytes since the last reset; -1 on the CPU, or where LibTorch has
// no CUDA headers).
#include <torch/torch.h>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define DSCHAT_BENCH_CUDA_MEMORY 1
#endif

namespace dschat {
namespace bench {

inline c10::DeviceIndex cuda_index(const torch::Device& device) { return device.has_index() ? device.index() : 0; }

inline void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(cuda_index(device));
}

inline void reset_peak_device_memory(const torch::Device& device) {
#ifdef DSCHAT_BENCH_CUDA_MEMORY
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
#else
  (void)device;
#endif
}

inline double peak_device_memory(const torch::Device& device) {
#ifdef DSCHAT_BENCH_CUDA_MEMORY
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
    return static_cast<double>(stats.allocated_bytes[0].peak);
  }
#else
  (void)device;
#endif
  return -1.0;
}

}  // namespace bench
}  // namespace dschat
