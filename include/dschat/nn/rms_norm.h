#pragma once
// RMSNorm module (LLaMA): parameter "weight" [hidden]; forward through ops::rms_norm (fused
// kernel on CUDA, ATen reference elsewhere).
//   RmsNorm norm(RmsNormOptions(4096).eps(1e-5));

#include <torch/torch.h>

namespace dschat {
namespace nn {

struct RmsNormOptions {
  explicit RmsNormOptions(int64_t hidden) : hidden_(hidden) {}
  TORCH_ARG(int64_t, hidden);
  TORCH_ARG(double, eps) = 1e-6;
};

class RmsNormImpl : public torch::nn::Module {
 public:
  explicit RmsNormImpl(const RmsNormOptions& options);
  /// x: [..., hidden] -> [..., hidden]
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  RmsNormOptions options;
  torch::Tensor weight;  // [hidden]
};
TORCH_MODULE(RmsNorm);

}  // namespace nn
}  // namespace dschat
