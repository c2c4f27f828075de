#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common.cuh"
#include "kernels/rotary.cuh"

namespace dschat {
namespace kernels {
namespace {

constexpr int kThreads = 128;

// One block per (b, t): its threads walk the (head, i) pairs of q's heads, then k's, so
// consecutive threads touch consecutive i (coalesced) and cos/sin rows are read from cache.
template <typename T>
__global__ void __launch_bounds__(kThreads) rotary_kernel(const RotaryParams<T> p) {
  using detail::round_to;
  using detail::to_float;
  const int64_t b = blockIdx.x / p.tokens, t = blockIdx.x % p.tokens;
  const int64_t half = p.head_dim / 2;
  const T* cos = p.cos + (b * p.tokens + t) * p.head_dim;  // [D]
  const T* sin = p.sin + (b * p.tokens + t) * p.head_dim;  // [D]
  const int64_t pairs = (p.q_heads + p.k_heads) * half;
  for (int64_t idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
    const int64_t head = idx / half, i = idx % half;
    const T* x;
    T* y;
    if (head < p.q_heads) {
      x = p.q + b * p.q_stride_b + head * p.q_stride_h + t * p.q_stride_t;
      y = p.q_out + ((b * p.q_heads + head) * p.tokens + t) * p.head_dim;
    } else {
      const int64_t kh = head - p.q_heads;
      x = p.k + b * p.k_stride_b + kh * p.k_stride_h + t * p.k_stride_t;
      y = p.k_out + ((b * p.k_heads + kh) * p.tokens + t) * p.head_dim;
    }
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    const float first = round_to<T>(x1 * to_float(cos[i])) + round_to<T>(-x2 * to_float(sin[i]));
    const float second = round_to<T>(x2 * to_float(cos[i + half])) + round_to<T>(x1 * to_float(sin[i + half]));
    y[i] = detail::from_float<T>(first);
    y[i + half] = detail::from_float<T>(second);
  }
}

}  // namespace

template <typename T>
cudaError_t rotary_embedding(const RotaryParams<T>& p, cudaStream_t stream) {
  if (p.head_dim % 2 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = p.batch * p.tokens;
  if (blocks == 0 || p.head_dim == 0 || p.q_heads + p.k_heads == 0) return cudaSuccess;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  rotary_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template cudaError_t rotary_embedding<float>(const RotaryParams<float>&, cudaStream_t);
template cudaError_t rotary_embedding<__half>(const RotaryParams<__half>&, cudaStream_t);
template cudaError_t rotary_embedding<__nv_bfloat16>(const RotaryParams<__nv_bfloat16>&, cudaStream_t);

}  // namespace kernels
}  // namespace dschat
