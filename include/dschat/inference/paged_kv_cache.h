#pragma once
// The nn::KvCache of one forward over sequences whose keys and values live in a KvBlockPool,
// reached through each sequence's block table (vLLM's PagedAttention; the CPU reference path).
//
// Rows may have different cached lengths and feed different numbers of new tokens (a decode
// step: 1 each; a batched prefill: each prompt's chunk). The forward sees them in a padded frame
// the models already handle: W = the longest row's cached length, T = the most new tokens of a
// row; row r's cached tokens right-aligned in columns [W - cached_r, W) and its new_r new ones
// right-aligned in [W + T - new_r, W + T), the mask (attention_mask()) 1 exactly there. Positions
// (cumsum of the mask), causal masking, sliding windows and ALiBi (all computed from the mask)
// are then those of the row alone; the padding columns between are masked. The caller feeds row
// r's ids in the last new_r of its T columns (the others: any id, e.g. the pad id). append()
// writes the real new keys/values into the rows' blocks (padding columns are not stored) and
// gathers each row's slots into that frame; padding columns read some slot of the row's own.

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
  /// Row r feeds new_tokens[r] >= 1 tokens (a batched prefill of several prompts' chunks).
  PagedKvCache(KvBlockPool& pool, const std::vector<Row>& rows, const std::vector<int64_t>& new_tokens);
  /// A decode step (one new token per row) over index tensors the caller filled, on the pool's
  /// device: write_slots [B], read_slots [B * (W + 1)], mask [B, W + 1] as this class lays them
  /// out, lengths [B] each row's cached + 1 (the CPU kernel's). The CUDA-graph decode keeps them in
  /// static buffers of a fixed W (src/inference/paged_decode_graph.h).
  PagedKvCache(KvBlockPool& pool, torch::Tensor write_slots, torch::Tensor read_slots, torch::Tensor mask,
               std::vector<int64_t> lengths);

  /// W: the longest row's cached tokens (the frame's cached columns; the same for every row).
  int64_t cached_length() const override { return width_; }
  /// T: the most new tokens of a row (the forward's input width).
  int64_t new_tokens() const { return new_tokens_; }
  /// Whether some column of the frame is padding (rows of different cached or new lengths).
  bool padded() const { return padded_; }
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
  bool padded_ = false;
  torch::Tensor write_slots_;  // [N] pool slots of the real new tokens (N = sum of new_r), row-major
  torch::Tensor write_rows_;   // [N] their rows of the flattened [B * T] new tokens (undefined: all, no padding)
  torch::Tensor read_slots_;   // [B * (W + T)] pool slot of every frame column, row-major
  torch::Tensor mask_;         // [B, W + T]
  std::vector<int64_t> lengths_;  // [B] each row's cached + new tokens
};

}  // namespace inference
}  // namespace dschat
