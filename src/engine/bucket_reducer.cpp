#include "engine/bucket_reducer.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "dschat/core/error.h"

namespace dschat {
namespace engine {

namespace {

int64_t fp32_bytes(const ElementRange& range) { return range.size() * 4; }

}  // namespace

// Called by autograd after a parameter's .grad has been accumulated (AccumulateGrad), once per
// backward pass through it (once per recomputed segment under activation checkpointing).
struct BucketGradientReducer::Hook : torch::autograd::PostAccumulateGradHook {
  Hook(BucketGradientReducer* reducer, size_t group, size_t member) : reducer(reducer), group(group), member(member) {}
  void operator()(const torch::autograd::Variable& /*param*/) override { reducer->on_gradient(group, member); }

  BucketGradientReducer* reducer;
  size_t group;
  size_t member;
};

BucketGradientReducer::BucketGradientReducer(std::vector<FlatParameterGroup*> groups, const Options& options)
    : groups_(std::move(groups)), options_(options) {
  const int64_t bucket_elements = options_.bucket_elements;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatLayout& layout = groups_[g]->layout();
    buckets_.push_back(split_into_chunks(layout.padded_numel, bucket_elements));
    bucket_members_.emplace_back(buckets_[g].size());
    member_buckets_.emplace_back(layout.slots.size());
    for (size_t m = 0; m < layout.slots.size(); ++m) {
      const FlatSlot& slot = layout.slots[m];
      if (slot.numel == 0) continue;
      for (int64_t b = slot.offset / bucket_elements; b <= (slot.offset + slot.numel - 1) / bucket_elements; ++b) {
        member_buckets_[g][m].push_back(static_cast<size_t>(b));
        bucket_members_[g][b].push_back(m);
      }
    }
    for (size_t b = buckets_[g].size(); b-- > 0;) sequence_.push_back({g, b});
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& members = groups_[g]->members();
    for (size_t m = 0; m < members.size(); ++m) {
      DSCHAT_CHECK(torch::autograd::impl::post_acc_grad_hooks(members[m].param) == nullptr, InvalidArgument,
                   "ZeRO gradient reduction: parameter '", members[m].name,
                   "' already has a post-accumulate-grad hook (is another engine at stage 2 or with overlap_comm "
                   "training this module?)");
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& members = groups_[g]->members();
    for (size_t m = 0; m < members.size(); ++m) {
      torch::autograd::impl::set_post_acc_grad_hooks(members[m].param, std::make_unique<Hook>(this, g, m));
    }
  }
}

BucketGradientReducer::~BucketGradientReducer() {
  for (FlatParameterGroup* group : groups_) {
    for (const auto& member : group->members()) {
      auto& hook = torch::autograd::impl::post_acc_grad_hooks(member.param);
      const auto* ours = dynamic_cast<const Hook*>(hook.get());
      if (ours && ours->reducer == this) hook.reset();
    }
  }
  // Collectives still in flight (a backward that threw) are waited by the groups' handles.
}

void BucketGradientReducer::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_) {
    // The previous armed backward threw half way: wait for what it started. Its other gradients
    // are lost, as a failed backward's partial .grad would be without this reducer.
    for (FlatParameterGroup* group : groups_) group->finish_gradient_reductions();
    if (options_.staged) {  // gradients that waited for their bucket: dropped, as the flat buffer is
      for (FlatParameterGroup* group : groups_) {
        for (size_t m = 0; m < group->members().size(); ++m) group->drop_gradient(m);
      }
    }
  }
  waiting_.assign(groups_.size(), {});
  reported_.assign(groups_.size(), {});
  started_.assign(groups_.size(), {});
  in_flight_.clear();
  in_flight_bytes_ = 0;
  head_staging_ = torch::Tensor();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& members : bucket_members_[g]) waiting_[g].push_back(static_cast<int64_t>(members.size()));
    reported_[g].assign(groups_[g]->members().size(), 0);
    started_[g].assign(buckets_[g].size(), 0);
    if (!options_.staged) groups_[g]->ensure_gradient_buffer();
  }
  next_ = 0;
  late_parameter_.clear();
  armed_ = true;
  if (options_.staged) prepare_head();
  start_ready_buckets();  // a bucket of padding alone has nothing to wait for
}

void BucketGradientReducer::on_gradient(size_t group, size_t member) {
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
    take_gradient(group, member);
    return;
  }
  reported_[group][member] = 1;
  take_gradient(group, member);
  for (size_t bucket : member_buckets_[group][member]) --waiting_[group][bucket];
  start_ready_buckets();
}

void BucketGradientReducer::take_gradient(size_t group, size_t member) {
  if (!options_.staged) {
    groups_[group]->take_gradient(member);
    return;
  }
  if (next_ >= sequence_.size()) return;
  const BucketRef head = sequence_[next_];
  if (head.group != group) return;
  for (size_t bucket : member_buckets_[group][member]) {
    if (bucket == head.bucket) stage_part(group, member, bucket, head_staging_);
  }
}

void BucketGradientReducer::stage_part(size_t group, size_t member, size_t bucket, torch::Tensor& staging) {
  FlatParameterGroup& flat = *groups_[group];
  if (!flat.members()[member].param.grad().defined()) return;
  flat.add_gradient_to(member, buckets_[group][bucket], staging);
  // Buckets start last first, so the member's first bucket is its last to be staged.
  if (bucket == member_buckets_[group][member].front()) {
    flat.drop_gradient(member);
  } else {
    flat.zero_gradient_part(member, buckets_[group][bucket]);
  }
}

void BucketGradientReducer::prepare_head() {
  if (next_ >= sequence_.size()) return;
  const BucketRef head = sequence_[next_];
  const ElementRange& range = buckets_[head.group][head.bucket];
  head_staging_ = groups_[head.group]->new_gradient_staging(range.size());
  peak_staging_bytes_ = std::max(peak_staging_bytes_, fp32_bytes(range) + in_flight_bytes_);
  for (size_t member : bucket_members_[head.group][head.bucket]) stage_part(head.group, member, head.bucket, head_staging_);
}

void BucketGradientReducer::wait_in_flight() {
  for (const BucketRef& ref : in_flight_) groups_[ref.group]->finish_gradient_reductions();
  in_flight_.clear();
  in_flight_bytes_ = 0;
}

void BucketGradientReducer::start_ready_buckets() {
  while (next_ < sequence_.size() && waiting_[sequence_[next_].group][sequence_[next_].bucket] == 0) {
    start_bucket(sequence_[next_++]);
    if (options_.staged) prepare_head();
  }
}

void BucketGradientReducer::start_bucket(const BucketRef& ref) {
  started_[ref.group][ref.bucket] = 1;
  const ElementRange& range = buckets_[ref.group][ref.bucket];
  if (!options_.staged) {
    groups_[ref.group]->begin_gradient_reduction(range);
    return;
  }
  // One reduction in flight at a time: the previous bucket's completes before this one starts
  // (with overlap_comm it ran while this bucket filled).
  wait_in_flight();
  groups_[ref.group]->begin_gradient_reduction(range, head_staging_);
  head_staging_ = torch::Tensor();  // the group holds it until the reduction is finished
  in_flight_.push_back(ref);
  in_flight_bytes_ += fp32_bytes(range);
  if (!options_.overlap) wait_in_flight();
}

void BucketGradientReducer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;
  armed_ = false;
  if (options_.staged) {
    // Gradients of parameters that did not report are staged when their bucket reaches the head.
    while (next_ < sequence_.size()) {
      start_bucket(sequence_[next_++]);
      prepare_head();
    }
    wait_in_flight();
  } else {
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t m = 0; m < reported_[g].size(); ++m) {
        if (!reported_[g][m]) take_gradient(g, m);
      }
    }
    while (next_ < sequence_.size()) start_bucket(sequence_[next_++]);
  }
  for (FlatParameterGroup* group : groups_) group->finish_gradient_reductions();
  DSCHAT_CHECK(late_parameter_.empty(), Unsupported, "ZeRO gradient reduction: parameter '", late_parameter_,
               "' received a gradient again in the same backward after its bucket's reduction had started (a "
               "parameter used by several activation-checkpointed segments); set zero_optimization.overlap_comm "
               "to false at stages 0-1, or use stage 1 instead of stage 2");
}

}  // namespace engine
}  // namespace dschat
