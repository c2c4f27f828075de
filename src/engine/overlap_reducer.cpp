#include "engine/overlap_reducer.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dschat/core/error.h"

namespace dschat {
namespace engine {

// Called by autograd after a parameter's .grad has been accumulated (AccumulateGrad), once per
// backward pass through it (once per recomputed segment under activation checkpointing).
struct OverlappedGradientReducer::Hook : torch::autograd::PostAccumulateGradHook {
  Hook(OverlappedGradientReducer* reducer, size_t group, size_t member)
      : reducer(reducer), group(group), member(member) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { reducer->on_gradient(group, member); }

  OverlappedGradientReducer* reducer;
  size_t group;
  size_t member;
};

OverlappedGradientReducer::OverlappedGradientReducer(std::vector<FlatParameterGroup*> groups,
                                                     int64_t bucket_elements)
    : groups_(std::move(groups)) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatLayout& layout = groups_[g]->layout();
    buckets_.push_back(split_into_chunks(layout.padded_numel, bucket_elements));
    bucket_members_.emplace_back(buckets_[g].size(), 0);
    member_buckets_.emplace_back(layout.slots.size());
    for (size_t m = 0; m < layout.slots.size(); ++m) {
      const FlatSlot& slot = layout.slots[m];
      if (slot.numel == 0) continue;
      for (int64_t b = slot.offset / bucket_elements; b <= (slot.offset + slot.numel - 1) / bucket_elements; ++b) {
        member_buckets_[g][m].push_back(static_cast<size_t>(b));
        ++bucket_members_[g][b];
      }
    }
    for (size_t b = buckets_[g].size(); b-- > 0;) sequence_.push_back({g, b});
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& members = groups_[g]->members();
    for (size_t m = 0; m < members.size(); ++m) {
      DSCHAT_CHECK(torch::autograd::impl::post_acc_grad_hooks(members[m].param) == nullptr, InvalidArgument,
                   "overlap_comm: parameter '", members[m].name,
                   "' already has a post-accumulate-grad hook (is another engine with overlap_comm training this "
                   "module?)");
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& members = groups_[g]->members();
    for (size_t m = 0; m < members.size(); ++m) {
      torch::autograd::impl::set_post_acc_grad_hooks(members[m].param, std::make_unique<Hook>(this, g, m));
    }
  }
}

OverlappedGradientReducer::~OverlappedGradientReducer() {
  for (FlatParameterGroup* group : groups_) {
    for (const auto& member : group->members()) {
      auto& hook = torch::autograd::impl::post_acc_grad_hooks(member.param);
      const auto* ours = dynamic_cast<const Hook*>(hook.get());
      if (ours && ours->reducer == this) hook.reset();
    }
  }
  // Collectives still in flight (a backward that threw) are waited by the groups' handles.
}

void OverlappedGradientReducer::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_) {
    // The previous armed backward threw half way: wait for what it started. Its other gradients
    // are lost, as a failed backward's partial .grad would be without overlap_comm.
    for (FlatParameterGroup* group : groups_) group->finish_gradient_reductions();
  }
  waiting_ = bucket_members_;
  reported_.assign(groups_.size(), {});
  started_.assign(groups_.size(), {});
  for (size_t g = 0; g < groups_.size(); ++g) {
    reported_[g].assign(groups_[g]->members().size(), 0);
    started_[g].assign(buckets_[g].size(), 0);
    groups_[g]->ensure_gradient_buffer();
  }
  next_ = 0;
  late_parameter_.clear();
  armed_ = true;
  start_ready_buckets();  // a bucket of padding alone has nothing to wait for
}

void OverlappedGradientReducer::on_gradient(size_t group, size_t member) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // the gradient stays in .grad for the non-overlapped path
  if (reported_[group][member]) {
    // A second gradient in the same backward: it can still be added while none of its buckets
    // has been started; after that it would miss the reduction.
    for (size_t bucket : member_buckets_[group][member]) {
      if (started_[group][bucket]) {
        if (late_parameter_.empty()) late_parameter_ = groups_[group]->members()[member].name;
        return;
      }
    }
    groups_[group]->take_gradient(member);
    return;
  }
  reported_[group][member] = 1;
  groups_[group]->take_gradient(member);
  for (size_t bucket : member_buckets_[group][member]) --waiting_[group][bucket];
  start_ready_buckets();
}

void OverlappedGradientReducer::start_ready_buckets() {
  while (next_ < sequence_.size() && waiting_[sequence_[next_].group][sequence_[next_].bucket] == 0) {
    start_bucket(sequence_[next_++]);
  }
}

void OverlappedGradientReducer::start_bucket(const BucketRef& ref) {
  started_[ref.group][ref.bucket] = 1;
  groups_[ref.group]->begin_gradient_reduction(buckets_[ref.group][ref.bucket]);
}

void OverlappedGradientReducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  armed_ = false;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t m = 0; m < reported_[g].size(); ++m) {
      if (!reported_[g][m]) groups_[g]->take_gradient(m);
    }
  }
  while (next_ < sequence_.size()) start_bucket(sequence_[next_++]);
  for (FlatParameterGroup* group : groups_) group->finish_gradient_reductions();
  DSCHAT_CHECK(late_parameter_.empty(), Unsupported, "overlap_comm: parameter '", late_parameter_,
               "' received a gradient again in the same backward after its reduction had started (a parameter "
               "used by several activation-checkpointed segments); set zero_optimization.overlap_comm to false");
}

}  // namespace engine
}  // namespace dschat
