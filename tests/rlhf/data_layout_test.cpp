// The data position of a checkpoint on another layout (src/rlhf/setup/data_layout.h): the micro-batch
// a resume continues at, the refusal of another global batch, and the guardian's skipped windows
// moved onto the new layout's micro-batches.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "rlhf/setup/data_layout.h"
#include "test_util.h"

namespace dschat {
namespace {
using nlohmann::json;
using rlhf::DataLayout;

json state_of(const DataLayout& layout, int64_t batch, json skipped = json::array()) {
  return {{"epoch", 0},
          {"batch", batch},
          {rlhf::data_layout_key(), layout.to_json()},
          {"guardian", {{"rollbacks", 1}, {"skipped", skipped}}}};
}

TEST(DataLayout, AResumeContinuesAtTheFirstUnseenSample) {
  const DataLayout two_ranks{2, 1, 4}, one_rank{1, 1, 8}, four_rows{1, 4, 2};
  EXPECT_EQ(rlhf::resume_micro_batch(state_of(two_ranks, 20), two_ranks, false, "t"), 20);
  EXPECT_EQ(rlhf::resume_micro_batch(state_of(two_ranks, 20), one_rank, false, "t"), 40);  // 40 samples
  EXPECT_EQ(rlhf::resume_micro_batch(state_of(one_rank, 40), two_ranks, false, "t"), 20);
  EXPECT_EQ(rlhf::resume_micro_batch(state_of(two_ranks, 20), four_rows, false, "t"), 10);
  // A checkpoint without a layout was written by this one.
  EXPECT_EQ(rlhf::resume_micro_batch({{"epoch", 0}, {"batch", 7}}, one_rank, false, "t"), 7);
  // Another global batch: refused naming both layouts, unless allowed.
  const DataLayout smaller{1, 1, 4};
  EXPECT_THROW_WITH(rlhf::resume_micro_batch(state_of(two_ranks, 20), smaller, false, "step 1 (SFT)"),
                    core::ConfigError, "2 ranks x 1 rows x GAS 4 (global batch 8) and this run is 1 rank x 1 rows x GAS 4");
  EXPECT_EQ(rlhf::resume_micro_batch(state_of(two_ranks, 20), smaller, true, "t"), 40);
}

TEST(DataLayout, SkippedWindowsCoverTheSameSamplesOnTheNewLayout) {
  const DataLayout two_ranks{2, 1, 4};
  const json skipped = json::array({{{"epoch", 0}, {"begin", 4}, {"end", 8}}, {{"epoch", 1}, {"begin", 3}, {"end", 5}}});
  // 2 ranks x 1 row -> 1 rank x 1 row: samples [8, 16) are micro-batches [8, 16).
  json moved = rlhf::guardian_state_for(state_of(two_ranks, 0, skipped), DataLayout{1, 1, 8});
  EXPECT_EQ(moved.at("skipped")[0], json({{"epoch", 0}, {"begin", 8}, {"end", 16}}));
  EXPECT_EQ(moved.at("skipped")[1], json({{"epoch", 1}, {"begin", 6}, {"end", 10}}));
  EXPECT_EQ(moved.at("rollbacks"), 1);
  // -> 1 rank x 4 rows: samples [6, 10) fall in micro-batches 1 and 2 (rows [4, 12)): widened.
  moved = rlhf::guardian_state_for(state_of(two_ranks, 0, skipped), DataLayout{1, 4, 2});
  EXPECT_EQ(moved.at("skipped")[1], json({{"epoch", 1}, {"begin", 1}, {"end", 3}}));
  // The same layout, or a checkpoint without one: unchanged.
  EXPECT_EQ(rlhf::guardian_state_for(state_of(two_ranks, 0, skipped), two_ranks).at("skipped"), skipped);
  json old = state_of(two_ranks, 0, skipped);
  old.erase(rlhf::data_layout_key());
  EXPECT_EQ(rlhf::guardian_state_for(old, DataLayout{1, 1, 8}).at("skipped"), skipped);
}

}  // namespace
}  // namespace dschat
