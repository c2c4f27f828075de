#pragma once
// Private to src/inference: the decode step in the "full-capacity" layout that a CUDA graph can
// replay, and the per-batch-size graphs themselves (docs/inference.md).
//
// A replayed graph sees the same shapes and addresses every time, so the step cannot narrow the
// cache to the tokens cached so far. Instead it runs over every slot of the workspace
// [B, H_kv, M, D] (M = max_out_tokens) with a key mask, and everything that changes between steps
// lives in static device buffers that are refilled before each replay:
//   ids  [B, 1]  the current token;
//   slot [1]     its sequence index p: keys/values are appended there with index_copy_ (a device
//                index, so no host value is baked into the graph);
//   mask [B, M]  columns [0, p) the attention mask so far, column M - 1 the current token's flag,
//                zeros elsewhere.
// The model derives positions from the mask's last column (cumsum - 1) and checks that the mask
// covers cached + new tokens, so the step presents itself as "M - 1 cached + 1 new": slot M - 1 is
// a scratch slot that also receives the current key/value (while slot p stays masked in this
// step). Hence positions, masking and attention equal those of the narrowed eager step; only the
// summation length of the attention differs (masked slots contribute exact zeros). Slot M - 1 is
// never a real slot: prompt + max_new_tokens <= M leaves sequence index p <= M - 2.

#include <torch/torch.h>

#include <memory>

#include "dschat/inference/kv_workspace.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace inference {

class DecodeGraphs {
 public:
  DecodeGraphs();
  ~DecodeGraphs();

  /// Whether this build can capture CUDA graphs (it was compiled with CUDA).
  static bool compiled();

  /// Drops every captured graph and static buffer.
  void reset();

  /// One decode step in the full-capacity layout. step_input [B, 1]; mask [B, S] int64, the
  /// attention mask so far whose last column is the current token's (S = p + 1). With `capture`
  /// (CUDA tensors only) the step replays this batch size's graph, capturing it on first use;
  /// without, it runs the same layout eagerly on any device. Returns logits [B, V] float32 (with
  /// a graph: its static output, overwritten by the next step), or an undefined tensor when the
  /// capture failed (the caller decodes eagerly; this batch size is not tried again until reset).
  torch::Tensor step(models::CausalLM& model, const KvWorkspace& workspace, const torch::Tensor& step_input,
                     const torch::Tensor& mask, bool capture);

  int64_t replays() const;  // steps served by a graph since construction
  int64_t captures() const;  // graphs captured since construction

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inference
}  // namespace dschat
