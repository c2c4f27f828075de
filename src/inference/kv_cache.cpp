#include "dschat/inference/kv_cache.h"

#include "dschat/core/error.h"

namespace dschat {
namespace inference {

ContiguousKvCache::ContiguousKvCache(const core::ModelConfig& config, int64_t batch, int64_t max_tokens,
                                     torch::ScalarType dtype, torch::Device device)
    : max_tokens_(max_tokens) {
  auto options = torch::dtype(dtype).device(device);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    keys_.push_back(torch::empty({batch, config.num_key_value_heads, max_tokens, config.head_dim}, options));
    values_.push_back(torch::empty({batch, config.num_key_value_heads, max_tokens, config.head_dim}, options));
  }
}

std::pair<torch::Tensor, torch::Tensor> ContiguousKvCache::append(int64_t layer, const torch::Tensor& k,
                                                                  const torch::Tensor& v) {
  DSCHAT_CHECK(layer >= 0 && layer < static_cast<int64_t>(keys_.size()), InvalidArgument, "kv cache: layer ", layer,
               " out of range [0, ", keys_.size(), ")");
  const int64_t steps = k.size(2);
  DSCHAT_CHECK(length_ + steps <= max_tokens_, InvalidArgument, "kv cache: ", length_, " cached + ", steps,
               " new tokens exceed the capacity of ", max_tokens_, " tokens");
  keys_[layer].narrow(2, length_, steps).copy_(k);
  values_[layer].narrow(2, length_, steps).copy_(v);
  return {keys_[layer].narrow(2, 0, length_ + steps), values_[layer].narrow(2, 0, length_ + steps)};
}

void ContiguousKvCache::commit(int64_t new_tokens) { length_ += new_tokens; }

}  // namespace inference
}  // namespace dschat
