// FlatParameterGroup's gradient side: the flat fp32 buffer (stages 0-1, one rank), stage 2's
// bucket staging, the reductions into the owned partition, and what the optimizer reads.
#include "engine/flat_group.h"

#include "dschat/core/error.h"

namespace dschat {
namespace engine {

void FlatParameterGroup::ensure_gradient_buffer() {
  if (!flat_grad_.defined()) {
    flat_grad_ = torch::zeros({layout_.padded_numel}, torch::dtype(torch::kFloat32).device(context_.model_device));
  }
}

void FlatParameterGroup::take_gradient(size_t member) {
  torch::Tensor& grad = members_[member].param.mutable_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  ensure_gradient_buffer();
  const FlatSlot& slot = layout_.slots[member];
  flat_grad_.narrow(0, slot.offset, slot.numel).add_(grad.reshape({-1}));
  grad = torch::Tensor();
}

void FlatParameterGroup::add_gradient_to(size_t member, const ElementRange& range, torch::Tensor& staging) const {
  const torch::Tensor& grad = members_[member].param.grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  const FlatSlot& slot = layout_.slots[member];
  const ElementRange common = intersect(range, slot.range());
  if (common.size() == 0) return;
  staging.narrow(0, common.begin - range.begin, common.size())
      .add_(grad.reshape({-1}).narrow(0, common.begin - slot.offset, common.size()));
}

void FlatParameterGroup::zero_gradient_part(size_t member, const ElementRange& range) {
  torch::Tensor& grad = members_[member].param.mutable_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  if (!grad.is_contiguous()) grad = grad.contiguous();  // so the flat view below writes into it
  const FlatSlot& slot = layout_.slots[member];
  const ElementRange common = intersect(range, slot.range());
  if (common.size() > 0) grad.view({-1}).narrow(0, common.begin - slot.offset, common.size()).zero_();
}

torch::Tensor FlatParameterGroup::new_gradient_staging(int64_t numel) const {
  return torch::zeros({numel}, torch::dtype(torch::kFloat32).device(context_.model_device));  // [numel]
}

void FlatParameterGroup::accumulate_gradients() {
  if (!trainable_) return;
  ensure_gradient_buffer();
  for (size_t i = 0; i < members_.size(); ++i) take_gradient(i);
}

void FlatParameterGroup::reduce_gradients() {
  if (!trainable_) return;
  torch::NoGradGuard no_grad;
  accumulate_gradients();  // every rank reduces, with zeros where it had no gradient
  const int64_t world = context_.world_size;
  if (owner_world() == 1) {  // stage 0: average the whole buffer over the data-parallel ranks
    if (world == 1) {
      if (gradients_leave_the_device()) move_gradients_to_state();
      return;
    }
    for (const ElementRange& chunk : split_into_chunks(layout_.padded_numel, context_.reduce_bucket_elements)) {
      torch::Tensor part = flat_grad_.narrow(0, chunk.begin, chunk.size());
      context_.communicator->all_reduce(part, dist::ReduceOp::Avg);
    }
    return;
  }
  const int64_t part = layout_.partition_numel();
  host_gradients_.complete();  // the previous backward's copies (long done): bounds the staging memory
  const bool fresh = !grad_partition_.defined();  // zeros: the window's first contribution
  if (fresh) grad_partition_ = new_state_tensor(part);
  torch::Tensor rows = flat_grad_.view({world, part});  // [world, part]: row r goes to rank r
  for (const ElementRange& columns : partition_column_buckets(layout_, context_.reduce_bucket_elements)) {
    torch::Tensor input = columns.size() == part ? rows : rows.narrow(1, columns.begin, columns.size()).contiguous();
    torch::Tensor reduced = torch::empty({columns.size()}, flat_grad_.options());  // [columns]: sum over ranks
    context_.communicator->reduce_scatter(reduced, input);
    reduced.div_(static_cast<double>(world));
    add_to_partition(grad_partition_.narrow(0, columns.begin, columns.size()), reduced, fresh);
  }
  // Stages 2-3 keep only their partition of the gradients; stage 1 reuses the buffer next step.
  if (context_.stage >= 2) flat_grad_ = torch::Tensor();
}

void FlatParameterGroup::begin_gradient_reduction(const ElementRange& range, const torch::Tensor& staged) {
  DSCHAT_CHECK(trainable_ && (flat_grad_.defined() || staged.defined()) && !partition_params_, Error, "ZeRO group '",
               label_, "': no flat gradient buffer to reduce");
  DSCHAT_CHECK(!staged.defined() || (owner_world() > 1 && staged.numel() == range.size()), Error, "ZeRO group '",
               label_, "': staged gradients need a partitioned owner world and one value per element of the range");
  torch::NoGradGuard no_grad;
  torch::Tensor input = staged.defined() ? staged : flat_grad_.narrow(0, range.begin, range.size());  // [range]
  PendingReduction pending;
  if (owner_world() == 1) {  // stage 0 (or a world of one): every rank keeps the whole average
    if (context_.world_size > 1) pending.work = context_.communicator->start_all_reduce(input, dist::ReduceOp::Avg);
    pending_reductions_.push_back(std::move(pending));
    return;
  }
  // Rank r receives the part of the range inside its partition; partitions are consecutive, so
  // these parts are consecutive segments of the range.
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < owner_world(); ++r) counts.push_back(intersect(range, layout_.partition(r)).size());
  pending.owned_part = intersect(range, owned_range());
  if (staged.defined()) {
    // In place: the all-to-all has read the whole input before the sum lands in this segment.
    pending.staged = staged;
    pending.reduced = pending.owned_part.size() == 0
                          ? staged.narrow(0, 0, 0)
                          : staged.narrow(0, pending.owned_part.begin - range.begin, pending.owned_part.size());
  } else {
    pending.reduced = torch::empty({pending.owned_part.size()}, flat_grad_.options());  // [owned part]
  }
  pending.work = context_.communicator->start_reduce_scatter(pending.reduced, input, counts);
  pending_reductions_.push_back(std::move(pending));
}

void FlatParameterGroup::finish_gradient_reductions() {
  if (pending_reductions_.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<PendingReduction> pending = std::move(pending_reductions_);
  pending_reductions_.clear();
  for (PendingReduction& reduction : pending) reduction.work.wait();
  if (owner_world() == 1) {  // averaged in place: the buffer is the gradient
    if (gradients_leave_the_device()) move_gradients_to_state();
    return;
  }
  const ElementRange owned = owned_range();
  host_gradients_.complete();  // the previous backward's copies (long done): bounds the staging memory
  const bool fresh = !grad_partition_.defined();  // zeros: the window's first contribution
  if (fresh) grad_partition_ = new_state_tensor(owned.size());
  for (PendingReduction& reduction : pending) {
    if (reduction.owned_part.size() == 0) continue;
    // The same division and addition as reduce_gradients(): the same values, bit for bit.
    reduction.reduced.div_(static_cast<double>(context_.world_size));
    const int64_t offset = reduction.owned_part.begin - owned.begin;
    add_to_partition(grad_partition_.narrow(0, offset, reduction.owned_part.size()), reduction.reduced, fresh);
  }
  if (context_.stage >= 2) {
    flat_grad_ = torch::Tensor();
  } else if (flat_grad_.defined()) {
    flat_grad_.zero_();
  }
}

void FlatParameterGroup::move_gradients_to_state() {
  host_gradients_.complete();  // the previous backward's copies (long done): bounds the staging memory
  const bool fresh = !grad_partition_.defined();  // zeros: the window's first contribution
  if (fresh) grad_partition_ = new_state_tensor(layout_.padded_numel);
  add_to_partition(grad_partition_, flat_grad_, fresh);
  // The copy may still be reading the buffer: a later backward gets a fresh one rather than
  // writing into it (freeing it is safe, see HostGradientQueue::add).
  flat_grad_ = torch::Tensor();
}

void FlatParameterGroup::add_to_partition(const torch::Tensor& part, const torch::Tensor& reduced, bool fresh) {
  // Each call of a reduction adds into a disjoint part, so a fresh partition's parts are zeros.
  if (fresh) {
    host_gradients_.add_to_zeros(part, reduced);
  } else {
    host_gradients_.add(part, reduced);
  }
}

void FlatParameterGroup::complete_gradient_copies() { host_gradients_.complete(); }

torch::Tensor FlatParameterGroup::owned_gradients() const {
  DSCHAT_CHECK(host_gradients_.empty(), Error, "ZeRO group '", label_,
               "': gradients are still being copied to the host (complete_gradient_copies first)");
  if (owner_world() == 1 && !gradients_leave_the_device()) return flat_grad_;  // stage 0: the whole (averaged) buffer
  return grad_partition_;
}

void FlatParameterGroup::zero_gradients() {
  // Stages 0-1 keep their flat gradient buffer from step to step (zero-filled, not reallocated);
  // stages 2-3 hold no full gradients between backward passes.
  if (flat_grad_.defined()) flat_grad_.zero_();
  host_gradients_.discard();
  grad_partition_ = torch::Tensor();
  for (Member& member : members_) member.param.mutable_grad() = torch::Tensor();
}

}  // namespace engine
}  // namespace dschat
