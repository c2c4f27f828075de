#include "dschat/nn/activation.h"

#include "dschat/core/error.h"

namespace dschat {
namespace nn {

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::Relu;
  if (name == "gelu") return Activation::Gelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") return Activation::GeluTanh;
  if (name == "silu" || name == "swish") return Activation::Silu;
  DSCHAT_THROW(Unsupported, "activation '", name, "' is not supported (supported: relu, gelu, gelu_new, silu)");
}

torch::Tensor apply_activation(Activation activation, const torch::Tensor& x) {
  switch (activation) {
    case Activation::Relu: return torch::relu(x);
    case Activation::Gelu: return torch::gelu(x);
    case Activation::GeluTanh: return torch::gelu(x, "tanh");
    case Activation::Silu: return torch::silu(x);
  }
  DSCHAT_INTERNAL_ASSERT(false, "unhandled activation");
}

ops::Activation fused_activation(Activation activation) {
  switch (activation) {
    case Activation::Relu: return ops::Activation::Relu;
    case Activation::Gelu: return ops::Activation::Gelu;
    case Activation::GeluTanh: return ops::Activation::GeluTanh;
    case Activation::Silu: return ops::Activation::Silu;
  }
  DSCHAT_INTERNAL_ASSERT(false, "unhandled activation");
  return ops::Activation::Relu;
}

}  // namespace nn
}  // namespace dschat
