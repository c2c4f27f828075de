#include "dschat/ops/decode_attention.h"

#include "dschat/core/error.h"
#include "ops/kernel_dispatch.h"

#ifdef DSCHAT_WITH_CUDA
#include "kernels/decode_attention.cuh"  // kDecodeAttentionMaxHeadDim
#include "ops/decode_attention_launch.h"
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
  detail::DecodeAttentionKernelArgs args;
  args.q = q.stride(3) == 1 ? q : q.contiguous();                                            // [B, H, 1, D]
  const torch::Tensor keys = k_cache.stride(3) == 1 ? k_cache : k_cache.narrow(2, 0, length).contiguous();  // [B, H_kv, S, D]
  const torch::Tensor values = v_cache.stride(3) == 1 ? v_cache : v_cache.narrow(2, 0, length).contiguous();
  args.k = keys;
  args.v = values;
  args.kv_heads = keys.size(1);
  args.length = length;
  for (int d = 0; d < 3; ++d) {
    args.k_strides[d] = detail::stride_of(keys, d);
    args.v_strides[d] = detail::stride_of(values, d);
  }
  if (mask.defined()) {  // [B, S] int64, unit stride along S
    args.mask = mask.to(torch::kInt64);
    if (args.mask.stride(1) != 1) args.mask = args.mask.contiguous();
  }
  args.scale = scale;
  return detail::launch_decode_attention_kernel("decode_attention", args);
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
