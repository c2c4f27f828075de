#include "dschat/engine/zero_partition.h"

#include <algorithm>

#include "dschat/core/error.h"

namespace dschat {
namespace engine {
namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

ElementRange intersect(const ElementRange& a, const ElementRange& b) {
  const int64_t begin = std::max(a.begin, b.begin);
  const int64_t end = std::min(a.end, b.end);
  return end > begin ? ElementRange{begin, end} : ElementRange{begin, begin};
}

ElementRange FlatLayout::partition(int64_t rank) const {
  DSCHAT_CHECK(rank >= 0 && rank < world_size, InvalidArgument, "ZeRO partition: rank ", rank,
               " is out of range for world size ", world_size);
  const int64_t size = partition_numel();
  return {rank * size, (rank + 1) * size};
}

FlatLayout plan_flat_layout(const std::vector<std::pair<std::string, int64_t>>& named_numels, int64_t world_size) {
  DSCHAT_CHECK(world_size >= 1, InvalidArgument, "ZeRO partition: world size must be >= 1, got ", world_size);
  FlatLayout layout;
  layout.world_size = world_size;
  for (const auto& [name, numel] : named_numels) {
    DSCHAT_CHECK(numel >= 0, InvalidArgument, "ZeRO partition: parameter '", name, "' has negative size ", numel);
    layout.slots.push_back({name, numel, layout.numel});
    layout.numel += numel;
  }
  // An empty group still gets one element per rank, so every rank has a (padding) partition.
  layout.padded_numel = round_up(std::max<int64_t>(layout.numel, 1), world_size);
  return layout;
}

std::vector<Piece> pieces_in_range(const FlatLayout& layout, const ElementRange& range) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    const FlatSlot& slot = layout.slots[i];
    const ElementRange overlap = intersect(slot.range(), range);
    if (overlap.size() == 0) continue;
    pieces.push_back({i, overlap.begin - slot.offset, overlap.begin - range.begin, overlap.size()});
  }
  return pieces;
}

std::vector<ElementRange> split_into_chunks(int64_t total, int64_t chunk) {
  DSCHAT_CHECK(chunk >= 1, InvalidArgument, "ZeRO buckets: chunk size must be >= 1, got ", chunk);
  std::vector<ElementRange> chunks;
  for (int64_t begin = 0; begin < total; begin += chunk) chunks.push_back({begin, std::min(total, begin + chunk)});
  return chunks;
}

std::vector<ElementRange> partition_column_buckets(const FlatLayout& layout, int64_t bucket_elements) {
  DSCHAT_CHECK(bucket_elements >= 1, InvalidArgument, "ZeRO buckets: bucket size must be >= 1 element, got ",
               bucket_elements);
  const int64_t columns = std::max<int64_t>(1, bucket_elements / layout.world_size);
  return split_into_chunks(layout.partition_numel(), columns);
}

MemoryFootprint theoretical_footprint(int stage, int64_t num_params, int64_t param_bytes, int64_t world_size) {
  DSCHAT_CHECK(stage >= 0 && stage <= 3, InvalidArgument, "ZeRO footprint: stage must be 0..3, got ", stage);
  DSCHAT_CHECK(param_bytes == 2 || param_bytes == 4, InvalidArgument,
               "ZeRO footprint: parameter bytes must be 2 or 4, got ", param_bytes);
  DSCHAT_CHECK(world_size >= 1 && num_params >= 0, InvalidArgument, "ZeRO footprint: bad sizes (", num_params,
               " parameters, world ", world_size, ")");
  const int64_t partition = round_up(std::max<int64_t>(num_params, 1), world_size) / world_size;
  const bool reduced = param_bytes == 2;
  const int64_t grad_bytes = reduced ? 4 : param_bytes;           // fp32 accumulators for bf16/fp16
  const int64_t optimizer_per_param = 8 + (reduced ? 4 : 0);      // m, v (+ fp32 master)
  MemoryFootprint footprint;
  footprint.parameter_bytes = (stage >= 3 ? partition : num_params) * param_bytes;
  footprint.gradient_bytes = (stage >= 2 ? partition : num_params) * grad_bytes;
  footprint.optimizer_bytes = (stage >= 1 ? partition : num_params) * optimizer_per_param;
  return footprint;
}

}  // namespace engine
}  // namespace dschat
