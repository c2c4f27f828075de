// The .dstok file version: files written before reward pairs stored their prompt lengths are
// refused for reward data (they would read as prompt length 0) and read unchanged otherwise.
#include <gtest/gtest.h>

#include "dschat/data/tokenized_dataset.h"
#include "dstok_writer.h"
#include "test_util.h"

namespace dschat {
namespace {

TEST(TokenizedDataset, FilesCarryTheirVersion) {
  testing::TempDir tmp;
  data::TokenizedDataset pairs(data::PhaseKind::kReward);
  std::vector<int64_t> c = {2, 5, 6}, r = {2, 5, 7};
  pairs.append({&c, &r}, 2);
  // The current version round-trips through the helper as through save().
  testing::write_dstok(tmp / "pairs_v2.dstok", pairs, data::kTokenizedFileVersion);
  EXPECT_EQ(data::TokenizedDataset::load(tmp / "pairs_v2.dstok").prompt_length(0), 2);
  pairs.save(tmp / "saved.dstok");
  EXPECT_EQ(data::TokenizedDataset::load(tmp / "saved.dstok").prompt_length(0), 2);
  // A version-1 reward file has no prompt lengths: refused, so the cache rebuilds it.
  testing::write_dstok(tmp / "pairs_v1.dstok", pairs, 1);
  EXPECT_THROW_WITH(data::TokenizedDataset::load(tmp / "pairs_v1.dstok"), core::FormatError,
                    "version-1 reward file");

  // Version-1 files of the other kinds have the same layout and meaning: still read.
  data::TokenizedDataset sft(data::PhaseKind::kSft);
  std::vector<int64_t> ids = {2, 7, 8, 9};
  sft.append({&ids}, 3);
  testing::write_dstok(tmp / "sft_v1.dstok", sft, 1);
  auto sft_v1 = data::TokenizedDataset::load(tmp / "sft_v1.dstok");
  ASSERT_EQ(sft_v1.size(), 1);
  EXPECT_EQ(sft_v1.prompt_length(0), 3);
  ASSERT_EQ(sft_v1.sequence(0).size, 4);
  EXPECT_EQ(sft_v1.sequence(0).data[3], 9);

  // A file from a newer build is refused, not guessed at.
  testing::write_dstok(tmp / "sft_v9.dstok", sft, 9);
  EXPECT_THROW_WITH(data::TokenizedDataset::load(tmp / "sft_v9.dstok"), core::FormatError, "format version 9");
}

}  // namespace
}  // namespace dschat
