#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/residual_norm.cuh"

namespace dschat {
namespace kernels {
namespace {

constexpr int kMaxThreads = 512;

// One block per row, V elements per vector. Pass 1 forms the sum (rounded as ATen rounds it),
// stores it as the new residual and accumulates its statistics; later passes re-read the stored
// (rounded) sum, so the normalised output is exactly the norm of the returned residual. Each
// thread re-reads only the vectors it wrote itself.
template <typename T, int V, bool kRms>
__global__ void __launch_bounds__(kMaxThreads) residual_norm_kernel(const ResidualNormParams<T> p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t vecs = p.cols / V;
  const T* x = p.x + row * p.cols;
  const T* residual = p.residual + row * p.cols;
  T* sum_out = p.residual_out + row * p.cols;
  T* out = p.out + row * p.cols;

  float stat = 0.f;  // sum (LayerNorm) or sum of squares (RMSNorm)
  for (int64_t vi = threadIdx.x; vi < vecs; vi += blockDim.x) {
    float xv[V], rv[V], bv[V], s[V];
    detail::load_vec<T, V>(x + vi * V, xv);
    detail::load_vec<T, V>(residual + vi * V, rv);
    if (p.bias != nullptr) detail::load_vec<T, V>(p.bias + vi * V, bv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float with_bias = p.bias != nullptr ? detail::round_to<T>(xv[e] + bv[e]) : xv[e];
      s[e] = detail::round_to<T>(with_bias + rv[e]);
      stat += kRms ? s[e] * s[e] : s[e];
    }
    detail::store_vec<T, V>(sum_out + vi * V, s);
  }
  const float cols = static_cast<float>(p.cols);
  stat = detail::block_reduce<false>(stat, scratch);

  if constexpr (kRms) {
    const float inv_rms = rsqrtf(stat / cols + p.eps);
    for (int64_t vi = threadIdx.x; vi < vecs; vi += blockDim.x) {
      float s[V], w[V], y[V];
      detail::load_vec<T, V>(sum_out + vi * V, s);
      detail::load_vec<T, V>(p.weight + vi * V, w);
#pragma unroll
      for (int e = 0; e < V; ++e) y[e] = w[e] * detail::round_to<T>(s[e] * inv_rms);
      detail::store_vec<T, V>(out + vi * V, y);
    }
  } else {
    const float mean = stat / cols;
    float squares = 0.f;
    for (int64_t vi = threadIdx.x; vi < vecs; vi += blockDim.x) {
      float s[V];
      detail::load_vec<T, V>(sum_out + vi * V, s);
#pragma unroll
      for (int e = 0; e < V; ++e) squares += (s[e] - mean) * (s[e] - mean);
    }
    const float rstd = rsqrtf(detail::block_reduce<false>(squares, scratch) / cols + p.eps);
    for (int64_t vi = threadIdx.x; vi < vecs; vi += blockDim.x) {
      float s[V], g[V], bt[V], y[V];
      detail::load_vec<T, V>(sum_out + vi * V, s);
      if (p.weight != nullptr) detail::load_vec<T, V>(p.weight + vi * V, g);
      if (p.beta != nullptr) detail::load_vec<T, V>(p.beta + vi * V, bt);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float normalised = (s[e] - mean) * rstd;
        if (p.weight != nullptr) normalised *= g[e];
        if (p.beta != nullptr) normalised += bt[e];
        y[e] = normalised;
      }
      detail::store_vec<T, V>(out + vi * V, y);
    }
  }
}

template <typename T, bool kRms>
cudaError_t launch(const ResidualNormParams<T>& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.rows > 0x7fffffff) return cudaErrorInvalidValue;
  constexpr int kVec = detail::kVecWidth<T>;
  const bool vectorised = p.cols % kVec == 0 && detail::is_aligned(p.x, 16) && detail::is_aligned(p.bias, 16) &&
                          detail::is_aligned(p.residual, 16) && detail::is_aligned(p.weight, 16) &&
                          detail::is_aligned(p.beta, 16) && detail::is_aligned(p.out, 16) &&
                          detail::is_aligned(p.residual_out, 16);
  const int64_t vecs = vectorised ? p.cols / kVec : p.cols;
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, detail::ceil_div(vecs, 32) * 32));
  const auto blocks = static_cast<unsigned>(p.rows);
  if (vectorised) {
    residual_norm_kernel<T, kVec, kRms><<<blocks, threads, 0, stream>>>(p);
  } else {
      residual_norm_kernel<T, 1, kRms><<<blocks, threads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  }

  }  // namespace

  template <typename T>
  cudaError_t bias_residual_layer_norm(const ResidualNormParams<T>& params, cudaStream_t stream) {
    return launch<T, false>(params, stream);
  }

  template <typename T>
  cudaError_t bias_residual_rms_norm(const ResidualNormParams<T>& params, cudaStream_t stream) {
    if (params.weight == nullptr) return cudaErrorInvalidValue;
    return launch<T, true>(params, stream);
  }

  template cudaError_t bias_residual_layer_norm<float>(const ResidualNormParams<float>&, cudaStream_t);
  template cudaError_t bias_residual_layer_norm<__half>(const ResidualNormParams<__half>&, cudaStream_t);
  template cudaError_t bias_residual_layer_norm<__nv_bfloat16>(const ResidualNormParams<__nv_bfloat16>&, cudaStream_t);
  template cudaError_t bias_residual_rms_norm<float>(const ResidualNormParams<float>&, cudaStream_t);
  template cudaError_t bias_residual_rms_norm<__half>(const ResidualNormParams<__half>&, cudaStream_t);
  template cudaError_t bias_residual_rms_norm<__nv_bfloat16>(const ResidualNormParams<__nv_bfloat16>&, cudaStream_t);

  }  // namespace kernels
  }  // namespace dschat
