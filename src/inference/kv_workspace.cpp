#include "dschat/inference/kv_workspace.h"

#include "dschat/core/error.h"

namespace dschat {
namespace inference {

bool KvWorkspace::reserve(const core::ModelConfig& config, int64_t batch, int64_t max_tokens,
                          torch::ScalarType dtype, torch::Device device) {
  DSCHAT_CHECK(batch >= 1 && max_tokens >= 1, InvalidArgument, "kv workspace: batch (", batch,
               ") and max_tokens (", max_tokens, ") must be positive");
  const int64_t layers = config.num_hidden_layers, heads = config.num_key_value_heads, dim = config.head_dim;
  if (allocated() && buffer_.size(0) == layers && buffer_.size(3) == heads && buffer_.size(4) == max_tokens &&
      buffer_.size(5) == dim && buffer_.scalar_type() == dtype && buffer_.device() == device &&
      batch <= batch_capacity()) {
    return false;
  }
  const int64_t capacity = std::max({batch, batch_capacity(), released_capacity_});
  // Free first: the old and the new buffer never coexist, so growing does not double the peak.
  buffer_ = torch::Tensor();
  buffer_ = torch::zeros({layers, 2, capacity, heads, max_tokens, dim}, torch::dtype(dtype).device(device));
  released_capacity_ = 0;
  return true;
}

void KvWorkspace::release() {
  released_capacity_ = std::max(released_capacity_, batch_capacity());
  buffer_ = torch::Tensor();
}

torch::Tensor KvWorkspace::slice(int64_t layer, int64_t which, int64_t batch) const {
  DSCHAT_CHECK(allocated(), InvalidArgument, "kv workspace: used after release() without a reserve()");
  DSCHAT_CHECK(layer >= 0 && layer < num_layers(), InvalidArgument, "kv cache: layer ", layer, " out of range [0, ",
               num_layers(), ")");
  DSCHAT_CHECK(batch >= 1 && batch <= batch_capacity(), InvalidArgument, "kv workspace: batch ", batch,
               " exceeds its capacity of ", batch_capacity(), " rows");
  return buffer_[layer][which].narrow(0, 0, batch);  // [batch, H_kv, M, D], contiguous
}

torch::Tensor KvWorkspace::keys(int64_t layer, int64_t batch) const { return slice(layer, 0, batch); }

torch::Tensor KvWorkspace::values(int64_t layer, int64_t batch) const { return slice(layer, 1, batch); }

}  // namespace inference
}  // namespace dschat
