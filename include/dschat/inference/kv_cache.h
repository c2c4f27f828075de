#pragma once
// A contiguous key/value cache for incremental decoding, owned by the caller of the model: the
// first `batch` rows of a KvWorkspace (layout there: per layer, keys and values
// [B, H_kv, max_tokens, D]); the first cached_length() token slots are filled, and append()
// returns views of exactly those plus the new ones, so attention reads no unused slot.

#include <torch/torch.h>

#include <memory>

#include "dschat/core/model_config.h"
#include "dschat/inference/kv_workspace.h"
#include "dschat/nn/kv_cache.h"

namespace dschat {
namespace inference {

class ContiguousKvCache : public nn::KvCache {
 public:
  /// With a workspace of its own, allocated now (one-off callers and tests).
  ContiguousKvCache(const core::ModelConfig& config, int64_t batch, int64_t max_tokens, torch::ScalarType dtype,
                    torch::Device device);
  /// Rows [0, batch) of `workspace`, which is not owned and must outlive this cache (the
  /// inference engine's). Starts empty.
  ContiguousKvCache(const KvWorkspace& workspace, int64_t batch);

  int64_t cached_length() const override { return length_; }
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) override;
  void commit(int64_t new_tokens) override;
  int64_t capacity() const { return workspace_->max_tokens(); }
  int64_t batch() const { return batch_; }

  /// n samples per prompt from one prefill: the filled slots [0, cached_length()) of row b are
  /// copied to rows [b * n, (b + 1) * n), and the cache then covers batch() * n rows (a prompt's
  /// copies adjacent, as repeat_for_return_sequences lays out the prompts). Throws
  /// core::InvalidArgument when batch() * n rows exceed the workspace's capacity.
  void repeat_rows(int64_t n);

 private:
  std::shared_ptr<KvWorkspace> owned_;  // set by the first constructor only
  const KvWorkspace* workspace_;        // owned_ or the caller's
  int64_t batch_;
  int64_t length_ = 0;
};

}  // namespace inference
}  // namespace dschat
