#pragma once
// The inference engine's key/value memory: ONE allocation holding every layer's keys and values
// for up to `batch_capacity` rows of `max_tokens` tokens (prompt + generated), reused across
// generate calls (DeepSpeed's InferenceContext workspace, §2.3 of the runtime reference).
//
// Layout: buffer [L, 2, B_cap, H_kv, M, D] (M = max_tokens): layer l's keys are buffer[l][0] and
// its values buffer[l][1], so one layer's K and V are adjacent; a batch of B <= B_cap rows uses
// rows [0, B) of each, a contiguous [B, H_kv, M, D] block. Slot t of row b holds the token at
// sequence index t of that (left-padded) row.
//
// The buffer is zero-filled when allocated: a decode step that reads every slot under a key mask
// (the CUDA-graph path) must never meet NaN bit patterns left in reused memory.

#include <torch/torch.h>

#include "dschat/core/model_config.h"

namespace dschat {
namespace inference {

class KvWorkspace {
 public:
  /// Makes room for `batch` rows of `max_tokens` tokens of `config`'s layers in dtype/device.
  /// Keeps the allocation when it already fits (same layers, heads, head size, tokens, dtype and
  /// device, batch <= capacity); otherwise frees it and allocates [L, 2, B, H_kv, M, D], where B
  /// is the larger of `batch` and the capacity before a release (so a retake after
  /// release() takes the same bytes). Returns true when it allocated.
  bool reserve(const core::ModelConfig& config, int64_t batch, int64_t max_tokens, torch::ScalarType dtype,
               torch::Device device);
  /// Frees the memory; the next reserve() takes it again.
  void release();

  bool allocated() const { return buffer_.defined(); }
  int64_t bytes() const { return allocated() ? static_cast<int64_t>(buffer_.nbytes()) : 0; }
  int64_t batch_capacity() const { return allocated() ? buffer_.size(2) : 0; }
  int64_t max_tokens() const { return allocated() ? buffer_.size(4) : 0; }
  int64_t num_layers() const { return allocated() ? buffer_.size(0) : 0; }
  /// The start of the allocation (nullptr when released): captured CUDA graphs hold it.
  const void* data() const { return allocated() ? buffer_.data_ptr() : nullptr; }

  /// Layer `layer`'s keys / values for the first `batch` rows: [batch, H_kv, M, D] views.
  torch::Tensor keys(int64_t layer, int64_t batch) const;
  torch::Tensor values(int64_t layer, int64_t batch) const;

 private:
  torch::Tensor slice(int64_t layer, int64_t which, int64_t batch) const;

  torch::Tensor buffer_;          // [L, 2, B_cap, H_kv, M, D]
  int64_t released_capacity_ = 0; // B_cap before the last release(), retaken by the next reserve()
};

}  // namespace inference
}  // namespace dschat
