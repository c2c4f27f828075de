#pragma once
// Attention of one new token per row over keys and values that live in a paged KV cache's block
// pool (inference::KvBlockPool), read in place through each row's slots: no gather of the cache
// into a contiguous [B, H_kv, S, D] copy first. Grouped-query heads as decode_attention (query
// head h reads kv head h / (H / H_kv)); scores, softmax and the weighted sum in fp32.
// float32 CPU tensors without autograd run the CPU kernel (one task per row and kv head, each key
// and value read once); CUDA tensors in float32/float16/bfloat16 without autograd run
// decode_attention's CUDA kernel reading each key column's pool row through `slots` (paged mode,
// kernels/decode_attention.cuh: padding columns masked and not read, split-K when the batch is
// small); everything else runs paged_decode_attention_reference (gather, then
// decode_attention_reference under the key mask), which is also the test oracle. docs/ops.md has
// the tolerances.

#include <torch/torch.h>

#include <vector>

namespace dschat {
namespace ops {

/// q: [B, H, 1, D]; key_slots, value_slots: [N, H_kv * D] (one row per pool slot); slots: [B, S]
/// int64 on q's device, row r's keys at slots[r][S - lengths[r] .. S) in order (the left-padded
/// frame; earlier columns are not read); lengths: B values in [1, S]. `scale` multiplies q . k.
/// key_mask: optional [B, S] int64 on q's device, 1 exactly at each row's last lengths[b] columns
/// (the caller's copy of the lengths on the device, e.g. PagedKvCache's mask; without it the CUDA
/// kernel copies one from `lengths`). Returns [B, H, 1, D] in q's dtype.
torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& key_slots,
                                     const torch::Tensor& value_slots, const torch::Tensor& slots,
                                     const std::vector<int64_t>& lengths, double scale,
                                     const torch::Tensor& key_mask = {});

/// The ATen composition: gather the slots into [B, H_kv, S, D], then decode_attention_reference
/// with the key mask of `lengths`. Same argument checks.
torch::Tensor paged_decode_attention_reference(const torch::Tensor& q, const torch::Tensor& key_slots,
                                               const torch::Tensor& value_slots, const torch::Tensor& slots,
                                               const std::vector<int64_t>& lengths, double scale);

}  // namespace ops
}  // namespace dschat
