#pragma once
// ZeRO stage 3's parameter lifetimes (internal): the backbone calls these around every decoder
// layer (nn/layer_hooks.h). A layer's groups are all-gathered on acquire and freed on release;
// in backward, once the recomputed layer has produced its gradients, they are reduce-scattered
// into this rank's partition at once, so no full gradient outlives its layer. The groups outside
// the layers are gathered at begin_forward and stay until the optimizer step releases them.
//
// Prefetch (stage3_prefetch_bucket_size, stage3_max_live_parameters): after acquiring layer i,
// the next layer in the direction of travel (i + 1 in forward, i - 1 in backward) is gathered
// ahead when it fits in the prefetch bucket and the live total stays under the limit, so its
// all-gather is not on the critical path of the next acquire.

#include <cstdint>
#include <vector>

#include "dschat/nn/layer_hooks.h"
#include "engine/flat_group.h"

namespace dschat {
namespace engine {

class Zero3LayerHooks : public nn::LayerParameterHooks {
 public:
  Zero3LayerHooks(std::vector<std::vector<FlatParameterGroup*>> layer_groups,
                  std::vector<FlatParameterGroup*> outer_groups, int64_t prefetch_bucket_elements,
                  int64_t max_live_elements);

  void begin_forward() override;
  void acquire_layer(int64_t layer) override;
  void release_layer(int64_t layer) override;
  void layer_gradients_ready(int64_t layer) override;

  /// Frees the outer groups and any prefetched layer (called by the optimizer step).
  void release_all();
  /// Elements of the layer groups currently materialised.
  int64_t live_elements() const;

 private:
  int64_t layer_elements(int64_t layer) const;
  void gather_layer(int64_t layer);
  void maybe_prefetch(int64_t layer);

  std::vector<std::vector<FlatParameterGroup*>> layer_groups_;
  std::vector<FlatParameterGroup*> outer_groups_;
  int64_t prefetch_bucket_elements_;
  int64_t max_live_elements_;
  int64_t last_acquired_ = -1;
  bool in_backward_ = false;
};

}  // namespace engine
}  // namespace dschat
