#pragma once
// Callbacks through which an engine owns the decoder layers' parameters (ZeRO stage 3): a layer's
// parameters are present only between acquire_layer() and release_layer(). The backbone calls
//
//   forward:   begin_forward(); then for each layer i: acquire_layer(i), layer i, release_layer(i)
//   backward:  each layer runs as an activation-checkpointed segment whose recompute is bracketed
//              by acquire_layer(i) ... layer_gradients_ready(i), release_layer(i)
//
// so with grad enabled every layer is recomputed in backward (its parameters cannot stay alive
// from forward to backward otherwise). Without grad (evaluation) only the forward bracket runs.
// A backbone with hooks refuses a grad-enabled forward with a KV cache (core::Unsupported).

#include <cstdint>

namespace dschat {
namespace nn {

class LayerParameterHooks {
 public:
  virtual ~LayerParameterHooks() = default;
  /// At the start of every backbone forward, before the embeddings are read.
  virtual void begin_forward() = 0;
  /// Layer `layer`'s parameters must be materialised until the matching release_layer().
  virtual void acquire_layer(int64_t layer) = 0;
  /// Layer `layer`'s parameters may be freed.
  virtual void release_layer(int64_t layer) = 0;
  /// In backward, after layer `layer`'s recomputed segment has accumulated its parameters'
  /// gradients into their .grad() (called before release_layer(layer)).
  virtual void layer_gradients_ready(int64_t layer) = 0;
};

}  // namespace nn
}  // namespace dschat
