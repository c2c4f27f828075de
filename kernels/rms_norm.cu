#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/rms_norm.cuh"

namespace dschat {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// One block per row: each thread sums squares over a strided slice, the block reduces through
// warp shuffles + shared memory, then every thread scales its slice.
template <typename T>
__global__ void rms_norm_kernel(const T* __restrict__ input, const T* __restrict__ weight,
                                T* __restrict__ output, int64_t cols, float eps) {
  const int64_t row = blockIdx.x;
  const T* x = input + row * cols;
  T* y = output + row * cols;

  float sum_squares = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = static_cast<float>(x[c]);
    sum_squares += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum_squares += __shfl_xor_sync(0xffffffff, sum_squares, offset);

  __shared__ float warp_sums[kThreads / 32];  // [warps]
  __shared__ float inv_rms;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = sum_squares;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
    inv_rms = rsqrtf(total / static_cast<float>(cols) + eps);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    // Match the reference's rounding: normalise in fp32, round to T, then multiply by weight.
    T normalised = static_cast<T>(static_cast<float>(x[c]) * inv_rms);
    y[c] = static_cast<T>(static_cast<float>(weight[c]) * static_cast<float>(normalised));
  }
}

}  // namespace

template <typename T>
cudaError_t rms_norm(const T* input, const T* weight, T* output, int64_t rows, int64_t cols, float eps,
                     cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  rms_norm_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(input, weight, output, cols, eps);
  return cudaGetLastError();
}

template cudaError_t rms_norm<float>(const float*, const float*, float*, int64_t, int64_t, float, cudaStream_t);
template cudaError_t rms_norm<__half>(const __half*, const __half*, __half*, int64_t, int64_t, float, cudaStream_t);
template cudaError_t rms_norm<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                             int64_t, float, cudaStream_t);

}  // namespace kernels
}  // namespace dschat
