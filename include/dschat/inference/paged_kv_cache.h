#pragma once
// The nn::KvCache of one forward over sequences whose keys and values live in a KvBlockPool,
// reached through each sequence's block table (vLLM's PagedAttention; the CPU reference path).
//
// Rows may have different cached lengths; every row feeds the same number of new tokens T (a
// decode step: T = 1; a prefill: one row of T tokens). The forward sees them in the left-padded
// frame the models already handle: width W = the longest row's cached length, row r's cached
// tokens right-aligned in columns [W - cached_r, W) and its new ones in [W, W + T), the mask
// (attention_mask()) 1 exactly there, so positions (cumsum of the mask) and every family's masking
// are those of the row alone. append() writes the new keys/values into the rows' blocks and
// gathers each row's slots into that frame; slots left of a row's tokens read some slot of its
// own and are masked.

#include <torch/torch.h>

#include <vector>

#include "dschat/inference/kv_block_pool.h"
#include "dschat/nn/kv_cache.h"

namespace dschat {
namespace inference {

class PagedKvCache : public nn::KvCache {
 public:
  struct Row {
    const std::vector<int64_t>* blocks;  // its block table: token t lives in blocks[t / block_size]
    int64_t cached;                      // tokens already in the blocks
  };
  /// The caller has given each row blocks for cached + new_tokens tokens, and none of the blocks
  /// written to (those holding tokens [cached, cached + new_tokens)) is shared.
  PagedKvCache(KvBlockPool& pool, const std::vector<Row>& rows, int64_t new_tokens);

  /// W: the longest row's cached tokens (the frame's cached columns; the same for every row).
  int64_t cached_length() const override { return width_; }
  /// k, v: [B, H_kv, T, D] -> keys and values of the frame [B, H_kv, W + T, D] each.
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) override;
  /// The rows' lengths are the caller's (each sequence advances its own): nothing to do.
  void commit(int64_t) override {}
  /// A decode step (T = 1) attends through the block tables in place (ops::paged_decode_attention):
  /// stores k, v [B, H_kv, 1, D] and returns attention(q) [B, H, 1, D]. With
  /// gather_for_attention set it returns undefined (append() then gathers; the reference path).
  torch::Tensor attend_decode_step(int64_t layer, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, double scale) override;
  /// Take the gathered reference path for decode steps too (tests compare both).
  bool gather_for_attention = false;

  /// The forward's attention mask [B, W + T] int64 on the pool's device (left-padded frame).
  const torch::Tensor& attention_mask() const { return mask_; }

 private:
  KvBlockPool* pool_;
  int64_t batch_, width_, new_tokens_;
  torch::Tensor write_slots_;  // [B * T] pool slots of the new tokens, row-major
  torch::Tensor read_slots_;   // [B * (W + T)] pool slot of every frame column, row-major
  torch::Tensor mask_;         // [B, W + T]
  std::vector<int64_t> lengths_;  // [B] each row's cached + new tokens
};

}  // namespace inference
}  // namespace dschat
