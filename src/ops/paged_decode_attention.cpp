#include "dschat/ops/paged_decode_attention.h"

#include "dschat/core/error.h"
#include "dschat/ops/decode_attention.h"
#include "ops/cpu_decode_attention.h"
#include "ops/kernel_dispatch.h"

#ifdef DSCHAT_WITH_CUDA
#include "kernels/decode_attention.cuh"  // kDecodeAttentionMaxHeadDim
#include "ops/decode_attention_launch.h"
#endif

namespace dschat {
namespace ops {
namespace {

void check_arguments(const torch::Tensor& q, const torch::Tensor& key_slots, const torch::Tensor& value_slots,
                     const torch::Tensor& slots, const std::vector<int64_t>& lengths) {
  DSCHAT_CHECK(q.defined() && q.dim() == 4 && q.size(2) == 1, InvalidArgument,
               "paged_decode_attention: expected q of shape [B, H, 1, D], got ", detail::shape_of(q));
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3);
  DSCHAT_CHECK(key_slots.defined() && value_slots.defined() && key_slots.dim() == 2 &&
                   key_slots.sizes() == value_slots.sizes() && key_slots.size(1) % dim == 0,
               InvalidArgument, "paged_decode_attention: expected key_slots and value_slots of one shape [N, H_kv * ",
               dim, "], got ", detail::shape_of(key_slots), " and ", detail::shape_of(value_slots));
  const int64_t kv_heads = key_slots.size(1) / dim;
  DSCHAT_CHECK(kv_heads >= 1 && heads % kv_heads == 0, InvalidArgument, "paged_decode_attention: q's heads (", heads,
               ") must be a multiple of the pool's kv heads (", kv_heads, ")");
  DSCHAT_CHECK(slots.defined() && slots.dim() == 2 && slots.size(0) == batch && slots.scalar_type() == torch::kInt64,
               InvalidArgument, "paged_decode_attention: expected int64 slots of shape [", batch, ", S], got ",
               detail::shape_of(slots));
  DSCHAT_CHECK(static_cast<int64_t>(lengths.size()) == batch, InvalidArgument, "paged_decode_attention: ",
               lengths.size(), " lengths for ", batch, " rows");
  for (int64_t length : lengths) {
    DSCHAT_CHECK(length >= 1 && length <= slots.size(1), InvalidArgument, "paged_decode_attention: length ", length,
                 " outside [1, S = ", slots.size(1), "]");
  }
  DSCHAT_CHECK(key_slots.scalar_type() == q.scalar_type() && value_slots.scalar_type() == q.scalar_type(),
               InvalidArgument, "paged_decode_attention: q (", q.scalar_type(), ") and the pool (",
               key_slots.scalar_type(), ", ", value_slots.scalar_type(), ") must have one dtype");
  DSCHAT_CHECK(key_slots.device() == q.device() && value_slots.device() == q.device() && slots.device() == q.device(),
               InvalidArgument, "paged_decode_attention: q, the pool and the slots must be on one device");
}

torch::Tensor run_cpu_kernel(const torch::Tensor& q, const torch::Tensor& key_slots, const torch::Tensor& value_slots,
                             const torch::Tensor& slots, const std::vector<int64_t>& lengths, double scale) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3), width = slots.size(1);
  torch::Tensor queries = q.contiguous();                                          // [B, H, 1, D]
  torch::Tensor keys = key_slots.contiguous(), values = value_slots.contiguous();  // [N, H_kv * D]
  torch::Tensor table = slots.contiguous();                                        // [B, S]
  torch::Tensor out = torch::empty({batch, heads, 1, dim}, q.options());           // [B, H, 1, D]
  const int64_t* slot_data = table.data_ptr<int64_t>();
  detail::CpuDecodeAttentionArgs args;
  args.q = queries.data_ptr<float>();
  args.out = out.data_ptr<float>();
  args.batch = batch;
  args.heads = heads;
  args.kv_heads = key_slots.size(1) / dim;
  args.dim = dim;
  args.k = keys.data_ptr<float>();
  args.v = values.data_ptr<float>();
  args.k_head_stride = args.v_head_stride = dim;  // kv head j at offset j * D of a slot's row
  args.row_begin.assign(1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row_slots = slot_data + b * width + (width - lengths[b]);  // the row's last lengths[b] columns
    for (int64_t t = 0; t < lengths[b]; ++t) args.key_offsets.push_back(row_slots[t] * args.kv_heads * dim);
    args.row_begin.push_back(static_cast<int64_t>(args.key_offsets.size()));
  }
  args.value_offsets = args.key_offsets;
  args.scale = static_cast<float>(scale);
  detail::cpu_decode_attention(args);
  return out;
}

// The frame's key mask [B, S]: 1 at each row's last lengths[b] columns.
torch::Tensor key_mask_of(const std::vector<int64_t>& lengths, int64_t width, torch::Device device) {
  torch::Tensor mask = torch::zeros({static_cast<int64_t>(lengths.size()), width}, torch::kInt64);  // [B, S]
  for (size_t b = 0; b < lengths.size(); ++b) {
    mask[static_cast<int64_t>(b)].narrow(0, width - lengths[b], lengths[b]).fill_(1);
  }
  return mask.to(device);
}

#ifdef DSCHAT_WITH_CUDA
torch::Tensor run_cuda_kernel(const torch::Tensor& q, const torch::Tensor& key_slots, const torch::Tensor& value_slots,
                              const torch::Tensor& slots, const torch::Tensor& key_mask, double scale) {
  const int64_t dim = q.size(3);
  detail::DecodeAttentionKernelArgs args;
  args.q = q.stride(3) == 1 ? q : q.contiguous();                                       // [B, H, 1, D]
  args.k = key_slots.stride(1) == 1 ? key_slots : key_slots.contiguous();                // [N, H_kv * D]
  args.v = value_slots.stride(1) == 1 ? value_slots : value_slots.contiguous();          // [N, H_kv * D]
  args.kv_heads = key_slots.size(1) / dim;
  args.length = slots.size(1);
  // Every row reads the one pool (batch stride 0); kv head j at offset j * D of a token row.
  args.k_strides[0] = 0;
  args.k_strides[1] = dim;
  args.k_strides[2] = args.k.stride(0);
  args.v_strides[0] = 0;
  args.v_strides[1] = dim;
  args.v_strides[2] = args.v.stride(0);
  args.slots = slots.stride(1) == 1 ? slots : slots.contiguous();            // [B, S]
  args.mask = key_mask.stride(1) == 1 ? key_mask : key_mask.contiguous();    // [B, S]
  args.scale = scale;
  return detail::launch_decode_attention_kernel("paged_decode_attention", args);
}
#endif

}  // namespace

torch::Tensor paged_decode_attention_reference(const torch::Tensor& q, const torch::Tensor& key_slots,
                                               const torch::Tensor& value_slots, const torch::Tensor& slots,
                                               const std::vector<int64_t>& lengths, double scale) {
  check_arguments(q, key_slots, value_slots, slots, lengths);
  const int64_t batch = q.size(0), dim = q.size(3), width = slots.size(1), kv_heads = key_slots.size(1) / dim;
  auto gather = [&](const torch::Tensor& pool) {
    return pool.index_select(0, slots.reshape({-1})).view({batch, width, kv_heads, dim}).transpose(1, 2);  // [B, H_kv, S, D]
  };
  return decode_attention_reference(q, gather(key_slots), gather(value_slots), key_mask_of(lengths, width, q.device()),
                                    width, scale);
}

torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& key_slots,
                                     const torch::Tensor& value_slots, const torch::Tensor& slots,
                                     const std::vector<int64_t>& lengths, double scale,
                                     const torch::Tensor& key_mask) {
  check_arguments(q, key_slots, value_slots, slots, lengths);
  DSCHAT_CHECK(!key_mask.defined() || (key_mask.sizes() == slots.sizes() && key_mask.scalar_type() == torch::kInt64 &&
                                       key_mask.device() == q.device()),
               InvalidArgument, "paged_decode_attention: expected an int64 key_mask of the slots' shape ",
               detail::shape_of(slots), " on q's device, got ", detail::shape_of(key_mask));
#ifdef DSCHAT_WITH_CUDA
  if (detail::kernel_applies(q, {q, key_slots, value_slots}) && q.size(3) <= kernels::kDecodeAttentionMaxHeadDim &&
      q.size(0) <= 65535 && q.size(1) <= 65535) {
    return run_cuda_kernel(q, key_slots, value_slots, slots,
                           key_mask.defined() ? key_mask : key_mask_of(lengths, slots.size(1), q.device()), scale);
  }
#endif
  const bool recorded = torch::GradMode::is_enabled() && (q.requires_grad() || key_slots.requires_grad());
  if (q.device().is_cpu() && q.scalar_type() == torch::kFloat32 && !recorded) {
    return run_cpu_kernel(q, key_slots, value_slots, slots, lengths, scale);
  }
  return paged_decode_attention_reference(q, key_slots, value_slots, slots, lengths, scale);
}

}  // namespace ops
}  // namespace dschat
