#pragma once
// The CPU loop of one decode step's attention in fp32, shared by decode_attention (a contiguous
// cache) and paged_decode_attention (a block pool read through slots): both list each row's keys
// by offset, so a row whose real keys hold the same values in the same order gets the same bits
// from either cache, whatever else is in the batch and at any thread count.

#include <cstdint>
#include <vector>

#include "ops/skinny_linear_kernel.h"  // SkinnyIsa: the instruction sets the CPU loops are compiled for

namespace dschat {
namespace ops {
namespace detail {

struct CpuDecodeAttentionArgs {
  const float* q = nullptr;  // [B, H, D], contiguous
  float* out = nullptr;      // [B, H, D], contiguous
  int64_t batch = 0, heads = 0, kv_heads = 0, dim = 0;
  const float* k = nullptr;  // row b's i-th key of kv head j: k + key_offsets[row_begin[b] + i] + j * k_head_stride
  const float* v = nullptr;  // its value: v + value_offsets[row_begin[b] + i] + j * v_head_stride
  int64_t k_head_stride = 0, v_head_stride = 0;
  std::vector<int64_t> row_begin;      // [B + 1]: row b's keys are entries [row_begin[b], row_begin[b + 1])
  std::vector<int64_t> key_offsets;    // [row_begin[B]]
  std::vector<int64_t> value_offsets;  // [row_begin[B]]
  float scale = 1.0f;
  int64_t kv_heads_per_task = 0;  // kv heads one task reads; 0: from the batch and thread count
};

/// out[b, h] = softmax_i(q[b, h] . k_i * scale) . v_i over row b's listed keys, query head h
/// reading kv head h / (H / H_kv). A task per row and run of kv heads, over at::parallel_for,
/// reads each listed token's keys and values of its heads together; each element's arithmetic is
/// fixed (16-lane dot products, keys in listed order) and the same for every `isa` and split, so
/// the result depends neither on the thread count, the other rows nor the loop this CPU runs.
void cpu_decode_attention(const CpuDecodeAttentionArgs& args, SkinnyIsa isa = best_skinny_isa());

}  // namespace detail
}  // namespace ops
}  // namespace dschat
