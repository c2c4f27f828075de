#include "dschat/engine/zero_groups.h"

#include <map>

#include "dschat/core/error.h"
#include "engine/quantized_weights.h"

namespace dschat {
namespace engine {
namespace {

int64_t element_bytes(torch::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// Appends one group per dtype of `members` (dtypes in ScalarType order, as the engine splits them).
void add_groups(ZeroGrouping& grouping, const std::vector<ParameterSpec>& params, const std::string& label,
                const std::vector<size_t>& members, bool trainable, bool partitioned) {
  std::map<torch::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t index : members) by_dtype[params[index].dtype].push_back(index);
  for (auto& [dtype, indices] : by_dtype) {
    grouping.groups.push_back({label + "/" + std::string(c10::toString(dtype)), std::move(indices), dtype, trainable,
                               partitioned});
  }
}

}  // namespace

int64_t owner_world(int stage, int64_t world_size) { return stage == 0 ? 1 : world_size; }

ZeroGrouping group_parameters(const std::vector<ParameterSpec>& params, int stage, int64_t persistence_threshold) {
  DSCHAT_CHECK(stage >= 0 && stage <= 3, InvalidArgument, "ZeRO grouping: stage must be 0..3, got ", stage);
  ZeroGrouping grouping;
  if (stage < 3) {
    std::vector<size_t> trainable;
    for (size_t i = 0; i < params.size(); ++i) (params[i].trainable ? trainable : grouping.ungrouped).push_back(i);
    add_groups(grouping, params, "params", trainable, true, false);
    return grouping;
  }
  int64_t layers = 0;
  for (const ParameterSpec& p : params) layers = std::max(layers, p.layer + 1);
  std::vector<std::vector<size_t>> layer_trainable(layers), layer_frozen(layers);
  std::vector<size_t> outer_trainable, outer_frozen, persistent;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterSpec& p = params[i];
    if (p.numel <= persistence_threshold) {
      (p.trainable ? persistent : grouping.ungrouped).push_back(i);
    } else if (p.layer < 0) {
      (p.trainable ? outer_trainable : outer_frozen).push_back(i);
    } else {
      (p.trainable ? layer_trainable : layer_frozen)[p.layer].push_back(i);
    }
  }
  add_groups(grouping, params, "persistent", persistent, true, false);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string label = "layer" + std::to_string(i);
    add_groups(grouping, params, label, layer_trainable[i], true, true);
    add_groups(grouping, params, label + "/frozen", layer_frozen[i], false, true);
  }
  add_groups(grouping, params, "outer", outer_trainable, true, true);
  add_groups(grouping, params, "outer/frozen", outer_frozen, false, true);
  return grouping;
}

FlatLayout group_layout(const std::vector<ParameterSpec>& params, const GroupSpec& group,
                        const ZeroPlacement& placement) {
  std::vector<std::pair<std::string, int64_t>> named;
  for (size_t index : group.members) named.emplace_back(params[index].name, params[index].numel);
  return plan_flat_layout(named, owner_world(placement.stage, placement.world_size));
}

MemoryFootprint footprint_at_step(const std::vector<ParameterSpec>& params, const ZeroGrouping& grouping,
                                  const ZeroPlacement& placement) {
  DSCHAT_CHECK(placement.world_size >= 1 && placement.rank >= 0 && placement.rank < placement.world_size,
               InvalidArgument, "ZeRO footprint: rank ", placement.rank, " is outside a world of ",
               placement.world_size);
  const int64_t owners = owner_world(placement.stage, placement.world_size);
  const int64_t owner_rank = owners == 1 ? 0 : placement.rank;
  MemoryFootprint bytes;
  for (const GroupSpec& group : grouping.groups) {
    const FlatLayout layout = group_layout(params, group, placement);
    const int64_t owned = layout.partition_numel();
    if (group.partitioned && !group.trainable && placement.quantize_frozen && c10::isFloatingType(group.dtype)) {
      // int8 groups and one fp32 scale per group (engine/quantized_weights.h).
      bytes.parameter_bytes += quant_groups(owned) * (kQuantGroupElements + 4);
    } else {
      bytes.parameter_bytes += (group.partitioned ? owned : layout.padded_numel) * element_bytes(group.dtype);
    }
    if (!group.trainable) continue;
    // Gradients (fp32): one owner keeps the whole buffer; stage 1 keeps it and its partition.
    if (owners == 1) {
      bytes.gradient_bytes += layout.padded_numel * 4;
    } else {
      bytes.gradient_bytes += owned * 4 + (placement.stage == 1 ? layout.padded_numel * 4 : 0);
    }
    int64_t owned_elements = 0;  // the padding has no moments
    for (const Piece& piece : pieces_in_range(layout, layout.partition(owner_rank))) owned_elements += piece.numel;
    bytes.optimizer_bytes += owned_elements * 8 + (group.dtype == torch::kFloat32 ? 0 : owned * 4);
  }
  for (size_t index : grouping.ungrouped) bytes.parameter_bytes += params[index].numel * element_bytes(params[index].dtype);
  return bytes;
}

}  // namespace engine
}  // namespace dschat
