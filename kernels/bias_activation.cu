#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/bias_activation.cuh"
#include "kernels/common.cuh"

namespace dschat {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride loops cover the rest

// ATen's fp32 formulas (aten/src/ATen/native/cuda/ActivationGeluKernel.cu, ActivationSiluKernel.cu).
__device__ __forceinline__ float activate(Activation activation, float v) {
  switch (activation) {
    case Activation::Relu: return v < 0.f ? 0.f : v;  // NaN stays NaN, as torch.relu
    case Activation::Gelu: return v * 0.5f * (1.f + erff(v * 0.70710678118654752f));
    case Activation::GeluTanh: {
      const float inner = 0.79788456080286536f * (v + 0.044715f * (v * v * v));
      return 0.5f * v * (1.f + tanhf(inner));
    }
    case Activation::Silu: return v / (1.f + expf(-v));
  }
  return v;
}

template <typename T, int V>
__global__ void bias_activation_kernel(const T* x, const T* bias, T* out, int64_t row_vecs, int64_t vecs,
                                       Activation activation) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float xv[V], bv[V], y[V];
    detail::load_vec<T, V>(x + i * V, xv);
    if (bias != nullptr) detail::load_vec<T, V>(bias + (i % row_vecs) * V, bv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float sum = bias != nullptr ? detail::round_to<T>(xv[e] + bv[e]) : xv[e];
      y[e] = activate(activation, sum);
    }
    detail::store_vec<T, V>(out + i * V, y);
  }
}

template <typename T, int V>
__global__ void silu_and_mul_kernel(const T* gate, const T* up, T* out, int64_t cols, int64_t row_vecs, int64_t vecs,
                                    int64_t gate_stride, int64_t up_stride) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, col = (i % row_vecs) * V;
    float g[V], u[V], y[V];
    detail::load_vec<T, V>(gate + row * gate_stride + col, g);
    detail::load_vec<T, V>(up + row * up_stride + col, u);
#pragma unroll
    for (int e = 0; e < V; ++e) y[e] = detail::round_to<T>(activate(Activation::Silu, g[e])) * u[e];
    detail::store_vec<T, V>(out + row * cols + col, y);
  }
}

unsigned grid_for(int64_t vecs) { return static_cast<unsigned>(std::min(detail::ceil_div(vecs, kThreads), kMaxBlocks)); }

}  // namespace

template <typename T>
cudaError_t bias_activation(const T* x, const T* bias, T* out, int64_t rows, int64_t cols, Activation activation,
                            cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kVec = detail::kVecWidth<T>;
  const bool vectorised = cols % kVec == 0 && detail::is_aligned(x, 16) && detail::is_aligned(bias, 16) &&
                          detail::is_aligned(out, 16);
  if (vectorised) {
    const int64_t vecs = rows * cols / kVec;
    bias_activation_kernel<T, kVec><<<grid_for(vecs), kThreads, 0, stream>>>(x, bias, out, cols / kVec, vecs, activation);
  } else {
    bias_activation_kernel<T, 1><<<grid_for(rows * cols), kThreads, 0, stream>>>(x, bias, out, cols, rows * cols,
                                                                                   activation);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t silu_and_mul(const T* gate, const T* up, T* out, int64_t rows, int64_t cols, int64_t gate_stride,
                         int64_t up_stride, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int kVec = detail::kVecWidth<T>;
  const bool vectorised = cols % kVec == 0 && gate_stride % kVec == 0 && up_stride % kVec == 0 &&
                          detail::is_aligned(gate, 16) && detail::is_aligned(up, 16) && detail::is_aligned(out, 16);
  if (vectorised) {
    const int64_t vecs = rows * cols / kVec;
    silu_and_mul_kernel<T, kVec><<<grid_for(vecs), kThreads, 0, stream>>>(gate, up, out, cols, cols / kVec, vecs,
                                                                          gate_stride, up_stride);
  } else {
    silu_and_mul_kernel<T, 1><<<grid_for(rows * cols), kThreads, 0, stream>>>(gate, up, out, cols, cols, rows * cols,
                                                                              gate_stride, up_stride);
  }
  return cudaGetLastError();
}

#define DSCHAT_INSTANTIATE(T)                                                                                     \
  template cudaError_t bias_activation<T>(const T*, const T*, T*, int64_t, int64_t, Activation, cudaStream_t);   \
  template cudaError_t silu_and_mul<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
DSCHAT_INSTANTIATE(float)
DSCHAT_INSTANTIATE(__half)
DSCHAT_INSTANTIATE(__nv_bfloat16)
#undef DSCHAT_INSTANTIATE

}  // namespace kernels
}  // namespace dschat
