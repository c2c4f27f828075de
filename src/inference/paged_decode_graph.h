#pragma once
// Private to src/inference: the continuous engine's decode step in a fixed-shape layout a CUDA
// graph can replay, and the graphs themselves (docs/inference.md, "CUDA graphs").
//
// PagedKvCache lays a decode step out as a frame [B, W + 1] with W the step's longest cached row,
// so the shapes change every step. Here the frame has a fixed width and batch, chosen from a few
// buckets: B rows padded to the next power of two (Bp), W to a power-of-two number of blocks
// (Wp >= every row's cached tokens). Everything that changes between steps lives in static
// buffers refilled before each replay:
//   ids         [Bp, 1]          each row's last token;
//   write_slots [Bp]             the pool slot its key/value goes to;
//   read_slots  [Bp * (Wp + 1)]  the pool slot of every frame column: row r's c cached tokens in
//                                columns [Wp - c, Wp), its new one in column Wp;
//   mask        [Bp, Wp + 1]     1 exactly on those columns.
// Columns left of a row's tokens, and every column of a padding row, read a scratch slot (a free
// block of the pool taken for the step and given back after it); a padding row (id 0, its token
// alone in column Wp) writes its key/value there. Positions (cumsum of the mask), masking and the
// attention over each row's keys are then the row's own: on the CPU the step computes the bits of
// PagedKvCache's frame (the decode-attention loop reads each row's last cached + 1 columns either
// way), which is what the eager mode (no capture, any device) lets the tests check without a GPU.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "dschat/inference/kv_block_pool.h"
#include "dschat/inference/paged_kv_cache.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace inference {

class PagedDecodeGraphs {
 public:
  explicit PagedDecodeGraphs(KvBlockPool& pool);
  ~PagedDecodeGraphs();

  /// Whether this build can capture CUDA graphs (it was compiled with CUDA).
  static bool compiled();

  /// Drops every captured graph and static buffer (their model's parameters or pool are gone).
  void reset();

  /// One decode step of `rows` (each one's block table and cached tokens; its blocks hold room for
  /// the new token) whose last tokens are `ids`, in the fixed-shape layout. With `capture` (a
  /// CUDA pool) it replays the bucket's graph, capturing it on first use; without, it runs the
  /// layout eagerly on any device. Returns logits [B, V] float32 (with a graph: a view of its
  /// static output, overwritten by the next step), or an undefined tensor when the step cannot
  /// run this way (no free block for the scratch slot, or the capture failed: the caller decodes
  /// through PagedKvCache's own frame; a failed bucket is not tried again until reset).
  torch::Tensor step(models::CausalLM& model, const std::vector<PagedKvCache::Row>& rows,
                     const std::vector<int64_t>& ids, bool capture);

  int64_t replays() const;   // steps served by a graph since construction
  int64_t captures() const;  // graphs captured since construction

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inference
}  // namespace dschat
