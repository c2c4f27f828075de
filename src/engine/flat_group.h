#pragma once
// One flat group of parameters under ZeRO (internal to the training engine).
//
// The members' values live back to back in one flat buffer laid out by plan_flat_layout for the
// "owner world" (1 at stage 0: every rank owns everything; the data-parallel world at stages
// 1-3). Each member tensor becomes a view of that buffer (param.set_data), so the module keeps
// its Variables and autograd identity. A rank owns the range owned_range() of the buffer: its
// fp32 master values and gradients exist only for that range.
//
// Replicated groups keep the flat buffer materialised (stages 0-2, and stage 3's persistent
// small parameters). Partitioned groups (stage 3) keep only their owned range in
// param_partition_ and materialise the flat buffer between gather() and release(); frozen ones
// with ZeroContext::quantize_frozen keep it as int8 groups instead and dequantize when gathering.
//
// Gradients (flat_group_gradients.cpp): stages 0-1 and one-rank worlds add them into an fp32 flat
// buffer; stage 2 on several ranks never has one: the bucket reducer (bucket_reducer.h) stages a
// bucket at a time and reduce-scatters it into the owned fp32 partition.
//
// ZeRO-Offload on a CUDA model (state on the host): reduced gradients travel to the host partition
// through HostGradientQueue (pinned staging, a side stream; added in order when complete), and
// updated values travel back through copy_to_device (pinned staging, non-blocking).

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dschat/dist/process_group.h"
#include "dschat/engine/zero_partition.h"
#include "engine/host_transfers.h"
#include "engine/quantized_weights.h"

namespace dschat {
namespace engine {

/// What every group of one engine shares.
struct ZeroContext {
  dist::Communicator* communicator = nullptr;  // null: a world of one
  int64_t rank = 0;
  int64_t world_size = 1;
  int stage = 0;
  torch::Device model_device = torch::kCPU;
  torch::Device state_device = torch::kCPU;        // fp32 masters, moments, gradient partitions
  bool offload_optimizer = false;                  // state_device is the host by offload_optimizer
  torch::Device param_store_device = torch::kCPU;  // stage 3's parameter partitions
  bool pin_memory = false;                         // CPU-side state of a CUDA model
  // Stage 3: frozen partitioned groups keep their partitions as group-wise int8
  // (zero_quantized_nontrainable_weights, engine/quantized_weights.h).
  bool quantize_frozen = false;
  int64_t reduce_bucket_elements = 500000000;
  int64_t allgather_bucket_elements = 500000000;
};

/// A meta parameter's value in a deferred load's `values` (core::InvalidArgument naming it when
/// there are none or it is missing).
const torch::Tensor& deferred_value(const std::map<std::string, torch::Tensor>* values, const std::string& name);

class FlatParameterGroup {
 public:
  struct Member {
    std::string name;
    torch::Tensor param;  // the module's Variable; its data is re-pointed into the flat buffer
  };

  /// Collective for partitioned groups only in the sense that every rank must build the same
  /// groups in the same order. Members must share one dtype and be on the model device or on the
  /// meta device; a meta member's value is `deferred_values`' tensor of its name (a deferred load,
  /// models::DeferredParameters). A partitioned group copies only the pieces of its owned range,
  /// so no full-size buffer of it ever exists on the device (DeepSpeed's zero.Init).
  FlatParameterGroup(std::string label, std::vector<Member> members, bool trainable, bool partition_params,
                     const ZeroContext& context, const std::map<std::string, torch::Tensor>* deferred_values = nullptr);

  const std::string& label() const { return label_; }
  const std::vector<Member>& members() const { return members_; }
  /// The i-th member's shape (its tensor is empty while a partitioned group is released).
  const std::vector<int64_t>& member_shape(size_t i) const { return shapes_[i]; }
  const FlatLayout& layout() const { return layout_; }
  bool trainable() const { return trainable_; }
  bool partitioned() const { return partition_params_; }
  /// A frozen partitioned group stored as int8 (ZeroContext::quantize_frozen).
  bool quantized() const { return quantized_; }
  /// This rank's range of the flat buffer.
  ElementRange owned_range() const { return layout_.partition(owner_rank_); }

  /// Partitioned groups: collective all-gather that materialises every member (no-op when
  /// already gathered). release() points the members at empty tensors again.
  void gather();
  void release();
  bool gathered() const { return flat_params_.defined(); }
  /// gather() in two halves, so the all-gather runs while the caller computes (prefetch):
  /// begin_gather() starts it, finish_gather() waits and materialises. gather() and release()
  /// finish a pending one first.
  void begin_gather();
  void finish_gather();
  bool gather_pending() const { return pending_flat_.defined(); }

  /// Moves the members' .grad() into the fp32 flat gradient buffer (adding) and drops them.
  void accumulate_gradients();
  /// The same for member `member` alone (nothing when it has no .grad).
  void take_gradient(size_t member);
  /// Stage 2's bucket staging (engine/bucket_reducer.h): adds the part of member `member`'s .grad
  /// inside the flat range `range` into `staging` [range], fp32 on the model device.
  void add_gradient_to(size_t member, const ElementRange& range, torch::Tensor& staging) const;
  void drop_gradient(size_t member) { members_[member].param.mutable_grad() = torch::Tensor(); }
  /// Zeroes the part of member `member`'s .grad inside the flat range `range` (already staged).
  void zero_gradient_part(size_t member, const ElementRange& range);
  /// [numel] fp32 zeros on the model device, for add_gradient_to.
  torch::Tensor new_gradient_staging(int64_t numel) const;
  /// Allocates the fp32 flat gradient buffer (zeros) unless it exists.
  void ensure_gradient_buffer();
  /// Collective: stage 0 all-reduces (averages) the flat gradients in place; stages 1-3
  /// reduce-scatter them (averaged) into the owned gradient partition (adding) and free them.
  void reduce_gradients();
  /// Overlapped reduction (overlap_comm), one contiguous range of the flat gradient buffer at a
  /// time, started while backward still runs. Collective, in the same order on every rank:
  /// stage 0 averages the range in place (all-reduce); stages 1-2 reduce-scatter it (averaged)
  /// onto the owners, each rank receiving the range's part in its own partition (possibly none).
  /// The range must not be written until finish_gradient_reductions(). With `staged` [range]
  /// (stage 2 without a flat buffer) the range's gradients are read from it instead, and this
  /// rank's part is reduced into it in place; the group keeps it until the reduction is finished.
  void begin_gradient_reduction(const ElementRange& range, const torch::Tensor& staged = torch::Tensor());
  /// Waits for the begun ranges; stages 1-2 add their parts into the owned gradient partition and
  /// then free (stage 2) or zero (stage 1: a second backward before the step adds only its own
  /// gradients) the flat buffer, as reduce_gradients() leaves it.
  void finish_gradient_reductions();
  /// Waits for the gradients still travelling to a host partition (ZeRO-Offload on CUDA) and adds
  /// them in; owned_gradients() refuses to run before.
  void complete_gradient_copies();
  /// [owned] fp32 gradients of the owned range (undefined before any gradient).
  torch::Tensor owned_gradients() const;
  /// [owned] fp32 master values of the owned range (trainable groups).
  torch::Tensor master() const { return master_; }
  /// Collective: writes the owned master values back into the parameters (cast to the model
  /// dtype); replicated groups of stages 1-3 then all-gather the flat buffer.
  void publish_master();
  void zero_gradients();

  /// [owned] values in the model dtype: the partition of partitioned groups (dequantized, a new
  /// tensor, when quantized), else a view of the flat buffer. For checkpoints of frozen groups.
  torch::Tensor owned_values() const;
  /// Loads owned master values (trainable) or owned values (frozen) from `values` [owned].
  void load_owned(const torch::Tensor& values);

  MemoryFootprint footprint() const;

 private:
  int64_t owner_world() const { return layout_.world_size; }
  // A world of one at stages 1-3 with the optimizer state off the model's device (ZeRO-Offload
  // of a CUDA model): nothing to reduce, yet the gradients must reach the state device as a
  // reduce-scatter's share would. (Stage 0 never offloads.)
  bool gradients_leave_the_device() const {
    return owner_world() == 1 && context_.state_device != context_.model_device;
  }
  void move_gradients_to_state();
  // part += reduced (a part of grad_partition_, through host_gradients_); `fresh`: the partition
  // was created by the calling reduction, so the part still holds zeros.
  void add_to_partition(const torch::Tensor& part, const torch::Tensor& reduced, bool fresh);
  // Takes the meta members (a deferred load's) off the meta device, so set_data can re-point them.
  void bind_deferred_members();
  void point_members_at(const torch::Tensor& flat);
  void point_members_at_nothing();
  torch::Tensor new_state_tensor(int64_t numel) const;

  std::string label_;
  std::vector<Member> members_;
  std::vector<std::vector<int64_t>> shapes_;
  bool trainable_;
  bool partition_params_;
  ZeroContext context_;
  FlatLayout layout_;
  int64_t owner_rank_ = 0;
  torch::ScalarType dtype_;
  torch::Tensor flat_params_;      // [padded] model dtype on the model device; undefined when released
  torch::Tensor param_partition_;  // [owned] model dtype on the param store device (partitioned, not quantized)
  bool quantized_ = false;
  QuantizedValues quantized_partition_;  // the owned range as int8 groups on the param store device (quantized)
  // A quantized gather in flight: [world, groups * G] int8 and [world, groups] fp32 landings.
  torch::Tensor pending_quantized_, pending_scales_;
  torch::Tensor master_;           // [owned] fp32; a view of flat_params_/param_partition_ when they are fp32 on the state device
  torch::Tensor flat_grad_;        // [padded] fp32 on the model device, between backward and reduction
  torch::Tensor grad_partition_;   // [owned] fp32 on the state device (stages 1-3)
  HostGradientQueue host_gradients_;  // reduced gradients on their way into a host grad_partition_
  // An all-gather in flight: the buffer it fills, the source it reads, and per bucket the
  // columns, the [world, columns] landing tensor (undefined when it lands in pending_flat_
  // directly) and the handle.
  torch::Tensor pending_flat_;    // [padded]
  torch::Tensor pending_source_;  // [owned]
  struct PendingBucket {
    ElementRange columns;
    torch::Tensor landing;  // [world, columns]
    torch::Tensor source;   // [columns], kept alive until the collective completes
    std::optional<dist::PendingCollective> work;
  };
  std::vector<PendingBucket> pending_buckets_;
  // Gradient ranges being reduced: the part of the range this rank owns, the [owned part] result
  // of a reduce-scatter (stages 1-2) and the handle.
  struct PendingReduction {
    ElementRange owned_part;  // within the flat buffer
    torch::Tensor staged;     // [range] fp32 staging it reads (stage 2), kept alive until finished
    torch::Tensor reduced;    // [owned_part] fp32 sum over ranks (undefined at stage 0); staged: a view of it
    dist::PendingCollective work;
  };
  std::vector<PendingReduction> pending_reductions_;
};

}  // namespace engine
}  // namespace dschat
