#pragma once
// Per-step batches from tokenised items, as DeepSpeed-Chat's collators build them.
//   SFT     input_ids/attention_mask/labels, right padded; labels = ids where counted, -100 else.
//   Reward  all chosen rows, then all rejected rows ([2B, T]), right padded (DataCollatorReward),
//           plus each pair's prompt length (where the answers start; DPO-style losses need it).
//   Prompts left padded to exactly max_prompt_seq_len (DataCollatorRLHF's reverse-pad-flip).
//   Unsupervised blocks (mixture training): SFT batches whose labels are the ids.
//
// DeepSpeed-Chat pads SFT and reward rows to max_seq_len; by default we pad to the longest row of
// the batch, which gives the same loss (padding is masked and attention is causal) and less
// work. Set pad_to to max_seq_len for DeepSpeed-Chat's exact shapes.
//
// Batches are built on the CPU (the prefetch thread); to(device) moves every defined tensor, so a
// trainer writes `batch.to(device, /*non_blocking=*/true)` without naming the fields.

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "dschat/data/tokenized_dataset.h"

namespace dschat {
namespace data {

/// Which SFT tokens the loss counts. DeepSpeed-Chat counts the prompt and the answer (and the
/// appended end-of-conversation token): kPromptAndAnswer. kAnswerOnly masks the prompt tokens.
enum class SftLossTokens { kPromptAndAnswer, kAnswerOnly };

// Every batch's to(): a copy whose defined tensors are tensor.to(device, non_blocking); undefined
// tensors stay undefined. A tensor already on `device` is returned as is (LibTorch's to() aliases
// it), so moving a CPU batch to the CPU copies nothing. With non_blocking, a host tensor bound for
// a GPU is pinned first (pageable memory would make the copy synchronous) and copied
// asynchronously on the current stream.
//
// Every batch's pinned_for(): for a batch collated on the prefetch thread and consumed by a GPU,
// a copy whose host tensors are in pinned memory when `device` is CUDA (this thread's current
// device is set to it first, so the pinned blocks belong to that GPU's context), the batch itself
// otherwise. The trainer thread's to(device, true) then only queues the copies.

struct SftBatch {
  torch::Tensor input_ids;       // [B, T] int64
  torch::Tensor attention_mask;  // [B, T] int64: 1 for tokens, 0 for padding
  torch::Tensor labels;          // [B, T] int64: ids where counted, -100 elsewhere

  SftBatch to(const torch::Device& device, bool non_blocking = false) const;
  SftBatch pinned_for(const torch::Device& device) const;
};

struct RewardBatch {
  torch::Tensor input_ids;       // [2B, T] int64: rows 0..B-1 chosen, B..2B-1 rejected
  torch::Tensor attention_mask;  // [2B, T] int64
  // Real tokens only: rows are right padded, so columns [0, prompt_lengths[i]) of rows i and B+i
  // are the prompt. Counts the prompt tokenised alone (BOS included when the tokenizer adds one),
  // capped at max_seq_len; see TokenizedDataset::prompt_length.
  torch::Tensor prompt_lengths;  // [B] int64: tokens of pair i's prompt (rows i and B+i share it)

  RewardBatch to(const torch::Device& device, bool non_blocking = false) const;
  RewardBatch pinned_for(const torch::Device& device) const;
};

struct PromptBatch {
  torch::Tensor input_ids;       // [B, P] int64, P = max_prompt_seq_len, left padded
  torch::Tensor attention_mask;  // [B, P] int64

  PromptBatch to(const torch::Device& device, bool non_blocking = false) const;
  PromptBatch pinned_for(const torch::Device& device) const;
};

struct PadOptions {
  int64_t pad_token_id = 0;
  /// Pad every row to this length (DeepSpeed-Chat: max_seq_len); nullopt: the batch's longest.
  std::optional<int64_t> pad_to;
};

/// Throws core::InvalidArgument for an empty batch, a wrong dataset kind or rows longer than pad_to.
SftBatch collate_sft(const TokenizedDataset& dataset, const std::vector<int64_t>& items, const PadOptions& pad,
                     SftLossTokens loss_tokens = SftLossTokens::kPromptAndAnswer);
RewardBatch collate_reward(const TokenizedDataset& dataset, const std::vector<int64_t>& items, const PadOptions& pad);
PromptBatch collate_prompts(const TokenizedDataset& dataset, const std::vector<int64_t>& items, int64_t pad_token_id,
                            int64_t max_prompt_seq_len);

}  // namespace data
}  // namespace dschat
