#pragma once
// Decode attention: one new query token per row against a KV cache, grouped-query heads,
// a key-padding mask, fp32 scores/softmax/accumulation. Split-K over the keys when the batch
// alone does not fill the GPU (flash-decoding), merged by a second small kernel.
//   out[b, h, :] = softmax_s(scale * q[b, h, :] . k[b, h / G, s, :]) @ v[b, h / G, s, :],
//   s < length, masked keys (mask[b, s] == 0) scored `masked_score` (their keys are not read),
//   G = heads / kv_heads.
// Paged (slots set): k and v are a block pool's token rows [N, H_kv * D] and key column s of row b
// is pool row slots[b, s] (vLLM's PagedAttention through a block table; the left-padded frame of
// inference::PagedKvCache, whose padding columns are masked).
// Raw pointers, sizes and a stream; no allocation (the caller passes the split workspace),
// no synchronisation.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dschat {
namespace kernels {

/// Largest head_dim the kernel takes.
constexpr int64_t kDecodeAttentionMaxHeadDim = 256;

template <typename T>
struct DecodeAttentionParams {
  const T* q;            // [B, H, D] at q_stride_b / q_stride_h, last dim contiguous
  const T* k;            // [B, H_kv, >= length, D] at k_stride_*, last dim contiguous
  const T* v;            // [B, H_kv, >= length, D] at v_stride_*, last dim contiguous
  const int64_t* mask;   // [B, length] at mask_stride_b (nonzero = real key), or null = all real
  const int64_t* slots;  // paged: [B, length] at slots_stride_b, the pool row of each key column
                         // (then k_stride_b = v_stride_b = 0, k_stride_h = D, k_stride_s = the
                         // pool row's stride); null: column s is index s of k / v
  T* out;                // [B, H, D] contiguous
  float* workspace;      // decode_attention_workspace_floats(...) floats when num_splits > 1, else unused
  int64_t batch, heads, kv_heads, head_dim, length;
  int64_t q_stride_b, q_stride_h;
  int64_t k_stride_b, k_stride_h, k_stride_s;
  int64_t v_stride_b, v_stride_h, v_stride_s;
  int64_t mask_stride_b;
  int64_t slots_stride_b;
  float scale;         // applied to q . k
  float masked_score;  // the score of a masked key (the dtype's lowest finite value)
  int num_splits;      // from decode_attention_num_splits
};

/// How many key ranges each (row, head) is split into, so that batch * heads * splits blocks fill
/// `sm_count` multiprocessors; 1 when the batch already does or the cache is short.
int decode_attention_num_splits(int64_t batch, int64_t heads, int64_t length, int sm_count);

/// Floats of workspace for `num_splits` (0 when num_splits == 1).
int64_t decode_attention_workspace_floats(int64_t batch, int64_t heads, int64_t head_dim, int num_splits);

/// T = float, __half, __nv_bfloat16. Requires 1 <= length, head_dim <= kDecodeAttentionMaxHeadDim,
/// heads % kv_heads == 0, batch and heads <= 65535. Returns the launch status
/// (cudaErrorInvalidValue for arguments outside these bounds).
template <typename T>
cudaError_t decode_attention(const DecodeAttentionParams<T>& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace dschat
