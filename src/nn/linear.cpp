#include "dschat/nn/linear.h"

#include <cmath>

#include "dschat/core/error.h"
#include "dschat/ops/skinny_linear.h"

namespace dschat {
namespace nn {

namespace {

thread_local std::optional<torch::TensorOptions> current_parameter_options;
thread_local bool current_shapes_only = false;

}  // namespace

ParameterPlacementScope::ParameterPlacementScope(const torch::Device& device, torch::ScalarType dtype,
                                                 bool shapes_only)
    : previous_(current_parameter_options), previous_shapes_only_(current_shapes_only) {
  current_parameter_options = torch::TensorOptions().device(device).dtype(dtype);
  current_shapes_only = shapes_only;
}

ParameterPlacementScope::~ParameterPlacementScope() {
  current_parameter_options = previous_;
  current_shapes_only = previous_shapes_only_;
}

torch::TensorOptions parameter_options() { return current_parameter_options.value_or(torch::TensorOptions()); }

LinearImpl::LinearImpl(const LinearOptions& options_) : options(options_) {
  const torch::TensorOptions where = parameter_options();
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}, where));
  if (options.bias()) bias = register_parameter("bias", torch::empty({options.out_features()}, where));
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

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  // ATen's linear (what torch.nn.functional.linear calls): a contiguous [B, T, in] input takes
  // one addmm with the bias fused; LibTorch's functional::linear runs matmul, then adds the bias
  // in a second pass over the output. A decode step's few rows on the CPU take the skinny kernel
  // (ops/skinny_linear.h), which reads the weight at the memory-bandwidth limit.
  torch::Tensor y = ops::linear(x, weight, bias);  // [..., out]
  if (!has_lora() || lora_fused()) return y;
  // Same operation order as LinearLayer_LoRA.forward, so results match it to rounding.
  const double p = lora_options_->lora_dropout();
  torch::Tensor adapter_input = p > 0.0 ? torch::dropout(x, p, is_training()) : x;  // [..., in]
  return y + torch::matmul(torch::matmul(adapter_input, lora_right_weight), lora_left_weight) * lora_scale_;
}

void LinearImpl::enable_lora(const LinearLoraOptions& lora_options) {
  DSCHAT_CHECK(!has_lora(), InvalidArgument, "Linear(in=", options.in_features(), ", out=", options.out_features(),
               "): LoRA adapters are already attached");
  DSCHAT_CHECK(lora_options.lora_dim() >= 1, InvalidArgument, "lora_dim must be >= 1, got ", lora_options.lora_dim());
  DSCHAT_CHECK(lora_options.lora_dropout() >= 0.0 && lora_options.lora_dropout() < 1.0, InvalidArgument,
               "lora_dropout must be in [0, 1), got ", lora_options.lora_dropout());
  // A deferred (meta) weight gets host adapters: they are small, and the engine that partitions
  // the deferred model moves them to its device with everything else it keeps. A model built
  // only to be measured keeps them on meta (ParameterPlacementScope's shapes_only).
  auto like_weight = weight.options().requires_grad(false);
  if (weight.is_meta() && !current_shapes_only) like_weight = like_weight.device(torch::kCPU);
  const int64_t r = lora_options.lora_dim();
  lora_right_weight = register_parameter("lora_right_weight", torch::empty({options.in_features(), r}, like_weight));
  lora_left_weight = register_parameter("lora_left_weight", torch::empty({r, options.out_features()}, like_weight));
  lora_options_ = lora_options;
  lora_scale_ = lora_options.lora_scaling() / static_cast<double>(r);
  // DeepSpeed-Chat trains only the adapter (and the bias) of a converted layer.
  weight.set_requires_grad(false);
  reset_lora_parameters();
}

void LinearImpl::reset_lora_parameters() {
  DSCHAT_CHECK(has_lora(), InvalidArgument, "reset_lora_parameters: this Linear has no LoRA adapters");
  torch::NoGradGuard no_grad;
  // torch's fan_in of a [in, r] tensor is its dim 1 = r, hence the bounds +-1/sqrt(r).
  torch::nn::init::kaiming_uniform_(lora_right_weight, std::sqrt(5.0));
  lora_left_weight.zero_();
}

const LinearLoraOptions& LinearImpl::lora_options() const {
  DSCHAT_CHECK(has_lora(), InvalidArgument, "lora_options: this Linear has no LoRA adapters");
  return *lora_options_;
}

void LinearImpl::fuse_lora(const torch::Device& backup_device) {
  DSCHAT_CHECK(has_lora(), InvalidArgument, "fuse_lora: this Linear has no LoRA adapters");
  DSCHAT_CHECK(!lora_fused(), InvalidArgument, "fuse_lora: LoRA is already fused into this Linear's weight");
  torch::NoGradGuard no_grad;
  // clone() when the backup stays on the weight's device: to() would return W itself.
  weight_before_fuse_ = backup_device == weight.device() ? weight.clone() : weight.to(backup_device);  // [out, in]
  // LinearLayer_LoRA.fuse_lora_weight: W += scaling * left^T right^T.
  torch::Tensor delta = torch::matmul(lora_left_weight.t(), lora_right_weight.t()) * lora_scale_;  // [out, in]
  weight.add_(delta);
}

void LinearImpl::unfuse_lora() {
  DSCHAT_CHECK(lora_fused(), InvalidArgument, "unfuse_lora: LoRA is not fused into this Linear's weight");
  torch::NoGradGuard no_grad;
  // copy_ keeps W's storage, so optimizers and views that hold W still see the restored values.
  weight.copy_(weight_before_fuse_);
  weight_before_fuse_ = torch::Tensor();
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "dschat::nn::Linear(in=" << options.in_features() << ", out=" << options.out_features()
         << ", bias=" << (options.bias() ? "true" : "false");
  if (has_lora()) {
    stream << ", lora_dim=" << lora_options_->lora_dim() << ", lora_scaling=" << lora_options_->lora_scaling()
           << ", lora_dropout=" << lora_options_->lora_dropout() << (lora_fused() ? ", fused" : "");
  }
  stream << ")";
}

}  // namespace nn
}  // namespace dschat
