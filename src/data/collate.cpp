#include "dschat/data/collate.h"

#include <algorithm>

#include "dschat/core/device.h"
#include "dschat/core/error.h"

namespace dschat {
namespace data {
namespace {

struct Rows {
  std::vector<TokenSpan> spans;
  std::vector<int32_t> prompt_lengths;
};

Rows gather(const TokenizedDataset& dataset, const std::vector<int64_t>& items, int field) {
  Rows rows;
  for (int64_t item : items) {
    rows.spans.push_back(dataset.sequence(item, field));
    rows.prompt_lengths.push_back(dataset.prompt_length(item));
  }
  return rows;
}

int64_t padded_length(const std::vector<TokenSpan>& spans, const std::optional<int64_t>& pad_to) {
  int64_t longest = 0;
  for (const auto& span : spans) longest = std::max(longest, span.size);
  if (!pad_to) return longest;
  DSCHAT_CHECK(longest <= *pad_to, InvalidArgument, "collate: a row has ", longest,
               " tokens, more than pad_to ", *pad_to);
  return *pad_to;
}

// Right padded ids and mask: [rows, width].
std::pair<torch::Tensor, torch::Tensor> right_padded(const std::vector<TokenSpan>& spans, int64_t width, int64_t pad_id) {
  const int64_t rows = static_cast<int64_t>(spans.size());
  torch::Tensor ids = torch::full({rows, width}, pad_id, torch::kInt64);  // [rows, width]
  torch::Tensor mask = torch::zeros({rows, width}, torch::kInt64);        // [rows, width]
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < spans[r].size; ++t) {
      ids_a[r][t] = spans[r].data[t];
      mask_a[r][t] = 1;
    }
  }
  return {ids, mask};
}

// Undefined tensors (fields a batch leaves unset) stay undefined instead of throwing in to().
// A non_blocking copy from pageable host memory to a GPU is synchronous (the driver stages it),
// so a host batch bound for a GPU is pinned first; the pinned block is not reused before the
// copy has run (the caching host allocator records the copy's stream).
torch::Tensor moved(const torch::Tensor& tensor, const torch::Device& device, bool non_blocking) {
  if (!tensor.defined()) return tensor;
  const bool pin = non_blocking && device.is_cuda() && tensor.is_cpu() && !tensor.is_pinned();
  const torch::Tensor source = pin ? tensor.pin_memory() : tensor;
  return source.to(torch::TensorOptions().device(device), non_blocking);  // dtype kept
}

// A host tensor a GPU will read, in pinned memory (the GPU made current on this thread first).
torch::Tensor pinned_for_gpu(const torch::Tensor& tensor, const torch::Device& device) {
  if (!tensor.defined() || !device.is_cuda() || !tensor.is_cpu() || tensor.is_pinned()) return tensor;
  core::set_current_device(device);
  return tensor.pin_memory();
}

void check_batch(const TokenizedDataset& dataset, const std::vector<int64_t>& items, PhaseKind kind, const char* what) {
  DSCHAT_CHECK(!items.empty(), InvalidArgument, what, ": empty batch");
  DSCHAT_CHECK(dataset.kind() == kind, InvalidArgument, what, ": the dataset holds phase ",
               static_cast<int>(dataset.kind()), " items, this collator takes phase ", static_cast<int>(kind));
}

}  // namespace

SftBatch SftBatch::to(const torch::Device& device, bool non_blocking) const {
  return SftBatch{moved(input_ids, device, non_blocking), moved(attention_mask, device, non_blocking),
                  moved(labels, device, non_blocking)};
}

RewardBatch RewardBatch::to(const torch::Device& device, bool non_blocking) const {
  return RewardBatch{moved(input_ids, device, non_blocking), moved(attention_mask, device, non_blocking),
                     moved(prompt_lengths, device, non_blocking)};
}

PromptBatch PromptBatch::to(const torch::Device& device, bool non_blocking) const {
  return PromptBatch{moved(input_ids, device, non_blocking), moved(attention_mask, device, non_blocking)};
}

SftBatch SftBatch::pinned_for(const torch::Device& device) const {
  return SftBatch{pinned_for_gpu(input_ids, device), pinned_for_gpu(attention_mask, device),
                  pinned_for_gpu(labels, device)};
}

RewardBatch RewardBatch::pinned_for(const torch::Device& device) const {
  return RewardBatch{pinned_for_gpu(input_ids, device), pinned_for_gpu(attention_mask, device),
                     pinned_for_gpu(prompt_lengths, device)};
}

PromptBatch PromptBatch::pinned_for(const torch::Device& device) const {
  return PromptBatch{pinned_for_gpu(input_ids, device), pinned_for_gpu(attention_mask, device)};
}

SftBatch collate_sft(const TokenizedDataset& dataset, const std::vector<int64_t>& items, const PadOptions& pad,
                     SftLossTokens loss_tokens) {
  check_batch(dataset, items, PhaseKind::kSft, "collate_sft");
  Rows rows = gather(dataset, items, 0);
  const int64_t width = padded_length(rows.spans, pad.pad_to);
  SftBatch batch;
  std::tie(batch.input_ids, batch.attention_mask) = right_padded(rows.spans, width, pad.pad_token_id);
  batch.labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100);  // [B, T]
  if (loss_tokens == SftLossTokens::kAnswerOnly) {
    auto labels = batch.labels.accessor<int64_t, 2>();
    for (size_t r = 0; r < items.size(); ++r) {
      for (int64_t t = 0; t < std::min<int64_t>(rows.prompt_lengths[r], width); ++t) labels[r][t] = -100;
    }
  }
  return batch;
}

RewardBatch collate_reward(const TokenizedDataset& dataset, const std::vector<int64_t>& items, const PadOptions& pad) {
  check_batch(dataset, items, PhaseKind::kReward, "collate_reward");
  Rows chosen = gather(dataset, items, 0), rejected = gather(dataset, items, 1);
  std::vector<TokenSpan> all = chosen.spans;  // chosen rows first, then rejected: DataCollatorReward
  all.insert(all.end(), rejected.spans.begin(), rejected.spans.end());
  RewardBatch batch;
  std::tie(batch.input_ids, batch.attention_mask) = right_padded(all, padded_length(all, pad.pad_to), pad.pad_token_id);
  // One per pair (chosen and rejected share the prompt): real tokens, so with right padding the
  // prompt is columns [0, prompt_lengths[i]) of rows i and B + i.
  batch.prompt_lengths = torch::tensor(std::vector<int64_t>(chosen.prompt_lengths.begin(), chosen.prompt_lengths.end()),
                                       torch::kInt64);  // [B]
  return batch;
}

PromptBatch collate_prompts(const TokenizedDataset& dataset, const std::vector<int64_t>& items, int64_t pad_token_id,
                            int64_t max_prompt_seq_len) {
  check_batch(dataset, items, PhaseKind::kPrompt, "collate_prompts");
  Rows rows = gather(dataset, items, 0);
  const int64_t width = padded_length(rows.spans, max_prompt_seq_len);
  const int64_t count = static_cast<int64_t>(items.size());
  PromptBatch batch;
  batch.input_ids = torch::full({count, width}, pad_token_id, torch::kInt64);  // [B, P]
  batch.attention_mask = torch::zeros({count, width}, torch::kInt64);         // [B, P]
  auto ids = batch.input_ids.accessor<int64_t, 2>();
  auto mask = batch.attention_mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < count; ++r) {
    const int64_t start = width - rows.spans[r].size;  // left padding: tokens end at the last column
    for (int64_t t = 0; t < rows.spans[r].size; ++t) {
      ids[r][start + t] = rows.spans[r].data[t];
      mask[r][start + t] = 1;
    }
  }
  return batch;
}

}  // namespace data
}  // namespace dschat
