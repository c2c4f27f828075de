#pragma once
// ZeroInferenceEngine: a frozen model partitioned by ZeRO stage 3 for inference, as DeepSpeed-Chat
// wraps step 3's reference model (reward model) in a stage-3 eval engine when the actor's
// (critic's) stage is 3 (get_eval_ds_config). Each rank keeps 1/N of every decoder layer's
// parameters and of those outside the layers; a forward gathers each layer just before it runs
// and frees it right after (the backbone's layer hooks, with the stage3 prefetch and live limits),
// and gathers the outer parameters (embeddings, final norm, heads) at its start, which
// release_gathered_parameters() frees again. Parameters of at most
// stage3_param_persistence_threshold elements stay resident. offload_param keeps the partitions
// in (pinned, with pin_memory) host memory; they are gathered onto the model's device per layer.
//
//   ZeroInferenceOptions options;
//   options.zero = eval_zero;                 // stage 3
//   options.communicator = communicator;
//   ZeroInferenceEngine ref_engine(ref.ptr(), options);   // collective
//   { torch::NoGradGuard no_grad; logits = ref->forward(ids, mask); }   // collective
//   ref_engine.release_gathered_parameters();
//
// The module must be frozen (no parameter requires grad) and built on a models::Backbone.

#include <torch/torch.h>

#include <memory>

#include "dschat/dist/process_group.h"
#include "dschat/engine/ds_config.h"
#include "dschat/engine/zero_partition.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace engine {

struct ZeroInferenceOptions {
  ZeroConfig zero;  // stage must be 3; persistence threshold, prefetch, live limit, offload_param
  std::shared_ptr<dist::Communicator> communicator;  // the ranks that share the partitions; null: one
  /// A deferred load's values (models::LoadOptions::deferred): only this rank's partitions are
  /// ever copied onto the device. Released once the engine is built.
  std::shared_ptr<const models::DeferredParameters> deferred;
};

class ZeroOptimizer;

class ZeroInferenceEngine {
 public:
  /// Collective. Throws core::ConfigError for a stage other than 3 and core::InvalidArgument for a
  /// module with a trainable parameter.
  ZeroInferenceEngine(std::shared_ptr<torch::nn::Module> module, ZeroInferenceOptions options);
  ~ZeroInferenceEngine();

  torch::nn::Module& module() { return *module_; }
  /// Collective: frees the parameters gathered outside the decoder layers by the last forward.
  void release_gathered_parameters();
  /// What this rank holds now for the module's parameters (partitions, gathered, resident).
  MemoryFootprint memory_footprint() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<dist::Communicator> communicator_;
  std::unique_ptr<ZeroOptimizer> zero_;
};

}  // namespace engine
}  // namespace dschat
