#pragma once
// Device helpers shared by the kernels in this folder: fp32 conversion of the storage types
// (float, __half, __nv_bfloat16), rounding through a storage type, 16-byte vector loads/stores,
// warp and block reductions. Included by kernels/*.cu only.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace dschat {
namespace kernels {
namespace detail {

/// Elements of T in one 16-byte vector: 4 floats, 8 halves or bfloat16s.
template <typename T>
constexpr int kVecWidth = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}

/// v rounded to T and back: what an ATen op on T-tensors stores between two steps. The fused
/// kernels round where the ATen reference rounds, so they agree with it to fp32 noise.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

/// Loads V consecutive elements (one vector instruction when V * sizeof(T) is 4, 8 or 16 bytes;
/// `p` must then be aligned to V * sizeof(T)) as floats.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_float(pack.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  Pack<T, V> pack;
#pragma unroll
  for (int i = 0; i < V; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Sum (kMax = false) or max (kMax = true) of `v` over the block, returned to every thread.
/// blockDim.x must be a multiple of 32 (at most 1024) and every thread must call it;
/// `scratch` holds 32 floats and may be reused by the next call.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // a previous call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.f);
  return kMax ? warp_max(total) : warp_sum(total);
}

/// True when `p` is aligned to `bytes` (host side; null counts as aligned).
inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace detail
}  // namespace kernels
}  // namespace dschat
