#pragma once
// Elementwise activations with their bias, and the SiLU gate of LLaMA's MLP:
//   bias_activation: out[r, c] = act(x[r, c] + bias[c])     the sum rounded to T first, as ATen
//   silu_and_mul:    out[r, c] = silu(gate[r, c]) * up[r, c] silu rounded to T first, as ATen
// Activations are computed in fp32 with ATen's formulas: ReLU, GELU (erf), GELU (tanh), SiLU.
// Raw pointers, sizes and a stream; no allocation, no synchronisation.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dschat {
namespace kernels {

enum class Activation { Relu, Gelu, GeluTanh, Silu };

/// x, out: [rows, cols] contiguous (out may alias x); bias: [cols] or null.
/// T = float, __half, __nv_bfloat16. Returns the launch status.
template <typename T>
cudaError_t bias_activation(const T* x, const T* bias, T* out, int64_t rows, int64_t cols, Activation activation,
                            cudaStream_t stream);

/// gate, up: [rows, cols] with row strides gate_stride, up_stride (elements; the halves of one
/// [rows, 2 * cols] tensor have stride 2 * cols); out: [rows, cols] contiguous.
template <typename T>
cudaError_t silu_and_mul(const T* gate, const T* up, T* out, int64_t rows, int64_t cols, int64_t gate_stride,
                         int64_t up_stride, cudaStream_t stream);

}  // namespace kernels
}  // namespace dschat
