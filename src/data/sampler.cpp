#include "dschat/data/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "dschat/core/error.h"

namespace dschat {
namespace data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  DSCHAT_CHECK(dataset_size >= 0, InvalidArgument, "DistributedSampler: dataset_size must be >= 0, got ",
               dataset_size);
  DSCHAT_CHECK(world_size >= 1, InvalidArgument, "DistributedSampler: world_size must be >= 1, got ", world_size);
  DSCHAT_CHECK(rank >= 0 && rank < world_size, InvalidArgument, "DistributedSampler: rank ", rank,
               " is out of range [0, ", world_size - 1, "] for world_size ", world_size);
  // PyTorch: drop_last with a remainder gives ceil((size - world) / world), which is
  // floor(size / world) (0 when size < world); otherwise ceil(size / world).
  num_samples_ = (drop_last && dataset_size % world_size != 0) ? dataset_size / world_size
                                                                : (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  if (shuffle_) {
    // Unsigned addition wraps modulo 2^64, as manual_seed maps a negative Python int.
    uint64_t epoch_seed = seed_ + static_cast<uint64_t>(epoch_);
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(epoch_seed);
    at::Tensor perm = at::randperm(dataset_size_, generator, at::TensorOptions().dtype(at::kLong));
    const int64_t* data = perm.data_ptr<int64_t>();
    std::copy(data, data + dataset_size_, order.begin());
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) order[i] = i;
  }

  // Padding (not drop_last) cycles through the order from its start, as many times as needed:
  // padded[i] = order[i % size]. Truncation (drop_last) just reads the first total_size entries,
  // so both are the same modular lookup. An empty dataset has total_size 0 and never divides.
  const int64_t total = total_size();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(order[i % dataset_size_]);
  DSCHAT_INTERNAL_ASSERT(static_cast<int64_t>(mine.size()) == num_samples_, "rank ", rank_, " got ",
                         mine.size(), " indices, expected ", num_samples_);
  return mine;
}

std::vector<std::vector<int64_t>> batch_indices(const std::vector<int64_t>& indices, int64_t batch_size,
                                                bool drop_last) {
  DSCHAT_CHECK(batch_size >= 1, InvalidArgument, "batch_indices: batch_size must be >= 1, got ", batch_size);
  std::vector<std::vector<int64_t>> batches;
  const auto size = static_cast<int64_t>(indices.size());
  for (int64_t begin = 0; begin < size; begin += batch_size) {
    int64_t end = std::min(begin + batch_size, size);
    if (drop_last && end - begin < batch_size) break;
    batches.emplace_back(indices.begin() + begin, indices.begin() + end);
  }
  return batches;
}

}  // namespace data
}  // namespace dschat
