// The per-step batches: padding side and width, label masking, chosen-then-rejected order, and
// left-padded prompts of exactly max_prompt_seq_len (DeepSpeed-Chat's collators).
#include <gtest/gtest.h>

#include "dschat/data/collate.h"
#include "test_util.h"

namespace dschat {
namespace {

data::TokenizedDataset sft_rows() {
  data::TokenizedDataset d(data::PhaseKind::kSft);
  std::vector<int64_t> a = {2, 10, 11, 12, 2}, b = {2, 20, 2};
  d.append({&a}, 3);
  d.append({&b}, 2);
  return d;
}

TEST(Collate, SftRightPadsAndMasksLabels) {
  auto d = sft_rows();
  auto batch = data::collate_sft(d, {1, 0}, {/*pad_token_id=*/1, std::nullopt});
  EXPECT_TRUE(torch::equal(batch.input_ids, torch::tensor({{2, 20, 2, 1, 1}, {2, 10, 11, 12, 2}})));
  EXPECT_TRUE(torch::equal(batch.attention_mask, torch::tensor({{1, 1, 1, 0, 0}, {1, 1, 1, 1, 1}})));
  EXPECT_TRUE(torch::equal(batch.labels, torch::tensor({{2, 20, 2, -100, -100}, {2, 10, 11, 12, 2}})));
  EXPECT_EQ(batch.input_ids.dtype(), torch::kInt64);

  auto answer_only = data::collate_sft(d, {0, 1}, {1, 8}, data::SftLossTokens::kAnswerOnly);
  EXPECT_EQ(answer_only.input_ids.size(1), 8);  // DeepSpeed-Chat's fixed max_seq_len width
  EXPECT_TRUE(torch::equal(answer_only.labels[0], torch::tensor({-100, -100, -100, 12, 2, -100, -100, -100})));
  EXPECT_TRUE(torch::equal(answer_only.labels[1], torch::tensor({-100, -100, 2, -100, -100, -100, -100, -100})));
}

TEST(Collate, RewardPutsAllChosenRowsFirst) {
  data::TokenizedDataset d(data::PhaseKind::kReward);
  std::vector<int64_t> c0 = {2, 5, 6}, r0 = {2, 5, 7, 8}, c1 = {2, 9}, r1 = {2, 9, 9};
  d.append({&c0, &r0});
  d.append({&c1, &r1});
  auto batch = data::collate_reward(d, {0, 1}, {0, std::nullopt});
  EXPECT_TRUE(torch::equal(batch.input_ids, torch::tensor({{2, 5, 6, 0}, {2, 9, 0, 0}, {2, 5, 7, 8}, {2, 9, 9, 0}})));
  EXPECT_TRUE(torch::equal(batch.attention_mask.sum(1), torch::tensor({3, 2, 4, 3})));
}

TEST(Collate, RewardCarriesEachPairsPromptLength) {
  data::TokenizedDataset d(data::PhaseKind::kReward);
  std::vector<int64_t> c0 = {2, 5, 6}, r0 = {2, 5, 7, 8}, c1 = {2, 9}, r1 = {2, 9, 9};
  d.append({&c0, &r0}, 2);
  d.append({&c1, &r1}, 1);
  EXPECT_EQ(d.prompt_length(0), 2);
  EXPECT_EQ(d.prompt_length(1), 1);
  const std::vector<int64_t> items = {1, 0, 1};
  auto batch = data::collate_reward(d, items, {0, std::nullopt});
  ASSERT_EQ(batch.prompt_lengths.dim(), 1);
  EXPECT_EQ(batch.prompt_lengths.size(0), 3);  // [B]: one per pair, not one per row
  EXPECT_EQ(batch.prompt_lengths.dtype(), torch::kInt64);
  EXPECT_TRUE(torch::equal(batch.prompt_lengths, torch::tensor({1, 2, 1})));
  // Right padding: the prompt is the head of both rows of a pair, no padding before it.
  for (int64_t k = 0; k < 3; ++k) {
    const int64_t length = batch.prompt_lengths[k].item<int64_t>();
    EXPECT_TRUE(torch::equal(batch.input_ids[k].slice(0, 0, length), batch.input_ids[k + 3].slice(0, 0, length)));
    EXPECT_EQ(batch.attention_mask[k].slice(0, 0, length).sum().item<int64_t>(), length);
  }
  // The lengths survive the file and blending.
  testing::TempDir tmp;
  d.save(tmp / "pairs.dstok");
  auto loaded = data::TokenizedDataset::load(tmp / "pairs.dstok");
  EXPECT_EQ(loaded.prompt_length(0), 2);
  EXPECT_EQ(loaded.prompt_length(1), 1);
  auto blended = data::TokenizedDataset::concatenate({&d, &loaded}, {3, 0});
  EXPECT_EQ(blended.prompt_length(0), 1);
  EXPECT_EQ(blended.prompt_length(1), 2);
  EXPECT_THROW_WITH(d.append({&c0, &r0}, -1), core::InvalidArgument, "prompt length -1");
}

TEST(Collate, BatchesMoveToADevice) {
  auto sft_data = sft_rows();
  const data::SftBatch sft = data::collate_sft(sft_data, {0, 1}, {1, std::nullopt});
  data::TokenizedDataset pairs(data::PhaseKind::kReward);
  std::vector<int64_t> c = {2, 5, 6}, r = {2, 5, 7, 8};
  pairs.append({&c, &r}, 2);
  const data::RewardBatch reward = data::collate_reward(pairs, {0}, {0, std::nullopt});
  data::TokenizedDataset prompt_data(data::PhaseKind::kPrompt);
  prompt_data.append({&c});
  const data::PromptBatch prompts = data::collate_prompts(prompt_data, {0}, 1, 4);

  for (bool non_blocking : {false, true}) {
    const data::SftBatch sft_moved = sft.to(torch::kCPU, non_blocking);
    const data::RewardBatch reward_moved = reward.to(torch::kCPU, non_blocking);
    const data::PromptBatch prompts_moved = prompts.to(torch::Device(torch::kCPU), non_blocking);
    const std::vector<std::pair<const torch::Tensor*, const torch::Tensor*>> fields = {
        {&sft.input_ids, &sft_moved.input_ids},          {&sft.attention_mask, &sft_moved.attention_mask},
        {&sft.labels, &sft_moved.labels},                {&reward.input_ids, &reward_moved.input_ids},
        {&reward.attention_mask, &reward_moved.attention_mask},
        {&reward.prompt_lengths, &reward_moved.prompt_lengths},
        {&prompts.input_ids, &prompts_moved.input_ids},  {&prompts.attention_mask, &prompts_moved.attention_mask}};
    for (size_t i = 0; i < fields.size(); ++i) {
      const torch::Tensor& before = *fields[i].first;
      const torch::Tensor& after = *fields[i].second;
      ASSERT_TRUE(after.defined()) << "field " << i;
      EXPECT_EQ(after.device(), torch::Device(torch::kCPU)) << "field " << i;
      EXPECT_EQ(after.dtype(), before.dtype()) << "field " << i;
      EXPECT_EQ(after.sizes(), before.sizes()) << "field " << i;
      EXPECT_TRUE(torch::equal(after, before)) << "field " << i;
      // LibTorch's to() returns the tensor itself when the device already matches: nothing copied.
      EXPECT_TRUE(after.is_same(before)) << "field " << i;
    }
  }

  // Undefined fields stay undefined; other dtypes are kept.
  data::SftBatch partial;
  partial.input_ids = torch::arange(6, torch::kFloat32).view({2, 3});  // [2, 3] float32
  data::SftBatch partial_moved = partial.to(torch::kCPU);
  EXPECT_EQ(partial_moved.input_ids.dtype(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(partial_moved.input_ids, partial.input_ids));
  EXPECT_FALSE(partial_moved.attention_mask.defined());
  EXPECT_FALSE(partial_moved.labels.defined());
  data::RewardBatch reward_partial;
  reward_partial.input_ids = torch::ones({2, 3}, torch::kInt64);  // [2B, T] int64, B = 1
  EXPECT_FALSE(reward_partial.to(torch::kCPU).prompt_lengths.defined());
  const data::PromptBatch empty_moved = data::PromptBatch{}.to(torch::kCPU);
  EXPECT_FALSE(empty_moved.input_ids.defined());
  EXPECT_FALSE(empty_moved.attention_mask.defined());
  // The result is its own struct: replacing one of its fields leaves the original alone.
  partial_moved.input_ids = torch::zeros({1}, torch::kFloat32);
  EXPECT_EQ(partial.input_ids.numel(), 6);

  // pinned_for (on the prefetch thread): a CPU consumer gets the batch itself; a GPU consumer
  // pinned copies of the same values, which to(gpu, non_blocking) then copies without pinning.
  const data::SftBatch for_cpu = sft.pinned_for(torch::kCPU);
  EXPECT_TRUE(for_cpu.input_ids.is_same(sft.input_ids));
  EXPECT_TRUE(reward.pinned_for(torch::kCPU).prompt_lengths.is_same(reward.prompt_lengths));
  EXPECT_TRUE(prompts.pinned_for(torch::kCPU).attention_mask.is_same(prompts.attention_mask));
  EXPECT_FALSE(data::SftBatch{}.pinned_for(torch::kCPU).labels.defined());
  if (torch::cuda::is_available()) {
    const data::PromptBatch for_gpu = prompts.pinned_for(torch::Device(torch::kCUDA, 0));
    EXPECT_TRUE(for_gpu.input_ids.is_pinned());
    EXPECT_TRUE(torch::equal(for_gpu.input_ids, prompts.input_ids));
    EXPECT_TRUE(torch::equal(for_gpu.to(torch::Device(torch::kCUDA, 0), true).input_ids.cpu(), prompts.input_ids));
  }
}

TEST(Collate, PromptsAreLeftPaddedToExactlyMaxPromptLength) {
  data::TokenizedDataset d(data::PhaseKind::kPrompt);
  std::vector<int64_t> a = {2, 7, 8}, b = {2, 9};
  d.append({&a});
  d.append({&b});
  auto batch = data::collate_prompts(d, {0, 1}, /*pad_token_id=*/1, /*max_prompt_seq_len=*/5);
  EXPECT_TRUE(torch::equal(batch.input_ids, torch::tensor({{1, 1, 2, 7, 8}, {1, 1, 1, 2, 9}})));
  EXPECT_TRUE(torch::equal(batch.attention_mask, torch::tensor({{0, 0, 1, 1, 1}, {0, 0, 0, 1, 1}})));
  EXPECT_THROW_WITH(data::collate_prompts(d, {0}, 1, 2), core::InvalidArgument, "more than pad_to 2");
}

TEST(Collate, MisuseIsNamed) {
  auto d = sft_rows();
  EXPECT_THROW_WITH(data::collate_reward(d, {0}, {}), core::InvalidArgument, "collate_reward: the dataset holds phase 1");
  EXPECT_THROW_WITH(data::collate_sft(d, {}, {}), core::InvalidArgument, "empty batch");
  EXPECT_THROW_WITH(data::collate_sft(d, {5}, {}), core::InvalidArgument, "item 5");
  EXPECT_THROW_WITH(data::collate_sft(d, {0}, {0, 3}), core::InvalidArgument, "more than pad_to 3");
}

TEST(TokenizedDataset, SavesAndMapsBackIdentically) {
  testing::TempDir tmp;
  data::TokenizedDataset d(data::PhaseKind::kReward);
  std::vector<int64_t> c = {1, 2, 3}, r = {}, big = {2147483647};
  d.append({&c, &r});
  d.append({&big, &c});
  d.metadata()["note"] = "x";
  d.save(tmp / "d.dstok");
  auto loaded = data::TokenizedDataset::load(tmp / "d.dstok");
  ASSERT_EQ(loaded.size(), 2);
  EXPECT_EQ(loaded.kind(), data::PhaseKind::kReward);
  EXPECT_EQ(loaded.sequence(0, 1).size, 0);
  EXPECT_EQ(loaded.sequence(1, 0).data[0], 2147483647);
  EXPECT_EQ(loaded.sequence(1, 1).size, 3);
  EXPECT_EQ(loaded.metadata()["note"], "x");
  auto copy = loaded;  // copies share the mapping
  EXPECT_EQ(copy.sequence(0, 0).data, loaded.sequence(0, 0).data);
  std::vector<int64_t> too_big = {int64_t{1} << 31};
  EXPECT_THROW_WITH(d.append({&too_big, &c}), core::InvalidArgument, "does not fit in int32");
  EXPECT_THROW_WITH(loaded.append({&c, &c}), core::InvalidArgument, "mapped");

  auto blended = data::TokenizedDataset::concatenate({&d, &loaded}, {3, 0});
  ASSERT_EQ(blended.size(), 2);
  EXPECT_EQ(blended.sequence(0, 0).data[0], 2147483647);
  EXPECT_EQ(blended.sequence(1, 0).size, 3);
}

}  // namespace
}  // namespace dschat

#include "dschat/data/epoch_batches.h"

namespace dschat {
namespace {

TEST(EpochBatches, RanksCoverTheDatasetAndEpochsReshuffle) {
  data::TokenizedDataset d(data::PhaseKind::kSft);
  for (int64_t i = 0; i < 10; ++i) {
    std::vector<int64_t> ids(1 + i % 3, i);
    d.append({&ids});
  }
  auto collate = [&](const std::vector<int64_t>& items) { return data::collate_sft(d, items, {0, std::nullopt}); };
  std::vector<int64_t> seen;
  std::vector<std::vector<int64_t>> orders;
  for (int64_t rank = 0; rank < 2; ++rank) {
    data::EpochBatches<data::SftBatch> batches(data::DistributedSampler(10, 2, rank, true, 7), 0, 2, false, collate);
    EXPECT_EQ(batches.size(), 3);  // 5 indices per rank -> 2 + 2 + 1
    int64_t b = 0;
    while (auto batch = batches.next()) {
      ASSERT_EQ(batch->input_ids.size(0), static_cast<int64_t>(batches.indices(b).size()));
      for (size_t r = 0; r < batches.indices(b).size(); ++r) {
        EXPECT_EQ(batch->input_ids[r][0].item<int64_t>(), batches.indices(b)[r]);  // row i holds token i
        seen.push_back(batches.indices(b)[r]);
      }
      ++b;
    }
    EXPECT_EQ(b, 3);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  data::EpochBatches<data::SftBatch> epoch0(data::DistributedSampler(10, 1, 0, true, 7), 0, 10, false, collate);
  data::EpochBatches<data::SftBatch> epoch1(data::DistributedSampler(10, 1, 0, true, 7), 1, 10, false, collate);
  EXPECT_NE(epoch0.indices(0), epoch1.indices(0));
}

TEST(EpochBatches, CollateErrorsReachTheTrainer) {
  data::TokenizedDataset d(data::PhaseKind::kSft);
  std::vector<int64_t> ids = {1, 2, 3};
  d.append({&ids});
  data::EpochBatches<data::SftBatch> batches(data::DistributedSampler(1, 1, 0, false), 0, 1, false,
                                             [&](const std::vector<int64_t>& items) {
                                               return data::collate_sft(d, items, {0, 2});  // row longer than 2
                                             });
  EXPECT_THROW_WITH(batches.next(), core::InvalidArgument, "more than pad_to 2");
}

}  // namespace
}  // namespace dschat
