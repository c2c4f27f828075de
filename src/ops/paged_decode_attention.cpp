#include "dschat/ops/paged_decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "dschat/core/error.h"
#include "dschat/ops/decode_attention.h"
#include "ops/kernel_dispatch.h"

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

// a . b over `dim` floats with 16 independent lanes (vectorised; a fixed order of additions).
inline float dot(const float* a, const float* b, int64_t dim) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    for (int l = 0; l < 16; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = 0.0f;
  for (int l = 0; l < 16; ++l) sum += lanes[l];
  for (; i < dim; ++i) sum += a[i] * b[i];
  return sum;
}

torch::Tensor run_cpu_kernel(const torch::Tensor& q, const torch::Tensor& key_slots, const torch::Tensor& value_slots,
                             const torch::Tensor& slots, const std::vector<int64_t>& lengths, double scale) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3), width = slots.size(1);
  const int64_t kv_heads = key_slots.size(1) / dim, group = heads / kv_heads, row_floats = kv_heads * dim;
  torch::Tensor queries = q.contiguous();                             // [B, H, 1, D]
  torch::Tensor keys = key_slots.contiguous(), values = value_slots.contiguous();  // [N, H_kv * D]
  torch::Tensor table = slots.contiguous();                           // [B, S]
  torch::Tensor out = torch::empty({batch, heads, 1, dim}, q.options());  // [B, H, 1, D]
  const float* q_data = queries.data_ptr<float>();
  const float* k_data = keys.data_ptr<float>();
  const float* v_data = values.data_ptr<float>();
  const int64_t* slot_data = table.data_ptr<int64_t>();
  float* out_data = out.data_ptr<float>();
  const float score_scale = static_cast<float>(scale);
  // One task per (row, kv head): its G query heads read each of the row's keys and values once.
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [G, L]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, j = task % kv_heads, length = lengths[b];
      const int64_t* row_slots = slot_data + b * width + (width - length);
      scores.assign(static_cast<size_t>(group * length), 0.0f);
      for (int64_t t = 0; t < length; ++t) {
        const float* key = k_data + row_slots[t] * row_floats + j * dim;
        for (int64_t g = 0; g < group; ++g) {
          scores[g * length + t] = dot(q_data + (b * heads + j * group + g) * dim, key, dim) * score_scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * length;
        const float top = *std::max_element(s, s + length);
        float total = 0.0f;
        for (int64_t t = 0; t < length; ++t) total += (s[t] = std::exp(s[t] - top));
        float* o = out_data + (b * heads + j * group + g) * dim;
        std::fill(o, o + dim, 0.0f);
        for (int64_t t = 0; t < length; ++t) {
          const float weight = s[t] / total;
          const float* value = v_data + row_slots[t] * row_floats + j * dim;
          for (int64_t d = 0; d < dim; ++d) o[d] += weight * value[d];
        }
      }
    }
  });
  return out;
}

}  // namespace

torch::Tensor paged_decode_attention_reference(const torch::Tensor& q, const torch::Tensor& key_slots,
                                               const torch::Tensor& value_slots, const torch::Tensor& slots,
                                               const std::vector<int64_t>& lengths, double scale) {
  check_arguments(q, key_slots, value_slots, slots, lengths);
  const int64_t batch = q.size(0), dim = q.size(3), width = slots.size(1), kv_heads = key_slots.size(1) / dim;
  auto gather = [&](const torch::Tensor& pool) {
    return pool.index_select(0, slots.reshape({-1})).view({batch, width, kv_heads, dim}).transpose(1, 2);  // [B, H_kv, S, D]
  };
  torch::Tensor mask = torch::zeros({batch, width}, torch::kInt64);  // [B, S]
  for (int64_t b = 0; b < batch; ++b) mask[b].narrow(0, width - lengths[b], lengths[b]).fill_(1);
  return decode_attention_reference(q, gather(key_slots), gather(value_slots), mask.to(q.device()), width, scale);
}

torch::Tensor paged_decode_attention(const torch::Tensor& q, const torch::Tensor& key_slots,
                                     const torch::Tensor& value_slots, const torch::Tensor& slots,
                                     const std::vector<int64_t>& lengths, double scale) {
  check_arguments(q, key_slots, value_slots, slots, lengths);
  const bool recorded = torch::GradMode::is_enabled() && (q.requires_grad() || key_slots.requires_grad());
  if (q.device().is_cpu() && q.scalar_type() == torch::kFloat32 && !recorded) {
    return run_cpu_kernel(q, key_slots, value_slots, slots, lengths, scale);
  }
  return paged_decode_attention_reference(q, key_slots, value_slots, slots, lengths, scale);
}

}  // namespace ops
}  // namespace dschat
