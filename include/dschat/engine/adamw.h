#pragma once
// The training engine's Adam/AdamW: DeepSpeed's DeepSpeedCPUAdam / FusedAdam math
// (deepspeed-runtime.md §4) with a per-parameter step count t:
//   Adam (L2) mode only:  g <- g + wd * p
//   m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
//   AdamW mode only:      p <- p - lr wd p                  (decoupled decay)
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)    (bias_correction = false: no 1 - b^t)
// CPU parameters: fp32 moments, a vectorised multi-threaded loop (the ZeRO-Offload step; bf16/fp16
// parameters are updated in fp32 and written back rounded). CUDA parameters: ATen's multi-tensor
// fused kernel at::_fused_adamw_ / _fused_adam_, moments in the parameter dtype (as FusedAdam).
//   engine::AdamWOptions options;
//   options.betas = {0.9, 0.95};
//   engine::AdamW optimizer(engine::optimizer_grouped_parameters(named, 1e-5, 0.1), options);
//   loss.backward(); optimizer.step(); optimizer.zero_grad();

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dschat/engine/param_groups.h"

namespace dschat {
namespace engine {

/// DeepSpeed's defaults (DeepSpeed-Chat passes betas (0.9, 0.95)).
struct AdamWOptions {
  double lr = 1e-3;  // used by the constructor over a plain parameter list only
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;  // used by the constructor over a plain parameter list only
  bool bias_correction = true;
  bool adam_w_mode = true;  // false: Adam with L2 (g += wd p) instead of decoupled decay
};

/// Everything a checkpoint needs to resume the optimizer exactly.
struct AdamWStateDict {
  AdamWOptions options;
  std::vector<double> group_lrs;
  std::vector<double> group_weight_decays;
  std::vector<std::vector<std::string>> group_names;  // parameter names per group (may be empty strings)
  /// "state.<k>.step" (int64 scalar), "state.<k>.exp_avg", "state.<k>.exp_avg_sq" (parameter
  /// shape), k = the parameter's position counted across all groups in order (torch's numbering).
  /// Parameters that never had a gradient have no entries. Tensors are on the parameters' device.
  std::map<std::string, torch::Tensor> tensors;
};

class AdamW {
 public:
  /// Groups keep their own lr and weight_decay; options supply betas, eps and the modes.
  /// Throws core::InvalidArgument for an undefined or non-floating parameter, one listed twice,
  /// mismatched names/params sizes, or hyperparameters outside their ranges (betas in [0, 1),
  /// lr, eps, weight_decay >= 0).
  explicit AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});
  /// One unnamed group with options.lr and options.weight_decay.
  explicit AdamW(std::vector<torch::Tensor> params, const AdamWOptions& options = {});

  /// Updates every parameter that has a .grad() (others keep their state and step count). Throws
  /// core::Unsupported for a CPU parameter that is not fp32/bf16/fp16, or a CUDA step without
  /// bias_correction; core::InvalidArgument for a grad whose shape or device differs from its
  /// parameter, or a non-contiguous CPU parameter.
  void step();
  /// Drops every gradient (set to undefined, as DeepSpeed's set_grad_none).
  void zero_grad();

  size_t num_groups() const { return groups_.size(); }
  const ParamGroup& group(size_t index) const;
  /// The learning-rate scheduler drives these.
  void set_group_lr(size_t index, double lr);
  std::vector<double> group_lrs() const;
  const AdamWOptions& options() const { return options_; }

  /// Steps taken by one parameter (0 before its first gradient).
  int64_t param_step(size_t group_index, size_t param_index) const;

  /// Copies of the state (tensors are cloned, so later steps do not change them).
  AdamWStateDict state_dict() const;
  /// Restores a state_dict() taken from an optimizer over the same groups (same counts, shapes
  /// and, where both are non-empty, names). Replaces options, group lrs and weight decays.
  /// Throws core::InvalidArgument naming the first mismatch; nothing changes on failure.
  void load_state_dict(const AdamWStateDict& state);

  /// Bytes held by the moment tensors (exp_avg + exp_avg_sq), for the ZeRO memory reports.
  /// Moments are created at a parameter's first step, so this is 0 before the first step().
  int64_t state_bytes() const;

 private:
  struct ParamState {
    int64_t step = 0;
    torch::Tensor exp_avg;      // parameter shape; fp32 on CPU, parameter dtype on CUDA
    torch::Tensor exp_avg_sq;   // same
    torch::Tensor device_step;  // float32 scalar on the parameter's device, for the fused kernel
  };

  void step_group(size_t group_index);
  void init_state(const torch::Tensor& param, ParamState& state) const;

  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> states_;  // parallel to groups_[g].params
  AdamWOptions options_;
};

}  // namespace engine
}  // namespace dschat
