#pragma once
// Gradients reduced bucket by bucket while backward runs (internal), as DeepSpeed's stage 1/2
// does with its gradient hooks and IPG buckets. Two uses:
//   - overlap_comm at stages 0-1 (and stage 2 on one rank): the gradients go into the group's
//     flat fp32 buffer and each complete bucket of it is reduced during the backward that ends
//     an accumulation window.
//   - stage 2 on several ranks, with or without overlap_comm ("staged"): no flat gradient buffer
//     exists. Only the bucket at the head of the start sequence (below) has a bucket-sized fp32
//     staging tensor; a gradient is copied into it when its parameter reports, a gradient for a
//     later bucket waits in its .grad until that bucket reaches the head (the part already
//     staged is zeroed there, and the .grad is dropped once every part is staged). The complete
//     head is reduce-scattered from its staging into the owners' partitions, and the staging is
//     freed when that collective completes. So at most two buckets of staging are alive (one
//     reducing, one filling). Without overlap_comm each bucket is waited for as soon as it
//     starts (DeepSpeed's synchronous IPG reduction); with it, one bucket's reduction runs while
//     the next one fills.
//
// Every member of the given (replicated, trainable) groups gets an autograd post-accumulate-grad
// hook. Each group's flat layout is cut into buckets: consecutive ranges of at most
// reduce_bucket_size elements. While armed (for the backward of a micro-step that reduces: every
// one at stage 2, the accumulation boundary's at stages 0-1), a hook moves its parameter's new
// .grad into the flat buffer (or the staging of each bucket it overlaps) and counts it against
// every bucket it overlaps; a bucket is complete when all the parameters overlapping it have
// reported.
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

class BucketGradientReducer {
 public:
  struct Options {
    int64_t bucket_elements = 500000000;
    // Stage 2 on several ranks: per-bucket staging instead of the flat gradient buffer.
    bool staged = false;
    // Staged only: let a bucket's reduction run while the next bucket fills (overlap_comm);
    // otherwise each bucket is waited for as soon as it starts.
    bool overlap = true;
  };

  /// Installs the hooks; throws core::InvalidArgument when a member already has a
  /// post-accumulate-grad hook (another engine reducing in backward over the same module).
  BucketGradientReducer(std::vector<FlatParameterGroup*> groups, const Options& options);
  /// Removes the hooks.
  ~BucketGradientReducer();
  BucketGradientReducer(const BucketGradientReducer&) = delete;
  BucketGradientReducer& operator=(const BucketGradientReducer&) = delete;

  /// Before a backward whose gradients are to be reduced. Collective when a bucket has no
  /// parameters (it starts at once).
  void arm();
  bool armed() const { return armed_; }
  /// Collective, after that backward: starts the buckets left and waits for all.
  void finish();

  /// Number of buckets over all groups.
  size_t bucket_count() const { return sequence_.size(); }
  /// Staged: the most staging bytes (filling and reducing) alive at once since reset_peak().
  int64_t peak_staging_bytes() const { return peak_staging_bytes_; }
  void reset_peak() { peak_staging_bytes_ = 0; }

 private:
  struct Hook;
  struct BucketRef {
    size_t group = 0;
    size_t bucket = 0;
  };

  void on_gradient(size_t group, size_t member);
  // Moves member's .grad into the flat buffer or, staged, its head-bucket part into the staging.
  void take_gradient(size_t group, size_t member);
  // Staged: copies the part of member's .grad inside `bucket` into `staging`; drops the .grad
  // when that was its last unstaged part (its first bucket), else zeroes the copied part.
  void stage_part(size_t group, size_t member, size_t bucket, torch::Tensor& staging);
  // Staged: allocates the head bucket's staging and stages the gradients waiting for it.
  void prepare_head();
  void wait_in_flight();
  void start_ready_buckets();  // with mutex_ held
  void start_bucket(const BucketRef& ref);

  std::vector<FlatParameterGroup*> groups_;
  Options options_;
  std::vector<std::vector<ElementRange>> buckets_;                // [group][bucket] range of the flat buffer
  std::vector<std::vector<std::vector<size_t>>> member_buckets_;  // [group][member] buckets it overlaps
  std::vector<std::vector<std::vector<size_t>>> bucket_members_;  // [group][bucket] members overlapping it
  std::vector<BucketRef> sequence_;                               // the fixed start order

  // State of the armed backward. Hooks run on autograd's threads, hence the mutex.
  std::mutex mutex_;
  bool armed_ = false;
  size_t next_ = 0;                           // position in sequence_ of the next bucket to start
  std::vector<std::vector<int64_t>> waiting_;  // [group][bucket] members yet to report
  std::vector<std::vector<char>> reported_;    // [group][member]
  std::vector<std::vector<char>> started_;     // [group][bucket]
  std::string late_parameter_;                // the first parameter whose gradient came after its bucket started
  // Staged only.
  torch::Tensor head_staging_;        // [head bucket size] fp32
  std::vector<BucketRef> in_flight_;  // started, not yet waited for
  int64_t in_flight_bytes_ = 0;
  int64_t peak_staging_bytes_ = 0;
};

}  // namespace engine
}  // namespace dschat
