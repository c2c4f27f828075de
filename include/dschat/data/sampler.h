#pragma once
// Which dataset rows each data-parallel rank reads, index for index the same as PyTorch's
// torch.utils.data.distributed.DistributedSampler for the same (dataset_size, world_size, rank,
// shuffle, seed, epoch, drop_last), plus BatchSampler-style chunking of those indices.
//
// Per epoch: shuffle 0..size-1 with torch.randperm on a CPU generator seeded with seed + epoch
// (or keep the natural order), make the length a multiple of world_size — pad by repeating from the
// start, or with drop_last cut the tail — and give rank r every world_size-th index from r.
//
// Epochs: DeepSpeed-Chat never calls set_epoch, so every epoch there repeats the epoch-0 order.
// dschat's trainers call set_epoch(e) at the start of epoch e, so each epoch gets a fresh
// permutation that is still reproducible from the seed alone.

#include <cstdint>
#include <vector>

namespace dschat {
namespace data {

class DistributedSampler {
 public:
  /// Throws core::InvalidArgument naming the argument when dataset_size < 0, world_size < 1 or
  /// rank is outside [0, world_size). An empty dataset is allowed: num_samples() is 0 and
  /// indices() is empty for every rank (with or without drop_last), as in PyTorch.
  DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  /// Selects the permutation of the following indices() calls. The generator seed is
  /// seed + epoch modulo 2^64, which is what torch.Generator.manual_seed makes of any sum that
  /// PyTorch accepts (negative sums wrap the same way).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  /// This rank's dataset indices for the current epoch, in the order they are to be read.
  std::vector<int64_t> indices() const;

  /// Indices per rank and epoch: ceil(size / world), or floor(size / world) with drop_last.
  int64_t num_samples() const { return num_samples_; }
  /// num_samples() * world_size: the padded (or truncated) length shared out across ranks.
  int64_t total_size() const { return num_samples_ * world_size_; }

  int64_t dataset_size() const { return dataset_size_; }
  int64_t world_size() const { return world_size_; }
  int64_t rank() const { return rank_; }

 private:
  int64_t dataset_size_;
  int64_t world_size_;
  int64_t rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

/// Splits `indices` into consecutive batches of `batch_size` like torch.utils.data.BatchSampler:
/// the last batch is shorter, or dropped when `drop_last`. Throws core::InvalidArgument when
/// batch_size < 1.
std::vector<std::vector<int64_t>> batch_indices(const std::vector<int64_t>& indices, int64_t batch_size,
                                                bool drop_last);

}  // namespace data
}  // namespace dschat
