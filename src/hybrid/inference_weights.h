#pragma once
// The weights a generation runs on, materialised from the actor's training state at eval() and
// undone at train() (internal to the hybrid engine). Two ways:
//
//   borrow  the inference model is the actor itself: same dtype and no tensor parallelism.
//           ZeRO-3 with pin_parameters gathers every layer once and detaches the backbone's
//           hooks; without it the hooks stay and gather each layer on every forward. LoRA is
//           fused in place (per layer while gathered, when the hooks gather).
//   fill    the parameters of a second model (`target`: a cast copy, or a tensor-parallel shard)
//           are filled from the actor: views where nothing has to change (a TP slice in the same
//           dtype of a resident parameter), copies otherwise. Under ZeRO-3 the layers are
//           gathered tp_gather_partition_size at a time (all at once with pin_parameters),
//           copied and released, so at most one group is ever resident in full.
// A fill copies from the fused weights: LoRA is fused before and unfused after (or at restore,
// when the target holds views of the fused weights).
#include <torch/torch.h>

#include <memory>

#include "dschat/models/causal_lm.h"
#include "dschat/nn/layer_hooks.h"
#include "hybrid/generation_model.h"

namespace dschat {
namespace hybrid {

struct InferenceWeightsOptions {
  bool pin_parameters = true;
  int64_t layers_per_gather = 8;  // tp_gather_partition_size
  LoraFuseBackup lora_fuse_backup = LoraFuseBackup::kAuto;  // HybridEngineOptions::lora_fuse_backup
};

/// Where fuse_lora keeps `actor`'s unfused weights under `choice`: the device when asked, or for
/// kAuto when the device's free memory is at least twice the backups' bytes (a CPU model: the CPU).
torch::Device lora_backup_device(models::CausalLM& actor, LoraFuseBackup choice);

class InferenceWeights {
 public:
  /// Borrow: generation runs on `actor`. `zero3_hooks`: the engine's stage-3 hooks or nullptr.
  InferenceWeights(models::CausalLM actor, nn::LayerParameterHooks* zero3_hooks,
                   const InferenceWeightsOptions& options);
  /// Fill `target` from `actor`. The target must outlive this object.
  InferenceWeights(models::CausalLM actor, nn::LayerParameterHooks* zero3_hooks, const InferenceWeightsOptions& options,
                   GenerationModel& target);
  /// Restores the training side (see restore()); errors are logged, not thrown.
  ~InferenceWeights();
  InferenceWeights(const InferenceWeights&) = delete;
  InferenceWeights& operator=(const InferenceWeights&) = delete;

  /// Undoes everything: unfuses LoRA, releases gathered layers, reattaches the hooks and empties
  /// the target's parameters. Collective under ZeRO-3. Idempotent.
  void restore();

  models::CausalLM model() const { return borrowed_ ? actor_ : target_->model(); }
  bool borrows() const { return borrowed_; }
  /// Bytes of the target's parameters that are copies (views of the actor count zero).
  int64_t copied_bytes() const { return borrowed_ || restored_ ? 0 : target_->copied_bytes(); }
  double gather_seconds() const { return gather_seconds_; }

 private:
  void borrow();
  void fill();

  models::CausalLM actor_;
  GenerationModel* target_ = nullptr;  // not owned
  nn::LayerParameterHooks* hooks_;
  InferenceWeightsOptions options_;
  std::unique_ptr<nn::LayerParameterHooks> lora_hooks_;  // borrow + ZeRO-3 unpinned + LoRA
  bool borrowed_ = true;
  bool hooks_detached_ = false;
  bool layers_gathered_ = false;
  bool actor_fused_ = false;
  bool restored_ = false;
  double gather_seconds_ = 0.0;
};

}  // namespace hybrid
}  // namespace dschat
