#pragma once
// ZeRO stages 0-2 with overlap_comm (internal): gradients are reduced while backward still runs,
// as DeepSpeed's stage 1/2 does with its gradient hooks and IPG buckets.
//
// Every member of the given (replicated, trainable) groups gets an autograd post-accumulate-grad
// hook. Each group's flat gradient buffer is cut into buckets: consecutive ranges of at most
// reduce_bucket_size elements. While armed (for the backward of a micro-step that reduces: every
// one at stage 2, the accumulation boundary's at stages 0-1), a hook moves its parameter's new
// .grad into the flat buffer and counts it against every bucket the parameter overlaps; a bucket
// is complete when all the parameters overlapping it have reported.
//
// Order: collectives must be started in the same order on every rank, and completion order
// depends on timing. So buckets are started strictly in one fixed sequence, the same on every
// rank: group by group, each group from its last bucket to its first (backward produces the last
// parameters' gradients first). After each report, the buckets at the head of the sequence that
// are complete are started; a bucket that completes early waits for those before it. Readiness
// changes only when a collective starts, never which one comes next.
//
// finish() (after backward) moves the .grad of parameters that did not report (they got no
// gradient, or one from outside an armed backward), starts the remaining buckets in sequence and
// waits for all. A parameter that received no gradient contributes what its part of the buffer
// already holds (zeros at stage 2, the earlier micro-steps' sum at stages 0-1), exactly as the
// non-overlapped path sends it. A parameter whose gradient arrives a second time in one backward
// after one of its buckets was started (a parameter shared by several activation-checkpointed
// segments) cannot be reduced: finish() throws core::Unsupported, as DeepSpeed asserts.

#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "engine/flat_group.h"

namespace dschat {
namespace engine {

class OverlappedGradientReducer {
 public:
  /// Installs the hooks; throws core::InvalidArgument when a member already has a
  /// post-accumulate-grad hook (another engine with overlap_comm over the same module).
  OverlappedGradientReducer(std::vector<FlatParameterGroup*> groups, int64_t bucket_elements);
  /// Removes the hooks.
  ~OverlappedGradientReducer();
  OverlappedGradientReducer(const OverlappedGradientReducer&) = delete;
  OverlappedGradientReducer& operator=(const OverlappedGradientReducer&) = delete;

  /// Before a backward whose gradients are to be reduced. Collective when a bucket has no
  /// parameters (it starts at once).
  void arm();
  bool armed() const { return armed_; }
  /// Collective, after that backward: starts the buckets left and waits for all.
  void finish();

  /// Number of buckets over all groups.
  size_t bucket_count() const { return sequence_.size(); }

 private:
  struct Hook;
  struct BucketRef {
    size_t group = 0;
    size_t bucket = 0;
  };

  void on_gradient(size_t group, size_t member);
  void start_ready_buckets();  // with mutex_ held
  void start_bucket(const BucketRef& ref);

  std::vector<FlatParameterGroup*> groups_;
  std::vector<std::vector<ElementRange>> buckets_;                // [group][bucket] range of the flat buffer
  std::vector<std::vector<std::vector<size_t>>> member_buckets_;  // [group][member] buckets it overlaps
  std::vector<std::vector<int64_t>> bucket_members_;              // [group][bucket] members overlapping it
  std::vector<BucketRef> sequence_;                               // the fixed start order

  // State of the armed backward. Hooks run on autograd's threads, hence the mutex.
  std::mutex mutex_;
  bool armed_ = false;
  size_t next_ = 0;                           // position in sequence_ of the next bucket to start
  std::vector<std::vector<int64_t>> waiting_;  // [group][bucket] members yet to report
  std::vector<std::vector<char>> reported_;    // [group][member]
  std::vector<std::vector<char>> started_;     // [group][bucket]
  std::string late_parameter_;                // the first parameter whose gradient came after its bucket started
};

}  // namespace engine
}  // namespace dschat
