#include "engine/zero3_hooks.h"

#include "dschat/core/error.h"

namespace dschat {
namespace engine {

Zero3LayerHooks::Zero3LayerHooks(std::vector<std::vector<FlatParameterGroup*>> layer_groups,
                                 std::vector<FlatParameterGroup*> outer_groups, int64_t prefetch_bucket_elements,
                                 int64_t max_live_elements)
    : layer_groups_(std::move(layer_groups)),
      outer_groups_(std::move(outer_groups)),
      prefetch_bucket_elements_(prefetch_bucket_elements),
      max_live_elements_(max_live_elements) {}

int64_t Zero3LayerHooks::layer_elements(int64_t layer) const {
  int64_t elements = 0;
  for (const FlatParameterGroup* group : layer_groups_[layer]) elements += group->layout().padded_numel;
  return elements;
}

int64_t Zero3LayerHooks::live_elements() const {
  int64_t live = 0;
  for (size_t layer = 0; layer < layer_groups_.size(); ++layer) {
    for (const FlatParameterGroup* group : layer_groups_[layer]) {
      if (group->gathered() || group->gather_pending()) live += group->layout().padded_numel;
    }
  }
  return live;
}

void Zero3LayerHooks::begin_forward() {
  in_backward_ = false;
  last_acquired_ = -1;
  for (FlatParameterGroup* group : outer_groups_) group->gather();
}

void Zero3LayerHooks::gather_layer(int64_t layer) {
  DSCHAT_CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_groups_.size()), InvalidArgument,
               "ZeRO-3: the model ran layer ", layer, " but the engine knows ", layer_groups_.size(), " layers");
  for (FlatParameterGroup* group : layer_groups_[layer]) group->begin_gather();
  for (FlatParameterGroup* group : layer_groups_[layer]) group->finish_gather();
}

void Zero3LayerHooks::maybe_prefetch(int64_t layer) {
  const int64_t next = in_backward_ ? layer - 1 : layer + 1;
  if (next < 0 || next >= static_cast<int64_t>(layer_groups_.size()) || prefetch_bucket_elements_ <= 0) return;
  const int64_t size = layer_elements(next);
  if (size > prefetch_bucket_elements_ || live_elements() + size > max_live_elements_) return;
  // Every rank takes the same decision from the same sizes, so the collectives stay in step.
  for (FlatParameterGroup* group : layer_groups_[next]) group->begin_gather();
}

void Zero3LayerHooks::acquire_layer(int64_t layer) {
  // Backward recomputes the layers last to first: an acquire below the last one means backward.
  if (last_acquired_ >= 0 && layer < last_acquired_) in_backward_ = true;
  last_acquired_ = layer;
  gather_layer(layer);
  maybe_prefetch(layer);
}

void Zero3LayerHooks::release_layer(int64_t layer) {
  for (FlatParameterGroup* group : layer_groups_[layer]) group->release();
}

void Zero3LayerHooks::layer_gradients_ready(int64_t layer) {
  in_backward_ = true;
  for (FlatParameterGroup* group : layer_groups_[layer]) group->reduce_gradients();
}

void Zero3LayerHooks::release_all() {
  for (auto& groups : layer_groups_) {
    for (FlatParameterGroup* group : groups) group->release();
  }
  for (FlatParameterGroup* group : outer_groups_) group->release();
  last_acquired_ = -1;
  in_backward_ = false;
}

}  // namespace engine
}  // namespace dschat
