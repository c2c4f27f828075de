#include "ops/cpu_decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace dschat {
namespace ops {
namespace detail {
namespace {

// a . b over `dim` floats with 16 independent lanes (vectorised; a fixed order of additions).
inline float dot16(const float* a, const float* b, int64_t dim) {
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

}  // namespace

void cpu_decode_attention(const CpuDecodeAttentionArgs& args) {
  const int64_t heads = args.heads, kv_heads = args.kv_heads, dim = args.dim, group = heads / kv_heads;
  // One task per (row, kv head): its G query heads read each of the row's keys and values once.
  at::parallel_for(0, args.batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;  // [G, L]
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, j = task % kv_heads;
      const int64_t first = args.row_begin[b], length = args.row_begin[b + 1] - first;
      const bool uniform = !args.uniform_rows.empty() && args.uniform_rows[b] != 0;
      const float* q_row = args.q + (b * heads + j * group) * dim;  // [G, D]
      float* out_row = args.out + (b * heads + j * group) * dim;    // [G, D]
      scores.assign(static_cast<size_t>(group * length), 0.0f);
      if (!uniform) {
        for (int64_t t = 0; t < length; ++t) {
          const float* key = args.k + args.key_offsets[first + t] + j * args.k_head_stride;
          for (int64_t g = 0; g < group; ++g) scores[g * length + t] = dot16(q_row + g * dim, key, dim) * args.scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * length;
        const float top = length > 0 ? *std::max_element(s, s + length) : 0.0f;
        float total = 0.0f;
        for (int64_t t = 0; t < length; ++t) total += (s[t] = std::exp(s[t] - top));
        float* o = out_row + g * dim;
        std::fill(o, o + dim, 0.0f);
        for (int64_t t = 0; t < length; ++t) {
          const float weight = s[t] / total;
          const float* value = args.v + args.value_offsets[first + t] + j * args.v_head_stride;
          for (int64_t d = 0; d < dim; ++d) o[d] += weight * value[d];
        }
      }
    }
  });
}

}  // namespace detail
}  // namespace ops
}  // namespace dschat
