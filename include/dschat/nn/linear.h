#pragma once
// Linear layer with the parameter names of torch.nn.Linear ("weight" [out, in], "bias" [out]).
// It is the one place where LoRA adapters attach: models use it for every projection, and
// nn/lora.h converts layers by module name. With adapters it behaves like DeepSpeed-Chat's
// LinearLayer_LoRA (same parameter names, init, forward and fuse arithmetic):
//   Linear proj(LinearOptions(512, 2048).bias(false));
//   proj->enable_lora(LinearLoraOptions(128));   // weight frozen, adapters trainable
//   proj->fuse_lora(); ... proj->unfuse_lora();  // W restored bit for bit

#include <torch/torch.h>

#include <optional>

namespace dschat {
namespace nn {

/// Where dschat's own layers (Linear, RmsNorm) allocate their parameters while a scope is alive on
/// this thread. models::load_causal_lm builds a model inside one, so the weights a checkpoint then
/// overwrites are allocated (and initialised) straight on their device, in their dtype, with no
/// host copy of the model first (dschat's Embedding and LayerNorm do the same, nn/embedding.h).
///
/// `shapes_only` (with the meta device): the model is built only to be measured (dschat plan), so
/// LoRA adapters of meta weights stay on meta too instead of being made on the host for a
/// deferred ZeRO-3 model to move later (LinearImpl::enable_lora).
class ParameterPlacementScope {
 public:
  ParameterPlacementScope(const torch::Device& device, torch::ScalarType dtype, bool shapes_only = false);
  ~ParameterPlacementScope();
  ParameterPlacementScope(const ParameterPlacementScope&) = delete;
  ParameterPlacementScope& operator=(const ParameterPlacementScope&) = delete;

 private:
  std::optional<torch::TensorOptions> previous_;
  bool previous_shapes_only_;
};

/// The options of a new parameter of dschat's layers: the innermost scope's, else CPU float32.
torch::TensorOptions parameter_options();

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
};

/// The adapter of one layer; DeepSpeed-Chat's LinearLayer_LoRA(lora_dim, lora_scaling, lora_dropout).
struct LinearLoraOptions {
  explicit LinearLoraOptions(int64_t lora_dim) : lora_dim_(lora_dim) {}
  TORCH_ARG(int64_t, lora_dim);           // r >= 1
  TORCH_ARG(double, lora_scaling) = 1.0;  // the delta is multiplied by lora_scaling / r
  TORCH_ARG(double, lora_dropout) = 0.0;  // on the adapter's input only; 0 = identity
};

class LinearImpl : public torch::nn::Module {
 public:
  explicit LinearImpl(const LinearOptions& options);
  /// Re-draws weight and bias (torch.nn.Linear's distribution); adapters are left alone.
  void reset_parameters();
  /// x: [..., in] -> [..., out]. With unfused adapters: x W^T + b + (dropout(x) right left) * scaling.
  torch::Tensor forward(const torch::Tensor& x);
  void pretty_print(std::ostream& stream) const override;

  /// Adds adapters "lora_right_weight" [in, r] and "lora_left_weight" [r, out] (on the weight's
  /// device and dtype) and freezes `weight` (requires_grad = false; the bias stays trainable),
  /// as DeepSpeed-Chat does. Throws core::InvalidArgument for r < 1, a dropout outside [0, 1),
  /// or a layer that already has adapters.
  void enable_lora(const LinearLoraOptions& lora_options);
  /// Re-draws the adapters: right ~ kaiming_uniform(a = sqrt(5)) with torch's fan_in = r, i.e.
  /// U(-1/sqrt(r), 1/sqrt(r)); left = 0, so a fresh adapter changes nothing.
  void reset_lora_parameters();
  bool has_lora() const { return lora_right_weight.defined(); }
  /// lora_scaling / r (0 without adapters).
  double lora_scale() const { return lora_scale_; }
  const LinearLoraOptions& lora_options() const;

  /// W += scale * (right left)^T, after which forward is a plain linear. The exact pre-fuse W is
  /// copied to `backup_device` first, so unfuse_lora() restores it bit for bit (W + D - D is not
  /// exact in floating point). That copy costs one weight's bytes per fused layer — for a whole
  /// model, the bytes of every adapted weight — in host memory by default, to spare the GPU; pass
  /// the weight's device instead to trade GPU memory for skipping the device-host copies.
  /// Throws core::InvalidArgument without adapters or when already fused.
  void fuse_lora(const torch::Device& backup_device = torch::kCPU);
  /// Restores the pre-fuse W (discarding any change made to W while fused) and frees the copy.
  /// Throws core::InvalidArgument when not fused.
  void unfuse_lora();
  bool lora_fused() const { return weight_before_fuse_.defined(); }

  LinearOptions options;
  torch::Tensor weight;             // [out, in]
  torch::Tensor bias;               // [out] or undefined
  torch::Tensor lora_right_weight;  // [in, r] or undefined (no adapters)
  torch::Tensor lora_left_weight;   // [r, out] or undefined

 private:
  std::optional<LinearLoraOptions> lora_options_;
  double lora_scale_ = 0.0;
  torch::Tensor weight_before_fuse_;  // [out, in] on the backup device while fused, else undefined
};
TORCH_MODULE(Linear);

}  // namespace nn
}  // namespace dschat
