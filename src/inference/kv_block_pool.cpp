#include "dschat/inference/kv_block_pool.h"

#include <algorithm>

#include "dschat/core/error.h"

namespace dschat {
namespace inference {

KvBlockPool::KvBlockPool(const core::ModelConfig& config, int64_t num_blocks, int64_t block_size,
                         torch::ScalarType dtype, torch::Device device)
    : block_size_(block_size) {
  DSCHAT_CHECK(num_blocks >= 1 && block_size >= 1, InvalidArgument, "kv block pool: num_blocks (", num_blocks,
               ") and block_size (", block_size, ") must be positive");
  storage_ = torch::zeros({config.num_hidden_layers, 2, num_blocks, block_size, config.num_key_value_heads,
                           config.head_dim},
                          torch::dtype(dtype).device(device));
  reference_counts_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  // A stack whose top is block 0: a fresh pool hands out blocks in order.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int64_t KvBlockPool::bytes_per_block(const core::ModelConfig& config, int64_t block_size, torch::ScalarType dtype) {
  return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t KvBlockPool::blocks_for_memory(const core::ModelConfig& config, int64_t block_size, torch::ScalarType dtype,
                                       int64_t memory_bytes) {
  const int64_t per_block = bytes_per_block(config, block_size, dtype);
  DSCHAT_CHECK(memory_bytes >= per_block, InvalidArgument, "kv block pool: kv_cache_memory of ", memory_bytes,
               " bytes is below one block of ", block_size, " tokens (", per_block, " bytes)");
  return memory_bytes / per_block;
}

std::optional<int64_t> KvBlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int64_t block = free_.back();
  free_.pop_back();
  reference_counts_[block] = 1;
  return block;
}

void KvBlockPool::check_block(int64_t block, const char* what) const {
  DSCHAT_CHECK(block >= 0 && block < num_blocks(), InvalidArgument, "kv block pool: ", what, " of block ", block,
               " outside [0, ", num_blocks(), ")");
  DSCHAT_CHECK(reference_counts_[block] > 0, InvalidArgument, "kv block pool: ", what, " of block ", block,
               ", which is free");
}

void KvBlockPool::retain(int64_t block) {
  check_block(block, "retain");
  ++reference_counts_[block];
}

void KvBlockPool::release(int64_t block) {
  check_block(block, "release");
  if (--reference_counts_[block] == 0) free_.push_back(block);
}

int64_t KvBlockPool::reference_count(int64_t block) const {
  DSCHAT_CHECK(block >= 0 && block < num_blocks(), InvalidArgument, "kv block pool: block ", block,
               " outside [0, ", num_blocks(), ")");
  return reference_counts_[block];
}

void KvBlockPool::copy_block(int64_t from, int64_t to) {
  check_block(from, "copy");
  check_block(to, "copy");
  storage_.select(2, to).copy_(storage_.select(2, from));  // [L, 2, block_size, H_kv, D]
}

torch::Tensor KvBlockPool::keys(int64_t layer) const {
  return storage_[layer][0].view({num_blocks() * block_size_, -1});  // [N * block_size, H_kv * D]
}

torch::Tensor KvBlockPool::values(int64_t layer) const {
  return storage_[layer][1].view({num_blocks() * block_size_, -1});  // [N * block_size, H_kv * D]
}

}  // namespace inference
}  // namespace dschat
