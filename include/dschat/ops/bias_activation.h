#pragma once
// Elementwise activations fused with the bias of the GEMM before them, and LLaMA's SiLU gate:
//   bias_activation(x, bias, act) = act(x + bias)     ReLU, GELU (erf), GELU (tanh), SiLU
//   silu_and_mul(gate, up)        = silu(gate) * up
// CUDA tensors (float32, float16, bfloat16) run one kernel (kernels/bias_activation.cu) unless
// autograd records the call; everything else runs the *_reference composition (the ATen ops of
// nn::apply_activation), which is also the test oracle. docs/ops.md has the tolerances.

#include <torch/torch.h>

namespace dschat {
namespace ops {

/// The activations of nn::Activation: relu, gelu (erf), gelu_new / gelu_pytorch_tanh, silu.
enum class Activation { Relu, Gelu, GeluTanh, Silu };

/// x: [..., F]; bias: [F] or undefined (one dtype and device with x) -> act(x + bias): [..., F].
torch::Tensor bias_activation(const torch::Tensor& x, const torch::Tensor& bias, Activation activation);

/// torch::relu / gelu / gelu(tanh) / silu of (x + bias).
torch::Tensor bias_activation_reference(const torch::Tensor& x, const torch::Tensor& bias, Activation activation);

/// gate, up: [..., F] (same shape, dtype, device) -> silu(gate) * up: [..., F].
torch::Tensor silu_and_mul(const torch::Tensor& gate, const torch::Tensor& up);

/// gate_up: [..., 2F] holding [gate | up] (gate_proj's outputs first) -> silu(gate) * up: [..., F].
torch::Tensor silu_and_mul(const torch::Tensor& gate_up);

/// torch::silu(gate) * up.
torch::Tensor silu_and_mul_reference(const torch::Tensor& gate, const torch::Tensor& up);

}  // namespace ops
}  // namespace dschat
