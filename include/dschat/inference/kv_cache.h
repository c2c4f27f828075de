#pragma once
// A contiguous key/value cache for incremental decoding, owned by the caller of the model.
// Layout: per layer, keys and values [B, H_kv, max_tokens, D]; the first cached_length() token
// slots are filled. One allocation per tensor, made up front from max_tokens.

#include <torch/torch.h>

#include <vector>

#include "dschat/core/model_config.h"
#include "dschat/nn/kv_cache.h"

namespace dschat {
namespace inference {

class ContiguousKvCache : public nn::KvCache {
 public:
  ContiguousKvCache(const core::ModelConfig& config, int64_t batch, int64_t max_tokens, torch::ScalarType dtype,
                    torch::Device device);

  int64_t cached_length() const override { return length_; }
  std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k, const torch::Tensor& v) override;
  void commit(int64_t new_tokens) override;
  int64_t capacity() const { return max_tokens_; }

 private:
  std::vector<torch::Tensor> keys_;    // [L] x [B, H_kv, max_tokens, D]
  std::vector<torch::Tensor> values_;  // [L] x [B, H_kv, max_tokens, D]
  int64_t max_tokens_;
  int64_t length_ = 0;
};

}  // namespace inference
}  // namespace dschat
