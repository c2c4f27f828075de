#pragma once
// Private to src/ops (CUDA builds): one launch of kernels/decode_attention.cuh, shared by
// decode_attention (a [B, H_kv, S, D] cache) and paged_decode_attention (a block pool's token rows
// read through slots): the split count, the split-K workspace and the parameter block.

#ifdef DSCHAT_WITH_CUDA
#include <torch/torch.h>

#include <cstdint>

namespace dschat {
namespace ops {
namespace detail {

struct DecodeAttentionKernelArgs {
  torch::Tensor q;             // [B, H, 1, D], unit stride along D
  torch::Tensor k, v;          // the cache or the pool, unit stride along D
  int64_t kv_heads = 0;
  int64_t length = 0;          // key columns
  int64_t k_strides[3] = {};   // elements per batch row, kv head, key column (0 where one)
  int64_t v_strides[3] = {};
  torch::Tensor mask;          // [B, length] int64, unit stride along length; undefined: all real
  torch::Tensor slots;         // [B, length] int64, unit stride; undefined: column s is key s
  double scale = 1.0;
};

/// Runs the kernel on the current stream; returns [B, H, 1, D] in q's dtype. `op` names the
/// caller in a dtype error.
torch::Tensor launch_decode_attention_kernel(const char* op, const DecodeAttentionKernelArgs& args);

}  // namespace detail
}  // namespace ops
}  // namespace dschat
#endif
