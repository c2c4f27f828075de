#pragma once
// The paged KV cache's storage: one pool of fixed-size blocks per model (vLLM's PagedAttention),
// from which every sequence takes blocks as it grows and to which it returns them when it ends.
//
// Layout: storage [L, 2, N, block_size, H_kv, D] (N blocks), token-major inside a block, so
// layer l's keys (values) seen as [N * block_size, H_kv * D] rows are indexed by slot =
// block * block_size + offset: one index_select gathers a sequence's tokens, one index_copy_
// writes a step's. Blocks are reference-counted: the n samples of one prompt, and prompts sharing
// a prefix, hold the same blocks; a holder about to write into a shared block copies it first
// (copy-on-write, PagedKvCache's caller). Zero-filled at allocation: slots read under a key mask
// never hold NaN bit patterns.

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "dschat/core/model_config.h"

namespace dschat {
namespace inference {

class KvBlockPool {
 public:
  /// `num_blocks` blocks of `block_size` tokens of `config`'s layers and key/value heads.
  KvBlockPool(const core::ModelConfig& config, int64_t num_blocks, int64_t block_size, torch::ScalarType dtype,
              torch::Device device);

  /// Bytes one block takes: 2 (K, V) * L * block_size * H_kv * D * element size.
  static int64_t bytes_per_block(const core::ModelConfig& config, int64_t block_size, torch::ScalarType dtype);
  /// The blocks a memory budget holds (at least 1; throws core::InvalidArgument when the budget is
  /// below one block, naming both numbers).
  static int64_t blocks_for_memory(const core::ModelConfig& config, int64_t block_size, torch::ScalarType dtype,
                                   int64_t memory_bytes);

  /// A free block with reference count 1, or nullopt when none is free.
  std::optional<int64_t> allocate();
  /// One more holder of `block` (a shared prefix, a forked sample).
  void retain(int64_t block);
  /// One holder fewer; the block is free again at zero.
  void release(int64_t block);
  int64_t reference_count(int64_t block) const;
  /// Copies every layer's keys and values of block `from` into block `to` (copy-on-write).
  void copy_block(int64_t from, int64_t to);

  int64_t num_blocks() const { return static_cast<int64_t>(reference_counts_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return storage_.size(0); }
  int64_t bytes() const { return static_cast<int64_t>(storage_.nbytes()); }
  const torch::Tensor& storage() const { return storage_; }

  /// Layer `layer`'s keys / values as [N * block_size, H_kv * D] rows, one per slot (views).
  torch::Tensor keys(int64_t layer) const;
  torch::Tensor values(int64_t layer) const;

 private:
  void check_block(int64_t block, const char* what) const;

  torch::Tensor storage_;                 // [L, 2, N, block_size, H_kv, D]
  int64_t block_size_;
  std::vector<int32_t> reference_counts_;  // [N]
  std::vector<int64_t> free_;              // free blocks; allocate() takes the lowest first
};

}  // namespace inference
}  // namespace dschat
