#pragma once
// TrainingEngine: a module, its AdamW and LR schedule, configured by a DeepSpeed-style config,
// driven like DeepSpeed's engine:
//
//   for each micro-batch:  loss = model(batch);  engine.backward(loss);  engine.step();
//
// backward() divides the loss by gradient_accumulation_steps (and multiplies it by the fp16 loss
// scale) and accumulates gradients; step() acts only at accumulation boundaries: overflow /
// non-finite check, unscale + clip by the global norm in one multiply, the optimizer step on fp32
// master weights, the copy back into bf16/fp16 model weights, then the LR schedule. As in
// DeepSpeed, a skipped step does not step the LR schedule but still counts in global_steps.
//
// Precision: fp32 models train in place. bf16/fp16 models get fp32 master copies of their
// trainable parameters and fp32 gradient accumulators (DeepSpeed's BF16_Optimizer / fp16 path).
// This process is the whole data-parallel world for now: ZeRO stages > 0 and world sizes > 1 are
// refused with core::Unsupported until the c10d engine lands.

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dschat/engine/adamw.h"
#include "dschat/engine/ds_config.h"
#include "dschat/engine/loss_scaler.h"
#include "dschat/engine/lr_schedule.h"

namespace dschat {
namespace engine {

struct TrainingEngineOptions {
  DeepSpeedConfig config;
  /// Used when the config has no "optimizer" block (DeepSpeed-Chat builds its own optimizer:
  /// betas (0.9, 0.95), its lr and weight decay).
  OptimizerConfig optimizer;
  /// HF-style schedule (DeepSpeed-Chat's --lr_scheduler_type); nullopt keeps the lr constant.
  std::optional<LrScheduleOptions> lr_schedule;
  double lora_learning_rate = 5e-4;
};

class TrainingEngine {
 public:
  /// Throws core::ConfigError / core::Unsupported for settings it cannot honour, and
  /// core::InvalidArgument when the module has no trainable parameters.
  TrainingEngine(std::shared_ptr<torch::nn::Module> module, TrainingEngineOptions options);

  torch::nn::Module& module() { return *module_; }
  const DeepSpeedConfig& config() const { return options_.config; }

  /// Backpropagates loss / gradient_accumulation_steps (times the loss scale) and accumulates.
  void backward(const torch::Tensor& loss);
  /// Ends a micro-step; at an accumulation boundary runs the optimizer. Returns true when the
  /// weights changed (false: not a boundary, or the step was skipped for overflow / non-finite
  /// gradients).
  bool step();

  /// Whether the next step() call ends an accumulation window.
  bool is_gradient_accumulation_boundary() const;
  int64_t micro_steps() const { return micro_steps_; }
  int64_t global_steps() const { return global_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double loss_scale() const { return scaler_.scale(); }
  /// L2 norm of the unscaled gradients at the last boundary (-1 when they were not finite).
  double last_grad_norm() const { return last_grad_norm_; }
  std::vector<double> learning_rates() const { return optimizer_->group_lrs(); }
  /// Bytes this rank holds for optimizer state (Adam moments) and fp32 master copies.
  int64_t optimizer_state_bytes() const;

  /// Saves the full training state under <dir>/<tag>/ (weights, fp32 masters, optimizer moments
  /// and step counts, LR schedule, loss scaler, RNG state, step counters, `client_state` such as
  /// the data-loader position) with a manifest of SHA-256 checksums. The files are written into
  /// a temporary directory that is renamed into place, then <dir>/latest is replaced atomically:
  /// a crash at any point leaves the previous checkpoint loadable. Only at an accumulation
  /// boundary (core::InvalidArgument otherwise). An empty tag means "global_step<N>".
  void save_checkpoint(const std::filesystem::path& dir, std::string tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object());
  /// Restores a checkpoint of this same model and configuration (tag empty: <dir>/latest) and
  /// returns its client_state. Throws core::NotFound, core::FormatError (checksum mismatch,
  /// missing or mis-shaped tensor, naming the file and tensor) before anything is modified.
  nlohmann::json load_checkpoint(const std::filesystem::path& dir, const std::string& tag = "");

 private:
  struct Trainable {
    std::string name;
    torch::Tensor param;   // the module's parameter (any dtype)
    torch::Tensor master;  // fp32 copy when param is bf16/fp16, else the same tensor as param
    bool has_master() const { return !param.is_same(master); }
  };

  void move_grads_to_masters();
  std::vector<torch::Tensor> master_grads() const;
  void zero_grads();
  void apply_schedule();

  std::shared_ptr<torch::nn::Module> module_;
  TrainingEngineOptions options_;
  std::vector<Trainable> trainables_;
  std::unique_ptr<AdamW> optimizer_;
  std::optional<LrScheduler> scheduler_;
  LossScaler scaler_;
  int64_t micro_steps_ = 0;
  int64_t global_steps_ = 0;
  int64_t skipped_steps_ = 0;
  double last_grad_norm_ = 0.0;
};

}  // namespace engine
}  // namespace dschat
