#pragma once
// The training engine's ZeRO machinery (internal): splits a module's parameters into flat groups
// for the configured stage, runs AdamW over the pieces this rank owns, and does the gradient and
// parameter collectives. TrainingEngine drives it; checkpoints read its pieces.
//
// Groups per stage:
//   0-2  one replicated group per (dtype, device) of the trainable parameters; frozen ones are
//        left as they are
//   3    per decoder layer: a partitioned trainable group and a partitioned frozen group; the
//        same for the parameters outside the layers ("outer"); parameters of at most
//        stage3_param_persistence_threshold elements form a replicated "persistent" group
//        (trainable) or stay as they are (frozen), as DeepSpeed keeps small parameters resident.
//
// overlap_comm at stages 0-2, and stage 2 on several ranks always: the gradients of a backward
// that reduces (every one at stage 2, the accumulation boundary's at stages 0-1) are reduced
// bucket by bucket while that backward runs (engine/bucket_reducer.h; at stage 2 from bucket
// staging, without a flat gradient buffer); reduce_at_boundary() then has nothing left to do.
// Stage 3 always reduces each layer inside backward and prefetches its gathers.

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dschat/engine/adamw.h"
#include "dschat/engine/ds_config.h"
#include "engine/flat_group.h"

namespace dschat {
namespace models {
class Backbone;
struct DeferredParameters;
}
namespace engine {

class BucketGradientReducer;
class Zero3LayerHooks;

/// DeepSpeed's unscale-and-clip multiplier, 0-dim fp64 on the norm's device:
/// min(1, clip / (norm + 1e-6)) / scale with norm = sqrt(norm_squared) / scale, the clip term only
/// when clip > 0; norm_squared [1] is the squared norm of the scaled gradients. A device norm is
/// not read: unscale_and_clip_factor_by_tensor_ops computes it there. A host norm goes through
/// the formula in double. A 0-dim factor does not promote fp32 gradients to double, so
/// g * factor rounds as g * (double) does.
torch::Tensor unscale_and_clip_factor(const torch::Tensor& norm_squared, double scale, double clip);
/// The same formula as tensor operations on norm_squared's device, in the same order. On CUDA
/// every one of them (sqrt and division included) is IEEE-rounded, so the result is the host
/// formula's bit for bit; CPU tensor sqrt may differ from it in the last bit.
torch::Tensor unscale_and_clip_factor_by_tensor_ops(const torch::Tensor& norm_squared, double scale, double clip);

class ZeroOptimizer {
 public:
  /// A trainable parameter's part that this rank owns, as the optimizer sees it.
  struct OwnedPiece {
    FlatParameterGroup* group = nullptr;
    size_t slot = 0;
    int64_t param_offset = 0;  // first element within the flattened parameter
    torch::Tensor value;       // [numel] fp32 view of the group's master
    int64_t range_offset = 0;  // first element within the group's owned range
  };

  /// Collective: broadcasts rank 0's values of every parameter, then builds the groups.
  /// `deferred`: the values of a deferred load (models::DeferredParameters; its meta parameters
  /// are read from the same checkpoint by every rank, so not broadcast). Stage 3 copies only this
  /// rank's partitions of them onto the device; the parameters kept whole (stages 0-2, and stage
  /// 3's small ones) are materialised whole. Parameters a deferred model holds on the host (LoRA
  /// adapters made after the load) are moved to the model device first.
  ZeroOptimizer(torch::nn::Module& module, const ZeroContext& context, const ZeroConfig& zero,
                const OptimizerConfig& optimizer, double lora_learning_rate,
                const models::DeferredParameters* deferred = nullptr);
  ~ZeroOptimizer();

  const ZeroContext& context() const { return context_; }
  AdamW& adamw() { return *adamw_; }
  const AdamW& adamw() const { return *adamw_; }
  const std::vector<std::unique_ptr<FlatParameterGroup>>& groups() const { return groups_; }
  const std::vector<OwnedPiece>& owned_pieces() const { return pieces_; }
  /// Parameters in no group (frozen at stages 0-2, small frozen ones at stage 3), by name.
  const std::vector<std::pair<std::string, torch::Tensor>>& ungrouped() const { return ungrouped_; }

  /// Before each backward; `boundary`: it ends an accumulation window. With a bucket reducer
  /// (overlap_comm, or stage 2 on several ranks), arms it when this backward's gradients are to
  /// be reduced (collective then).
  void before_backward(bool boundary);
  /// After each backward: moves new gradients into the groups; stages 2-3 reduce-scatter them
  /// (with a bucket reducer: waits for the reductions started during backward and finishes them).
  void after_backward();
  /// Collective, at an accumulation boundary: stage 0 all-reduces, stage 1 reduce-scatters.
  void reduce_at_boundary();
  /// Collective: [1] fp64, the squared L2 norm of the whole (averaged) gradient, summed over ranks
  /// on the device of the gradients (the state device), so nothing is read to the host; not
  /// finite exactly when some rank holds an inf or NaN gradient. Waits for gradients still being
  /// copied to the host (ZeRO-Offload).
  torch::Tensor gradient_norm_squared();
  /// Multiplies the owned gradients by `factor`, a 0-dim tensor on their device (no host read).
  void scale_gradients(const torch::Tensor& factor);
  /// AdamW over the owned pieces, then the new values go back into the parameters (collective).
  /// With offload_optimizer, group by group: a group's copy back to the device starts while the
  /// CPU steps the next one.
  void step();
  void zero_gradients();
  /// Collective at stage 3: partitioned groups gathered outside a layer's bracket are released.
  void release_gathered();
  /// Collective: copies of every parameter's full value by name, in the model dtype.
  std::map<std::string, torch::Tensor> consolidated_parameters();
  /// Collective: puts the masters back into the parameters after a checkpoint load.
  void publish_all();

  MemoryFootprint footprint() const;
  /// Stage 3's layer hooks (the ones set on the backbone); nullptr at stages 0-2.
  Zero3LayerHooks* layer_hooks() { return hooks_.get(); }

 private:
  void build_groups(torch::nn::Module& module, const ZeroConfig& zero, const models::DeferredParameters* deferred);
  void build_optimizer(const OptimizerConfig& optimizer, double lora_learning_rate);
  // Points the owned pieces at their gradients; only the pieces of `only` when it is not null
  // (the others get none, so AdamW leaves them alone).
  void bind_piece_gradients(const FlatParameterGroup* only = nullptr);

  ZeroContext context_;
  std::vector<std::unique_ptr<FlatParameterGroup>> groups_;
  std::vector<std::pair<std::string, torch::Tensor>> ungrouped_;
  std::vector<OwnedPiece> pieces_;
  std::unique_ptr<AdamW> adamw_;
  std::shared_ptr<models::Backbone> backbone_;  // stage 3: the model whose layers the hooks bracket
  std::unique_ptr<Zero3LayerHooks> hooks_;
  std::unique_ptr<BucketGradientReducer> reducer_;  // stages 0-2 with overlap_comm; stage 2 on several ranks
  bool reduced_in_backward_ = false;  // stages 0-1: this window's gradients were reduced by reducer_
};

}  // namespace engine
}  // namespace dschat
