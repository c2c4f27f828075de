#include "dschat/nn/rms_norm.h"

#include "dschat/nn/linear.h"
#include "dschat/ops/rms_norm.h"

namespace dschat {
namespace nn {

RmsNormImpl::RmsNormImpl(const RmsNormOptions& options_) : options(options_) {
  weight = register_parameter("weight", torch::ones({options.hidden()}, parameter_options()));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) { return ops::rms_norm(x, weight, options.eps()); }

void RmsNormImpl::pretty_print(std::ostream& stream) const {
  stream << "dschat::nn::RmsNorm(" << options.hidden() << ", eps=" << options.eps() << ")";
}

}  // namespace nn
}  // namespace dschat
