// ZeRO's shard arithmetic (dschat/engine/zero_partition.h) on hand-checked cases and an exhaustive
// small grid: partitions tile the padded buffer, pieces tile every parameter exactly once.
#include <gtest/gtest.h>

#include "dschat/engine/zero_partition.h"
#include "test_util.h"

namespace dschat {
namespace {

using engine::ElementRange;
using engine::FlatLayout;
using engine::Piece;

TEST(ZeroPartition, HandCheckedLayout) {
  FlatLayout layout = engine::plan_flat_layout({{"w", 6}, {"b", 3}}, 2);
  EXPECT_EQ(layout.numel, 9);
  EXPECT_EQ(layout.padded_numel, 10);
  EXPECT_EQ(layout.partition_numel(), 5);
  EXPECT_EQ(layout.slots[1].offset, 6);
  EXPECT_EQ(layout.partition(0), (ElementRange{0, 5}));
  EXPECT_EQ(layout.partition(1), (ElementRange{5, 10}));
  // Rank 1 owns w[5, 6) and all of b (plus one padding element).
  std::vector<Piece> pieces = engine::pieces_in_range(layout, layout.partition(1));
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].slot, 0u);
  EXPECT_EQ(pieces[0].slot_offset, 5);
  EXPECT_EQ(pieces[0].range_offset, 0);
  EXPECT_EQ(pieces[0].numel, 1);
  EXPECT_EQ(pieces[1].slot, 1u);
  EXPECT_EQ(pieces[1].slot_offset, 0);
  EXPECT_EQ(pieces[1].range_offset, 1);
  EXPECT_EQ(pieces[1].numel, 3);
}

TEST(ZeroPartition, EmptyAndZeroSizedParameters) {
  FlatLayout empty = engine::plan_flat_layout({}, 4);
  EXPECT_EQ(empty.padded_numel, 4);  // one padding element per rank
  EXPECT_TRUE(engine::pieces_in_range(empty, empty.partition(2)).empty());
  FlatLayout with_zero = engine::plan_flat_layout({{"a", 0}, {"b", 2}}, 1);
  auto pieces = engine::pieces_in_range(with_zero, with_zero.partition(0));
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].slot, 1u);
}

TEST(ZeroPartition, PiecesTileEveryParameterOnceForAnyWorld) {
  for (int64_t world = 1; world <= 7; ++world) {
    for (int seed = 0; seed < 20; ++seed) {
      std::vector<std::pair<std::string, int64_t>> sizes;
      for (int i = 0; i < 1 + seed % 5; ++i) sizes.emplace_back("p" + std::to_string(i), (seed * 7 + i * 13) % 23);
      FlatLayout layout = engine::plan_flat_layout(sizes, world);
      ASSERT_EQ(layout.padded_numel % world, 0);
      ASSERT_GE(layout.padded_numel, layout.numel);
      ASSERT_LT(layout.padded_numel - std::max<int64_t>(layout.numel, 1), world);
      std::vector<std::vector<int>> covered(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) covered[i].assign(sizes[i].second, 0);
      int64_t next_begin = 0;
      for (int64_t rank = 0; rank < world; ++rank) {
        const ElementRange range = layout.partition(rank);
        EXPECT_EQ(range.begin, next_begin);
        next_begin = range.end;
        for (const Piece& piece : engine::pieces_in_range(layout, range)) {
          EXPECT_GE(piece.range_offset, 0);
          EXPECT_LE(piece.range_offset + piece.numel, range.size());
          EXPECT_EQ(layout.slots[piece.slot].offset + piece.slot_offset, range.begin + piece.range_offset);
          for (int64_t e = 0; e < piece.numel; ++e) ++covered[piece.slot][piece.slot_offset + e];
        }
      }
      EXPECT_EQ(next_begin, layout.padded_numel);
      for (const auto& counts : covered) {
        for (int count : counts) EXPECT_EQ(count, 1) << "world " << world << " seed " << seed;
      }
    }
  }
}

TEST(ZeroPartition, BucketsCoverThePartitionColumns) {
  FlatLayout layout = engine::plan_flat_layout({{"w", 100}}, 4);  // 25 columns per rank
  auto buckets = engine::partition_column_buckets(layout, 40);    // 10 columns per round
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0], (ElementRange{0, 10}));
  EXPECT_EQ(buckets[2], (ElementRange{20, 25}));
  EXPECT_EQ(engine::partition_column_buckets(layout, 2).size(), 25u);  // at least one column per round
  EXPECT_EQ(engine::split_into_chunks(10, 4).back(), (ElementRange{8, 10}));
  EXPECT_THROW_WITH(engine::split_into_chunks(10, 0), core::InvalidArgument, "chunk size");
}

TEST(ZeroPartition, TheoreticalFootprintFollowsTheZeroPaper) {
  // Ψ = 1000 bf16 parameters on 4 ranks: 2Ψ parameters, 4Ψ fp32 gradients, 12Ψ optimizer.
  auto stage0 = engine::theoretical_footprint(0, 1000, 2, 4);
  EXPECT_EQ(stage0.parameter_bytes, 2000);
  EXPECT_EQ(stage0.gradient_bytes, 4000);
  EXPECT_EQ(stage0.optimizer_bytes, 12000);
  auto stage1 = engine::theoretical_footprint(1, 1000, 2, 4);
  EXPECT_EQ(stage1.optimizer_bytes, 3000);
  EXPECT_EQ(stage1.gradient_bytes, 4000);
  auto stage2 = engine::theoretical_footprint(2, 1000, 2, 4);
  EXPECT_EQ(stage2.gradient_bytes, 1000);
  auto stage3 = engine::theoretical_footprint(3, 1000, 2, 4);
  EXPECT_EQ(stage3.parameter_bytes, 500);
  EXPECT_EQ(stage3.total(), 500 + 1000 + 3000);
  EXPECT_THROW_WITH(engine::theoretical_footprint(4, 1, 2, 1), core::InvalidArgument, "stage");
  EXPECT_THROW_WITH(engine::plan_flat_layout({{"a", 1}}, 0), core::InvalidArgument, "world size");
}

}  // namespace
}  // namespace dschat
