#pragma once
// RMSNorm over the last dimension: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight.
// Raw pointers, sizes and a stream; no allocation, no synchronisation. Accumulates in fp32.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dschat {
namespace kernels {

/// input, output: [rows, cols] row-major contiguous; weight: [cols]. T = float, __half,
/// __nv_bfloat16. Returns the launch status.
template <typename T>
cudaError_t rms_norm(const T* input, const T* weight, T* output, int64_t rows, int64_t cols, float eps,
                     cudaStream_t stream);

}  // namespace kernels
}  // namespace dschat
