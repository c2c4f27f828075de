#include "ops/decode_attention_launch.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dschat/core/status_check.h"
#include "kernels/decode_attention.cuh"
#include "ops/kernel_dispatch.h"

namespace dschat {
namespace ops {
namespace detail {

torch::Tensor launch_decode_attention_kernel(const char* op, const DecodeAttentionKernelArgs& a) {
  c10::cuda::CUDAGuard guard(a.q.device());
  const int64_t batch = a.q.size(0), heads = a.q.size(1), dim = a.q.size(3);
  torch::Tensor out = torch::empty({batch, heads, 1, dim}, a.q.options());  // [B, H, 1, D]
  if (out.numel() == 0) return out;
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int splits = kernels::decode_attention_num_splits(batch, heads, a.length, sm_count);
  const int64_t workspace_floats = kernels::decode_attention_workspace_floats(batch, heads, dim, splits);
  torch::Tensor workspace;  // [B, H, splits, D + 2] fp32 when split
  if (workspace_floats > 0) workspace = torch::empty({workspace_floats}, a.q.options().dtype(torch::kFloat32));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  dispatch_kernel_dtype(op, a.q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    kernels::DecodeAttentionParams<T> p{};
    p.q = data_as<T>(a.q);
    p.k = data_as<T>(a.k);
    p.v = data_as<T>(a.v);
    p.mask = a.mask.defined() ? a.mask.data_ptr<int64_t>() : nullptr;
    p.slots = a.slots.defined() ? a.slots.data_ptr<int64_t>() : nullptr;
    p.out = mutable_data_as<T>(out);
    p.workspace = workspace.defined() ? workspace.data_ptr<float>() : nullptr;
    p.batch = batch;
    p.heads = heads;
    p.kv_heads = a.kv_heads;
    p.head_dim = dim;
    p.length = a.length;
    p.q_stride_b = stride_of(a.q, 0);
    p.q_stride_h = stride_of(a.q, 1);
    p.k_stride_b = a.k_strides[0];
    p.k_stride_h = a.k_strides[1];
    p.k_stride_s = a.k_strides[2];
    p.v_stride_b = a.v_strides[0];
    p.v_stride_h = a.v_strides[1];
    p.v_stride_s = a.v_strides[2];
    p.mask_stride_b = a.mask.defined() ? stride_of(a.mask, 0) : 0;
    p.slots_stride_b = a.slots.defined() ? stride_of(a.slots, 0) : 0;
    p.scale = static_cast<float>(a.scale);
    p.masked_score = static_cast<float>(lowest_value(a.q.scalar_type()));
    p.num_splits = splits;
    DSCHAT_CUDA_CHECK(kernels::decode_attention(p, stream));
  });
  return out;
}

}  // namespace detail
}  // namespace ops
}  // namespace dschat
#endif
