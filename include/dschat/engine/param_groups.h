#pragma once
// DeepSpeed-Chat's optimizer parameter groups (dschat/utils/utils.py,
// get_optimizer_grouped_parameters): which trainable parameters get weight decay and which LoRA
// adapters train at their own learning rate. Names are matched lower-cased by substring, so
// "LayerNorm.weight", "layer_norm.weight" and "norm.weight" (RMSNorm) all count as norms:
//   auto groups = engine::optimizer_grouped_parameters(named, /*lr=*/9.65e-6, /*wd=*/0.0, /*lora_lr=*/5e-4);
//   engine::AdamW optimizer(groups, options);

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace engine {

/// One optimizer group: parameters that share a learning rate and a weight decay. `names[i]`
/// names `params[i]` (used in checkpoints and messages; may be empty for unnamed groups).
struct ParamGroup {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  double lr = 0.0;
  double weight_decay = 0.0;
};

/// Substrings that exempt a parameter from weight decay (DeepSpeed-Chat's no_decay_name_list).
const std::vector<std::string>& no_decay_name_list();
/// Substrings that mark a LoRA adapter (DeepSpeed-Chat's lora_name_list).
const std::vector<std::string>& lora_name_list();

/// DeepSpeed-Chat's groups, in its order, over the parameters with requires_grad:
///   0. neither no-decay nor LoRA          -> weight_decay, lr
///   1. LoRA and not no-decay              -> weight_decay, lora_lr
///   2. no-decay (LoRA or not)             -> 0, lr
/// Empty groups are dropped, so the result has 1 to 3 groups (0 when nothing is trainable).
/// With `model_names` (the trainable parameters of the whole model, when `named_params` are the
/// pieces one ZeRO rank owns), the groups are those the names fill, kept even when this rank's
/// share of one is empty: every rank then has the same groups, as the LR schedule and a
/// checkpoint's group hyper-parameters (saved by rank 0 for all) require.
/// Throws core::InvalidArgument for a negative lr, lora_lr or weight_decay.
std::vector<ParamGroup> optimizer_grouped_parameters(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params, double lr, double weight_decay,
    double lora_lr = 5e-4, const std::vector<std::string>* model_names = nullptr);

/// The group above a parameter of this name goes to: 0 decay, 1 LoRA, 2 no-decay.
int optimizer_group_index(const std::string& name);

/// The same over a module's named_parameters() (registration order, as Python's named_parameters).
std::vector<ParamGroup> optimizer_grouped_parameters(const torch::nn::Module& module, double lr, double weight_decay,
                                                     double lora_lr = 5e-4);

}  // namespace engine
}  // namespace dschat
