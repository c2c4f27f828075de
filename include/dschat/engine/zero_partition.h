#pragma once
// ZeRO's shard arithmetic as plain functions. A group of parameters is laid out back to back in
// one flat buffer (registration order), padded to a multiple of the world size; rank r owns the
// contiguous range [r * P, (r + 1) * P) with P = padded / world, as DeepSpeed's stage 1/2
// partitions a flat fp32 group. A parameter may straddle ranks; the part of it that falls in a
// rank's range is a "piece". Buckets cut a collective into rounds of at most `bucket_elements`.
//
//   FlatLayout layout = plan_flat_layout({{"w", 6}, {"b", 3}}, /*world=*/2);  // numel 9, padded 10
//   ElementRange mine = layout.partition(1);                                  // [5, 10)
//   std::vector<Piece> pieces = pieces_in_range(layout, mine);                // w[5,6) b[0,3)

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace engine {

/// [begin, end) in elements.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ElementRange& other) const { return begin == other.begin && end == other.end; }
};

/// The intersection of two ranges (empty, begin == end, when disjoint).
ElementRange intersect(const ElementRange& a, const ElementRange& b);

struct FlatSlot {
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;  // first element in the flat buffer
  ElementRange range() const { return {offset, offset + numel}; }
};

struct FlatLayout {
  std::vector<FlatSlot> slots;
  int64_t world_size = 1;
  int64_t numel = 0;         // sum of the slots
  int64_t padded_numel = 0;  // numel rounded up to a multiple of world_size
  int64_t partition_numel() const { return padded_numel / world_size; }
  /// Rank `rank`'s range of the flat buffer; throws core::InvalidArgument out of [0, world).
  ElementRange partition(int64_t rank) const;
};

/// Slots in the given order, padded for `world_size` ranks. Throws core::InvalidArgument for a
/// world size < 1 or a negative numel.
FlatLayout plan_flat_layout(const std::vector<std::pair<std::string, int64_t>>& named_numels, int64_t world_size);

/// The part of one slot that lies in a range of the flat buffer.
struct Piece {
  size_t slot = 0;            // index into FlatLayout::slots
  int64_t slot_offset = 0;    // first element within the parameter (flattened)
  int64_t range_offset = 0;   // first element within the range
  int64_t numel = 0;
};

/// The non-empty pieces of every slot inside `range`, in slot order.
std::vector<Piece> pieces_in_range(const FlatLayout& layout, const ElementRange& range);

/// Cuts [0, total) into consecutive chunks of at most `chunk` elements (chunk >= 1).
std::vector<ElementRange> split_into_chunks(int64_t total, int64_t chunk);

/// A bucketed reduce-scatter / all-gather over a flat buffer viewed as [world, P]: each round
/// moves columns [c.begin, c.end) of every rank's row, so a bucket of `bucket_elements` in total
/// takes bucket_elements / world columns (at least 1).
std::vector<ElementRange> partition_column_buckets(const FlatLayout& layout, int64_t bucket_elements);

/// What a rank holds, in bytes, per ZeRO stage, for Ψ trainable parameters of `param_bytes`
/// each (2 for bf16/fp16, 4 for fp32), as in the ZeRO paper: parameters (model dtype),
/// gradients (fp32 accumulators for reduced precision, else the model dtype) and optimizer state
/// (two fp32 moments, plus an fp32 master copy when the model dtype is not fp32). Partitioned
/// quantities are divided by the world size, rounded up to whole padded partitions.
struct MemoryFootprint {
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  // Stage 2 on several ranks: the most fp32 bucket-staging bytes alive at once during the backward
  // passes since the last step (at most 2 * reduce_bucket_size * 4 while every parameter fits
  // in one bucket; not part of total(): nothing stays allocated after backward).
  int64_t peak_staging_bytes = 0;
  int64_t total() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
};
MemoryFootprint theoretical_footprint(int stage, int64_t num_params, int64_t param_bytes, int64_t world_size);

}  // namespace engine
}  // namespace dschat
