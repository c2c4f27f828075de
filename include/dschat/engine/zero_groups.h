#pragma once
// How the training engine splits a model's parameters into ZeRO flat groups, and what those
// groups hold per rank, as plain data: the engine builds its groups from group_parameters, and
// `dschat plan` predicts the engine's memory_footprint() from the same grouping without
// allocating anything.
//
//   std::vector<ParameterSpec> specs = ...;  // from a model built on the meta device
//   ZeroGrouping grouping = group_parameters(specs, /*stage=*/3, /*persistence_threshold=*/1e5);
//   MemoryFootprint at_step = footprint_at_step(specs, grouping, {3, /*world=*/4, /*rank=*/0});

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dschat/engine/zero_partition.h"

namespace dschat {
namespace engine {

/// One parameter as ZeRO groups it. `layer`: the decoder layer holding it, -1 outside the layers.
struct ParameterSpec {
  std::string name;
  int64_t numel = 0;
  torch::ScalarType dtype = torch::kFloat32;
  bool trainable = false;
  int64_t layer = -1;
};

/// A flat group: members (indices into the specs, in registration order) of one dtype.
struct GroupSpec {
  std::string label;  // "params/Float", "layer3/Half", "layer3/frozen/Half", "outer/Float", ...
  std::vector<size_t> members;
  torch::ScalarType dtype = torch::kFloat32;
  bool trainable = false;
  bool partitioned = false;  // stage 3: only the owned range is resident between gathers
};

struct ZeroGrouping {
  std::vector<GroupSpec> groups;  // in the engine's construction order
  std::vector<size_t> ungrouped;  // frozen at stages 0-2; small frozen ones at stage 3
};

/// The engine's grouping. Stages 0-2: one replicated group per dtype of the trainable
/// parameters, frozen ones ungrouped. Stage 3: parameters of at most `persistence_threshold`
/// elements form replicated "persistent" groups (trainable) or stay ungrouped (frozen); the rest
/// go into a partitioned trainable and a partitioned frozen group per decoder layer, then the same
/// for the parameters outside the layers ("outer").
ZeroGrouping group_parameters(const std::vector<ParameterSpec>& params, int stage, int64_t persistence_threshold);

struct ZeroPlacement {
  int stage = 0;
  int64_t world_size = 1;
  int64_t rank = 0;
  bool quantize_frozen = false;  // stage 3's zero_quantized_nontrainable_weights: frozen partitions as int8
};

/// The ranks that own a group's flat buffer: 1 at stage 0 (everyone owns everything), the world
/// otherwise.
int64_t owner_world(int stage, int64_t world_size);

/// What rank `placement.rank` holds at an optimizer step (after the window's last backward and
/// its reduction, before the update, with the Adam moments of an earlier step present), in the
/// categories of TrainingEngine::memory_footprint(): parameters in the model dtype (replicated
/// flat buffers padded to the owner world, or the owned partition), fp32 gradients (the whole
/// flat buffer where one rank owns it, stage 1's kept buffer plus its partition, the partition at
/// stages 2-3) and the optimizer (two fp32 moments per owned element, an fp32 master of the owned
/// range unless the model is fp32).
MemoryFootprint footprint_at_step(const std::vector<ParameterSpec>& params, const ZeroGrouping& grouping,
                                  const ZeroPlacement& placement);

/// The layout of one group for `placement` (its members' numels, padded for the owner world).
FlatLayout group_layout(const std::vector<ParameterSpec>& params, const GroupSpec& group,
                        const ZeroPlacement& placement);

}  // namespace engine
}  // namespace dschat
