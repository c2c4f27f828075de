#include "dschat/ops/decode_attention.h"

#include "dschat/core/error.h"
#include "ops/kernel_dispatch.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "dschat/core/status_check.h"
#include "kernels/decode_attention.cuh"
#endif

namespace dschat {
namespace ops {
namespace {

void check_decode_attention_arguments(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& mask, int64_t length) {
  DSCHAT_CHECK(q.defined() && q.dim() == 4 && q.size(2) == 1, InvalidArgument,
               "decode_attention: expected q of shape [B, H, 1, D], got ", detail::shape_of(q));
  DSCHAT_CHECK(k.defined() && v.defined() && k.dim() == 4 && k.sizes() == v.sizes(), InvalidArgument,
               "decode_attention: expected k_cache and v_cache of one shape [B, H_kv, S_max, D], got k_cache ",
               detail::shape_of(k), " and v_cache ", detail::shape_of(v));
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3), kv_heads = k.size(1);
  DSCHAT_CHECK(k.size(0) == batch && k.size(3) == dim, InvalidArgument, "decode_attention: expected k_cache of shape [",
               batch, ", H_kv, S_max, ", dim, "] to match q ", q.sizes(), ", got ", k.sizes());
  DSCHAT_CHECK(kv_heads >= 1 && heads % kv_heads == 0, InvalidArgument, "decode_attention: q's heads (", heads,
               ") must be a multiple of the cache's kv heads (", kv_heads, ")");
  DSCHAT_CHECK(length >= 1 && length <= k.size(2), InvalidArgument, "decode_attention: length ", length,
               " outside [1, S_max = ", k.size(2), "]");
  DSCHAT_CHECK(q.is_floating_point(), InvalidArgument, "decode_attention: q must be floating point, got ",
               q.scalar_type());
  DSCHAT_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), InvalidArgument,
               "decode_attention: q (", q.scalar_type(), "), k_cache (", k.scalar_type(), ") and v_cache (",
               v.scalar_type(), ") must have one dtype");
  DSCHAT_CHECK(k.device() == q.device() && v.device() == q.device(), InvalidArgument, "decode_attention: q (",
               q.device(), "), k_cache (", k.device(), ") and v_cache (", v.device(), ") must be on one device");
  if (mask.defined()) {
    DSCHAT_CHECK(mask.dim() == 2 && mask.size(0) == batch && mask.size(1) == length, InvalidArgument,
                 "decode_attention: expected attention_mask of shape [", batch, ", ", length, "] ([B, length]), got ",
                 mask.sizes());
    DSCHAT_CHECK(mask.device() == q.device(), InvalidArgument, "decode_attention: attention_mask is on ",
                 mask.device(), ", q on ", q.device());
  }
}

torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                        const torch::Tensor& mask, int64_t length, double scale) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3), kv_heads = k_cache.size(1);
  const auto compute = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  torch::Tensor keys = k_cache.narrow(2, 0, length).to(compute);    // [B, H_kv, S, D]
  torch::Tensor values = v_cache.narrow(2, 0, length).to(compute);  // [B, H_kv, S, D]
  // Query head h = j * G + g reads kv head j (repeat_interleave's order).
  torch::Tensor queries = q.to(compute).reshape({batch, kv_heads, heads / kv_heads, dim});  // [B, H_kv, G, D]
  torch::Tensor scores = torch::matmul(queries, keys.transpose(2, 3)) * scale;               // [B, H_kv, G, S]
  if (mask.defined()) {
    torch::Tensor masked = mask.eq(0).reshape({batch, 1, 1, length});  // [B, 1, 1, S]
    scores = scores.masked_fill(masked, detail::lowest_value(q.scalar_type()));
  }
  torch::Tensor out = torch::matmul(scores.softmax(-1), values);  // [B, H_kv, G, D]
  return out.reshape({batch, heads, 1, dim}).to(q.scalar_type());
}

#ifdef DSCHAT_WITH_CUDA
torch::Tensor run_decode_attention_kernel(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                         const torch::Tensor& mask, int64_t length, double scale) {
  c10::cuda::CUDAGuard guard(q.device());
  torch::Tensor queries = q.stride(3) == 1 ? q : q.contiguous();                                      // [B, H, 1, D]
  torch::Tensor keys = k_cache.stride(3) == 1 ? k_cache : k_cache.narrow(2, 0, length).contiguous();  // [B, H_kv, S, D]
  torch::Tensor values = v_cache.stride(3) == 1 ? v_cache : v_cache.narrow(2, 0, length).contiguous();
  torch::Tensor key_mask;  // [B, S] int64, unit stride along S
  if (mask.defined()) {
    key_mask = mask.to(torch::kInt64);
    if (key_mask.stride(1) != 1) key_mask = key_mask.contiguous();
  }
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3);
  torch::Tensor out = torch::empty({batch, heads, 1, dim}, q.options());  // [B, H, 1, D]
  if (out.numel() == 0) return out;
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int splits = kernels::decode_attention_num_splits(batch, heads, length, sm_count);
  const int64_t workspace_floats = kernels::decode_attention_workspace_floats(batch, heads, dim, splits);
  torch::Tensor workspace;  // [B, H, splits, D + 2] fp32 when split
  if (workspace_floats > 0) workspace = torch::empty({workspace_floats}, q.options().dtype(torch::kFloat32));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  detail::dispatch_kernel_dtype("decode_attention", q.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    kernels::DecodeAttentionParams<T> p{};
    p.q = detail::data_as<T>(queries);
    p.k = detail::data_as<T>(keys);
    p.v = detail::data_as<T>(values);
    p.mask = key_mask.defined() ? key_mask.data_ptr<int64_t>() : nullptr;
    p.out = detail::mutable_data_as<T>(out);
    p.workspace = workspace.defined() ? workspace.data_ptr<float>() : nullptr;
    p.batch = batch;
    p.heads = heads;
    p.kv_heads = keys.size(1);
    p.head_dim = dim;
    p.length = length;
    p.q_stride_b = detail::stride_of(queries, 0);
    p.q_stride_h = detail::stride_of(queries, 1);
    p.k_stride_b = detail::stride_of(keys, 0);
    p.k_stride_h = detail::stride_of(keys, 1);
    p.k_stride_s = detail::stride_of(keys, 2);
    p.v_stride_b = detail::stride_of(values, 0);
    p.v_stride_h = detail::stride_of(values, 1);
    p.v_stride_s = detail::stride_of(values, 2);
    p.mask_stride_b = key_mask.defined() ? detail::stride_of(key_mask, 0) : 0;
    p.scale = static_cast<float>(scale);
    p.masked_score = static_cast<float>(detail::lowest_value(q.scalar_type()));
    p.num_splits = splits;
    DSCHAT_CUDA_CHECK(kernels::decode_attention(p, stream));
  });
  return out;
}
#endif

}  // namespace

torch::Tensor decode_attention_reference(const torch::Tensor& q, const torch::Tensor& k_cache,
                                         const torch::Tensor& v_cache, const torch::Tensor& attention_mask,
                                         int64_t length, double scale) {
  check_decode_attention_arguments(q, k_cache, v_cache, attention_mask, length);
  return reference(q, k_cache, v_cache, attention_mask, length, scale);
}

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& attention_mask, int64_t length, double scale) {
  check_decode_attention_arguments(q, k_cache, v_cache, attention_mask, length);
#ifdef DSCHAT_WITH_CUDA
  if (detail::kernel_applies(q, {q, k_cache, v_cache}) &&
      q.size(3) <= kernels::kDecodeAttentionMaxHeadDim && q.size(0) <= 65535 && q.size(1) <= 65535) {
    return run_decode_attention_kernel(q, k_cache, v_cache, attention_mask, length, scale);
  }
#endif
  return reference(q, k_cache, v_cache, attention_mask, length, scale);
}

}  // namespace ops
}  // namespace dschat
