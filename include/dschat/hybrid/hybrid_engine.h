#pragma once
// HybridEngine: one object owning the actor for both halves of PPO: train() puts it in the
// training engine's mode (ZeRO, LoRA adapters unfused, activation checkpointing as configured),
// eval()/generate() in the inference engine's (KV-cache decoding through the fused ops), as
// DeepSpeed's Hybrid Engine does, configured by the DeepSpeed config's "hybrid_engine" block:
//
//   HybridEngine actor(lm, {training_options});     // training_options.config.hybrid_engine
//   actor.eval();  auto out = actor.generate(ids, mask, gen);   // experience
//   actor.train(); loss = ...; actor.backward(loss); actor.step();
//
// What generation runs on (docs/hybrid.md):
//   * ZeRO 0-2, same dtype, inference_tp_size 1: the training parameters themselves (no copy).
//   * ZeRO 3: the layer partitions are gathered for the whole generation when pin_parameters
//     (the backbone's hooks are detached meanwhile), else layer by layer on every forward by the
//     engine's own hooks (ranks then step in lockstep until all have finished).
//   * A generation dtype other than the model's (fp32 training, bf16 generation): one cast copy
//     per eval(), reused for every generate() until train().
//   * inference_tp_size t > 1 (dividing the world): the ranks form world / t tensor-parallel groups
//     of t consecutive ranks (DeepSpeed's); a shard per rank, made of views of the training
//     parameters (ZeRO 0-2, same dtype) or of copies filled tp_gather_partition_size layers at a
//     time (ZeRO 3 gathers each layer group over all ranks, copies its slices and releases it).
//     The prompt batches of a group's ranks are concatenated and each rank keeps its own rows.
//   * LoRA adapters are fused into the base weights for generation and unfused after, bit for bit.
//   * hybrid_engine.continuous_batching: the continuous engine (paged KV blocks, n samples sharing
//     their prompt's blocks, prefix_caching emptied at every eval()) instead of the static one, in
//     every case above: a TP group runs one schedule over the joint batch, and data-parallel ranks
//     under ZeRO-3 vote before each forward (ContinuousEngineOptions::lockstep).
// release_inference_cache frees the KV workspace after every generate() and takes it again
// before the next; train() then checks that the memory is back at the training level.
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>

#include "dschat/core/generation_config.h"
#include "dschat/engine/training_engine.h"
#include "dschat/hybrid/lora_fuse_backup.h"
#include "dschat/inference/generate.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace hybrid {

struct HybridEngineOptions {
  /// The training side; training.config.hybrid_engine configures the inference side.
  engine::TrainingEngineOptions training;
  /// The dtype generation runs in; nullopt: the model's own (nothing is cast).
  std::optional<torch::ScalarType> inference_dtype;
  /// After every switch to generation, the first generate() compares the inference path's
  /// logits over its first prompt with the training forward's and throws core::Error on a
  /// mismatch. nullopt: on in debug builds, off in release builds.
  std::optional<bool> logits_self_check;
  /// Where fusing LoRA for generation keeps the exact unfused weights it restores at train()
  /// (lora_fuse_backup.h: auto, device or host).
  LoraFuseBackup lora_fuse_backup = LoraFuseBackup::kAuto;
};

/// What the last generate() cost, beyond the inference engine's own statistics.
struct HybridGenerationStats {
  inference::GenerationStats generation;
  double gather_seconds = 0.0;        // materialising the inference weights at the last eval()
  double self_check_max_diff = -1.0;  // max |logit difference| of the last self-check (-1: none)
};

class InferenceWeights;
class GenerationModel;

class HybridEngine {
 public:
  /// Collective over options.training.communicator, like TrainingEngine. Throws
  /// core::ConfigError / core::Unsupported for hybrid_engine settings it cannot honour (naming
  /// the key).
  HybridEngine(models::CausalLM actor, HybridEngineOptions options);
  ~HybridEngine();
  HybridEngine(const HybridEngine&) = delete;
  HybridEngine& operator=(const HybridEngine&) = delete;

  engine::TrainingEngine& training_engine() { return *training_; }
  models::CausalLM& actor() { return actor_; }

  /// Back to training: generation weights, gathers and fused LoRA are undone. Idempotent.
  void train();
  /// Switches to generation (materialises the inference weights). Collective under ZeRO-3 or
  /// tensor parallelism. Idempotent while in eval mode.
  void eval();
  bool generating() const { return weights_ != nullptr; }

  /// Collective when the world has several ranks (every rank calls it, each with its own
  /// prompts). Switches to eval mode first if needed. input_ids / attention_mask: [B, T]
  /// left-padded. Returns [B * n, T + N] (n = config.num_return_sequences, each prompt prefilled
  /// once and its KV shared by its n answers) as inference::generate does.
  inference::GenerationResult generate(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                       const core::GenerationConfig& config);

  /// Training calls; they need train mode (core::InvalidArgument otherwise).
  void backward(const torch::Tensor& loss);
  bool step();

  /// The model generate() runs (the actor itself, a cast copy or a TP shard); only in eval mode.
  models::CausalLM inference_model();
  /// Bytes held for generation beyond the training state: KV workspace and weight copies.
  int64_t inference_bytes() const;
  const HybridGenerationStats& last_stats() const { return stats_; }

 private:
  void require_training_mode(const char* call) const;
  void log_iteration_line();
  const engine::HybridEngineConfig& he_config() const { return options_.training.config.hybrid_engine; }
  inference::GenerationResult generate_continuous(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                  const core::GenerationConfig& config);
  inference::GenerationResult generate_tensor_parallel(const torch::Tensor& input_ids,
                                                       const torch::Tensor& attention_mask,
                                                       const core::GenerationConfig& config);
  void run_self_check(const torch::Tensor& input_ids, const torch::Tensor& attention_mask);

  models::CausalLM actor_;
  HybridEngineOptions options_;
  std::unique_ptr<engine::TrainingEngine> training_;
  std::unique_ptr<inference::InferenceEngine> inference_;
  std::unique_ptr<inference::ContinuousEngine> continuous_;  // hybrid_engine.continuous_batching: made on first use
  std::unique_ptr<GenerationModel> generation_model_;  // a cast copy / TP shard, built at the first eval()
  std::shared_ptr<dist::Communicator> tp_group_;       // inference_tp_size > 1: this rank's TP group
  std::unique_ptr<InferenceWeights> weights_;          // non-null in eval mode
  bool saved_checkpointing_ = false;
  bool self_check_pending_ = false;
  int64_t training_parameter_bytes_ = 0;  // the engine's parameter bytes when eval() began
  HybridGenerationStats stats_;
  // DeepSpeed's per-iteration line (E2E / gather / generate / training time).
  std::optional<std::chrono::steady_clock::time_point> iteration_start_;
  double generate_seconds_ = 0.0;
  double training_seconds_ = 0.0;
  std::chrono::steady_clock::time_point training_start_;
  int64_t samples_ = 0;
  int64_t iterations_ = 0;
  double total_latency_ = 0.0;
};

}  // namespace hybrid
}  // namespace dschat
