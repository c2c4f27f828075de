#pragma once
// The interface through which attention layers read and extend a key/value cache during
// incremental decoding. Models keep no runtime state: the cache object is created and owned by
// the inference engine and passed into each forward call.

#include <torch/torch.h>

#include <utility>

namespace dschat {
namespace nn {

class KvCache {
 public:
  virtual ~KvCache() = default;

  /// Tokens already cached before the current forward call (same for every layer and row).
  virtual int64_t cached_length() const = 0;

  /// Stores this step's keys/values for `layer` and returns the keys/values of all cached tokens
  /// plus this step's: k, v: [B, H_kv, T_new, D] -> ([B, H_kv, T_cached + T_new, D], same).
  virtual std::pair<torch::Tensor, torch::Tensor> append(int64_t layer, const torch::Tensor& k,
                                                         const torch::Tensor& v) = 0;

  /// Called by the model after all layers ran: the new tokens now count as cached.
  virtual void commit(int64_t new_tokens) = 0;

  /// A single-token step's attention computed by the cache itself, reading its own storage in
  /// place (the paged cache: through its block tables, no gathered copy). Stores k, v as append()
  /// would and returns softmax(q k^T * scale) v over every cached key of each row plus the new
  /// one: q [B, H, 1, D], k, v [B, H_kv, 1, D] -> [B, H, 1, D]. Undefined (nothing stored) when
  /// the cache does not do this; the caller then appends and attends itself. Only called for
  /// plain causal attention (no ALiBi, no sliding window).
  virtual torch::Tensor attend_decode_step(int64_t /*layer*/, const torch::Tensor& /*q*/, const torch::Tensor& /*k*/,
                                           const torch::Tensor& /*v*/, double /*scale*/) {
    return {};
  }
};

}  // namespace nn
}  // namespace dschat
