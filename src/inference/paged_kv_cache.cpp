#include "dschat/inference/paged_kv_cache.h"

#include <algorithm>

#include "dschat/core/error.h"
#include "dschat/ops/paged_decode_attention.h"

namespace dschat {
namespace inference {

PagedKvCache::PagedKvCache(KvBlockPool& pool, const std::vector<Row>& rows, int64_t new_tokens)
    : PagedKvCache(pool, rows, std::vector<int64_t>(rows.size(), new_tokens)) {}

PagedKvCache::PagedKvCache(KvBlockPool& pool, const std::vector<Row>& rows, const std::vector<int64_t>& new_tokens)
    : pool_(&pool), batch_(static_cast<int64_t>(rows.size())), width_(0), new_tokens_(0) {
  DSCHAT_CHECK(batch_ >= 1 && new_tokens.size() == rows.size(), InvalidArgument, "paged kv cache: needs rows (got ",
               batch_, ") and a count of new tokens for each (got ", new_tokens.size(), ")");
  const int64_t block_size = pool.block_size();
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const int64_t fed = new_tokens[r];
    DSCHAT_CHECK(fed >= 1, InvalidArgument, "paged kv cache: row ", r, " feeds ", fed, " new tokens (needs >= 1)");
    DSCHAT_CHECK(row.cached >= 0 && row.blocks != nullptr &&
                     static_cast<int64_t>(row.blocks->size()) * block_size >= row.cached + fed,
                 InvalidArgument, "paged kv cache: a row of ", row.cached, " cached + ", fed, " new tokens has ",
                 row.blocks ? row.blocks->size() : 0, " blocks of ", block_size, " tokens");
    width_ = std::max(width_, row.cached);
    new_tokens_ = std::max(new_tokens_, fed);
  }
  const int64_t frame = width_ + new_tokens_;
  std::vector<int64_t> writes, write_rows, reads, mask;  // host copies of the index tensors and mask_
  reads.reserve(batch_ * frame);
  mask.reserve(batch_ * frame);
  for (int64_t r = 0; r < batch_; ++r) {
    const Row& row = rows[r];
    const int64_t fed = new_tokens[r];
    const std::vector<int64_t>& table = *row.blocks;
    auto slot = [&](int64_t token) { return table[token / block_size] * block_size + token % block_size; };
    const int64_t cached_padding = width_ - row.cached, new_padding = new_tokens_ - fed;
    padded_ = padded_ || cached_padding > 0 || new_padding > 0;
    for (int64_t column = 0; column < frame; ++column) {
      // The row's token at this column, or -1 for padding (which reads the row's first slot, masked).
      int64_t token = -1;
      if (column < width_ && column >= cached_padding) token = column - cached_padding;
      if (column >= width_ + new_padding) token = row.cached + column - width_ - new_padding;
      reads.push_back(slot(std::max<int64_t>(token, 0)));
      mask.push_back(token >= 0 ? 1 : 0);
    }
    for (int64_t t = 0; t < fed; ++t) {
      writes.push_back(slot(row.cached + t));
      write_rows.push_back(r * new_tokens_ + new_padding + t);
    }
    lengths_.push_back(row.cached + fed);
  }
  const torch::Device device = pool.storage().device();
  auto to_tensor = [&](std::vector<int64_t>& host) {
    return torch::from_blob(host.data(), {static_cast<int64_t>(host.size())}, torch::kInt64).to(device, /*non_blocking=*/false, /*copy=*/true);
  };
  write_slots_ = to_tensor(writes);  // [N]
  if (static_cast<int64_t>(writes.size()) != batch_ * new_tokens_) write_rows_ = to_tensor(write_rows);  // [N]
  read_slots_ = to_tensor(reads);                    // [B * (W + T)]
  mask_ = to_tensor(mask).view({batch_, frame});     // [B, W + T]
}

PagedKvCache::PagedKvCache(KvBlockPool& pool, torch::Tensor write_slots, torch::Tensor read_slots, torch::Tensor mask,
                           std::vector<int64_t> lengths)
    : pool_(&pool), batch_(mask.size(0)), width_(mask.size(1) - 1), new_tokens_(1), padded_(true),
      write_slots_(std::move(write_slots)), read_slots_(std::move(read_slots)), mask_(std::move(mask)),
      lengths_(std::move(lengths)) {
  DSCHAT_CHECK(mask_.dim() == 2 && mask_.size(1) >= 1 && write_slots_.numel() == batch_ &&
                   read_slots_.numel() == mask_.numel() && static_cast<int64_t>(lengths_.size()) == batch_,
               InvalidArgument, "paged kv cache: expected write_slots [B], read_slots [B * (W + 1)], mask [B, W + 1] ",
               "and B lengths, got ", write_slots_.sizes(), ", ", read_slots_.sizes(), ", ", mask_.sizes(), " and ",
               lengths_.size());
}

torch::Tensor PagedKvCache::attend_decode_step(int64_t layer, const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v, double scale) {
  if (gather_for_attention || new_tokens_ != 1) return {};
  const int64_t heads = k.size(1), dim = k.size(3);
  torch::Tensor keys = pool_->keys(layer), values = pool_->values(layer);  // [N * block_size, H_kv * D]
  keys.index_copy_(0, write_slots_, k.transpose(1, 2).reshape({batch_, heads * dim}));
  values.index_copy_(0, write_slots_, v.transpose(1, 2).reshape({batch_, heads * dim}));
  return ops::paged_decode_attention(q, keys, values, read_slots_.view({batch_, width_ + 1}), lengths_, scale, mask_);
}

std::pair<torch::Tensor, torch::Tensor> PagedKvCache::append(int64_t layer, const torch::Tensor& k,
                                                             const torch::Tensor& v) {
  DSCHAT_CHECK(k.dim() == 4 && k.size(0) == batch_ && k.size(2) == new_tokens_ && k.sizes() == v.sizes(),
               InvalidArgument, "paged kv cache: expected k and v of [", batch_, ", H_kv, ", new_tokens_,
               ", D], got ", k.sizes(), " and ", v.sizes());
  const int64_t heads = k.size(1), dim = k.size(3), frame = width_ + new_tokens_;
  auto store_and_gather = [&](torch::Tensor slots_of_pool, const torch::Tensor& fresh) {
    // [B, H_kv, T, D] -> token rows [B * T, H_kv * D] (the pool's token-major layout), the real ones [N, H_kv * D]
    torch::Tensor rows = fresh.transpose(1, 2).reshape({batch_ * new_tokens_, heads * dim});
    if (write_rows_.defined()) rows = rows.index_select(0, write_rows_);
    slots_of_pool.index_copy_(0, write_slots_, rows);
    return slots_of_pool.index_select(0, read_slots_)
        .view({batch_, frame, heads, dim})
        .transpose(1, 2);  // [B, H_kv, W + T, D], unit stride along D
  };
  return {store_and_gather(pool_->keys(layer), k), store_and_gather(pool_->values(layer), v)};
}

}  // namespace inference
}  // namespace dschat
