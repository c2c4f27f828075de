#include "dschat/inference/kv_cache.h"

#include "dschat/core/error.h"

namespace dschat {
namespace inference {

ContiguousKvCache::ContiguousKvCache(const core::ModelConfig& config, int64_t batch, int64_t max_tokens,
                                     torch::ScalarType dtype, torch::Device device)
    : owned_(std::make_shared<KvWorkspace>()), workspace_(owned_.get()), batch_(batch) {
  owned_->reserve(config, batch, max_tokens, dtype, device);
}

ContiguousKvCache::ContiguousKvCache(const KvWorkspace& workspace, int64_t batch)
    : workspace_(&workspace), batch_(batch) {
  DSCHAT_CHECK(workspace.allocated() && batch >= 1 && batch <= workspace.batch_capacity(), InvalidArgument,
               "kv cache: a batch of ", batch, " rows does not fit the workspace (", workspace.batch_capacity(),
               " rows", workspace.allocated() ? "" : ", released", ")");
}

std::pair<torch::Tensor, torch::Tensor> ContiguousKvCache::append(int64_t layer, const torch::Tensor& k,
                                                                  const torch::Tensor& v) {
  const int64_t steps = k.size(2), max_tokens = workspace_->max_tokens();
  DSCHAT_CHECK(length_ + steps <= max_tokens, InvalidArgument, "kv cache: ", length_, " cached + ", steps,
               " new tokens exceed the capacity of ", max_tokens, " tokens");
  torch::Tensor keys = workspace_->keys(layer, batch_);      // [B, H_kv, M, D]
  torch::Tensor values = workspace_->values(layer, batch_);  // [B, H_kv, M, D]
  keys.narrow(2, length_, steps).copy_(k);
  values.narrow(2, length_, steps).copy_(v);
  return {keys.narrow(2, 0, length_ + steps), values.narrow(2, 0, length_ + steps)};
}

void ContiguousKvCache::commit(int64_t new_tokens) { length_ += new_tokens; }

void ContiguousKvCache::repeat_rows(int64_t n) {
  DSCHAT_CHECK(n >= 1, InvalidArgument, "kv cache: repeat_rows needs n >= 1, got ", n);
  const int64_t rows = batch_ * n;
  DSCHAT_CHECK(rows <= workspace_->batch_capacity(), InvalidArgument, "kv cache: repeating ", batch_,
               " rows ", n, " times needs ", rows, " rows, but the workspace holds ", workspace_->batch_capacity(),
               " (reserve it for batch * n rows before the prefill)");
  if (n == 1) return;
  for (int64_t layer = 0; layer < workspace_->num_layers(); ++layer) {
    for (const bool is_keys : {true, false}) {
      // The source rows [0, B) overlap the destination rows [0, B * n): copied out first.
      torch::Tensor source = (is_keys ? workspace_->keys(layer, batch_) : workspace_->values(layer, batch_))
                                 .narrow(2, 0, length_)
                                 .clone();  // [B, H_kv, S, D]
      torch::Tensor target = (is_keys ? workspace_->keys(layer, rows) : workspace_->values(layer, rows))
                                 .narrow(2, 0, length_)
                                 .unflatten(0, {batch_, n});  // [B, n, H_kv, S, D]: row b * n + j is [b][j]
      // source.repeat_interleave(n, 0) written into rows [0, B * n), as a broadcast: no [B * n, ...] temporary.
      target.copy_(source.unsqueeze(1));
    }
  }
  batch_ = rows;
}

}  // namespace inference
}  // namespace dschat
