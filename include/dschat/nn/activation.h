#pragma once
// Activation functions by their Hugging Face names (config "activation_function"/"hidden_act").

#include <torch/torch.h>

#include <string>

#include "dschat/ops/bias_activation.h"

namespace dschat {
namespace nn {

enum class Activation { Relu, Gelu, GeluTanh, Silu };

/// "relu", "gelu", "gelu_new" / "gelu_pytorch_tanh", "silu" / "swish"; throws core::Unsupported
/// naming the activation and the supported ones.
Activation parse_activation(const std::string& name);

torch::Tensor apply_activation(Activation activation, const torch::Tensor& x);

/// The same activation as the fused inference ops name it (ops::bias_activation's epilogue).
ops::Activation fused_activation(Activation activation);

}  // namespace nn
}  // namespace dschat
