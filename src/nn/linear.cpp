#include "dschat/nn/linear.h"

#include <cmath>

namespace dschat {
namespace nn {

LinearImpl::LinearImpl(const LinearOptions& options_) : options(options_) {
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", torch::empty({options.out_features()}));
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  // Same distribution as torch.nn.Linear: kaiming-uniform weights, uniform(+-1/sqrt(in)) bias.
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    double bound = options.in_features() > 0 ? 1.0 / std::sqrt(static_cast<double>(options.in_features())) : 0.0;
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight, bias); }

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "dschat::nn::Linear(in=" << options.in_features() << ", out=" << options.out_features()
         << ", bias=" << (options.bias() ? "true" : "false") << ")";
}

}  // namespace nn
}  // namespace dschat
