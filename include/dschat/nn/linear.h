#pragma once
// Linear layer with the parameter names of torch.nn.Linear ("weight" [out, in], "bias" [out]).
// It is the one place where LoRA adapters attach (the training-engine issue adds them); models
// use it for every projection so that adapters can be added by module name later.
//   Linear proj(LinearOptions(512, 2048).bias(false));

#include <torch/torch.h>

namespace dschat {
namespace nn {

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
};

class LinearImpl : public torch::nn::Module {
 public:
  explicit LinearImpl(const LinearOptions& options);
  void reset_parameters();
  /// x: [..., in] -> [..., out]
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  LinearOptions options;
  torch::Tensor weight;  // [out, in]
  torch::Tensor bias;    // [out] or undefined
};
TORCH_MODULE(Linear);

}  // namespace nn
}  // namespace dschat
