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
//
// Data parallelism and ZeRO (docs/engine.md): with a dist::Communicator of N ranks, each rank
// feeds its own micro-batches and the gradients are averaged over ranks. The trainable parameters
// are flattened into contiguous buffers (the module's tensors become views of them) and:
//   stage 0  gradients all-reduced at the accumulation boundary; every rank steps everything
//   stage 1  gradients reduce-scattered at the boundary; each rank steps its 1/N of the fp32
//            state, then the parameters are all-gathered
//   stage 2  as 1, but gradients are reduce-scattered after every backward, so a rank keeps only
//            its 1/N of them between micro-steps
//   stage 3  as 2, and each decoder layer's parameters are partitioned too: gathered just before
//            the layer runs (forward, and its recompute in backward) and released after; the
//            parameters outside the layers (embeddings, final norm, heads) are gathered at the
//            first forward after a step and released at the step. Needs a model with a
//            models::Backbone (CausalLM, ValueHeadModel).
// Collectives are bucketed by reduce_bucket_size / allgather_bucket_size; with overlap_comm,
// stages 0-2 reduce each gradient bucket during backward as soon as it is complete (stage 0-1:
// in the accumulation boundary's backward). offload_optimizer
// keeps the fp32 partition, its gradients and the moments on the CPU (pinned with pin_memory when
// the model is on CUDA) and steps them with the CPU AdamW; offload_param keeps stage 3's parameter
// partitions there. For a CUDA model the reduced gradients go to the host on a side stream during
// backward and the new values come back without blocking, group by group as the CPU steps them.
//
// Host reads: one per optimizer step, of the squared gradient norm (summed over ranks on the
// gradients' device), which decides the skip and gives last_grad_norm(); the unscale-and-clip
// multiplier is computed and applied on the device before that read completes.

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dschat/dist/process_group.h"
#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/engine/ds_config.h"
#include "dschat/engine/loss_scaler.h"
#include "dschat/engine/lr_schedule.h"
#include "dschat/engine/zero_partition.h"
#include "dschat/models/load_save.h"
#include "dschat/nn/layer_hooks.h"

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
  /// The data-parallel ranks; null is a world of one. The config's batch sizes must have been
  /// parsed for its world size.
  std::shared_ptr<dist::Communicator> communicator;
  /// ZeRO-3 partitioned loading (DeepSpeed's zero.Init): the values of a module loaded with
  /// models::LoadOptions::deferred, whose parameters are on the meta device. The engine puts the
  /// module on deferred->device and, at stage 3, copies there only this rank's partitions (and
  /// the small persistent parameters), so a model larger than one device loads; at stages 0-2
  /// every parameter is materialised whole. Released once the engine is built.
  std::shared_ptr<const models::DeferredParameters> deferred;
};

class ZeroOptimizer;

class TrainingEngine {
 public:
  /// Throws core::ConfigError / core::Unsupported for settings it cannot honour, and
  /// core::InvalidArgument when the module has no trainable parameters.
  /// Collective when the communicator has several ranks: every rank constructs its engine over
  /// the same model architecture; rank 0's parameter values are broadcast to the others.
  TrainingEngine(std::shared_ptr<torch::nn::Module> module, TrainingEngineOptions options);
  ~TrainingEngine();

  torch::nn::Module& module() { return *module_; }
  const DeepSpeedConfig& config() const { return options_.config; }

  /// Backpropagates loss / gradient_accumulation_steps (times the loss scale) and accumulates.
  void backward(const torch::Tensor& loss);
  /// Ends a micro-step; at an accumulation boundary runs the optimizer. Returns true when the
  /// weights changed (false: not a boundary, or the step was skipped for overflow / non-finite
  /// gradients).
  bool step();
  /// DeepSpeed-Chat's align_overflow, first half. At an accumulation boundary (after the last
  /// backward of the window, before step()): reduces the gradients (step() then does not reduce
  /// again) and returns whether they are non-finite, i.e. whether step() will skip. Collective
  /// like step(). Between boundaries it returns false and does nothing.
  bool check_overflow();
  /// align_overflow, second half: the next boundary step() is skipped as an overflow would be (no
  /// optimizer or LR step, gradients dropped, counted in skipped_steps()) but the loss scale is
  /// left alone, since this engine's own gradients were finite.
  void skip_next_step() { skip_next_step_ = true; }

  /// Whether the next step() call ends an accumulation window.
  bool is_gradient_accumulation_boundary() const;
  int64_t micro_steps() const { return micro_steps_; }
  int64_t global_steps() const { return global_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double loss_scale() const { return scaler_.scale(); }
  /// fp16 with dynamic loss scaling: non-finite gradients are routine overflows, skipped and
  /// answered by a lower scale, not faults.
  bool uses_loss_scaling() const { return scaler_.checks_overflow(); }
  /// L2 norm of the unscaled gradients at the last boundary (-1 when they were not finite). A
  /// host value: the step reads the squared norm to the host once anyway, to decide on the skip.
  double last_grad_norm() const { return last_grad_norm_; }
  /// NaN/Inf values among the fp32 master weights this rank's optimizer updates (its ZeRO
  /// partition; all of them at stage 0), as a [] int64 tensor on the masters' device: not read,
  /// so the caller picks when to wait for it. A diverged update shows here before any loss does.
  torch::Tensor non_finite_weight_count() const;
  std::vector<double> learning_rates() const;
  /// Multiplies every group's learning rate by `factor` from now on (the schedule's base rates,
  /// so warmup and decay keep their shape; saved in checkpoints). The guardian's rollback.
  void scale_learning_rates(double factor);
  /// Bytes this rank holds for optimizer state (Adam moments) and fp32 master copies.
  int64_t optimizer_state_bytes() const { return memory_footprint().optimizer_bytes; }
  /// What this rank holds now for the trainable and frozen parameters of the module (model
  /// dtype, resident or gathered), their gradients (accumulators and partitions) and the
  /// optimizer (moments, fp32 masters).
  MemoryFootprint memory_footprint() const;
  int64_t rank() const;
  int64_t world_size() const;
  /// The data-parallel ranks (null: a world of one).
  const std::shared_ptr<dist::Communicator>& communicator() const { return options_.communicator; }
  /// ZeRO-3: the hooks that own the decoder layers' parameters (the backbone calls them around
  /// every layer; the hybrid engine calls them to gather layers for generation). nullptr at
  /// stages 0-2, where every parameter is resident.
  nn::LayerParameterHooks* layer_parameter_hooks();

  /// Collective: the full parameters by module name, in the model dtype, on every rank (ZeRO-3
  /// partitions are gathered). For saving a Hugging Face checkpoint during training.
  std::map<std::string, torch::Tensor> consolidated_parameters();
  /// ZeRO-3: frees the parameters gathered since the last step (those outside the decoder
  /// layers). A no-op at other stages. Call after an evaluation loop to return to the step's
  /// memory level.
  void release_gathered_parameters();

  /// Collective. Saves the full training state under <dir>/<tag>/ (fp32 parameters, optimizer
  /// moments and step counts, frozen parameters, LR schedule, loss scaler, RNG states, step
  /// counters, `client_state` such as the data-loader position): each rank writes the pieces
  /// of the parameters it owns (rank<r>.safetensors + rank<r>.json), rank 0 the engine state
  /// and a manifest of SHA-256 checksums of every file. The files are written into a temporary
  /// directory that rank 0 renames into place, then <dir>/latest is replaced atomically: a crash
  /// at any point leaves the previous checkpoint loadable. `dir` must be shared by the ranks.
  /// Only at an accumulation boundary (core::InvalidArgument otherwise). An empty tag means
  /// "global_step<N>". Before anything is written, the ranks' bytes are compared with the free
  /// space (core::IoError naming both).
  ///
  /// With `background`, the save is asynchronous: the state is copied to the host (pinned
  /// buffers filled from the device, or clones on the CPU) and the call returns; the writer's
  /// thread writes and commits it while training goes on. The caller must call
  /// wait_for_checkpoint_writes(*background, communicator()) on every rank before the next save to
  /// the same directory and before relying on the checkpoint. Without, the call returns once the
  /// checkpoint is committed, on every rank (the same write, on a thread it waits for).
  void save_checkpoint(const std::filesystem::path& dir, std::string tag = "",
                       const nlohmann::json& client_state = nlohmann::json::object(),
                       AsyncCheckpointWriter* background = nullptr);
  /// Collective. Restores a checkpoint of the same model (tag empty: <dir>/latest) and returns its
  /// client_state. It may have been saved by any number of ranks at any ZeRO stage: each rank
  /// reads the pieces that overlap what it owns now. Throws core::NotFound, core::FormatError
  /// (checksum mismatch, missing or mis-shaped tensor, naming the file and tensor) before anything
  /// is modified.
  nlohmann::json load_checkpoint(const std::filesystem::path& dir, const std::string& tag = "");

 private:
  friend class PartitionedEma;  // reads the flat groups' owned ranges
  // The accumulation window's reduced gradients' squared norm, on their device and (read once)
  // on the host; defined in training_engine.cpp.
  struct WindowNorm;
  void apply_schedule();
  // Reduces the window's gradients across ranks once (check_overflow() or step(), whichever comes
  // first), computes their squared norm and starts its copy to the host; kept until step() ends
  // the window.
  WindowNorm& reduced_window_norm();
  void log_step(double grad_norm) const;

  std::shared_ptr<torch::nn::Module> module_;
  TrainingEngineOptions options_;
  std::unique_ptr<ZeroOptimizer> zero_;
  std::optional<LrScheduler> scheduler_;
  LossScaler scaler_;
  int64_t micro_steps_ = 0;
  int64_t global_steps_ = 0;
  int64_t skipped_steps_ = 0;
  double last_grad_norm_ = 0.0;
  // Set once this window's gradients are reduced (check_overflow() or step()).
  std::unique_ptr<WindowNorm> window_norm_;
  bool skip_next_step_ = false;
};

}  // namespace engine
}  // namespace dschat
