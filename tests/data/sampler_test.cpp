// DistributedSampler against PyTorch's torch.utils.data.distributed.DistributedSampler (run in
// Python at test time through the project venv) over a grid of sizes, world sizes, ranks, seeds,
// epochs, shuffle and drop_last; plus the properties the trainers rely on and batch_indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "dschat/data/sampler.h"
#include "test_util.h"

namespace dschat {
namespace {

using data::DistributedSampler;
using Indices = std::vector<int64_t>;

TEST(DistributedSampler, MatchesPyTorchOverTheGrid) {
  const std::string script = R"PY(
import json, sys
from torch.utils.data.distributed import DistributedSampler
cases = []
def add(size, world, rank, shuffle, drop_last, epoch, seed):
    s = DistributedSampler(range(size), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
    s.set_epoch(epoch)
    cases.append({"size": size, "world": world, "rank": rank, "shuffle": shuffle, "drop_last": drop_last,
                  "epoch": epoch, "seed": seed, "num_samples": s.num_samples, "total_size": s.total_size,
                  "indices": list(s)})
for size in [0, 1, 7, 10, 100, 1001]:
    for world in [1, 2, 3, 8]:
        for rank in range(world):
            for shuffle in [False, True]:
                for drop_last in [False, True]:
                    for epoch in [0, 1, 5]:
                        for seed in [0, 1234]:
                            add(size, world, rank, shuffle, drop_last, epoch, seed)
# Seeds above 2^63 and a sum that reaches 2^64 - 1: the unsigned seed path.
add(37, 3, 1, True, False, 5, 18446744073709551610)
add(37, 3, 2, True, True, 0, 9223372036854775809)
json.dump(cases, open(sys.argv[1], "w"))
)PY";
  nlohmann::json cases = testing::run_python_json(script);
  ASSERT_EQ(cases.size(), 6u * (1 + 2 + 3 + 8) * 2 * 2 * 3 * 2 + 2);
  int64_t shuffled_nonempty = 0;
  for (const auto& c : cases) {
    DistributedSampler sampler(c["size"].get<int64_t>(), c["world"].get<int64_t>(), c["rank"].get<int64_t>(),
                               c["shuffle"].get<bool>(), c["seed"].get<uint64_t>(), c["drop_last"].get<bool>());
    sampler.set_epoch(c["epoch"].get<int64_t>());
    const std::string where = c.dump().substr(0, 140);
    EXPECT_EQ(sampler.num_samples(), c["num_samples"].get<int64_t>()) << where;
    EXPECT_EQ(sampler.total_size(), c["total_size"].get<int64_t>()) << where;
    EXPECT_EQ(sampler.indices(), c["indices"].get<Indices>()) << where;
    if (c["shuffle"].get<bool>() && c["size"].get<int64_t>() > 1) ++shuffled_nonempty;
  }
  EXPECT_GT(shuffled_nonempty, 0);  // the grid really exercised randperm, not only identity orders
}

// Padding wraps around the dataset more than once when world_size exceeds the size.
TEST(DistributedSampler, PaddingRepeatsFromTheStartBeyondTheDatasetSize) {
  std::vector<Indices> by_rank;
  for (int64_t rank = 0; rank < 8; ++rank) by_rank.push_back(DistributedSampler(3, 8, rank, false).indices());
  EXPECT_EQ(by_rank, (std::vector<Indices>{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}}));
  EXPECT_EQ(DistributedSampler(10, 3, 0, false).indices(), (Indices{0, 3, 6, 9}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, false).indices(), (Indices{2, 5, 8, 1}));  // padded order: 0..9, 0, 1
  EXPECT_EQ(DistributedSampler(10, 3, 2, false, 0, /*drop_last=*/true).indices(), (Indices{2, 5, 8}));
}

TEST(DistributedSampler, EmptyDatasetGivesNoIndices) {
  for (bool drop_last : {false, true}) {
    for (int64_t rank = 0; rank < 4; ++rank) {
      DistributedSampler sampler(0, 4, rank, true, 7, drop_last);
      EXPECT_EQ(sampler.num_samples(), 0);
      EXPECT_EQ(sampler.total_size(), 0);
      EXPECT_TRUE(sampler.indices().empty());
    }
  }
  // drop_last with fewer rows than ranks also leaves every rank empty.
  DistributedSampler small(3, 4, 1, true, 0, /*drop_last=*/true);
  EXPECT_EQ(small.num_samples(), 0);
  EXPECT_TRUE(small.indices().empty());
}

// Together the ranks read every padded position once: each row exactly ceil-or-floor times.
TEST(DistributedSampler, RanksPartitionThePaddedIndexSet) {
  for (bool drop_last : {false, true}) {
    const int64_t size = 103, world = 8;
    std::map<int64_t, int64_t> count;
    int64_t total = 0;
    for (int64_t rank = 0; rank < world; ++rank) {
      DistributedSampler sampler(size, world, rank, true, 42, drop_last);
      sampler.set_epoch(3);
      for (int64_t index : sampler.indices()) {
        ASSERT_GE(index, 0);
        ASSERT_LT(index, size);
        ++count[index];
        ++total;
      }
      EXPECT_EQ(sampler.total_size(), drop_last ? 96 : 104);
    }
    EXPECT_EQ(total, drop_last ? 96 : 104);
    // Without drop_last every row appears, one extra time for the 1 padding row;
    // with drop_last 96 distinct rows appear once each.
    EXPECT_EQ(static_cast<int64_t>(count.size()), drop_last ? 96 : size);
    int64_t repeated = 0;
    for (const auto& [index, n] : count) repeated += n - 1;
    EXPECT_EQ(repeated, drop_last ? 0 : 1);
  }
}

TEST(DistributedSampler, SetEpochReshufflesAndTheSameEpochRepeats) {
  DistributedSampler sampler(100, 2, 1, true, 1234);
  Indices epoch0 = sampler.indices();
  EXPECT_EQ(sampler.indices(), epoch0);  // no hidden state advances between calls
  sampler.set_epoch(1);
  Indices epoch1 = sampler.indices();
  EXPECT_NE(epoch1, epoch0);
  Indices sorted0 = epoch0, sorted1 = epoch1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  EXPECT_NE(sorted0, sorted1);  // a rank's share changes too, not just its order
  sampler.set_epoch(0);
  EXPECT_EQ(sampler.indices(), epoch0);
  EXPECT_EQ(DistributedSampler(100, 2, 1, true, 1234).indices(), epoch0);  // a fresh sampler agrees
  EXPECT_NE(DistributedSampler(100, 2, 1, true, 1235).indices(), epoch0);  // the seed matters
  // Without shuffle the epoch changes nothing.
  DistributedSampler ordered(100, 2, 1, false, 1234);
  Indices before = ordered.indices();
  ordered.set_epoch(9);
  EXPECT_EQ(ordered.indices(), before);
}

TEST(DistributedSampler, BadArgumentsAreNamed) {
  EXPECT_THROW_WITH(DistributedSampler(10, 0, 0), core::InvalidArgument, "world_size must be >= 1, got 0");
  EXPECT_THROW_WITH(DistributedSampler(10, -2, 0), core::InvalidArgument, "world_size must be >= 1, got -2");
  EXPECT_THROW_WITH(DistributedSampler(10, 4, 4), core::InvalidArgument, "rank 4 is out of range [0, 3]");
  EXPECT_THROW_WITH(DistributedSampler(10, 4, -1), core::InvalidArgument, "rank -1 is out of range [0, 3]");
  EXPECT_THROW_WITH(DistributedSampler(-5, 4, 0), core::InvalidArgument, "dataset_size must be >= 0, got -5");
  EXPECT_THROW_WITH(data::batch_indices({1, 2}, 0, false), core::InvalidArgument, "batch_size must be >= 1, got 0");
}

TEST(DistributedSampler, BatchIndicesChunkLikeBatchSampler) {
  const Indices indices = {5, 3, 9, 1, 0, 7, 2};
  using Batches = std::vector<Indices>;
  EXPECT_EQ(data::batch_indices(indices, 3, false), (Batches{{5, 3, 9}, {1, 0, 7}, {2}}));
  EXPECT_EQ(data::batch_indices(indices, 3, true), (Batches{{5, 3, 9}, {1, 0, 7}}));
  EXPECT_EQ(data::batch_indices(indices, 7, true), (Batches{indices}));
  EXPECT_EQ(data::batch_indices(indices, 8, false), (Batches{indices}));
  EXPECT_EQ(data::batch_indices(indices, 8, true), Batches{});
  EXPECT_EQ(data::batch_indices(indices, 1, false).size(), 7u);
  EXPECT_EQ(data::batch_indices({}, 4, false), Batches{});
}

}  // namespace
}  // namespace dschat
