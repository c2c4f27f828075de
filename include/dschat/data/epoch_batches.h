#pragma once
// One rank's per-step batches for one epoch: the distributed sampler's indices for that epoch,
// chunked into micro-batches, collated on a background thread (Prefetcher). The collate function
// picks the batch kind, e.g.
//
//   data::EpochBatches<data::SftBatch> batches(sampler, epoch, /*batch_size=*/16, /*drop_last=*/false,
//       [&](const std::vector<int64_t>& items) { return data::collate_sft(train, items, pad); });
//   while (auto batch = batches.next()) step(*batch);

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dschat/data/prefetch.h"
#include "dschat/data/sampler.h"

namespace dschat {
namespace data {

template <class Batch>
class EpochBatches {
 public:
  using Collate = std::function<Batch(const std::vector<int64_t>& items)>;

  /// Throws core::InvalidArgument for batch_size < 1 or prefetch_depth < 1. Collate errors
  /// surface from next().
  EpochBatches(DistributedSampler sampler, int64_t epoch, int64_t batch_size, bool drop_last, Collate collate,
               int64_t prefetch_depth = 2) {
    sampler.set_epoch(epoch);
    batches_ = batch_indices(sampler.indices(), batch_size, drop_last);
    auto next_index = std::make_shared<size_t>(0);
    // The producer owns copies of what it reads, so it never outlives its data.
    prefetcher_ = std::make_unique<Prefetcher<Batch>>(
        [batches = batches_, collate = std::move(collate), next_index]() -> std::optional<Batch> {
          if (*next_index >= batches.size()) return std::nullopt;
          return collate(batches[(*next_index)++]);
        },
        prefetch_depth);
  }

  /// Micro-batches this rank gets in the epoch.
  int64_t size() const { return static_cast<int64_t>(batches_.size()); }
  /// The dataset indices of micro-batch `i` (for logging and tests).
  const std::vector<int64_t>& indices(int64_t i) const { return batches_.at(static_cast<size_t>(i)); }

  /// The next collated batch, or std::nullopt after the last.
  std::optional<Batch> next() { return prefetcher_->next(); }

 private:
  std::vector<std::vector<int64_t>> batches_;
  std::unique_ptr<Prefetcher<Batch>> prefetcher_;
};

}  // namespace data
}  // namespace dschat
